"""Local randomizers for gradient vectors: what one user applies before her message leaves her.

Both randomizers first clip the gradient to ℓ2 norm C (``clip``), so that any two inputs of one
user are within distance 2C — the sensitivity under replacement of her record — and are unbiased
for the clipped gradient. A *dummy* message (Balle et al. 2020, Alg. 1: the server's update for an empty time
slot) is the same randomizer applied to the zero vector (:meth:`dummy`), which is what the
amplification argument of :mod:`panpriv.accounting.checkin` requires.

- :class:`GaussianRandomizer`: x + N(0, (σC)² I), σ the *noise multiplier* relative to C (Liew & Takahashi 2022 §5.2's
  convention). It is (ε₀, δ₀)-DP with the exact Gaussian privacy profile for sensitivity 2C
  (Balle & Wang 2018, Thm 8); in Liew & Takahashi's normalisation (records at distance 1) its noise is σ/2.
- :class:`L2BallRandomizer`: the ℓ2-ball sampling mechanism of Duchi, Jordan & Wainwright (2018),
  a pure ε₀-DP randomizer for vectors (the "ε₀-DP randomizer" of Balle et al. 2020 Thm 3.2); the proof of ε₀ is
  in its docstring.

References
----------
Liew & Takahashi 2022, §5.2 (clip to C, add N(0, C²σ²I)); Liew & Takahashi 2022, §5.2's "σ = 0.86 corresponding to (ε₀, δ₀) =
(12, 1e-5)" (pinned in the tests: the exact profile at sensitivity 2C gives 12.06).
Duchi, Jordan & Wainwright (2018), "Minimax optimal procedures for locally private estimation",
JASA 113(521) (cited by Liew & Takahashi 2022), the ℓ2 sampling mechanism. Balle & Wang (2018), Thm 8.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln

from panpriv.accounting.gaussian import analytic_epsilon
from panpriv.accounting.ledger import Guarantee
from panpriv.protocols import validation as check
from panpriv.protocols.calibration import smallest_feasible
from panpriv.protocols.scalar_residue import scale_rows
from panpriv.protocols.scratch import clip_rows_into

Array = NDArray[np.float64]


class LocalRandomizer(Protocol):
    """What the learners need from a local randomizer."""

    @property
    def clip(self) -> float:
        """The ℓ2 bound every input row is clipped to."""

    def privatize(self, G: Array, generator: np.random.Generator) -> Array:
        """Messages for the rows of ``G`` (shape (k, p)): each row clipped to ``clip``, then randomized."""

    def dummy(self, count: int, dim: int, generator: np.random.Generator) -> Array:
        """``count`` messages of the randomizer applied to the zero vector (dummy updates)."""

    def noise_second_moment(self, dim: int) -> float:
        """v with E‖R(x) − x‖² ≤ v for every (clipped) input x in R^dim."""

    def local_guarantee(self) -> Guarantee:
        """(ε₀, δ₀): R(x) and R(x′) are (ε₀, δ₀)-indistinguishable for any two inputs."""


def gaussian_epsilon0(noise_multiplier: float, delta0: float) -> float:
    """ε₀ at δ₀ of "clip to C, add N(0, (σC)² I)": the exact Gaussian profile for noise σC and
    sensitivity 2C (the ratio is all that matters, so C drops out). Balle & Wang (2018), Thm 8."""
    return analytic_epsilon(noise_multiplier, delta0, 2.0)


@functools.lru_cache(maxsize=128)
def _gaussian_sigma(epsilon0: float, delta0: float) -> float:
    """The smallest noise multiplier σ with ``gaussian_epsilon0(σ, δ₀) <= ε₀`` (cached search)."""
    return smallest_feasible(lambda s: gaussian_epsilon0(s, delta0), epsilon0)


@dataclass(frozen=True)
class GaussianRandomizer:
    """Clip to norm C, then add N(0, (σC)² I) (Liew & Takahashi 2022 §5.2).

    Parameters
    ----------
    clip
        C > 0.
    noise_multiplier
        σ > 0: the noise standard deviation is σC per coordinate.
    delta
        δ₀ in (0, 1) at which :meth:`local_guarantee` reports ε₀.
    """

    clip: float
    noise_multiplier: float
    delta: float

    def __post_init__(self) -> None:
        owner = "GaussianRandomizer"
        object.__setattr__(self, "clip", check.positive(owner, "clip", self.clip))
        object.__setattr__(self, "noise_multiplier", check.positive(owner, "noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "delta", check.open_unit(owner, "delta", self.delta))

    @property
    def noise_std(self) -> float:
        """σC, the standard deviation of every coordinate's noise."""
        return self.noise_multiplier * self.clip

    def privatize(self, G: Array, generator: np.random.Generator) -> Array:
        """Messages clip_C(g) + N(0, (σC)² I) for the rows of ``G``: the clip as
        :func:`panpriv.protocols.losses.clip_rows` computes it (bitwise, :func:`panpriv.protocols.scratch.clip_rows_into`,
        whose norms and factors live in arrays zeroed here) and the noise added in place, its
        draw zeroed once added."""
        G = np.asarray(G, dtype=np.float64)
        messages = np.empty_like(G)
        norms, work = np.zeros(G.shape[0]), np.zeros_like(G)
        noise = generator.normal(0.0, self.noise_std, size=G.shape)
        try:
            clip_rows_into(G, self.clip, messages, norms, work)
            messages += noise
        finally:
            for array in (norms, work, noise):
                array.fill(0.0)
        return messages

    def dummy(self, count: int, dim: int, generator: np.random.Generator) -> Array:
        return generator.normal(0.0, self.noise_std, size=(count, dim))

    def noise_second_moment(self, dim: int) -> float:
        """p (σC)²: the noise is independent of x."""
        return dim * self.noise_std**2

    def local_guarantee(self) -> Guarantee:
        """Exact (ε₀, δ₀) of the Gaussian mechanism with sensitivity 2C and noise σC (any dim)."""
        return Guarantee(gaussian_epsilon0(self.noise_multiplier, self.delta), self.delta)

    @classmethod
    def calibrated(cls, clip: float, epsilon0: float, delta0: float) -> GaussianRandomizer:
        """The randomizer with the smallest σ (to 1e-6 relative, checked) that is (ε₀, δ₀)-DP."""
        return cls(clip, _gaussian_sigma(epsilon0, delta0), delta0)


@dataclass(frozen=True)
class L2BallRandomizer:
    """Duchi, Jordan & Wainwright's ℓ2-ball sampling mechanism: a pure ε₀-DP vector randomizer.

    For an input x with ‖x‖ ≤ C (after clipping) in R^p:

    1. v = +x/‖x‖ with probability 1/2 + ‖x‖/(2C), else −x/‖x‖ (for x = 0: ±u with u uniform on the
       unit sphere, each sign with probability 1/2). Then E[v] = x/C.
    2. With probability π = e^{ε₀}/(1 + e^{ε₀}) draw z uniform on the hemisphere {⟨z, v⟩ > 0} of the
       unit sphere, otherwise uniform on {⟨z, v⟩ ≤ 0}.
    3. Output B z with B = C (e^{ε₀} + 1) / ((e^{ε₀} − 1) κ_p), κ_p = Γ(p/2) / (√π Γ((p + 1)/2)).

    **ε₀-DP (proof).** Let μ be the uniform probability on the unit sphere. Given v, the output
    direction z has density 2π on {⟨z, v⟩ > 0} and 2(1 − π) elsewhere w.r.t. μ, i.e. a value in
    {2e^{ε₀}/(1 + e^{ε₀}), 2/(1 + e^{ε₀})}. Averaging over v, the density of z given x is a convex
    combination of those two values, so it lies in [2/(1 + e^{ε₀}), 2e^{ε₀}/(1 + e^{ε₀})] for every
    x and z. The ratio of the densities for any two inputs is therefore at most e^{ε₀}: the
    randomizer is ε₀-DP for *any* pair of inputs (replacement, any distance), δ₀ = 0. The dummy
    input 0 gives density 1 (z uniform), within the same band.

    **Unbiased.** For z uniform on the unit sphere, E[⟨z, e⟩ | ⟨z, e⟩ > 0] = E|z₁| = κ_p, so given v
    the mean of z is (2π − 1) κ_p v = κ_p v (e^{ε₀} − 1)/(e^{ε₀} + 1), and E[B z] = B κ_p
    (e^{ε₀} − 1)/(e^{ε₀} + 1) · x/C = x. Every output has norm B, so E‖B z − x‖² = B² − ‖x‖² ≤ B²
    (about π p C²/2 · ((e^{ε₀} + 1)/(e^{ε₀} − 1))², i.e. 2π p C²/ε₀² for small ε₀ — no log(1/δ)).

    Parameters
    ----------
    clip
        C > 0.
    epsilon0
        ε₀ > 0.

    References
    ----------
    Duchi, Jordan & Wainwright (2018), JASA 113(521), the ℓ2 sampling strategy (cited by Liew & Takahashi 2022; the
    same primitive underlies LDP-SGD, Liew & Takahashi 2022 footnote 1).
    """

    clip: float
    epsilon0: float

    def __post_init__(self) -> None:
        owner = "L2BallRandomizer"
        object.__setattr__(self, "clip", check.positive(owner, "clip", self.clip))
        object.__setattr__(self, "epsilon0", check.positive(owner, "epsilon0", self.epsilon0))

    @property
    def keep_probability(self) -> float:
        """π = e^{ε₀}/(1 + e^{ε₀}): probability of the hemisphere around v."""
        return 1.0 / (1.0 + math.exp(-self.epsilon0))

    def scale(self, dim: int) -> float:
        """B = C (e^{ε₀} + 1)/((e^{ε₀} − 1) κ_p): the norm of every output, making it unbiased."""
        return _l2_scale(self.clip, self.epsilon0, check.positive_int("L2BallRandomizer", "dim", dim))

    def privatize(self, G: Array, generator: np.random.Generator) -> Array:
        """Messages B z for the rows of ``G`` (steps 1–3 of the class docstring, vectorised).

        With a = ⟨z, x⟩ for a uniform unit z, step 1's v = s x/‖x‖ (s = ±1) lies on z's side iff
        s·a > 0 (a > 0 for s = +1, a < 0 for s = −1), and step 2 keeps z when that agrees with the
        hemisphere drawn, reflecting it otherwise. A zero row (the dummy input) gets z itself: for
        x = 0, v = ±u is uniform and so is the resulting z, whatever hemisphere is drawn. The
        output row is ±B·z, the sign chosen before the one multiplication (B·(±1) is exact), in
        place on z (:func:`panpriv.protocols.scalar_residue.scale_rows`). Every work value derived from the
        clean rows (norms, ⟨z, x⟩, sides) is computed into arrays allocated here and zeroed before
        returning: no numpy temporary is left holding them.
        """
        G = np.asarray(G, dtype=np.float64)
        k, dim = G.shape
        uniforms = generator.random((k, 2))
        z = _unit_rows(generator, k, dim)
        values = np.zeros((3, k))  # the rows' norms, ⟨z, x⟩, then the "toward" level and the signed B
        flags = np.zeros((4, k), dtype=bool)
        work = np.zeros_like(z)
        norms, along, level = values
        toward, positive, same_side, keep = flags
        try:
            np.einsum("ij,ij->i", G, G, out=norms)
            np.sqrt(norms, out=norms)
            np.einsum("ij,ij->i", z, G, out=along)
            np.minimum(norms, self.clip, out=level)
            level /= 2.0 * self.clip
            level += 0.5  # 0.5 + min(‖x‖, C)/(2C)
            np.less(uniforms[:, 0], level, out=toward)
            np.greater(along, 0.0, out=positive)
            np.less(along, 0.0, out=same_side)
            np.copyto(same_side, positive, where=toward)
            np.less(uniforms[:, 1], self.keep_probability, out=keep)
            np.equal(same_side, keep, out=keep)
            keep |= np.equal(norms, 0.0, out=positive)
            scale = _l2_scale(self.clip, self.epsilon0, dim)
            np.copyto(level, -scale)
            np.copyto(level, scale, where=keep)
            return scale_rows(z, level, work)
        except BaseException:
            z.fill(0.0)
            raise
        finally:  # work arrays tied to the clean input (norms, sides) and to the draw: wiped
            for array in (uniforms, values, flags, work):
                array.fill(0)

    def dummy(self, count: int, dim: int, generator: np.random.Generator) -> Array:
        """R(0): uniform on the sphere of radius B — :meth:`privatize` of zero rows, whose output
        is B·z whatever the hemisphere uniforms say; those are still drawn (and wiped), so the
        generator advances exactly as for ``privatize(np.zeros((count, dim)))``."""
        generator.random((count, 2)).fill(0.0)
        z = _unit_rows(generator, count, dim)
        z *= _l2_scale(self.clip, self.epsilon0, dim)
        return z

    def noise_second_moment(self, dim: int) -> float:
        """B²: E‖Bz − x‖² = B² − ‖x‖² because ‖Bz‖ = B and E[Bz] = x."""
        return self.scale(dim) ** 2

    def local_guarantee(self) -> Guarantee:
        return Guarantee(self.epsilon0, 0.0)


def _unit_rows(generator: np.random.Generator, k: int, dim: int) -> Array:
    """k points uniform on the unit sphere of R^dim (normalised Gaussians), normalised in place
    (:func:`normalise_rows`): no un-normalised copy (which would give the direction drawn) is
    left behind, and the Gaussians' lengths are zeroed after use."""
    Z = generator.standard_normal((k, dim))
    lengths, work = np.empty(k), np.empty_like(Z)
    try:
        return normalise_rows(Z, lengths, work)
    finally:
        lengths.fill(0.0)
        work.fill(0.0)


def normalise_rows(Z: Array, lengths: Array, work: Array) -> Array:
    """Each row of ``Z`` divided by its length (floored at the smallest normal double), in place.
    ``lengths`` (shape (k,)) and ``work`` (the shape of ``Z``) are the caller's buffers, left
    holding the lengths for the caller to wipe: the division goes through ``work`` because a
    broadcast ``Z /= lengths[:, None]`` would leave them in numpy's freed iteration buffer
    (:mod:`panpriv.protocols.scalar_residue`). Shared by :func:`_unit_rows` and the check-in learner's
    ℓ2 directions, so both normalise with the same operations."""
    np.einsum("ij,ij->i", Z, Z, out=lengths)
    np.sqrt(lengths, out=lengths)
    np.maximum(lengths, np.finfo(np.float64).tiny, out=lengths)
    np.copyto(work, lengths[:, None])
    Z /= work
    return Z


@functools.lru_cache(maxsize=64)
def _l2_scale(clip: float, epsilon0: float, dim: int) -> float:
    """B = C/(tanh(ε₀/2) κ_p), κ_p = E|z₁| = Γ(p/2)/(√π Γ((p + 1)/2)) for z uniform on the unit
    sphere of R^p; 1/tanh(ε₀/2) = (e^{ε₀} + 1)/(e^{ε₀} − 1)."""
    log_inverse_kappa = gammaln((dim + 1.0) / 2.0) - gammaln(dim / 2.0) + 0.5 * math.log(math.pi)
    return clip * math.exp(log_inverse_kappa) / math.tanh(epsilon0 / 2.0)
