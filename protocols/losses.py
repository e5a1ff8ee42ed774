"""Convex losses of linear models, with the constants the privacy and utility proofs need.

Every loss here is ``ℓ(θ; x, y) = φ(⟨θ, z⟩, y) + (λ/2)‖θ‖²`` where ``z`` is the record's feature
vector after two public, record-by-record transformations:

1. **clipping**: ``x`` is scaled to norm at most ``R`` (the declared ``feature_bound``) — so the
   Lipschitz constant ``L`` holds for *any* input, and the sensitivity of a gradient sum is a
   proven bound rather than an assumption on the data;
2. **intercept** (optional): a constant feature ``c`` (``intercept_scale``) is appended, and it is
   counted in the norm bound: ``‖z‖ ≤ R_z = √(R² + c²)``.

The data term ``φ`` is what a record contributes; the ridge term ``(λ/2)‖θ‖²`` (λ-strong convexity)
is data-independent, so :meth:`Loss.gradient` returns only the data term's gradient ``φ'(s, y) z``
and learners add ``λθ`` once per step (:meth:`Loss.ridge_gradient`). The ridge applies to every
coordinate, the intercept included — otherwise the objective is not λ-strongly convex.

Constants, for ``‖z‖ ≤ R_z`` and parameters in the ℓ2 ball of radius ``r``:

============  ====================================  ==========  ===========  ===========
loss          φ(s, y)                               L (data)    β (data)     prox
============  ====================================  ==========  ===========  ===========
logistic      log(1 + e^{−ys}), y ∈ {−1, +1}        R_z         R_z²/4       none closed
squared       (s − y)²/2, |y| ≤ Y (clipped)         (rR_z+Y)R_z R_z²         yes
hinge         max(0, 1 − ys), y ∈ {−1, +1}          R_z         ∞            yes
absolute      |s − y|                               R_z         ∞            yes
huber (h)     r²/2 if |r| ≤ h, h(|r| − h/2) else    h R_z       R_z²         yes
============  ====================================  ==========  ===========  ===========

Binary labels may be given as 0/1 or −1/+1 (0 is mapped to −1). The prox is the per-record
proximal operator used for Moreau smoothing (Cheu et al. 2022, Def. 4.5 and Lemma 4.6): for a linear model it
reduces to a scalar equation ``c ∈ ∂φ(s − cκ, y)`` with ``κ = ‖z‖²/β``, and the gradient of the
envelope is ``c z`` (see :meth:`Loss.envelope_gradient`).

Every loss is rebuilt from a JSON-ready dict: ``loss_from_config(loss.config()) == loss``.

References
----------
Cheu, Joseph, Mao & Peng (2022), Def. 4.5 and Lemma 4.6 (Moreau envelope, Nesterov 2005), and the
L-Lipschitz / β-smooth assumptions of Thms 4.3, 4.7, 4.8 and C.3.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols import validation as check
from panpriv.protocols.defaults import DEFAULT_LOSS
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.sigmoid import expit

Array = NDArray[np.float64]


def clip_rows(X: Array, bound: float) -> Array:
    """Rows of ``X`` scaled to ℓ2 norm at most ``bound`` (a new array; ``X`` is not changed).

    Rows already inside the ball are returned unchanged; a row outside is multiplied by
    ``bound/‖row‖``, the ℓ2 projection onto the ball. The norms are one ``einsum`` pass (several
    times faster than ``np.linalg.norm``, which squares into a temporary first; the two may differ
    in the last bit, which the learners' sensitivity slack covers).
    """
    X = np.asarray(X, dtype=np.float64)
    norms = np.sqrt(np.einsum("...i,...i->...", X, X))[..., None]
    with np.errstate(over="ignore"):  # bound/tiny may overflow to inf: the minimum makes it 1
        scale = np.minimum(1.0, bound / np.maximum(norms, np.finfo(np.float64).tiny))
    return X * scale


def _nonzero(kappa: Array) -> None:
    """κ ← 1 where κ ≤ 0, in place (κ = ‖z‖²/β is 0 only for z = 0, where c·z = 0 whatever c)."""
    zero = np.less_equal(kappa, 0.0)
    np.copyto(kappa, 1.0, where=zero)
    zero.fill(False)


class Loss(abc.ABC):
    """A convex loss of a linear model, ``φ(⟨θ, z⟩, y) + (λ/2)‖θ‖²`` (see the module docstring).

    Parameters
    ----------
    ridge
        λ ≥ 0, the weight of the ridge term (λ/2)‖θ‖²; the loss is then λ-strongly convex.
    intercept
        Append the constant feature ``intercept_scale`` to every record.
    intercept_scale
        The constant c > 0 appended; it counts in the norm bound, ``R_z = √(R² + c²)``.
    """

    name: ClassVar[str]
    binary_labels: ClassVar[bool]
    smooth: ClassVar[bool]
    has_prox: ClassVar[bool]

    def __init__(self, *, ridge: float = 0.0, intercept: bool = False, intercept_scale: float = 1.0):
        owner = type(self).__name__
        self.ridge = check.nonnegative(owner, "ridge", ridge)
        self.intercept = check.boolean(owner, "intercept", intercept)
        self.intercept_scale = check.positive(owner, "intercept_scale", intercept_scale)

    # -- the scalar link φ and its constants (per loss) --------------------------------------

    @abc.abstractmethod
    def _phi(self, s: Array, y: Array) -> Array:
        """φ(s, y), elementwise."""

    @abc.abstractmethod
    def _dphi(self, s: Array, y: Array) -> Array:
        """A (sub)derivative ∂φ/∂s, elementwise.

        Implementations allocate only their result and work in it in place (no other temporary
        holding a function of the records is left in freed memory; :mod:`panpriv.protocols.scratch`)."""

    @abc.abstractmethod
    def _dphi_bound(self, norm_bound: float, radius: float) -> float:
        """sup |∂φ/∂s| over labels and over |s| ≤ radius·norm_bound."""

    def _curvature(self) -> float:
        """sup ∂²φ/∂s² (β = curvature·R_z²); ``inf`` for a non-smooth φ."""
        return math.inf

    def _envelope_dphi(self, s: Array, y: Array, kappa: Array) -> Array:
        """The c solving c ∈ ∂φ(s − cκ, y): derivative of the scalar Moreau envelope. ``kappa`` is
        work space (it may be overwritten); only the result is allocated."""
        raise InvalidInputError(
            f"{type(self).__name__} has no closed-form proximal operator; Moreau smoothing "
            "(Cheu et al. 2022, Lemma 4.6) is available for squared, hinge, absolute and huber"
        )

    def _extra_config(self) -> dict[str, Any]:
        """Loss-specific constructor arguments."""
        return {}

    # -- records -------------------------------------------------------------------------------

    def param_dim(self, dim: int) -> int:
        """Number of parameters for ``dim`` raw features (one more with an intercept)."""
        return dim + int(self.intercept)

    def norm_bound(self, feature_bound: float) -> float:
        """R_z: the bound on ‖z‖ after clipping to ``feature_bound`` and appending the intercept."""
        if self.intercept:
            return math.hypot(feature_bound, self.intercept_scale)
        return float(feature_bound)

    def features(self, X: Array, feature_bound: float) -> Array:
        """The model's feature vectors ``z``: rows of ``X`` clipped to ``feature_bound``, plus the
        intercept column when enabled. Shape (m, param_dim(dim)); ``X`` is not changed."""
        Z = clip_rows(X, feature_bound)
        if self.intercept:
            Z = np.hstack([Z, np.full((Z.shape[0], 1), self.intercept_scale)])
        return Z

    def labels(self, y: Array) -> Array:
        """Labels as the loss uses them (binary losses: 0/1 or ±1 mapped to ±1)."""
        y = np.asarray(y, dtype=np.float64)
        if not self.binary_labels:
            return y.copy()
        valid = (y == 1.0) | (y == 0.0) | (y == -1.0)
        if not np.all(valid):
            bad = y[~valid][:3].tolist()
            raise InvalidInputError(
                f"{type(self).__name__}: labels must be 0/1 or -1/+1; got values such as {bad}"
            )
        return np.where(y == 1.0, 1.0, -1.0)

    # -- values and gradients of the data term, per record ---------------------------------------

    def value(self, theta: Array, Z: Array, y: Array) -> Array:
        """φ(⟨θ, z_i⟩, y_i) for each record: shape (m,). ``Z``/``y`` from features/labels."""
        return self._phi(Z @ theta, y)

    def objective(self, theta: Array, Z: Array, y: Array) -> float:
        """Mean data loss over the records plus the ridge term (λ/2)‖θ‖²."""
        return float(np.mean(self.value(theta, Z, y)) + 0.5 * self.ridge * (theta @ theta))

    def gradient(self, theta: Array, Z: Array, y: Array) -> Array:
        """∇_θ φ(⟨θ, z_i⟩, y_i) = φ'(s_i, y_i) z_i for each record: shape (m, p).

        For hinge and absolute, a subgradient (φ' = 0 at the kink of the absolute loss and of the
        hinge). Excludes the ridge term (see :meth:`ridge_gradient`).
        """
        return self._dphi(Z @ theta, y)[:, None] * Z

    def envelope_gradient(self, theta: Array, Z: Array, y: Array, beta: float) -> Array:
        """Gradient of each record's β-Moreau envelope, ``β(θ − prox_{φ_i/β}(θ))``: shape (m, p).

        For ``φ_i(θ) = φ(⟨θ, z_i⟩, y_i)`` the prox is ``θ − (c/β) z_i`` with ``c`` solving
        ``c ∈ ∂φ(s − cκ)``, ``s = ⟨θ, z_i⟩``, ``κ = ‖z_i‖²/β``, so the envelope gradient is
        ``c z_i``. Since ``c`` is a subgradient of φ at the prox point, ``|c| ≤ sup|φ'|``: the
        envelope is as Lipschitz as the loss, and β-smooth (Cheu et al. 2022, Lemma 4.6, items 1–2).

        Notes
        -----
        Cheu et al. 2022, Def. 4.5 takes the minimum over θ′ ∈ Θ; here it is over all of R^p, the classical
        Moreau envelope (Nesterov 2005), because that one has the closed form. Lemma 4.6's three
        properties hold for it unchanged (and with Lipschitz constant L instead of 2L).
        """
        beta = check.positive(type(self).__name__, "beta", beta)
        s = Z @ theta
        kappa = np.einsum("ij,ij->i", Z, Z) / beta
        return self._envelope_dphi(s, y, kappa)[:, None] * Z

    def prox(self, theta: Array, Z: Array, y: Array, beta: float) -> Array:
        """prox_{φ_i/β}(θ) = argmin_u φ_i(u) + (β/2)‖u − θ‖² for each record: shape (m, p)."""
        return theta[None, :] - self.envelope_gradient(theta, Z, y, beta) / beta

    def ridge_gradient(self, theta: Array) -> Array:
        """Gradient λθ of the ridge term."""
        return self.ridge * np.asarray(theta, dtype=np.float64)

    # -- constants ---------------------------------------------------------------------------

    def lipschitz(self, feature_bound: float, radius: float) -> float:
        """L: a bound on ‖∇_θ φ(⟨θ, z⟩, y)‖ for every record and every ‖θ‖ ≤ ``radius``.

        Excludes the ridge term, which is the same for every record and so never enters a
        sensitivity; the whole objective is (L + λ·radius)-Lipschitz on the ball.
        """
        R_z = self.norm_bound(feature_bound)
        return self._dphi_bound(R_z, radius) * R_z

    def smoothness(self, feature_bound: float) -> float:
        """β of the data term (``inf`` if it is not smooth); the objective is (β + λ)-smooth."""
        return self._curvature() * self.norm_bound(feature_bound) ** 2

    # -- predictions ---------------------------------------------------------------------------

    def predict(self, theta: Array, Z: Array) -> Array:
        """Predictions for feature vectors ``Z``: the linear score ⟨θ, z⟩ unless overridden."""
        return Z @ theta

    # -- configuration ------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """JSON-ready constructor arguments, with the loss ``name``; see :func:`loss_from_config`."""
        return {
            "name": self.name,
            "ridge": self.ridge,
            "intercept": self.intercept,
            "intercept_scale": self.intercept_scale,
            **self._extra_config(),
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Loss) and self.config() == other.config()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.config().items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")
        return f"{type(self).__name__}({args})"


class LogisticLoss(Loss):
    """Logistic loss log(1 + e^{−ys}); labels 0/1 or ±1. ``predict`` gives P(y = 1) = σ(s)."""

    name = "logistic"
    binary_labels = True
    smooth = True
    has_prox = False

    def _phi(self, s: Array, y: Array) -> Array:
        return np.logaddexp(0.0, -y * s)

    def _dphi(self, s: Array, y: Array) -> Array:
        out = np.multiply(y, s)  # -(y·s) is exactly (-y)·s, and -(y·e) exactly (-y)·e
        np.negative(out, out=out)
        expit(out, out=out)
        np.multiply(y, out, out=out)
        return np.negative(out, out=out)

    def _dphi_bound(self, norm_bound: float, radius: float) -> float:
        return 1.0

    def _curvature(self) -> float:
        return 0.25

    def predict(self, theta: Array, Z: Array) -> Array:
        """P(y = 1 | z) = σ(⟨θ, z⟩)."""
        return expit(Z @ theta)


class SquaredLoss(Loss):
    """Squared loss (s − y)²/2 with labels clipped to [−label_bound, label_bound].

    The clipping makes L = (radius·R_z + label_bound)·R_z hold for any input.
    ``predict`` gives the regression value ⟨θ, z⟩.
    """

    name = "squared"
    binary_labels = False
    smooth = True
    has_prox = True

    def __init__(
        self,
        *,
        label_bound: float = 1.0,
        ridge: float = 0.0,
        intercept: bool = False,
        intercept_scale: float = 1.0,
    ):
        super().__init__(ridge=ridge, intercept=intercept, intercept_scale=intercept_scale)
        self.label_bound = check.positive(type(self).__name__, "label_bound", label_bound)

    def labels(self, y: Array) -> Array:
        return np.clip(np.asarray(y, dtype=np.float64), -self.label_bound, self.label_bound)

    def _phi(self, s: Array, y: Array) -> Array:
        return 0.5 * (s - y) ** 2

    def _dphi(self, s: Array, y: Array) -> Array:
        return s - y

    def _dphi_bound(self, norm_bound: float, radius: float) -> float:
        return radius * norm_bound + self.label_bound

    def _curvature(self) -> float:
        return 1.0

    def _envelope_dphi(self, s: Array, y: Array, kappa: Array) -> Array:
        # c = s − cκ − y  ⇒  c = (s − y)/(1 + κ)
        out = np.subtract(s, y)
        np.add(kappa, 1.0, out=kappa)
        return np.divide(out, kappa, out=out)

    def _extra_config(self) -> dict[str, Any]:
        return {"label_bound": self.label_bound}


class HingeLoss(Loss):
    """Hinge loss max(0, 1 − ys); labels 0/1 or ±1. Not smooth.

    ``predict`` gives the linear score ⟨θ, z⟩ (the class is its sign; the score ranks for AUC).
    """

    name = "hinge"
    binary_labels = True
    smooth = False
    has_prox = True

    def _phi(self, s: Array, y: Array) -> Array:
        return np.maximum(0.0, 1.0 - y * s)

    def _dphi(self, s: Array, y: Array) -> Array:
        out = np.multiply(y, s)
        active = np.less(out, 1.0)
        np.negative(y, out=out)
        np.logical_not(active, out=active)
        np.copyto(out, 0.0, where=active)
        active.fill(False)
        return out

    def _dphi_bound(self, norm_bound: float, radius: float) -> float:
        return 1.0

    def _envelope_dphi(self, s: Array, y: Array, kappa: Array) -> Array:
        # In t = ys: h(t) = max(0, 1 − t); c_t ∈ ∂h(t − c_t κ) gives c_t = clip((t − 1)/κ, −1, 0)
        # (κ = 0 only for z = 0, where the gradient c z is 0 whatever c is).
        _nonzero(kappa)
        out = np.multiply(y, s)
        out -= 1.0
        out /= kappa
        np.clip(out, -1.0, 0.0, out=out)
        return np.multiply(out, y, out=out)


class AbsoluteLoss(Loss):
    """Absolute loss |s − y| (median regression). Not smooth. ``predict`` gives ⟨θ, z⟩."""

    name = "absolute"
    binary_labels = False
    smooth = False
    has_prox = True

    def _phi(self, s: Array, y: Array) -> Array:
        return np.abs(s - y)

    def _dphi(self, s: Array, y: Array) -> Array:
        out = np.subtract(s, y)
        return np.sign(out, out=out)

    def _dphi_bound(self, norm_bound: float, radius: float) -> float:
        return 1.0

    def _envelope_dphi(self, s: Array, y: Array, kappa: Array) -> Array:
        # c ∈ sign(s − y − cκ)  ⇒  c = clip((s − y)/κ, −1, 1)
        _nonzero(kappa)
        out = np.subtract(s, y)
        out /= kappa
        return np.clip(out, -1.0, 1.0, out=out)


class HuberLoss(Loss):
    """Huber loss with threshold h: r²/2 for |r| ≤ h, h(|r| − h/2) beyond (r = s − y).

    Smooth (β = R_z²) and L = h·R_z whatever the labels. ``predict`` gives ⟨θ, z⟩.
    """

    name = "huber"
    binary_labels = False
    smooth = True
    has_prox = True

    def __init__(
        self,
        *,
        delta: float = 1.0,
        ridge: float = 0.0,
        intercept: bool = False,
        intercept_scale: float = 1.0,
    ):
        super().__init__(ridge=ridge, intercept=intercept, intercept_scale=intercept_scale)
        self.delta = check.positive(type(self).__name__, "delta", delta)

    def _phi(self, s: Array, y: Array) -> Array:
        r = np.abs(s - y)
        return np.where(r <= self.delta, 0.5 * r**2, self.delta * (r - 0.5 * self.delta))

    def _dphi(self, s: Array, y: Array) -> Array:
        out = np.subtract(s, y)
        return np.clip(out, -self.delta, self.delta, out=out)

    def _dphi_bound(self, norm_bound: float, radius: float) -> float:
        return self.delta

    def _curvature(self) -> float:
        return 1.0

    def _envelope_dphi(self, s: Array, y: Array, kappa: Array) -> Array:
        # Inside the quadratic zone c = r/(1 + κ); the clip covers the linear zone.
        out = np.subtract(s, y)
        np.add(kappa, 1.0, out=kappa)
        out /= kappa
        return np.clip(out, -self.delta, self.delta, out=out)

    def _extra_config(self) -> dict[str, Any]:
        return {"delta": self.delta}


LOSSES: dict[str, type[Loss]] = {
    cls.name: cls for cls in (LogisticLoss, SquaredLoss, HingeLoss, AbsoluteLoss, HuberLoss)
}
"""The losses by name, as written in configurations."""


def loss_from_config(config: Mapping[str, Any]) -> Loss:
    """Rebuild a loss from :meth:`Loss.config` output (unknown keys are an error, not ignored)."""
    if not isinstance(config, Mapping) or config.get("name") not in LOSSES:
        name = config.get("name") if isinstance(config, Mapping) else config
        raise InvalidInputError(
            f"The 'name' entry of a loss config must be one of {sorted(LOSSES)}. Got {name!r} instead."
        )
    arguments = {k: v for k, v in config.items() if k != "name"}
    try:
        return LOSSES[config["name"]](**arguments)
    except TypeError as exc:  # an unknown or misspelt argument
        raise InvalidInputError(f"invalid loss config {dict(config)!r}: {exc}") from None


def learner_loss(loss: Loss | Mapping[str, Any] | str, owner: str) -> Loss:
    """The loss a learner's constructor means by its ``loss`` argument: the learners' defaults.

    A :class:`Loss` object is taken as it is (every option explicit). A loss *name* or a config
    dict is completed with the learners' defaults first: an intercept unless the dict says
    ``"intercept": False``, and the :data:`DEFAULT_LOSS` when the dict names no loss (so
    ``{"intercept": False}`` is the logistic loss without one). ``loss="logistic"`` is therefore
    the model ``panpriv run`` learns by default: a linear model cannot put the decision boundary
    anywhere but through the origin without an intercept, and on imbalanced data (a few per cent
    positives) every score then sits near the wrong prior. The rule looks at no data.
    """
    if isinstance(loss, str):
        loss = {"name": loss}
    if isinstance(loss, Mapping):
        loss = {"name": DEFAULT_LOSS, "intercept": True, **loss}
    return as_loss(loss, owner)


def as_loss(loss: Loss | Mapping[str, Any] | str, owner: str) -> Loss:
    """A loss object from a loss, its name (``"logistic"``: default options) or its config dict
    (``{"name": "logistic", "ridge": 0.1}``): what learners' constructors accept."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        return loss_from_config({"name": loss})
    if isinstance(loss, Mapping):
        return loss_from_config(loss)
    raise InvalidInputError(
        check.message(owner, "loss", "a panpriv.protocols.losses.Loss, a loss name or a loss config dict", loss)
    )
