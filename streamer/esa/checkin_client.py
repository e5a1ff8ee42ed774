"""The client of ``checkin`` in Encode–Shuffle–Analyze: random check-ins on the user's device
(Balle et al. 2020, Def. 3.1 and Algs 1–2, §4.2; Bittau et al. 2017 §3, the encoder).

A record is a client waking at her slot w — the public position slot ⌊i / slot_length⌋, which the
public model record of round w names (the analyzer publishes round w once slot w − 1 is closed).
On waking she:

1. performs a random check-in with her own randomness (:func:`panpriv.protocols.checkin.check_in_slots`,
   the function behind :func:`panpriv.protocols.checkin.check_in`): with probability p₀ a slot uniform in
   her window of m slots, else none; and draws her *choice key* (uniform, as the in-process
   learner's candidates do: the least key of a slot is its update in ``update="single"``);
2. computes her gradient at the model θ_w of that time, clipped to C, and runs the learner's local
   randomizer on it (ℓ2-ball or Gaussian, :mod:`panpriv.protocols.randomizers`, the in-process learner's
   objects and calls) — a client who does not check in runs it on the zero vector instead, so the
   work does not depend on her choice and her data never leave in that case;
3. sends **one** message at once, whatever she chose (send time and message count are those of her
   wake slot, public): the update sealed to the **analyzer** (to the key model w names), inside a
   box sealed to the **shuffler** with the chosen slot and the key
   (:mod:`panpriv.streamer.esa.checkin_wire`). The clear header carries the wake slot and the
   shuffler's key id only; every message has one size.

What leaves her is the local randomizer's output, (ε₀, δ₀)-DP against anyone (the ℓ2 mechanism is
pure ε₀-DP, Duchi, Jordan & Wainwright 2018; the Gaussian one (ε₀, δ₀) at sensitivity 2C, Balle &
Wang 2018 Thm 8); ``max_local_epsilon`` refuses a model whose randomizer is weaker. Against the
analyzer alone, with an honest and separate shuffler, the learner's amplified guarantee holds
(:func:`panpriv.streamer.esa.deployment.checkin_report`).

This module imports ``protocols``, numpy, PyNaCl and its siblings ``panpriv.streamer.esa.wire``,
``checkin_wire``, ``keys``, ``model``, ``client``, ``families`` only — none of the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from nacl.public import PublicKey
from numpy.typing import NDArray

from panpriv.protocols import scratch
from panpriv.protocols.checkin import check_in_slots, window_start
from panpriv.protocols.randomizers import GaussianRandomizer, L2BallRandomizer, LocalRandomizer
from panpriv.protocols.randomness import NoiseSource, RngLike
from panpriv.streamer.esa import checkin_wire, wire
from panpriv.streamer.esa.client import ModelClient, PrivacyRefused, RefusedModel
from panpriv.streamer.esa.families import learners_with
from panpriv.streamer.esa.model import ModelRecord

Array = NDArray[np.float64]

KEY_SCALE = float(1 << 53)
"""A choice key in [0, 1) (a multiple of 2^-53, numpy's ``random()``) is sent as key·2^53 (u64)."""


def local_randomizer(calibration: Mapping[str, Any]) -> LocalRandomizer:
    """The learner's local randomizer named by a ``checkin`` model record's calibration."""
    clip = float(calibration["clip"])
    if calibration["randomizer"] == "gaussian":
        return GaussianRandomizer(clip, float(calibration["noise_multiplier"]), float(calibration["delta0"]))
    if calibration["randomizer"] == "l2":
        return L2BallRandomizer(clip, float(calibration["epsilon0"]))
    raise RefusedModel(f"unknown local randomizer {calibration['randomizer']!r}")


class CheckinEncoder(ModelClient):
    """Turns the records of the clients waking at the slot of one public ``checkin`` model record
    into check-in messages (module docstring).

    Parameters
    ----------
    public_key
        The analyzer's public key (out of band; the model record names its id).
    shuffler_key
        The shuffler's public key (out of band: the clients' second trust anchor).
    model
        The model record of round w: the wake slot of the records to encode.
    max_local_epsilon
        Refuse a model whose local randomizer is less private than this.
    rng
        ``None``: fresh OS entropy for every draw (the deployment). A seed or generator: tests only.
    """

    def __init__(self, public_key: PublicKey, shuffler_key: PublicKey, model: ModelRecord,
                 max_local_epsilon: float | None = None, rng: RngLike = None) -> None:
        super().__init__(public_key, shuffler_key, model, learners_with(client="check-in"))
        cal = model.calibration
        if cal.get("time", "position") != "position":
            raise RefusedModel("checkin in three roles needs position slots (time = 'position')")
        self.params = self.loss.param_dim(self.dim)
        self.randomizer = local_randomizer(cal)
        self.local = self.randomizer.local_guarantee()
        if max_local_epsilon is not None and self.local.epsilon > max_local_epsilon:
            raise PrivacyRefused(f"the model's local randomizer has epsilon {self.local.epsilon:.4g} > the "
                               f"{max_local_epsilon:g} this client accepts")
        if model.theta.shape != (self.params,):
            raise RefusedModel(f"theta has {model.theta.size} coordinates, the calibration {self.params}")
        self.slots, self.window, self.update = int(cal["slots"]), str(cal["window"]), str(cal["update"])
        self.probability = float(cal["checkin_probability"])
        self._theta = np.array(model.theta, dtype=np.float64)
        self._noise = NoiseSource(rng)
        self.size = checkin_wire.message_size(self.params)

    def _encode_block(self, Z: Array, labels: Array) -> list[bytes]:
        """Check in, randomize (the zero vector for those who do not check in) and seal, per client."""
        count = Z.shape[0]
        wake = self.round
        with self._noise.draw() as generator:
            first = np.full(count, window_start(wake, self.slots, self.window), dtype=np.int64)
            slots = check_in_slots(first, self.slots, self.probability, generator)
            keys = np.asarray(generator.random(count) if self.update == "single" else np.zeros(count))
        gradients = scratch.clipped_gradients(self.loss, self._theta, Z, labels, self.clip, self._work)
        gradients[slots < 0] = 0.0
        if isinstance(self.randomizer, GaussianRandomizer):
            self._noise.add_gaussian(gradients, self.randomizer.noise_std)
            messages = gradients
        else:
            with self._noise.draw() as generator:
                messages = self.randomizer.privatize(gradients, generator)
        try:
            return [self._message(wake, int(slot), float(key), row)
                    for slot, key, row in zip(slots.tolist(), keys.tolist(), messages, strict=True)]
        finally:
            messages.fill(0.0)
            slots.fill(0)
            keys.fill(0.0)

    def _message(self, wake: int, slot: int, key: float, row: Array) -> bytes:
        tag = slot if slot >= 0 else wake
        unit = self._unit(wire.plaintext(tag, row))
        return self._seal(wake, checkin_wire.body(slot if slot >= 0 else None, int(key * KEY_SCALE), unit))
