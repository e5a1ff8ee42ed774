"""Scratch-buffer computations equal the reference ones bit for bit, and the noise source leaves
no generator state behind."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from panpriv.protocols import scratch
from panpriv.protocols.losses import LOSSES, clip_rows
from panpriv.protocols.randomness import NoiseSource, _KeyedPCG64
from panpriv.protocols.scratch import Scratch

SMOOTHABLE = ("squared", "hinge", "absolute", "huber")


def _data(m: int = 50, d: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((m, d)) * 0.7  # some rows above the bound 1, some below
    y = np.where(rng.random(m) < 0.5, 1.0, 0.0)
    theta = rng.standard_normal(d + 1)
    return X, y, theta


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("intercept", [False, True])
def test_features_labels_and_gradients_equal_the_loss_methods_bitwise(name: str, intercept: bool) -> None:
    loss = LOSSES[name](intercept=intercept)
    X, y, theta = _data()
    theta = theta[: loss.param_dim(X.shape[1])] * 3.0
    work = Scratch()
    Z = scratch.features(loss, X, 1.0, work)
    np.testing.assert_array_equal(Z, loss.features(X, 1.0))
    labels = scratch.labels(loss, y, work)
    np.testing.assert_array_equal(labels, loss.labels(y))
    expected = clip_rows(loss.gradient(theta, Z, labels), 0.5)
    np.testing.assert_array_equal(scratch.clipped_gradients(loss, theta, Z, labels, 0.5, work), expected)
    if name in SMOOTHABLE:
        expected = clip_rows(loss.envelope_gradient(theta, Z, labels, 2.0), 0.5)
        got = scratch.clipped_gradients(loss, theta, Z, labels, 0.5, work, smoothing=2.0)
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(scratch.row_sum(expected, work), expected.sum(axis=0))


def test_wipe_zeroes_every_buffer() -> None:
    work = Scratch()
    a = work.take("a", 3, 4)
    a[...] = 7.0
    b = work.take("b", 5)
    b[...] = 1.0
    work.wipe()
    assert not a.any() and not b.any()
    bigger = work.take("a", 10, 4)  # growing zeroes the old buffer before dropping it
    assert bigger.shape == (10, 4)
    assert not a.any()


def test_seeded_add_gaussian_is_bitwise_the_old_normal_draw() -> None:
    out = np.arange(5.0)
    NoiseSource(11).add_gaussian(out, 0.3)
    np.testing.assert_array_equal(out, np.arange(5.0) + np.random.default_rng(11).normal(0.0, 0.3, size=5))


def test_os_entropy_draws_leave_the_generator_state_zero_and_differ() -> None:
    source = NoiseSource()
    first, second = np.zeros(64), np.zeros(64)
    source.add_gaussian(first, 1.0)
    source.add_gaussian(second, 1.0)
    assert not np.array_equal(first, second)
    keyed = source._keyed
    assert isinstance(keyed, _KeyedPCG64)
    assert keyed._bit_generator.state["state"] == {"state": 0, "inc": 0}
    assert keyed._bit_generator.state["has_uint32"] == 0
    assert not keyed._state.any() and not source._scratch.any()
    with source.draw() as generator:
        inside = generator.bit_generator.state["state"]
    assert inside["inc"] % 2 == 1 and inside["state"] != 0  # keyed from the OS inside the block
    assert keyed._bit_generator.state["state"] == {"state": 0, "inc": 0}


def test_os_entropy_gaussian_has_unit_variance() -> None:
    """Statistical: 200,000 draws; the sample variance is within 6 standard errors of 1
    (false-failure probability < 1e-8)."""
    out = np.zeros(200_000)
    NoiseSource().add_gaussian(out, 1.0)
    assert abs(out.var() - 1.0) < 6.0 * np.sqrt(2.0 / out.size)
    assert abs(out.mean()) < 6.0 / np.sqrt(out.size)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("smoothing", [None, 2.0])
@pytest.mark.parametrize("bound", [0.05, 0.5, 100.0])  # most, some, and no gradients clipped
def test_the_fused_clipped_gradient_sum_equals_the_sum_of_clipped_gradients(name, intercept, smoothing, bound) -> None:
    """The GLM fast path (no feature or gradient matrix) sums the same clipped gradients."""
    if smoothing is not None and name not in SMOOTHABLE:
        pytest.skip("the logistic loss is smooth: no Moreau smoothing")
    loss = LOSSES[name](intercept=intercept, intercept_scale=0.7)
    X, y, theta = _data(m=300)
    X[::17] = 0.0  # zero rows: norms at the floor, weights finite
    theta = theta[: loss.param_dim(X.shape[1])] * 3.0
    Z = loss.features(X, 1.0)
    labels = loss.labels(y)
    gradients = loss.gradient(theta, Z, labels) if smoothing is None else loss.envelope_gradient(theta, Z, labels, smoothing)
    clipped = clip_rows(gradients, bound)
    assert (np.linalg.norm(gradients, axis=1) > bound).any() == (bound < 100.0)
    fused = scratch.clipped_gradient_sum(loss, theta, X, labels, 1.0, bound, Scratch(), smoothing)
    np.testing.assert_allclose(fused, clipped.sum(axis=0), rtol=1e-12, atol=1e-12 * bound)


def test_clip_factors_are_the_textbook_minimum_bitwise() -> None:
    """bound/max(n, bound) equals min(1, bound/max(n, tiny)) bit for bit: zero, tiny, subnormal,
    equal-to-bound, just-above, huge and NaN norms, for several bounds."""
    rng = np.random.default_rng(8)
    tiny = np.finfo(np.float64).tiny
    for bound in (1.0, 0.37, 1.4142135623730951, 1e-300, 7e300):
        norms = np.concatenate([
            [0.0, 5e-324, tiny, bound, np.nextafter(bound, 0.0), np.nextafter(bound, np.inf), 1e308, np.inf, np.nan],
            bound * np.exp(rng.normal(0.0, 3.0, 2000)),
        ])
        with np.errstate(over="ignore"):
            expected = np.minimum(1.0, bound / np.maximum(norms, tiny))
        np.testing.assert_array_equal(scratch._clip_factors(bound, norms.copy()), expected)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("smoothing", [None, 2.0])
@pytest.mark.parametrize("bound", [0.05, 0.5, 100.0])  # most, some, and no gradients clipped
def test_clipped_weights_are_the_clipped_gradients(name, intercept, smoothing, bound) -> None:
    """w_i·z_i from the block's row norms (the pooled rounds' clip) is clipped_gradients' row:
    bit for bit where the gradient is inside the bound (factor exactly 1), within a few ulps
    where it is clipped; Zᵀw is their sum up to the order of the additions."""
    if smoothing is not None and name not in SMOOTHABLE:
        pytest.skip("the logistic loss is smooth: no Moreau smoothing")
    loss = LOSSES[name](intercept=intercept, intercept_scale=0.7)
    X, y, theta = _data(m=300)
    X[::17] = 0.0
    theta = theta[: loss.param_dim(X.shape[1])] * 3.0
    work = Scratch()
    Z = scratch.features(loss, X, 1.0, work)
    labels = scratch.labels(loss, y, work)
    squares, norms = scratch.feature_norms(Z, work)
    expected = scratch.clipped_gradients(loss, theta, Z, labels, bound, work, smoothing).copy()
    inside = np.linalg.norm(expected, axis=1) < bound * (1.0 - 1e-12)
    weights = scratch.clipped_weights(loss, theta, Z, labels, norms, bound, work, smoothing, squares)
    total = scratch.weighted_row_sum(weights, Z, work).copy()
    rows = scratch.weighted_rows(weights, Z, work)
    np.testing.assert_array_equal(rows[inside], expected[inside])
    np.testing.assert_allclose(rows, expected, rtol=1e-12, atol=1e-15 * bound)
    np.testing.assert_allclose(total, expected.sum(axis=0), rtol=1e-12, atol=1e-12 * bound)


def _exceeds(rows: np.ndarray, bound: float, slack: float) -> bool:
    """Whether some row's exact ℓ2 norm (rational arithmetic on its float entries) is above
    bound·(1 + slack)."""
    limit = (Fraction(bound) * (1 + Fraction(slack))) ** 2
    return any(sum(Fraction(float(v)) ** 2 for v in row) > limit for row in rows)


@pytest.mark.parametrize("name", ["logistic", "squared", "huber"])
def test_clipped_per_record_gradients_never_exceed_the_bound(name: str) -> None:
    """Adversarial rows — huge finite entries (squared norm overflowing), subnormal and zero
    rows, rows exactly at the feature bound, gradients exactly at the clip bound C, far above
    and far below it: every w_i·z_i of clipped_weights, and every row of clipped_gradients at
    strict_bound(C, p), has exact norm ≤ C (rational arithmetic, no slack): shuffle-gaussian
    calibrates its noise to sensitivity exactly C. Controls: the old clip to C itself
    (clipped_gradients at C) is caught above C on these rows, and so is a clip to C(1 + 1e-12)."""
    loss = LOSSES[name]()
    rng = np.random.default_rng(12)
    d = 5
    X = np.concatenate([
        np.full((3, d), 1e300), np.full((2, d), -1.7e308), np.array([[1e300, -1e300, 0.0, 5.0, 1e-300]]),
        np.full((2, d), 5e-324), np.zeros((3, d)), np.eye(d), -np.eye(d) * 3.0,
        rng.normal(size=(200, d)) * rng.choice([1e-8, 0.3, 1.0, 1e8], size=(200, 1)),
    ])
    y = rng.choice([-1.0, 1.0], size=X.shape[0])
    work = Scratch()
    Z = scratch.features(loss, X, 1.0, work)
    labels = scratch.labels(loss, y, work)
    squares, norms = scratch.feature_norms(Z, work)
    checked_control = old_clip_exceeds = False
    for bound in (1.0, 0.5, 0.37, 1e-3, 0.3, 0.7, 0.9):
        strict = scratch.strict_bound(bound, Z.shape[1])
        for theta in (np.zeros(d), rng.normal(size=d) * 4.0):
            if name == "squared":  # θ = 0: gradient −y·z, exactly at C = 1 for the unit rows
                labels = np.where(np.arange(X.shape[0]) % 2 == 0, 1.0, -1.0) * min(bound, 1.0)
            weights = scratch.clipped_weights(loss, theta, Z, labels, norms, bound, work)
            rows = scratch.weighted_rows(weights, Z, work)
            assert np.all(np.isfinite(rows))
            assert not _exceeds(rows, bound, 0.0)
            assert not _exceeds(weights[:, None] * Z, bound, 0.0)  # w_i times the exact z_i too
            assert not _exceeds(scratch.clipped_gradients(loss, theta, Z, labels, strict, work), bound, 0.0)
            old_clip_exceeds |= _exceeds(scratch.clipped_gradients(loss, theta, Z, labels, bound, work), bound, 0.0)
            if np.any(np.linalg.norm(loss.gradient(theta, Z, labels), axis=1) > bound * (1 + 1e-11)):
                loose = scratch.clipped_weights(loss, theta, Z, labels, norms, bound * (1 + 1e-12), work)
                assert _exceeds(scratch.weighted_rows(loose, Z, work), bound, 0.0)
                checked_control = True
    assert checked_control
    assert old_clip_exceeds


def test_logistic_clipped_weights_are_the_generic_form_bitwise() -> None:
    """clipped_weights' logistic form (σ computed in place, |φ'| = σ) gives the generic form's
    weights — C'/max(|φ'|‖z‖, C')·φ' with the loss's own _dphi — bit for bit: margins beyond
    ±709, zeros, both labels, sizes around expit's scalar size and unaligned slices. Control:
    the generic form at a bound 1e-12 off differs."""
    rng = np.random.default_rng(21)
    loss = LOSSES["logistic"]()
    work = Scratch()
    for m in (5, 6, 7, 8, 33, 64, 65, 127, 300):
        for offset in (0, 1, 3):
            Z = rng.normal(size=(m + offset, 4)) * rng.choice([0.0, 1e-3, 0.5, 1.0, 1e3], size=(m + offset, 1))
            Z = Z[offset:]
            labels = rng.choice([-1.0, 1.0], size=m + offset)[offset:]
            norms = np.linalg.norm(Z, axis=1)
            theta = rng.normal(size=4) * rng.choice([0.0, 1.0, 1e3])
            for bound in (1e-3, 0.3, 1.0, 50.0):
                strict = scratch.strict_bound(bound, 4)
                slopes = loss._dphi(Z @ theta, labels)
                expected = scratch._clip_factors(strict, np.abs(slopes) * norms) * slopes
                got = scratch.clipped_weights(loss, theta, Z, labels, norms, bound, work)
                np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
                np.testing.assert_array_equal(got, expected)
                if np.any(np.abs(slopes) * norms > strict):
                    off = scratch._clip_factors(strict * (1.0 - 1e-12), np.abs(slopes) * norms) * slopes
                    assert not np.array_equal(got, off)


def test_a_finite_row_whose_squared_norm_overflows_is_clipped_not_zeroed() -> None:
    """‖x‖² overflows for x = (1e200, …) although x is finite: the row is clipped onto the bound
    along x (and the other rows are bitwise the loss's features). Control: the textbook clip,
    ``Loss.features``, zeroes that row (a factor bound/∞)."""
    loss = LOSSES["logistic"](intercept=True)
    X = np.random.default_rng(4).normal(size=(5, 6)) * 0.3
    X[2] = np.linspace(1e200, -3e200, 6)
    Z = scratch.features(loss, X, 1.0, scratch.Scratch()).copy()
    reference = loss.features(X, 1.0)
    np.testing.assert_array_equal(np.delete(Z, 2, axis=0), np.delete(reference, 2, axis=0))
    direction = X[2] / np.abs(X[2]).max()
    direction /= np.linalg.norm(direction)
    np.testing.assert_allclose(Z[2, :6], direction, rtol=1e-12)
    assert np.linalg.norm(Z[2, :6]) <= 1.0
    assert not reference[2, :6].any()  # control: the overflowed norm zeroes the row


def test_clipping_takes_the_same_operations_whatever_the_rows(monkeypatch) -> None:
    """Timing (docs/privacy.md): clip_rows_into and the codec's clip multiply every row, whether
    or not a row is over the bound — the calls made are the same for a block with no row to clip
    and for one with a row to clip (before, the multiply was skipped when no row needed it: a
    1024 × 21 block took 26 µs instead of 37 µs). The results are still the textbook clip."""
    import numpy as np

    from panpriv.protocols import losses
    from panpriv.streamer.io import codec

    rng = np.random.default_rng(4)
    inside = rng.standard_normal((64, 21))
    inside /= np.linalg.norm(inside, axis=1, keepdims=True) * 1.1
    one_over = inside.copy()
    one_over[7] *= 5.0
    traces = []
    for X in (inside, one_over):
        calls: list[str] = []
        with monkeypatch.context() as patch:
            for module, name in ((scratch, "scale_rows"), (np, "multiply"), (np, "copyto"), (np, "divide")):
                original = getattr(module, name)

                def traced(*args, _name=name, _original=original, **kwargs):
                    calls.append(_name)
                    return _original(*args, **kwargs)

                patch.setattr(module, name, traced)
            out = scratch.clip_rows_into(X, 1.0, np.empty_like(X), np.empty(64), np.empty_like(X))
            clipped = codec._clip(X.copy(), np.linalg.norm(X, axis=1), 1.0, in_place=True, work=np.empty_like(X))
        np.testing.assert_array_equal(out, losses.clip_rows(X, 1.0))
        np.testing.assert_array_equal(clipped, losses.clip_rows(X, 1.0))
        traces.append(calls)
    assert traces[0] == traces[1]
    assert {"scale_rows", "multiply"} <= set(traces[0])
