"""``panpriv analyze``: the analyzer of Encode–Shuffle–Analyze for ``shuffle-gaussian`` (Bittau et
al. 2017 §3; Liew & Takahashi 2022 §5.2 for the analysis).

It reads shuffled batches (:mod:`streamer.esa.wire`) from the shuffled topic, and for the batch of
the current round t: opens every message with the private key its key id names, keeps the valid
ones, takes one SGD step on their mean (:meth:`ShuffleGaussianSGD.learn_round`), checkpoints, and
publishes the model of round t + 1 to the model topic (:mod:`streamer.esa.model`).

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

**What it holds.** The model, the counters, the private keys and, while a batch is analysed, the
batch's decrypted noisy messages (zeroed after the step). Never a raw record: clients send none
(tested by a canary scan of the process and its files, ``tests/esa``). The statement is
:func:`streamer.esa.deployment.esa_report`.
"""

from __future__ import annotations

import json
import logging
import signal
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox

from accounting.ledger import PrivacyReport
from protocols.base import StateValue
from protocols.shuffle_gaussian import ShuffleGaussianSGD
from streamer.esa import wire
from streamer.esa.deployment import DEPLOYMENT, esa_report
from streamer.esa.keys import key_id
from streamer.esa.model import ModelRecord

log = logging.getLogger("panpriv.analyze")

CHECKPOINT_FORMAT = "panpriv-esa-analyzer/1"
APPLIED_KEPT = 1024
"""Batch ids remembered for ``duplicate_batch`` (a duplicate follows its original closely)."""


def _encode_state(state: Mapping[str, StateValue]) -> dict[str, Any]:
    return {k: {"array": v.tolist()} if isinstance(v, np.ndarray) else v for k, v in state.items()}


def _decode_state(data: Mapping[str, Any]) -> dict[str, StateValue]:
    return {k: np.asarray(v["array"], dtype=np.float64) if isinstance(v, dict) else v for k, v in data.items()}


class Analyzer:
    """The analyzer's state machine (no I/O): learner, keys, counters, input position.

    Parameters
    ----------
    learner
        A ``shuffle-gaussian`` learner with ``participation="all"``.
    keys
        The private keys it may use; the first is the one it asks clients to use now.
    name
        The deployment instance's name (the model records' key and ``deployment`` field).
    """

    def __init__(self, learner: ShuffleGaussianSGD, keys: list[PrivateKey], name: str) -> None:
        if learner.participation != "all" or learner.batch_size is None:
            raise ValueError("the ESA analyzer runs shuffle-gaussian with participation 'all'")
        if not keys:
            raise ValueError("the analyzer needs at least one private key")
        self.learner = learner
        self.name = name
        self._boxes = {key_id(k.public_key): SealedBox(k) for k in keys}
        self.current_key = key_id(keys[0].public_key)
        self.rejected: Counter[str] = Counter()
        self.applied: list[str] = []
        self.offset = 0
        self.min_valid: int | None = None
        self._params = int(learner.calibration()["params"])
        self._size = wire.message_size(self._params)

    @property
    def round(self) -> int:
        return self.learner.rounds_done

    def handle(self, value: bytes | None) -> bool:
        """Analyse one record of the shuffled topic; True if it was the current round's batch (a step)."""
        try:
            batch = wire.parse_batch(value or b"")
        except wire.WireError:
            self.rejected["malformed_batch"] += 1
            return False
        if batch.id.hex() in self.applied:
            self.rejected["duplicate_batch"] += 1
            return False
        if batch.round != self.round:
            self.rejected["stale_round"] += len(batch.messages)
            return False
        if len(batch.messages) != self.learner.batch_size:
            self.rejected["wrong_batch_size"] += len(batch.messages)
            return False
        vectors = self._open(batch)
        try:
            self.learner.learn_round(vectors)
        finally:
            vectors.fill(0.0)
        valid = vectors.shape[0]
        self.min_valid = valid if self.min_valid is None else min(self.min_valid, valid)
        self.applied = [*self.applied[-(APPLIED_KEPT - 1):], batch.id.hex()]
        return True

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
        if len(item) != self._size:
            return "malformed"
        try:
            header, sealed = wire.parse_message(item)
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
            inner_round, vector = wire.parse_plaintext(box.decrypt(sealed), self._params)
        except CryptoError:
            return "undecryptable"
        except wire.WireError:
            return "malformed"
        if inner_round != round_:
            return "round_mismatch"
        if not np.all(np.isfinite(vector)):
            return "non_finite"
        out[...] = vector
        vector.fill(0.0)
        return None

    def model(self) -> ModelRecord:
        """The public model record of the current round."""
        local = self.learner.local_guarantee()
        return ModelRecord("shuffle-gaussian", self.name, self.round, self.learner.theta, self.learner.calibration(),
                           self.current_key.hex(), (local.epsilon, local.delta))

    def report(self) -> PrivacyReport:
        """The statement of this deployment (:func:`streamer.esa.deployment.esa_report`)."""
        return esa_report(self.learner, self.min_valid)

    def checkpoint(self) -> dict[str, Any]:
        """Noisy state, counters and position only (no message, no key)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "deployment": DEPLOYMENT,
            "name": self.name,
            "config": self.learner.config(),
            "state": _encode_state(self.learner.state_dict()),
            "offset": self.offset,
            "applied": self.applied,
            "rejected": dict(self.rejected),
            "min_valid": self.min_valid,
            "round": self.round,
            "released": self.learner.release().tolist(),
            "privacy": self.report().to_dict(),
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any], keys: list[PrivateKey]) -> Analyzer:
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not an analyzer checkpoint ({CHECKPOINT_FORMAT})")
        learner = ShuffleGaussianSGD.from_state_dict(data["config"], _decode_state(data["state"]))
        analyzer = cls(learner, keys, data["name"])
        analyzer.offset = int(data["offset"])
        analyzer.applied = list(data["applied"])
        analyzer.rejected = Counter({k: int(v) for k, v in data["rejected"].items()})
        analyzer.min_valid = data["min_valid"]
        return analyzer


@dataclass
class AnalyzeOptions:
    """What ``panpriv analyze`` needs (``learner`` is used only when ``out`` holds no checkpoint)."""

    bootstrap: list[str]
    shuffled_topic: str
    model_topic: str
    keys: list[PrivateKey]
    out: Path
    learner: Callable[[], ShuffleGaussianSGD]
    name: str = "default"
    max_rounds: int | None = None


def checkpoint_path(out: Path) -> Path:
    return out / "analyzer.json"


def run(options: AnalyzeOptions) -> Analyzer:
    """Serve until SIGTERM/SIGINT or ``max_rounds`` rounds are done; return the final state."""
    from kafka import TopicPartition

    from streamer import kafka_client
    from streamer.safefiles import write_atomically

    stopping = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["now"] = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    options.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = checkpoint_path(options.out)
    if path.exists():
        analyzer = Analyzer.restore(json.loads(path.read_bytes()), options.keys)
        log.info("analyzer: resumed at round %d, shuffled offset %d", analyzer.round, analyzer.offset)
    else:
        analyzer = Analyzer(options.learner(), options.keys, options.name)
        write_atomically(path, json.dumps(analyzer.checkpoint()).encode(), "analyzer checkpoint")
    producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0)
    consumer = kafka_client.consumer(options.bootstrap, group_id=None, enable_auto_commit=False,
                                     max_partition_fetch_bytes=256 * 1024 * 1024, fetch_max_bytes=256 * 1024 * 1024)

    def publish() -> None:
        producer.send(options.model_topic, key=analyzer.name.encode(), value=analyzer.model().to_json()).get(timeout=60)

    try:
        tp = TopicPartition(options.shuffled_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, analyzer.offset)
        publish()
        log.info("analyzer: round %d published; %s", analyzer.round, analyzer.report().statement())
        while not stopping["now"]:
            if options.max_rounds is not None and analyzer.round >= options.max_rounds:
                break
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    if record.offset < analyzer.offset:
                        continue
                    stepped = analyzer.handle(record.value)
                    analyzer.offset = record.offset + 1
                    write_atomically(path, json.dumps(analyzer.checkpoint()).encode(), "analyzer checkpoint")
                    if stepped:
                        publish()
                        log.info("analyzer: round %d done, model of round %d published", analyzer.round - 1, analyzer.round)
                    else:
                        log.info("analyzer: record %d not applied; rejected so far %s", record.offset, dict(analyzer.rejected))
    finally:
        producer.close()
        consumer.close()
    log.info("analyzer stopped at round %d; rejected %s", analyzer.round, dict(analyzer.rejected) or "none")
    return analyzer
