"""The rules both budget stores follow (SQLite, :mod:`panpriv.streamer.budget.store`; Kafka,
:mod:`panpriv.streamer.budget.kafka_store`), as pure functions, so the two cannot drift apart.

**Attempts.** Every process that begins a run is an *attempt* of it: a row with the process's
identity (:func:`process_identity`), its own durable marks (positions of its last durable
checkpoint per data key, starting at the checkpoint it resumed from; never lowered:
:func:`merged_marks`), whether it stopped cleanly, whether it ended, whether its loss was
accounted (*settled*) and the last report it stored per instance. Every charge names the attempt
that made it.

**One live process per run** (:func:`is_live`). An attempt is live until it ends (its store is
closed) or its process is gone: on the same machine (host name and boot id) the process id with
the same start time must still exist; on another machine the attempt is live while its last write
is younger than :data:`LEASE_S`. A second process of a run with a live attempt is refused.

**What a dead process held** (:func:`relabel`). Only the charges of an attempt that did not stop
cleanly, at or beyond *its own* durable marks, were in a state that no checkpoint keeps; they move
to an intrusion-only *lost* instance whose report is the dead process's last stored report for the
instance (:func:`panpriv.accounting.budget.lost_state_report`; the componentwise maximum with what the
resuming process restored). Charges of attempts that stopped cleanly, or that lie below their
attempt's marks, were released or are in a durable state and stay where they are: a rollback's
re-learned records are a second use. Relabelling less is always safe (a charge kept with its
instance counts its output too); so a resuming process may raise a dead attempt's marks to the
positions of the checkpoint it resumes from, which that attempt may have written just before it
died, before it could note it in the store.

**Integrity** (:func:`row_check`). Every row (SQLite) or message (Kafka) carries a keyed BLAKE2b
check of its content under the store's id, so a flipped bit, a hand-edited value or a row copied
from another store is refused with one line. This detects corruption and edits by hand; it is not a
signature (the key lives in the store: whoever can rewrite the store and reads this code can
recompute it). Rollback is caught by the store's *generation*, which only grows and which every
checkpoint and snapshot records (:func:`check_seen`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEASE_S = 600.0
"""How long an attempt on another machine counts as live after its last write to the store."""


# -- processes ---------------------------------------------------------------------------------------


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, str]:
    """The state letter and start time (clock ticks since boot) of process ``pid`` from /proc,
    ``("", "")`` if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "", ""
    return fields[0], fields[19]


def process_identity() -> str:
    """``host/boot id/pid/start time`` of this process: unique on a machine across pid reuse."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{_boot_id()}/{pid}/{_stat(pid)[1]}"


def describe_process(identity: str) -> str:
    """``PID 123 on host h`` for a message."""
    host, _, pid, _ = (identity.split("/") + ["", "", "", ""])[:4]
    return f"PID {pid} on host {host}"


def is_live(identity: str, ended: bool, seen: float, now: float) -> bool:
    """Whether an attempt of process ``identity`` may still be running (module docstring)."""
    if ended:
        return False
    host, boot, pid, start = (identity.split("/") + ["", "", "", ""])[:4]
    if (host, boot) != (socket.gethostname(), _boot_id()) or not pid.isdigit():
        return now - seen < LEASE_S
    state, started = _stat(int(pid))
    if state == "Z" or (start and started and started != start):
        return False  # killed and not reaped yet, or the pid was reused
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- marks and relabelling ---------------------------------------------------------------------------


def merged_marks(old: Mapping[str, int], new: Mapping[str, int]) -> dict[str, int]:
    """Durable marks never go down: the per-key maximum."""
    merged = {str(k): int(v) for k, v in old.items()}
    for key, value in new.items():
        merged[str(key)] = max(merged.get(str(key), 0), int(value))
    return merged


@dataclass(frozen=True)
class Row:
    """A stored charge: ``handle`` is the store's own reference (a rowid, a message key)."""

    handle: Any
    instance: str
    source: str
    start: int
    stop: int
    attempt: str
    order: str


@dataclass(frozen=True)
class Relabelling:
    """What :func:`relabel` decided: rows to shorten (``handle`` → new stop), rows to delete
    (moved whole), and the moved pieces (start, stop) with their row."""

    shorten: dict[Any, int]
    delete: list[Any]
    moved: list[tuple[Row, int, int]]

    def hull(self) -> dict[str, tuple[int, int]]:
        """Per data key, the hull of what moved."""
        lost: dict[str, tuple[int, int]] = {}
        for row, start, stop in self.moved:
            a, b = lost.get(row.source, (start, stop))
            lost[row.source] = (min(a, start), max(b, stop))
        return lost


def relabel(rows: Iterable[Row], edges: Mapping[str, Mapping[str, int]]) -> Relabelling:
    """The pieces of ``rows`` at or beyond ``edges[attempt][key]`` (0 for a key without an edge);
    rows of attempts without an entry in ``edges`` are kept."""
    shorten: dict[Any, int] = {}
    delete: list[Any] = []
    moved: list[tuple[Row, int, int]] = []
    for row in rows:
        marks = edges.get(row.attempt)
        if marks is None:
            continue
        edge = int(marks.get(row.source, 0))
        if row.stop <= edge:
            continue
        if row.start < edge:
            shorten[row.handle] = edge
            moved.append((row, edge, row.stop))
        else:
            delete.append(row.handle)
            moved.append((row, row.start, row.stop))
    return Relabelling(shorten, delete, moved)


# -- integrity -----------------------------------------------------------------------------------------


def canonical(values: Iterable[Any]) -> bytes:
    """The bytes a row check covers (JSON: floats round-trip exactly)."""
    return json.dumps(list(values), separators=(",", ":"), sort_keys=True, allow_nan=False).encode("utf-8")


def row_check(store_id: str, table: str, values: Iterable[Any]) -> str:
    """The keyed check of one row of ``table`` (module docstring)."""
    digest = hashlib.blake2b(canonical(values), digest_size=16, key=bytes.fromhex(store_id),
                             person=table.encode("utf-8")[:16])
    return digest.hexdigest()


def check_seen(store: str, generation: int, seen: Mapping[str, Any] | None, where: str, path: str) -> str | None:
    """Why a store (id ``store`` at ``generation``) must not be used by an output directory that
    recorded ``seen`` (``{"store": id, "generation": g}``, from its checkpoint or its last
    snapshot, at ``where``), or ``None``."""
    if not seen or "store" not in seen:
        return None
    if str(seen["store"]) != store:
        return (f"{where} was written with the budget store {seen['store']}, but {path} is store {store} (deleted, "
                "replaced or another state directory): the uses it recorded are not in this store. Use the state "
                "directory (--state-dir) of that store, or another --out")
    if int(seen.get("generation", 0)) > generation:
        return (f"the budget store {path} is at generation {generation:,}, behind generation "
                f"{int(seen['generation']):,} recorded in {where}: it was restored from a backup or rolled back, and "
                "forgets uses made since. Restore the newest store, or use another --out")
    return None
