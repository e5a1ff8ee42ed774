"""Where does a learner beat releasing θ = 0? The noise map of issue 17 (PNSGD, shuffle-gaussian, checkin).

Run (from the repository root)::

    .venv/bin/python -m benchmarks.noise_map            # n ∈ {10⁴, 10⁵, 10⁶}, 3 repetitions (hours; ~1 GB a worker)
    .venv/bin/python -m benchmarks.noise_map --quick    # n ∈ {10⁴, 10⁵}, 1 repetition

``--quick`` takes 450–540 CPU-seconds (about 4.5 minutes on 2 idle cores; 8–15 minutes measured on
a shared machine with a load of 3–6); most of it is checkin, whose defaults take one step per record.

Both write the map as a picture (``--png``, default ``docs/img/noise_map.png``).

Streams: the synthetic logistic streams of :mod:`benchmarks.synthetic` (features uniform on the
unit sphere of R^d, P(y = 1 | x) = σ(⟨θ*, x⟩), ‖θ*‖ = 4, no intercept), one stream per (n, d)
shared by every learner and cell (common random numbers). Grid: n ∈ {10⁴, 10⁵, (10⁶ without
``--quick``)}, d ∈ {5, 20, 100}, radius r of Θ ∈ {1, √d, 10} (√d is the service's default; √100 = 10),
ε ∈ {1, 4, 16}, δ = 1e-6. Each cell is the excess population loss of the released model divided
by that of θ = 0 (the same for every learner of a d): below 1 the learner beats θ = 0, and the
number says by how much. Mean over repetitions (stream and noise seeds).

Learners, each built by the service's own builder (:func:`panpriv.streamer.runtime.learners.build_learner`, as
``panpriv run`` and ``panpriv privacy`` build them: its defaults, its planned parameters), with
the options ``loss = logistic without intercept`` (the streams have none) and ``radius = r``:

- ``pnsgd``: online PNSGD (Sordello et al. 2021, Thm 7 schedule) with the service's pan floor
  ``pan_delta = δ``, η = 1/β = 4 (the largest step of ``benchmarks.utility_pnsgd``; the noise moves
  the iterate by η·σ_t, and σ_t ∝ 1/η, so η does not change the noise's size);
- ``shuffled-pnsgd``: one pass in the learner's random order (Sordello et al. 2021, Thm 5), η = 4.
  Its noise does not depend on ε, so one run (same seed) serves the three ε;
- ``shuffle-gaussian``: participation ``all``, the batch b planned for n (Liew & Takahashi 2022);
- ``checkin``: the defaults (Balle et al. 2020 Alg. 1, single updates, ℓ2 randomizer, sliding
  windows of 1,000 slots, one record per slot, p₀ = 1);
- ``pan-acsa``: the reference (Cheu et al. 2022, Alg. 6), its planned batches.

Every learner runs in the seeded replay mode (``learner.seed``), so the numbers are reproducible;
the noise has the law of the default OS-entropy mode. Next to each cell: ``W`` when the
learner's :meth:`panpriv.protocols.base.Learner.utility_warnings` (computed from the plan, never from
data) warns. The agreement table counts, per learner, warned cells that do / do not beat θ = 0;
for shuffle-gaussian and checkin a second table does the same for SGD's own guarantee at the
planned number of steps (:func:`sgd_bound`), which, unlike the per-step ρ, knows how many steps
average the noise out.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.synthetic import LogisticTask
from panpriv.protocols.base import Learner
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pnsgd import ShuffledPNSGD
from panpriv.protocols.sgd import MessageSGDLearner
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.streamer.config import load_config
from panpriv.streamer.runtime.learners import build_learner

DELTA = 1e-6
NORM = 4.0
DIMS = (5, 20, 100)
EPSILONS = (1.0, 4.0, 16.0)
ETA = 4.0
"""1/β for the logistic loss without intercept at feature bound 1 (β = 1/4)."""
MICRO_BATCH = 4096
LEARNERS = ("pnsgd", "shuffled-pnsgd", "shuffle-gaussian", "checkin", "pan-acsa")
EPSILON_FREE = frozenset({"shuffled-pnsgd"})
"""Learners whose noise, hence whose run for a seed, does not depend on ε."""


def radii(d: int) -> tuple[float, ...]:
    """1, √d (the service's default) and 10 (two radii at d = 100, where √d = 10)."""
    return tuple(sorted({1.0, math.sqrt(d), 10.0}))


@dataclass(frozen=True)
class Cell:
    """One learner at one (n, d, r, ε): excess loss over θ = 0's, and whether it warned."""

    learner: str
    n: int
    d: int
    radius: float
    epsilon: float
    ratio: float
    warned: bool
    rho: float
    """ρ of :meth:`panpriv.protocols.sgd.MessageSGDLearner.noise_to_signal` (NaN for the other learners)."""
    bound: float
    """:func:`sgd_bound` (NaN for the other learners)."""


def sgd_bound(learner: MessageSGDLearner, n: int) -> float:
    """(3/2)·D·C·√((1 + ρ²)/T): the excess-loss guarantee of :class:`panpriv.protocols.sgd.AveragedSGD`
    (Cheu et al. 2022, Lemma 4.2; G² = C²(1 + ρ²), no ridge) at the T steps the plan takes over n
    records — rounds of b records (shuffle-gaussian, ``participation="all"``) or slots of
    ``slot_length`` records (checkin, position slots). Data-independent, like ρ; it needs n."""
    if isinstance(learner, ShuffleGaussianSGD) and learner.batch_size is not None:
        per_step: float = learner.batch_size
    elif isinstance(learner, RandomCheckinSGD):
        per_step = learner.slot_length
    else:
        raise ValueError(f"{learner.name}: no planned step count here")
    clip = learner.loss.lipschitz(learner.feature_bound, learner.radius) if learner.clip is None else learner.clip
    return 1.5 * 2.0 * learner.radius * clip * math.sqrt((1.0 + learner.noise_to_signal() ** 2) * per_step / n)


def build(name: str, n: int, d: int, radius: float, epsilon: float, seed: int) -> Learner:
    """The learner ``panpriv run --learner name`` would build for this cell (seeded replay mode)."""
    options: dict[str, Any] = {"loss": {"name": "logistic", "intercept": False}, "radius": radius}
    if name in ("pnsgd", "shuffled-pnsgd"):
        options["eta"] = ETA
    config = load_config(None, {
        "source.url": "synthetic:n=1&dim=1", "records.format": "json", "records.dim": d, "records.feature_bound": 1.0,
        "learner.name": name, "learner.epsilon": epsilon, "learner.delta": DELTA, "learner.options": options,
        "learner.seed": seed,
    })
    return build_learner(config, n)


def released(learner: Learner, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Feed the stream (in the learner's own order for shuffled-pnsgd) and take a snapshot."""
    if isinstance(learner, ShuffledPNSGD):
        order = learner.next_indices(X.shape[0])
        X, y = X[order], y[order]
    for start in range(0, X.shape[0], MICRO_BATCH):
        learner.learn_many(X[start : start + MICRO_BATCH], y[start : start + MICRO_BATCH])
    return learner.snapshot().params


def stream(task: LogisticTask, n: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Repetition r's stream of n records (seeded: every learner and cell of (n, d, r) sees the same
    records; drawn again for each use, so a worker holds one stream at a time)."""
    return task.sample(n, np.random.default_rng(1000 * n + 7 * task.d + r))


def block(n: int, d: int, name: str, reps: int) -> list[Cell]:
    """One learner at every radius and ε on the streams of one (n, d)."""
    task, loss = LogisticTask(d=d, norm=NORM), LogisticLoss()
    best = task.population_loss(task.optimum(loss), loss)
    zero = task.population_loss(np.zeros(d), loss) - best
    cells = []
    for radius in radii(d):
        excess: list[float] = []
        for epsilon in EPSILONS:
            planned = build(name, n, d, radius, epsilon, 0)
            warned = bool(planned.utility_warnings())
            rho = bound = math.nan
            if isinstance(planned, MessageSGDLearner):
                rho, bound = planned.noise_to_signal(), sgd_bound(planned, n)
            if not excess or name not in EPSILON_FREE:
                excess = [task.population_loss(released(build(name, n, d, radius, epsilon, r), *stream(task, n, r)), loss)
                          - best for r in range(reps)]
            cells.append(Cell(name, n, d, radius, epsilon, float(np.mean(excess)) / zero, warned, rho, bound))
    return cells


def run(ns: list[int], reps: int, workers: int) -> list[Cell]:
    """Every (n, d, learner) block on ``workers`` processes, the longest streams first."""
    jobs = sorted(itertools.product(ns, DIMS, LEARNERS), key=lambda job: -job[0] * job[1])
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(block, n, d, name, reps) for n, d, name in jobs]
        return [cell for future in futures for cell in future.result()]


def _columns(ns: list[int]) -> list[tuple[int, float]]:
    return list(itertools.product(ns, EPSILONS))


def tables(cells: list[Cell], ns: list[int]) -> Iterator[str]:
    """Markdown: one table per learner (rows d, r; columns n, ε), then the agreement counts."""
    index = {(c.learner, c.n, c.d, c.radius, c.epsilon): c for c in cells}
    columns = _columns(ns)
    for name in LEARNERS:
        yield f"\n### {name}: excess loss / excess loss of θ = 0 (**bold** < 1: beats θ = 0; W: warned)\n"
        yield "| d | r | " + " | ".join(f"n = {n:.0e}, ε = {e:g}" for n, e in columns) + " |"
        yield "|---|---|" + "---|" * len(columns)
        for d in DIMS:
            for radius in radii(d):
                row = []
                for n, e in columns:
                    c = index[(name, n, d, radius, e)]
                    value = f"**{c.ratio:.2g}**" if c.ratio < 1.0 else f"{c.ratio:.2g}"
                    row.append(value + (" W" if c.warned else ""))
                yield f"| {d} | {radius:.3g} | " + " | ".join(row) + " |"
    for name in sorted({c.learner for c in cells if not math.isnan(c.rho)}):
        yield f"\n### {name}: predicted noise-to-gradient ratio ρ per step (the warning's number; warns if > 1)\n"
        yield "| d | r | " + " | ".join(f"n = {n:.0e}, ε = {e:g}" for n, e in columns) + " |"
        yield "|---|---|" + "---|" * len(columns)
        for d in DIMS:
            for radius in radii(d):
                yield f"| {d} | {radius:.3g} | " + " | ".join(f"{index[(name, n, d, radius, e)].rho:.3g}" for n, e in columns) + " |"
    yield "\n### Warnings vs the map (cells)\n"
    yield "| learner | warned, beats θ = 0 | warned, does not | no warning, beats | no warning, does not | best ratio (cell) |"
    yield "|---|---|---|---|---|---|"
    for name in LEARNERS:
        own = [c for c in cells if c.learner == name]
        counts = [sum(1 for c in own if c.warned == w and (c.ratio < 1.0) == b) for w in (True, False) for b in (True, False)]
        best = min(own, key=lambda c: c.ratio)
        where = f"{best.ratio:.2g} (n = {best.n:.0e}, d = {best.d}, r = {best.radius:.3g}, ε = {best.epsilon:g})"
        yield f"| {name} | " + " | ".join(str(k) for k in counts) + f" | {where} |"
    yield ("\n### SGD's own bound at the planned steps, (3/2)·D·C·√((1 + ρ²)/T) > 1 (needs n), vs the map "
           "(cells)\n")
    yield "| learner | bound > 1, beats θ = 0 | bound > 1, does not | bound ≤ 1, beats | bound ≤ 1, does not |"
    yield "|---|---|---|---|---|"
    for name in sorted({c.learner for c in cells if not math.isnan(c.bound)}):
        own = [c for c in cells if c.learner == name]
        counts = [sum(1 for c in own if (c.bound > 1.0) == w and (c.ratio < 1.0) == b) for w in (True, False) for b in (True, False)]
        yield f"| {name} | " + " | ".join(str(k) for k in counts) + " |"


def picture(cells: list[Cell], ns: list[int], path: Path, quick: bool) -> None:
    """Heat maps of log10(ratio): one row per learner, one column per d (blue: beats θ = 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = {(c.learner, c.n, c.d, c.radius, c.epsilon): c for c in cells}
    columns = _columns(ns)
    figure, axes = plt.subplots(len(LEARNERS), len(DIMS), figsize=(4.2 * len(DIMS), 1.4 * len(LEARNERS) + 1.2),
                                dpi=110, squeeze=False, gridspec_kw={"hspace": 0.12, "wspace": 0.25})
    image = None
    for (i, name), (j, d) in itertools.product(enumerate(LEARNERS), enumerate(DIMS)):
        ax = axes[i][j]
        grid = np.array([[index[(name, n, d, r, e)].ratio for n, e in columns] for r in radii(d)])
        image = ax.imshow(np.log10(grid), cmap="RdBu_r", vmin=-1.5, vmax=1.5, aspect="auto")
        for (a, b), value in np.ndenumerate(grid):
            ax.text(b, a, f"{value:.2g}", ha="center", va="center", fontsize=6,
                    color="white" if abs(math.log10(value)) > 1.0 else "black",
                    fontweight="bold" if value < 1.0 else "normal")
        ax.set_yticks(range(len(radii(d))), [f"r={r:.3g}" for r in radii(d)], fontsize=7)
        ax.set_xticks(range(len(columns)), [f"n=1e{round(math.log10(n))}\nε={e:g}" if i == len(LEARNERS) - 1 else ""
                                            for n, e in columns], fontsize=6.5)
        if i == 0:
            ax.set_title(f"d = {d}", fontsize=9)
        if j == 0:
            ax.set_ylabel(name, fontsize=9)
    figure.suptitle("excess loss / excess loss of θ = 0 on the synthetic logistic streams (< 1, blue: beats θ = 0)"
                    + (" — n ≤ 10⁵, one repetition" if quick else " — mean of 3 repetitions"), fontsize=9.5)
    figure.colorbar(image, ax=axes, shrink=0.6, label="log10 ratio")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n ≤ 1e5, one repetition")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--png", type=Path, default=Path("docs/img/noise_map.png"), help="where to draw the map")
    args = parser.parse_args()
    ns = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6]
    start = time.perf_counter()
    cells = run(ns, 1 if args.quick else 3, args.workers)
    print(f"## Noise map — logistic streams, ‖θ*‖ = {NORM:g}, δ = {DELTA:g}, seeded replay mode")
    loss = LogisticLoss()
    print("\nexcess loss of θ = 0: " + ", ".join(
        f"d = {d}: {LogisticTask(d=d, norm=NORM).excess(np.zeros(d), loss):.3g}" for d in DIMS))
    for line in tables(cells, ns):
        print(line)
    picture(cells, ns, args.png, args.quick)
    print(f"\n(map drawn to {args.png}; total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
