"""Where snapshots (and, optionally, rejected messages) go.

A snapshot record is what leaves the service: released parameters (computed from noisy state
only), how many records contributed, the privacy report (numbers and a one-paragraph statement of
the guarantee, its unit and its assumptions), the source positions covered (offsets are public),
and the creation time. Fields::

    {"schema_version": 2, "sequence": 7, "instance": "pan-acsa-1f2e…", "learner": "pan-acsa",
     "records": 12000, "rejected": 3, "positions": {"topic/0": 4001, …}, "params": [...],
     "model": {"loss": {"name": "logistic", ...}, "link": "logistic", "intercept": false, "dim": 20,
               "feature_bound": 1.0, "clipping": "l2-ball", "feature_names": null},
     "privacy": {... PrivacyReport.to_dict(), including "statement" ...},
     "budget": {"store": "5f0c…", "generation": 1234},
     "created": "2026-11-22T10:00:00.000Z"}

``model`` (schema version 2; version-1 records lack it) is what serving the parameters needs
(:class:`panpriv.protocols.base.ModelSpec`): ``panpriv.streamer.serving.snapshots.load_snapshot(path).predict_many(X)`` and
``panpriv predict`` apply the same clipping as training. ``budget`` (absent in records of earlier
versions) is the budget store's id and generation when the snapshot was taken: a later run in the
same output directory refuses a store behind it (:mod:`panpriv.streamer.budget.session`).

Snapshots are emitted only after the checkpoint holding their records is durable (see
:mod:`panpriv.streamer.runtime.processor`), so after a crash the next snapshot's ``records`` is never smaller than
an earlier one's. ``sequence`` is the checkpoint sequence number it follows.

The JSONL sink appends one line per snapshot and fsyncs it. A crash in the middle of a write can
leave a partial last line; opening the sink again truncates it, so the file is always valid JSONL.
The Kafka sink produces the same JSON to a topic (acks=all, flushed before returning).

The dead-letter sink produces a rejected message's raw value to a topic with the reason in the
``panpriv-reject-reason`` header. It carries raw input, so it belongs to the input side (same
cluster, same access rules as the source topic) and is off unless configured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from panpriv.protocols.base import Snapshot
from panpriv.streamer.state.atomic_files import PRIVATE_DIRECTORY_MODE, PRIVATE_MODE, fsync_directory

SCHEMA_VERSION = 2
REASON_HEADER = "panpriv-reject-reason"


def snapshot_record(
    snapshot: Snapshot,
    *,
    sequence: int,
    instance: str,
    rejected: int,
    positions: Mapping[str, int],
    privacy: Mapping[str, Any],
    feature_names: tuple[str, ...] | None = None,
    budget: Mapping[str, Any] | None = None,
    max_epsilon: float | None = None,
) -> dict[str, Any]:
    """The JSON-ready snapshot record (module docstring); ``privacy`` is the ledger's report,
    ``feature_names`` the source's public feature names where it has them (Adult; a schema's
    names travel in the snapshot's model), ``budget`` the
    budget store's id and generation when the snapshot was taken (a later run refuses a store
    behind it), ``max_epsilon`` the budget limit the run was given (``--max-epsilon``; absent
    without one), which ``panpriv report`` draws beside the composed ε."""
    model = None
    if snapshot.model is not None:
        model = snapshot.model.to_dict()
        if feature_names is not None:  # else the model's own (a learner's declared schema)
            model["feature_names"] = list(feature_names)
    return {
        "schema_version": SCHEMA_VERSION,
        "sequence": sequence,
        "instance": instance,
        "learner": snapshot.learner,
        "records": snapshot.records,
        "rejected": rejected,
        "positions": dict(positions),
        "params": [float(v) for v in snapshot.params],
        "model": model,
        "privacy": dict(privacy),
        **({"budget": dict(budget)} if budget else {}),
        **({"max_epsilon": float(max_epsilon)} if max_epsilon is not None else {}),
        "created": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


class SnapshotSink(Protocol):
    def emit(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlSnapshotSink:
    """Append snapshot records to a JSONL file (0600), one fsync-ed line each."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(mode=PRIVATE_DIRECTORY_MODE, parents=True, exist_ok=True)
        repair_jsonl(self.path)
        existed = self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_MODE)
        try:
            os.fchmod(fd, PRIVATE_MODE)  # a file of an earlier version, created as the umask said
        except BaseException:
            os.close(fd)
            raise
        self._handle = os.fdopen(fd, "ab")
        if not existed:
            fsync_directory(self.path.parent)

    def emit(self, record: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(record, sort_keys=True, allow_nan=False).encode("utf-8") + b"\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def repair_jsonl(path: Path) -> None:
    """Truncate a partial last line (left by a crash mid-write), keeping every complete line."""
    try:
        with open(path, "rb+") as handle:
            data = handle.read()
            if not data or data.endswith(b"\n"):
                return
            handle.truncate(data.rfind(b"\n") + 1)
            handle.flush()
            os.fsync(handle.fileno())
    except FileNotFoundError:
        return


def read_snapshots(path: Path) -> list[dict[str, Any]]:
    """Every snapshot record of a JSONL file (a partial last line is ignored)."""
    records = []
    with open(path, "rb") as handle:
        for line in handle:
            if line.endswith(b"\n"):
                records.append(json.loads(line))
    return records


def last_budget_mark(path: Path) -> dict[str, Any] | None:
    """The ``budget`` mark of the last complete snapshot record in the JSONL file ``path`` (read
    from the end: the file grows for weeks), or ``None`` (no file, no complete record, no mark)."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None
    complete: list[bytes] = []
    with handle:
        position, tail = handle.seek(0, 2), b""
        while position > 0 and not complete:
            step = min(position, 1 << 16)
            position -= step
            handle.seek(position)
            tail = handle.read(step) + tail
            pieces = tail.split(b"\n")[:-1]  # after the last newline: a partial line, or nothing
            complete = [p for p in (pieces[1:] if position > 0 else pieces) if p.strip()]
    if not complete:
        return None
    try:
        mark = json.loads(complete[-1]).get("budget")
    except (ValueError, AttributeError):
        return None
    return mark if isinstance(mark, dict) else None


class KafkaSnapshotSink:
    """Produce snapshot records as JSON to ``topic`` (acks=all; each emit waits for the broker)."""

    def __init__(self, bootstrap: list[str], topic: str) -> None:
        from panpriv.streamer.kafka import client as kafka_client

        self.topic = topic
        self._producer = kafka_client.producer(bootstrap, acks="all", client_id="panpriv-snapshots")

    def emit(self, record: Mapping[str, Any]) -> None:
        value = json.dumps(record, sort_keys=True, allow_nan=False).encode("utf-8")
        self._producer.send(self.topic, value=value, key=str(record["instance"]).encode()).get(timeout=30)

    def close(self) -> None:
        self._producer.close()


class DeadLetterSink:
    """Produce rejected messages, unchanged, to ``topic`` with the reason in a header."""

    def __init__(self, bootstrap: list[str], topic: str) -> None:
        from panpriv.streamer.kafka import client as kafka_client

        self.topic = topic
        self._producer = kafka_client.producer(bootstrap, acks="all", client_id="panpriv-dead-letters")

    def send(self, value: bytes, reason: str, key: str, position: int) -> None:
        headers = [
            (REASON_HEADER, reason.encode()),
            ("panpriv-source", key.encode()),
            ("panpriv-offset", str(position).encode()),
        ]
        self._producer.send(self.topic, value=value, headers=headers)

    def flush(self) -> None:
        """Wait until every sent message is acknowledged (called before each checkpoint)."""
        self._producer.flush(timeout=30)

    def close(self) -> None:
        self._producer.close()
