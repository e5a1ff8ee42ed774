"""Benchmark of the PVEC encoder (protocols.encoder.VectorSum), all paths side by side in one run.

    .venv/bin/python benchmarks/encoder.py            # d ∈ {10, 100}, batches of 10⁴ users
    .venv/bin/python benchmarks/encoder.py --quick    # smaller batches, fewer repeats

For each d it times, on the same batch (ε = 1, δ = 1e-6, Δ₂ = 1, tight calibration):

* ``reference`` — the literal protocol: every user materialises its d·(g + b) labelled bits
  (``VectorSum.randomize_bits``), the shuffler permutes all messages, the analyzer counts one-bits
  per label and calls ``analyze``; timed on a subset of users (its cost is per user);
* ``randomize+aggregate+analyze`` — the vectorised per-user path;
* ``pooled_noise=True`` — one Bin(n·b, p) per coordinate (trusted single process only);
* the floors set by random number generation alone: numpy drawing n·d uniforms, and n·d
  binomials Bin(b, p).

Targets (issue 4): vectorised ≥ 100× the reference; pooled within 2× of the uniform floor; the
per-user path within 2× of the binomial floor. Times are the best of several repeats.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from protocols.encoder import VectorSum


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


def run(d: int, n: int, reference_users: int, repeats: int) -> list[tuple[str, float, str]]:
    rng = np.random.default_rng(12345)
    start = time.perf_counter()
    encoder = VectorSum(n, d, epsilon=1.0, delta=1e-6, l2_bound=1.0)
    calibration = time.perf_counter() - start
    X = batch(n, d, rng)
    print(
        f"\nd = {d}, n = {n}: g = {encoder.g}, b = {encoder.b}, p = {encoder.p:.6g} "
        f"(tight calibration took {calibration:.1f} s, cached afterwards)"
    )
    t_ref = best_time(lambda: reference_estimate(encoder, X[:reference_users], rng), 1)
    t_ref_per_user = t_ref / reference_users
    t_vec = best_time(lambda: encoder.analyze(encoder.aggregate(encoder.randomize(X))), repeats)
    t_pool = best_time(lambda: encoder.estimate_sum(X, pooled_noise=True), repeats)
    t_unif = best_time(lambda: rng.random(n * d), repeats)
    t_binom = best_time(lambda: rng.binomial(encoder.b, encoder.p, size=n * d), repeats)

    rows = [
        ("reference (bits + shuffle + count)", 1.0 / t_ref_per_user, f"1 (timed on {reference_users} users)"),
        ("randomize+aggregate+analyze", n / t_vec, f"{t_ref_per_user * n / t_vec:,.0f}x reference; {t_vec / t_binom:.2f}x binomial floor time"),
        ("pooled_noise=True", n / t_pool, f"{t_ref_per_user * n / t_pool:,.0f}x reference; {t_pool / t_unif:.2f}x uniform floor time"),
        ("floor: n*d uniforms", n / t_unif, f"{t_unif / (n * d) * 1e9:.2f} ns per element"),
        ("floor: n*d binomials Bin(b, p)", n / t_binom, f"{t_binom / (n * d) * 1e9:.2f} ns per element"),
    ]
    width = max(len(name) for name, _, _ in rows)
    print(f"  {'path':<{width}}  {'records/s':>14}  ratios")
    for name, rate, note in rows:
        print(f"  {name:<{width}}  {rate:>14,.0f}  {note}")
    checks = [
        ("vectorised >= 100x reference", t_ref_per_user * n / t_vec >= 100.0),
        ("pooled within 2x of uniform floor", t_pool <= 2.0 * t_unif),
        ("per-user within 2x of binomial floor", t_vec <= 2.0 * t_binom),
    ]
    print("  targets: " + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller batches, fewer repeats")
    args = parser.parse_args()
    n, reference_users, repeats = (2_000, 20, 3) if args.quick else (10_000, 100, 7)
    print(f"PVEC encoder benchmark (numpy {np.__version__}; best of {repeats} repeats)")
    for d in (10, 100):
        run(d, n, reference_users, repeats)


if __name__ == "__main__":
    main()
