"""Every learner's ``learn_many`` rate, side by side with the numpy floor, in one run.

    .venv/bin/python -m benchmarks.learners [--dims 20 100] [--records 100000] [--rounds 2]

For each d, every learner of the catalogue is built as ``panpriv run`` builds it (ε = 1, δ = 1e-6,
logistic loss with an intercept, the service's defaults; pnsgd with η = 0.5 and
``accept_larger_delta``) and fed the same records in micro-batches of 1,024; its set-up (the
calibrations, cached after the first build) is not timed. The rates (process CPU time, best of
``--rounds`` interleaved rounds) are printed against the "clip+noise" floor of
:mod:`benchmarks.glm_fast_path` (a numpy mini-batch step with per-record clipping and one
Gaussian draw per micro-batch) and scikit-learn's ``SGDClassifier.partial_fit`` (non-private).

River's ``LogisticRegression`` (not private) is timed in the same rounds: ``learn_one`` on dict
rows and ``learn_many`` on DataFrame micro-batches of 1,024, the rows converted before timing.
``--learners`` restricts the panpriv learners timed (default: every streaming learner).

pan-acsa's ``learn_one`` is timed in the same rounds on the same records (an array row and a
float label per call, as River gets a dict and a bool), and again with its per-call float scrub
turned off (``no scrub``: :func:`panpriv.protocols.scalar_residue.scrub_call_floats` and the
reservation before it replaced by no-ops), so the table shows what the memory hygiene costs, and
through ``learn_many``'s micro-batch path (``batch path``, what ``learn_one`` was before); the
ratio ``pan-acsa learn_one / river learn_one`` is printed (issue 37: within 2×).

Why pnsgd and checkin sit far below the floor, by construction: each takes one step per record (a
projected noisy step; a slot's update and one randomized message) and the next record's gradient
is taken at the model that step produced, so the loop over records is sequential Python. Their
noise (and checkin's check-in draws) comes from one generator keyed from OS entropy per
sub-block of at most 128 in-flight records (panpriv.protocols.randomness, "Noise of the records in
flight"), not per record.
"""

from __future__ import annotations

import argparse
import os
import time
import types
from collections.abc import Callable

import numpy as np

from benchmarks.glm_fast_path import MICRO_BATCH, _cases, _stream
from panpriv.protocols.catalogue import learner_names
from panpriv.protocols.recorded import RecordedLearner
from panpriv.streamer.config import load_config
from panpriv.streamer.runtime.learners import build_learner, learner_class

_OPTIONS = {"pnsgd": {"eta": 0.5}}


def _learner_run(name: str, X: np.ndarray, y: np.ndarray) -> Callable[[], float]:
    """A run of a fresh learner over the records, returning its CPU seconds (set-up excluded)."""
    n, d = X.shape
    config = load_config(None, {
        "source.url": f"synthetic:n={n}&dim={d}", "records.dim": d, "records.feature_bound": 1.0,
        "learner.name": name, "learner.accept_larger_delta": True, "learner.options": _OPTIONS.get(name, {}),
    })
    build_learner(config, n)  # warm the calibration caches: set-up is not what is timed

    def run() -> float:
        model = build_learner(config, n)
        start = time.process_time()
        for first in range(0, n, MICRO_BATCH):
            model.learn_many(X[first : first + MICRO_BATCH], y[first : first + MICRO_BATCH])
        return time.process_time() - start

    return run


def _learn_one_runs(X: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], float]]:
    """pan-acsa's ``learn_one`` over the records as ``panpriv run`` builds the learner, with and
    without the per-call float scrub, and through the micro-batch path it took before its row
    path (``batch path``): runs returning CPU seconds (set-up and the row views excluded)."""
    import panpriv.protocols.pan_acsa as pan_acsa
    from panpriv.protocols import scalar_residue

    n, d = X.shape
    config = load_config(None, {"source.url": f"synthetic:n={n}&dim={d}", "records.dim": d, "records.feature_bound": 1.0})
    build_learner(config, n)
    rows = list(X)
    labels = y.tolist()
    unscrubbed = types.SimpleNamespace(reserve_float_room=list, scrub_call_floats=lambda room: None)

    def run(scrub: bool, row_path: bool = True) -> float:
        model = build_learner(config, n)
        if not row_path:  # every record through learn_many's micro-batch machinery (before issue 37)
            model._row_dphi = None  # type: ignore[attr-defined]
        pan_acsa.scalar_residue = scalar_residue if scrub else unscrubbed
        try:
            start = time.process_time()
            for row, label in zip(rows, labels):
                model.learn_one(row, label)
            return time.process_time() - start
        finally:
            pan_acsa.scalar_residue = scalar_residue

    return {"pan-acsa learn_one": lambda: run(True), "pan-acsa learn_one, no scrub": lambda: run(False),
            "pan-acsa learn_one, batch path": lambda: run(True, row_path=False)}


def _river_runs(X: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], float]]:
    """River's LogisticRegression ``learn_one`` (dict rows) and, where pandas is installed,
    ``learn_many`` (DataFrames of MICRO_BATCH rows): runs returning CPU seconds, the conversions
    made before timing."""
    try:
        from river import linear_model
    except ImportError:  # River is a benchmark extra
        return {}
    rows = [dict(enumerate(row)) for row in X.tolist()]
    labels = [bool(label > 0) for label in y.tolist()]

    def learn_one() -> float:
        model = linear_model.LogisticRegression()
        start = time.process_time()
        for row, label in zip(rows, labels):
            model.learn_one(row, label)
        return time.process_time() - start

    runs = {"river learn_one": learn_one}
    try:
        import pandas as pd
    except ImportError:  # River's learn_many takes DataFrames: the realdata extra
        return runs
    frames = [(pd.DataFrame(X[i : i + MICRO_BATCH]), pd.Series(y[i : i + MICRO_BATCH] > 0))
              for i in range(0, X.shape[0], MICRO_BATCH)]

    def learn_many() -> float:
        model = linear_model.LogisticRegression()
        start = time.process_time()
        for frame, target in frames:
            model.learn_many(frame, target)
        return time.process_time() - start

    return {**runs, "river learn_many": learn_many}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--learners", nargs="+", default=None, help="panpriv learners to time (default: all streaming)")
    parser.add_argument("--no-river", action="store_true", help="skip River's rows")
    args = parser.parse_args()
    print(f"learn_many rates (CPU time, best of {args.rounds}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    for d in args.dims:
        X, y = _stream(args.records, d, seed=d)
        floors = {k: v for k, v in _cases(X, y).items() if k in ("floor: clip+noise", "sklearn partial_fit")}
        streaming = [name for name in learner_names() if not issubclass(learner_class(name), RecordedLearner)]
        if args.learners is not None:
            streaming = [name for name in streaming if name in args.learners]
        learners = {name: _learner_run(name, X, y) for name in streaming}
        if "pan-acsa" in streaming:
            learners.update(_learn_one_runs(X, y))
        if not args.no_river:
            learners.update(_river_runs(X, y))
        best = dict.fromkeys([*floors, *learners], float("inf"))
        for _ in range(args.rounds):
            for name, floor_run in floors.items():
                start = time.process_time()
                floor_run()
                best[name] = min(best[name], time.process_time() - start)
            for name, learner_run in learners.items():
                best[name] = min(best[name], learner_run())
        floor = args.records / best["floor: clip+noise"]
        print(f"\nd = {d}, n = {args.records:,}")
        for name, seconds in best.items():
            rate = args.records / seconds
            print(f"  {name:31s} {rate / 1e6:9.4f} M rec/s   {rate / floor:7.3f} x clip+noise floor")
        if "pan-acsa learn_one" in best and "river learn_one" in best:
            print(f"  pan-acsa learn_one takes {best['pan-acsa learn_one'] / best['river learn_one']:.2f}x River's "
                  f"learn_one time; the scrub costs {best['pan-acsa learn_one'] / best['pan-acsa learn_one, no scrub'] - 1:.0%}")
        skipped = sorted(name for name in learner_names() if issubclass(learner_class(name), RecordedLearner))
        print(f"  (not timed: {', '.join(skipped)} read a recording by index, passes over it: benchmarks.utility_shuffle_gd)")


if __name__ == "__main__":
    main()
