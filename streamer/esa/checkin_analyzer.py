"""``panpriv analyze --learner checkin``: the analyzer of random check-ins in Encode–Shuffle–Analyze
(Balle et al. 2020 Algs 1–2, §4.2; Bittau et al. 2017 §3).

It reads the shuffler's per-slot releases (:mod:`panpriv.streamer.esa.slot_shuffler`: a signed batch
whose round is the slot and whose units are the clients' updates, sealed to this analyzer) and, for
the release of the current slot s: opens each unit (:class:`panpriv.streamer.esa.analyzer.VectorAnalyzer`:
the key its id names, the sealed slot must be s, finite values, no repeat), charges the budget
(``gate``), and closes the slot through the learner's own code,
:meth:`panpriv.protocols.checkin.RandomCheckinSGD.learn_slot` — ``single``: a step on the one update (a
client's or the shuffler's dummy: it cannot tell which; if the message is rejected, a dummy it
draws itself with OS entropy), ``averaged``: a step on the mean of the valid updates, none for an
empty slot — then checkpoints and publishes the model of round s + 1, the model at which the
clients waking at slot s + 1 compute (the in-process staleness rule).

**Rejected, counted by reason**: per release the refusals of every analyzer
(:data:`panpriv.streamer.esa.analyzer.BATCH_REJECTS`: unsigned, forged, replayed, out of order,
duplicated — the same release twice after a shuffler crash — or, for a single-update release, not
one unit — none before the first window); per unit ``malformed``, ``unknown_key``,
``undecryptable``, ``round_mismatch``, ``non_finite``, ``duplicate_message``.

**Budget.** Position s is wake slot s: its ``slot_length`` clients' records, each with the learner's
guarantee for all of its use (a record wakes once; the accounting covers every slot of her window).
Slot s is charged ``[s, s + 1)`` before it is learned, as :mod:`panpriv.streamer.esa.analyze_service` describes for rounds.

**Exactly once.** The step of a slot with a message is deterministic (no noise is added here); the
analyzer's own dummy for a rejected single update is drawn from OS entropy, so a re-analysis of
that slot after a crash draws another — noise only, never a record. The checkpoint is written
before the next model is published, as for the other analyzers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nacl.public import PrivateKey

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.checkin import RandomCheckinSGD, window_start
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyzer import REJECT_REASONS as VECTOR_REJECT_REASONS
from panpriv.streamer.esa.analyzer import VectorAnalyzer, check_format, decode_state
from panpriv.streamer.esa.deployment import checkin_report
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.runtime.learners import restore_learner

CHECKPOINT_FORMAT = "panpriv-esa-checkin-analyzer/2"

REJECT_REASONS = VECTOR_REJECT_REASONS
"""Every reason :meth:`CheckinAnalyzer.handle` counts (module docstring)."""


def calibration(learner: RandomCheckinSGD) -> dict[str, Any]:
    """What a client and the shuffler need: the loss, the clip, the local randomizer and the
    check-in configuration (all public). ``batch_size`` is ``slot_length``: the clients of one round."""
    local = learner.local_randomizer
    guarantee = local.local_guarantee()
    return {
        "dim": learner.dim,
        "params": learner.loss.param_dim(learner.dim),
        "loss": learner.loss.config(),
        "feature_bound": learner.feature_bound,
        "clip": local.clip,
        "randomizer": learner.randomizer,
        "epsilon0": guarantee.epsilon,
        "delta0": guarantee.delta if learner.randomizer == "gaussian" else 0.0,
        "noise_multiplier": getattr(local, "noise_multiplier", None),
        "update": learner.update,
        "window": learner.window,
        "slots": learner.slots,
        "checkin_probability": learner.checkin_probability,
        "time": learner.time,
        "slot_length": int(learner.slot_length),
        "batch_size": int(learner.slot_length),
        "epsilon": learner.epsilon,
        "delta": learner.delta,
    }


class CheckinAnalyzer(VectorAnalyzer):
    """The check-in analyzer's state machine (no I/O); the interface :mod:`panpriv.streamer.esa.analyze_service` drives.

    Parameters
    ----------
    learner
        A ``checkin`` learner with position slots (``time = "position"``).
    keys, name, instance
        As :class:`panpriv.streamer.esa.analyzer.Analyzer`.
    """

    def __init__(self, learner: RandomCheckinSGD, keys: list[PrivateKey], name: str, instance: str | None = None) -> None:
        if learner.time != "position":
            raise ValueError("checkin in three roles needs position slots (time = 'position'): with timestamps the "
                             "shuffler could not know when a wake slot is complete")
        super().__init__(learner, keys, name, instance)
        self.learner: RandomCheckinSGD = learner
        self._params = learner.loss.param_dim(learner.dim)
        self._size = wire.vector_unit_size(self._params)
        self._first = int(window_start(0, learner.slots, learner.window))  # fixed windows: round 0 is released empty

    REJECT_REASONS = REJECT_REASONS
    CHECKPOINT_FORMAT = CHECKPOINT_FORMAT

    def shuffler_arguments(self) -> str:
        return f"--checkin --batch-size {int(self.learner.slot_length)} --params {self._params}"

    def release_bytes(self) -> int:
        return wire.batch_bytes(int(self.learner.slot_length), self._size)

    @property
    def round(self) -> int:  # type: ignore[override]
        """The next slot to close (the model record's round)."""
        return max(self.learner._clock, 0)

    def handle(self, value: bytes | None) -> bool:
        """Analyse one record of the shuffled topic; True if it closed the current slot."""
        batch = self._admit(value)
        if batch is None:
            return False
        if self.learner.update == "single" and len(batch.units) != (self.round >= self._first):
            self.rejected["wrong_batch_size"] += 1
            return False
        vectors = self._open(batch)
        try:
            if self.gate is not None:
                self.stopped = self.gate(self.round, self.report())
                if self.stopped is not None:
                    return False
            self.learner.learn_slot(vectors)
        finally:
            vectors.fill(0.0)
        self.last_valid = vectors.shape[0]
        self._mark_applied(batch)
        return True

    def model(self) -> ModelRecord:
        """The public model record of the current slot: θ after the previous slot, at which the
        clients waking now compute."""
        local = self.learner.local_randomizer.local_guarantee()
        return ModelRecord(self.learner.name, self.name, self.round, self.learner._sgd.theta.copy(), calibration(self.learner), self.current_key.hex(),
                           (local.epsilon, local.delta))

    def report(self) -> PrivacyReport:
        """The statement of this deployment (:func:`panpriv.streamer.esa.deployment.checkin_report`)."""
        return checkin_report(self.learner)

    def checkpoint(self, privacy: PrivacyReport | None = None) -> dict[str, Any]:
        return {"format": CHECKPOINT_FORMAT, **self._checkpoint_fields(privacy)}

    @classmethod
    def restore(cls, data: Mapping[str, Any], keys: list[PrivateKey]) -> CheckinAnalyzer:
        check_format(data, CHECKPOINT_FORMAT, "a checkin analyzer checkpoint")
        learner = restore_learner(RandomCheckinSGD.name, data["config"], decode_state(data["state"]), None)
        assert isinstance(learner, RandomCheckinSGD)
        analyzer = cls(learner, keys, data["name"], data.get("instance"))
        analyzer._restore_fields(data)
        return analyzer
