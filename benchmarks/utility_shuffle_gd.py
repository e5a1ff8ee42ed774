"""Utility of fully interactive shuffle GD (Cheu et al. 2022 Alg. 5) next to pan-private AC-SA, on the shared streams.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.utility_shuffle_gd            # n ∈ {10³, 10⁴}, T ≤ 64 passes
    .venv/bin/python -m benchmarks.utility_shuffle_gd --quick    # logistic, n = 10³, T ≤ 16 (~2 min)

ShuffleGD needs every record in every round, so it runs on a recording replayed T times
(:meth:`panpriv.protocols.shuffle_gd.ShuffleGD.learn_recorded`); it cannot be a row of
:mod:`benchmarks.utility_shuffle`, whose learners see the stream once. Thm 4.9's
T = min{n, ε²n²/(d log²(nd/δ))} (88 at n = 10³, ε = 1; 7 400 at n = 10⁴) times n users per round is
O(n²) work and, under the tight calibration, one slow accountant run per tiny ε₀; the table caps T
(column "T") and says so. Any T is a valid choice for privacy; Lemma B.6's rate assumes Thm 4.9's.

Columns: mean excess population loss (± s.e.) of ShuffleGD with the tight calibration and Lemma
B.6's per-round budget, the same with the ``"solved"`` budget (the largest ε₀ whose composition is
still ε), the paper's calibration with Lemma B.6's budget, and pan-private AC-SA (one pass); the
output ε each ShuffleGD configuration reports after its T rounds (B.6's split leaves part of ε
unused, most of it when T is small). Streams, tasks, δ = 1e-6 and d = 20 are those of
:mod:`benchmarks.utility_pan_acsa`; learners run in the seeded replay mode.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from benchmarks.utility_pan_acsa import DELTA, Setting, feed, mean_se, pan_learner, settings_case2
from panpriv.protocols.shuffle_gd import ShuffleGD, theorem_rounds

VARIANTS = (("tight", "lemma-b6"), ("tight", "solved"), ("paper", "lemma-b6"))
"""(calibration, budget) of the ShuffleGD columns."""


def repetitions(n: int, quick: bool) -> int:
    return {10**3: 3 if quick else 5, 10**4: 2}[n]


def gd_learner(setting: Setting, n: int, epsilon: float, rounds: int, variant: tuple[str, str], seed: int) -> ShuffleGD:
    calibration, budget = variant
    return ShuffleGD(
        setting.task.d, setting.loss, epsilon, DELTA, n=n, rounds=rounds, budget=budget, radius=setting.radius,
        calibration=calibration, rng=seed,
    )


def table(ns: list[int], epsilons: list[float], cap: int, quick: bool) -> None:
    print(f"\n## Shuffle GD (Cheu et al. 2022 Alg. 5), excess population loss, d = 20, δ = 1e-6, T = min(Thm 4.9's T, {cap})\n")
    names = [f"GD {c}, {b}" for c, b in VARIANTS]
    print("| task | n | ε | T (Thm 4.9) | " + " | ".join(names) + " | pan-private AC-SA | output ε of GD: "
          + ", ".join(f"{c}/{b}" for c, b in VARIANTS) + " |")
    print("|---" * (5 + len(VARIANTS) + 1) + "|")
    tasks = settings_case2()[:1] if quick else settings_case2()
    for setting, n in itertools.product(tasks, ns):
        data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(repetitions(n, quick))]
        for epsilon in epsilons:
            T = min(cap, theorem_rounds(n, setting.task.d, epsilon, DELTA))
            cells, reported = [], []
            for variant in VARIANTS:
                excess = []
                for r, (X, y) in enumerate(data):
                    learner = gd_learner(setting, n, epsilon, T, variant, r)
                    learner.learn_recorded(lambda i, X=X, y=y: (X[i], y[i]))
                    excess.append(setting.task.excess(learner.release(), setting.loss))
                cells.append(mean_se(excess))
                reported.append(f"{learner.privacy().output.epsilon:.3g}")
            pan = []
            for r, (X, y) in enumerate(data):
                learner = pan_learner(setting, n, epsilon, seed=r)
                feed(learner, X, y)
                pan.append(setting.task.excess(learner.release(), setting.loss))
            print(f"| {setting.name} | {n:.0e} | {epsilon:g} | {T} ({theorem_rounds(n, setting.task.d, epsilon, DELTA)}) | "
                  + " | ".join(cells) + f" | {mean_se(pan)} | " + ", ".join(reported) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="logistic only, n = 1e3, T ≤ 16")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.quick:
        table([10**3], [0.5, 1.0, 4.0], 16, quick=True)
    else:
        table([10**3, 10**4], [0.5, 1.0, 4.0], 64, quick=False)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
