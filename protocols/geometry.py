"""The parameter set Θ of the learners: a closed ℓ2 ball centred at the origin.

Cheu et al.'s theorems (4.1, 4.3, 4.7, 4.8, C.3) assume a closed convex Θ ⊂ R^d of diameter D; the
algorithms project onto it (Cheu et al. 2022, Alg. 3 line 4, Alg. 4 line 5 and Alg. 6 line 10, whose
``argmin_{θ∈Θ} ⟨g, θ − θ_t⟩ + (L_t/2)‖θ − θ_t‖²`` is the projection of ``θ_t − g/L_t``). Θ also fixes
the Lipschitz constant of losses whose gradient grows with ‖θ‖ (squared loss).

References
----------
Cheu, Joseph, Mao & Peng (2022), Thms 4.3, 4.7, 4.8, C.3 (closed convex Θ of diameter D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols import validation as check


@dataclass(frozen=True)
class L2Ball:
    """Θ = {θ : ‖θ‖₂ ≤ radius}.

    Parameters
    ----------
    radius
        A finite float > 0.
    """

    radius: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "radius", check.positive("L2Ball", "radius", self.radius))

    @property
    def diameter(self) -> float:
        """D = 2·radius, the largest distance between two points of Θ."""
        return 2.0 * self.radius

    def project(self, theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Euclidean projection onto Θ: ``θ·min(1, radius/‖θ‖)`` (a new array)."""
        theta = np.asarray(theta, dtype=np.float64)
        flat = theta.ravel(order="K")
        norm = math.sqrt(float(flat.dot(flat)))  # np.linalg.norm's own computation, without its dispatch
        if norm <= self.radius:
            return theta.copy()
        return theta * (self.radius / norm)

    def project_in_place(self, theta: NDArray[np.float64]) -> None:
        """:meth:`project` into ``theta`` itself (float64, contiguous): bitwise the same numbers
        (the same norm, then ``θ *= radius/‖θ‖``, the same product as ``θ·(radius/‖θ‖)``), without
        the new array; for the learners' per-round steps."""
        norm = math.sqrt(float(theta.dot(theta)))
        if norm > self.radius:
            theta *= self.radius / norm

    def contains(self, theta: NDArray[np.float64], rtol: float = 1e-12) -> bool:
        """True if ‖θ‖ ≤ radius·(1 + rtol) (the tolerance absorbs rounding of a projection)."""
        return float(np.linalg.norm(theta)) <= self.radius * (1.0 + rtol)
