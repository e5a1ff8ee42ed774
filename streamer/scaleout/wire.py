"""The records of the scale-out topics (JSON; every field public or noisy).

*Gradients topic* (one partition, so the coordinator reads one order), key = deployment::

    {"format": "panpriv-scaleout-gradient/1", "deployment": ..., "version": v, "worker": <instance>,
     "records": w, "gradient": [...], "ranges": {<data key>: [start, stop], ...}}

``gradient`` is a worker's noisy batch mean (Cheu et al. 2022 Alg. 6 lines 4–9: both draws added);
``ranges`` are the positions the batch read (public, like every offset in panpriv). On the same
topic, a worker's *open-batch lease* (:class:`BatchOpen`), renewed while its batch at ``version`` is
open, so that the other workers leave the version's last places to it and the coordinator can say
whom it waits for::

    {"format": "panpriv-scaleout-open/1", "deployment": ..., "version": v, "worker": <instance>,
     "filled": f, "size": w, "renew_s": r, "claim": bool, "withdrawn": bool}

``filled`` is the count of valid records in the batch so far (public, like every count of records
read). The first record of a lease is its *claim* (``claim``: its offset orders it among the
version's places, :mod:`panpriv.streamer.scaleout.tally`); a worker whose claim found no place
*withdraws* it (``withdrawn``). Records written before claims existed (neither field) are renewals.

*Model topic* (compacted, one partition), key = deployment: the coordinator's whole state after
version v — all of it post-processing of noisy means — so that a restarted coordinator resumes
from it and workers load θ^md_v from it::

    {"format": "panpriv-scaleout-model/1", "deployment": ..., "learner": "pan-acsa", "version": v,
     "workers": K, "worker_batch": w, "config": {...}, "state": {...}, "theta_ag": [...],
     "gradients_offset": o, "records": n, "stale": s, "done": bool, "abandoned": "...", "privacy": "..."}

``done`` says the plan finished; ``abandoned`` (non-empty) that the coordinator gave the plan up,
and why (:class:`~panpriv.streamer.errors.PlanStalled`): either way the workers stop (exit 0 when
done, 4 when abandoned). A restarted coordinator republishes its version without it.

``learner`` is the catalogue name of a :class:`~panpriv.protocols.batch_worker.BatchWorkerLearner`
(records written before it existed are ``pan-acsa``'s); workers build it from ``config`` through
the one factory (:func:`panpriv.streamer.runtime.learners.from_public_config`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.base import StateValue
from panpriv.streamer.kafka.topic_reader import MALFORMED

GRADIENT_FORMAT = "panpriv-scaleout-gradient/1"
OPEN_FORMAT = "panpriv-scaleout-open/1"
MODEL_FORMAT = "panpriv-scaleout-model/1"

Array = NDArray[np.float64]


class WireError(ValueError):
    """A record that is not a well-formed scale-out record."""


def _integer(value: Any) -> int:
    """A JSON integer of a mean (``true`` or ``2.0`` is not one: ``int()`` would turn a copy of
    the real mean with ``"version": true`` into the real mean of version 1, learned twice)."""
    if type(value) is not int:
        raise WireError(f"{value!r} is not an integer")
    return value


@dataclass(frozen=True)
class GradientRecord:
    """One worker's noisy mean of one batch, computed at model version ``version``."""

    deployment: str
    version: int
    worker: str
    records: int
    gradient: Array
    ranges: Mapping[str, tuple[int, int]]

    def to_json(self) -> bytes:
        return json.dumps({
            "format": GRADIENT_FORMAT, "deployment": self.deployment, "version": self.version, "worker": self.worker,
            "records": self.records, "gradient": [float(v) for v in self.gradient],
            "ranges": {k: [int(a), int(b)] for k, (a, b) in self.ranges.items()},
        }, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | None) -> GradientRecord:
        try:
            value = json.loads(data or b"")
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
            raise WireError(f"malformed gradient record: {exc}") from None
        return cls.from_value(value)

    @classmethod
    def from_value(cls, value: Any) -> GradientRecord:
        """The record of a decoded JSON value (:class:`WireError` if it is not one)."""
        try:
            if value.get("format") != GRADIENT_FORMAT:
                raise WireError(f"not a {GRADIENT_FORMAT} record")
            gradient = np.asarray(value["gradient"], dtype=np.float64)
            if gradient.ndim != 1 or not np.all(np.isfinite(gradient)):
                raise WireError("gradient must be a vector of finite floats")
            ranges = {str(k): (_integer(a), _integer(b)) for k, (a, b) in value["ranges"].items()}
            records = _integer(value["records"])
            if not all(0 <= a < b for a, b in ranges.values()) or sum(b - a for a, b in ranges.values()) < records:
                # A mean whose ranges do not hold its records would be published with no (or too
                # little) charge to check against: the ledger's "every published range charged".
                raise WireError("the mean's ranges do not hold its records")
            return cls(str(value["deployment"]), _integer(value["version"]), str(value["worker"]), records, gradient, ranges)
        except MALFORMED as exc:
            if isinstance(exc, WireError):
                raise
            raise WireError(f"malformed gradient record: {exc}") from None


@dataclass(frozen=True)
class BatchOpen:
    """A worker's lease on a place at ``version``: it holds an open batch there (``filled`` of
    ``size`` records) and renews this record every ``renew_s`` seconds until it publishes or hands
    the batch back (:mod:`panpriv.streamer.scaleout.tally`). ``claim``: the lease's first record,
    sent before the worker reads a record for the batch; ``withdrawn``: the claim found no place."""

    deployment: str
    version: int
    worker: str
    filled: int
    size: int
    renew_s: float
    claim: bool = False
    withdrawn: bool = False

    def to_json(self) -> bytes:
        return json.dumps({"format": OPEN_FORMAT, "deployment": self.deployment, "version": self.version,
                           "worker": self.worker, "filled": self.filled, "size": self.size, "renew_s": self.renew_s,
                           "claim": self.claim, "withdrawn": self.withdrawn}, sort_keys=True).encode()


def gradients_topic_record(data: bytes | None) -> GradientRecord | BatchOpen:
    """A record of the gradients topic: a noisy mean or an open-batch lease (:class:`WireError` if neither)."""
    try:
        value = json.loads(data or b"")
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the parser's depth
        raise WireError(f"malformed gradient record: {exc}") from None
    if not (isinstance(value, dict) and value.get("format") == OPEN_FORMAT):
        return GradientRecord.from_value(value)
    try:
        renew_s = float(value["renew_s"])
        if not 0 < renew_s < 3600:
            raise WireError("renew_s must be in (0, 3600) seconds")
        return BatchOpen(str(value["deployment"]), _integer(value["version"]), str(value["worker"]), _integer(value["filled"]),
                         _integer(value["size"]), renew_s, value.get("claim") is True, value.get("withdrawn") is True)
    except MALFORMED as exc:  # OverflowError too: int(Infinity)
        if isinstance(exc, WireError):
            raise
        raise WireError(f"malformed open-batch record: {exc}") from None


def encode_state(state: Mapping[str, StateValue]) -> dict[str, Any]:
    """A learner state dict as JSON values: float arrays as lists of floats, integer arrays (the
    secure mode's grid-unit accumulator) as lists of ints, flagged so that they decode as int64."""
    encoded: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            encoded[key] = {"array": [int(x) for x in value], "int": True}
        elif isinstance(value, np.ndarray):
            encoded[key] = {"array": [float(x) for x in value]}
        else:
            encoded[key] = value
    return encoded


def decode_state(data: Mapping[str, Any]) -> dict[str, StateValue]:
    """The inverse of :func:`encode_state`."""
    decoded: dict[str, StateValue] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if value.get("int"):
                decoded[key] = np.asarray(value["array"], dtype=np.int64)
            else:
                decoded[key] = np.asarray(value["array"], dtype=np.float64)
        else:
            decoded[key] = value
    return decoded


def query_state(state: Mapping[str, Any]) -> dict[str, StateValue]:
    """A model record's state for a worker: the coordinator's iterates and counters with the
    accumulator zeroed (a worker opens its own batches), in the accumulator's own dtype."""
    decoded = decode_state(state)
    for key in ("grad", "grad_units"):
        value = decoded.get(key)
        if isinstance(value, np.ndarray):
            value.fill(0)
    return decoded


@dataclass(frozen=True)
class ModelVersion:
    """The coordinator's public state after ``version`` steps (module docstring)."""

    deployment: str
    version: int
    workers: int
    worker_batch: int
    config: Mapping[str, Any]
    state: Mapping[str, Any]
    theta_ag: Array
    gradients_offset: int
    records: int
    stale: int = 0
    done: bool = False
    privacy: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    learner: str = "pan-acsa"
    abandoned: str = ""

    def to_json(self) -> bytes:
        return json.dumps({
            "format": MODEL_FORMAT, "deployment": self.deployment, "learner": self.learner, "version": self.version,
            "workers": self.workers,
            "worker_batch": self.worker_batch, "config": dict(self.config), "state": dict(self.state),
            "theta_ag": [float(v) for v in self.theta_ag], "gradients_offset": self.gradients_offset,
            "records": self.records, "stale": self.stale, "done": self.done, "privacy": self.privacy,
            "extra": dict(self.extra), "abandoned": self.abandoned,
        }, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ModelVersion:
        value = json.loads(data)
        if value.get("format") != MODEL_FORMAT:
            raise WireError(f"not a {MODEL_FORMAT} record (format {value.get('format')!r})")
        return cls(str(value["deployment"]), int(value["version"]), int(value["workers"]), int(value["worker_batch"]),
                   value["config"], value["state"], np.asarray(value["theta_ag"], dtype=np.float64),
                   int(value["gradients_offset"]), int(value["records"]), int(value.get("stale", 0)),
                   bool(value.get("done", False)), str(value.get("privacy", "")), value.get("extra", {}),
                   str(value.get("learner", "pan-acsa")), str(value.get("abandoned", "")))


def scaleout_topics(gradients: str, model: str) -> list[Any]:
    """The topics of a scale-out model both roles name, with the layout they need (created if
    missing, another partition count of the gradients topic refused: :mod:`panpriv.streamer.kafka.topics`)."""
    from panpriv.streamer.kafka.topics import TopicSpec

    return [TopicSpec(gradients, "coordinator", "it reads the workers' noisy means in one order, from partition 0"),
            TopicSpec(model, "coordinator", "its newest record per deployment is the model's whole state", partitions=None,
                      compacted=True)]


class ModelReader:
    """The newest record of one deployment on the (compacted) model topic, by version
    (:class:`panpriv.streamer.kafka.topic_reader.NewestRecord`: the caught-up rule; malformed
    records are skipped)."""

    def __init__(self, bootstrap: list[str], topic: str, deployment: str) -> None:
        from panpriv.streamer.kafka import client as kafka_client
        from panpriv.streamer.kafka.topic_reader import NewestRecord

        self.deployment = deployment
        consumer = kafka_client.consumer(bootstrap, enable_auto_commit=False, group_id=None)
        self._newest = NewestRecord(consumer, topic, self._parse, lambda model: model.version)

    def _parse(self, value: bytes) -> ModelVersion | None:
        model = ModelVersion.from_json(value)
        return model if model.deployment == self.deployment else None

    @property
    def best(self) -> ModelVersion | None:
        return self._newest.newest

    def poll(self, timeout_ms: int = 0) -> ModelVersion | None:
        """Take what arrived (waiting at most ``timeout_ms``); the newest record so far."""
        return self._newest.poll(timeout_ms)

    def read_to_end(self, timeout_s: float = 30.0) -> ModelVersion | None:
        """The newest record once the topic is read to its end."""
        return self._newest.current(timeout_s)

    def close(self) -> None:
        self._newest.close()
