"""panpriv: streaming, pan-private learning.

The installed package has three parts, one direction of imports:

- :mod:`panpriv.accounting` — privacy math (pure functions of scalars, and ledgers);
- :mod:`panpriv.protocols` — the mechanisms and online learners (numpy array code, no I/O);
- :mod:`panpriv.streamer` — the service: sources, the runtime loop, checkpoints, sinks, the CLI.

In the repository these are the top-level folders ``accounting/``, ``protocols/`` and
``streamer/``; ``panpriv/`` holds this module and a link to each, so that the source tree, the type
checker and the built wheel all see the same import names.

The names a user needs first are re-exported here and imported on first use, so that ``import
panpriv`` (and the ``panpriv`` command, whose start-up time is measured) loads no learner module
it does not use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from panpriv.accounting.accountant import Accountant
    from panpriv.protocols.base import Snapshot
    from panpriv.protocols.checkin import RandomCheckinSGD
    from panpriv.protocols.pan_acsa import PanPrivateACSA
    from panpriv.protocols.pan_ftrl import PanPrivateFTRL
    from panpriv.protocols.pnsgd import OnlinePNSGD, ShuffledPNSGD
    from panpriv.protocols.schema import FeatureSchema
    from panpriv.protocols.shuffle_acsa import ShuffleACSA
    from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
    from panpriv.protocols.shuffle_gd import ShuffleGD
    from panpriv.protocols.shuffle_sgd import ShuffleSGD
    from panpriv.streamer.serving.snapshots import load_snapshot

_EXPORTS: dict[str, str] = {
    "PanPrivateACSA": "panpriv.protocols.pan_acsa",
    "PanPrivateFTRL": "panpriv.protocols.pan_ftrl",
    "OnlinePNSGD": "panpriv.protocols.pnsgd",
    "ShuffledPNSGD": "panpriv.protocols.pnsgd",
    "ShuffleSGD": "panpriv.protocols.shuffle_sgd",
    "ShuffleACSA": "panpriv.protocols.shuffle_acsa",
    "ShuffleGD": "panpriv.protocols.shuffle_gd",
    "ShuffleGaussianSGD": "panpriv.protocols.shuffle_gaussian",
    "RandomCheckinSGD": "panpriv.protocols.checkin",
    "Snapshot": "panpriv.protocols.base",
    "FeatureSchema": "panpriv.protocols.schema",
    "Accountant": "panpriv.accounting.accountant",
    "load_snapshot": "panpriv.streamer.serving.snapshots",
}
"""Re-exported name → the module that defines it."""

__all__ = [
    "__version__",
    "PanPrivateACSA", "PanPrivateFTRL", "OnlinePNSGD", "ShuffledPNSGD", "ShuffleSGD", "ShuffleACSA", "ShuffleGD",
    "ShuffleGaussianSGD", "RandomCheckinSGD", "Snapshot", "FeatureSchema", "Accountant", "load_snapshot",
]


def _installed_version() -> str:
    """The version of the installed distribution (pyproject.toml's ``version``, the one place it is set)."""
    from importlib import metadata

    try:
        return metadata.version("panpriv")
    except metadata.PackageNotFoundError:
        return "unknown"


def __getattr__(name: str) -> Any:
    """Import a re-exported name, or read ``__version__``, on first use (PEP 562): reading the
    distribution's metadata costs milliseconds that the command's start-up need not pay."""
    if name == "__version__":
        globals()[name] = _installed_version()
        return globals()[name]
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'panpriv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
