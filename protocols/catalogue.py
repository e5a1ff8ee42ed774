"""The catalogue of learners: ``--learner NAME`` → the class that implements it, imported on use.

This is the one list of learner names. The service's choices (:data:`panpriv.streamer.config.LEARNER_NAMES`),
its registry (:mod:`panpriv.streamer.runtime.learners`) and the conformance test every learner must pass
(``tests/protocols/test_catalogue.py``) all derive from it. Adding a learner means writing its
module (with ``unit_test_params()``: the parameters the conformance test builds it with), adding
one line here, and writing its own tests.

Entries are ``"module:Class"`` strings, not classes, so that listing the names (``panpriv --help``)
imports no learner module (start-up stays fast; each module pulls in its own accounting).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from panpriv.protocols.errors import InvalidInputError

if TYPE_CHECKING:
    from panpriv.protocols.base import Learner

CATALOGUE: dict[str, str] = {
    "pan-acsa": "panpriv.protocols.pan_acsa:PanPrivateACSA",
    "pan-ftrl": "panpriv.protocols.pan_ftrl:PanPrivateFTRL",
    "pnsgd": "panpriv.protocols.pnsgd:OnlinePNSGD",
    "shuffled-pnsgd": "panpriv.protocols.pnsgd:ShuffledPNSGD",
    "shuffle-sgd": "panpriv.protocols.shuffle_sgd:ShuffleSGD",
    "shuffle-acsa": "panpriv.protocols.shuffle_acsa:ShuffleACSA",
    "shuffle-gd": "panpriv.protocols.shuffle_gd:ShuffleGD",
    "shuffle-gaussian": "panpriv.protocols.shuffle_gaussian:ShuffleGaussianSGD",
    "checkin": "panpriv.protocols.checkin:RandomCheckinSGD",
}
"""Learner name → ``"module:Class"``, in the order the CLI lists them."""


def learner_names() -> tuple[str, ...]:
    """Every learner name, in catalogue order."""
    return tuple(CATALOGUE)


class UnknownLearnerError(InvalidInputError):
    """A name that is not in the catalogue, or an entry whose module or class cannot be loaded."""


def load_learner(name: str) -> type[Learner]:
    """Import and return the class catalogued under ``name``.

    Raises :class:`UnknownLearnerError` naming the choices for an unknown name, and saying what is
    missing for an entry whose module or class cannot be found, or whose class declares another name.
    """
    target = CATALOGUE.get(name)
    if target is None:
        raise UnknownLearnerError(f"unknown learner {name!r}; choose one of {', '.join(CATALOGUE)}")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UnknownLearnerError(f"learner {name!r} is catalogued but its module {module_name} is missing ({exc})") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise UnknownLearnerError(f"learner {name!r} is catalogued as {target}, but {module_name} has no {class_name}")
    if getattr(cls, "name", None) != name:
        raise UnknownLearnerError(f"{target}.name is {getattr(cls, 'name', None)!r}, catalogued as {name!r}")
    return cast("type[Learner]", cls)
