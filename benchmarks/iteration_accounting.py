"""Online PNSGD accounting (Sordello et al. 2021, Sec. 5): O(n) prefix sums vs one product per record.

Run: ``.venv/bin/python benchmarks/iteration_accounting.py``

For streams of n records under Sordello et al. 2021 App. G's online Gaussian schedule (Thm 7: ε = 1, L = 10,
η = 0.01, α = 1.5, C1 = C2 = 100, D = 1, β = 0.5, ρ = 0) with a snapshot every n/100 records,
prints the time to build the σ schedule, the time of ``record_log_deltas`` (every record's δ at
once, O(n)) next to the per-record loop over ``pnsgd_delta`` (O(n · snapshot interval); run on
the first ``LOOP_RECORDS`` records only and scaled to n), their ratio, the largest relative
difference of the δ values on the looped records, and the worst δ (best of 3 timings).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from panpriv.accounting.iteration import online_sigma, pnsgd_delta, record_log_deltas

EPSILON = 1.0
MODEL = {"L": 10.0, "eta": 0.01, "diameter": 1.0, "beta": 0.5, "rho": 0.0}
SCHEDULE = (1.5, 0.01, 1.0, 100.0, 100.0, 0.5, 0.0)
LOOP_RECORDS = 2000


def best_time(run: Callable[[], object], repeats: int = 3) -> float:
    """Smallest wall time over ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def per_record(sigmas: np.ndarray, releases: np.ndarray, count: int) -> np.ndarray:
    """δ_i for the first ``count`` records, one product A_i ∏_{t=i+1}^{s(i)} B_t each."""
    deltas = np.empty(count)
    for position in range(1, count + 1):
        release = int(releases[np.searchsorted(releases, position)])
        deltas[position - 1] = pnsgd_delta(EPSILON, sigmas[:release], position, **MODEL)
    return deltas


def main() -> None:
    columns = ("n", "schedule[s]", "O(n)[s]", "loop[s]*", "loop/O(n)", "rel.diff", "worst δ")
    widths = (9, 12, 9, 10, 10, 9, 9)
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for n in (10**4, 10**5, 10**6):
        steps = np.arange(1, n + 1)
        releases = np.arange(n // 100, n + 1, n // 100)
        schedule = best_time(lambda s=steps: online_sigma(s, *SCHEDULE))
        sigmas = online_sigma(steps, *SCHEDULE)
        fast = best_time(lambda s=sigmas, r=releases: record_log_deltas(EPSILON, s, r, **MODEL))
        loop = best_time(lambda s=sigmas, r=releases: per_record(s, r, LOOP_RECORDS), 1)
        loop_scaled = loop * n / LOOP_RECORDS
        log_deltas = record_log_deltas(EPSILON, sigmas, releases, **MODEL)
        looped = per_record(sigmas, releases, LOOP_RECORDS)
        fast_head = np.exp(log_deltas[:LOOP_RECORDS])
        mask = looped > 0.0
        difference = float(np.max(np.abs(fast_head[mask] / looped[mask] - 1.0)))
        worst = math.exp(float(np.max(log_deltas)))
        print(
            f"{n:>9.0e} {schedule:>12.4f} {fast:>9.4f} {loop_scaled:>10.2f} "
            f"{loop_scaled / fast:>10.0f} {difference:>9.1e} {worst:>9.4f}"
        )
    print(f"* loop time measured on the first {LOOP_RECORDS} records and scaled by n/{LOOP_RECORDS}")


if __name__ == "__main__":
    main()
