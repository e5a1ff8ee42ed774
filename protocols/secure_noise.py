"""Fixed-point accumulation with exact discrete Gaussian noise: the ``noise="secure"`` option.

A learner in this mode keeps its noisy sum as an int64 vector on a public grid of step γ and adds
noise drawn exactly from the discrete Gaussian (:mod:`panpriv.protocols.discrete_gaussian`), so no noise
value ever passes through a floating-point sampler (Mironov 2012's attack surface). Values leave
the grid only by post-processing (the batch mean is ``γ · sum / b``, formed after both draws).

The public rule (depends on the configuration only, never on data):

* grid step γ = L · 2^−k with k = :data:`GRID_BITS`, L the per-record clipping bound;
* each clipped record vector g (‖g‖₂ ≤ L) enters as u = trunc(g/γ), rounded toward zero
  coordinate-wise, then checked in integers: ‖u‖₂² ≤ 4^k (clipping in floating point is exact
  only to a few ulps; a row over the bound, which needs such an ulp, is moved one unit toward
  zero per coordinate until it fits);
* hence ‖u‖₂ ≤ 2^k for every record, and replacing one record changes the integer batch sum by at
  most ‖u‖₂ + ‖u'‖₂ ≤ 2^(k+1) = Δ grid units (the triangle inequality, as for 2L in the float
  mechanism). Rounding toward zero, unlike rounding to nearest, adds no √p term to Δ; its cost is
  a bias of less than γ per coordinate toward zero in each record's contribution (a utility
  effect, ≤ √p · 2^−k · L in norm);
* each draw is N_Z(0, σ²) per coordinate with σ² the smallest integer (then rounded up to a
  multiple of the sampler's proposal scale, :func:`panpriv.protocols.discrete_gaussian.efficient_variance`)
  for which the batch sum is (ε, δ)-DP through Canonne, Kamath & Steinke 2020 Thm 14 (ρ = Δ²/(2σ²)
  zCDP) and Cor. 13 (ρ-zCDP → (ε, δ)), computed by :mod:`panpriv.accounting.discrete_gaussian`.

σ² in grid units depends only on (ε, δ) and k, not on L: the noise on the real scale is γσ = Lσ/2^k.

References
----------
Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for Differential Privacy",
arXiv:2004.00010, Algs. 1–3, Thm 14, Cor. 13.
Mironov (2012), "On significance of the least significant bits for differential privacy", CCS 2012.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.discrete_gaussian import calibrate_sigma2, rho, zcdp_epsilon
from panpriv.protocols.discrete_gaussian import UniformSource, efficient_variance, sample_discrete_gaussian

GRID_BITS = 16
"""k: the grid step is γ = L·2^−k, so a record's vector spans up to 2^k grid units. 16 bits keep the
truncation bias below 2^−16·L per coordinate, σ² (≈ (2^17·σ/Δ)²) small enough for int64 sampling,
and a batch sum within int64 for batches of up to 2^40 records."""

SENSITIVITY_UNITS = 2 ** (GRID_BITS + 1)
"""Δ: the ℓ2 sensitivity, in grid units, of a batch sum under replacement of one record."""

Noise = Literal["gaussian", "secure"]
NOISES: tuple[Noise, ...] = ("gaussian", "secure")
"""The ``noise`` options: float64 Gaussian (numpy) or the exact discrete Gaussian on a grid."""


@dataclass(frozen=True)
class DrawCalibration:
    """The discrete Gaussian of one draw for a target (ε, δ) and its accounted guarantee."""

    sigma2: int
    """σ² of each coordinate, in grid units² (sampled exactly)."""
    scale: int
    """The sampler's discrete Laplace proposal scale t (divides σ²)."""
    rho: float
    """ρ = Δ²/(2σ²): the draw's zCDP for a sum of sensitivity Δ (CKS 2020, Thm 14)."""
    epsilon: float
    """ε at the target δ implied by ρ (CKS 2020, Cor. 13); at most the target ε."""
    delta: float

    @property
    def noise_multiplier(self) -> float:
        """σ/Δ: the draw's standard deviation per unit of sensitivity (variance of N_Z is ≤ σ²)."""
        return math.sqrt(self.sigma2) / SENSITIVITY_UNITS


@functools.lru_cache(maxsize=64)
def calibrate_draw(epsilon: float, delta: float) -> DrawCalibration:
    """The draw that makes a batch sum of sensitivity :data:`SENSITIVITY_UNITS` (ε, δ)-DP."""
    sigma2, scale = efficient_variance(calibrate_sigma2(epsilon, delta, SENSITIVITY_UNITS))
    concentration = rho(sigma2, SENSITIVITY_UNITS)
    return DrawCalibration(sigma2, scale, concentration, zcdp_epsilon(concentration, delta), delta)


def grid_step(bound: float) -> float:
    """γ = L·2^−k (exact in binary floating point: a power-of-two scaling)."""
    return math.ldexp(bound, -GRID_BITS)


def to_grid(vectors: NDArray[np.float64], bound: float) -> NDArray[np.int64]:
    """Rows of ``vectors`` (each clipped to ‖·‖₂ ≤ ``bound``) as integer rows of ‖·‖₂ ≤ 2^k, exactly.

    u = trunc(v·2^k/L); rows whose integer squared norm exceeds 4^k (possible only through the
    few-ulp slack of floating-point clipping) move one unit toward zero in every nonzero
    coordinate until they fit. Deterministic: the same inputs give the same rows.
    """
    units = np.trunc(vectors * (math.ldexp(1.0, GRID_BITS) / bound)).astype(np.int64)
    limit = 4**GRID_BITS
    over = np.flatnonzero(np.einsum("ij,ij->i", units, units) > limit)
    while over.size:
        rows = units[over]
        units[over] = rows - np.sign(rows)
        over = over[np.einsum("ij,ij->i", units[over], units[over]) > limit]
    return units


_FLOAT_EXACT_COLUMNS = 2**19
_FLOAT_EXACT_ROWS = 2**36


def grid_sum(vectors: NDArray[np.float64], bound: float) -> NDArray[np.int64]:
    """``to_grid(vectors, bound).sum(axis=0)``, exactly, without forming an int64 matrix (faster).

    Why the float arithmetic here is exact: ``np.trunc`` of a double is an integer-valued double.
    A row whose float squared norm is at most 4^k has every |u_j| ≤ 2^k, so each square is an
    integer ≤ 2^(2k) and every partial sum of at most 2^19 of them is an integer below 2^53 —
    exactly representable, so each addition is exact and the comparison with 4^k is exact. A row
    with some |u_j| > 2^k has a float squared norm > 4^k (rounding is monotone), so it is sent to
    :func:`to_grid`'s integer path. Column sums of at most 2^36 integers of magnitude ≤ 2^k stay
    below 2^53, so they are exact in any order. Outside these sizes, the integer path is used.
    """
    rows, columns = vectors.shape
    if rows == 0:
        return np.zeros(columns, dtype=np.int64)
    if columns >= _FLOAT_EXACT_COLUMNS or rows >= _FLOAT_EXACT_ROWS:
        units = to_grid(vectors, bound)
        total = units.sum(axis=0)
        units.fill(0)
        return total
    units_f = vectors * (math.ldexp(1.0, GRID_BITS) / bound)
    np.trunc(units_f, out=units_f)
    squares = np.einsum("ij,ij->i", units_f, units_f)
    over = squares > 4**GRID_BITS
    squares.fill(0.0)  # per-record squared norms: clean data, wiped like the grid vectors
    if over.any():
        units_f[over] = to_grid(vectors[over], bound)
    sums = units_f.sum(axis=0)
    total = sums.astype(np.int64)
    units_f.fill(0.0)  # per-record grid vectors are clean data: do not leave them in freed memory
    sums.fill(0.0)
    return total


def draw(calibration: DrawCalibration, size: int, source: UniformSource | None) -> NDArray[np.int64]:
    """``size`` exact N_Z(0, σ²) draws (``source`` ``None``: fresh OS entropy, no state kept)."""
    return sample_discrete_gaussian(calibration.sigma2, size, source, scale=calibration.scale)


def describe(calibration: DrawCalibration) -> str:
    """The per-draw guarantee as one sentence for a privacy report."""
    return (
        f"secure noise: the batch sum is kept as int64 on a grid of step L*2^-{GRID_BITS}, each "
        f"record's clipped gradient truncated toward zero and bounded in integers to norm 2^{GRID_BITS}, "
        f"so the sum's l2 sensitivity is {SENSITIVITY_UNITS} grid units; each draw is exact discrete "
        f"Gaussian N_Z(0, {calibration.sigma2}) per coordinate (sampled from OS entropy without "
        f"floating point), i.e. rho = {calibration.rho:.6g}-zCDP for the sum (Canonne, Kamath & Steinke 2020, Thm 14), "
        f"hence (epsilon, delta) = ({calibration.epsilon:.6g}, {calibration.delta:g})-DP (ibid., Cor. 13)"
    )
