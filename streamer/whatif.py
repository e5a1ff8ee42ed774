"""``panpriv privacy``: what a configuration would add as noise, and what a noise level guarantees.

Two directions, both without touching any data:

- **target → noise**: build the learner for (n, ε, δ, dimension, bounds, options) and report its
  planned batches and the standard deviation of every noise draw, with both guarantees (outputs;
  one intrusion plus outputs).
- **noise → guarantee**: for a noise multiplier z (the standard deviation of a draw divided by the
  ℓ2 sensitivity it protects), the smallest ε with which the Gaussian mechanism is (ε, δ)-DP
  (Balle & Wang 2018, Thm 8, via :func:`accounting.gaussian.analytic_epsilon`); for pan-private
  AC-SA each draw alone protects its batch (Cheu et al. 2022, Lemma C.4), so this is the per-record guarantee
  for outputs and for one intrusion.

Per-learner calculators live in :data:`CALCULATORS`; a learner without one gets its report only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from accounting.gaussian import analytic_epsilon
from accounting.ledger import PrivacyReport
from protocols.base import Learner
from streamer.config import ServiceConfig
from streamer.learners import build_learner


@dataclass(frozen=True)
class WhatIf:
    """The answer: the report of the would-be learner and learner-specific noise lines."""

    report: PrivacyReport
    lines: tuple[str, ...]


def _pan_acsa_lines(learner: Learner) -> list[str]:
    plan = learner.current_plan()  # type: ignore[attr-defined]
    sizes = sorted({plan.batch_size(t) for t in range(1, plan.steps + 1)})
    lines = [
        f"records per run: {plan.records:,}; batches T = {plan.steps:,} of b = "
        + " or ".join(f"{b:,}" for b in sizes)
        + " records",
        "per batch: two "
        + ("exact discrete Gaussian (noise = secure)" if getattr(learner, "noise", "gaussian") == "secure" else "Gaussian")
        + " draws (at its start and its end), each with standard deviation",
    ]
    for b in sizes:
        lines.append(f"  zeta = {learner.batch_noise_std(b):.6g} for b = {b:,} (l2 sensitivity of the batch mean 2L/b)")  # type: ignore[attr-defined]
    lines.append(f"per-record gradients clipped to norm L = {learner.gradient_norm_bound:.6g}")  # type: ignore[attr-defined]
    lines.append("Moreau smoothing: " + ("none (smooth loss)" if plan.smoothing is None else f"beta_s = {plan.smoothing:.6g}"))
    lines.append(f"restarts: {learner.restart} (post-processing; no effect on the guarantee)")  # type: ignore[attr-defined]
    return lines


CALCULATORS: dict[str, Callable[[Learner], list[str]]] = {"pan-acsa": _pan_acsa_lines}


def target_to_noise(config: ServiceConfig, n: int) -> WhatIf:
    """The would-be learner's report and noise for ``config`` and stream length ``n``."""
    learner = build_learner(config, n)
    calculator = CALCULATORS.get(learner.name)
    lines = calculator(learner) if calculator else ["(no noise calculator for this learner yet)"]
    return WhatIf(learner.privacy(), tuple(lines))


def noise_to_epsilon(noise_multiplier: float, delta: float) -> float:
    """ε of the Gaussian mechanism with σ/Δ = ``noise_multiplier`` at ``delta`` (Balle & Wang)."""
    return analytic_epsilon(noise_multiplier, delta, 1.0)
