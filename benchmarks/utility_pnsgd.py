"""Utility and guarantees of PNSGD (Sordello et al. 2021) next to pan-private AC-SA, on the same synthetic streams.

Run (from the repository root)::

    .venv/bin/python -m benchmarks.utility_pnsgd            # full tables (~14 min on 2 cores)
    .venv/bin/python -m benchmarks.utility_pnsgd --quick    # n ≤ 10⁵, fewer repetitions (~3 min)

Table 1 — guarantees for a stream of 10⁶ records with a snapshot every 10⁴ records, and the cost
of the accounting: for Sordello et al. 2021, App. G's online setting and for the learners of table 2, the
(output, intrusion) δ at each ε that ``OnlinePNSGD.privacy()`` reports, next to the O(n) oracle
``panpriv.accounting.iteration.worst_released_delta`` over the same stream (value and time). The learner's
accounting is driven through its public API (restored at each snapshot position, then asked for
its report), i.e. one report per snapshot, as the service does.

Table 2 — excess population loss (mean ± s.e. over repetitions) on the streams of
``benchmarks.utility_pan_acsa`` (:mod:`benchmarks.synthetic`: logistic, ‖θ*‖ = 4, radius 5, and
least squares, ‖θ*‖ = 2, radius 3; d = 20, ‖x‖ = 1), n ∈ {10³…10⁶}, ε ∈ {0.5, 1, 4}, each with the
δ it comes with:

- ``online 1/β``: OnlinePNSGD, Sordello et al. 2021 Thm 7 schedule with App. G's α = 1.5, C1 = C2 = 100, η = 1/β;
- ``+ pan floor``: the same with ``pan_delta = 1e-6`` (every step (ε, 1e-6)-DP);
- ``online 0.01/β``: η a hundred times smaller (its schedule σ_j ∝ 1/η, so A_j is tiny);
- ``shuffled``: ShuffledPNSGD, one pass, Thm 5 noise with App. G's C1 = 1e5, C2 = 100, η = 1/β;
- ``pan-AC-SA``: PanPrivateACSA at (ε, 1e-6), the learner of issue 5 (its planned parameters);
- ``θ = 0``: the excess loss of releasing the zero vector.

Cells read ``excess (δ_out/δ_int)``: δ at the row's ε for everything released (the final
iterate) and for one intrusion. The PNSGD learners run in the seeded replay mode for reproducible
numbers (that mode has no intrusion guarantee; the δ_int printed is what the same learner reports
in the default OS-entropy mode, obtained by restoring it unseeded). The schedules of the online
learner without floor and of the shuffled learner do not depend on ε, so one run serves the three ε.

What to expect (Sordello et al.'s schedules): the noise added to the iterate per step is η σ_j = M D/(2√W(·)),
independent of η and shrinking only like D/√(log j), so the last iterate keeps moving on the scale
of K and its excess loss does not fall with n (it is above θ = 0's). See the report in the issue.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from benchmarks.utility_pan_acsa import DELTA, Setting, feed, mean_se, pan_learner, settings_case2
from panpriv.accounting.iteration import worst_released_delta
from panpriv.protocols.base import Learner
from panpriv.protocols.losses import HuberLoss
from panpriv.protocols.pan_acsa import SENSITIVITY_SLACK
from panpriv.protocols.pnsgd import OnlinePNSGD, ShuffledPNSGD

EPSILONS = (0.5, 1.0, 4.0)
STREAM, EVERY = 10**6, 10**4


def repetitions(n: int, quick: bool) -> int:
    """Repetitions (stream samples and noise seeds) per n; one at 10⁶ (six passes of a minute each)."""
    reps = {10**3: 10, 10**4: 5, 10**5: 3, 10**6: 1}[n]
    return max(2, reps // 2) if quick else reps


# -- learners ----------------------------------------------------------------------------------


def online(setting: Setting, epsilon: float, eta_scale: float, seed: int | None, **kwargs: object) -> OnlinePNSGD:
    beta = setting.loss.smoothness(1.0)
    return OnlinePNSGD(setting.task.d, setting.loss, epsilon, eta_scale / beta, setting.radius, rng=seed, **kwargs)


def shuffled(setting: Setting, epsilon: float, n: int, seed: int | None) -> ShuffledPNSGD:
    beta = setting.loss.smoothness(1.0)
    return ShuffledPNSGD(setting.task.d, setting.loss, epsilon, 1.0 / beta, setting.radius, n=n, rng=seed)


def final_release_report(learner: Learner, epsilon: float) -> tuple[float, float]:
    """(output δ, intrusion δ) at ``epsilon`` of a learner whose only release was its final
    iterate, as the same learner reports it in the default OS-entropy mode: a twin with the
    row's ε is restored at the learner's position with nothing released yet, and takes the final
    snapshot itself (the noise schedules here do not depend on ε, only the accounting does)."""
    state = {**learner.state_dict(), "last_release": 0}
    if isinstance(learner, ShuffledPNSGD):
        state["window_delta"] = 0.0
    twin = type(learner).from_state_dict({**learner.config(), "epsilon": epsilon}, state)
    report = twin.snapshot().privacy
    return report.output.delta, report.intrusion.delta


def cell(excess: list[float], deltas: tuple[float, float]) -> str:
    return f"{mean_se(excess)} ({deltas[0]:.2g}/{deltas[1]:.2g})"


# -- table 1 -----------------------------------------------------------------------------------


def app_g_online(epsilon: float, **kwargs: object) -> OnlinePNSGD:
    """Sordello et al. 2021, App. G online: L = 10, β = 0.5, ρ = 0, η = 0.01, α = 1.5, C1 = C2 = 100, D = 1 (a Huber
    loss with threshold 10√2 at feature bound 1/√2 has exactly these L and β)."""
    return OnlinePNSGD(1, HuberLoss(delta=10 * math.sqrt(2)), epsilon, 0.01, 0.5, feature_bound=1 / math.sqrt(2),
                       **kwargs)


def account_stream(build: Callable[[], OnlinePNSGD]) -> tuple[float, float, float]:
    """Drive the learner's accounting through a 10⁶-record stream with a snapshot every 10⁴
    records: restore at each snapshot position and ask for the report. Returns (output δ,
    intrusion δ, seconds)."""
    learner = build()
    zeros = np.zeros(learner.loss.param_dim(learner.dim))
    start = time.perf_counter()
    for position in range(EVERY, STREAM + 1, EVERY):
        learner.load_state_dict({"records": position, "last_release": position, "theta": zeros, "released": zeros})
        report = learner.privacy()
    return report.output.delta, report.intrusion.delta, time.perf_counter() - start


def oracle_stream(learner: OnlinePNSGD) -> tuple[float, float]:
    """worst_released_delta over the whole stream (O(n)); returns (δ, seconds incl. the schedule)."""
    slack = 1.0 + SENSITIVITY_SLACK
    start = time.perf_counter()
    scales = learner.noise_scales(1, STREAM)
    worst = worst_released_delta(
        learner.epsilon, scales, np.arange(EVERY, STREAM + 1, EVERY), noise=learner.noise,
        L=learner.loss.lipschitz(learner.feature_bound, learner.radius) * slack, eta=learner.eta,
        diameter=2 * learner.radius * slack, beta=learner.loss.smoothness(learner.feature_bound) + learner.loss.ridge,
        rho=learner.loss.ridge,
    )
    return worst.delta, time.perf_counter() - start


def table_guarantees() -> None:
    print(f"\n## Table 1 — OnlinePNSGD guarantees for {STREAM:.0e} records, a snapshot every {EVERY:.0e}\n")
    print("| learner | ε | output δ | intrusion δ | oracle δ (O(n)) | learner accounting [s] | oracle [s] |")
    print("|---|---|---|---|---|---|---|")
    rows: list[tuple[str, float, Callable[[], OnlinePNSGD]]] = []
    for epsilon in EPSILONS:
        rows.append(("Sordello et al. 2021 App. G online (L = 10, η = 0.01, D = 1)", epsilon, lambda e=epsilon: app_g_online(e)))
        rows.append(("App. G + pan floor 1e-6", epsilon, lambda e=epsilon: app_g_online(e, pan_delta=DELTA)))
    for setting in settings_case2():
        for epsilon in EPSILONS:
            rows.append((f"{setting.name}, η = 1/β", epsilon, lambda s=setting, e=epsilon: online(s, e, 1.0, None)))
            rows.append((f"{setting.name}, η = 1/β, pan floor 1e-6", epsilon,
                         lambda s=setting, e=epsilon: online(s, e, 1.0, None, pan_delta=DELTA)))
    for name, epsilon, build in rows:
        output, intrusion, seconds = account_stream(build)
        oracle, oracle_seconds = oracle_stream(build())
        print(f"| {name} | {epsilon:g} | {output:.4g} | {intrusion:.4g} | {oracle:.4g} | {seconds:.3f} "
              f"| {oracle_seconds:.2f} |", flush=True)


# -- table 2 -----------------------------------------------------------------------------------


def table_utility(ns: list[int], quick: bool) -> None:
    print("\n## Table 2 — excess population loss (δ_out/δ_int at the row's ε), d = 20\n")
    print("| task | n | ε | online 1/β | + pan floor 1e-6 | online 0.01/β | shuffled (Thm 5) "
          "| pan-AC-SA (δ = 1e-6) | θ = 0 | PNSGD rec/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setting in settings_case2():
        zero = setting.task.excess(np.zeros(setting.task.d), setting.loss)
        for n in ns:
            reps = repetitions(n, quick)
            data = [setting.task.sample(n, np.random.default_rng(1000 * n + r)) for r in range(reps)]
            plain: dict[float, list[float]] = {1.0: [], 0.01: []}
            plain_learners: dict[float, Learner] = {}
            mixed: list[float] = []
            speed: list[float] = []
            for r, (X, y) in enumerate(data):
                for scale in plain:
                    learner = online(setting, 1.0, scale, seed=r)
                    speed.append(feed(learner, X, y))
                    learner.snapshot()
                    plain[scale].append(setting.task.excess(learner.release(), setting.loss))
                    plain_learners[scale] = learner
                one_pass = shuffled(setting, 1.0, n, seed=r)
                order = one_pass.next_indices(n)
                feed(one_pass, X[order], y[order])
                one_pass.snapshot()
                mixed.append(setting.task.excess(one_pass.release(), setting.loss))
                plain_learners[0.0] = one_pass
            for epsilon in EPSILONS:
                floored, pan = [], []
                for r, (X, y) in enumerate(data):
                    learner = online(setting, epsilon, 1.0, seed=r, pan_delta=DELTA)
                    feed(learner, X, y)
                    learner.snapshot()
                    floored.append(setting.task.excess(learner.release(), setting.loss))
                    acsa = pan_learner(setting, n, epsilon, seed=r)
                    feed(acsa, X, y)
                    pan.append(setting.task.excess(acsa.release(), setting.loss))
                cells = [
                    cell(plain[1.0], final_release_report(plain_learners[1.0], epsilon)),
                    cell(floored, final_release_report(learner, epsilon)),
                    cell(plain[0.01], final_release_report(plain_learners[0.01], epsilon)),
                    cell(mixed, final_release_report(plain_learners[0.0], epsilon)),
                    mean_se(pan),
                ]
                print(f"| {setting.name} | {n:.0e} | {epsilon:g} | " + " | ".join(cells)
                      + f" | {zero:.3g} | {np.mean(speed):,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n ≤ 1e5 and fewer repetitions")
    args = parser.parse_args()
    ns = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6]
    start = time.perf_counter()
    table_guarantees()
    table_utility(ns, args.quick)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
