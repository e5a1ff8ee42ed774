"""Utility of the shuffle-model learners next to pan-private AC-SA, on the shared synthetic streams.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.utility_shuffle            # both tasks, n ∈ {10³ … 10⁶}
    .venv/bin/python -m benchmarks.utility_shuffle --quick    # logistic only, n ≤ 10⁵, fewer repetitions
    .venv/bin/python -m benchmarks.utility_shuffle --quick --dim 100 --only shuffle-acsa   # batch rules at d = 100
    .venv/bin/python -m benchmarks.utility_shuffle --quick --only shuffle-acsa   # also restarts (default) vs none

Streams (:mod:`benchmarks.synthetic`, the same as ``benchmarks.utility_pan_acsa``): d = 20 (``--dim``), ‖x‖ = 1,
the logistic stream (‖θ*‖ = 4, Θ of radius 5) and the least-squares stream (‖θ*‖ = 2, radius 3);
δ = 1e-6, ε ∈ {0.5, 1, 4}. Every learner is the real streaming learner fed in micro-batches of
4,096 records, in the seeded replay mode (reproducible; the noise law is that of the default
mode). Table 1 is the mean excess population loss (± standard error over repetitions); Table 2
gives, per learner, its configuration, the guarantee it reports for outputs and for one
intrusion, and its throughput. ``--only TEXT`` keeps the learners whose name contains TEXT.

ShuffleACSA runs with both batch rules (:func:`panpriv.protocols.acsa.noise_dimension`): ``worst-case``
(the default; the rows without a rule) and ``glm`` (issue 17 item 2); the rule changes only the
planned batches, never the privacy noise's calibration.

Adding a learner (e.g. the encoder-based ShuffleSGD / ShuffleACSA / ShuffleGD with
``calibration="paper"`` and ``"tight"``): append a :class:`Row` to :data:`ROWS` — a name and a factory
``(setting, n, epsilon, seed) -> Learner``. Nothing else changes. (ShuffleGD reads a recording T
times, so it has its own table: :mod:`benchmarks.utility_shuffle_gd`.)

Check-in configuration (Balle et al. 2020): the server can run at most :data:`SERVER_SLOTS` slots per stream (the
rate limit that motivates Balle et al. 2020 Alg. 1), so a slot holds ⌈n / 10⁵⌉ records; windows are a tenth of
the stream's slots, at most 10⁴; Alg. 1 checks in with p₀ = 1/(records per slot) (about one
candidate per slot, Balle et al. 2020 Remark 1), Alg. 2 with p₀ = 1.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.baselines import sgd_one_pass
from benchmarks.synthetic import LinearTask, LogisticTask
from panpriv.protocols.base import Learner
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.losses import LogisticLoss, Loss, SquaredLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD, plan_batch_size
from panpriv.protocols.shuffle_sgd import ShuffleSGD

DELTA = 1e-6
MICRO_BATCH = 4096
SERVER_SLOTS = 10**5


@dataclass(frozen=True)
class Setting:
    """A task with its loss and the declared Θ radius (θ* lies inside)."""

    name: str
    task: LogisticTask | LinearTask
    loss: Loss
    radius: float


@dataclass(frozen=True)
class Row:
    """One learner of the comparison: a name and ``build(setting, n, epsilon, seed) -> Learner``
    (``seed=None``: the default OS-entropy mode, used only to read its guarantees)."""

    name: str
    build: Callable[[Setting, int, float, int | None], Learner]


def settings(quick: bool, d: int) -> list[Setting]:
    logistic = Setting("logistic", LogisticTask(d=d, norm=4.0), LogisticLoss(), 5.0)
    linear = LinearTask(d=d, norm=2.0, noise=0.5)
    squares = Setting("least squares", linear, SquaredLoss(label_bound=linear.label_bound), 3.0)
    return [logistic] if quick else [logistic, squares]


def checkin_plan(n: int) -> tuple[int, int]:
    """(records per slot, slots per window) for a stream of n records (module docstring)."""
    per_slot = max(1, math.ceil(n / SERVER_SLOTS))
    return per_slot, min(10_000, max(10, n // per_slot // 10))


def _shuffle_checkin(setting: Setting, n: int, epsilon: float, seed: int | None) -> Learner:
    """Liew & Takahashi 2022 Thm 3: windows of 2b users each joining with probability 1/2 (b messages on average)."""
    b = plan_batch_size(setting.loss.param_dim(setting.task.d), "shuffle", epsilon, DELTA, n)
    return ShuffleGaussianSGD(
        setting.task.d, setting.loss, epsilon, DELTA, participation="checkin", window=2 * b, checkin_rate=0.5,
        radius=setting.radius, rng=seed,
    )


def _checkin(update: str) -> Callable[[Setting, int, float, int | None], Learner]:
    def build(setting: Setting, n: int, epsilon: float, seed: int | None) -> Learner:
        per_slot, slots = checkin_plan(n)
        probability = 1.0 / per_slot if update == "single" else 1.0
        return RandomCheckinSGD(
            setting.task.d, setting.loss, epsilon, DELTA, update=update, slots=slots, slot_length=per_slot,
            checkin_probability=probability, radius=setting.radius, rng=seed,
        )

    return build


ROWS: list[Row] = [
    Row("pan-private AC-SA", lambda s, n, e, seed: PanPrivateACSA(s.task.d, s.loss, e, DELTA, horizon=n, radius=s.radius, rng=seed)),
    Row("shuffle-gaussian (all)", lambda s, n, e, seed: ShuffleGaussianSGD(s.task.d, s.loss, e, DELTA, radius=s.radius, horizon=n, rng=seed)),
    Row("shuffle-gaussian (check-in)", _shuffle_checkin),
    Row("checkin Alg. 1", _checkin("single")),
    Row("checkin Alg. 2", _checkin("averaged")),
    *(Row(f"shuffle-sgd ({c})", lambda s, n, e, seed, c=c: ShuffleSGD(s.task.d, s.loss, e, DELTA, radius=s.radius, horizon=n,
                                                                      calibration=c, rng=seed)) for c in ("tight", "paper")),
    *(Row(f"shuffle-acsa ({c})", lambda s, n, e, seed, c=c: ShuffleACSA(s.task.d, s.loss, e, DELTA, horizon=n, radius=s.radius,
                                                                        calibration=c, rng=seed)) for c in ("tight", "paper")),
    Row("shuffle-acsa (tight, glm)", lambda s, n, e, seed: ShuffleACSA(s.task.d, s.loss, e, DELTA, horizon=n, radius=s.radius,
                                                                     batch_rule="glm", rng=seed)),
    Row("shuffle-acsa (tight, no restarts)", lambda s, n, e, seed: ShuffleACSA(s.task.d, s.loss, e, DELTA, horizon=n,
                                                                             radius=s.radius, restart="none", rng=seed)),
]
"""The learners compared, in column order."""


def describe(learner: Learner) -> str:
    """A short configuration summary for Table 2."""
    if isinstance(learner, ShuffleGaussianSGD):
        size = f"b = {learner.batch_size}" if learner.participation == "all" else f"N = {learner.window}, γ = {learner.checkin_rate:g}"
        return f"{size}, σ = {learner.noise_multiplier:.3g}"
    if isinstance(learner, RandomCheckinSGD):
        return (f"{learner.slot_length:g} rec/slot, m = {learner.slots}, p₀ = {learner.checkin_probability:g}, "
                f"ε₀ = {learner.local_randomizer.local_guarantee().epsilon:.3g}")
    if isinstance(learner, PanPrivateACSA):
        plan = learner.epoch_plans(0)[0]
        return f"b × T = {plan.batch_size(plan.steps)} × {plan.steps}"
    if isinstance(learner, ShuffleSGD):
        return f"b = {learner.vector_sum.n}"
    if isinstance(learner, ShuffleACSA):
        return ", ".join(f"{p.batch_size(p.steps)} × {p.steps}" for p in learner.plans)
    return ""


def repetitions(n: int, quick: bool) -> int:
    return ({10**3: 5, 10**4: 3, 10**5: 1} if quick else {10**3: 10, 10**4: 5, 10**5: 2, 10**6: 1})[n]


def feed(learner: Learner, X: np.ndarray, y: np.ndarray) -> float:
    """Stream X, y through the learner in micro-batches; returns records per second."""
    start = time.perf_counter()
    for i in range(0, X.shape[0], MICRO_BATCH):
        learner.learn_many(X[i : i + MICRO_BATCH], y[i : i + MICRO_BATCH])
    return X.shape[0] / (time.perf_counter() - start)


def mean_se(values: list[float]) -> str:
    m = float(np.mean(values))
    se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return f"{m:.3g} ± {se:.1g}" if len(values) > 1 else f"{m:.3g}"


def run(ns: list[int], epsilons: list[float], quick: bool, d: int, rows: list[Row]) -> None:
    details: list[str] = []
    print(f"\n## Table 1 — excess population loss, d = {d}, δ = 1e-6 (mean ± s.e. over repetitions)\n")
    print("| task | n | ε | " + " | ".join(row.name for row in rows) + " | non-private SGD |")
    print("|---" * (4 + len(rows)) + "|")
    for setting, n in itertools.product(settings(quick, d), ns):
        reps = repetitions(n, quick)
        data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(reps)]
        baseline = [
            setting.task.excess(
                sgd_one_pass(setting.loss, X, y, batch=1, noise_std=0.0, feature_bound=1.0, radius=setting.radius,
                             rng=np.random.default_rng(r)),
                setting.loss,
            )
            for r, (X, y) in enumerate(data)
        ]
        for epsilon in epsilons:
            cells = []
            for row in rows:
                excess, speed = [], []
                for r, (X, y) in enumerate(data):
                    learner = row.build(setting, n, epsilon, r)
                    speed.append(feed(learner, X, y))
                    excess.append(setting.task.excess(learner.release(), setting.loss))
                cells.append(mean_se(excess))
                report = row.build(setting, n, epsilon, None).privacy()  # the default mode's report
                details.append(
                    f"| {setting.name} | {n:.0e} | {epsilon:g} | {row.name} | {describe(learner)} "
                    f"| {report.output.epsilon:.3g} | {report.intrusion.epsilon:.3g} | {np.mean(speed):,.0f} |"
                )
            print(f"| {setting.name} | {n:.0e} | {epsilon:g} | " + " | ".join(cells) + f" | {mean_se(baseline)} |",
                  flush=True)
    print("\n## Table 2 — configuration, reported guarantees (ε at δ = 1e-6, default OS-entropy mode; intrusion = one\n"
          "## read of the state plus all outputs) and throughput\n")
    print("| task | n | ε | learner | configuration | output ε | intrusion ε | records/s |")
    print("|---|---|---|---|---|---|---|---|")
    for line in details:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="logistic only, n ≤ 1e5, fewer repetitions")
    parser.add_argument("--dim", type=int, default=20, help="d of the synthetic streams (default 20)")
    parser.add_argument("--only", default="", help="run only the learners whose name contains this text")
    args = parser.parse_args()
    ns = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6]
    rows = [row for row in ROWS if args.only in row.name]
    start = time.perf_counter()
    run(ns, [0.5, 1.0, 4.0], args.quick, args.dim, rows)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
