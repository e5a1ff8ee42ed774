"""The user's side of Encode–Shuffle–Analyze for ``shuffle-sgd`` and ``shuffle-acsa`` over secure
summation (Bittau et al. 2017 §3, the encoder; Cheu et al. 2022 Alg. 2, the local randomizer, in
the rounds of Alg. 3 or Alg. 4; Ishai et al. 2006, split and mix, :mod:`panpriv.protocols.secure_sum`).

For the round named by the public model record (:mod:`panpriv.streamer.esa.model`), a user with record
(x, y): takes her gradient at the round's query point (θ^md of AC-SA, θ_t of SGD), clipped to L (of
the Moreau envelope when the plan smooths) — :func:`panpriv.protocols.scratch.clipped_gradients`, the very function the
in-process learner uses; runs PVEC's local randomizer on it — :meth:`panpriv.protocols.encoder.VectorSum.randomize`,
likewise — giving her count vector c ∈ {0, …, g + b}^d; splits c into m additive shares in
Z_q^d (:func:`panpriv.protocols.secure_sum.split`, OS entropy); seals **each** share to the analyzer's
public key on its own (a unit); and sends the m units as one message sealed to the shuffler
(:func:`panpriv.streamer.esa.wire.seal_message`), so her shares arrive together and nothing of them is
readable on the messages topic.

The client trusts the record for nothing it can recompute: it rebuilds the PVEC instance from the
record's (n, d, ε, δ, l2 bound, calibration, honest fraction γ) and refuses a record whose (g, b, p)
differ, and it recomputes m and q from (n, ⌈γn⌉, d, g + b) at its own σ
(:func:`panpriv.protocols.secure_sum.round_plan`, :data:`panpriv.protocols.secure_sum.SECURITY_BITS`).

Her guarantees: against anyone, the local guarantee of PVEC's randomizer (a shuffler and an
analyzer that collude can link her m shares); against the analyzer, alone or with the broker's
operator, PVEC's shuffle-model (ε, δ) plus the secure sum's (1 + e^ε)·τ
(:func:`panpriv.streamer.esa.deployment.sum_report`).

This module imports ``protocols``, ``accounting``, numpy, PyNaCl and its siblings
``panpriv.streamer.esa.wire``/``keys``/``model``/``client``/``families`` only — none of the service (tested).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from nacl.public import PublicKey
from numpy.typing import NDArray

from panpriv.protocols import scratch
from panpriv.protocols.encoder import VectorSum
from panpriv.protocols.randomness import NoiseSource, RngLike
from panpriv.protocols.secure_sum import SECURITY_BITS, round_plan, split
from panpriv.protocols.shuffle_base import message_guarantee
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.client import ModelClient, RefusedModel
from panpriv.streamer.esa.families import learners_with
from panpriv.streamer.esa.model import ModelRecord

Array = NDArray[np.float64]

SUM_LEARNERS = learners_with(shuffler="shares", client="per-round")
"""The learners deployed over secure summation, one round per user (:mod:`panpriv.streamer.esa.families`):
the catalogue's :class:`panpriv.protocols.shuffle_base.SequentialLearner` s (tested)."""


class SharesEncoder(ModelClient):
    """Turns records into share messages for the round of one public ``shuffle-sgd`` or
    ``shuffle-acsa`` model record.

    Parameters
    ----------
    public_key, shuffler_key
        The analyzer's and the shuffler's public keys (obtained out of band).
    model
        The round's model record.
    max_local_epsilon
        Refuse a model whose PVEC randomizer is less private than this locally (ε at the record's δ).
    rng
        ``None``: fresh OS entropy for the PVEC noise (the deployment). A seed or generator: tests
        only. The shares always come from OS entropy.
    """

    learners: ClassVar[tuple[str, ...]] = SUM_LEARNERS
    """The learners whose model records this encoder answers (``shuffle-gd``: :mod:`panpriv.streamer.esa.gd_client`)."""

    def __init__(self, public_key: PublicKey, shuffler_key: PublicKey, model: ModelRecord,
                 max_local_epsilon: float | None = None, rng: RngLike = None) -> None:
        super().__init__(public_key, shuffler_key, model, self.learners)
        cal = model.calibration
        self.smoothing = None if cal["smoothing"] is None else float(cal["smoothing"])
        self.vector_sum = VectorSum(int(cal["batch_size"]), int(cal["params"]), float(cal["epsilon"]), float(cal["delta"]),
                                    float(cal["l2_bound"]), calibration=cal["calibration"],
                                    honest_fraction=float(cal["honest_fraction"]))
        if (self.vector_sum.g, self.vector_sum.b, self.vector_sum.p) != (cal["g"], cal["b"], cal["p"]):
            raise RefusedModel(f"the model's PVEC parameters (g, b, p) = ({cal['g']}, {cal['b']}, {cal['p']}) are not the "
                               f"({self.vector_sum.g}, {self.vector_sum.b}, {self.vector_sum.p}) its (epsilon, delta) give")
        plan = round_plan(self.vector_sum.n, self.vector_sum.parameters.noisy_users, self.vector_sum.d,
                          self.vector_sum.g + self.vector_sum.b)
        self.bits, self.shares = plan.bits, plan.shares
        if (cal["shares"], cal["modulus_bits"], cal["honest_users"]) != (self.shares, self.bits, plan.honest):
            raise RefusedModel(f"the model asks for {cal['shares']} shares mod 2^{cal['modulus_bits']}; this client needs "
                               f"{self.shares} mod 2^{self.bits} for statistical distance 2^-{SECURITY_BITS} among "
                               f"{plan.honest} honest users")
        if max_local_epsilon is not None:
            local = message_guarantee(self.vector_sum, self.vector_sum.delta, max_local_epsilon)
            if local.epsilon > max_local_epsilon:
                raise RefusedModel(f"the model's PVEC randomizer has local epsilon {local.epsilon:.4g} > the "
                                   f"{max_local_epsilon:g} this client accepts")
        if model.theta.shape != (self.vector_sum.d,):
            raise RefusedModel(f"theta has {model.theta.size} coordinates, the calibration {self.vector_sum.d}")
        self._theta = np.array(model.theta, dtype=np.float64)
        self._noise = NoiseSource(rng)
        self.size = wire.shares_message_size(self.vector_sum.d, self.shares)

    def _encode_block(self, Z: Array, labels: Array) -> list[bytes]:
        """One share message per user: her clipped gradient's PVEC counts, split and sealed; the
        counts are wiped before returning (the shares in :meth:`_message`)."""
        gradients = scratch.clipped_gradients(self.loss, self._theta, Z, labels, self.clip, self._work, self.smoothing)
        with self._noise.draw() as generator:
            counts = self.vector_sum.randomize(gradients, generator)
        try:
            return [self._message(row) for row in counts]
        finally:
            counts.fill(0)

    def _message(self, counts: NDArray[np.unsignedinteger]) -> bytes:
        """One user's m shares, each sealed to the analyzer, together sealed to the shuffler."""
        shares = split(counts, self.shares, self.bits)
        try:
            units = [self._unit(wire.share_plaintext(self.round, share)) for share in shares]
        finally:
            shares.fill(0)
        return self._seal(self.round, b"".join(units))
