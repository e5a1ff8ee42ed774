"""Utility of pan-private AC-SA (000 Alg. 6, Thm C.3) next to its noiseless and central baselines.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.utility_pan_acsa            # full tables (~11 min on 2 cores)
    .venv/bin/python -m benchmarks.utility_pan_acsa --quick    # n ≤ 10⁵, fewer repetitions (~1.5 min)
    .venv/bin/python -m benchmarks.utility_pan_acsa --tune     # the sweep behind protocols.acsa.Tuning

Tables (markdown), all at δ = 1e-6, d = 20, ‖x‖ ≤ 1 (:mod:`benchmarks.synthetic`):

1. Cases 2 of Thm C.3 — logistic and least-squares streams, n ∈ {10³…10⁶}, ε ∈ {0.5, 1, 4}: mean
   excess population loss of ``PanPrivateACSA`` (the real streaming learner, fed in micro-batches
   of 4,096) next to: the same plans without noise ("noiseless"), the central-DP counterpart (one
   noise draw per batch, planned for that noise), central-DP one-pass SGD (000 Alg. 3 with a
   Gaussian sum) and non-private one-pass SGD (b = 1). ``pan/noiseless`` is the cost of noise.
2. The other cases at ε = 1: absolute loss (case 1, Moreau smoothing), absolute + ridge (case 3)
   and squared + ridge (case 4) on the linear stream, logistic + ridge (case 4), and the logistic
   stream with ``horizon=None`` (doubling epochs) — next to the same plans without noise.
3. UCI Adult (:mod:`benchmarks.adult`): test accuracy and AUC of ``PanPrivateACSA`` (logistic,
   intercept, radius 16) at ε ∈ {0.5, 1, 4} next to non-private one-pass SGD, mean over 5 stream
   orders (and noise seeds).

The learners run in the seeded replay mode (reproducible numbers); the noise distribution is the
same as in the default OS-entropy mode.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from accounting.gaussian import analytic_sigma
from benchmarks import adult
from benchmarks.baselines import acsa_with_plans, dp_sgd_batch, sgd_one_pass
from benchmarks.synthetic import LinearTask, LogisticTask
from protocols.acsa import Problem, Tuning, plan_runs
from protocols.losses import AbsoluteLoss, LogisticLoss, Loss, SquaredLoss
from protocols.pan_acsa import FIRST_EPOCH, PanPrivateACSA

DELTA = 1e-6
MICRO_BATCH = 4096
LOGISTIC = LogisticTask(d=20, norm=4.0)
LINEAR = LinearTask(d=20, norm=2.0, noise=0.5)
LOGISTIC_RADIUS, LINEAR_RADIUS = 5.0, 3.0


@dataclass(frozen=True)
class Setting:
    """A task with its loss and the declared Θ radius (θ* lies inside)."""

    name: str
    task: LogisticTask | LinearTask
    loss: Loss
    radius: float


def settings_case2() -> list[Setting]:
    return [
        Setting("logistic", LOGISTIC, LogisticLoss(), LOGISTIC_RADIUS),
        Setting("least squares", LINEAR, SquaredLoss(label_bound=LINEAR.label_bound), LINEAR_RADIUS),
    ]


def repetitions(n: int, quick: bool) -> int:
    reps = {10**3: 20, 10**4: 10, 10**5: 5, 10**6: 3}[n]
    return max(2, reps // 2) if quick else reps


def pan_learner(setting: Setting, n: int | None, epsilon: float, seed: int, **kwargs: object) -> PanPrivateACSA:
    return PanPrivateACSA(
        setting.task.d, setting.loss, epsilon, DELTA, horizon=n, radius=setting.radius, rng=seed, **kwargs
    )


def feed(learner: PanPrivateACSA, X: np.ndarray, y: np.ndarray) -> float:
    """Stream X, y through the learner in micro-batches; returns records per second."""
    start = time.perf_counter()
    for i in range(0, X.shape[0], MICRO_BATCH):
        learner.learn_many(X[i : i + MICRO_BATCH], y[i : i + MICRO_BATCH])
    return X.shape[0] / (time.perf_counter() - start)


def central_problem(learner: PanPrivateACSA, noise_multiplier: float) -> Problem:
    """The learner's planning problem with another noise multiplier (one draw of ζ = 2Ls/b per
    batch: ν = 2s; the pan-private learner's two draws: ν = √8 s)."""
    return Problem.for_loss(
        learner.loss,
        dim=learner.dim,
        feature_bound=learner.feature_bound,
        radius=learner.radius,
        strong_convexity=learner.strong_convexity,
        noise_multiplier=noise_multiplier,
    )


def mean_se(values: list[float]) -> str:
    m = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return f"{m:.3g} ± {se:.1g}"


# -- table 1 -----------------------------------------------------------------------------------


def table_case2(ns: list[int], epsilons: list[float], quick: bool) -> None:
    print("\n## Table 1 — excess population loss, smooth case (Thm C.3 case 2), d = 20, δ = 1e-6\n")
    print("| task | n | ε | b × T | pan-private AC-SA | noiseless (same plan) | pan/noiseless | central AC-SA "
          "| central DP-SGD | non-private SGD | learner rec/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for setting, n in itertools.product(settings_case2(), ns):
        reps = repetitions(n, quick)
        data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(reps)]
        L = setting.loss.lipschitz(1.0, setting.radius)
        sgd = [
            setting.task.excess(
                sgd_one_pass(setting.loss, X, y, batch=1, noise_std=0.0, feature_bound=1.0, radius=setting.radius,
                             rng=np.random.default_rng(r)),
                setting.loss,
            )
            for r, (X, y) in enumerate(data)
        ]
        for epsilon in epsilons:
            s = analytic_sigma(epsilon, DELTA, 1.0)
            pan, quiet, central, dpsgd, speed = [], [], [], [], []
            for r, (X, y) in enumerate(data):
                learner = pan_learner(setting, n, epsilon, seed=r)
                speed.append(feed(learner, X, y))
                pan.append(setting.task.excess(learner.release(), setting.loss))
                plans = learner.epoch_plans(0)
                common = dict(feature_bound=1.0, radius=setting.radius, rng=np.random.default_rng(r))
                quiet.append(setting.task.excess(acsa_with_plans(setting.loss, plans, X, y, noise_std=lambda b: 0.0, **common), setting.loss))
                central_plans = plan_runs(central_problem(learner, 2.0 * s), n, moreau=False)
                central.append(setting.task.excess(
                    acsa_with_plans(setting.loss, central_plans, X, y, noise_std=lambda b: 2 * L * s / b, **common), setting.loss))
                b = dp_sgd_batch(20, s)
                dpsgd.append(setting.task.excess(
                    sgd_one_pass(setting.loss, X, y, batch=b, noise_std=2 * L * s / b, **common), setting.loss))
            plan = plans[0]
            print(f"| {setting.name} | {n:.0e} | {epsilon:g} | {plan.batch_size(plan.steps)} × {plan.steps} "
                  f"| {mean_se(pan)} | {mean_se(quiet)} | {np.mean(pan) / np.mean(quiet):.2f} | {mean_se(central)} "
                  f"| {mean_se(dpsgd)} | {mean_se(sgd)} | {np.mean(speed):,.0f} |", flush=True)


# -- table 2 -----------------------------------------------------------------------------------


def table_other_cases(ns: list[int], quick: bool) -> None:
    epsilon = 1.0
    print("\n## Table 2 — the other cases of Thm C.3 at ε = 1, δ = 1e-6 (and doubling epochs)\n")
    print("| case | stream, loss | n | runs (b × T each) | pan-private AC-SA | noiseless (same plans) | pan/noiseless |")
    print("|---|---|---|---|---|---|---|")
    cases = [
        ("1 non-smooth", Setting("linear, absolute", LINEAR, AbsoluteLoss(), LINEAR_RADIUS), {}),
        ("3 strongly convex", Setting("linear, absolute + ridge 0.05", LINEAR, AbsoluteLoss(ridge=0.05), LINEAR_RADIUS), {}),
        ("4 s.c. + smooth", Setting("linear, squared + ridge 0.05", LINEAR, SquaredLoss(label_bound=LINEAR.label_bound, ridge=0.05), LINEAR_RADIUS), {}),
        ("4 s.c. + smooth", Setting("logistic + ridge 0.01", LOGISTIC, LogisticLoss(ridge=0.01), LOGISTIC_RADIUS), {}),
        ("2, horizon=None", Setting("logistic (doubling epochs)", LOGISTIC, LogisticLoss(), LOGISTIC_RADIUS), {"doubling": True}),
    ]
    for (case, setting, options), n in itertools.product(cases, ns):
        reps = repetitions(n, quick)
        pan, quiet = [], []
        for r in range(reps):
            X, y = setting.task.sample(n, np.random.default_rng(1000 * n + r))
            learner = pan_learner(setting, None if options.get("doubling") else n, epsilon, seed=r)
            feed(learner, X, y)
            pan.append(setting.task.excess(learner.release(), setting.loss))
            if options.get("doubling"):
                plans, epoch = [], 0
                while sum(p.records for p in plans) + learner.epoch_length(epoch) <= n:
                    plans.extend(learner.epoch_plans(epoch))
                    epoch += 1
                used = sum(p.records for p in plans)
                X, y = X[:used], y[:used]  # the noiseless run stops at the last complete epoch
            else:
                plans = list(learner.epoch_plans(0))
            quiet.append(setting.task.excess(
                acsa_with_plans(setting.loss, plans, X, y, feature_bound=1.0, radius=setting.radius,
                                noise_std=lambda b: 0.0, rng=np.random.default_rng(r)), setting.loss))
        shown = plans[-1:] if options.get("doubling") else plans
        runs = ", ".join(f"{p.batch_size(p.steps)}×{p.steps}" for p in shown)
        if options.get("doubling"):
            runs = f"{epoch} epochs of {FIRST_EPOCH}·2^e, last {runs}"
        print(f"| {case} | {setting.name} | {n:.0e} | {runs} | {mean_se(pan)} | {mean_se(quiet)} "
              f"| {np.mean(pan) / np.mean(quiet):.2f} |", flush=True)


# -- table 3 -----------------------------------------------------------------------------------


def table_adult(quick: bool) -> None:
    X_train, y_train, X_test, y_test = adult.load()
    d = X_train.shape[1]
    loss = LogisticLoss(intercept=True)
    radius = 16.0
    reps = 3 if quick else 5
    orders = [np.random.default_rng(r).permutation(X_train.shape[0]) for r in range(reps)]
    print(f"\n## Table 3 — UCI Adult ({X_train.shape[0]:,} train, {X_test.shape[0]:,} test records, d = {d} + "
          "intercept), logistic loss, radius 16, δ = 1e-6\n")
    print("| learner | ε | b × T | test accuracy | test AUC |")
    print("|---|---|---|---|---|")

    def evaluate(scores: Callable[[np.ndarray], np.ndarray]) -> tuple[float, float]:
        p = scores(X_test)
        return float(np.mean((p > 0.5) == (y_test > 0.5))), adult.auc(p, y_test)

    rows = []
    for r, order in enumerate(orders):
        theta = sgd_one_pass(loss, X_train[order], y_train[order], batch=1, noise_std=0.0, feature_bound=1.0,
                             radius=radius, rng=np.random.default_rng(r))
        rows.append(evaluate(lambda X: loss.predict(theta, loss.features(X, 1.0))))
    acc, auc = zip(*rows)
    print(f"| non-private one-pass SGD | ∞ | 1 × {X_train.shape[0]} | {mean_se(list(acc))} | {mean_se(list(auc))} |")
    majority = float(np.mean(y_test < 0.5))
    for epsilon in (0.5, 1.0, 4.0):
        rows = []
        for r, order in enumerate(orders):
            learner = PanPrivateACSA(d, loss, epsilon, DELTA, horizon=X_train.shape[0], radius=radius, rng=r)
            feed(learner, X_train[order], y_train[order])
            rows.append(evaluate(learner.predict_many))
        plan = learner.current_plan() if learner.records_seen < X_train.shape[0] else learner.epoch_plans(0)[0]
        acc, auc = zip(*rows)
        print(f"| pan-private AC-SA | {epsilon:g} | {plan.batch_size(plan.steps)} × {plan.steps} "
              f"| {mean_se(list(acc))} | {mean_se(list(auc))} |", flush=True)
    print(f"\n(majority class: accuracy {majority:.4f})")


# -- tuning ------------------------------------------------------------------------------------


def tune(ns: list[int], epsilons: list[float]) -> None:
    """Sweep C_b (batch) and κ (noise_step) of :class:`protocols.acsa.Tuning` on table 1's streams;
    prints the mean excess loss relative to the best setting of each (task, n, ε) row."""
    grid = list(itertools.product([0.35, 0.5, 0.7, 1.0, 1.4], [0.0625, 0.125, 0.25, 0.5, 1.0]))
    print("\n## Tuning sweep: mean over rows of excess(C_b, κ) / best excess of the row\n")
    ratios: dict[tuple[float, float], list[float]] = {g: [] for g in grid}
    for setting, n, epsilon in itertools.product(settings_case2(), ns, epsilons):
        s = analytic_sigma(epsilon, DELTA, 1.0)
        L = setting.loss.lipschitz(1.0, setting.radius)
        learner = pan_learner(setting, n, epsilon, seed=0)
        problem = central_problem(learner, math.sqrt(8.0) * s)  # two draws, as the learner
        data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(repetitions(n, False))]
        row = {}
        for c_b, kappa in grid:
            plans = plan_runs(problem, n, moreau=False, tuning=Tuning(batch=c_b, noise_step=kappa))
            row[(c_b, kappa)] = np.mean([
                setting.task.excess(acsa_with_plans(setting.loss, plans, X, y, feature_bound=1.0, radius=setting.radius,
                                                    noise_std=lambda b: math.sqrt(2) * 2 * L * s / b,
                                                    rng=np.random.default_rng(r)), setting.loss)
                for r, (X, y) in enumerate(data)
            ])
        best = min(row.values())
        for g in grid:
            ratios[g].append(row[g] / best)
        print(f"{setting.name} n={n:.0e} ε={epsilon:g}: best {min(row, key=row.get)} excess {best:.3g}", flush=True)
    print("\n| C_b \\ κ | " + " | ".join(f"{k:g}" for k in sorted({k for _, k in grid})) + " |")
    print("|---" * (1 + len({k for _, k in grid})) + "|")
    for c_b in sorted({c for c, _ in grid}):
        cells = [f"{np.mean(ratios[(c_b, k)]):.2f}" for k in sorted({k for _, k in grid})]
        print(f"| {c_b:g} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n ≤ 1e5 and fewer repetitions")
    parser.add_argument("--tune", action="store_true", help="run the tuning sweep instead of the tables")
    args = parser.parse_args()
    ns = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6]
    epsilons = [0.5, 1.0, 4.0]
    if args.tune:
        tune(ns, epsilons)
        return
    start = time.perf_counter()
    table_case2(ns, epsilons, args.quick)
    table_other_cases([n for n in ns if n >= 10**4], args.quick)
    table_adult(args.quick)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
