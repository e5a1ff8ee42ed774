"""The requested δ is a promise: no run reports a larger one unless the user agreed to it.

Most learners are calibrated to the requested (ε, δ) and their guarantee is fixed when they are
built. Some are not: PNSGD's δ follows from its noise schedule and grows with the stream (Sordello
et al. 2021, Thms 2 and 7), shuffle-gd's grows with its rounds, and a learner's intrusion guarantee
may add the local guarantee of a message. Before anything is learned, the service compares the
weakest guarantee the learner can come to report over its planned use
(:meth:`panpriv.protocols.base.Learner.planned_privacy`) with ``learner.delta``, and refuses to start when
it is larger, naming the setting that fixes it — unless ``learner.accept_larger_delta`` says the
user accepts the larger δ (it is then printed with every report, as always).
"""

from __future__ import annotations

import math

from panpriv.protocols.base import Learner
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.errors import ConfigError

RELATIVE_TOLERANCE = 1e-9
"""A reported δ within this relative margin of the target is the target (rounding of the accounting)."""

_FIXES = {
    "pnsgd": "set learner.options.pan_delta to the target (the default when pan_delta is not given)",
    "shuffled-pnsgd": "set learner.options.pan_delta to the target (the default when pan_delta is not given)",
    "shuffle-gd": "its intrusion guarantee composes the rounds' outputs with one message's local guarantee; "
                  "learner.options.fit_intrusion = true (the default) plans both within the target",
}


def excess_delta(learner: Learner, target: float) -> tuple[str, float] | None:
    """``("outputs" or "intrusion", δ)`` for the first planned guarantee whose δ exceeds ``target``.

    A guarantee with ε = ∞ claims nothing (seeded test/replay mode reports its intrusion guarantee
    so; ``learner.seed`` is the user's explicit choice): it is not a δ to compare."""
    planned = learner.planned_privacy()
    for which, guarantee in (("outputs", planned.output), ("intrusion", planned.intrusion)):
        if math.isfinite(guarantee.epsilon) and guarantee.delta > target * (1.0 + RELATIVE_TOLERANCE):
            return which, guarantee.delta
    return None


def check_delta_target(learner: Learner, config: ServiceConfig) -> None:
    """Raise :class:`ConfigError` when the learner could report a δ above ``learner.delta`` and the
    user has not accepted that (module docstring)."""
    if config.learner.accept_larger_delta:
        return
    excess = excess_delta(learner, config.learner.delta)
    if excess is None:
        return
    which, delta = excess
    fix = _FIXES.get(learner.name, "see `panpriv privacy` for what sets it")
    raise ConfigError(
        f"learner.delta: {learner.name} would report delta = {delta:.3g} for its {which}, above the requested "
        f"{config.learner.delta:g}; {fix}; or accept the larger delta explicitly with --accept-larger-delta "
        "(learner.accept_larger_delta = true). Nothing was learned."
    )
