"""Tests for panpriv.accounting.checkin (Balle et al. 2020, random check-ins).

Balle et al.'s formulas were lost, so the amplified bound is derived in panpriv.accounting.checkin and checked here
against two independent oracles:

* brute force: the exact per-slot conditional privacy loss of A_fix (Balle et al. 2020 Alg. 1) on small
  instances with random *adaptive* ε₀-DP randomizers, enumerating every check-in pattern and
  server choice, against ``per_slot_epsilons`` slot by slot;
* the exact (ε, δ) profile of A_fix with randomized response and a lone client (check-in
  probability per slot exactly p₀/m), computed in closed form over the number of 1s released.

The recalled Thm 3.2 of formulas.md and its "7 p₀ ε₀ √(log(1/δ)/m)" simplification are asserted
as upper bounds on the derived bound.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from panpriv.accounting.checkin import (
    CheckinGuarantee,
    averaged_updates,
    erlingsson_shuffling,
    fixed_window,
    per_slot_epsilons,
    shuffling,
    sliding_window,
    unamplified,
)
from panpriv.accounting.errors import InvalidParameterError

# --- brute force: exact per-slot conditional privacy loss of A_fix -------------------------------

_DUMMY = -1


def _random_randomizer(rng: np.random.Generator, m: int, records: list[int], outputs: int, spread: float):
    """Adaptive local randomizer tables R[(slot, history)][record] -> distribution over outputs."""
    tables = {}
    for slot in range(m):
        for history in itertools.product(range(outputs), repeat=slot):
            base = rng.normal(size=outputs)
            rows = {}
            for record in records:
                # Half the records sit at an extreme (RR-like) to stress the bound.
                shift = rng.choice([-spread, spread], size=outputs) if rng.random() < 0.5 else rng.uniform(-spread, spread, outputs)
                weights = np.exp(base + shift)
                rows[record] = weights / weights.sum()
            tables[(slot, history)] = rows
    log_rows = [np.log(np.array(list(rows.values()))) for rows in tables.values()]
    epsilon0 = max(float(np.max(r[:, None, :] - r[None, :, :])) for r in log_rows)
    return tables, epsilon0


def _sequence_law(tables, m: int, outputs: int, events: list[tuple[float, list[int]]]) -> dict:
    """P(y_1..y_m) for a mixture of record assignments (probability, record used at each slot)."""
    law = {}
    for ys in itertools.product(range(outputs), repeat=m):
        total = 0.0
        for probability, assignment in events:
            value = probability
            for slot in range(m):
                value *= tables[(slot, ys[:slot])][assignment[slot]][ys[slot]]
            total += value
        law[ys] = total
    return law


def _prefix(law: dict, length: int) -> dict:
    marginal: dict = {}
    for ys, value in law.items():
        marginal[ys[:length]] = marginal.get(ys[:length], 0.0) + value
    return marginal


def _worst_slot_losses(seed: int, m: int, p0: float, others: list[int]) -> tuple[np.ndarray, float]:
    """Max over C and histories of |log P_j/Q_j| per slot for A_fix with client 1: x=0 vs x'=1."""
    rng = np.random.default_rng(seed)
    outputs = 2
    records = [0, 1, *sorted(set(others)), _DUMMY]
    tables, epsilon0 = _random_randomizer(rng, m, records, outputs, spread=0.6)
    worst = np.zeros(m)
    # C: every other client's slot (None = abstain) and, per slot, which of them is the default.
    for slots in itertools.product([None, *range(m)], repeat=len(others)):
        present = [[i for i, s in enumerate(slots) if s == j] for j in range(m)]
        for defaults in itertools.product(*[p if p else [None] for p in present]):
            xbar = [others[d] if d is not None else _DUMMY for d in defaults]
            counts = [len(p) for p in present]

            def law(x: int) -> dict:
                events = []
                used = 0.0
                for j in range(m):
                    q = p0 / m / (counts[j] + 1)  # checks into j, then picked uniformly
                    used += q
                    events.append((q, [x if k == j else xbar[k] for k in range(m)]))
                events.append((1.0 - used, xbar))
                return _sequence_law(tables, m, outputs, events)

            p_law, q_law = law(0), law(1)
            for j in range(m):
                p_prev, q_prev = _prefix(p_law, j), _prefix(q_law, j)
                p_now, q_now = _prefix(p_law, j + 1), _prefix(q_law, j + 1)
                for ys in p_now:
                    loss = math.log(p_now[ys] / p_prev[ys[:j]]) - math.log(q_now[ys] / q_prev[ys[:j]])
                    worst[j] = max(worst[j], abs(loss))
    return worst, epsilon0


@pytest.mark.parametrize(
    ("seed", "m", "p0", "others"),
    [(0, 3, 1.0, []), (1, 3, 0.5, [0]), (2, 4, 1.0, [1]), (3, 3, 0.8, [0, 1]), (4, 4, 0.3, [])],
)
def test_per_slot_bound_holds_on_exact_enumeration(seed: int, m: int, p0: float, others: list[int]) -> None:
    worst, epsilon0 = _worst_slot_losses(seed, m, p0, others)
    bound = per_slot_epsilons(epsilon0, p0, m)
    assert np.all(worst <= bound * (1 + 1e-12)), (worst, bound)
    # The bound is not vacuous here: it is below ε₀ and the instance gets within a factor 3 of it.
    assert np.all(bound < epsilon0) and np.max(worst / bound) > 1 / 3


def test_per_slot_bound_is_attained_by_randomized_response_at_the_first_slot() -> None:
    # Slot 1 has no history: P = (p₀/m) RR(x) + (1 − p₀/m) RR(dummy); with x = dummy's opposite
    # the loss at the output favouring x is log(1 + (p₀/m)(e^{ε₀} − 1)) = ε_0 exactly in one
    # direction against x′ = dummy.
    epsilon0, p0, m = 1.3, 0.6, 5
    q = p0 / m
    rr_same, rr_flip = math.exp(epsilon0) / (1 + math.exp(epsilon0)), 1 / (1 + math.exp(epsilon0))
    p_slot = q * rr_same + (1 - q) * rr_flip
    q_slot = rr_flip
    assert math.log(p_slot / q_slot) == pytest.approx(per_slot_epsilons(epsilon0, p0, m)[0], rel=1e-14)


# --- exact whole-protocol oracle -----------------------------------------------------------------


def _lone_client_rr_delta(epsilon0: float, p0: float, m: int, epsilon: float) -> float:
    """Exact δ(ε) (both directions) of A_fix with one client, RR randomizer, dummy = x′ = 0, x = 1.

    The client's record is used at slot j with probability p₀/m, else the slot releases RR(0).
    With k ones among m outputs, P/Q = 1 + (p₀/m)(k(e^{ε₀} − 1) + (m − k)(e^{−ε₀} − 1)).
    """
    k = np.arange(m + 1)
    q_law = binom.pmf(k, m, 1 / (1 + math.exp(epsilon0)))
    ratio = 1 + (p0 / m) * (k * math.expm1(epsilon0) + (m - k) * math.expm1(-epsilon0))
    forward = np.sum(q_law * np.maximum(0.0, ratio - math.exp(epsilon)))
    backward = np.sum(q_law * np.maximum(0.0, 1 - math.exp(epsilon) * ratio))
    return float(max(forward, backward))


@pytest.mark.parametrize(
    ("epsilon0", "p0", "m", "delta"),
    [(1.0, 1.0, 2000, 1e-3), (2.0, 0.5, 5000, 1e-5), (0.5, 1.0, 500, 1e-4), (4.0, 0.05, 3000, 1e-6)],
)
def test_derived_bound_holds_for_exact_randomized_response_profile(
    epsilon0: float, p0: float, m: int, delta: float
) -> None:
    guarantee = fixed_window(epsilon0, p0, m, delta)
    assert guarantee.status == "derived"
    assert _lone_client_rr_delta(epsilon0, p0, m, guarantee.epsilon) <= guarantee.delta
    # The check has teeth: the instance needs more than ε/15 at this δ (the derived bound is 3–12×
    # the exact ε of this instance), so a bound too small by more than that would fail here.
    assert _lone_client_rr_delta(epsilon0, p0, m, guarantee.epsilon / 15) > guarantee.delta


# --- comparison with the recalled Thm 3.2 (formulas.md) ------------------------------------------

common = {
    "epsilon0": st.floats(1e-3, 8.0),
    "p0": st.floats(1e-4, 1.0),
    "m": st.integers(1, 20_000),
    "log10_delta": st.floats(-14.0, -0.5),
}


def _recalled_theorem_3_2(epsilon0: float, p0: float, m: int, delta: float) -> float:
    # formulas.md, Balle et al. 2020 Thm 3.2 [recalled]:
    # ε = p₀(e^{ε₀} − 1)√(2 e^{ε₀} log(1/δ)/m) + p₀² e^{ε₀}(e^{ε₀} − 1)²/m.
    growth = math.expm1(epsilon0)
    return p0 * growth * math.sqrt(2 * math.exp(epsilon0) * math.log(1 / delta) / m) + (
        p0**2 * math.exp(epsilon0) * growth**2 / m
    )


@settings(max_examples=200, deadline=None)
@given(**common)
def test_derived_bound_never_exceeds_the_recalled_theorem(
    epsilon0: float, p0: float, m: int, log10_delta: float
) -> None:
    delta = 10.0**log10_delta
    guarantee = fixed_window(epsilon0, p0, m, delta)
    assert guarantee.epsilon <= max(_recalled_theorem_3_2(epsilon0, p0, m, delta), 0.0) or (
        guarantee.status == "unamplified fallback" and guarantee.epsilon == epsilon0
    )


@settings(max_examples=200, deadline=None)
@given(**{**common, "epsilon0": st.floats(1e-3, 1.0), "log10_delta": st.floats(-14.0, -2.0)})
def test_simplified_form_of_theorem_3_2_is_an_upper_bound(
    epsilon0: float, p0: float, m: int, log10_delta: float
) -> None:
    # formulas.md: for ε₀ ≤ 1, δ ≤ 1/100, ε ≤ 7 p₀ ε₀ √(log(1/δ)/m).
    delta = 10.0**log10_delta
    assert fixed_window(epsilon0, p0, m, delta).epsilon <= 7 * p0 * epsilon0 * math.sqrt(math.log(1 / delta) / m)


def test_pinned_derived_value() -> None:
    # ε₀ = 1, p₀ = 0.1, m = 1000, δ = 1e-6; recomputed here from the per-slot formula and Cheu et al. 2022
    # Lemma 3.3 independently of the module, and compared with the recalled Thm 3.2 (≈ 0.047171).
    k = np.arange(1000)
    w = (0.1 / 1000) / (1 - 0.1 * k / 1000 * (1 - math.exp(-1)))
    slots = np.log1p(w * (math.e - 1))
    expected = float(np.sum(slots * np.expm1(slots)) + math.sqrt(2 * math.log(1e6) * np.sum(slots**2)))
    guarantee = fixed_window(1.0, 0.1, 1000, 1e-6)
    assert guarantee == CheckinGuarantee(guarantee.epsilon, 1e-6, "Balle et al. 2020 Thm 3.2 (A_fix, Alg. 1)", "derived")
    assert guarantee.epsilon == pytest.approx(expected, rel=1e-12)
    assert guarantee.epsilon == pytest.approx(0.029538132, rel=1e-8)
    assert guarantee.epsilon < _recalled_theorem_3_2(1.0, 0.1, 1000, 1e-6) == pytest.approx(0.0471715, rel=1e-6)


# --- invariants ----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(**common)
def test_never_above_the_unamplified_fallback(epsilon0: float, p0: float, m: int, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    guarantee = fixed_window(epsilon0, p0, m, delta)
    assert guarantee.epsilon <= epsilon0
    assert (guarantee.status == "derived") == (guarantee.epsilon < epsilon0)
    assert guarantee.delta == (delta if guarantee.status == "derived" else 0.0)
    slots = per_slot_epsilons(epsilon0, p0, m)
    assert np.all(slots <= epsilon0) and np.all(slots > 0) and np.all(np.diff(slots) >= 0)


@settings(max_examples=150, deadline=None)
@given(**common, factor=st.floats(1.01, 4.0))
def test_monotone_in_each_parameter(epsilon0: float, p0: float, m: int, log10_delta: float, factor: float) -> None:
    delta = 10.0**log10_delta
    base = fixed_window(epsilon0, p0, m, delta).epsilon
    assert fixed_window(epsilon0 * factor, p0, m, delta).epsilon >= base
    assert fixed_window(epsilon0, min(1.0, p0 * factor), m, delta).epsilon >= base
    assert fixed_window(epsilon0, p0, math.ceil(m * factor), delta).epsilon <= base
    assert fixed_window(epsilon0, p0, m, delta / factor).epsilon >= base


def test_approximate_dp_randomizer_falls_back() -> None:
    guarantee = fixed_window(1.0, 0.1, 1000, 1e-6, delta0=1e-8)
    assert (guarantee.epsilon, guarantee.delta, guarantee.status) == (1.0, 1e-8, "unamplified fallback")


def test_sliding_window_uses_the_same_derivation_with_its_own_label() -> None:
    fixed, sliding = fixed_window(0.8, 0.3, 400, 1e-5), sliding_window(0.8, 0.3, 400, 1e-5)
    assert sliding.epsilon == fixed.epsilon and sliding.status == "derived"
    assert sliding.theorem == "Balle et al. 2020 Thm 4.3 (sliding windows)"


def test_theorems_without_a_derived_bound_report_the_fallback() -> None:
    assert averaged_updates(0.7) == CheckinGuarantee(0.7, 0.0, "Balle et al. 2020 Thm 4.1 (A_avg, Alg. 2)", "unamplified fallback")
    assert shuffling(0.7, 1e-9) == CheckinGuarantee(0.7, 1e-9, "Balle et al. 2020 Thm 5.1 (shuffling)", "unamplified fallback")
    assert unamplified(2.0).status == "unamplified fallback"


# --- Erlingsson et al. 2019 comparison bound -----------------------------------------------------


def test_erlingsson_value() -> None:
    # 12 ε₀ √(log(1/δ)/n) at ε₀ = 0.5, n = 10 000, δ = 1e-6: 6·√(13.8155/10⁴) = 0.2230153.
    guarantee = erlingsson_shuffling(0.5, 10_000, 1e-6)
    assert guarantee.epsilon == pytest.approx(0.22301533, rel=1e-7)
    assert (guarantee.delta, guarantee.status) == (1e-6, "published comparison")


@pytest.mark.parametrize(
    ("epsilon0", "n", "delta", "name"),
    [(0.51, 1000, 1e-3, "'epsilon0'"), (0.0, 1000, 1e-3, "'epsilon0'"), (0.3, 999, 1e-3, "'n'"),
     (0.3, 1000, 0.011, "'delta'"), (0.3, 1000, 0.0, "'delta'"), (0.3, 1000.0, 1e-3, "'n'")],
)
def test_erlingsson_validates_its_range(epsilon0: float, n: int, delta: float, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        erlingsson_shuffling(epsilon0, n, delta)


def test_erlingsson_accepts_its_boundary() -> None:
    assert erlingsson_shuffling(0.5, 1000, 0.01).epsilon == pytest.approx(6 * math.sqrt(math.log(100) / 1000))


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: fixed_window(0.0, 0.5, 10, 1e-5), "'epsilon0'"),
        (lambda: fixed_window(1.0, 0.0, 10, 1e-5), "'p0'"),
        (lambda: fixed_window(1.0, 1.5, 10, 1e-5), "'p0'"),
        (lambda: fixed_window(1.0, 0.5, 0, 1e-5), "'m'"),
        (lambda: fixed_window(1.0, 0.5, 10, 1.0), "'delta'"),
        (lambda: fixed_window(1.0, 0.5, 10, 1e-5, delta0=1.0), "'delta0'"),
        (lambda: sliding_window(1.0, 0.5, 2.5, 1e-5), "'m'"),  # type: ignore[arg-type]
        (lambda: per_slot_epsilons(math.inf, 0.5, 10), "'epsilon0'"),
        (lambda: unamplified(-1.0), "'epsilon0'"),
    ],
)
def test_invalid_parameters_name_the_parameter(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=name):
        call()


# --- dishonest clients that win slots, chosen from the published outputs ----------------------------


def _adaptive_slot_losses(tables: dict, m: int, p0: float, block: dict, value: dict, compete: bool = False) -> np.ndarray:
    """Max over histories of the per-slot privacy loss |log P(y_j | y_<j) − log Q(y_j | y_<j)| of
    client 1 (record 0 vs 1, checking into one of m slots with probability p₀, alone otherwise: an
    empty slot runs the dummy through the randomizer), against a dishonest client who, at every
    slot j and history y_<j, decides ``block[(j, y_<j)]`` and sends the point mass
    ``value[(j, y_<j)]``. ``compete=False``: she sends choice key 0 and wins the slot (client 1 is
    not used there). ``compete=True`` (the case outside the bound): her update competes with a
    uniform key and is picked instead of client 1's half the time."""

    def law(x: int) -> dict:
        out = {}
        for ys in itertools.product((0, 1), repeat=m):
            total = 0.0
            for J in [None, *range(m)]:
                probability = 1.0 - p0 if J is None else p0 / m
                for j in range(m):
                    history = ys[:j]
                    rows = tables[(j, history)]
                    point = 1.0 if ys[j] == value[(j, history)] else 0.0
                    if block[(j, history)] and not compete:
                        probability *= point
                    elif block[(j, history)]:
                        probability *= 0.5 * rows[x][ys[j]] + 0.5 * point if J == j else point
                    else:
                        probability *= rows[x][ys[j]] if J == j else rows[_DUMMY][ys[j]]
                total += probability
            out[ys] = total
        return out

    p_law, q_law = law(0), law(1)
    worst = np.zeros(m)
    for j in range(m):
        p_prev, q_prev, p_now, q_now = _prefix(p_law, j), _prefix(q_law, j), _prefix(p_law, j + 1), _prefix(q_law, j + 1)
        for ys in p_now:
            if p_now[ys] > 0 and q_now[ys] > 0:
                worst[j] = max(worst[j], abs(math.log(p_now[ys] / p_prev[ys[:j]]) - math.log(q_now[ys] / q_prev[ys[:j]])))
            elif p_now[ys] != q_now[ys]:
                worst[j] = math.inf
    return worst


@pytest.mark.parametrize(("seed", "p0"), [(5, 1.0), (6, 0.5), (7, 0.3)])
def test_a_dishonest_client_who_wins_slots_adaptively_does_not_weaken_the_bound(seed: int, p0: float) -> None:
    """The "key 0" claim for adaptive dishonest clients (panpriv.accounting.checkin.per_slot_epsilons,
    "Dishonest clients"): over every deterministic strategy of a dishonest client who, at each of
    m = 3 slots, decides from the published outputs so far whether to win the slot (choice key 0)
    and what to release there — 2^7 × 2^7 strategies — client 1's per-slot loss stays within ε_k for
    every history, with random adaptive ε₀-DP randomizers. Positive control (p₀ < 1, where the
    bound is well below these randomizers' ε₀): the same client whose point-mass update *competes*
    with client 1's (picked half the time) exceeds it."""
    m = 3
    rng = np.random.default_rng(seed)
    tables, epsilon0 = _random_randomizer(rng, m, [0, 1, _DUMMY], 2, spread=0.6)
    bound = per_slot_epsilons(epsilon0, p0, m)
    keys = [(j, history) for j in range(m) for history in itertools.product((0, 1), repeat=j)]
    worst = np.zeros(m)
    for blocks in itertools.product((0, 1), repeat=len(keys)):
        block = dict(zip(keys, blocks, strict=True))
        for values in itertools.product((0, 1), repeat=len(keys)):
            worst = np.maximum(worst, _adaptive_slot_losses(tables, m, p0, block, dict(zip(keys, values, strict=True))))
    assert np.all(worst <= bound * (1 + 1e-12)), (worst, bound)
    assert np.max(worst / bound) > 1 / 3, "the instance comes close to the bound"
    if p0 == 1.0:
        return
    always = dict.fromkeys(keys, 1)
    competing = max(float(np.max(_adaptive_slot_losses(tables, m, p0, always, dict(zip(keys, values, strict=True)),
                                                       compete=True) / bound))
                    for values in itertools.product((0, 1), repeat=len(keys)))
    assert competing > 1.0, "an update that is not the randomizer's, picked instead of client 1's, is outside it"
