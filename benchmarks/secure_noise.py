"""Cost of ``noise="secure"`` (exact discrete Gaussian on a fixed-point grid) against the float Gaussian.

Run: ``python -m benchmarks.secure_noise`` (``--records``, ``--rounds``; ``--help``).

Three tables, one run, side by side:

1. **per draw**: one noise vector of p ∈ {21, 101, 1001} coordinates — the exact sampler
   (:func:`panpriv.protocols.secure_noise.draw`, OS entropy, σ² calibrated for ε = 1, δ = 1e-6) against what
   the float mode does per draw (a generator seeded from 128 OS bits, then ``normal(size=p)``);
   medians over interleaved repetitions.
2. **learner throughput**: ``PanPrivateACSA.learn_many`` records/s in both modes (logistic loss,
   d ∈ {20, 100}, horizon = records, micro-batches of 256 as the service feeds them), the two modes
   alternated ``--rounds`` times on the same data; medians and their ratio. The machine is shared,
   so only the ratio of interleaved runs means much.
3. **utility**: σ per unit of sensitivity needed by the discrete Gaussian accountant (CKS 2020
   Thm 14 + Cor. 13, on the integer grid, :func:`panpriv.protocols.secure_noise.calibrate_draw`) against the
   analytic Gaussian's (Balle & Wang 2018) at ε ∈ {0.5, 1, 4}, δ = 1e-6; the rounding term is 0 with
   truncation toward zero (the rule used), and the table also shows what rounding to nearest would
   have cost (Δ + √p instead of Δ).
"""

from __future__ import annotations

import argparse
import math
import secrets
import statistics
import time

import numpy as np

from panpriv.accounting.gaussian import analytic_sigma
from panpriv.protocols import secure_noise
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA

MICRO_BATCH = 256


def per_draw_seconds(p: int, repetitions: int) -> tuple[float, float]:
    """Median seconds per draw of p coordinates: (secure, float)."""
    calibration = secure_noise.calibrate_draw(1.0, 1e-6)
    secure, plain = [], []
    for _ in range(repetitions):
        start = time.perf_counter()
        secure_noise.draw(calibration, p, None)
        secure.append(time.perf_counter() - start)
        start = time.perf_counter()
        np.random.default_rng(secrets.randbits(128)).normal(0.0, 1.0, size=p)
        plain.append(time.perf_counter() - start)
    return statistics.median(secure), statistics.median(plain)


def stream(dim: int, records: int) -> tuple[np.ndarray, np.ndarray]:
    """A logistic stream with ‖x‖ ≤ 1 (fixed seed: the data, not the noise)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(records, dim)) / math.sqrt(dim)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    theta = np.linspace(-1.0, 1.0, dim)
    y = (rng.uniform(size=records) < 1.0 / (1.0 + np.exp(-3.0 * X @ theta))).astype(np.float64)
    return X, y


def throughput(noise: str, X: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Records/s of learn_many over the whole stream in micro-batches, and the planned batch size."""
    learner = PanPrivateACSA(X.shape[1], LogisticLoss(), 1.0, 1e-6, horizon=X.shape[0], radius=5.0, noise=noise)
    batch = learner.current_plan().batch_size(1)
    start = time.perf_counter()
    for first in range(0, X.shape[0], MICRO_BATCH):
        learner.learn_many(X[first : first + MICRO_BATCH], y[first : first + MICRO_BATCH])
    return X.shape[0] / (time.perf_counter() - start), batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per throughput run (default 1e6)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs per mode (default 3)")
    parser.add_argument("--draws", type=int, default=300, help="repetitions per draw timing (default 300)")
    args = parser.parse_args()

    print("1. per draw (median seconds; secure = exact N_Z from OS entropy, float = numpy normal)")
    print(f"{'p':>6} {'secure us':>11} {'float us':>10} {'ratio':>8}")
    for p in (21, 101, 1001):
        secure, plain = per_draw_seconds(p, args.draws)
        print(f"{p:>6} {secure * 1e6:>11.1f} {plain * 1e6:>10.1f} {secure / plain:>8.1f}")

    print(f"\n2. PanPrivateACSA.learn_many, logistic, {args.records} records, micro-batches of {MICRO_BATCH}, "
          f"{args.rounds} interleaved rounds (median records/s)")
    print(f"{'d':>5} {'batch b':>8} {'gaussian':>12} {'secure':>12} {'slowdown':>9}")
    for dim in (20, 100):
        X, y = stream(dim, args.records)
        rates: dict[str, list[float]] = {"gaussian": [], "secure": []}
        batch = 0
        for _ in range(args.rounds):
            for noise in ("gaussian", "secure"):
                rate, batch = throughput(noise, X, y)
                rates[noise].append(rate)
        g, s = statistics.median(rates["gaussian"]), statistics.median(rates["secure"])
        print(f"{dim:>5} {batch:>8} {g:>12,.0f} {s:>12,.0f} {g / s:>8.3f}x")

    print("\n3. utility: sigma per unit of l2 sensitivity, delta = 1e-6")
    print(f"{'eps':>5} {'analytic':>10} {'discrete':>10} {'ratio':>7} {'nearest-rounding ratio p=21/101/1001':>38}")
    for epsilon in (0.5, 1.0, 4.0):
        calibration = secure_noise.calibrate_draw(epsilon, 1e-6)
        analytic = analytic_sigma(epsilon, 1e-6, 1.0)
        ratio = calibration.noise_multiplier / analytic
        nearest = [ratio * (1 + math.sqrt(p) / secure_noise.SENSITIVITY_UNITS) for p in (21, 101, 1001)]
        print(f"{epsilon:>5} {analytic:>10.4f} {calibration.noise_multiplier:>10.4f} {ratio:>7.4f} "
              f"{' / '.join(f'{r:.4f}' for r in nearest):>38}")
    print(f"(grid: L*2^-{secure_noise.GRID_BITS}, truncation toward zero: no rounding term in the sensitivity; "
          f"bias < 2^-{secure_noise.GRID_BITS} L per coordinate and record)")


if __name__ == "__main__":
    main()
