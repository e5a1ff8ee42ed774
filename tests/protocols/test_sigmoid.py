"""panpriv.protocols.sigmoid.expit: σ(s) = 1/(1 + e^{−s}) with numpy's exp, against mpmath and scipy."""

from __future__ import annotations

import mpmath
import numpy as np
from scipy.special import expit as scipy_expit

from panpriv.protocols.sigmoid import expit


def _exact(s: float) -> float:
    with mpmath.workdps(40):
        return float(1 / (1 + mpmath.exp(-mpmath.mpf(s))))


def test_within_two_ulps_of_the_exact_sigma_like_scipys() -> None:
    rng = np.random.default_rng(3)
    scores = np.concatenate([rng.normal(0.0, 3.0, 1500), rng.uniform(-700.0, 700.0, 500)])
    exact = np.array([_exact(s) for s in scores])
    ours = np.abs(expit(scores) - exact) / np.spacing(exact)
    theirs = np.abs(scipy_expit(scores) - exact) / np.spacing(exact)
    assert ours.max() <= 2.0
    assert theirs.max() <= 2.0  # the reference is no better


def test_agrees_with_scipy_to_two_ulps_and_in_place() -> None:
    rng = np.random.default_rng(4)
    scores = rng.normal(0.0, 5.0, 100_000)
    expected = scipy_expit(scores)
    in_place = scores.copy()
    result = expit(in_place, out=in_place)
    assert result is in_place
    assert np.all(np.abs(in_place - expected) <= 2.0 * np.spacing(expected))
    assert np.array_equal(expit(scores), in_place)


def test_extremes_without_warnings() -> None:
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        values = expit(np.array([-np.inf, -1e4, -709.0, 0.0, 709.0, 1e4, np.inf]))
    assert values[3] == 0.5
    assert values[4] == values[5] == values[6] == 1.0
    assert np.all(values[:3] <= 1.3e-308)
    assert np.isnan(expit(np.array([np.nan]))[0])


def test_scalars_and_lists() -> None:
    assert float(expit(np.float64(0.0))) == 0.5
    assert np.allclose(expit([0.0, np.log(3.0)]), [0.5, 0.75], rtol=0, atol=2e-16)


def test_the_few_element_path_equals_scipys_bit_for_bit_and_honours_out() -> None:
    """Up to four scores go through math.exp (the C library's, as scipy's expit); any layout of ``out``."""
    rng = np.random.default_rng(5)
    for size in (1, 2, 4):
        scores = rng.normal(0.0, 4.0, size)
        assert np.array_equal(expit(scores), scipy_expit(scores))
    out = np.zeros((2, 4))[:, ::2]  # a non-contiguous 2 × 2 view
    grid = np.array([[-1.0, 0.0], [2.0, -800.0]])
    expit(grid, out=out)
    assert np.array_equal(out[:, 0], scipy_expit(grid[:, 0])) and out[0, 1] == 0.5 and out[1, 1] <= 1.3e-308
