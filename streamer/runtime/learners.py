"""The one learner factory: ``--learner NAME`` and its settings → a learner, for every entry point.

``panpriv run`` (from its config), ``panpriv analyze`` and ``panpriv coordinate`` (from their flags)
and a scale-out worker (from the model's public config) build their learners here, from
:class:`LearnerSettings`, so equal settings give equal learners whichever process builds them.
The names and classes come from :mod:`panpriv.protocols.catalogue` (the one list); the defaults are
the constructors' own (radius √d, an intercept, PNSGD's step size and pan floor: each learner's
docstring states the rule), so this module only maps the settings to constructor parameters. A
learner that reads a recording by record index (``learn_recorded``: ``shuffled-pnsgd``, ``shuffle-gd``) is
catalogued the same way; the processor sees what it declares (:mod:`panpriv.streamer.runtime.recorded_driver`) and gives it
a ``file:`` source by index.

Building. The factory passes the common settings to the constructor parameters of the same name,
when the constructor has them (``run``: the config's sections; the roles: the flags of the same names):

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
``rng``             ``learner.seed`` (test/replay mode) or ``None`` (OS entropy per draw)
==================  ================================================================

Everything else comes from ``[learner.options]``, passed as given. An option the constructor does
not accept is an error naming the option and the accepted ones; so is a constructor argument
without a default that no setting gives (reported before any scan of the source).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from panpriv.protocols.base import Learner
from panpriv.protocols.catalogue import UnknownLearnerError, load_learner
from panpriv.protocols.errors import InvalidInputError
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.errors import ConfigError, LearnerUnavailableError
from panpriv.streamer.runtime.option_hints import hint

_STREAM_LENGTH_NAMES = ("horizon", "n")


def planned_length(learner: Learner) -> int | None:
    """The public stream length ``learner`` was built for (its ``horizon`` or ``n``), if it has one."""
    for name in _STREAM_LENGTH_NAMES:
        value = getattr(learner, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def learner_class(name: str) -> type[Learner]:
    """The class catalogued under ``name`` (:func:`panpriv.protocols.catalogue.load_learner`)."""
    try:
        return load_learner(name)
    except UnknownLearnerError as exc:
        raise LearnerUnavailableError(str(exc)) from None


@dataclass(frozen=True)
class LearnerSettings:
    """What every entry point gives the factory (module docstring's table).

    ``n`` is the public stream length (``horizon`` or ``n`` of the constructor; ``None``: not
    given, for a learner that plans without it); ``options`` the rest (``[learner.options]``,
    ``--options``); ``seed`` test/replay mode only (``None``: OS entropy per draw).
    """

    name: str
    dim: int | None
    epsilon: float
    delta: float
    feature_bound: float | None = 1.0
    n: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None

    @classmethod
    def of_config(cls, config: ServiceConfig, n: int) -> LearnerSettings:
        """``panpriv run``'s settings: the config's ``[records]`` and ``[learner]``, and ``n``."""
        return cls(config.learner.name, config.records.dim, config.learner.epsilon, config.learner.delta,
                   config.records.feature_bound, n, dict(config.learner.options), config.learner.seed)


def constructor_arguments(config: ServiceConfig, n: int) -> dict[str, Any]:
    """The keyword arguments (without ``rng``) that :func:`build_learner` passes."""
    return arguments_for(LearnerSettings.of_config(config, n))


def arguments_for(settings: LearnerSettings) -> dict[str, Any]:
    """The keyword arguments (without ``rng``) that :func:`build` passes for ``settings``."""
    cls = learner_class(settings.name)
    parameters = inspect.signature(cls.__init__).parameters
    common: dict[str, Any] = {
        "dim": settings.dim,
        "feature_bound": settings.feature_bound,
        "epsilon": settings.epsilon,
        "delta": settings.delta,
    }
    if settings.n is not None:
        common.update({name: settings.n for name in _STREAM_LENGTH_NAMES})
    if "delta" not in parameters:
        common["pan_delta"] = settings.delta  # PNSGD: the requested delta is its pan floor
    arguments = {k: v for k, v in common.items() if k in parameters}
    options = dict(settings.options)
    if "pan_delta" in options:  # the one setting a learner option may override
        arguments.pop("pan_delta", None)
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
            f"learner {settings.name!r} needs " + ", ".join(f"learner.options.{m}{hint(m)}" for m in missing)
            + f" (constructor arguments of {cls.__name__} without a default)"
        )
    return arguments


def build_learner(config: ServiceConfig, n: int) -> Learner:
    """A fresh learner for ``config`` and public stream length ``n``."""
    return build(LearnerSettings.of_config(config, n))


def build(settings: LearnerSettings) -> Learner:
    """A fresh learner for ``settings`` (every entry point's construction)."""
    cls = learner_class(settings.name)
    try:
        return cls.from_config(arguments_for(settings), rng=settings.seed)
    except InvalidInputError as exc:
        raise ConfigError(f"learner {settings.name!r}: {exc}") from None


def from_public_config(name: str, learner_config: Mapping[str, Any]) -> Learner:
    """A learner rebuilt from the constructor config another process published (a scale-out
    worker from the model record): the same learner as that process's, whatever this process's
    defaults."""
    cls = learner_class(name)
    try:
        return cls.from_config({**cls.legacy_defaults, **learner_config})
    except (InvalidInputError, TypeError) as exc:
        raise ConfigError(f"cannot build learner {name!r} from the published config: {exc}") from None


def restore_learner(name: str, learner_config: Mapping[str, Any], state: Mapping[str, Any], seed: int | None) -> Learner:
    """A learner rebuilt from a checkpoint's learner config and state, ready to learn on
    (:meth:`panpriv.protocols.base.Learner.resumed`). A ``seed`` with a state that
    has learned records is refused (:meth:`panpriv.protocols.base.Learner.from_state_dict`): the seed
    would restart the noise stream and repeat the draws already released."""
    cls = learner_class(name)
    try:
        learner = cls.from_state_dict(learner_config, state, rng=seed)
        learner.resumed()
        return learner
    except (InvalidInputError, TypeError) as exc:
        raise ConfigError(f"cannot restore learner {name!r} from the checkpoint: {exc}") from None
