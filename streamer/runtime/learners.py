"""The service's side of the learner catalogue: ``--learner NAME`` → a learner built from the config.

The names and classes come from :mod:`panpriv.protocols.catalogue` (the one list); the defaults are
the constructors' own (radius √d, an intercept, PNSGD's step size and pan floor: each learner's
docstring states the rule), so this module only maps the service's settings to constructor
parameters. A learner that reads a recording by record index (``learn_recorded``:
``shuffled-pnsgd``, ``shuffle-gd``) is catalogued the same way; the processor sees what it
declares (:mod:`panpriv.streamer.runtime.replay`) and gives it a ``file:`` source by index.

Building. The service passes its common settings to the constructor parameters of the same name,
when the constructor has them:

==================  ================================================================
parameter           value
==================  ================================================================
``dim``             ``records.dim``
``feature_bound``   ``records.feature_bound`` (the bound records were clipped to)
``epsilon``         ``learner.epsilon``
``delta``           ``learner.delta``
``pan_delta``       ``learner.delta`` for a learner without ``delta`` (PNSGD: the requested δ is
                    its pan floor, :mod:`panpriv.streamer.runtime.delta_target`)
``horizon``/``n``   the public stream length (``learner.n``, or the finite source's count)
``loss``            ``learner.options.loss``, else :data:`panpriv.protocols.losses.DEFAULT_LOSS`
``rng``             ``learner.seed`` (test/replay mode) or ``None`` (OS entropy per draw)
==================  ================================================================

Everything else comes from ``[learner.options]``, passed as given. An option the constructor does
not accept is an error naming the option and the accepted ones; so is a constructor argument
without a default that no setting gives (reported before any scan of the source).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from panpriv.protocols.base import Learner
from panpriv.protocols.catalogue import UnknownLearnerError, load_learner
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import DEFAULT_LOSS
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.errors import ConfigError, LearnerUnavailableError
from panpriv.streamer.runtime.option_hints import hint

_STREAM_LENGTH_NAMES = ("horizon", "n")


def learner_class(name: str) -> type[Learner]:
    """The class catalogued under ``name`` (:func:`panpriv.protocols.catalogue.load_learner`)."""
    try:
        return load_learner(name)
    except UnknownLearnerError as exc:
        raise LearnerUnavailableError(str(exc)) from None


def constructor_arguments(config: ServiceConfig, n: int) -> dict[str, Any]:
    """The keyword arguments (without ``rng``) that :func:`build_learner` passes."""
    cls = learner_class(config.learner.name)
    parameters = inspect.signature(cls.__init__).parameters
    common: dict[str, Any] = {
        "dim": config.records.dim,
        "feature_bound": config.records.feature_bound,
        "epsilon": config.learner.epsilon,
        "delta": config.learner.delta,
    }
    common.update({name: n for name in _STREAM_LENGTH_NAMES})
    if "delta" not in parameters:
        common["pan_delta"] = config.learner.delta  # PNSGD: the requested delta is its pan floor
    arguments = {k: v for k, v in common.items() if k in parameters}
    options = dict(config.learner.options)
    if "pan_delta" in options:  # the one setting a learner option may override (e.g. null: no floor)
        arguments.pop("pan_delta", None)
    if "loss" in parameters and "loss" not in options:
        arguments["loss"] = DEFAULT_LOSS
    accepted = set(parameters) - {"self", "rng"}
    for key, value in options.items():
        if key not in accepted:
            raise ConfigError(
                f"learner.options.{key}: {cls.__name__} has no parameter {key!r}; "
                f"accepted: {', '.join(sorted(accepted - set(common)))}"
            )
        if key in arguments:
            raise ConfigError(f"learner.options.{key}: set it through its own setting, not options")
        arguments[key] = value
    missing = [
        p.name for p in parameters.values()
        if p.default is inspect.Parameter.empty and p.name not in ("self", "rng") and p.name not in arguments
    ]
    if missing:
        raise ConfigError(
            f"learner {config.learner.name!r} needs " + ", ".join(f"learner.options.{m}{hint(m)}" for m in missing)
            + f" (constructor arguments of {cls.__name__} without a default)"
        )
    return arguments


def build_learner(config: ServiceConfig, n: int) -> Learner:
    """A fresh learner for ``config`` and public stream length ``n``."""
    cls = learner_class(config.learner.name)
    try:
        return cls.from_config(constructor_arguments(config, n), rng=config.learner.seed)
    except InvalidInputError as exc:
        raise ConfigError(f"learner {config.learner.name!r}: {exc}") from None


def restore_learner(name: str, learner_config: Mapping[str, Any], state: Mapping[str, Any], seed: int | None) -> Learner:
    """A learner rebuilt from a checkpoint's learner config and state, ready to learn on
    (:meth:`panpriv.protocols.base.Learner.resumed`)."""
    cls = learner_class(name)
    try:
        learner = cls.from_state_dict(learner_config, state, rng=seed)
        learner.resumed()
        return learner
    except (InvalidInputError, TypeError) as exc:
        raise ConfigError(f"cannot restore learner {name!r} from the checkpoint: {exc}") from None
