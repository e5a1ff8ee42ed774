"""Privacy of distributed learning with random check-ins (Balle et al. 2020).

The text of Balle et al. 2020 we worked from had lost its formulas (those quoted here are recalled, and marked so). This module ships only bounds proved here (the derivation is
in :func:`per_slot_epsilons`) or the bound that always holds; each result says which it is:

* :func:`fixed_window` — Balle et al. 2020 Thm 3.2 (A_fix, Alg. 1), **derived** here for an ε₀-DP local
  randomizer; the (ε₀, δ₀) variant falls back to (ε₀, δ₀).
* :func:`sliding_window` — the setting of Balle et al. 2020 Thm 4.3 (one record per slot, windows of m slots),
  **derived** by the same argument.
* :func:`averaged_updates` (Balle et al. 2020 Thm 4.1, A_avg) and :func:`shuffling` (Balle et al. 2020 Thm 5.1) — no amplified
  bound derived: the **unamplified fallback**.
* :func:`unamplified` — each client's record passes at most once through an ε₀-DP (or (ε₀, δ₀)-DP)
  local randomizer, so the protocol is (ε₀, δ₀)-DP.
* :func:`erlingsson_shuffling` — Erlingsson et al. (2019) Thm 7, the published shuffling bound
  Balle et al. 2020 compares against (a **published comparison** bound, not derived here).

The amplified bounds are never reported above the fallback: when the derived ε is not below ε₀
the fallback (ε₀, 0) is returned instead (it is better in both coordinates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.composition import heterogeneous
from panpriv.accounting.validation import in_range, open_unit, positive, positive_int

__all__ = [
    "CheckinGuarantee",
    "averaged_updates",
    "erlingsson_shuffling",
    "fixed_window",
    "per_slot_epsilons",
    "shuffling",
    "sliding_window",
    "unamplified",
]

Status = Literal["derived", "unamplified fallback", "published comparison"]


@dataclass(frozen=True)
class CheckinGuarantee:
    """An (ε, δ)-DP guarantee for a check-in protocol, with where it comes from.

    Attributes
    ----------
    epsilon, delta : float
        The guarantee: the released model sequence is (ε, δ)-DP under replacement of one client's
        record.
    theorem : str
        The seed result whose setting this accounts for, e.g. "Balle et al. 2020 Thm 3.2 (A_fix, Alg. 1)".
    status : {"derived", "unamplified fallback", "published comparison"}
        "derived": proved in this module (see :func:`per_slot_epsilons`); "unamplified
        fallback": the always-valid no-amplification bound; "published comparison": a bound
        quoted from the literature for comparison (Erlingsson et al. 2019).
    """

    epsilon: float
    delta: float
    theorem: str
    status: Status


_THM_3_2 = "Balle et al. 2020 Thm 3.2 (A_fix, Alg. 1)"
_THM_4_1 = "Balle et al. 2020 Thm 4.1 (A_avg, Alg. 2)"
_THM_4_3 = "Balle et al. 2020 Thm 4.3 (sliding windows)"
_THM_5_1 = "Balle et al. 2020 Thm 5.1 (shuffling)"


def per_slot_epsilons(epsilon0: float, p0: float, m: int) -> NDArray[np.float64]:
    """Per-slot privacy-loss bounds ε_k (k = 0, …, m − 1) of a random check-in into m slots.

    Parameters
    ----------
    epsilon0 : float
        ε₀ > 0 of the (pure) local randomizer.
    p0 : float
        Check-in probability p₀ in (0, 1].
    m : int
        Number of slots m ≥ 1 the client may check into.

    Returns
    -------
    NDArray[np.float64], shape (m,)
        ε_k = log(1 + w_k (e^{ε₀} − 1)), w_k = min(1, (p₀/m) / (1 − p₀ (k/m)(1 − e^{−ε₀}))).

    Notes
    -----
    **Setting (Balle et al. 2020 Def. 3.1, Alg. 1).** Neighbouring datasets differ in client 1's record
    (x vs x′). Client 1 checks in with probability p₀ into a slot uniform over its m slots,
    independently of all data. Every slot updates the model with exactly one record passed
    through an adaptive ε₀-DP local randomizer R_j(· ; y_{<j}, record), where y_{<j} are the
    earlier outputs; the record is chosen among the clients checked in at that slot by a rule
    that does not look at data (Alg. 1: uniformly), and an empty slot uses a *dummy record* that
    goes through the same randomizer (assumption: R_j(·; dummy) is within e^{±ε₀} of
    R_j(·; x) for every x — otherwise a dummy slot is distinguishable and nothing below holds).
    Only outputs are released (models are post-processing).

    **Step 1 (condition on the others).** Fix C = every other client's check-in and the record
    each slot would use without client 1 (x̄_j, possibly the dummy). C has the same law in both
    worlds and is independent of client 1, so if every conditional pair is (ε, δ)-close, so is
    the mixture (joint convexity of the hockey-stick divergence). Given C, client 1's record is
    used at slot j with probability q_j = p₀ π_j / m ≤ p₀/m (π_j the chance the rule picks client
    1 among those at slot j), at most one slot is used, and Σ_j q_j ≤ p₀ (Balle et al.'s "probable
    replacement": slot j's record is x̄_j, replaced by x with probability q_j).

    **Step 2 (posterior).** Let E_j = "client 1 used at slot j" and N = Π_{i<j} R_i(y_i; x̄_i).
    Under E_j the first j − 1 slots used x̄, so P(y_{<j} | E_j) = N, while
    P(y_{<j}) = N (1 − S + Σ_{i<j} q_i ρ_i) with S = Σ_{i<j} q_i and ρ_i = R_i(y_i; x)/R_i(y_i; x̄_i)
    ∈ [e^{−ε₀}, e^{ε₀}]. Hence w_j := P(E_j | y_{<j}) = q_j / (1 − S + Σ q_i ρ_i)
    ≤ (p₀/m) / (1 − S(1 − e^{−ε₀})), and S ≤ p₀ k/m at the k-th slot (k from 0) of the window,
    giving w_j ≤ w_k above (and w_j ≤ 1 as a probability). The same holds in world x′.

    **Step 3 (one slot).** Given y_{<j} the slot's output law is P_j = w R(x) + (1 − w) R(x̄) in
    world x and Q_j = w′ R(x′) + (1 − w′) R(x̄) in world x′ (w, w′ ≤ w_k). With α = R(x)/R(x̄),
    α′ = R(x′)/R(x̄) at a point y, P_j/Q_j = (1 + w(α − 1)) / (1 + w′(α′ − 1)), increasing in α
    and decreasing in α′ over {α, α′ ∈ [e^{−ε₀}, e^{ε₀}], α/α′ ∈ [e^{−ε₀}, e^{ε₀}]}; on the
    maximising edge α = e^{ε₀} α′ the ratio is linear-fractional in α′, so its maximum is at a
    vertex: max(1 + w(e^{ε₀} − 1), 1/(1 − w′(1 − e^{−ε₀}))). With z = e^{ε₀},
    (1 + w(z − 1))(1 − w(1 − 1/z)) = 1 + w(1 − w)(z − 1)²/z ≥ 1, so the first term dominates and
    |log P_j/Q_j| ≤ log(1 + w_k(e^{ε₀} − 1)) = ε_k for every history (swap the worlds for the
    lower side). With w ≤ 1 this never exceeds ε₀.

    **Step 4 (composition)** is in :func:`fixed_window`.

    **Dishonest clients that win slots, adaptively.** Step 1 conditions on the other clients'
    check-ins as independent of client 1; a dishonest client who reads the published models is
    not. The bound still holds for every honest client 1 against dishonest clients who choose,
    at their wake slot, their slot, their choice key and the record they randomize as any function
    of the outputs published so far, of their own randomness and of each other — provided every
    dishonest update that can be picked *instead of client 1's* is the randomizer's output on some
    record (with choice key 0 a dishonest client is never such an alternative: she wins her slot
    whatever client 1 does). Proof: condition on the honest others' check-ins and records only
    (independent of client 1 and of the outputs) and treat the dishonest choices as a strategy,
    so that whether slot j is won by a dishonest client, and what she sends, are functions of
    y_{<j} (her choice is made at her wake slot w ≤ j, from y_{<w}) and of her coins. (a) If slot j
    is won, client 1 is not used there: q_j(y_{<j}) = 0, and the slot's output has one law in both
    worlds, so c_j = 0. (b) Otherwise client 1 is used at j with probability
    q_j(y_{<j}) = p₀ π_j(y_{<j}) / m ≤ p₀/m (her key is uniform and independent of everything else,
    so π_j ∈ [0, 1] whatever the others' keys), and the slot's law is w R(x) + (1 − w) R(x̄_j) with
    x̄_j an honest client's record, the dummy, or a record a dishonest client chose — each within
    e^{±ε₀} of R(x), as Step 3 needs. Step 2 goes through with history-dependent q_i: under E_j
    client 1 was not used before j, so P(y_{<j} | E_j) = N(y_{<j}), the law of the outputs without
    her; P(y_{<j}) = N·(1 − S + Σ_{i<j} q_i ρ_i) with S = Σ_{i<j} q_i(y_{<i}) ≤ p₀k/m; hence
    w_j ≤ w_k. Steps 3 and 4 use only |c_j| ≤ ε_k for every history. ∎ (A tie at key 0 — client 1's
    key is 0 with probability 2^−53 — is broken by the units' ephemeral keys, independent of the
    data.) Not covered: a well-formed update that is not the randomizer's output (no noise, a
    chosen vector) and can be picked instead of an honest client's — Step 3 fails for it; the
    deployment's statement assumes every valid update honest (γ = 1). Checked by exact enumeration
    over every adaptive winning strategy of a dishonest client on small instances, with the
    competing point mass as positive control (tests/accounting/test_checkin.py).

    References
    ----------
    Balle et al. 2020 (Balle, Kairouz, McMahan, Thakkar, Thakurta), Def. 3.1, Alg. 1, Thm 3.2 and its proof
    sketch ("amplification by probable replacement"). Balle et al. 2020 Thm 3.2 (as recalled).
    """
    owner = "per_slot_epsilons"
    epsilon0 = positive(owner, "epsilon0", epsilon0)
    p0 = _check_in_probability(owner, p0)
    m = positive_int(owner, "m", m)
    used_before = p0 * np.arange(m, dtype=np.float64) / m
    posterior = np.minimum(1.0, (p0 / m) / (1.0 - used_before * -math.expm1(-epsilon0)))
    return np.log1p(posterior * math.expm1(epsilon0))


def fixed_window(
    epsilon0: float, p0: float, m: int, delta: float, delta0: float = 0.0
) -> CheckinGuarantee:
    """(ε, δ)-DP of A_fix (Balle et al. 2020 Alg. 1): random check-ins into a fixed window of m slots.

    Parameters
    ----------
    epsilon0 : float
        ε₀ > 0 of the local randomizer.
    p0 : float
        Check-in probability p₀ in (0, 1] (Balle et al. 2020 Remark 1 suggests p₀ = m/n).
    m : int
        Number of slots (model updates) m ≥ 1.
    delta : float
        Target δ in (0, 1) of the amplified bound.
    delta0 : float, default 0.0
        δ₀ in [0, 1) of the local randomizer. For δ₀ > 0 no amplified bound is derived here and
        the result is the unamplified (ε₀, δ₀).

    Returns
    -------
    CheckinGuarantee
        "derived": ε = Σ_k ε_k(e^{ε_k} − 1) + √(2 log(1/δ) Σ_k ε_k²) with the ε_k of
        :func:`per_slot_epsilons`, at the given δ — when that ε is below ε₀; otherwise the
        "unamplified fallback" (ε₀, δ₀).

    Notes
    -----
    **Step 4 of the derivation** (Steps 1–3 in :func:`per_slot_epsilons`). Given C, write the
    privacy loss of the output sequence by the chain rule as Σ_j c_j with
    c_j = log P_j(y_j | y_{<j}) / Q_j(y_j | y_{<j}). By Step 3, |c_j| ≤ ε_k for every history,
    and E[c_j | y_{<j}] = KL(P_j ‖ Q_j) ≤ ε_k(e^{ε_k} − 1) (Cheu et al. 2022 Lemma A.5(2)). Azuma–Hoeffding on
    the martingale differences c_j − E[c_j | y_{<j}] (each in an interval of length 2ε_k fixed by
    the history) gives P(Σ c_j ≥ ε) ≤ δ for the ε above, i.e. (ε, δ)-DP given C, hence (Step 1)
    unconditionally. This is Cheu et al. 2022 Lemma 3.3 with δ_j = 0, whose Azuma proof carries over verbatim
    to adaptively chosen steps because the bounds ε_k do not depend on the history; it is
    computed by :func:`panpriv.accounting.composition.heterogeneous`.

    **Comparison with Balle et al. 2020.** The recalled Thm 3.2 reads ε = p₀(e^{ε₀} − 1)√(2e^{ε₀} log(1/δ)/m) +
    p₀² e^{ε₀}(e^{ε₀} − 1)²/m. Its square-root term is what Step 2 gives at p₀ = 1 after
    Σ_k 1/(1 − (k/m)(1 − e^{−ε₀}))² ≤ m e^{ε₀}; the bound here is never larger on the tested
    grid (tests), and is smaller for p₀ < 1 because it keeps the p₀ in the posterior.

    References
    ----------
    Balle et al. 2020, Alg. 1 and Thm 3.2. Cheu et al. 2022, Lemma 3.3 / A.3 and Lemma A.5.
    """
    owner = "fixed_window"
    return _one_record_per_slot(owner, _THM_3_2, epsilon0, p0, m, delta, delta0)


def sliding_window(
    epsilon0: float, p0: float, m: int, delta: float, delta0: float = 0.0
) -> CheckinGuarantee:
    """(ε, δ)-DP of random check-ins with sliding windows (the setting of Balle et al. 2020 Thm 4.3).

    Client i checks in with probability p₀ into a slot uniform over its own window of m slots
    (Balle et al. 2020 §4.2: {i, …, i + m − 1}); every slot updates the model with one checked-in record or a
    dummy, as in A_fix. Slots outside client 1's window use the same record in both worlds, so
    their privacy loss is 0, and Steps 1–4 of :func:`per_slot_epsilons` / :func:`fixed_window`
    apply verbatim to the m slots of the window (a chosen slot outside the update range only
    lowers the q_j). Same parameters and return value as :func:`fixed_window`.

    References
    ----------
    Balle et al. 2020, §4.2 and Thm 4.3 (formula lost; bound derived here).
    """
    owner = "sliding_window"
    return _one_record_per_slot(owner, _THM_4_3, epsilon0, p0, m, delta, delta0)


def averaged_updates(epsilon0: float, delta0: float = 0.0) -> CheckinGuarantee:
    """(ε, δ)-DP of A_avg (Balle et al. 2020 Alg. 2, averaged updates): the unamplified fallback (ε₀, δ₀).

    Balle et al. 2020 Thm 4.1 amplifies this protocol, but its formula was lost and its analysis must handle
    the revealed per-slot counts and empty slots; no amplified bound is derived here.

    References
    ----------
    Balle et al. 2020, Alg. 2 and Thm 4.1.
    """
    return unamplified(epsilon0, delta0, theorem=_THM_4_1)


def shuffling(epsilon0: float, delta0: float = 0.0) -> CheckinGuarantee:
    """(ε, δ)-DP of shuffling + sequential local randomizers (Balle et al. 2020 Thm 5.1): the fallback (ε₀, δ₀).

    Balle et al. 2020 Thm 5.1's formula was lost. The probable-replacement argument of
    :func:`per_slot_epsilons` does not transfer (in the swapping view the first slot's record
    depends on client 1's position), so no amplified bound is derived here;
    :func:`erlingsson_shuffling` gives the published comparison bound.

    References
    ----------
    Balle et al. 2020, Thm 5.1.
    """
    return unamplified(epsilon0, delta0, theorem=_THM_5_1)


def unamplified(
    epsilon0: float, delta0: float = 0.0, theorem: str = "Balle et al. 2020 (any check-in protocol)"
) -> CheckinGuarantee:
    """The bound that always holds: (ε₀, δ₀), with no amplification.

    Parameters
    ----------
    epsilon0 : float
        ε₀ > 0 of the local randomizer.
    delta0 : float, default 0.0
        δ₀ in [0, 1) of the local randomizer.
    theorem : str
        The protocol/theorem this is reported for.

    Notes
    -----
    Each client's record passes through at most one call of an (ε₀, δ₀)-DP local randomizer, and
    which call (if any) is decided independently of the data. Conditioned on that choice and on
    everyone else's randomness, the two worlds differ in that single call, so the output sequence
    is the adaptive composition of one (ε₀, δ₀)-DP step with steps that are identical in both
    worlds: (ε₀, δ₀)-DP; mixing over the conditioning keeps it (joint convexity).

    References
    ----------
    Balle et al. 2020, §1 (Table 1, "None") (the fallback).
    """
    owner = "unamplified"
    epsilon0 = positive(owner, "epsilon0", epsilon0)
    delta0 = in_range(owner, "delta0", delta0, 0.0, 1.0, closed_low=True, closed_high=False)
    return CheckinGuarantee(epsilon0, delta0, theorem, "unamplified fallback")


def erlingsson_shuffling(epsilon0: float, n: int, delta: float) -> CheckinGuarantee:
    """Erlingsson et al. (2019) Thm 7: ε = 12 ε₀ √(log(1/δ)/n) for shuffled ε₀-DP randomizers.

    Parameters
    ----------
    epsilon0 : float
        ε₀ in (0, 1/2].
    n : int
        Number of clients, n ≥ 1000.
    delta : float
        δ in (0, 0.01].

    Returns
    -------
    CheckinGuarantee
        Status "published comparison": quoted, not derived here; Balle et al. 2020 §5 compares Thm 5.1 with it.

    References
    ----------
    Erlingsson, Feldman, Mironov, Raghunathan, Talwar, Thakurta (2019), "Amplification by
    shuffling", Thm 7. Balle et al. 2020, §5. (as implemented in the authors' code).
    """
    owner = "erlingsson_shuffling"
    epsilon0 = in_range(owner, "epsilon0", epsilon0, 0.0, 0.5, closed_low=False, closed_high=True)
    n = positive_int(owner, "n", n, minimum=1000)
    delta = in_range(owner, "delta", delta, 0.0, 0.01, closed_low=False, closed_high=True)
    epsilon = 12.0 * epsilon0 * math.sqrt(math.log(1.0 / delta) / n)
    return CheckinGuarantee(epsilon, delta, "Erlingsson et al. 2019 Thm 7", "published comparison")


def _one_record_per_slot(
    owner: str, theorem: str, epsilon0: float, p0: float, m: int, delta: float, delta0: float
) -> CheckinGuarantee:
    """The derived bound of :func:`fixed_window`, or the fallback when it is not better."""
    epsilon0 = positive(owner, "epsilon0", epsilon0)
    p0 = _check_in_probability(owner, p0)
    m = positive_int(owner, "m", m)
    delta = open_unit(owner, "delta", delta)
    fallback = unamplified(epsilon0, delta0, theorem=theorem)
    if fallback.delta > 0.0:
        return fallback
    slots = per_slot_epsilons(epsilon0, p0, m)
    epsilon, composed_delta = heterogeneous(slots, np.zeros(m), delta)  # Cheu et al. 2022, Lemma 3.3
    if epsilon >= epsilon0:
        return fallback
    return CheckinGuarantee(epsilon, composed_delta, theorem, "derived")


def _check_in_probability(owner: str, p0: object) -> float:
    """p₀ in (0, 1]."""
    return in_range(owner, "p0", p0, 0.0, 1.0, closed_low=False, closed_high=True)
