"""panpriv.accounting.accountant: composition answered both ways, pinned to closed forms and to
dp_accounting's PLD and RDP accountants (test-only oracles) on the exported events."""

from __future__ import annotations

import math

import pytest
from dp_accounting import pld, rdp

from panpriv.accounting.accountant import Accountant, ApproximateDpEvent, GaussianEvent
from panpriv.accounting.errors import AccountingError
from panpriv.accounting.gaussian import analytic_delta, analytic_epsilon
from panpriv.accounting.ledger import Guarantee, PrivacyReport


def test_gaussian_events_compose_to_one_gaussian_with_the_root_sum_of_inverse_squares() -> None:
    """k uses at multiplier σ are one Gaussian mechanism at σ/√k (Dong, Roth & Su 2022, Cor. 3.3)."""
    accountant = Accountant().compose(GaussianEvent(4.0), count=16).compose(GaussianEvent(2.0))
    sigma = 1.0 / math.sqrt(16 / 4.0**2 + 1 / 2.0**2)
    assert accountant.get_epsilon(1e-6) == pytest.approx(analytic_epsilon(sigma, 1e-6), rel=1e-12)
    assert accountant.get_delta(1.0) == pytest.approx(analytic_delta(1.0, sigma), rel=1e-12)


@pytest.mark.parametrize(("multiplier", "count"), [(1.0, 1), (5.0, 10), (20.0, 400)])
def test_gaussian_composition_agrees_with_dp_accountings_pld_and_beats_its_rdp(multiplier: float, count: int) -> None:
    accountant = Accountant().compose(GaussianEvent(multiplier), count=count)
    event = accountant.to_dp_events()
    pld_epsilon = pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(1e-6)
    rdp_epsilon = rdp.RdpAccountant().compose(event).get_epsilon(1e-6)
    ours = accountant.get_epsilon(1e-6)
    # PLD discretises pessimistically: it may exceed the exact value by its interval, never undercut it.
    assert ours <= pld_epsilon + 1e-9 and ours == pytest.approx(pld_epsilon, rel=2e-3, abs=2e-3)
    assert ours < rdp_epsilon


def test_approximate_events_take_basic_composition_when_it_is_tighter() -> None:
    accountant = Accountant().compose(ApproximateDpEvent(0.5, 1e-7), count=2)
    assert accountant.get_epsilon(2e-7 + 1e-9) == pytest.approx(1.0)  # advanced with γ = 1e-9 is worse
    assert accountant.get_delta(1.0) == pytest.approx(2e-7)
    assert accountant.get_epsilon(1.5e-7) == math.inf  # the events alone spend 2e-7 > 1.5e-7


def test_many_small_approximate_events_take_advanced_composition() -> None:
    """k = 1000 uses of ε = 0.01 at slack γ = 1e-6: Σε(e^ε − 1) + √(2 k ln(1/γ)) ε (Dwork & Roth
    2014, Thm 3.20 with identical εⱼ) — well below basic composition's 10."""
    accountant = Accountant().compose(ApproximateDpEvent(0.01, 0.0), count=1000)
    expected = 1000 * 0.01 * math.expm1(0.01) + math.sqrt(2 * 1000 * math.log(1e6)) * 0.01
    assert accountant.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-12)
    assert expected < 10.0
    assert accountant.get_delta(expected) == pytest.approx(1e-6, rel=1e-9)


def test_mixed_events_are_at_least_as_tight_as_composing_the_parts_at_a_fixed_split() -> None:
    accountant = Accountant().compose(GaussianEvent(3.0), count=50).compose(ApproximateDpEvent(0.2, 1e-8), count=3)
    delta = 1e-5
    spare = delta - 3e-8
    half_split = analytic_epsilon(3.0 / math.sqrt(50), spare / 2) + 0.6
    got = accountant.get_epsilon(delta)
    assert got <= half_split + 1e-12
    assert got >= analytic_epsilon(3.0 / math.sqrt(50), spare)  # the Gaussian part alone at all of δ
    assert accountant.get_delta(got) <= delta * (1 + 1e-6)


def test_from_reports_composes_each_reports_output_guarantee() -> None:
    reports = [
        PrivacyReport("a", 10, Guarantee(1.0, 1e-6), Guarantee(2.0, 1e-6)),
        PrivacyReport("b", 10, Guarantee(0.5, 0.0), Guarantee(0.5, 0.0)),
    ]
    accountant = Accountant.from_reports(reports)
    assert accountant.events == ((ApproximateDpEvent(1.0, 1e-6), 1), (ApproximateDpEvent(0.5, 0.0), 1))
    assert accountant.get_delta(1.5) == pytest.approx(1e-6)


def test_bad_events_and_questions_name_the_parameter() -> None:
    with pytest.raises(AccountingError, match="noise_multiplier"):
        GaussianEvent(0.0)
    with pytest.raises(AccountingError, match="delta"):
        ApproximateDpEvent(1.0, 1.0)
    with pytest.raises(AccountingError, match="count"):
        Accountant().compose(GaussianEvent(1.0), count=0)
    with pytest.raises(AccountingError, match="delta"):
        Accountant().get_epsilon(0.0)
    assert Accountant().get_epsilon(1e-6) == 0.0 and Accountant().get_delta(0.0) == 0.0
