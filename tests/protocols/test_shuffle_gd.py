"""Tests of ShuffleGD (Cheu et al. 2022 Alg. 5, Lemma B.6, Thm 4.9): rounds = passes, composition, the ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest

from panpriv.accounting.binomial import pvec_parameters
from panpriv.accounting.ledger import Guarantee, PrivacyLedger
from panpriv.protocols import checks
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import AbsoluteLoss, HingeLoss, LogisticLoss
from panpriv.protocols.shuffle_base import NORM_SLACK
from panpriv.protocols.shuffle_gd import (
    ROUND_MARGIN,
    ShuffleGD,
    composed,
    round_budget,
    solved_round_epsilon,
    theorem_rounds,
    theorem_smoothing,
)

PASS_X, PASS_Y = checks.make_stream(3, 8, binary=True)
# Three passes of the n = 8 recorded records, ending mid-pass (the checks feed up to twice this).
X3, Y3 = np.vstack([PASS_X] * 3)[:20], np.concatenate([PASS_Y] * 3)[:20]


def factory(rng):
    return ShuffleGD(3, LogisticLoss(), 4.0, 1e-5, n=8, rounds=6, radius=20.0, rng=rng)


@pytest.mark.statistical
@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
def test_conformance(check):
    """panpriv.protocols.checks; the statistical check fails falsely with probability ≤ 1e-3."""
    check(factory, X3, Y3)


def drdv(epsilon0: float, delta0: float, k: int, slack: float) -> tuple[float, float]:
    """Dwork–Rothblum–Vadhan advanced composition, written out independently (Dwork & Roth 2014, Thm 3.20)."""
    return epsilon0 * math.sqrt(2 * k * math.log(1 / slack)) + k * epsilon0 * (math.exp(epsilon0) - 1), k * delta0 + slack


def test_theorem_parameters():
    """Cheu et al. 2022 Thm 4.9 / Lemma B.6: T = min{n, ε²n²/(d log²(nd/δ))}, ε₀ = ε/(2√(2T log(1/δ))),
    δ₀ = δ/(T + 1), β = (L/D) min(√n, εn/(√d log^{3/2}(d/δ)))."""
    assert theorem_rounds(1000, 20, 1.0, 1e-6) == 88  # 10⁶/(20·log²(2·10¹⁰)) = 88.9
    assert theorem_rounds(100, 20, 4.0, 1e-6) == 17  # 16·10⁴/(20·log²(2·10⁹)) = 17.4
    assert theorem_rounds(50, 2, 10.0, 1e-3) == 50  # 943 rounds, capped by n
    assert theorem_rounds(10, 20, 0.1, 1e-6) == 1  # at least one round
    epsilon0, delta0 = round_budget(1.0, 1e-6, 88)
    assert epsilon0 == pytest.approx(1 / (2 * math.sqrt(2 * 88 * math.log(1e6))))
    assert delta0 == pytest.approx(1e-6 / 89)
    assert theorem_smoothing(10**4, 20, 1.0, 1e-6, 2.0, 4.0) == pytest.approx(
        0.5 * min(100.0, 1e4 / (math.sqrt(20) * math.log(2e7) ** 1.5))
    )


def test_noise_level_and_composed_guarantee():
    """Each round is PVEC (Thm 3.2, paper calibration) over all n users at (ε₀, δ₀); after t rounds
    the report is the better of basic and advanced composition with slack δ/(T + 1), and after T it
    is within (ε, δ) as Lemma B.6 claims."""
    learner = ShuffleGD(3, LogisticLoss(), 1.0, 1e-6, n=8, rounds=200, calibration="paper", rng=0)
    epsilon0, delta0 = round_budget(1.0, 1e-6, 200)
    expected = pvec_parameters(8, 3, epsilon0, delta0, 1.0 * (1 + NORM_SLACK))
    parameters = learner.vector_sum.parameters
    assert (parameters.g, parameters.b, parameters.p, parameters.epsilon) == (expected.g, expected.b, expected.p, epsilon0)
    v = expected.variance_bound
    assert learner.gradient_bound_sq == pytest.approx(1.0 + 3 * v / 64, rel=1e-12)
    slack = 1e-6 / 201
    previous = Guarantee(0.0, 0.0)
    for t in (1, 2, 10, 60, 200):
        learner.learn_many(np.vstack([PASS_X] * (t - learner.rounds_started)), np.concatenate([PASS_Y] * (t - learner.rounds_started)))
        report = learner.privacy().output
        basic = (t * epsilon0, t * delta0)
        advanced = drdv(epsilon0, delta0, t, slack)
        best = basic if basic[0] <= advanced[0] else advanced
        assert report.epsilon == pytest.approx(best[0], rel=1e-12) and report.delta == pytest.approx(best[1], rel=1e-12)
        assert report.dominates(previous)
        previous = report
    assert previous.epsilon <= 1.0 and previous.delta <= 1e-6
    assert previous.epsilon == pytest.approx(drdv(epsilon0, delta0, 200, slack)[0])  # advanced wins at T = 200


def test_solved_budget_spends_all_of_epsilon():
    for rounds in (3, 200):
        epsilon0 = solved_round_epsilon(1.0, 1e-6, rounds)
        assert composed(epsilon0, 1e-6 / (rounds + 1), rounds, 1e-6 / (rounds + 1)).epsilon == pytest.approx(1.0, rel=1e-9)
        assert epsilon0 > round_budget(1.0, 1e-6, rounds)[0]
    assert solved_round_epsilon(1.0, 1e-6, 3) == pytest.approx(1 / 3, rel=1e-9)  # basic composition wins
    learner = ShuffleGD(3, LogisticLoss(), 1.0, 1e-6, n=8, rounds=3, budget="solved", calibration="paper", rng=0)
    learner.learn_many(np.vstack([PASS_X] * 3), np.concatenate([PASS_Y] * 3))
    assert learner.privacy().output.epsilon == pytest.approx(1.0, rel=1e-9)
    assert learner.privacy().output.epsilon <= 1.0


def test_ledger_shows_T_uses_and_counts_the_composition_once():
    """Each pass charged as its own instance registered with round_reports()'s increment (what
    panpriv.streamer.runtime.recorded_driver does): every position is used T times, and the ledger's total equals the
    learner's composed figure (to the rounding margin, never below). Registering the cumulative
    report under one instance would count the composition T times."""
    T = 6
    learner = ShuffleGD(3, LogisticLoss(), 4.0, 1e-5, n=8, rounds=T, radius=20.0)  # the factory's PVEC
    ledger, naive = PrivacyLedger(), PrivacyLedger()
    for t in range(1, T + 1):
        learner.learn_many(PASS_X, PASS_Y)
        reports = learner.round_reports()
        assert len(reports) == t == learner.rounds_started
        for number, report in enumerate(reports, start=1):
            ledger.register(f"gd/round-{number:06d}", report)
        ledger.charge(f"gd/round-{t:06d}", "recording", 0, 8)
        naive.register("gd", learner.privacy())
        naive.charge("gd", "recording", 0, 8)
    (segment,) = ledger.coverage("recording")
    assert (segment.start, segment.stop, len(segment.uses)) == (0, 8, T)
    own, total = learner.privacy(), ledger.report()
    for mine, theirs in ((own.output, total.output), (own.intrusion, total.intrusion)):
        assert mine.epsilon <= theirs.epsilon <= mine.epsilon * (1 + 2 * ROUND_MARGIN)
        assert mine.delta <= theirs.delta <= mine.delta * (1 + 2 * ROUND_MARGIN)
    assert naive.report().output.epsilon == pytest.approx(T * own.output.epsilon)  # the double count
    assert learner.passes == T


def test_intrusion_is_outputs_plus_one_message():
    learner = ShuffleGD(3, LogisticLoss(), 4.0, 1e-5, n=8, rounds=6, radius=20.0)
    learner.learn_many(X3, Y3)
    report = learner.privacy()
    local = learner._message()
    assert local.epsilon >= learner.vector_sum.epsilon and local.delta == 1e-5
    assert report.intrusion == report.output.compose(local)
    assert learner.rounds_started == 3 and report.records == 20
    assert {"Cheu et al. 2022, Alg. 5", "Cheu et al. 2022, Lemma B.6", "Cheu et al. 2022, Thm 4.9"} <= set(report.references)
    assert not factory(0).privacy().intrusion.is_meaningful


def test_passes_and_moreau_smoothing():
    """learn_recorded runs the remaining passes; the protocol then refuses records. A non-smooth
    loss is optimised through its Moreau envelope with Thm 4.9's β."""
    recording = np.vstack([PASS_X, PASS_X[:2]]), np.concatenate([PASS_Y, PASS_Y[:2]])
    learner = ShuffleGD(3, HingeLoss(), 1.0, 1e-6, n=10, rounds=3, calibration="paper", rng=1)
    L = HingeLoss().lipschitz(1.0, 1.0)
    assert learner.smoothing_parameter == pytest.approx(theorem_smoothing(10, 3, 1.0, 1e-6, L, 2.0))
    learner.learn_many(recording[0][:4], recording[1][:4])
    fetched = []

    def fetch(indices):
        fetched.append(indices)
        return recording[0][indices], recording[1][indices]

    learner.learn_recorded(fetch, micro_batch=4)
    assert learner.records_seen == 30 and learner.rounds_started == 3
    assert [list(i) for i in fetched[:2]] == [[4, 5, 6, 7], [8, 9]]
    assert learner.state_dict()["weight"] == 3.0
    with pytest.raises(InvalidInputError, match="T = 3 passes of n = 10"):
        learner.learn_many(PASS_X[:1], PASS_Y[:1])
    assert ShuffleGD(3, LogisticLoss(), 1.0, 1e-6, n=10, rounds=3, calibration="paper").smoothing_parameter is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "'n' parameter of ShuffleGD"),
        ({"rounds": 0}, "'rounds' parameter of ShuffleGD"),
        ({"budget": "all"}, "'budget' parameter of ShuffleGD"),
        ({"smoothing": "none"}, "'smoothing' parameter of ShuffleGD .* non-smooth absolute"),
        ({"loss": LogisticLoss(), "smoothing": "moreau"}, "'smoothing' parameter .*no closed-form prox"),
        ({"epsilon": 200.0, "delta": 0.1, "rounds": 100}, "composes over T = 100 rounds .* smaller 'epsilon'"),
        ({"epsilon": 0.0}, "'epsilon' parameter of ShuffleGD"),
    ],
)
def test_invalid_parameters_are_named(kwargs, message):
    arguments = {"dim": 3, "loss": AbsoluteLoss(), "epsilon": 1.0, "delta": 1e-5, "n": 10, "calibration": "paper", **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        ShuffleGD(**arguments)


def test_invalid_states_are_rejected():
    learner = ShuffleGD(3, LogisticLoss(), 1.0, 1e-5, n=8, rounds=2, calibration="paper", rng=0)
    learner.learn_many(PASS_X[:3], PASS_Y[:3])
    state = learner.state_dict()
    with pytest.raises(InvalidInputError, match="do not fit T = 2 passes"):
        learner.load_state_dict({**state, "filled": 4})
    with pytest.raises(InvalidInputError, match="do not fit T = 2 passes"):
        learner.load_state_dict({**state, "records": 19, "filled": 3})
    with pytest.raises(InvalidInputError, match="'totals'"):
        learner.load_state_dict({**state, "totals": -state["totals"] - 1})


def test_planned_privacy_is_the_report_after_every_round():
    learner = ShuffleGD(3, LogisticLoss(), 4.0, 1e-5, n=len(Y3), rounds=4, radius=20.0, rng=3)
    planned = learner.planned_privacy()
    assert learner.privacy().output.epsilon == 0.0 < planned.output.epsilon
    learner.learn_recorded(lambda indices: (X3[indices], Y3[indices]), micro_batch=7)
    final = learner.privacy()
    assert (final.output, final.intrusion) == (planned.output, planned.intrusion)
