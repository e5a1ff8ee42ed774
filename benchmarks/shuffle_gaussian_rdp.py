"""Shuffled-Gaussian RDP (Liew & Takahashi 2022 Thm 1): generating function vs the partition method of Liew & Takahashi 2022 Alg. 1.

Run: ``.venv/bin/python benchmarks/shuffle_gaussian_rdp.py``

Prints, for single orders λ at n = 10⁹, σ = 1, the time of Alg. 1 (one order, cost ∝ p(λ)) next to
the generating function (one order, and every order 2..λ at once), their ratio and the relative
difference of the results; then the time of orders 2..256 and 2..512 at n = 10⁹ (best of 5).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from panpriv.accounting.shuffle_gaussian import rdp, rdp_by_partitions

N = 10**9
SIGMA = 1.0


def best_time(run: Callable[[], object], repeats: int) -> float:
    """Smallest wall time over ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def partition_count(total: int) -> int:
    """p(total), the number of integer partitions (dynamic programming over the largest part)."""
    ways = [1] + [0] * total
    for part in range(1, total + 1):
        for t in range(part, total + 1):
            ways[t] += ways[t - part]
    return ways[total]


def main() -> None:
    print(f"n = {N:.0e}, sigma = {SIGMA}")
    columns = ("order", "Alg.1 [s]", "GF one [s]", "GF 2..λ [s]", "Alg.1/GF", "rel.diff")
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, (5, 10, 11, 12, 9, 9), strict=True)))
    per_partition = 0.0
    for order in (10, 20, 30, 40, 50):
        repeats = 3 if order <= 40 else 1
        partitions = best_time(lambda o=order: rdp_by_partitions(o, N, SIGMA), repeats)
        one = best_time(lambda o=order: rdp(o, N, SIGMA), 5)
        every = best_time(lambda o=order: rdp(np.arange(2, o + 1), N, SIGMA), 5)
        per_partition = partitions / partition_count(order)
        reference, value = rdp_by_partitions(order, N, SIGMA), rdp(order, N, SIGMA)
        print(
            f"{order:>5} {partitions:>10.4f} {one:>11.5f} {every:>12.5f} "
            f"{partitions / one:>9.0f} {abs(value - reference) / reference:>9.1e}"
        )
    for top in (256, 512):
        seconds = best_time(lambda t=top: rdp(np.arange(2, t + 1), N, SIGMA), 5)
        count = partition_count(top)
        print(
            f"orders 2..{top} at n = 1e9, all at once: {seconds:.3f} s; Alg. 1 at order {top} "
            f"alone enumerates p({top}) = {count:.2e} partitions, "
            f"~{count * per_partition / 3.15e7:.1e} years at the measured "
            f"{per_partition * 1e6:.1f} µs each"
        )


if __name__ == "__main__":
    main()
