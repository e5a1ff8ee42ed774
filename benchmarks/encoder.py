"""Benchmark of the PVEC encoder (panpriv.protocols.encoder.VectorSum), all paths side by side in one run.

    .venv/bin/python -m benchmarks.encoder            # n ∈ {10³, 10⁴, 10⁵} × d ∈ {10, 100}, + d = 1000 memory
    .venv/bin/python -m benchmarks.encoder --quick    # n ∈ {10³, 10⁴}, fewer repeats

For each (n, d) it times, on the same batch (ε = 1, δ = 1e-6, Δ₂ = 1, tight calibration):

* ``reference`` — the literal protocol: every user materialises its d·(g + b) labelled bits
  (``VectorSum.randomize_bits``), the shuffler permutes all messages, the analyzer counts one-bits
  per label and calls ``analyze``; timed on a subset of users (its cost is per user);
* ``randomize+aggregate+analyze`` — the vectorised per-user path (what every user runs);
* ``pooled_noise=True`` — one Bin(n·b, p) per coordinate (trusted single process only);
* the floors set by random number generation alone: n·d raw 64-bit words (the raw-bit floor),
  n·d uniforms, and n·d draws of Bin(b, p) by ``Generator.binomial`` (what the encoder used before
  :mod:`panpriv.protocols.binomial_sampler`) and by the project's sampler.

Then the memory of ``randomize`` at d = 1000, n = 10⁵ (tracemalloc peak, input excluded) and the
construction time of a tight ``VectorSum`` before and after its calibration is on disk.

Targets (issues 4 and 18): vectorised ≥ 100× the reference; per-user path ≤ 3× the raw-bit floor;
pooled ≤ 2× the uniform floor for n·d ≥ 10⁵; randomize at d = 1000, n = 10⁵ ≤ 200 MB; a cached
construction < 0.2 s. Times are the best of several repeats; the machine's load is printed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from panpriv.accounting import binomial
from panpriv.protocols.binomial_sampler import BinomialSampler
from panpriv.protocols.encoder import VectorSum


def best_time(run: Callable[[], object], repeats: int) -> float:
    """Least wall-clock time of ``repeats`` calls (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def reference_estimate(encoder: VectorSum, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Literal per-user encoder + shuffle + count + analyze (for a subset of users)."""
    messages = np.concatenate([encoder.randomize_bits(x) for x in X])
    shuffled = messages[rng.permutation(messages.shape[0])]
    totals = np.bincount(shuffled[:, 0], weights=shuffled[:, 1], minlength=encoder.d)
    return encoder.analyze(totals.astype(np.int64))


def batch(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """n random vectors of ℓ₂ norm ≤ 1 (strictly inside, so no row trips the norm check)."""
    X = rng.normal(size=(n, d))
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X * (rng.random((n, 1)) / np.maximum(norms, 1e-12))


def run(d: int, n: int, reference_users: int, repeats: int) -> list[tuple[str, bool]]:
    """Print one (n, d) block; return its target checks."""
    rng = np.random.default_rng(12345)
    encoder = VectorSum(n, d, epsilon=1.0, delta=1e-6, l2_bound=1.0)
    sampler = BinomialSampler(encoder.b, encoder.p)
    X = batch(n, d, rng)
    size = n * d
    print(f"\nn = {n:,}, d = {d}: g = {encoder.g}, b = {encoder.b}, p = {encoder.p:.6g}, sampler {sampler.method}")
    t_ref = best_time(lambda: reference_estimate(encoder, X[:reference_users], rng), 1) / reference_users * n
    t_vec = best_time(lambda: encoder.analyze(encoder.aggregate(encoder.randomize(X))), repeats)
    t_pool = best_time(lambda: encoder.estimate_sum(X, pooled_noise=True), repeats)
    t_raw = best_time(lambda: rng.bit_generator.random_raw(size), repeats)
    t_unif = best_time(lambda: rng.random(size), repeats)
    t_numpy = best_time(lambda: rng.binomial(encoder.b, encoder.p, size=size), repeats)
    t_sampler = best_time(lambda: sampler.draw(rng, size), repeats)
    rows = [
        ("reference (bits + shuffle + count)", t_ref, f"timed on {reference_users} users"),
        ("randomize+aggregate+analyze", t_vec, f"{t_ref / t_vec:,.0f}x reference; {t_vec / t_raw:.2f}x raw-bit floor time"),
        ("pooled_noise=True", t_pool, f"{t_pool / t_unif:.2f}x uniform floor time"),
        ("floor: n*d raw 64-bit words", t_raw, f"{t_raw / size * 1e9:.2f} ns per element"),
        ("floor: n*d uniforms", t_unif, f"{t_unif / size * 1e9:.2f} ns per element"),
        ("Bin(b, p): Generator.binomial", t_numpy, f"{t_numpy / size * 1e9:.2f} ns per draw"),
        ("Bin(b, p): BinomialSampler", t_sampler, f"{t_sampler / size * 1e9:.2f} ns per draw; {t_numpy / t_sampler:.1f}x faster than numpy"),
    ]
    width = max(len(name) for name, _, _ in rows)
    print(f"  {'path':<{width}}  {'records/s':>14}  ratios")
    for name, seconds, note in rows:
        print(f"  {name:<{width}}  {n / seconds:>14,.0f}  {note}")
    checks = [
        (f"n={n} d={d}: vectorised >= 100x reference", t_ref / t_vec >= 100.0),
        (f"n={n} d={d}: per-user <= 3x raw-bit floor", t_vec <= 3.0 * t_raw),
    ]
    if size >= 100_000:
        checks.append((f"n={n} d={d}: pooled <= 2x uniform floor", t_pool <= 2.0 * t_unif))
    return checks


def randomize_memory(n: int, d: int) -> tuple[float, str]:
    """Peak bytes allocated by one ``randomize`` of an (n, d) batch (the input excluded)."""
    encoder = VectorSum(n, d, epsilon=1.0, delta=1e-6, l2_bound=1.0)
    X = batch(n, d, np.random.default_rng(3))
    tracemalloc.start()
    counts = encoder.randomize(X)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6, f"counts {counts.dtype} ({counts.nbytes / 1e6:.0f} MB), g + b = {encoder.g + encoder.b}"


def construction_times(n: int, d: int) -> tuple[float, float]:
    """Seconds to build a tight VectorSum with a cold disk cache, then from the disk cache (the
    in-process cache cleared in between)."""
    with tempfile.TemporaryDirectory() as cache:
        previous = os.environ.get("PANPRIV_CACHE_DIR")
        os.environ["PANPRIV_CACHE_DIR"] = cache
        try:
            timings = []
            for _ in range(2):
                binomial.tight_parameters.cache_clear()
                start = time.perf_counter()
                VectorSum(n, d, epsilon=1.0, delta=1e-6, l2_bound=1.0)
                timings.append(time.perf_counter() - start)
        finally:
            if previous is None:
                os.environ.pop("PANPRIV_CACHE_DIR")
            else:
                os.environ["PANPRIV_CACHE_DIR"] = previous
    return timings[0], timings[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n up to 10⁴, fewer repeats")
    args = parser.parse_args()
    sizes, repeats = ((1_000, 10_000), 3) if args.quick else ((1_000, 10_000, 100_000), 5)
    print(f"PVEC encoder benchmark (numpy {np.__version__}; best of {repeats} repeats; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    checks: list[tuple[str, bool]] = []
    for n in sizes:
        for d in (10, 100):
            checks += run(d, n, reference_users=20 if args.quick else 50, repeats=repeats)
    n_memory = 10_000 if args.quick else 100_000
    peak, note = randomize_memory(n_memory, 1000)
    print(f"\nrandomize at n = {n_memory:,}, d = 1000: peak {peak:,.0f} MB allocated ({note})")
    checks.append((f"randomize n={n_memory} d=1000 <= 200 MB", peak <= 200.0))
    cold, warm = construction_times(100_000, 20)
    print(f"tight VectorSum(n = 100,000, d = 20): {cold:.2f} s to calibrate, {warm:.3f} s from the disk cache")
    checks.append(("cached construction < 0.2 s", warm < 0.2))
    print("\ntargets: " + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks))


if __name__ == "__main__":
    main()
