"""pan-acsa's hot path, side by side: the fused GLM sum against the gradient-matrix path and floors.

For d in {20, 100, 1000}, on the same records (‖x‖ up to 1.3, so some rows are clipped; logistic
loss with an intercept), measured in one run with the rounds interleaved (process CPU time,
best of ``--rounds``), records per second of:

- **fused**: :func:`panpriv.protocols.scratch.clipped_gradient_sum`, the path ``PanPrivateACSA`` uses;
- **matrix**: features → per-record gradient matrix → clip → row sum, the path it used before
  (:func:`panpriv.protocols.scratch.features`, :func:`~panpriv.protocols.scratch.clipped_gradients`,
  :func:`~panpriv.protocols.scratch.row_sum`);
- **learner**: ``PanPrivateACSA.learn_many`` in micro-batches of 1,024 (noise, steps, wiping);
- **floor: step**: a bare numpy mini-batch logistic gradient (X θ, σ, Xᵀr), no clipping;
- **floor: clip+noise**: that step with per-record gradient clipping and a Gaussian draw per batch;
- **sklearn**: ``SGDClassifier(loss="log_loss").partial_fit`` on the same micro-batches (non-private).

Ratios are printed against the "clip+noise" floor. Run ``python -m benchmarks.glm_fast_path``
(``OPENBLAS_NUM_THREADS=1`` for one core).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from panpriv.protocols import scratch
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA

MICRO_BATCH = 1024


def _stream(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X *= (rng.uniform(0.2, 1.3, size=n) / np.linalg.norm(X, axis=1))[:, None]
    y = np.where(X @ rng.standard_normal(d) + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def _cpu_seconds(run: Callable[[], None]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def _cases(X: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], None]]:
    n, d = X.shape
    loss = LogisticLoss(intercept=True)
    theta = np.full(d + 1, 0.01)
    work = scratch.Scratch()
    labels = loss.labels(y)
    blocks = [slice(i, i + scratch.BLOCK_ROWS) for i in range(0, n, scratch.BLOCK_ROWS)]
    noise = np.random.default_rng()

    def fused() -> None:
        for rows in blocks:
            scratch.clipped_gradient_sum(loss, theta, X[rows], labels[rows], 1.0, 1.5, work)
        work.wipe()

    def matrix() -> None:
        for rows in blocks:
            Z = scratch.features(loss, X[rows], 1.0, work)
            gradients = scratch.clipped_gradients(loss, theta, Z, labels[rows], 1.5, work)
            scratch.row_sum(gradients, work)
        work.wipe()

    def learner() -> None:
        model = PanPrivateACSA(d, loss, 1.0, 1e-6, horizon=n, radius=float(np.sqrt(d)))
        for start in range(0, n, MICRO_BATCH):
            model.learn_many(X[start : start + MICRO_BATCH], y[start : start + MICRO_BATCH])

    def floor_step() -> None:
        w = np.zeros(d)
        for start in range(0, n, MICRO_BATCH):
            Xb, yb = X[start : start + MICRO_BATCH], y[start : start + MICRO_BATCH]
            residual = yb / (1.0 + np.exp(yb * (Xb @ w)))
            w += 0.1 * (Xb.T @ residual) / len(yb)

    def floor_clip_noise() -> None:
        w = np.zeros(d)
        for start in range(0, n, MICRO_BATCH):
            Xb, yb = X[start : start + MICRO_BATCH], y[start : start + MICRO_BATCH]
            G = (yb / (1.0 + np.exp(yb * (Xb @ w))))[:, None] * Xb
            norms = np.linalg.norm(G, axis=1)
            G *= np.minimum(1.0, 1.5 / np.maximum(norms, 1e-300))[:, None]
            w += 0.1 * (G.sum(axis=0) + noise.normal(0.0, 1.0, d)) / len(yb)

    cases = {"fused": fused, "matrix": matrix, "learner": learner, "floor: step": floor_step,
             "floor: clip+noise": floor_clip_noise}
    try:
        from sklearn.linear_model import SGDClassifier
    except ImportError:  # scikit-learn is a test extra
        return cases

    def sklearn() -> None:
        model = SGDClassifier(loss="log_loss")
        for start in range(0, n, MICRO_BATCH):
            model.partial_fit(X[start : start + MICRO_BATCH], y[start : start + MICRO_BATCH], classes=[-1.0, 1.0])

    cases["sklearn partial_fit"] = sklearn
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per d (default 200,000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100, 1000])
    args = parser.parse_args()
    for d in args.dims:
        n = max(20_000, args.records * 20 // max(d, 20))  # fewer records at large d: similar bytes
        X, y = _stream(n, d, seed=d)
        cases = _cases(X, y)
        best = dict.fromkeys(cases, float("inf"))
        for _ in range(args.rounds):
            for name, run in cases.items():
                best[name] = min(best[name], _cpu_seconds(run))
        floor = n / best["floor: clip+noise"]
        print(f"d = {d}, n = {n:,} (best of {args.rounds} interleaved rounds, CPU time)")
        for name, seconds in best.items():
            rate = n / seconds
            print(f"  {name:22s} {rate / 1e6:8.3f} M rec/s   {rate / floor:6.2f} x clip+noise floor")


if __name__ == "__main__":
    main()
