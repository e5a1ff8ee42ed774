"""``panpriv analyze``: the analyzer of Encode–Shuffle–Analyze for ``shuffle-gaussian`` (Bittau et
al. 2017 §3; Liew & Takahashi 2022 §5.2 for the analysis).

It reads signed batches (:mod:`panpriv.streamer.esa.wire`, :mod:`panpriv.streamer.esa.batches`) from
the shuffled topic, and for the batch of the current round t: opens every unit with the private key
its key id names, keeps the valid ones, takes one SGD step on their mean
(:meth:`ShuffleGaussianSGD.learn_round`), checkpoints, and publishes the model of round t + 1 to the
model topic (:mod:`panpriv.streamer.esa.model`).

**Rejected, counted by reason** (the counts are public, like the service's reject counts): per
batch record, before anything of it is opened, charged or learned — ``old_format`` (an unsigned
batch of the format before signed batches), ``malformed_batch``, ``unknown_signer``,
``bad_signature``, ``wrong_deployment`` (:class:`panpriv.streamer.esa.batches.BatchVerifier`),
``duplicate_batch`` (a digest already applied: a shuffler's re-release after a crash, or the same
record replayed), ``replayed_batch`` (a signed batch of a round already analysed, with other
units), ``out_of_order`` (a round ahead of the current one), ``wrong_batch_size`` (not exactly b
units: the threshold is the privacy precondition, so a short batch is never analysed); and per
unit of the current round's batch ``malformed``, ``unknown_key``, ``undecryptable``,
``round_mismatch`` (the sealed round is not the batch's: a unit moved between rounds),
``non_finite``, ``duplicate_message`` (the same ciphertext twice in a batch: a replay).

**Exactly once.** The analyzer adds no noise: its step is a deterministic function of the
checkpointed state and the batch record. The checkpoint (noisy state, next input offset, applied
batch digests, reject counts, the deployment id and the key of the current round) is written
atomically after each step and before the model is published; after a crash the analyzer re-reads
from the checkpoint's offset and recomputes the same model, and republishing it (compacted topic,
same key) changes nothing.

**Key of a round.** The model of round t names one analyzer key, fixed when round t begins (the
newest key then) and kept in the checkpoint, so a restart with a rotated key republishes round t
under the same key and rotation takes effect from round t + 1: every honest client of a round
seals to one key (a check-in shuffler seals that round's dummy to it too).

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
from panpriv.streamer.errors import CheckpointError
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.batches import BATCH_REASONS, ORDER_REASONS, BatchVerifier
from panpriv.streamer.esa.deployment import DEPLOYMENT, esa_report
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.runtime.learners import restore_learner

CHECKPOINT_FORMAT = "panpriv-esa-analyzer/2"
APPLIED_KEPT = 1024
"""Batch digests remembered for ``duplicate_batch`` (a duplicate follows its original closely)."""

BATCH_REJECTS = (*BATCH_REASONS, *ORDER_REASONS, "wrong_batch_size")
"""The reasons every analyzer refuses a whole batch record for, before opening it (module docstring)."""

UNIT_REJECTS = ("malformed", "unknown_key", "undecryptable", "round_mismatch", "duplicate_message")
"""The reasons every analyzer rejects one unit of the current round's batch for."""

REJECT_REASONS = (*BATCH_REJECTS, *UNIT_REJECTS, "non_finite")
"""Every reason :meth:`Analyzer.handle` counts (module docstring)."""

LEGACY_FORMATS = ("panpriv-esa-analyzer/1", "panpriv-esa-sum-analyzer/1", "panpriv-esa-gd-analyzer/1",
                  "panpriv-esa-checkin-analyzer/1")
"""Analyzer checkpoints written before onion sealing and signed batches: refused (:func:`check_format`)."""

MIGRATION = (
    "it was written before onion-sealed messages and signed batches (format {format}); its rounds' messages sit on "
    "the messages topic sealed to the analyzer's key alone, so this version's statement would not hold for them. "
    "Migrate by starting a new deployment: keep this --out as the record of the rounds learned (their charges stay "
    "in the budget store), make a shuffler key (`panpriv keygen DIR --role shuffler`) and a new analyzer key "
    "(`panpriv keygen DIR`; delete the old one once its messages are gone), new messages and shuffled topics, and "
    "run `panpriv analyze` with a new --out and --shuffler-verify-key"
)


def refuse_old_format(data: Mapping[str, Any], where: str = "analyzer checkpoint") -> None:
    """A :class:`panpriv.streamer.errors.CheckpointError` naming the migration if ``data`` is an
    analyzer state written before onion sealing and signed batches (sealed or not: panpriv 0.1
    wrote them unsealed, the one-runtime version sealed)."""
    found = data.get("format")
    if found in LEGACY_FORMATS:
        raise CheckpointError(f"{where}: {MIGRATION.format(format=found)}")


def check_format(data: Mapping[str, Any], expected: str, what: str) -> None:
    """Refuse a checkpoint that is not ``expected``; one written by a version before onion sealing
    with a :class:`panpriv.streamer.errors.CheckpointError` naming the migration."""
    refuse_old_format(data)
    if data.get("format") != expected:
        raise ValueError(f"not {what} ({expected})")

Gate = Callable[[int, PrivacyReport], "str | None"]
"""Asked before round t is learned, with the statement that holds once it is: ``None`` to go on,
else why not (:meth:`panpriv.streamer.budget.session.BudgetSession.charge_step`)."""


def encode_state(state: Mapping[str, StateValue]) -> dict[str, Any]:
    return {k: {"array": v.tolist()} if isinstance(v, np.ndarray) else v for k, v in state.items()}


def decode_state(data: Mapping[str, Any]) -> dict[str, StateValue]:
    return {k: np.asarray(v["array"], dtype=np.float64) if isinstance(v, dict) else v for k, v in data.items()}


class AnalyzerCore:
    """What every E-S-A analyzer keeps (no I/O): its learner, keys, reject counters, input position,
    the digests of the batches it applied and the key of the current round; the batch checks that
    come before opening any unit; and the checkpoint fields they make. :class:`Analyzer` and
    :class:`panpriv.streamer.esa.sum_analyzer.SumAnalyzer` add what their learners need.

    ``verifier`` (:class:`panpriv.streamer.esa.batches.BatchVerifier`: the shuffler's verify keys
    and the deployment id) is bound by :meth:`bind` before the first batch."""

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
        self.newest_key = key_id(keys[0].public_key)
        self.rejected: Counter[str] = Counter()
        self.applied: list[str] = []
        self.offset = 0
        self.gate: Gate | None = None
        self.stopped: str | None = None
        self.last_valid = 0
        self.verifier: BatchVerifier | None = None
        self.deployment_id: str | None = None
        self._round_key: tuple[int, bytes] | None = None

    def bind(self, verifier: BatchVerifier) -> None:
        """Accept batches signed by ``verifier``'s keys for its deployment from now on; refuse a
        checkpoint of another deployment (:class:`panpriv.streamer.errors.CheckpointError`)."""
        if self.deployment_id is not None and self.deployment_id != verifier.deployment:
            raise CheckpointError(f"the analyzer checkpoint belongs to deployment {self.deployment_id}, this run reads "
                                  f"{verifier.deployment} (another cluster or messages topic): use another --out")
        self.verifier = verifier
        self.deployment_id = verifier.deployment

    @property
    def current_key(self) -> bytes:
        """The analyzer key the current round's model names: the newest key when the round began
        (module docstring, "Key of a round")."""
        if self._round_key is None or self._round_key[0] != self.round:
            self._round_key = (self.round, self.newest_key)
        return self._round_key[1]

    def _admit(self, value: bytes | None) -> wire.Batch | None:
        """The batch in ``value`` if it is signed by the shuffler for this deployment, new and of the
        current round; else ``None`` with the reason counted once (module docstring)."""
        if self.verifier is None:
            raise RuntimeError("the analyzer has no batch verifier: call bind() first")
        admitted = self.verifier.admit(value)
        if isinstance(admitted, str):
            self.rejected[admitted] += 1
            return None
        reason = ("duplicate_batch" if admitted.digest.hex() in self.applied else "replayed_batch"
                  if admitted.round < self.round else "out_of_order" if admitted.round > self.round else None)
        if reason is not None:
            self.rejected[reason] += 1
            return None
        return admitted

    def _unseal(self, item: bytes, size: int, seen: set[bytes]) -> tuple[bytes, bytes] | str:
        """(plaintext, key id) of one unit, or why it is rejected: wrong size or magic, a repeat
        within the batch, an unknown key, or a seal that does not open. ``seen`` collects the
        batch's seals."""
        try:
            ident, sealed = wire.parse_unit(item, size)
        except wire.WireError:
            return "malformed"
        if sealed in seen:
            return "duplicate_message"
        seen.add(sealed)
        box = self._boxes.get(ident)
        if box is None:
            return "unknown_key"
        try:
            return box.decrypt(sealed), ident
        except CryptoError:
            return "undecryptable"

    def _mark_applied(self, batch: wire.Batch) -> None:
        """Remember ``batch``'s digest; the round that now begins takes the newest key."""
        self.applied = [*self.applied[-(APPLIED_KEPT - 1):], batch.digest.hex()]
        self._round_key = (self.round, self.newest_key)

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
        """Noisy state, counters and position only (no message, no private key); ``privacy``: the
        statement to record (default :meth:`report`; the analyzer's service records the composed one)."""
        return {
            "deployment": DEPLOYMENT,
            "deployment_id": self.deployment_id,
            "name": self.name,
            "instance": self.instance,
            "config": self.learner.config(),
            "state": encode_state(self.learner.state_dict()),
            "offset": self.offset,
            "applied": self.applied,
            "rejected": dict(self.rejected),
            "round": self.round,
            "round_key": [self.round, self.current_key.hex()],
            "released": self.learner.release().tolist(),
            "privacy": (privacy or self.report()).to_dict(),
        }

    def _restore_fields(self, data: Mapping[str, Any]) -> None:
        """Counters, position and deployment; the current round keeps its key if it is still held."""
        self.offset = int(data["offset"])
        self.applied = list(data["applied"])
        self.rejected = Counter({k: int(v) for k, v in data["rejected"].items()})
        self.deployment_id = data.get("deployment_id")
        round_, key = data["round_key"]
        if bytes.fromhex(key) in self._boxes:
            self._round_key = (int(round_), bytes.fromhex(key))


class VectorAnalyzer(AnalyzerCore):
    """An analyzer of units each holding one vector of ``_params`` coordinates (``shuffle-gaussian``;
    ``checkin``'s updates, :mod:`panpriv.streamer.esa.checkin_analyzer`)."""

    _params: int
    _size: int

    def _open(self, batch: wire.Batch) -> np.ndarray:
        """The valid units of the batch as rows (k, p); every other one counted by reason."""
        rows = np.zeros((len(batch.units), self._params))
        seen: set[bytes] = set()
        k = 0
        for item in batch.units:
            reason = self._open_one(item, batch.round, seen, rows[k])
            if reason is None:
                k += 1
            else:
                rows[k].fill(0.0)
                self.rejected[reason] += 1
        return rows[:k]

    def _open_one(self, item: bytes, round_: int, seen: set[bytes], out: np.ndarray) -> str | None:
        opened = self._unseal(item, self._size, seen)
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
        self._size = wire.vector_unit_size(self._params)

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
        if len(batch.units) != self.learner.batch_size:
            self.rejected["wrong_batch_size"] += 1
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
        check_format(data, CHECKPOINT_FORMAT, "an analyzer checkpoint")
        learner = restore_learner(ShuffleGaussianSGD.name, data["config"], decode_state(data["state"]), None)
        assert isinstance(learner, ShuffleGaussianSGD)
        analyzer = cls(learner, keys, data["name"], data.get("instance"))
        analyzer._restore_fields(data)
        analyzer.min_valid = data["min_valid"]
        return analyzer
