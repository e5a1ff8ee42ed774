"""The budget store: every use of every data source by every run, in one durable SQLite file.

What it is for (the composition rules are in :mod:`panpriv.accounting.budget`). A run's checkpoint ledger
knows that run only; deleting the checkpoint, restoring an old one, starting another ``--out`` or
another consumer group, or replaying a recording of the topic would each learn the same records
again under a fresh ×1 ledger. The store is keyed by the *data*:

==============================  ============================================  ==================
source                          data key                                      position
==============================  ============================================  ==================
Kafka topic                     ``kafka:<cluster>/<topic>/<partition>``       offset
``panpriv record`` recording    the recorded topic's key (same as above)      recorded offset
JSONL / CSV / Adult file        ``sha256:<content hash>``                     line index
synthetic stream                ``synthetic:seed=S,dim=D``                    record index
ESA deployment (``analyze``)    ``esa:<cluster>/<messages topic>``            round
==============================  ============================================  ==================

``<cluster>`` is ``cluster=<id>`` when the broker reports a cluster id in its metadata, else
``bootstrap=<sorted host:port list>`` (a fallback: the same cluster reached under two different
addresses then counts as two). A recording carries the cluster identity of the topic it copied
(header field ``cluster``; older recordings without it fall back to the bootstrap servers of their
``source``), so replaying a recording composes with runs on the topic, and copying or renaming
the file changes nothing. A file is keyed by the SHA-256 of its (decompressed) content.

Tables. ``instances``: one row per use-instance (a run's learner, a pass of a multi-pass learner,
a lost state) with its current :class:`~panpriv.accounting.ledger.PrivacyReport`, its run, output
directory and start time. ``charges``: ``(instance, data key, start, stop)`` rows; a charge that
continues the instance's previous range of the same key extends that row, so a stream read in
order costs one row per key and run. ``runs``: the run's last durable checkpoint (sequence and
positions per data key) and whether it stopped cleanly — what crash accounting needs.

Durability and atomicity. The database runs in WAL mode with ``synchronous=FULL``: a committed
transaction is on disk (fsync of the WAL) before :meth:`BudgetStore.charge` returns, and the
service charges a range before it learns it. A check against ``max_epsilon`` and the charge it
allows are one ``BEGIN IMMEDIATE`` transaction, so two processes on this machine sharing the
state directory cannot both pass the check on the same records. Processes on different machines
need a shared store; this one is local (the state directory must not be on a network file
system, where SQLite's locking is unreliable); :mod:`panpriv.streamer.budget.kafka_store` keeps the same store on
a compacted Kafka topic, without atomic check-and-charge across machines.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import Charge, Excess, compose, exceeds
from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.errors import StreamerError

DATABASE_NAME = "budget.sqlite"
SCHEMA_VERSION = 1
STATE_DIR_ENV = "PANPRIV_STATE_DIR"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances(
    instance TEXT PRIMARY KEY, run TEXT NOT NULL, report TEXT NOT NULL,
    out TEXT NOT NULL, started REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS charges(
    instance TEXT NOT NULL, source TEXT NOT NULL, start INTEGER NOT NULL, stop INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS charges_by_source ON charges(source);
CREATE INDEX IF NOT EXISTS charges_by_instance ON charges(instance, source, stop);
CREATE TABLE IF NOT EXISTS runs(
    run TEXT PRIMARY KEY, out TEXT NOT NULL, source TEXT NOT NULL, started REAL NOT NULL,
    sequence INTEGER NOT NULL DEFAULT 0, positions TEXT NOT NULL DEFAULT '{}',
    clean INTEGER NOT NULL DEFAULT 0, losses INTEGER NOT NULL DEFAULT 0);
"""


class BudgetError(StreamerError):
    """The budget store cannot be opened or is not a panpriv budget store."""


class BudgetExceededError(StreamerError):
    """A run was refused before it learned anything: its records would exceed ``max_epsilon``."""


def default_state_dir() -> Path:
    """``$PANPRIV_STATE_DIR``, else ``$XDG_STATE_HOME/panpriv``, else ``~/.local/state/panpriv``."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "panpriv"


@dataclass(frozen=True)
class RunState:
    """What the store knows of a run: its last durable checkpoint and how it ended."""

    run: str
    out: str
    source: str
    started: float
    sequence: int
    positions: dict[str, int]
    clean: bool
    losses: int


@dataclass(frozen=True)
class InstanceInfo:
    """One use-instance as stored."""

    instance: str
    run: str
    report: PrivacyReport
    out: str
    started: float


_LOCK_TIMEOUT = 60.0  # seconds a connection waits for another process's lock


def _use_wal(db: sqlite3.Connection) -> None:
    """Put the database in WAL mode (a persistent property of the file) unless it already is.

    Converting a fresh file to WAL needs exclusive access, and SQLite does not run the busy handler
    for ``PRAGMA journal_mode=WAL``: when several processes open a new store at once (the scale-out
    workers and coordinator do), all but one got "database is locked" at once, whatever the
    connection's timeout. So the mode is read first (no conversion, no exclusive lock, after the
    first open), and the conversion is retried with backoff for up to the lock timeout; another
    process finishing it in the meantime ends the wait.
    """
    deadline = time.monotonic() + _LOCK_TIMEOUT
    pause = 0.001
    while True:
        try:
            if str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            if str(db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower() == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        else:
            if time.monotonic() > deadline:
                raise sqlite3.OperationalError("could not switch the budget store to WAL mode (database is locked)")
        time.sleep(pause)
        pause = min(2 * pause, 0.1)


class BudgetStore:
    """The SQLite budget store in ``directory`` (created if missing).

    Parameters
    ----------
    directory
        The state directory (``[budget] state_dir``, ``--state-dir``; default
        :func:`default_state_dir`).
    max_records_per_user
        Declared records-per-user bound, for the user-level figures of composed reports.
    """

    def __init__(self, directory: Path, max_records_per_user: int | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / DATABASE_NAME
        self.max_records_per_user = max_records_per_user
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=_LOCK_TIMEOUT, isolation_level=None)
            _use_wal(self._db)
            self._db.execute("PRAGMA synchronous=FULL")
            with self._transaction() as db:
                for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                    db.execute(statement)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if int(row[0]) != SCHEMA_VERSION:
                raise BudgetError(
                    f"{self.path}: budget store schema_version {row[0]}; this panpriv reads {SCHEMA_VERSION}"
                )
        except (OSError, sqlite3.Error) as exc:
            raise BudgetError(
                f"cannot open the budget store {self.path} ({exc}); set [budget] state_dir or --state-dir "
                "to a writable local directory"
            ) from None

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back on an exception): the write lock is
        taken first, so a check and the write it allows see no other writer in between."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- runs and instances ------------------------------------------------------------------------

    def begin_run(self, run: str, out: Path | str, source: str) -> RunState | None:
        """Register run ``run`` (or find it again on resume); mark it as not cleanly stopped.
        Returns the state stored before this call (``None`` for a new run)."""
        with self._transaction() as db:
            previous = self._run_state(db, run)
            if previous is None:
                db.execute(
                    "INSERT INTO runs(run, out, source, started) VALUES (?, ?, ?, ?)",
                    (run, str(out), source, time.time()),
                )
            else:
                db.execute("UPDATE runs SET clean = 0, out = ? WHERE run = ?", (str(out), run))
        return previous

    def run_state(self, run: str) -> RunState | None:
        return self._run_state(self._db, run)

    @staticmethod
    def _run_state(db: sqlite3.Connection, run: str) -> RunState | None:
        row = db.execute(
            "SELECT run, out, source, started, sequence, positions, clean, losses FROM runs WHERE run = ?", (run,)
        ).fetchone()
        if row is None:
            return None
        positions = {str(k): int(v) for k, v in json.loads(row[5]).items()}
        return RunState(row[0], row[1], row[2], row[3], row[4], positions, bool(row[6]), row[7])

    def register(self, instance: str, run: str, report: PrivacyReport, out: Path | str) -> None:
        """Add ``instance`` of ``run`` or replace its report (durable when this returns)."""
        now = time.time()
        text = json.dumps(report.to_dict(), sort_keys=True)
        with self._transaction() as db:
            db.execute(
                "INSERT INTO instances(instance, run, report, out, started, updated) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(instance) DO UPDATE SET report = excluded.report, updated = excluded.updated",
                (instance, run, text, str(out), now, now),
            )

    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool = False) -> None:
        """Note that ``run``'s checkpoint ``sequence``, at ``positions`` (data keys), is durable."""
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET sequence = MAX(sequence, ?), positions = ?, clean = ? WHERE run = ?",
                (sequence, json.dumps(dict(positions), sort_keys=True), int(clean), run),
            )

    # -- charges -------------------------------------------------------------------------------------

    def charge(
        self, instance: str, ranges: Mapping[str, tuple[int, int]], limit: float | None = None
    ) -> Excess | None:
        """Charge ``ranges`` (data key → ``[start, stop)``) to ``instance``, durably, unless a
        record's ε would then exceed ``limit``: then nothing is written and the :class:`Excess`
        is returned. Check and charge are one transaction."""
        ranges = {k: (int(a), int(b)) for k, (a, b) in ranges.items() if b > a}
        if not ranges:
            return None
        with self._transaction() as db:
            if limit is not None:
                excess = exceeds(self._ledger(db, ranges, also=(instance,)), instance, ranges, limit)
                if excess is not None:
                    return excess
            for source, (start, stop) in ranges.items():
                updated = db.execute(
                    "UPDATE charges SET stop = ? WHERE rowid = "
                    "(SELECT rowid FROM charges WHERE instance = ? AND source = ? AND stop = ? LIMIT 1)",
                    (stop, instance, source, start),
                ).rowcount
                if not updated:
                    db.execute("INSERT INTO charges VALUES (?, ?, ?, ?)", (instance, source, start, stop))
        return None

    def reclassify_lost(
        self, instance: str, durable: Mapping[str, int], lost_instance: str, lost_report: PrivacyReport
    ) -> dict[str, tuple[int, int]]:
        """Move the charges of ``instance`` at or beyond ``durable[key]`` (0 for a key not in it) to
        ``lost_instance`` (registered with ``lost_report``): they were in a state lost in a crash.
        Returns the lost ranges per key (their hull)."""
        lost: dict[str, tuple[int, int]] = {}
        with self._transaction() as db:
            rows = db.execute(
                "SELECT rowid, source, start, stop FROM charges WHERE instance = ?", (instance,)
            ).fetchall()
            moved = []
            for rowid, source, start, stop in rows:
                edge = int(durable.get(source, 0))
                if stop <= edge:
                    continue
                if start < edge:
                    db.execute("UPDATE charges SET stop = ? WHERE rowid = ?", (edge, rowid))
                    start = edge
                else:
                    db.execute("DELETE FROM charges WHERE rowid = ?", (rowid,))
                moved.append(Charge(lost_instance, source, start, stop))
                a, b = lost.get(source, (start, stop))
                lost[source] = (min(a, start), max(b, stop))
            if moved:
                run = db.execute("SELECT run, out FROM instances WHERE instance = ?", (instance,)).fetchone()
                now = time.time()
                db.execute(
                    "INSERT OR REPLACE INTO instances VALUES (?, ?, ?, ?, ?, ?)",
                    (lost_instance, run[0], json.dumps(lost_report.to_dict(), sort_keys=True), run[1], now, now),
                )
                db.executemany(
                    "INSERT INTO charges VALUES (?, ?, ?, ?)", [(c.instance, c.source, c.start, c.stop) for c in moved]
                )
                db.execute("UPDATE runs SET losses = losses + 1 WHERE run = ?", (run[0],))
        return lost

    def note_loss(self, run: str) -> None:
        """Count one more crash loss of ``run`` (one whose lost instance was charged directly)."""
        with self._transaction() as db:
            db.execute("UPDATE runs SET losses = losses + 1 WHERE run = ?", (run,))

    # -- reading -------------------------------------------------------------------------------------

    def _ledger(self, db: sqlite3.Connection, sources: Iterable[str] | None, also: Iterable[str] = ()) -> PrivacyLedger:
        """The composed ledger of ``sources`` (``None``: all), with the reports of the instances
        in ``also`` registered too (an instance about to charge them for the first time)."""
        if sources is None:
            rows = db.execute("SELECT instance, source, start, stop FROM charges").fetchall()
        else:
            keys = sorted(set(sources))
            rows = []
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                rows += db.execute(
                    f"SELECT instance, source, start, stop FROM charges WHERE source IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
        names = sorted({row[0] for row in rows} | set(also))
        reports: dict[str, PrivacyReport] = {}
        for i in range(0, len(names), 500):
            chunk = names[i : i + 500]
            for instance, text in db.execute(
                f"SELECT instance, report FROM instances WHERE instance IN ({','.join('?' * len(chunk))})", chunk
            ):
                reports[instance] = PrivacyReport.from_dict(json.loads(text))
        missing = set(also) - set(reports)
        if missing:
            raise BudgetError(f"{self.path}: instances {sorted(missing)} charge before they are registered")
        charges = sorted((Charge(*row) for row in rows), key=lambda c: (c.source, c.start, c.instance))
        return compose(reports, charges, self.max_records_per_user)

    def ledger(self, sources: Iterable[str] | None = None) -> PrivacyLedger:
        """Every use of ``sources`` (data keys; ``None``: all) by every run, composed."""
        return self._ledger(self._db, sources)

    def instances(self) -> dict[str, InstanceInfo]:
        out: dict[str, InstanceInfo] = {}
        for instance, run, text, where, started in self._db.execute(
            "SELECT instance, run, report, out, started FROM instances"
        ):
            out[instance] = InstanceInfo(instance, run, PrivacyReport.from_dict(json.loads(text)), where, started)
        return out

    def runs(self) -> list[RunState]:
        names = [row[0] for row in self._db.execute("SELECT run FROM runs ORDER BY started")]
        return [state for name in names if (state := self._run_state(self._db, name)) is not None]


def describe_excess(excess: Excess, limit: float, instances: Mapping[str, InstanceInfo]) -> str:
    """One line naming what a refused charge would reach and the runs that spent the budget."""
    spenders = []
    for instance, report in excess.spent_by:
        where = instances.get(instance)
        spenders.append(
            f"{instance} (out {where.out if where else '?'}: output {report.output}, intrusion {report.intrusion})"
        )
    spent = "; ".join(spenders) if spenders else "no earlier run (this run's own guarantee is above it)"
    return (
        f"records [{excess.start:,}, {excess.stop:,}) of {excess.source} would reach ε = {excess.epsilon:.4g} "
        f"> max_epsilon = {limit:g}; already spent by: {spent}"
    )


def describe_store(directory: Path, contains: str | None = None) -> str:
    """``panpriv budget``: per data source, its ranges and uses with the composed guarantee; then
    every run (output directory, start, last durable checkpoint) and its instances' reports."""
    path = Path(directory) / DATABASE_NAME
    if not path.exists():
        return f"budget store {path}: empty (no run has used this state directory)"
    return describe_opened(BudgetStore(Path(directory)), contains)


def describe_opened(store: Any, contains: str | None = None) -> str:
    """:func:`describe_store` for an opened store (SQLite or Kafka); closes it."""
    from datetime import UTC, datetime

    from panpriv.accounting.budget import per_source

    path = store.path
    try:
        ledger = store.ledger()
        instances = store.instances()
        runs = store.runs()
    finally:
        store.close()
    lines = [f"budget store {path}"]
    sources = [s for s in ledger.sources if contains is None or contains in s]
    totals = per_source(ledger)
    lines.append(f"  data sources ({len(sources)}):")
    for source in sources:
        output, intrusion = totals[source]
        lines.append(f"    {source}: composed over all runs, worst record: output {output}, intrusion {intrusion}")
        for segment in ledger.coverage(source):
            o, i = ledger.record_guarantee(segment.uses)
            lines.append(
                f"      [{segment.start:,}, {segment.stop:,}) used by {', '.join(segment.uses)}: output {o}, intrusion {i}"
            )
    lines.append(f"  runs ({len(runs)}):")
    for run in runs:
        started = datetime.fromtimestamp(run.started, UTC).isoformat(timespec="seconds")
        ended = "stopped cleanly" if run.clean else "running, or crashed"
        lines.append(
            f"    {run.run}: out {run.out}, source {run.source}, started {started}, last durable checkpoint "
            f"{run.sequence} ({ended})" + (f", {run.losses} crash loss(es) accounted" if run.losses else "")
        )
        for info in sorted(instances.values(), key=lambda i: i.instance):
            if info.run == run.run:
                lines.append(f"      {info.instance}: output {info.report.output}, intrusion {info.report.intrusion}")
    return "\n".join(lines)
