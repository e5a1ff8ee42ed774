"""Reused, wiped work buffers for the clean per-record computations of a micro-batch.

An intruder who reads the process memory once (pan-privacy's threat model, read as "the whole
process", freed buffers included) must find no clean per-record value. Numpy expressions leave
their temporaries in freed memory (small ones in numpy's own cache, handed unchanged to the next
allocation of the same size). So the learners compute features, labels, per-record gradients,
their norms and partial sums into the buffers of a :class:`Scratch` with ``out=`` operations, and
call :meth:`Scratch.wipe` (zeros) before ``learn_many`` returns. The functions here reproduce
:meth:`panpriv.protocols.losses.Loss.features`, :meth:`~panpriv.protocols.losses.Loss.gradient`,
:meth:`~panpriv.protocols.losses.Loss.envelope_gradient` and :func:`panpriv.protocols.losses.clip_rows` operation
for operation, so results are bitwise the same and the mechanisms unchanged — except the GLM
forms :func:`clipped_gradient_sum` and :func:`clipped_weights`, which clip each gradient from its
feature row's norm (the same clip; rows inside the bound bitwise, clipped rows within a few ulps;
:func:`clipped_weights` clips to :func:`strict_bound`, so its rows' exact norms are ≤ C).

What still passes through short-lived numpy temporaries: the loss's scalar link derivative
φ'(⟨θ, z_i⟩, y_i) (one float per record, computed by the loss's ``_dphi``; the returned vector is
wiped, its internal temporaries are not) and the label validation masks. Their residue is at most a
few scalars per record of the last micro-batch, never a feature vector or a gradient.

Micro-batches are processed in blocks of at most :data:`BLOCK_ROWS` rows, so the buffers stay small
(and cheap to wipe) whatever the micro-batch size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.losses import HingeLoss, HuberLoss, LogisticLoss, Loss, SquaredLoss
from panpriv.protocols.scalar_residue import scale_rows, scrub_freed_floats
from panpriv.protocols.sigmoid import _LARGEST_EXPONENT, _SCALAR_SIZE

Array = NDArray[np.float64]

BLOCK_ROWS = 4096
"""Rows per block of a micro-batch: bounds the scratch memory (BLOCK_ROWS × p floats)."""


class Scratch:
    """Named float64 work buffers, grown on demand and reused; :meth:`wipe` zeroes all of them."""

    def __init__(self) -> None:
        self._buffers: dict[str, Array] = {}

    def take(self, name: str, *shape: int) -> Array:
        """A C-contiguous view of ``shape`` on buffer ``name`` (contents undefined). (Vectors skip
        the reshape: the round-based learners take a few per round.)"""
        size = shape[0] if len(shape) == 1 else math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < size:
            if buffer is not None:
                buffer.fill(0.0)
            buffer = np.zeros(size)
            self._buffers[name] = buffer
        return buffer[:size] if len(shape) == 1 else buffer[:size].reshape(shape)

    def wipe(self) -> None:
        """Zero every buffer (call before returning from ``learn_many``)."""
        for buffer in self._buffers.values():
            buffer.fill(0.0)


def clip_rows_into(X: Array, bound: float, out: Array, norms: Array, work: Array) -> Array:
    """:func:`panpriv.protocols.losses.clip_rows` of ``X`` into ``out`` (may be ``X`` itself), using
    ``norms`` (shape (m,)) and ``work`` (the shape of ``X``) as work space; bitwise the same
    result (:func:`_clip_factors`).

    Every factor is at most 1, and exactly 1 for a row inside the bound (x·1 = x), and every row is
    multiplied, whether or not any needs clipping: the block then takes the same operations
    whatever its values, so its duration does not tell whether a record was over the bound
    (skipping the multiply when none was made a 1024 × 21 block 26 µs instead of 37 µs, issue 32;
    ``benchmarks/memory_hygiene.py`` measures what the multiply costs). The rows are scaled through
    ``work`` (:func:`panpriv.protocols.scalar_residue.scale_rows`): ``X * norms[:, None]`` would
    leave every row's factor — its norm, for a clipped row — in numpy's freed iteration buffer.

    A finite row whose sum of squares overflows (‖x‖ above ~1.3e154) has its norm measured
    scaled (:func:`_scaled_norm`), so it is clipped onto the bound rather than zeroed by a factor
    bound/∞."""
    np.einsum("ij,ij->i", X, X, out=norms)
    np.sqrt(norms, out=norms)
    largest = np.max(norms, out=work.reshape(-1)[:1], keepdims=True)  # in scratch, not a numpy scalar
    if np.isinf(largest)[0]:  # rare: find the rows (a per-row mask only then)
        for i in np.flatnonzero(np.isinf(norms)).tolist():
            if np.isfinite(X[i]).all():
                norms[i] = _scaled_norm(X[i], work[i])
        scrub_freed_floats()  # the rare rows' norms passed through Python floats
    _clip_factors(bound, norms)
    if out is not X:
        np.copyto(out, X)
    scale_rows(out, norms, work)  # every row, clipped or not (docstring)
    return out


def _scaled_norm(row: Array, work: Array) -> float:
    """‖row‖ of a finite row whose sum of squares overflows: max|x|·‖x/max|x|‖ (``work`` holds the
    scaled row, in scratch; the Python floats made here are scrubbed by the caller)."""
    np.abs(row, out=work)
    peak = float(work.max())
    np.divide(row, peak, out=work)
    return peak * math.sqrt(float(work @ work))


def _clip_factors(bound: float, norms: Array) -> Array:
    """``min(1, bound/max(n, tiny))`` for each norm n, in place, as ``bound/max(n, bound)``.

    Bitwise the same numbers (``bound`` > 0 finite): for n > bound both divide bound by n; for
    n ≤ bound the first is ≥ 1 (division rounds monotonically, bound/bound = 1), so 1, and the
    second is bound/bound = 1; NaN stays NaN. Two operations instead of four, and no overflow of
    bound/tiny to silence (an ``errstate`` context costs more than the arithmetic on short rows).
    """
    np.maximum(norms, bound, out=norms)
    return np.divide(bound, norms, out=norms)


def strict_bound(bound: float, params: int) -> float:
    """C' = C·(1 − (p + 8)·2⁻⁵²): the bound a p-coordinate gradient is clipped to so that the
    clipped row's *exact* norm is at most C, rounding included (:func:`clipped_weights`,
    :func:`clipped_gradients`' callers that calibrate noise to sensitivity exactly C).

    Why it suffices (u = 2⁻⁵³, no underflow): the computed squared norm of a p-vector is within
    a factor (1 ± γ_p), γ_p = pu/(1 − pu), of the exact one, the square root, the product
    |s|·‖z‖, the factor C'/max(n, C'), the weight s·f and each coordinate w·z_j or g_j·f add one
    rounding (1 + u) each, so the exact norm of a clipped row is at most
    C'·(1 + u)⁴/((1 − u)²(1 − γ_p)) ≤ C'·(1 + (p + 7)u + O(p²u²)); and C' ≤ C(1 − 2(p + 8)u)(1 + u)
    (1 − (p + 8)·2⁻⁵² is exact). The product is below C for p ≪ 2⁵⁰. The old clip to C itself
    measured up to 2 ulps above C (``tests/protocols/test_scratch.py``). Rows inside C' are
    untouched (factor exactly 1); rows between C' and C and clipped rows move by (p + 8)·2⁻⁵²
    relative (6e-15 at p = 21)."""
    return bound * (1.0 - (params + 8) * 2.0**-52)


def features(loss: Loss, X: Array, feature_bound: float, scratch: Scratch) -> Array:
    """:meth:`Loss.features` of the rows ``X`` (at most :data:`BLOCK_ROWS`), in ``scratch``.

    Every elementwise operation runs on C-contiguous buffers: a ufunc writing into a strided view
    (such as the first d columns of the feature matrix) goes through numpy's iterator buffer,
    which would leave a copy of the raw rows in freed memory. So the rows are clipped in a
    contiguous buffer and then copied (a plain strided copy, no buffer) next to the intercept."""
    m, d = X.shape
    clipped = scratch.take("clipped_rows", m, d)
    np.copyto(clipped, X)
    clip_rows_into(clipped, feature_bound, clipped, scratch.take("row_norms", m), scratch.take("clip_work", m, d))
    if not loss.intercept:
        return clipped
    Z = scratch.take("features", m, d + 1)
    Z[:, :d] = clipped
    Z[:, d] = loss.intercept_scale
    return Z


def labels(loss: Loss, y: Array, scratch: Scratch) -> Array:
    """:meth:`Loss.labels` of ``y``, copied into ``scratch`` (the loss's own result is wiped)."""
    mapped = loss.labels(y)
    out = scratch.take("labels", y.shape[0])
    out[...] = mapped
    mapped.fill(0.0)
    return out


def features_with_norms(loss: Loss, X: Array, y: Array, feature_bound: float, scratch: Scratch) -> tuple[Array, Array, Array]:
    """The features (:func:`features`), labels (:func:`labels`) and feature-row norms ‖z_i‖ of
    one block of rows, all in ``scratch``: what the per-record learners (pnsgd, checkin) need to
    clip each gradient φ′·z_i from the scalar φ′ and the row's norm."""
    Z = features(loss, X, feature_bound, scratch)
    return Z, labels(loss, y, scratch), feature_norms(Z, scratch)[1]


def feature_norms(Z: Array, scratch: Scratch) -> tuple[Array, Array]:
    """‖z_i‖² and ‖z_i‖ of each feature row of a block, in ``scratch``: computed once per block,
    then sliced by every round of the block (:func:`clipped_weights`)."""
    squares = scratch.take("feature_squares", Z.shape[0])
    np.einsum("ij,ij->i", Z, Z, out=squares)
    return squares, np.sqrt(squares, out=scratch.take("feature_norms", Z.shape[0]))


def learn_in_blocks(
    loss: Loss, X: Array, y: Array, feature_bound: float, scratch: Scratch, learn_block: Callable[[Array, Array], None]
) -> None:
    """Call ``learn_block(features, labels)`` on the micro-batch ``X, y`` in blocks of at most
    :data:`BLOCK_ROWS` rows, both built in ``scratch`` (:func:`features`, :func:`labels`); the
    scratch is wiped when the micro-batch is done or fails."""
    try:
        for start in range(0, X.shape[0], BLOCK_ROWS):
            block = slice(start, start + BLOCK_ROWS)
            learn_block(features(loss, X[block], feature_bound, scratch), labels(loss, y[block], scratch))
    finally:
        scratch.wipe()


def clipped_gradients(
    loss: Loss, theta: Array, Z: Array, y: Array, bound: float, scratch: Scratch, smoothing: float | None = None
) -> Array:
    """Per-record gradients at ``theta`` — of the loss, or of its ``smoothing``-Moreau envelope —
    each clipped to norm ``bound``, in ``scratch``: shape (m, p). Bitwise equal to
    ``clip_rows(loss.gradient(theta, Z, y), bound)`` (or ``loss.envelope_gradient``)."""
    m, p = Z.shape
    margins = scratch.take("margins", m)
    np.matmul(Z, theta, out=margins)
    if smoothing is None:
        slopes = loss._dphi(margins, y)
    else:
        kappa = scratch.take("kappa", m)
        np.einsum("ij,ij->i", Z, Z, out=kappa)
        kappa /= smoothing
        slopes = loss._envelope_dphi(margins, y, kappa)
    G = weighted_rows(slopes, Z, scratch)  # the products s_i·z_ij
    slopes.fill(0.0)
    return clip_rows_into(G, bound, G, scratch.take("gradient_norms", m), scratch.take("clip_work", m, p))


def clipped_weights(
    loss: Loss,
    theta: Array,
    Z: Array,
    y: Array,
    norms: Array,
    bound: float,
    scratch: Scratch,
    smoothing: float | None = None,
    squares: Array | None = None,
    buffers: tuple[Array, Array] | None = None,
) -> Array:
    """w (shape (m,), in ``scratch``) with w_i·z_i the gradient of record i at ``theta`` (of the
    loss, or of its ``smoothing``-Moreau envelope) clipped to norm ``bound``: the rows of
    :func:`clipped_gradients` as scalars times the feature rows, from the block's ‖z_i‖
    (``norms``, :func:`feature_norms`; with ``smoothing`` also their ``squares``, for κ)
    instead of a pass over the gradient matrix per round.

    Why it is the same clip: every loss here is a GLM, so the gradient (and the Moreau envelope's,
    Cheu et al. 2022, Lemma 4.6) is g_i = s_i·z_i with ‖g_i‖ = |s_i|·‖z_i‖, and its clip to C is
    g_i·min(1, C/‖g_i‖) = (s_i·min(1, C/(|s_i|‖z_i‖)))·z_i. The factor is :func:`_clip_factors`',
    C'/max(|s_i|‖z_i‖, C') at C' = :func:`strict_bound` (C, p): exactly 1 for a gradient at or
    inside C' (zero rows included), so only rows at or above C' differ from
    :func:`clipped_gradients` at C — by (p + 8)·2⁻⁵² relative plus the order in which the same
    products are rounded. Each w_i·z_i (and w_i times the exact z_i) has exact norm ≤ C, rounding
    included (:func:`strict_bound`; ``tests/protocols/test_scratch.py`` checks it in rational
    arithmetic on adversarial rows). The loss's φ' vector is wiped as in :func:`clipped_gradients`.

    ``buffers``: the m-vectors for ⟨θ, z_i⟩ and w, when the caller has taken them from ``scratch``
    already (:meth:`Scratch.take` of ``"margins"`` and ``"gradient_weights"``, sliced to m): a
    learner stepping every few dozen records takes them once per block instead of once per round.
    """
    m = Z.shape[0]
    margins, weights = (scratch.take("margins", m), scratch.take("gradient_weights", m)) if buffers is None else buffers
    Z.dot(theta, margins)  # cblas_dgemv, as np.matmul here (bitwise), at half its dispatch cost
    if smoothing is None and m > _SCALAR_SIZE and type(loss) is LogisticLoss:
        return _logistic_clipped_weights(margins, y, norms, strict_bound(bound, Z.shape[1]), weights)
    if smoothing is None:
        slopes = loss._dphi(margins, y)
    else:
        if squares is None:
            raise ValueError("clipped_weights: smoothing needs the rows' squared norms")
        kappa = np.divide(squares, smoothing, out=scratch.take("kappa", m))
        slopes = loss._envelope_dphi(margins, y, kappa)
    np.abs(slopes, out=weights)  # |s_i|·‖z_i‖, then the factor, then w_i
    weights *= norms
    _clip_factors(strict_bound(bound, Z.shape[1]), weights)
    weights *= slopes
    slopes.fill(0.0)
    return weights


def _logistic_clipped_weights(margins: Array, y: Array, norms: Array, bound: float, weights: Array) -> Array:
    """:func:`clipped_weights` of the logistic loss (labels ±1, more than the scalar size of
    :func:`panpriv.protocols.sigmoid.expit`), bit for bit, in 10 ufunc calls instead of 15 and without
    the loss's temporary, into ``weights``. ``margins`` (⟨θ, z_i⟩, in scratch) is overwritten
    with σ(−y_i s_i).

    The same numbers: :meth:`LogisticLoss._dphi` computes s' = −(y·σ(−(y·s))) with
    :func:`~panpriv.protocols.sigmoid.expit`, σ(t) = 1/(1 + exp(min(−t, 709))); here −t = −(−(y·s)) = y·s
    exactly, so σ is the same array. As |y| = 1, |s'| = σ exactly (a product by ±1 is exact), so
    |s'|·‖z‖ = σ·‖z‖, and f·s' = f·(∓σ) = ((−f)·σ)·y bit for bit (sign changes are exact)."""
    largest_exponent, one = _LOGISTIC_CONSTANTS
    bound_array, minus_bound = _constant_pair(bound)
    sigma = np.multiply(y, margins, margins)  # outs positionally: the keyword costs a parse per call
    np.minimum(sigma, largest_exponent, out=sigma)  # (numpy 2.4 deprecates a positional out here)
    np.exp(sigma, sigma)
    np.add(sigma, one, sigma)
    np.reciprocal(sigma, sigma)
    np.multiply(sigma, norms, weights)
    np.maximum(weights, bound_array, out=weights)  # _clip_factors, negated: −C'/m is exactly −(C'/m)
    np.divide(minus_bound, weights, weights)
    weights *= sigma
    weights *= y
    return weights


def _read_only(value: float) -> Array:
    """``value`` as a read-only 0-d float64 array. A ufunc takes it as the same double as the
    Python float (NEP 50: a Python float operand is a float64 here), bit for bit, without the
    ~0.2 µs it spends converting a Python scalar per call — about 5 % of a 64-record round."""
    array = np.array(value, dtype=np.float64)
    array.flags.writeable = False
    return array


_LOGISTIC_CONSTANTS = (_read_only(_LARGEST_EXPONENT), _read_only(1.0))


@functools.lru_cache(maxsize=64)
def _constant_pair(bound: float) -> tuple[Array, Array]:
    """(C', −C') as read-only 0-d arrays (:func:`_read_only`), cached per bound: a learner's
    rounds all clip to the same public C'."""
    return _read_only(bound), _read_only(-bound)


def weighted_rows(weights: Array, Z: Array, scratch: Scratch) -> Array:
    """The rows w_i·z_i (shape (m, p), in ``scratch``): the clipped gradients of
    :func:`clipped_weights` as a matrix, for an encoder that needs each user's vector. Formed as
    the weights copied across each row, then times Z (the same products): ``weights[:, None] * Z``
    would leave the weights in numpy's freed iteration buffer (:mod:`panpriv.protocols.scalar_residue`)."""
    rows = scratch.take("gradients", *Z.shape)
    np.copyto(rows, weights[:, None])
    rows *= Z
    return rows


def weighted_row_sum(weights: Array, Z: Array, scratch: Scratch, out: Array | None = None) -> Array:
    """Σ_i w_i·z_i = Zᵀw (shape (p,), in ``scratch``, or in ``out``: the caller's view of its
    ``"row_sum"`` buffer): the sum of the clipped gradients of :func:`clipped_weights` in one
    matrix-vector product, without forming them (the same sum as :func:`row_sum` of
    :func:`weighted_rows` up to the order of the additions)."""
    return weights.dot(Z, scratch.take("row_sum", Z.shape[1]) if out is None else out)  # dgemv, as np.matmul


def clipped_gradient_sum(
    loss: Loss,
    theta: Array,
    X: Array,
    y: Array,
    feature_bound: float,
    bound: float,
    scratch: Scratch,
    smoothing: float | None = None,
    row_squares: Array | None = None,
) -> Array:
    """Σ_i of the per-record gradients at ``theta`` of the rows ``X`` (raw, C-contiguous), each
    clipped to norm ``bound``: shape (p,), in ``scratch``. The same sum as
    ``row_sum(clipped_gradients(loss, theta, features(loss, X, …), y, bound, …))`` up to
    floating-point rounding, without forming the feature or the gradient matrix.

    Why it is the same mechanism: every loss here is a GLM, ℓ(θ; z, y) = φ(⟨θ, z⟩, y), so the
    gradient (and the Moreau envelope's, Cheu et al. 2022, Lemma 4.6) is a scalar times z,
    g_i = s_i·z_i, with ‖g_i‖ = |s_i|·‖z_i‖. The feature clip is z_i = f_i·x_i (plus the intercept
    c), f_i = min(1, R/‖x_i‖), so ‖z_i‖² = f_i²‖x_i‖² + c² and ⟨θ, z_i⟩ = f_i⟨θ_x, x_i⟩ + c·θ_c
    come from one pass over X each; the clipped gradient is w_i·z_i with
    w_i = s_i·min(1, L/(|s_i|‖z_i‖)), and the sum is (Xᵀ(w∘f), c·Σw): one more pass (BLAS).
    Each record's contribution has norm |w_i|·‖z_i‖ ≤ L up to rounding, which the learners'
    sensitivity slack covers (:data:`panpriv.protocols.pan_acsa.SENSITIVITY_SLACK`).

    ``y`` are the loss's labels (:func:`labels`). Only m-vectors and the p-vector sum are
    written, all in ``scratch``; the loss's φ' vector is wiped as in :func:`clipped_gradients`.
    ``row_squares``: the rows' ‖x_i‖² when the caller has them (:func:`panpriv.protocols.base.check_batch`
    computes them while it validates X), which saves a pass over X.
    """
    m, d = X.shape
    intercept = loss.intercept_scale if loss.intercept else 0.0
    squares = scratch.take("row_squares", m)  # ‖x_i‖², then ‖z_i‖²
    if row_squares is None:
        np.einsum("ij,ij->i", X, X, out=squares)
    else:
        np.copyto(squares, row_squares)
    scale = scratch.take("feature_scale", m)  # f_i, as clip_rows_into computes it
    np.sqrt(squares, out=scale)
    overflowed = np.flatnonzero(~np.isfinite(scale))  # finite rows whose ‖x‖² overflows (rare)
    norms = [_scaled_norm(X[i], scratch.take("overflowed_row", d)) for i in overflowed.tolist()]
    scale[overflowed] = norms
    _clip_factors(feature_bound, scale)
    squares *= scale
    squares *= scale
    margins = scratch.take("margins", m)
    np.matmul(X, theta[:d], out=margins)
    margins *= scale
    for i, norm in zip(overflowed.tolist(), norms, strict=True):  # from the clipped row itself
        clipped = np.multiply(X[i], scale[i], out=scratch.take("overflowed_row", d))
        margins[i] = float(clipped @ theta[:d])
        squares[i] = (scale[i] * norm) ** 2
    squares += intercept * intercept
    if loss.intercept:
        margins += intercept * theta[d]
    if smoothing is None:
        slopes = loss._dphi(margins, y)
    else:
        kappa = scratch.take("kappa", m)
        np.divide(squares, smoothing, out=kappa)
        slopes = loss._envelope_dphi(margins, y, kappa)
    weights = scratch.take("gradient_weights", m)  # min(1, L/‖g_i‖), then w_i
    np.sqrt(squares, out=weights)
    np.multiply(weights, np.abs(slopes, out=margins), out=weights)  # margins is free again
    _clip_factors(bound, weights)
    weights *= slopes
    slopes.fill(0.0)
    total = scratch.take("row_sum", loss.param_dim(d))
    if loss.intercept:
        total[d] = intercept * float(np.sum(weights))
    weights *= scale
    np.matmul(weights, X, out=total[:d])
    return total


def scalar_dphi(loss: Loss) -> Callable[[float, float], float] | None:
    """φ′(s, y) on Python floats (the array ``_dphi`` of :mod:`panpriv.protocols.losses`, within a few
    ulps: logistic −y·σ(−ys) through a stable σ, squared s − y, Huber s − y clipped to [−h, h],
    hinge −y where ys < 1 else 0); ``None`` for any other loss, whose callers keep the array form.
    For the per-record loops (pnsgd, checkin): a numpy call on a one-element array costs
    microseconds. The value is one clean scalar per record, like the array form's."""
    if type(loss) is LogisticLoss:
        return _logistic_dphi
    if type(loss) is SquaredLoss:
        return _squared_dphi
    if type(loss) is HuberLoss:
        bound = loss.delta
        return lambda s, y: min(max(s - y, -bound), bound)
    if type(loss) is HingeLoss:
        return _hinge_dphi
    return None


def _logistic_dphi(s: float, y: float) -> float:
    t = -(y * s)
    if t >= 0.0:
        return -(y * (1.0 / (1.0 + math.exp(-t))))
    e = math.exp(t)
    return -(y * (e / (1.0 + e)))


def _squared_dphi(s: float, y: float) -> float:
    return s - y


def _hinge_dphi(s: float, y: float) -> float:
    return -y if y * s < 1.0 else 0.0


def rows(Z: Array, indices: NDArray[np.int64], scratch: Scratch, name: str) -> Array:
    """``Z[indices]`` into scratch buffer ``name`` (``take`` with ``mode="clip"`` writes
    straight into ``out``; with the default mode it would buffer a copy)."""
    out = scratch.take(name, indices.size, *Z.shape[1:])
    return Z.take(indices, axis=0, out=out, mode="clip")


def row_sum(G: Array, scratch: Scratch) -> Array:
    """``G.sum(axis=0)`` into ``scratch`` (the clean partial sum, wiped with the rest)."""
    out = scratch.take("row_sum", G.shape[1])
    np.sum(G, axis=0, out=out)
    return out
