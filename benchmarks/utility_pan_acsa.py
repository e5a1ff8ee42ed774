"""Utility of pan-private AC-SA (Cheu et al. 2022 Alg. 6, Thm C.3) next to its noiseless and central baselines.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.utility_pan_acsa            # full tables (~12 min on 2 cores)
    .venv/bin/python -m benchmarks.utility_pan_acsa --quick    # n ≤ 10⁵, fewer repetitions (~1 min)
    .venv/bin/python -m benchmarks.utility_pan_acsa --tune     # the sweep behind RESTART_TUNING
    .venv/bin/python -m benchmarks.utility_pan_acsa --plot docs/img/utility_n.png   # table 1 as curves too

Tables (markdown), all at δ = 1e-6, d = 20, ‖x‖ ≤ 1 (:mod:`benchmarks.synthetic`):

1. Case 2 of Thm C.3 — the logistic stream, and the least-squares stream with the declared gradient
   bound C = 0.5 (:data:`LINEAR_GRADIENT_BOUND`), n ∈ {10³…10⁶}, ε ∈ {0.5, 1, 4}: mean excess
   population loss of ``PanPrivateACSA`` with its defaults (gradient restarts; the real streaming
   learner, fed in micro-batches of 4,096) next to: the same learner without noise (same plan,
   restarts, clipping: "noiseless"), the central-DP counterpart (one noise draw per batch, planned
   for that noise), central-DP one-pass SGD (Cheu et al. 2022 Alg. 3 with a Gaussian sum) and non-private
   one-pass SGD (b = 1). ``pan/noiseless`` is the cost of the noise.
1b. At the largest n and ε = 1: restarts on/off (off = Lan's method with Cheu et al.'s parameters) and,
   for least squares, C ∈ {L = 5.5, 2.5, 1, 0.5}.
2. The other cases at ε = 1: absolute loss (case 1, Moreau smoothing), absolute + ridge (case 3)
   and squared + ridge (case 4) on the linear stream, logistic + ridge (case 4), and the logistic
   stream with ``horizon=None`` (doubling epochs) — next to the same learner without noise.
3. UCI Adult (:mod:`benchmarks.adult`): test accuracy and AUC of the service's default learner
   (``make run``'s configuration, :data:`panpriv.streamer.config.ADULT_DEMO`) at ε ∈ {0.5, 1, 4} next to
   non-private one-pass SGD on the same encoding, mean over 5 stream orders (and noise seeds).

The learners run in the seeded replay mode (reproducible numbers); the noise distribution is the
same as in the default OS-entropy mode.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks import adult
from benchmarks.baselines import acsa_with_plans, dp_sgd_batch, sgd_one_pass
from benchmarks.synthetic import LinearTask, LogisticTask
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.protocols.acsa import RESTART_TUNING, Problem, effective_gradient_bound, plan_runs
from panpriv.protocols.base import Learner
from panpriv.protocols.losses import AbsoluteLoss, LogisticLoss, Loss, SquaredLoss
from panpriv.protocols.pan_acsa import FIRST_EPOCH, PanPrivateACSA
from panpriv.streamer.config import ADULT_DEMO, load_config
from panpriv.streamer.runtime.learners import build_learner

DELTA = 1e-6
MICRO_BATCH = 4096
LOGISTIC = LogisticTask(d=20, norm=4.0)
LINEAR = LinearTask(d=20, norm=2.0, noise=0.5)
LOGISTIC_RADIUS, LINEAR_RADIUS = 5.0, 3.0
LINEAR_GRADIENT_BOUND = LINEAR.noise
"""The declared per-record gradient bound C of the squared-loss learners, by a public rule: C = a·R,
a = 0.5 the declared bound on the model's noise (y = ⟨θ*, x⟩ + e, |e| ≤ a — the same declaration
that gives the label bound Y = ‖θ*‖ + a). Residuals beyond C/‖x‖ are Huberised
(:func:`panpriv.protocols.acsa.effective_gradient_bound`); at θ* no residual exceeds a, so the surrogate
keeps θ* as its minimiser. The worst case over Θ is L = (rR + Y)R = 5.5: noise calibrated to it
is 11× larger than the stream's gradients near θ* need. Table 1b shows other choices of C."""


@dataclass(frozen=True)
class Setting:
    """A task with its loss, the declared Θ radius (θ* lies inside) and gradient bound C."""

    name: str
    task: LogisticTask | LinearTask
    loss: Loss
    radius: float
    gradient_bound: float | None = None


def settings_case2() -> list[Setting]:
    return [
        Setting("logistic", LOGISTIC, LogisticLoss(), LOGISTIC_RADIUS),
        Setting(
            f"least squares, C = {LINEAR_GRADIENT_BOUND:g}",
            LINEAR,
            SquaredLoss(label_bound=LINEAR.label_bound),
            LINEAR_RADIUS,
            LINEAR_GRADIENT_BOUND,
        ),
    ]


def repetitions(n: int, quick: bool) -> int:
    reps = {10**3: 20, 10**4: 10, 10**5: 6, 10**6: 6}[n]
    return max(2, reps // 2) if quick else reps


def pan_learner(setting: Setting, n: int | None, epsilon: float, seed: int, **kwargs: object) -> PanPrivateACSA:
    return PanPrivateACSA(
        setting.task.d, setting.loss, epsilon, DELTA, horizon=n, radius=setting.radius,
        gradient_bound=setting.gradient_bound, rng=seed, **kwargs,
    )


def same_learner_options(setting: Setting, learner: PanPrivateACSA) -> dict[str, object]:
    """The options of :func:`benchmarks.baselines.acsa_with_plans` that make it the learner's
    algorithm (gradient bound and restarts) on this setting."""
    return dict(feature_bound=1.0, radius=setting.radius, gradient_bound=setting.gradient_bound,
                restart=learner.restart == "gradient")


def feed(learner: Learner, X: np.ndarray, y: np.ndarray) -> float:
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
        gradient_bound=learner.gradient_bound,
    )


def mean_se(values: list[float]) -> str:
    m = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return f"{m:.3g} ± {se:.1g}"


# -- table 1 -----------------------------------------------------------------------------------


Curve = dict[tuple[str, str, float], dict[int, float]]
"""(stream, method, ε) → {n: mean excess loss}, what :func:`plot_curves` draws."""


def table_case2(ns: list[int], epsilons: list[float], quick: bool) -> Curve:
    """Print table 1 and return its means as curves."""
    curves: Curve = {}
    print("\n## Table 1 — excess population loss, smooth case (Thm C.3 case 2), d = 20, δ = 1e-6\n")
    print("| task | n | ε | b × T | pan-private AC-SA | noiseless (same learner) | pan/noiseless | central AC-SA "
          "| central DP-SGD | non-private SGD | learner rec/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for setting, n in itertools.product(settings_case2(), ns):
        reps = repetitions(n, quick)
        data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(reps)]
        L = effective_gradient_bound(setting.loss, 1.0, setting.radius, setting.gradient_bound)
        sgd = [
            setting.task.excess(
                sgd_one_pass(setting.loss, X, y, batch=1, noise_std=0.0, feature_bound=1.0, radius=setting.radius,
                             gradient_bound=setting.gradient_bound, rng=np.random.default_rng(r)),
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
                same = same_learner_options(setting, learner)
                quiet.append(setting.task.excess(acsa_with_plans(
                    setting.loss, plans, X, y, noise_std=lambda b: 0.0, rng=np.random.default_rng(r), **same), setting.loss))
                central_plans = plan_runs(central_problem(learner, 2.0 * s), n, moreau=False, tuning=learner.tuning)
                central.append(setting.task.excess(acsa_with_plans(
                    setting.loss, central_plans, X, y, noise_std=lambda b: 2 * L * s / b, rng=np.random.default_rng(r),
                    **same), setting.loss))
                b = dp_sgd_batch(20, s)
                dpsgd.append(setting.task.excess(sgd_one_pass(
                    setting.loss, X, y, batch=b, noise_std=2 * L * s / b, feature_bound=1.0, radius=setting.radius,
                    gradient_bound=setting.gradient_bound, rng=np.random.default_rng(r)), setting.loss))
            plan = plans[0]
            print(f"| {setting.name} | {n:.0e} | {epsilon:g} | {plan.batch_size(plan.steps)} × {plan.steps} "
                  f"| {mean_se(pan)} | {mean_se(quiet)} | {np.mean(pan) / np.mean(quiet):.2f} | {mean_se(central)} "
                  f"| {mean_se(dpsgd)} | {mean_se(sgd)} | {np.mean(speed):,.0f} |", flush=True)
            for method, values in (("pan-acsa", pan), ("noiseless twin", quiet), ("central AC-SA", central),
                                   ("central DP-SGD", dpsgd), ("non-private SGD", sgd)):
                curves.setdefault((setting.name, method, epsilon), {})[n] = float(np.mean(values))
    return curves


def plot_curves(curves: Curve, path: Path) -> None:
    """Per stream: excess loss against n at ε = 1 for every method (left), and pan-acsa's against
    n for each ε (right); log–log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = list(dict.fromkeys(stream for stream, _, _ in curves))
    epsilons = sorted({epsilon for _, _, epsilon in curves})
    figure, axes = plt.subplots(len(streams), 2, figsize=(11, 3.8 * len(streams)), squeeze=False)
    for (by_method, by_epsilon), stream in zip(axes, streams):
        for method in ("pan-acsa", "noiseless twin", "central AC-SA", "central DP-SGD", "non-private SGD"):
            points = sorted(curves[(stream, method, 1.0)].items())
            style = {"linestyle": "--"} if method in ("noiseless twin", "non-private SGD") else {"marker": "o"}
            by_method.plot([n for n, _ in points], [v for _, v in points], label=method, **style)
        by_method.set_title(f"{stream}: ε = 1, δ = 1e-6", fontsize=10)
        for epsilon in epsilons:
            points = sorted(curves[(stream, "pan-acsa", epsilon)].items())
            by_epsilon.plot([n for n, _ in points], [v for _, v in points], marker="o", label=f"pan-acsa, ε = {epsilon:g}")
        points = sorted(curves[(stream, "non-private SGD", epsilons[0])].items())
        by_epsilon.plot([n for n, _ in points], [v for _, v in points], linestyle="--", color="grey", label="non-private SGD")
        by_epsilon.set_title(f"{stream}: pan-acsa by ε", fontsize=10)
        for panel in (by_method, by_epsilon):
            panel.set_xscale("log")
            panel.set_yscale("log")
            panel.set_xlabel("records n")
            panel.set_ylabel("excess population loss")
            panel.grid(alpha=0.3, which="both")
            panel.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- table 1b ----------------------------------------------------------------------------------


def table_ablation(n: int, quick: bool) -> None:
    """pan/noiseless at n, ε = 1 for the two utility options: restarts (vs Lan's method with Cheu et al.'s
    parameters) and the declared gradient bound C of the squared loss."""
    epsilon = 1.0
    print(f"\n## Table 1b — restarts and the gradient bound C, n = {n:.0e}, ε = 1, δ = 1e-6\n")
    print("| task | C (L if none) | restart | b × T | pan-private AC-SA | noiseless (same learner) | pan/noiseless |")
    print("|---|---|---|---|---|---|---|")
    logistic, linear = settings_case2()
    variants = [(logistic, None)] + [
        (replace(linear, name="least squares", gradient_bound=c), c) for c in (None, LINEAR.label_bound, 1.0, LINEAR.noise)
    ]
    reps = repetitions(n, quick)
    for (setting, bound), restart in itertools.product(variants, ("none", "gradient")):
        pan, quiet = [], []
        for r in range(reps):
            X, y = setting.task.sample(n, np.random.default_rng(1000 * n + r))
            learner = pan_learner(setting, n, epsilon, seed=r, restart=restart)
            feed(learner, X, y)
            pan.append(setting.task.excess(learner.release(), setting.loss))
            quiet.append(setting.task.excess(acsa_with_plans(
                setting.loss, learner.epoch_plans(0), X, y, noise_std=lambda b: 0.0, rng=np.random.default_rng(r),
                **same_learner_options(setting, learner)), setting.loss))
        plan = learner.epoch_plans(0)[0]
        shown = f"{effective_gradient_bound(setting.loss, 1.0, setting.radius, bound):g}"
        print(f"| {setting.name.split(',')[0]} | {shown} | {restart} | {plan.batch_size(plan.steps)} × {plan.steps} "
              f"| {mean_se(pan)} | {mean_se(quiet)} | {np.mean(pan) / np.mean(quiet):.2f} |", flush=True)


# -- table 2 -----------------------------------------------------------------------------------


def table_other_cases(ns: list[int], quick: bool) -> None:
    """Cases 1, 3, 4 and doubling epochs at ε = 1. The squared + ridge learner declares C = Y·R, not
    :data:`LINEAR_GRADIENT_BOUND`: ridge shrinks the optimum to θ_λ = cθ* (0 < c < 1), where residuals
    reach |⟨θ* − θ_λ, x⟩| + a ≤ ‖θ*‖R + a = Y — beyond C = a, so clipping at a would move the
    surrogate's minimiser (measured: a constant excess of 5.3e-4 at every n)."""
    epsilon = 1.0
    print("\n## Table 2 — the other cases of Thm C.3 at ε = 1, δ = 1e-6 (and doubling epochs)\n")
    print("| case | stream, loss | n | runs (b × T each) | pan-private AC-SA | noiseless (same learner) | pan/noiseless |")
    print("|---|---|---|---|---|---|---|")
    cases = [
        ("1 non-smooth", Setting("linear, absolute", LINEAR, AbsoluteLoss(), LINEAR_RADIUS), {}),
        ("3 strongly convex", Setting("linear, absolute + ridge 0.05", LINEAR, AbsoluteLoss(ridge=0.05), LINEAR_RADIUS), {}),
        ("4 s.c. + smooth", Setting(f"linear, squared + ridge 0.05, C = Y = {LINEAR.label_bound:g}", LINEAR,
                                    SquaredLoss(label_bound=LINEAR.label_bound, ridge=0.05), LINEAR_RADIUS,
                                    LINEAR.label_bound), {}),
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
            quiet.append(setting.task.excess(acsa_with_plans(
                setting.loss, plans, X, y, noise_std=lambda b: 0.0, rng=np.random.default_rng(r),
                **same_learner_options(setting, learner)), setting.loss))
        shown = plans[-1:] if options.get("doubling") else plans
        runs = ", ".join(f"{p.batch_size(p.steps)}×{p.steps}" for p in shown)
        if options.get("doubling"):
            runs = f"{epoch} epochs of {FIRST_EPOCH}·2^e, last {runs}"
        print(f"| {case} | {setting.name} | {n:.0e} | {runs} | {mean_se(pan)} | {mean_se(quiet)} "
              f"| {np.mean(pan) / np.mean(quiet):.2f} |", flush=True)


# -- table 3 -----------------------------------------------------------------------------------


def table_adult(quick: bool) -> None:
    """The service's own Adult learner (:data:`panpriv.streamer.config.ADULT_DEMO`, as ``make run`` builds
    it, at each ε) next to non-private one-pass SGD on the same encoding and Θ."""
    X_train, y_train, X_test, y_test = adult.load()
    n, d = X_train.shape
    radius = ADULT_DEMO["learner"]["options"]["radius"]
    loss = LogisticLoss()
    reps = 3 if quick else 5
    orders = [np.random.default_rng(r).permutation(n) for r in range(reps)]
    print(f"\n## Table 3 — UCI Adult ({n:,} train, {X_test.shape[0]:,} test records, d = {d} incl. bias, "
          f"‖x‖ ≤ √14), the service's default learner (radius √d = {radius:.4g}), δ = 1e-6, {reps} stream orders\n")
    print("| learner | ε | b × T | test accuracy | test AUC |")
    print("|---|---|---|---|---|")

    def evaluate(scores: Callable[[np.ndarray], np.ndarray]) -> tuple[float, float]:
        p = scores(X_test)
        return float(np.mean((p > 0.5) == (y_test > 0.5))), adult.auc(p, y_test)

    rows = []
    for r, order in enumerate(orders):
        theta = sgd_one_pass(loss, X_train[order], y_train[order], batch=1, noise_std=0.0,
                             feature_bound=adult.FEATURE_BOUND, radius=radius, rng=np.random.default_rng(r))
        rows.append(evaluate(lambda X: loss.predict(theta, loss.features(X, adult.FEATURE_BOUND))))
    acc, auc = zip(*rows)
    print(f"| non-private one-pass SGD | ∞ | 1 × {n} | {mean_se(list(acc))} | {mean_se(list(auc))} |")
    majority = float(np.mean(y_test < 0.5))

    def demo(overrides: dict[str, object]) -> tuple[str, str, str]:
        """The demo learner with ``overrides`` over the stream orders: b × T, accuracy, AUC."""
        rows = []
        for r, order in enumerate(orders):
            learner = build_learner(load_config(base=ADULT_DEMO, overrides={**overrides, "learner.seed": r}), n)
            feed(learner, X_train[order], y_train[order])
            rows.append(evaluate(learner.predict_proba_many))
        assert isinstance(learner, PanPrivateACSA)
        plan = learner.epoch_plans(0)[0]
        acc, auc = zip(*rows)
        return f"{plan.batch_size(plan.steps)} × {plan.steps}", mean_se(list(acc)), mean_se(list(auc))

    for epsilon in (0.5, 1.0, 4.0):
        print(f"| pan-private AC-SA | {epsilon:g} | " + " | ".join(demo({"learner.epsilon": epsilon})) + " |", flush=True)
    print(f"\n(majority class: accuracy {majority:.4f})")
    print("\nSensitivity to the radius at ε = 1 (shown, not used to choose it: the demo's radius is the "
          "public rule √d of panpriv.streamer.config.ADULT_RADIUS):\n")
    print("| radius | b × T | test accuracy | test AUC |")
    print("|---|---|---|---|")
    for other in (4.0, 16.0, 32.0):
        options = {**ADULT_DEMO["learner"]["options"], "radius": other}
        print(f"| {other:g} | " + " | ".join(demo({"learner.options": options})) + " |", flush=True)


# -- tuning ------------------------------------------------------------------------------------


BATCH_RULES = [(0.6, 0.7), (0.6, 1.0), (0.6, 1.4), (0.6, 2.0), (0.8, 0.08), (0.8, 0.09), (0.8, 0.1), (0.8, 0.11), (0.8, 0.13)]
"""(exponent e, C_b) of the batch rule b = C_b n^e (…)^{2/5} swept by :func:`tune` (κ = 1/4)."""


def tune(ns: list[int], epsilons: list[float]) -> None:
    """Sweep the batch rule (exponent e and C_b of :class:`panpriv.protocols.acsa.Tuning`) for the
    learner's default algorithm (gradient restarts, the settings' gradient bounds) on table 1's
    streams. Prints, per rule, the mean and worst over (task, n, ε) rows of the excess loss
    relative to the row's best rule, and pan/noiseless at the largest n and ε = 1 per task."""
    print("\n## Batch-rule sweep (restart = gradient, κ = 1/4)\n")
    relative: dict[tuple[float, float], list[float]] = {rule: [] for rule in BATCH_RULES}
    cost: dict[str, dict[tuple[float, float], float]] = {}
    for setting, n, epsilon in itertools.product(settings_case2(), ns, epsilons):
        s = analytic_sigma(epsilon, DELTA, 1.0)
        L = effective_gradient_bound(setting.loss, 1.0, setting.radius, setting.gradient_bound)
        learner = pan_learner(setting, n, epsilon, seed=0)
        problem = central_problem(learner, math.sqrt(8.0) * s)  # two draws, as the learner
        data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(repetitions(n, False))]
        same = same_learner_options(setting, learner)

        def mean_excess(plans: tuple, noise: float) -> float:
            return float(np.mean([
                setting.task.excess(acsa_with_plans(setting.loss, plans, X, y, noise_std=lambda b: noise / b,
                                                    rng=np.random.default_rng(r), **same), setting.loss)
                for r, (X, y) in enumerate(data)
            ]))

        row = {}
        for exponent, c_b in BATCH_RULES:
            plans = plan_runs(problem, n, moreau=False, tuning=replace(RESTART_TUNING, batch=c_b, batch_exponent=exponent))
            row[(exponent, c_b)] = mean_excess(plans, math.sqrt(2) * 2 * L * s)
            if n == max(ns) and epsilon == 1.0:
                cost.setdefault(setting.name, {})[(exponent, c_b)] = row[(exponent, c_b)] / mean_excess(plans, 0.0)
        best = min(row.values())
        for rule in BATCH_RULES:
            relative[rule].append(row[rule] / best)
        print(f"{setting.name} n={n:.0e} ε={epsilon:g}: best (e, C_b) = {min(row, key=row.get)}, excess {best:.3g}", flush=True)

    names = list(cost)
    print("\n| e | C_b | mean excess / row's best | worst row | " + " | ".join(f"pan/noiseless, {k}" for k in names) + " |")
    print("|---" * (4 + len(names)) + "|")
    for rule in BATCH_RULES:
        cells = " | ".join(f"{cost[k][rule]:.2f}" for k in names)
        print(f"| {rule[0]:g} | {rule[1]:g} | {np.mean(relative[rule]):.2f} | {np.max(relative[rule]):.2f} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n ≤ 1e5 and fewer repetitions")
    parser.add_argument("--tune", action="store_true", help="run the tuning sweep instead of the tables")
    parser.add_argument("--plot", type=Path, default=None, help="also draw table 1 as a PNG here (needs matplotlib)")
    args = parser.parse_args()
    ns = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6]
    epsilons = [0.5, 1.0, 4.0]
    if args.tune:
        tune(ns, epsilons)
        return
    start = time.perf_counter()
    curves = table_case2(ns, epsilons, args.quick)
    if args.plot is not None:
        plot_curves(curves, args.plot)
        print(f"wrote {args.plot}", flush=True)
    table_ablation(max(ns), args.quick)
    table_other_cases([n for n in ns if n >= 10**4], args.quick)
    table_adult(args.quick)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
