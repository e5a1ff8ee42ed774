"""A data-independent rule for more, smaller pan-acsa batches, tried on every shape (issue 38): none wins or ties everywhere.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.acsa_batch_ratio                    # every stream, 3 repetitions (~25 min)
    .venv/bin/python -m benchmarks.acsa_batch_ratio --only flights     # one stream

The candidate rules cap pan-acsa's planned batch (Cheu et al. 2022, proof of Thm 4.3) where its noise
is small against the clip: one batch mean carries noise of norm √p·ν·L/b (ν² = 8s², s the analytic
σ for unit sensitivity; :class:`panpriv.protocols.acsa.Problem`), i.e. a noise-to-clip ratio
ρ(b) = √p·ν/b read off public values only. The rule ``ρ*`` takes b = min(b_planned, ⌈√p·ν/ρ*⌉): where
the planned batch's ratio is below ρ*, it takes smaller batches (more steps) until the ratio is ρ*.
The planner is wrapped here, not changed: the step sizes, restarts and everything else follow the
capped batch exactly as they follow a planned one.

Each rule is paired with the default on the same stream orders and noise seeds (3 repetitions), and
the table gives the mean difference (rule − default): AUC on the real sets, Adult and one-hot (higher
is better), excess loss on the synthetic streams (lower is better). "T" is the number of steps of
the pass.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from benchmarks import real_data
from benchmarks.utility_shapes import Stream, adult_stream, feature_bound, one_hot, real_stream, synthetic
from panpriv.protocols import acsa
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA

DELTA = 1e-6
EPSILONS = (0.5, 1.0, 4.0)
RATIOS = (0.01, 0.02, 0.04)
_planned_batch = acsa._batch_size


def capped(ratio: float | None) -> Callable[..., int]:
    """The planner's batch size, capped at ⌈√p·ν/ρ*⌉ (module docstring); ``None``: unchanged."""

    def batch_size(problem: acsa.Problem, records: int, distance: float, beta: float, tuning: acsa.Tuning,
                   rule: acsa.BatchRule = "worst-case") -> int:
        b = _planned_batch(problem, records, distance, beta, tuning, rule)
        if ratio is None:
            return b
        return int(max(1, min(b, math.ceil(math.sqrt(problem.dim) * problem.noise_multiplier / ratio))))

    return batch_size


def run(stream: Stream, epsilon: float, seed: int, ratio: float | None) -> tuple[float, int]:
    """(score, steps of the first pass) of pan-acsa under the rule."""
    acsa._batch_size = capped(ratio)
    try:
        order = np.random.default_rng(1000 + seed).permutation(len(stream.y))
        X, y = stream.X[order], stream.y[order]
        d = X.shape[1]
        learner = PanPrivateACSA(d, LogisticLoss(intercept=stream.intercept), epsilon, DELTA, horizon=len(y),
                                 radius=math.sqrt(d), feature_bound=feature_bound(stream), rng=seed)
        steps = learner.current_plan().steps
        for start in range(0, len(y), 4096):
            learner.learn_many(X[start : start + 4096], y[start : start + 4096])
        return stream.score(learner.release()), steps
    finally:
        acsa._batch_size = _planned_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated stream name prefixes")
    args = parser.parse_args()
    rng = np.random.default_rng(11)
    builders: list[Callable[[], Stream]] = [lambda name=d.name: real_stream(name) for d in real_data.DATA_SETS]
    builders += [lambda: adult_stream(rng), lambda: one_hot(200_000, rng), lambda: synthetic(20, 100_000, rng),
                 lambda: synthetic(100, 100_000, rng), lambda: synthetic(1000, 50_000, rng)]
    print("pan-acsa: default plan vs the cap b <= sqrt(p) nu / rho*; mean over "
          f"{args.repetitions} paired repetitions; difference = rule - default\n")
    print("| stream | eps | default (T) | " + " | ".join(f"rho* = {r:g}: diff (T)" for r in RATIOS) + " |")
    print("|---|---|---|" + "---|" * len(RATIOS))
    for build in builders:
        stream = build()
        if args.only and not any(stream.name.startswith(p) for p in args.only.split(",")):
            continue
        for epsilon in EPSILONS:
            base = [run(stream, epsilon, seed, None) for seed in range(args.repetitions)]
            cells = []
            for ratio in RATIOS:
                ruled = [run(stream, epsilon, seed, ratio) for seed in range(args.repetitions)]
                diff = float(np.mean([a - b for (a, _), (b, _) in zip(ruled, base)]))
                cells.append(f"{diff:+.4f} ({ruled[0][1]})")
            print(f"| {stream.name} | {epsilon:g} | {np.mean([s for s, _ in base]):.4f} ({base[0][1]}) | "
                  + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
