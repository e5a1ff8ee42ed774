"""``panpriv analyze``: the analyzer of Encode–Shuffle–Analyze for ``shuffle-gaussian`` (Bittau et
al. 2017 §3; Liew & Takahashi 2022 §5.2 for the analysis).

It reads shuffled batches (:mod:`panpriv.streamer.esa.wire`) from the shuffled topic, and for the batch of
the current round t: opens every message with the private key its key id names, keeps the valid
ones, takes one SGD step on their mean (:meth:`ShuffleGaussianSGD.learn_round`), checkpoints, and
publishes the model of round t + 1 to the model topic (:mod:`panpriv.streamer.esa.model`).

**Rejected, counted by reason** (the counts are public, like the service's reject counts):
per batch ``malformed_batch``, ``duplicate_batch`` (an id already applied: a shuffler's re-release
after a crash), ``wrong_batch_size`` (not exactly b: the threshold is the privacy precondition, so
a short batch is never analysed), and per message of a batch ``stale_round`` (the batch is not for
the current round), ``malformed``, ``unknown_key``, ``undecryptable``, ``round_mismatch`` (the
clear tag, the sealed round and the batch's round disagree: a message moved between rounds),
``non_finite``, ``duplicate_message`` (the same ciphertext twice in a batch: a replay).

**Exactly once.** The analyzer adds no noise: its step is a deterministic function of the
checkpointed state and the batch record. The checkpoint (noisy state, next input offset, applied
batch ids, reject counts) is written atomically after each step and before the model is
published; after a crash the analyzer re-reads from the checkpoint's offset and recomputes the
same model, and republishing it (compacted topic, same key) changes nothing.

**Budget.** :meth:`Analyzer.handle` asks ``gate`` (the budget store: :meth:`panpriv.streamer.budget.session.BudgetSession.charge_step`)
before each step, with the round and the statement that will hold once it is learned; a refusal
leaves the state untouched (the batch's decrypted messages are zeroed) and sets ``stopped``.

**What it holds.** The model, the counters, the private keys and, while a batch is analysed, the
batch's decrypted noisy messages (zeroed after the step). Never a raw record: clients send none
(tested by a canary scan of the process and its files, ``tests/esa``). The statement is
:func:`panpriv.streamer.esa.deployment.esa_report`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.base import StateValue
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.streamer.budget.units import ChargeUnit, Rounds
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.deployment import DEPLOYMENT, esa_report
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.runtime.learners import restore_learner

CHECKPOINT_FORMAT = "panpriv-esa-analyzer/1"
APPLIED_KEPT = 1024
"""Batch ids remembered for ``duplicate_batch`` (a duplicate follows its original closely)."""

REJECT_REASONS = ("malformed_batch", "duplicate_batch", "stale_round", "wrong_batch_size", "malformed", "unknown_key",
                  "undecryptable", "round_mismatch", "non_finite", "duplicate_message")
"""Every reason :meth:`Analyzer.handle` counts (module docstring)."""

Gate = Callable[[int, PrivacyReport], "str | None"]
"""Asked before round t is learned, with the statement that holds once it is: ``None`` to go on,
else why not (:meth:`panpriv.streamer.budget.session.BudgetSession.charge_step`)."""


def encode_state(state: Mapping[str, StateValue]) -> dict[str, Any]:
    return {k: {"array": v.tolist()} if isinstance(v, np.ndarray) else v for k, v in state.items()}


def decode_state(data: Mapping[str, Any]) -> dict[str, StateValue]:
    return {k: np.asarray(v["array"], dtype=np.float64) if isinstance(v, dict) else v for k, v in data.items()}


class AnalyzerCore:
    """What every E-S-A analyzer keeps (no I/O): its learner, keys, reject counters, input position
    and the ids of the batches it applied; the batch checks that come before opening any message;
    and the checkpoint fields they make. :class:`Analyzer` and
    :class:`panpriv.streamer.esa.sum_analyzer.SumAnalyzer` add what their learners need."""

    learner: Any
    round: int
    REJECT_REASONS: tuple[str, ...] = ()
    """Every reason :meth:`handle` counts (the metrics export each, at 0 from the start)."""
    CHECKPOINT_FORMAT = ""
    """The ``format`` of :meth:`checkpoint` (:mod:`panpriv.streamer.esa.families` restores by it)."""

    def __init__(self, learner: Any, keys: list[PrivateKey], name: str, instance: str | None) -> None:
        if not keys:
            raise ValueError("the analyzer needs at least one private key")
        self.learner = learner
        self.name = name
        self.instance = instance
        self._boxes = {key_id(k.public_key): SealedBox(k) for k in keys}
        self.current_key = key_id(keys[0].public_key)
        self.rejected: Counter[str] = Counter()
        self.applied: list[str] = []
        self.offset = 0
        self.gate: Gate | None = None
        self.stopped: str | None = None
        self.last_valid = 0

    def _admit(self, value: bytes | None) -> wire.Batch | None:
        """The batch in ``value`` if it is well formed, new and of the current round; else ``None``
        with the reason counted."""
        try:
            batch = wire.parse_batch(value or b"")
        except wire.WireError:
            self.rejected["malformed_batch"] += 1
            return None
        if batch.id.hex() in self.applied:
            self.rejected["duplicate_batch"] += 1
            return None
        if batch.round != self.round:
            self.rejected["stale_round"] += len(batch.messages)
            return None
        return batch

    def _unseal(self, item: bytes, size: int, magic: bytes, round_: int, seen: set[bytes]) -> tuple[bytes, bytes] | str:
        """(plaintext, key id) of one sealed message of round ``round_``, or why it is rejected:
        wrong size or header, another round, a repeat within the batch, an unknown key, or a seal
        that does not open. ``seen`` collects the batch's seals."""
        if len(item) != size:
            return "malformed"
        try:
            header, sealed = wire.parse_message(item, magic)
        except wire.WireError:
            return "malformed"
        if header.round != round_:
            return "round_mismatch"
        if sealed in seen:
            return "duplicate_message"
        seen.add(sealed)
        box = self._boxes.get(header.key_id)
        if box is None:
            return "unknown_key"
        try:
            return box.decrypt(sealed), header.key_id
        except CryptoError:
            return "undecryptable"

    def _mark_applied(self, batch: wire.Batch) -> None:
        self.applied = [*self.applied[-(APPLIED_KEPT - 1):], batch.id.hex()]

    def handle(self, value: bytes | None) -> bool:
        """Analyse one record of the shuffled topic; True if it closed the current round."""
        raise NotImplementedError

    def model(self) -> ModelRecord:
        """The public model record of the current round."""
        raise NotImplementedError

    def checkpoint(self, privacy: PrivacyReport | None = None) -> dict[str, Any]:
        """The state to save (:meth:`_checkpoint_fields` and the family's own)."""
        raise NotImplementedError

    def report(self) -> PrivacyReport:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        """No round is left to analyse: the service stops (default: never)."""
        return False

    def charge_unit(self, key: str) -> ChargeUnit:
        """What a round charges in the budget store (:mod:`panpriv.streamer.budget.units`): one
        position of ``key``, the round's users (default)."""
        return Rounds(key)

    def shuffler_arguments(self) -> str:
        """The ``panpriv shuffle`` flags this deployment needs (logged at start-up)."""
        raise NotImplementedError

    def release_bytes(self) -> int:
        """The largest record the shuffler releases for this deployment (the shuffled topic must admit it)."""
        raise NotImplementedError

    def _checkpoint_fields(self, privacy: PrivacyReport | None) -> dict[str, Any]:
        """Noisy state, counters and position only (no message, no key); ``privacy``: the statement
        to record (default :meth:`report`; the analyzer's service records the composed one)."""
        return {
            "deployment": DEPLOYMENT,
            "name": self.name,
            "instance": self.instance,
            "config": self.learner.config(),
            "state": encode_state(self.learner.state_dict()),
            "offset": self.offset,
            "applied": self.applied,
            "rejected": dict(self.rejected),
            "round": self.round,
            "released": self.learner.release().tolist(),
            "privacy": (privacy or self.report()).to_dict(),
        }

    def _restore_fields(self, data: Mapping[str, Any]) -> None:
        self.offset = int(data["offset"])
        self.applied = list(data["applied"])
        self.rejected = Counter({k: int(v) for k, v in data["rejected"].items()})


class VectorAnalyzer(AnalyzerCore):
    """An analyzer of sealed ``PPM1`` messages each holding one vector of ``_params`` coordinates
    (``shuffle-gaussian``; ``checkin``'s inner messages, :mod:`panpriv.streamer.esa.checkin_analyzer`)."""

    _params: int
    _size: int

    def _open(self, batch: wire.Batch) -> np.ndarray:
        """The valid messages of the batch as rows (k, p); every other one counted by reason."""
        rows = np.zeros((len(batch.messages), self._params))
        seen: set[bytes] = set()
        k = 0
        for item in batch.messages:
            reason = self._open_one(item, batch.round, seen, rows[k])
            if reason is None:
                k += 1
            else:
                rows[k].fill(0.0)
                self.rejected[reason] += 1
        return rows[:k]

    def _open_one(self, item: bytes, round_: int, seen: set[bytes], out: np.ndarray) -> str | None:
        opened = self._unseal(item, self._size, wire.MESSAGE_MAGIC, round_, seen)
        if isinstance(opened, str):
            return opened
        try:
            inner_round, vector = wire.parse_plaintext(opened[0], self._params)
        except wire.WireError:
            return "malformed"
        if inner_round != round_:
            return "round_mismatch"
        if not np.all(np.isfinite(vector)):
            return "non_finite"
        out[...] = vector
        vector.fill(0.0)
        return None

class Analyzer(VectorAnalyzer):
    """The shuffle-gaussian analyzer's state machine (no I/O): learner, keys, counters, input position.

    Parameters
    ----------
    learner
        A ``shuffle-gaussian`` learner with ``participation="all"``.
    keys
        The private keys it may use; the first is the one it asks clients to use now.
    name
        The deployment instance's name (the model records' key and ``deployment`` field).
    instance
        The analyzer's instance id in the budget store (``None``: not charged anywhere yet).
    """

    def __init__(self, learner: ShuffleGaussianSGD, keys: list[PrivateKey], name: str,
                 instance: str | None = None) -> None:
        if learner.participation != "all" or learner.batch_size is None:
            raise ValueError("the ESA analyzer runs shuffle-gaussian with participation 'all'")
        super().__init__(learner, keys, name, instance)
        self.learner: ShuffleGaussianSGD = learner
        self.min_valid: int | None = None
        self._params = int(learner.calibration()["params"])
        self._size = wire.message_size(self._params)

    REJECT_REASONS = REJECT_REASONS
    CHECKPOINT_FORMAT = CHECKPOINT_FORMAT

    def shuffler_arguments(self) -> str:
        return f"--batch-size {self.learner.batch_size} --params {self._params}"

    def release_bytes(self) -> int:
        return wire.batch_bytes(int(self.learner.batch_size or 0), self._size)

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.learner.rounds_done

    def handle(self, value: bytes | None) -> bool:
        """Analyse one record of the shuffled topic; True if it was the current round's batch (a step)."""
        batch = self._admit(value)
        if batch is None:
            return False
        if len(batch.messages) != self.learner.batch_size:
            self.rejected["wrong_batch_size"] += len(batch.messages)
            return False
        vectors = self._open(batch)
        valid = vectors.shape[0]
        min_valid = valid if self.min_valid is None else min(self.min_valid, valid)
        try:
            if self.gate is not None:
                self.stopped = self.gate(self.round, esa_report(self.learner, min_valid))
                if self.stopped is not None:
                    return False
            self.learner.learn_round(vectors)
        finally:
            vectors.fill(0.0)
        self.min_valid = min_valid
        self.last_valid = valid
        self._mark_applied(batch)
        return True

    def model(self) -> ModelRecord:
        """The public model record of the current round."""
        local = self.learner.local_guarantee()
        return ModelRecord(self.learner.name, self.name, self.round, self.learner.theta, self.learner.calibration(),
                           self.current_key.hex(), (local.epsilon, local.delta))

    def report(self) -> PrivacyReport:
        """The statement of this deployment (:func:`panpriv.streamer.esa.deployment.esa_report`)."""
        return esa_report(self.learner, self.min_valid)

    def checkpoint(self, privacy: PrivacyReport | None = None) -> dict[str, Any]:
        """:meth:`AnalyzerCore._checkpoint_fields` and the fewest valid messages of a round."""
        return {"format": CHECKPOINT_FORMAT, **self._checkpoint_fields(privacy), "min_valid": self.min_valid}

    @classmethod
    def restore(cls, data: Mapping[str, Any], keys: list[PrivateKey]) -> Analyzer:
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not an analyzer checkpoint ({CHECKPOINT_FORMAT})")
        learner = restore_learner(ShuffleGaussianSGD.name, data["config"], decode_state(data["state"]), None)
        assert isinstance(learner, ShuffleGaussianSGD)
        analyzer = cls(learner, keys, data["name"], data.get("instance"))
        analyzer._restore_fields(data)
        analyzer.min_valid = data["min_valid"]
        return analyzer
