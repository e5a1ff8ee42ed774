"""The public model record of a round, on the compacted model topic (Bittau et al. 2017 §3: the
analyzer's released output; Cheu et al. 2022 Def. 2.7: a sequentially interactive protocol in which
round t's users answer at the model θ_t).

One JSON value per round, keyed ``<deployment>`` so that compaction keeps the latest::

    {"format": "panpriv-esa-model/2", "learner": "shuffle-gaussian", "deployment": "...",
     "round": t, "theta": [...], "calibration": {...}, "key_id": "<hex>",
     "local_guarantee": [eps0, delta]}

Everything in it is public: θ_t is post-processing of earlier rounds' shuffled messages, the
calibration is configuration. Clients read the topic to its end and use the record with the
highest round (:func:`latest`).

Format 2 is that of onion-sealed messages (:mod:`panpriv.streamer.esa.wire`): a client of the format
before refuses it (so it never sends a message sealed to the analyzer alone to a deployment whose
statement counts on onion sealing), and a client of this format refuses a record of format 1
(:class:`UnknownModelFormat`, naming the upgrade).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

FORMAT = "panpriv-esa-model/2"
LEGACY_FORMAT = "panpriv-esa-model/1"


class UnknownModelFormat(ValueError):
    """A model record of another format (one written before onion sealing: the analyzer needs upgrading)."""


@dataclass(frozen=True)
class ModelRecord:
    """The public model of one round and what a client needs to answer it."""

    learner: str
    deployment: str
    round: int
    theta: NDArray[np.float64]
    calibration: Mapping[str, Any]
    key_id: str
    local_guarantee: tuple[float, float]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "learner": self.learner,
                "deployment": self.deployment,
                "round": self.round,
                "theta": [float(v) for v in self.theta],
                "calibration": dict(self.calibration),
                "key_id": self.key_id,
                "local_guarantee": list(self.local_guarantee),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ModelRecord:
        value = json.loads(data)
        if value.get("format") == LEGACY_FORMAT:
            raise UnknownModelFormat(f"the model topic holds {LEGACY_FORMAT} records, written by an analyzer from before "
                                     "onion-sealed messages and signed batches: it must be upgraded (and the deployment "
                                     "migrated) before this client answers")
        if value.get("format") != FORMAT:
            raise UnknownModelFormat(f"not a {FORMAT} record (format {value.get('format')!r})")
        theta = np.asarray(value["theta"], dtype=np.float64)
        if theta.shape != (int(value["calibration"]["params"]),):
            raise ValueError("model record: theta does not have the calibration's parameter count")
        eps, delta = value["local_guarantee"]
        return cls(value["learner"], value["deployment"], int(value["round"]), theta, value["calibration"],
                   value["key_id"], (float(eps), float(delta)))


class ModelWatcher:
    """A consumer of the whole model topic that keeps the record with the highest round.

    Parameters
    ----------
    bootstrap, topic
        Where the analyzer publishes.
    deployment
        Only records of this deployment name (``None``: any).
    options
        More ``kafka.KafkaConsumer`` options (security).
    """

    def __init__(self, bootstrap: str | list[str], topic: str, deployment: str | None = None, **options: Any) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic, self.deployment = topic, deployment
        self.best: ModelRecord | None = None
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **options)
        partitions = self._consumer.partitions_for_topic(topic) or {0}
        self._assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._assigned)
        self._consumer.seek_to_beginning(*self._assigned)

    def _take(self, timeout_ms: int) -> None:
        for records in self._consumer.poll(timeout_ms=timeout_ms).values():
            for record in records:
                if record.value is None:
                    continue
                model = ModelRecord.from_json(record.value)
                if self.deployment is not None and model.deployment != self.deployment:
                    continue
                if self.best is None or model.round >= self.best.round:
                    self.best = model

    def current(self, timeout_s: float = 10.0) -> ModelRecord | None:
        """The best record once every partition is read to its end offset at the call."""
        ends = self._consumer.end_offsets(self._assigned)
        deadline = time.monotonic() + timeout_s
        while any(self._consumer.position(tp) < ends[tp] for tp in self._assigned):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read the model topic {self.topic} to its end within {timeout_s:g} s")
            self._take(100)
        return self.best

    def wait_for(self, at_least: int, timeout_s: float = 60.0) -> ModelRecord:
        """The best record once its round is ≥ ``at_least``; ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.best is None or self.best.round < at_least:
            if time.monotonic() > deadline:
                seen = "none" if self.best is None else self.best.round
                raise TimeoutError(f"no model of round >= {at_least} on {self.topic} within {timeout_s:g} s (latest: {seen})")
            self._take(100)
        return self.best

    def close(self) -> None:
        self._consumer.close()


def latest(bootstrap: str | list[str], topic: str, deployment: str | None = None, timeout_s: float = 10.0,
           **options: Any) -> ModelRecord | None:
    """The record with the highest round on ``topic`` now (one-off :class:`ModelWatcher`)."""
    watcher = ModelWatcher(bootstrap, topic, deployment, **options)
    try:
        return watcher.current(timeout_s)
    finally:
        watcher.close()
