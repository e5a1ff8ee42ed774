"""Tests of RandomCheckinSGD (Balle et al. 2020 Algs 1–2, §4.2) and the ℓ2-ball randomizer: conformance, the
randomizer's ε₀ and unbiasedness, guarantees from panpriv.accounting.checkin, time slots, inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import gamma as gamma_function

from panpriv.accounting.checkin import averaged_updates, fixed_window, sliding_window
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.ledger import Guarantee
from panpriv.protocols import checks
from panpriv.protocols.checkin import RandomCheckinSGD, amplified_epsilon0, check_in, window_start
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import LogisticLoss, clip_rows
from panpriv.protocols.randomizers import L2BallRandomizer
from panpriv.protocols.randomness import SEEDED_WARNING

X3, Y3 = checks.make_stream(3, 40, binary=True)
DELTA = 1e-5

CASES = {
    "single-sliding-l2": lambda rng: RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, slots=5, radius=20.0, rng=rng),
    "averaged-fixed-gaussian": lambda rng: RandomCheckinSGD(
        3, {"name": "logistic", "ridge": 0.1}, 1.0, DELTA, update="averaged", window="fixed", slots=3,
        slot_length=2, randomizer="gaussian", radius=20.0, rng=rng,
    ),
    "single-fixed-l2": lambda rng: RandomCheckinSGD(
        3, LogisticLoss(intercept=True), 2.0, DELTA, window="fixed", slots=4, slot_length=2,
        checkin_probability=0.7, radius=20.0, rng=rng,
    ),
}
STATISTICAL = ("single-sliding-l2", "averaged-fixed-gaussian")


@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance(case, check):
    """panpriv.protocols.checks; the statistical micro-batch check (false failure ≤ 1e-3) runs on two
    configurations that together cover both updates, both windows and both randomizers."""
    if check is checks.check_micro_batch_invariance and case not in STATISTICAL:
        pytest.skip("statistical check run on the other configurations")
    check(CASES[case], X3, Y3)


# -- the l2-ball randomizer ----------------------------------------------------------------------


@pytest.mark.parametrize("dim, factor", [(1, 1.0), (2, math.pi / 2), (3, 2.0)])
def test_l2_scale_makes_outputs_unbiased(dim, factor):
    """B = C (e^ε + 1)/(e^ε − 1)/κ_p with 1/κ_p = 1, π/2, 2 for p = 1, 2, 3 (E|z₁| on the sphere)."""
    r = L2BallRandomizer(0.5, 1.3)
    assert r.scale(dim) == pytest.approx(0.5 * (math.exp(1.3) + 1) / (math.exp(1.3) - 1) * factor, rel=1e-12)
    assert r.noise_second_moment(dim) == pytest.approx(r.scale(dim) ** 2)
    inverse_kappa = math.sqrt(math.pi) * gamma_function((20 + 1) / 2) / gamma_function(20 / 2)
    assert r.scale(20) == pytest.approx(0.5 / math.tanh(0.65) * inverse_kappa, rel=1e-12)


def test_l2_randomizer_is_epsilon0_dp_in_one_dimension():
    """In R¹ the output is ±B with P(+B | x) = π(1/2 + x/2C) + (1 − π)(1/2 − x/2C), π = e^ε/(1 + e^ε).
    The largest likelihood ratio over inputs in [−C, C] is exactly e^ε (at x = ±C): the bound of
    the proof is attained, never exceeded."""
    epsilon0, C = 0.8, 1.0
    pi = math.exp(epsilon0) / (1 + math.exp(epsilon0))
    x = np.linspace(-C, C, 201)
    plus = pi * (0.5 + x / (2 * C)) + (1 - pi) * (0.5 - x / (2 * C))
    ratio = max(plus.max() / plus.min(), (1 - plus).max() / (1 - plus).min())
    assert ratio == pytest.approx(math.exp(epsilon0), rel=1e-12)
    assert L2BallRandomizer(C, epsilon0).local_guarantee() == Guarantee(epsilon0, 0.0)


@pytest.mark.statistical
def test_l2_randomizer_frequencies_match_the_one_dimensional_law():
    """Empirical P(+B | x) for x ∈ {−C, 0.3C, C} from 20 000 draws each matches the closed form
    (binomial test, false failure 3e-4 overall)."""
    r = L2BallRandomizer(2.0, 0.8)
    generator = np.random.default_rng(11)
    pi = r.keep_probability
    for x in (-2.0, 0.6, 2.0):
        out = r.privatize(np.full((20_000, 1), x), generator)[:, 0]
        assert np.allclose(np.abs(out), r.scale(1))
        expected = pi * (0.5 + x / 4.0) + (1 - pi) * (0.5 - x / 4.0)
        assert stats.binomtest(int(np.sum(out > 0)), out.size, expected).pvalue > 1e-4


@pytest.mark.statistical
def test_l2_randomizer_is_unbiased_with_norm_b():
    """Means of 40 000 messages for a clipped input (norm 2 → 1) and for the dummy (zero) input are
    within 4.5 standard errors of x_clipped and 0 in each of 5 coordinates (false failure ~7e-5)."""
    r = L2BallRandomizer(1.0, 1.5)
    generator = np.random.default_rng(7)
    x = np.array([2.0, 0.0, 0.0, 0.0, 0.0])  # clipped to norm 1
    for inputs, target in ((np.tile(x, (40_000, 1)), x / 2.0), (None, np.zeros(5))):
        out = r.privatize(inputs, generator) if inputs is not None else r.dummy(40_000, 5, generator)
        assert np.allclose(np.linalg.norm(out, axis=1), r.scale(5))
        se = out.std(axis=0, ddof=1) / math.sqrt(out.shape[0])
        assert np.all(np.abs(out.mean(axis=0) - target) < 4.5 * se)


# -- guarantees ------------------------------------------------------------------------------------


@pytest.mark.parametrize("window, accountant", [("sliding", sliding_window), ("fixed", fixed_window)])
def test_single_updates_use_the_largest_epsilon0_meeting_the_derived_bound(window, accountant):
    """ε₀ is the largest for which panpriv.accounting.checkin's bound (Balle et al. 2020 Thm 3.2 / Thm 4.3 setting) meets ε
    at δ; the report prints that bound; the intrusion guarantee is the local (ε₀, 0)."""
    m, p0, epsilon = 2000, 0.5, 1.0
    learner = RandomCheckinSGD(4, LogisticLoss(), epsilon, DELTA, window=window, slots=m, checkin_probability=p0)
    epsilon0 = learner.local_randomizer.epsilon0
    bound = accountant(epsilon0, p0, m, DELTA)
    assert bound.status == "derived" and bound.epsilon <= epsilon < epsilon0
    assert accountant(epsilon0 * (1 + 1e-5), p0, m, DELTA).epsilon > epsilon
    report = learner.privacy()
    assert report.output == Guarantee(bound.epsilon, bound.delta)
    assert report.intrusion == Guarantee(epsilon0, 0.0)
    assert any("derived" in a for a in report.assumptions)


def test_without_amplification_epsilon0_is_the_target():
    """Too few slots to amplify: the bound is the unamplified (ε₀, 0) and ε₀ = ε."""
    assert amplified_epsilon0("single", "sliding", 1.0, 5, 1.0, DELTA) == 1.0
    learner = CASES["single-sliding-l2"](None)
    assert learner.privacy().output == Guarantee(1.0, 0.0) == learner.privacy().intrusion


def test_averaged_updates_are_unamplified():
    learner = RandomCheckinSGD(4, LogisticLoss(), 0.7, DELTA, update="averaged", slots=5000)
    assert learner.local_randomizer.epsilon0 == 0.7
    assert averaged_updates(0.7).status == "unamplified fallback"
    report = learner.privacy()
    assert report.output == report.intrusion == Guarantee(0.7, 0.0)
    assert "Balle et al. 2020, Thm 4.1" in report.references and "Balle et al. 2020, Alg. 2" in report.references
    assert any("unamplified fallback" in a for a in report.assumptions)


def test_gaussian_randomizer_is_calibrated_to_the_target_unamplified():
    """An (ε₀, δ₀) randomizer gets no amplified bound: σ = the exact Gaussian σ for (ε, δ) at
    sensitivity 2C, and the report is the fallback (ε₀, δ₀)."""
    learner = CASES["averaged-fixed-gaussian"](None)
    randomizer = learner.local_randomizer
    assert randomizer.noise_multiplier == pytest.approx(analytic_sigma(1.0, DELTA, 2.0), rel=2e-6)
    local = randomizer.local_guarantee()
    assert local.epsilon <= 1.0 and local.delta == DELTA
    assert learner.privacy().output == learner.privacy().intrusion == local
    single = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, slots=10**5, randomizer="gaussian")
    assert single.privacy().output == local  # 10⁵ slots would amplify a pure randomizer


def test_seeded_mode_has_no_pan_private_guarantee():
    report = CASES["single-fixed-l2"](0).privacy()
    assert not report.intrusion.is_meaningful and SEEDED_WARNING in report.assumptions


# -- time slots, windows and updates ---------------------------------------------------------------


def test_client_side_check_in():
    """Balle et al. 2020 Def. 3.1: a slot of the client's window with probability p₀, else None."""
    assert window_start(7, 4, "sliding") == 7 and window_start(7, 4, "fixed") == 8
    slots = [check_in(7, 4, 0.6, rng=seed) for seed in range(4000)]
    chosen = [s for s in slots if s is not None]
    assert set(chosen) == {7, 8, 9, 10}
    assert stats.binomtest(len(chosen), 4000, 0.6).pvalue > 1e-4
    assert stats.chisquare(np.bincount(np.array(chosen) - 7)).pvalue > 1e-4
    assert {check_in(7, 4, 1.0, window="fixed") for _ in range(50)} <= {8, 9, 10, 11}
    with pytest.raises(InvalidInputError, match="'probability' parameter of check_in"):
        check_in(0, 4, 0.0)


def test_single_updates_run_every_slot_and_averaged_skip_empty_ones():
    """Alg. 1 updates once per closed slot (dummies fill empty ones); Alg. 2 only for non-empty."""
    rare = dict(slots=6, checkin_probability=0.05, radius=20.0, rng=3)
    single = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, **rare)
    averaged = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, update="averaged", **rare)
    for learner in (single, averaged):
        learner.learn_many(X3, Y3)
    assert single.state_dict()["clock"] == 39 and single.state_dict()["weight"] == 39.0
    assert 0.0 <= averaged.state_dict()["weight"] < 10.0


def test_fixed_window_waits_for_the_next_round():
    """Clients of round 0 check into round 1; round 0 performs no update."""
    learner = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, window="fixed", slots=4, rng=0)
    learner.learn_many(X3[:4], Y3[:4])
    state = learner.state_dict()
    assert state["clock"] == 4 and state["weight"] == 0.0 and np.any(state["slot_keys"] < 1.0)
    learner.learn_many(X3[4:9], Y3[4:9])  # slot 8 arrives: slots 4..7 close
    assert learner.state_dict()["weight"] == 4.0


def test_timestamps_place_clients_like_positions():
    """Timestamps t_i = origin + (i + 0.5)·Δ with Δ seconds per slot give the same slots — and,
    with the same seed, the same state — as positions with one record per slot."""
    by_position = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, slots=5, radius=20.0, rng=9)
    by_time = RandomCheckinSGD(
        3, LogisticLoss(), 1.0, DELTA, slots=5, time="timestamp", slot_length=60.0, origin=1.7e9, radius=20.0, rng=9
    )
    by_position.learn_many(X3[:15], Y3[:15])  # the same micro-batches: they cut the sub-blocks whose
    by_position.learn_many(X3[15:], Y3[15:])  # randomness is drawn together (RandomCheckinSGD.learn_many)
    stamps = 1.7e9 + (np.arange(40) + 0.5) * 60.0
    by_time.learn_many(X3[:15], Y3[:15], timestamps=stamps[:15])
    by_time.learn_many(X3[15:], Y3[15:], timestamps=stamps[15:])
    a, b = by_position.state_dict(), by_time.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_a_gap_in_time_closes_every_slot_in_between():
    learner = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, slots=3, time="timestamp", slot_length=1.0, rng=0)
    learner.learn_many(X3[:2], Y3[:2], timestamps=np.array([0.5, 0.7]))
    learner.learn_many(X3[2:3], Y3[2:3], timestamps=np.array([100.2]))
    assert learner.state_dict()["clock"] == 100 and learner.state_dict()["weight"] == 100.0


# -- invalid inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"update": "median"}, "update"),
        ({"window": "tumbling"}, "window"),
        ({"slots": 0}, "slots"),
        ({"checkin_probability": 0.0}, "checkin_probability"),
        ({"checkin_probability": 1.2}, "checkin_probability"),
        ({"time": "clock"}, "time"),
        ({"slot_length": 0}, "slot_length"),
        ({"slot_length": 1.5}, "slot_length"),
        ({"time": "timestamp", "slot_length": -1.0}, "slot_length"),
        ({"origin": 5.0}, "origin"),
        ({"randomizer": "laplace"}, "randomizer"),
        ({"clip": 0.0}, "clip"),
        ({"epsilon": -1.0}, "epsilon"),
    ],
)
def test_invalid_parameters_are_named(kwargs, name):
    arguments = {"dim": 3, "loss": LogisticLoss(), "epsilon": 1.0, "delta": DELTA, "slots": 4, **kwargs}
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of RandomCheckinSGD"):
        RandomCheckinSGD(**arguments)


def test_invalid_timestamps_and_states_are_refused():
    by_position = CASES["single-sliding-l2"](0)
    with pytest.raises(InvalidInputError, match="'timestamps'"):
        by_position.learn_many(X3[:2], Y3[:2], timestamps=np.zeros(2))
    by_time = RandomCheckinSGD(3, LogisticLoss(), 1.0, DELTA, slots=4, time="timestamp", origin=10.0)
    with pytest.raises(InvalidInputError, match="'timestamps'"):
        by_time.learn_many(X3[:2], Y3[:2])
    with pytest.raises(InvalidInputError, match="origin"):
        by_time.learn_many(X3[:2], Y3[:2], timestamps=np.array([9.0, 11.0]))
    by_time.learn_many(X3[:2], Y3[:2], timestamps=np.array([12.0, 15.0]))
    with pytest.raises(InvalidInputError, match="back in time"):
        by_time.learn_many(X3[:1], Y3[:1], timestamps=np.array([13.0]))
    state = by_position.state_dict()
    with pytest.raises(InvalidInputError, match="inconsistent"):
        by_position.load_state_dict({**state, "slot_keys": np.full(5, 2.0)})
    with pytest.raises(InvalidInputError, match="'slot_messages'"):
        by_position.load_state_dict({**state, "slot_messages": np.zeros(7)})


def test_utility_warning_is_the_noise_to_gradient_ratio_of_a_slot():
    """Issue 17: ρ = √(v/k)/C from the randomizer's calibration and the plan alone. ℓ2 (single
    updates, k = 1): ρ = B/C = 1/(tanh(ε₀/2)·κ_p), κ_p = Γ(p/2)/(√π Γ((p+1)/2)) — at least √(πp/2)-ish,
    so the service's default always warns. Averaged updates over slot_length·p₀ messages and the
    Gaussian randomizer (ρ = σ√(p/k)) can stay below 1: no warning."""
    default = RandomCheckinSGD(100, LogisticLoss(), 1.0, 1e-6, radius=10.0)
    epsilon0 = default.local_randomizer.local_guarantee().epsilon
    kappa = gamma_function(50.0) / (math.sqrt(math.pi) * gamma_function(50.5))
    rho = 1.0 / (math.tanh(epsilon0 / 2.0) * kappa)
    assert default.noise_to_signal() == pytest.approx(rho, rel=1e-9) and rho > math.sqrt(math.pi * 100 / 2)
    (warning,) = default.utility_warnings()
    assert f"= {rho:.3g} x the largest clipped gradient C = 1" in warning and f"it needs {1 + rho**2:.3g} x as many" in warning

    averaged = RandomCheckinSGD(20, LogisticLoss(), 1.0, 1e-6, update="averaged", slot_length=1000,
                                checkin_probability=0.5, radius=4.0)
    scale = averaged.local_randomizer.scale(20)
    assert averaged.noise_to_signal() == pytest.approx(scale / math.sqrt(500), rel=1e-12) and scale / math.sqrt(500) < 1
    assert averaged.utility_warnings() == ()

    gaussian = RandomCheckinSGD(5, LogisticLoss(), 16.0, 1e-6, randomizer="gaussian", radius=4.0)
    sigma = gaussian.local_randomizer.noise_multiplier
    (warning,) = gaussian.utility_warnings()
    assert gaussian.noise_to_signal() == pytest.approx(sigma * math.sqrt(5), rel=1e-12)
    assert f"= {sigma * math.sqrt(5):.3g} x the largest" in warning


# -- the seeded replay is Alg. 1, record by record ---------------------------------------------------


def _l2_messages(randomizer: L2BallRandomizer, G: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """The ℓ2-ball randomizer on the rows of ``G``, row by row as its class docstring states it
    (one call draws the rows' two uniforms each, then their Gaussian directions)."""
    uniforms = generator.random((G.shape[0], 2))
    Z = generator.standard_normal(G.shape)
    Z /= np.maximum(np.sqrt(np.einsum("ij,ij->i", Z, Z)), np.finfo(np.float64).tiny)[:, None]
    return np.array([_l2_message(randomizer, g, u, z) for g, u, z in zip(G, uniforms, Z)])


def _l2_message(randomizer: L2BallRandomizer, g: np.ndarray, uniforms: np.ndarray, z: np.ndarray) -> np.ndarray:
    """One ℓ2-ball message from the input ``g``, the two uniforms and the unit direction ``z``."""
    u_side, u_hemisphere = uniforms
    norm = float(np.sqrt(np.einsum("ij,ij->i", g[None, :], g[None, :]))[0])
    s = 1.0 if u_side < 0.5 + min(norm, randomizer.clip) / (2.0 * randomizer.clip) else -1.0
    on_v_side = s * float(np.einsum("ij,ij->i", z[None, :], g[None, :])[0]) > 0.0
    keep = on_v_side == (u_hemisphere < randomizer.keep_probability)
    return (randomizer.scale(g.size) * (1.0 if keep or norm == 0.0 else -1.0)) * z


@pytest.mark.parametrize(
    "options, splits, exercised",
    [
        ({"slots": 7}, [1, 8, 9, 40, 77], ()),
        ({"slots": 5, "slot_length": 2, "checkin_probability": 0.6}, [2, 6, 40, 78], ()),
        ({"slots": 4, "window": "fixed", "slot_length": 3, "checkin_probability": 0.8}, [3, 6, 42, 78], ()),
        ({"slots": 6, "slot_length": 2}, [5, 77], ()),  # micro-batches cutting a slot's clients in two
        # the learner's general close (a closing slot held by a client in flight) and its inlined one
        ({"slots": 2}, [1, 8, 9, 40, 77], ("in flight", "inlined")),
        ({"slots": 7, "radius": 0.05}, [30, 60], ("projected", "dummy")),  # Θ's boundary at most steps
        ({"slots": 40, "checkin_probability": 0.2}, [45], ("dummy",)),  # mostly dummies
    ],
)
def test_seeded_replay_is_algorithm_1_record_by_record(options, splits, exercised):
    """With a seed, single updates with the ℓ2 randomizer are exactly (bit for bit) Balle et al. 2020
    Alg. 1 replayed one client at a time from the loss's own features, labels and gradients, with
    the same generator in the learner's grouping of draws: each micro-batch here is one sub-block
    (at most NOISE_BLOCK_ROWS = 128 clients), whose randomness is drawn at its start — for all its
    clients, whether each checks in, her offset, her key, her randomizer's two uniforms, her
    Gaussian direction — and then client by client: a new wake slot closes the earlier slots (the
    kept message, or a dummy R(0): the part's first empty slot draws as many dummies as it has
    clients, R(0) of that many zero rows); a client who checks in and beats her slot's key
    sends R(her clipped gradient at the current model) with her own randomizer draws. Whatever the
    micro-batches, the learner's per-block features, scalar slopes and deferred vectorised
    messages must not change a bit of it."""
    loss = LogisticLoss(intercept=True)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(90, 3)) * 0.8
    y = np.where(rng.random(90) < 0.5, 1.0, 0.0)
    learner = RandomCheckinSGD(3, loss, 1.0, DELTA, rng=21, **{"radius": 3.0, **options})
    parts = np.split(np.arange(90), splits)
    for part in parts:
        learner.learn_many(X[part], y[part])

    local, m = learner.local_randomizer, learner.slots
    slot_length, window = options.get("slot_length", 1), options.get("window", "sliding")
    buffer = m if window == "sliding" else 2 * m
    generator = np.random.default_rng(21)
    theta, average, weight, moment = np.zeros(4), np.zeros(4), 0.0, 0.0
    messages, keys = np.zeros((buffer, 4)), np.ones(buffer)
    Z, labels = loss.features(X, learner.feature_bound), loss.labels(y)
    bound = (math.sqrt(local.clip**2 + local.noise_second_moment(4)) + 0.0) ** 2
    clock = -1
    wakes = np.arange(90) // slot_length
    seen: set[str] = set()  # the paths of the learner's loop this replay went through
    for part in parts:
        k = part.size
        joins = generator.random(k) < learner.checkin_probability
        offsets = generator.integers(0, m, size=k)
        drawn = generator.random(k)
        uniforms = generator.random((k, 2))
        directions = generator.standard_normal((k, 4))
        directions /= np.maximum(np.sqrt(np.einsum("ij,ij->i", directions, directions)), np.finfo(np.float64).tiny)[:, None]
        dummies, used = np.zeros((0, 4)), 0  # k dummies R(0) drawn at the part's first empty slot
        in_flight = set()  # slots held by a client of this part
        for r, client in enumerate(part):
            wake = wakes[client]
            clock = window_start(wake, m, window) if clock < 0 else clock
            for j in range(clock, max(clock, wake)):
                i = j % buffer
                seen.add("in flight" if i in in_flight else "inlined" if wake == clock + 1 else "several slots")
                in_flight.discard(i)
                if keys[i] < 1.0:
                    message = messages[i]
                else:
                    if used == dummies.shape[0]:
                        dummies, used = _l2_messages(local, np.zeros((k, 4)), generator), 0
                    message, used = dummies[used], used + 1
                    seen.add("dummy")
                moment += bound
                weight += 1.0
                average = average + (theta - average) / weight
                theta = theta - (2.0 * learner.radius / math.sqrt(moment)) * message
                if np.linalg.norm(theta) > learner.radius:
                    seen.add("projected")
                theta = theta * min(1.0, learner.radius / np.linalg.norm(theta))
                messages[i], keys[i] = 0.0, 1.0
            clock = max(clock, wake)
            if not joins[r]:
                continue
            slot = (window_start(wake, m, window) + offsets[r]) % buffer
            if drawn[r] < keys[slot]:
                keys[slot] = drawn[r]
                in_flight.add(slot)
                gradient = clip_rows(loss.gradient(theta, Z[client : client + 1], labels[client : client + 1]), local.clip)[0]
                messages[slot] = _l2_message(local, gradient, uniforms[r], directions[r])
    state = learner.state_dict()
    assert set(exercised) <= seen  # the case reaches the paths it is there for
    np.testing.assert_array_equal(state["theta"], theta)
    np.testing.assert_array_equal(learner.release(), average)
    assert state["weight"] == weight
    np.testing.assert_array_equal(state["slot_messages"], messages.ravel())  # closed slots: zeros
    np.testing.assert_array_equal(state["slot_keys"], keys)
