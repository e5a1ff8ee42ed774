"""``panpriv privacy``: what a configuration would add as noise, and what a noise level guarantees.

Two directions, both without touching any data:

- **target → noise**: build the learner for (n, ε, δ, dimension, bounds, options) and report its
  planned batches and the standard deviation of every noise draw, with both guarantees (outputs;
  one intrusion plus outputs).
- **noise → guarantee**: for a noise multiplier z (the standard deviation of a draw divided by the
  ℓ2 sensitivity it protects), the smallest ε with which the Gaussian mechanism is (ε, δ)-DP
  (Balle & Wang 2018, Thm 8, via :func:`panpriv.accounting.gaussian.analytic_epsilon`); for pan-private
  AC-SA each draw alone protects its batch (Cheu et al. 2022, Lemma C.4), so this is the per-record guarantee
  for outputs and for one intrusion.

The noise lines come from the learner itself (``describe_noise``), from its public configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from panpriv.accounting.gaussian import analytic_epsilon
from panpriv.accounting.ledger import PrivacyReport
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.runtime.delta_target import excess_delta
from panpriv.streamer.runtime.learners import build_learner


@dataclass(frozen=True)
class WhatIf:
    """The answer: the report of the would-be learner and learner-specific noise lines."""

    report: PrivacyReport
    lines: tuple[str, ...]
    planned: PrivacyReport
    """The weakest guarantee over the planned use (:meth:`panpriv.protocols.base.Learner.planned_privacy`)."""
    excess: tuple[str, float] | None
    """Which planned guarantee's δ exceeds the requested δ, and by how much (``panpriv run`` refuses it)."""
    warnings: tuple[str, ...]
    """What the configuration can learn, in plain words (:meth:`panpriv.protocols.base.Learner.utility_warnings`)."""


def target_to_noise(config: ServiceConfig, n: int) -> WhatIf:
    """The would-be learner's report and noise (:meth:`panpriv.protocols.base.Learner.describe_noise`)."""
    learner = build_learner(config, n)
    return WhatIf(learner.privacy(), learner.describe_noise(), learner.planned_privacy(),
                  excess_delta(learner, config.learner.delta), learner.utility_warnings())


def noise_to_epsilon(noise_multiplier: float, delta: float) -> float:
    """ε of the Gaussian mechanism with σ/Δ = ``noise_multiplier`` at ``delta`` (Balle & Wang)."""
    return analytic_epsilon(noise_multiplier, delta, 1.0)
