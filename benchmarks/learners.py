"""Every learner's ``learn_many`` rate, side by side with the numpy floor, in one run.

    .venv/bin/python -m benchmarks.learners [--dims 20 100] [--records 100000] [--rounds 2]

For each d, every learner of the catalogue is built as ``panpriv run`` builds it (ε = 1, δ = 1e-6,
logistic loss with an intercept, the service's defaults; pnsgd with η = 0.5 and
``accept_larger_delta``) and fed the same records in micro-batches of 1,024; its set-up (the
calibrations, cached after the first build) is not timed. The rates (process CPU time, best of
``--rounds`` interleaved rounds) are printed against the "clip+noise" floor of
:mod:`benchmarks.glm_fast_path` (a numpy mini-batch step with per-record clipping and one
Gaussian draw per micro-batch) and scikit-learn's ``SGDClassifier.partial_fit`` (non-private).

Why some learners sit far below the floor, by construction: pnsgd takes one noisy step per record
and checkin one randomizer call per participating record, each drawing its noise from a generator
keyed from OS entropy and zeroed afterwards (protocols.randomness) — a few microseconds of fixed
cost per record that no vectorisation may remove, since drawing several steps' noise in advance
would leave future noise in memory for an intruder (the pan-private threat model).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

from benchmarks.glm_fast_path import MICRO_BATCH, _cases, _stream
from protocols.catalogue import learner_names
from protocols.recorded import RecordedLearner
from streamer.config import load_config
from streamer.learners import build_learner, learner_class

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"learn_many rates (CPU time, best of {args.rounds}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    for d in args.dims:
        X, y = _stream(args.records, d, seed=d)
        floors = {k: v for k, v in _cases(X, y).items() if k in ("floor: clip+noise", "sklearn partial_fit")}
        streaming = [name for name in learner_names() if not issubclass(learner_class(name), RecordedLearner)]
        learners = {name: _learner_run(name, X, y) for name in streaming}
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
            print(f"  {name:22s} {rate / 1e6:9.4f} M rec/s   {rate / floor:7.3f} x clip+noise floor")
        skipped = sorted(set(learner_names()) - set(streaming))
        print(f"  (not timed: {', '.join(skipped)} read a recording by index, passes over it: benchmarks.utility_shuffle_gd)")


if __name__ == "__main__":
    main()
