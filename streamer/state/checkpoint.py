"""Checkpoints: one manifest, written atomically, holding everything a resumed run needs.

The manifest (``<out>/checkpoints/checkpoint.json``) holds the learner's noisy state and
constructor config, the next unread position of every source key, the privacy ledger, the reject
counters, the privacy-relevant configuration and its hash, and a schema version. It never holds
generator state (learners do not put it in ``state_dict``) and never a raw record: the manifest is
built from the learner's ``state_dict`` (noisy arrays and counters only), positions (public) and
counts (public).

Atomicity (quix-streams' order): the JSON is written to a temporary file in the same directory,
flushed and ``fsync``-ed, moved over the manifest with ``os.replace`` (atomic on POSIX), and the
directory is ``fsync``-ed so the rename itself is durable. A crash at any point leaves either the
previous manifest or the new one, never a mix; a leftover temporary file is ignored and replaced
(never followed if it is a symlink; :mod:`panpriv.streamer.state.atomic_files`). A failed write (disk full)
removes the temporary file and leaves the previous manifest.

Integrity (:mod:`panpriv.streamer.state.integrity`): the manifest carries the SHA-256 of its canonical content,
verified on load with a strict schema check, so a corrupted manifest is refused, never resumed.

Arrays are stored exactly (raw little-endian bytes, base64) so a resumed learner continues from
bit-identical state. Neither writing nor reading makes a Python string or bytes copy of them: the
manifest is assembled in, and read into, a buffer that is zeroed once written or parsed
(:func:`panpriv.streamer.state.integrity.seal_document`), and the learner-state arrays handed to the
writer are zeroed after the write. The previous manifest's file, replaced by ``os.replace``, is
overwritten with zeros once the new one is durable (:func:`panpriv.streamer.state.atomic_files.write_atomically`),
so its blocks do not stay on a disk that overwrites in place.

What a manifest can hold is a function of what was released: the learner's ``state_dict`` —
for ``pan-acsa`` the state at its last batch boundary, never the open batch's accumulator
(:meth:`panpriv.protocols.base.Learner.records_to_boundary`) — and public positions and counts
(docs/privacy.md, "Checkpoints on disk").
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from panpriv.streamer.config import describe_changes
from panpriv.streamer.errors import CheckpointError
from panpriv.streamer.state.atomic_files import write_atomically
from panpriv.streamer.state.integrity import check_ledger, check_schema, open_document, seal_document
from panpriv.streamer.state.lock import prepare_output_directory
from panpriv.streamer.state.owned_bytes import read_owned

SCHEMA_VERSION = 1
MANIFEST_NAME = "checkpoint.json"
SOURCE_MARKS_KEY = "source_marks"
"""The key of a Kafka source's marks in the manifest's ``extra`` object."""
BUDGET_MARK_KEY = "budget"
"""The key of the budget store's mark (id and generation) in the manifest's ``extra`` object."""
PARTIAL_KEY = "partial_rows"
"""The key, in ``extra``, of the rows of a message already in the learner state (see :class:`Checkpoint`)."""


@dataclass(frozen=True)
class ReplayMarks:
    """Where a learner that reads a recording by index stands in its passes (:mod:`panpriv.streamer.runtime.recorded_driver`).

    ``passes_charged``: passes whose ledger instance was charged with the whole recording;
    ``restart``: the checkpoint holds the state at the start of an interrupted pass (a learner
    that cannot resume mid-pass), so the resumed run restarts that pass under a new instance."""

    passes_charged: int
    restart: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"passes_charged": self.passes_charged, **({"restart": True} if self.restart else {})}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ReplayMarks:
        return cls(passes_charged=int(body.get("passes_charged", 0)), restart=bool(body.get("restart", False)))


@dataclass(frozen=True)
class Checkpoint:
    """The content of one manifest (see the module docstring).

    Beyond the learner, positions, ledger and counters, a manifest holds what a resume needs to
    continue the run's bookkeeping: ``snapshot_records`` (records covered by the last snapshot;
    -1 before the first), ``replay`` (a recorded learner's pass marks, ``None`` for stream
    learners), ``source_marks`` (a Kafka source's timestamps of the last records before the
    positions, for the offset-regression check of :mod:`panpriv.streamer.kafka.calls`) and
    ``budget_mark`` (the budget store's id and generation when the checkpoint was taken: a resume
    refuses a store behind it, :mod:`panpriv.streamer.budget.session`). On disk these live in the
    manifest's ``extra`` object, under the same keys since schema version 1 (``budget`` since
    content-keyed budgets; older manifests have none).

    ``partial`` (``extra["partial_rows"]``): for a source key whose position points into a
    message that holds several records (a binary batch) of which the learner state already has
    the first ``partial[key]`` valid rows — a batch boundary of ``pan-acsa`` fell inside that
    message (:meth:`panpriv.protocols.base.Learner.records_to_boundary`). A resumed run re-reads the
    message and skips those rows (:mod:`panpriv.streamer.runtime.stream_driver`).
    """

    sequence: int
    created: float
    instance: str
    learner: str
    learner_config: dict[str, Any]
    learner_state: dict[str, Any]
    positions: dict[str, int]
    ledger: dict[str, Any]
    rejects: dict[str, int]
    records: int
    snapshots: int
    config_hash: str
    privacy_config: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    finished: bool = False
    snapshot_records: int = -1
    replay: ReplayMarks | None = None
    source_marks: dict[str, int] = field(default_factory=dict)
    budget_mark: dict[str, Any] = field(default_factory=dict)
    partial: dict[str, int] = field(default_factory=dict)

    def extra(self) -> dict[str, Any]:
        """The manifest's ``extra`` object (the layout of schema version 1)."""
        extra: dict[str, Any] = {"snapshot_records": self.snapshot_records}
        if self.replay is not None:
            extra["replay"] = self.replay.to_dict()
        if self.source_marks:
            extra[SOURCE_MARKS_KEY] = dict(self.source_marks)
        if self.budget_mark:
            extra[BUDGET_MARK_KEY] = dict(self.budget_mark)
        if self.partial:
            extra[PARTIAL_KEY] = dict(self.partial)
        return extra

    def to_body(self) -> dict[str, Any]:
        """The manifest's content, learner-state arrays as numpy arrays (sealed and serialised by
        :func:`panpriv.streamer.state.integrity.seal_document`)."""
        return {
            "schema_version": self.schema_version,
            "sequence": self.sequence,
            "created": self.created,
            "finished": self.finished,
            "config_hash": self.config_hash,
            "privacy_config": self.privacy_config,
            "instance": self.instance,
            "learner": {
                "name": self.learner,
                "config": self.learner_config,
                "state": {k: encode_value(v) for k, v in self.learner_state.items()},
            },
            "positions": self.positions,
            "ledger": self.ledger,
            "rejects": self.rejects,
            "records": self.records,
            "snapshots": self.snapshots,
            "extra": self.extra(),
        }

    @classmethod
    def from_body(cls, body: dict[str, Any], where: str = "checkpoint") -> Checkpoint:
        """The checkpoint of a manifest's content (arrays already decoded)."""
        try:
            version = body.get("schema_version")
            if version != SCHEMA_VERSION:
                raise CheckpointError(
                    f"{where}: schema_version {version!r}; this panpriv reads version {SCHEMA_VERSION}"
                )
            learner = body["learner"]
            return cls(
                sequence=int(body["sequence"]),
                created=float(body["created"]),
                finished=bool(body.get("finished", False)),
                config_hash=str(body["config_hash"]),
                privacy_config=dict(body["privacy_config"]),
                instance=str(body["instance"]),
                learner=str(learner["name"]),
                learner_config=dict(learner["config"]),
                learner_state={k: decode_value(v) for k, v in learner["state"].items()},
                positions={str(k): int(v) for k, v in body["positions"].items()},
                ledger=dict(body["ledger"]),
                rejects={str(k): int(v) for k, v in body["rejects"].items()},
                records=int(body["records"]),
                snapshots=int(body["snapshots"]),
                **_typed_extra(dict(body.get("extra", {}))),
            )
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{where} is not a valid panpriv checkpoint: {exc!r}") from None


def _typed_extra(extra: dict[str, Any]) -> dict[str, Any]:
    """The typed fields stored in a manifest's ``extra`` object (absent ones keep their defaults)."""
    fields: dict[str, Any] = {"snapshot_records": int(extra.get("snapshot_records", -1))}
    if "replay" in extra:
        fields["replay"] = ReplayMarks.from_dict(dict(extra["replay"]))
    if SOURCE_MARKS_KEY in extra:
        fields["source_marks"] = {str(k): int(v) for k, v in dict(extra[SOURCE_MARKS_KEY]).items()}
    if BUDGET_MARK_KEY in extra:
        mark = dict(extra[BUDGET_MARK_KEY])
        fields["budget_mark"] = {"store": str(mark["store"]), "generation": int(mark["generation"])}
    if PARTIAL_KEY in extra:
        fields["partial"] = {str(k): int(v) for k, v in dict(extra[PARTIAL_KEY]).items() if int(v) > 0}
    return fields


def encode_value(value: Any) -> Any:
    """A learner-state value as the manifest holds it: numeric arrays as they are (the seal
    serialises them, :func:`panpriv.streamer.state.integrity.seal_document`), numpy scalars as
    Python numbers, non-finite floats as ``{"float": "inf"}``; anything else must be JSON-ready."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CheckpointError("learner state holds an object array; only numeric arrays can be checkpointed")
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    return value


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value` (arrays arrive decoded by the seal, in native byte order,
    writeable)."""
    if isinstance(value, dict) and "float" in value:
        return float(value["float"])
    return value


def copied_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A learner-state dict with its arrays copied (for a writer that wipes them, :func:`wipe_state`)."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in state.items()}


def wipe_state(state: Mapping[str, Any]) -> None:
    """Zero the arrays of a learner-state dict once it is written (a serialised copy of a state is
    never left to the allocator: module docstring)."""
    for value in state.values():
        if isinstance(value, np.ndarray) and value.flags.writeable:
            value.fill(0)


class CheckpointStore:
    """Reads and atomically writes the manifest in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / MANIFEST_NAME

    def load(self) -> Checkpoint | None:
        """The current manifest, or ``None`` if there is none yet."""
        if not self.path.exists() and not self.path.is_symlink():
            return None
        return read_manifest(self.path)

    def save(self, checkpoint: Checkpoint) -> float:
        """Write ``checkpoint`` durably (sealed with its checksum, :mod:`panpriv.streamer.state.integrity`;
        :func:`~panpriv.streamer.state.atomic_files.write_atomically`, the replaced manifest zeroed);
        return the Unix time it became durable. The sealed bytes are zeroed once written."""
        prepare_output_directory(self.directory)
        with seal_document(checkpoint.to_body()) as sealed:
            write_atomically(self.path, sealed.view(), what="checkpoint", wipe_replaced=True)
        return time.time()


def read_manifest(path: Path) -> Checkpoint:
    """The checkpoint in ``path``, its checksum and schema verified (:mod:`panpriv.streamer.state.integrity`);
    :class:`CheckpointError` for anything that is not a valid, intact manifest.

    A reader racing the running service (``panpriv inspect``, a monitor) may open the manifest just
    before it is replaced, and then read the zeros the service writes over the replaced file: a
    manifest that fails to parse is read again if the path names another file by then."""
    for attempt in range(3):
        try:
            inode = os.stat(path).st_ino
            raw = read_owned(path)
        except IsADirectoryError:
            raise CheckpointError(f"{path} is a directory, not a checkpoint file") from None
        except OSError as exc:
            raise CheckpointError(f"cannot read the checkpoint {path}: {exc.strerror}") from None
        try:
            with raw:
                body = open_document(raw, str(path))
            break
        except CheckpointError:
            if attempt == 2 or _inode(path) == inode:
                raise
    check_schema(body, str(path))
    checkpoint = Checkpoint.from_body(body, where=str(path))
    check_ledger(checkpoint.ledger, str(path))
    return checkpoint


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def check_resumable(checkpoint: Checkpoint, config_hash: str, privacy_config: Mapping[str, Any], where: Path) -> None:
    """Refuse to resume when the privacy-relevant configuration changed, naming each change."""
    if checkpoint.config_hash == config_hash:
        return
    changes = describe_changes(checkpoint.privacy_config, privacy_config)
    detail = "\n  ".join(changes) if changes else "(the settings hash differently; the checkpoint may be from another panpriv version)"
    raise CheckpointError(
        f"refusing to resume from {where}: privacy-relevant settings changed since it was written:\n  {detail}\n"
        "The learner's noise and accounting were set up for the old settings. Resume with the old "
        "settings, or start a new run with a different --out directory."
    )
