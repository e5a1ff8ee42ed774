"""pan-ftrl (pan-private DP-FTRL by tree aggregation) against pan-acsa and the one-pass baselines.

Run (from the repository root; the real data sets need ``pip install -e '.[realdata]'``)::

    .venv/bin/python -m benchmarks.utility_ftrl --real                      # the four public real data sets
    .venv/bin/python -m benchmarks.utility_ftrl --synthetic                 # synthetic d = 20/100/1000, one-hot, Adult
    .venv/bin/python -m benchmarks.utility_ftrl --real --plot docs/img/utility_ftrl_real.png
    .venv/bin/python -m benchmarks.utility_ftrl --quick --synthetic         # smaller n, one repetition
    .venv/bin/python -m benchmarks.utility_ftrl --real --checkpoint-cost    # the price of the checkpoint rule

Per stream and ε ∈ {0.5, 1, 4} (δ = 1e-6, logistic loss with an intercept where the stream has
one, radius √d: the service's defaults), mean over repetitions (stream order and noise seeds):

- **pan-ftrl**: :class:`panpriv.protocols.pan_ftrl.PanPrivateFTRL` with its defaults, fed in
  micro-batches of 4,096 — the real streaming learner;
- **pan-acsa**: :class:`panpriv.protocols.pan_acsa.PanPrivateACSA` with its defaults;
- **twins**: the same plans without noise — pan-ftrl's leaves and η
  (:func:`benchmarks.baselines.ftrl_with_plan` with ``node_std = 0``), pan-acsa's batches, step
  sizes and restarts (:func:`benchmarks.baselines.acsa_with_plans`): what each plan allows;
- **central DP-FTRL**: the same leaves, one draw per node calibrated for the outputs only
  (Kairouz et al. 2021's mechanism, no intrusion guarantee) and η for that noise — the price of
  the second draw;
- **central DP-SGD, one pass**: disjoint batches of b = ⌈2√p·s⌉, one Gaussian draw per batch (no
  intrusion guarantee); **non-private one-pass SGD** (b = 1).

``--checkpoint-cost`` instead compares pan-ftrl fed as above with the same learner persisted every
10,000 records (``checkpoint_state()``, the service's default cadence ``checkpoint.every_records``;
``--checkpoint-every N`` for another):
each persisted state adds two draws to every open node, the rule that keeps persisted states safe.

Metric: test AUC on the held-out part (real sets, Adult, one-hot; higher is better) or excess
population logistic loss (synthetic, :mod:`benchmarks.synthetic`; lower is better). The closing
lines give, per real set, pan-acsa's and pan-ftrl's gaps to non-private SGD at ε = 1 and whether
the gap was halved, and the ε = 4 comparison.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import real_data
from benchmarks.baselines import acsa_with_plans, dp_sgd_batch, ftrl_with_plan, sgd_one_pass
from benchmarks.utility_shapes import Stream, adult_stream, epsilon_panels, feature_bound, one_hot, real_stream, synthetic
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.tree import tree_sigma
from panpriv.protocols.base import Learner
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import SENSITIVITY_SLACK, PanPrivateACSA
from panpriv.protocols.pan_ftrl import PanPrivateFTRL

DELTA = 1e-6
EPSILONS = (0.5, 1.0, 4.0)
MICRO_BATCH = 4096
METHODS = ("pan-ftrl", "pan-acsa", "pan-ftrl twin", "pan-acsa twin", "central DP-FTRL", "central DP-SGD",
           "non-private SGD")


def feed(learner: Learner, X: np.ndarray, y: np.ndarray) -> None:
    for start in range(0, len(y), MICRO_BATCH):
        learner.learn_many(X[start : start + MICRO_BATCH], y[start : start + MICRO_BATCH])


def scores(stream: Stream, epsilon: float, seed: int) -> dict[str, float]:
    """One repetition: every method on the stream in the order of ``seed``."""
    order = np.random.default_rng(1000 + seed).permutation(len(stream.y))
    X, y = stream.X[order], stream.y[order]
    d = X.shape[1]
    radius, bound = math.sqrt(d), feature_bound(stream)
    loss = LogisticLoss(intercept=stream.intercept)
    out: dict[str, float] = {}

    ftrl = PanPrivateFTRL(d, loss, epsilon, DELTA, horizon=len(y), radius=radius, feature_bound=bound, rng=seed)
    feed(ftrl, X, y)
    out["pan-ftrl"] = stream.score(ftrl.release())
    plan = ftrl.plan(0)
    rng = np.random.default_rng(seed)
    common = {"feature_bound": bound, "radius": radius}
    out["pan-ftrl twin"] = stream.score(ftrl_with_plan(loss, plan, X, y, node_std=0.0, rng=rng, **common))
    central = tree_sigma(epsilon, DELTA, plan.leaves, 2.0 * ftrl.gradient_norm_bound) * (1.0 + SENSITIVITY_SLACK)
    central_eta = radius / (central * math.sqrt(plan.levels / 2 * loss.param_dim(d)))  # the same rule, one draw
    out["central DP-FTRL"] = stream.score(ftrl_with_plan(loss, plan, X, y, node_std=central, eta=central_eta, rng=rng,
                                                         **common))

    acsa = PanPrivateACSA(d, loss, epsilon, DELTA, horizon=len(y), radius=radius, feature_bound=bound, rng=seed)
    feed(acsa, X, y)
    out["pan-acsa"] = stream.score(acsa.release())
    out["pan-acsa twin"] = stream.score(acsa_with_plans(loss, acsa.epoch_plans(0), X, y, noise_std=lambda b: 0.0, rng=rng,
                                                        restart=True, **common))

    unit = analytic_sigma(epsilon, DELTA, 1.0)
    batch = dp_sgd_batch(loss.param_dim(d), unit)
    out["central DP-SGD"] = stream.score(sgd_one_pass(loss, X, y, batch=batch, noise_std=2.0 * acsa.gradient_norm_bound * unit / batch,
                                                      rng=rng, **common))
    return out


CHECKPOINT_EVERY = 10_000
"""The service's default ``checkpoint.every_records``."""


def checkpoint_cost(stream: Stream, epsilon: float, seed: int, every: int = CHECKPOINT_EVERY) -> tuple[float, float, int]:
    """(score without checkpoints, score persisted every ``every`` records, checkpoints)."""
    order = np.random.default_rng(1000 + seed).permutation(len(stream.y))
    X, y = stream.X[order], stream.y[order]
    d = X.shape[1]
    loss = LogisticLoss(intercept=stream.intercept)
    scored = []
    for interval in (None, every):
        learner = PanPrivateFTRL(d, loss, epsilon, DELTA, horizon=len(y), radius=math.sqrt(d),
                                 feature_bound=feature_bound(stream), rng=seed)
        step = interval or MICRO_BATCH
        for start in range(0, len(y), step):
            learner.learn_many(X[start : start + step], y[start : start + step])
            if interval is not None:
                learner.checkpoint_state()
        scored.append(stream.score(learner.release()))
    return scored[0], scored[1], -(-len(y) // every)


def nonprivate(stream: Stream, seed: int) -> float:
    order = np.random.default_rng(1000 + seed).permutation(len(stream.y))
    d = stream.X.shape[1]
    return stream.score(sgd_one_pass(LogisticLoss(intercept=stream.intercept), stream.X[order], stream.y[order], batch=1,
                                     noise_std=0.0, feature_bound=feature_bound(stream), radius=math.sqrt(d),
                                     rng=np.random.default_rng(seed)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", action="store_true", help="the public real data sets of benchmarks.real_data")
    parser.add_argument("--synthetic", action="store_true", help="synthetic d = 20/100/1000, one-hot and Adult")
    parser.add_argument("--quick", action="store_true", help="smaller synthetic n, one repetition")
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--only", default=None, help="comma-separated stream name prefixes to run")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the table (needs matplotlib)")
    parser.add_argument("--checkpoint-cost", action="store_true", help="pan-ftrl with and without a checkpoint every N records")
    parser.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY, help="N for --checkpoint-cost")
    args = parser.parse_args()
    repetitions = args.repetitions or (1 if args.quick else 3)
    n = 30_000 if args.quick else 100_000
    rng = np.random.default_rng(11)
    builders: list[Callable[[], Stream]] = []
    if args.real:
        builders += [lambda name=data_set.name: real_stream(name) for data_set in real_data.DATA_SETS]
    if args.synthetic:
        builders += [lambda: synthetic(20, n, rng), lambda: synthetic(100, n, rng), lambda: synthetic(1000, n // 2, rng),
                     lambda: one_hot(2 * n, rng), lambda: adult_stream(rng)]
    if not builders:
        parser.error("choose --real and/or --synthetic")
    if args.checkpoint_cost:
        print(f"pan-ftrl without checkpoints and persisted every {args.checkpoint_every:,} records; mean of {repetitions}\n")
        print(f"| stream | eps | no checkpoint | checkpoint every {args.checkpoint_every:,} | checkpoints |")
        print("|---|---|---|---|---|")
        for build in builders:
            stream = build()
            if args.only and not any(stream.name.startswith(prefix) for prefix in args.only.split(",")):
                continue
            for epsilon in EPSILONS:
                costs = [checkpoint_cost(stream, epsilon, seed, args.checkpoint_every) for seed in range(repetitions)]
                print(f"| {stream.name} | {epsilon:g} | {np.mean([c[0] for c in costs]):.4f} | "
                      f"{np.mean([c[1] for c in costs]):.4f} | {costs[0][2]} |", flush=True)
        return
    results: list[tuple[str, int, float, dict[str, float]]] = []
    print(f"delta = {DELTA:g}, radius sqrt(d), logistic loss; mean of {repetitions} repetition(s) (stream orders and noise)\n")
    print("| stream | n | eps | " + " | ".join(METHODS) + " |")
    print("|---|---|---|" + "---|" * len(METHODS))
    for build in builders:
        started = time.perf_counter()
        stream = build()
        if args.only and not any(stream.name.startswith(prefix) for prefix in args.only.split(",")):
            continue
        sgd = float(np.mean([nonprivate(stream, seed) for seed in range(repetitions)]))
        for epsilon in EPSILONS:
            runs = [scores(stream, epsilon, seed) for seed in range(repetitions)]
            row = {method: float(np.mean([r[method] for r in runs])) for method in runs[0]}
            row["non-private SGD"] = sgd
            results.append((stream.name, len(stream.y), epsilon, row))
            print(f"| {stream.name} | {len(stream.y):,} | {epsilon:g} | "
                  + " | ".join(f"{row[m]:.4f}" for m in METHODS) + " |", flush=True)
        print(f"<!-- {stream.name}: {time.perf_counter() - started:.0f} s -->", flush=True)
    print()
    for line in goal_lines(results):
        print(line)
    if args.plot is not None:
        plot(results, repetitions, args.plot)
        print(f"wrote {args.plot}")


def goal_lines(results: list[tuple[str, int, float, dict[str, float]]]) -> list[str]:
    """Per AUC stream: the gaps to non-private SGD at ε = 1 (halved?) and pan-ftrl − pan-acsa at ε = 4."""
    lines = []
    for name, _, epsilon, row in results:
        if "(AUC)" not in name or epsilon != 1.0:
            continue
        acsa_gap = row["non-private SGD"] - row["pan-acsa"]
        ftrl_gap = row["non-private SGD"] - row["pan-ftrl"]
        at_four = next(r for s, _, e, r in results if s == name and e == 4.0)
        lines.append(
            f"- {name.split(' (')[0]}: at eps = 1 the gap to non-private SGD is {acsa_gap:.4f} (pan-acsa) and "
            f"{ftrl_gap:.4f} (pan-ftrl): {'halved' if ftrl_gap <= acsa_gap / 2 else 'not halved'}; at eps = 4 "
            f"pan-ftrl - pan-acsa = {at_four['pan-ftrl'] - at_four['pan-acsa']:+.4f}"
        )
    return lines


STYLES = {
    "pan-ftrl": {"marker": "o", "color": "C3"},
    "pan-acsa": {"marker": "s", "color": "C0"},
    "pan-ftrl twin": {"linestyle": "--", "color": "C3"},
    "pan-acsa twin": {"linestyle": "--", "color": "C0"},
    "central DP-FTRL": {"linestyle": ":", "marker": "^", "color": "C1"},
    "central DP-SGD": {"linestyle": ":", "marker": "v", "color": "C2"},
    "non-private SGD": {"linestyle": "-.", "color": "k"},
}


def plot(results: list[tuple[str, int, float, dict[str, float]]], repetitions: int, path: Path) -> None:
    """One panel per stream: each method's score against ε (log scale; excess loss on a log axis)."""
    streams = list(dict.fromkeys(name for name, _, _, _ in results))
    panels = [(name, [(epsilon, row) for stream, _, epsilon, row in results if stream == name]) for name in streams]
    epsilon_panels(panels, [(method, method, STYLES[method]) for method in METHODS],
                   f"pan-ftrl, pan-acsa, their noiseless twins and one-pass baselines (mean of {repetitions})", path,
                   log_excess=True)

if __name__ == "__main__":
    main()
