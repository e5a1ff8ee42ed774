"""The user's side of Encode–Shuffle–Analyze for ``shuffle-gaussian`` (Bittau et al. 2017 §3, the
encoder; Liew & Takahashi 2022 §5.2, the local randomizer).

For the round t named by the public model record (:mod:`panpriv.streamer.esa.model`), a user with record
(x, y) sends exactly one message: her gradient at θ_t, clipped to norm C, plus N(0, (σC)² I) —
computed by :func:`panpriv.protocols.shuffle_gaussian.local_messages`, the very function the in-process
learner uses — sealed to the analyzer's public key, and the result sealed again to the shuffler's
(onion sealing, :mod:`panpriv.streamer.esa.wire`): in the clear only the round and the shuffler's
key id. Every message has the same size.

What leaves the user is (ε₀, δ)-locally private whoever reads it (Balle & Wang 2018, Thm 8 at
sensitivity 2C): that is her guarantee even if the shuffler and the analyzer collude. The encoder
can refuse a model whose calibration gives a weaker local guarantee than she accepts
(``max_local_epsilon``), recomputed here from σ, not taken from the record.

This module imports ``protocols``, ``accounting``, numpy, PyNaCl, kafka-python and its siblings
``panpriv.streamer.esa.wire``/``keys``/``model``/``families`` only — none of the service (tested). Sending is
:class:`MessageSender`; :class:`Encoder` is pure (no I/O).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nacl.public import PublicKey, SealedBox
from numpy.typing import NDArray

from panpriv.protocols import scratch
from panpriv.protocols.losses import loss_from_config
from panpriv.protocols.randomizers import gaussian_epsilon0
from panpriv.protocols.randomness import NoiseSource, RngLike
from panpriv.protocols.shuffle_gaussian import local_messages
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.families import learners_with
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.model import ModelRecord

Array = NDArray[np.float64]


class RefusedModel(ValueError):
    """The model record cannot be answered by this client (wrong learner or key, too little noise)."""


class PrivacyRefused(RefusedModel):
    """The model would spend more of the users' privacy than this client accepts (its local ε, a
    plan's composed ε, rounds beyond the plan): a budget refusal (exit code 3)."""


class ModelClient:
    """What every E-S-A client checks and reads in a model record before encoding: that it is for
    a learner this client speaks and sealed to the key it holds, then the round and the public
    calibration every learner's record carries (dimension, loss, feature bound, clip); and the
    two layers of every message (:meth:`_unit`, :meth:`_seal`).

    ``public_key`` is the analyzer's, ``shuffler_key`` the shuffler's (both obtained out of band:
    the client's trust anchors)."""

    def __init__(self, public_key: PublicKey, shuffler_key: PublicKey, model: ModelRecord,
                 learners: tuple[str, ...]) -> None:
        if model.learner not in learners:
            raise RefusedModel(f"this encoder speaks {' and '.join(learners)}, the model is for {model.learner!r}")
        self._key_id = key_id(public_key)
        if self._key_id.hex() != model.key_id:
            raise RefusedModel(f"the analyzer now reads key {model.key_id}, this client holds the public key "
                               f"{self._key_id.hex()}: fetch the new public key")
        self._box = SealedBox(public_key)
        self._shuffler = SealedBox(shuffler_key)
        self._shuffler_id = key_id(shuffler_key)
        cal = model.calibration
        self.round = model.round
        self.dim = int(cal["dim"])
        self.loss = loss_from_config(cal["loss"])
        self.feature_bound = float(cal["feature_bound"])
        self.clip = float(cal["clip"])
        self._work = scratch.Scratch()

    def encode(self, X: Array, y: Array) -> list[bytes]:
        """One message per row of ``X`` (m, dim) with labels ``y`` (m,), made block by block from the
        rows' features and labels by :meth:`_encode_block`; the scratch rows holding clean values
        are wiped before returning."""
        X = np.ascontiguousarray(X, dtype=np.float64).reshape(-1, self.dim)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        out: list[bytes] = []
        try:
            for start in range(0, X.shape[0], scratch.BLOCK_ROWS):
                block = slice(start, start + scratch.BLOCK_ROWS)
                Z = scratch.features(self.loss, X[block], self.feature_bound, self._work)
                out += self._encode_block(Z, scratch.labels(self.loss, y[block], self._work))
        finally:
            self._work.wipe()
        return out

    def _encode_block(self, Z: Array, labels: Array) -> list[bytes]:
        """The messages of one block of users (features ``Z``, labels ``labels``)."""
        raise NotImplementedError

    def _unit(self, sealed_plaintext: bytes) -> bytes:
        """The inner layer: ``sealed_plaintext`` sealed to the analyzer, framed as a unit."""
        return wire.seal_unit(self._box, self._key_id, sealed_plaintext)

    def _seal(self, round_: int, body: bytes) -> bytes:
        """The outer layer: the message carrying ``body`` (units) sealed to the shuffler."""
        return wire.seal_message(self._shuffler, self._shuffler_id, round_, body)


class Encoder(ModelClient):
    """Turns records into sealed messages for the round of one public model record.

    Parameters
    ----------
    public_key, shuffler_key
        The analyzer's and the shuffler's public keys (obtained out of band: the client's trust anchors).
    model
        The round's model record.
    max_local_epsilon
        Refuse a model whose message would be less private than this (ε₀ at the record's δ).
    rng
        ``None``: fresh OS entropy for every message (the deployment). A seed: tests only.
    """

    def __init__(self, public_key: PublicKey, shuffler_key: PublicKey, model: ModelRecord,
                 max_local_epsilon: float | None = None, rng: RngLike = None) -> None:
        super().__init__(public_key, shuffler_key, model, learners_with(shuffler="messages"))
        cal = model.calibration
        self.noise_multiplier = float(cal["noise_multiplier"])
        self.params = self.loss.param_dim(self.dim)
        self.local_epsilon = gaussian_epsilon0(self.noise_multiplier, float(cal["delta"]))
        if max_local_epsilon is not None and self.local_epsilon > max_local_epsilon:
            raise PrivacyRefused(f"the model's noise multiplier {self.noise_multiplier:.6g} gives messages with local "
                               f"epsilon {self.local_epsilon:.4g} > the {max_local_epsilon:g} this client accepts")
        if model.theta.shape != (self.params,):
            raise RefusedModel(f"theta has {model.theta.size} coordinates, the calibration {self.params}")
        self._theta = np.array(model.theta, dtype=np.float64)
        self._noise = NoiseSource(rng)
        self.size = wire.message_size(self.params)

    def _encode_block(self, Z: Array, labels: Array) -> list[bytes]:
        """Each user's clipped gradient at θ_t plus N(0, (σC)² I), sealed to the analyzer, then to the shuffler."""
        messages = local_messages(self.loss, self._theta, Z, labels, self.clip, self.noise_multiplier * self.clip,
                                  self._noise, self._work)
        return [self._seal(self.round, self._unit(wire.plaintext(self.round, row))) for row in messages]


class MessageSender:
    """Produces messages to the messages topic: no key, no headers, acks=all, flushed per call.

    The record timestamp Kafka requires is set to 0, so not even the client's clock leaves with the
    message (the shuffler drops what metadata remains: the broker's offsets and log-append times).
    """

    def __init__(self, bootstrap: str | list[str], topic: str, **options: Any) -> None:
        from kafka import KafkaProducer

        self.topic = topic
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **options)

    def send(self, messages: list[bytes]) -> None:
        futures = [self._producer.send(self.topic, value=item, timestamp_ms=0) for item in messages]
        self._producer.flush()
        for future in futures:
            future.get(timeout=30)

    def close(self) -> None:
        self._producer.close()
