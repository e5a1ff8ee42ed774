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
(:class:`UnknownModelFormat`, naming the upgrade). On the topic such a record is skipped like any
record that does not parse (a migrated deployment's newer records follow it); a watcher that found
no record of this format but one of the format before refuses (:class:`ModelWatcher`).
"""

from __future__ import annotations

import json
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
    """The record with the highest round on the model topic, read from its beginning
    (:class:`panpriv.streamer.kafka.topic_reader.NewestRecord`: the caught-up rule; a malformed
    record is skipped, not fatal). If the deployment has records of the format before onion sealing
    only, :meth:`current` and :meth:`wait_for` raise :class:`UnknownModelFormat` (the analyzer is to
    be upgraded) instead of returning nothing or timing out.

    Parameters
    ----------
    bootstrap, topic
        Where the analyzer publishes.
    deployment
        Only records of this deployment name (``None``: any).
    consumer
        A group-less consumer to read with, closed by :meth:`close`: a role of the service passes
        one built by :func:`panpriv.streamer.kafka.client.consumer` (the roles' short fetch wait:
        the check-in shuffler reads the topic to its end before every slot's release). ``None``
        (a client): a ``kafka.KafkaConsumer`` with kafka-python's fetch wait (500 ms). A client
        waits only for the next model, which Apache Kafka hands over as soon as it is written
        whatever the wait; a shorter one would multiply every waiting client's idle fetch
        requests (:data:`panpriv.streamer.kafka.client.FETCH_WAIT_MS`).
    options
        More ``kafka.KafkaConsumer`` options (security) when ``consumer`` is ``None``.
    """

    def __init__(self, bootstrap: str | list[str], topic: str, deployment: str | None = None, consumer: Any = None,
                 **options: Any) -> None:
        from kafka import KafkaConsumer

        from panpriv.streamer.kafka.topic_reader import NewestRecord

        self.topic, self.deployment = topic, deployment
        self.refused: UnknownModelFormat | None = None  # a record of this deployment in another format
        if consumer is None:
            consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **options)
        self._newest = NewestRecord(consumer, topic, self._parse, lambda model: model.round)

    def _parse(self, value: bytes) -> ModelRecord | None:
        try:
            model = ModelRecord.from_json(value)
        except UnknownModelFormat as exc:
            if self.deployment is None or json.loads(value).get("deployment") == self.deployment:
                self.refused = exc
            raise
        return model if self.deployment is None or model.deployment == self.deployment else None

    @property
    def best(self) -> ModelRecord | None:
        return self._newest.newest

    def current(self, timeout_s: float = 10.0) -> ModelRecord | None:
        """The newest record once the topic is read to its end (:class:`UnknownModelFormat` if the
        deployment's records are all of another format)."""
        newest = self._newest.current(timeout_s)
        if newest is None and self.refused is not None:
            raise self.refused
        return newest

    def wait_for(self, at_least: int, timeout_s: float = 60.0) -> ModelRecord:
        """The newest record once its round is ≥ ``at_least``; ``TimeoutError`` after ``timeout_s``
        (:class:`UnknownModelFormat` if the deployment's records are all of another format)."""
        try:
            return self._newest.wait_for(at_least, timeout_s)
        except TimeoutError:
            if self._newest.newest is None and self.refused is not None:
                raise self.refused from None
            raise

    def close(self) -> None:
        self._newest.close()


def latest(bootstrap: str | list[str], topic: str, deployment: str | None = None, timeout_s: float = 10.0,
           **options: Any) -> ModelRecord | None:
    """The record with the highest round on ``topic`` now (one-off :class:`ModelWatcher`)."""
    watcher = ModelWatcher(bootstrap, topic, deployment, **options)
    try:
        return watcher.current(timeout_s)
    finally:
        watcher.close()
