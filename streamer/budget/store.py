"""The budget store: every use of every data source by every run, in one durable SQLite file.

What it is for (the composition rules are in :mod:`panpriv.accounting.budget`). A run's checkpoint ledger
knows that run only; deleting the checkpoint, restoring an old one, starting another ``--out`` or
another consumer group, replaying a recording of the topic, or re-serialising a file would each
learn the same records again under a fresh ×1 ledger. The store is keyed by the *data*
(:mod:`panpriv.streamer.sources.identity`, :data:`~panpriv.streamer.sources.identity.IDENTIFICATION_RULE`):

==============================  ============================================  ==================
source                          data key                                      position
==============================  ============================================  ==================
Kafka topic                     ``kafka:<cluster>/<topic>/<partition>``       offset
``panpriv record`` recording    the recorded topic's keys (same as above)     recorded offset
                                and ``records:<content digest>``              frame index
JSONL / CSV / Adult file        ``records:<content digest>``                  line index
synthetic stream                ``synthetic:seed=S,dim=D``                    record index
ESA deployment (``analyze``)    ``esa:<cluster>/<messages topic>``            round
==============================  ============================================  ==================

Tables. ``instances``: one row per use-instance (a run's learner, a pass of a multi-pass learner,
a lost state) with its report — never weakened below what it was (:func:`panpriv.accounting.budget.weakest`),
except a *provisional* one (a round registered before its report is known) — its run, output
directory and start time. ``charges``: ``(instance, data key, start, stop, attempt, order)``; a
charge that continues the same attempt's previous range of the same key extends that row.
``runs``: per run, the highest durable checkpoint (sequence; positions, never lowered) and the
crash losses accounted. ``attempts``: per process that began a run, the rules of
:mod:`panpriv.streamer.budget.rules` (its own durable marks, clean stop, liveness, last reports).
``meta``: schema version, the store's random id, its *generation* (incremented by every write)
and the sum of the rows' checks.

Integrity. Every row carries a keyed check (:func:`panpriv.streamer.budget.rules.row_check`), verified
whenever it is read; the meta row's check covers the generation and the sum of all row checks,
verified when the store is opened, so a row removed or added by hand is found too; SQLite's own
integrity check runs when the store is opened too, for what the row checks do not cover (an index
that no longer matches its table hides rows from the queries that use it). A 0-byte file,
a file that is not SQLite, or a SQLite file without this schema is "not a budget store" (refused,
never taken for a new store: a new store is created under a temporary name and linked into place
complete). The generation only grows: a store object refuses a file whose generation went back
while it had it open, and a run refuses a store behind the generation its output directory recorded
(:meth:`BudgetStore.check_seen`). Every failure is a :class:`BudgetError`: one line.

Durability, atomicity and signals. A rollback journal (``journal_mode=DELETE``) with
``synchronous=FULL`` and no memory map (``mmap_size=0``): a committed transaction is on disk before
:meth:`BudgetStore.charge` returns, and the service charges a range before it learns it. Not WAL:
WAL keeps its index in a shared memory map of ``budget.sqlite-shm``, and when the kernel cannot give
a page of that map (the file made immutable, truncated, or a hole on a full disk) the process gets
SIGBUS, which no error handler sees. With a rollback journal every write is a system call that
returns an error. The cost: four fdatasyncs per commit instead of WAL's one (counted with strace;
about 20 ms instead of 5 ms a charge on the test machine's disk), so a run over a source read in
order charges eight micro-batches per write (:mod:`panpriv.streamer.budget.ahead`). A check against
``max_epsilon`` and the charge it allows are one ``BEGIN IMMEDIATE`` transaction, so two processes
on this machine sharing the state directory cannot both pass the check on the same records.
Processes on different machines need a shared store; this one is local (the state directory must not
be on a network file system, where SQLite's locking is unreliable);
:mod:`panpriv.streamer.budget.kafka_store` keeps the same store on a compacted Kafka topic.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from panpriv.accounting.budget import Charge, Excess, compose, exceeds_after, lost_state_report, weakest
from panpriv.accounting.errors import AccountingError
from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.budget import rules
from panpriv.streamer.errors import ConfigError, StreamerError
from panpriv.streamer.state.atomic_files import PRIVATE_DIRECTORY_MODE, PRIVATE_MODE, fsync_directory

DATABASE_NAME = "budget.sqlite"
SCHEMA_VERSION = 2
STATE_DIR_ENV = "PANPRIV_STATE_DIR"

COLUMNS: dict[str, tuple[str, ...]] = {
    "instances": ("instance", "run", "report", "out", "started", "updated", "provisional"),
    "charges": ("instance", "source", "start", "stop", "attempt", "ord"),
    "runs": ("run", "out", "source", "started", "sequence", "positions", "clean", "losses"),
    "attempts": ("attempt", "run", "process", "started", "seen", "positions", "sequence", "clean", "ended", "settled",
                 "reports"),
}
"""The columns each row check covers, per table."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances(
    instance TEXT PRIMARY KEY, run TEXT NOT NULL, report TEXT NOT NULL, out TEXT NOT NULL, started REAL NOT NULL,
    updated REAL NOT NULL, provisional INTEGER NOT NULL DEFAULT 0, chk TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS charges(
    instance TEXT NOT NULL, source TEXT NOT NULL, start INTEGER NOT NULL, stop INTEGER NOT NULL,
    attempt TEXT NOT NULL DEFAULT '', ord TEXT NOT NULL DEFAULT '', chk TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS charges_by_source ON charges(source);
CREATE INDEX IF NOT EXISTS charges_by_instance ON charges(instance, source, stop);
CREATE TABLE IF NOT EXISTS runs(
    run TEXT PRIMARY KEY, out TEXT NOT NULL, source TEXT NOT NULL, started REAL NOT NULL,
    sequence INTEGER NOT NULL DEFAULT 0, positions TEXT NOT NULL DEFAULT '{}',
    clean INTEGER NOT NULL DEFAULT 0, losses INTEGER NOT NULL DEFAULT 0, chk TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS attempts(
    attempt TEXT PRIMARY KEY, run TEXT NOT NULL, process TEXT NOT NULL, started REAL NOT NULL, seen REAL NOT NULL,
    positions TEXT NOT NULL, sequence INTEGER NOT NULL, clean INTEGER NOT NULL, ended INTEGER NOT NULL,
    settled INTEGER NOT NULL, reports TEXT NOT NULL, chk TEXT NOT NULL);
"""

_DIGEST_MODULUS = 1 << 128
_LOCK_TIMEOUT = 60.0  # seconds a connection waits for another process's lock
_SEEN_EVERY_S = 30.0  # an attempt's "seen" time is refreshed at most this often (liveness across machines)


class BudgetError(StreamerError):
    """The budget store cannot be opened or used, is not a panpriv budget store, fails its
    integrity checks, or went back in time. Its message is one line."""


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


def refuse_non_directory(directory: Path) -> None:
    """A state directory that exists but is not a directory (a file given as ``--state-dir``) is a
    configuration error (:class:`~panpriv.streamer.errors.ConfigError`, one line), not an empty store."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"the budget state directory {directory} is not a directory; give --state-dir (or [budget] "
                          "state_dir) a directory")


@dataclass(frozen=True)
class RunState:
    """What the store knows of a run: its highest durable checkpoint and how it last ended."""

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


@dataclass(frozen=True)
class AttemptState:
    """One process's attempt at a run (:mod:`panpriv.streamer.budget.rules`)."""

    attempt: str
    run: str
    process: str
    started: float
    seen: float
    positions: dict[str, int]
    sequence: int
    clean: bool
    ended: bool
    settled: bool
    reports: dict[str, PrivacyReport] = field(default_factory=dict)

    def live(self, now: float) -> bool:
        return rules.is_live(self.process, self.ended, self.seen, now)

    def state(self, now: float) -> str:
        """For people: running, stopped cleanly, crashed (accounted or not)."""
        if self.live(now):
            return f"running ({rules.describe_process(self.process)})"
        if self.clean:
            return "stopped cleanly"
        return "ended without a clean stop" + ("; its lost state is accounted" if self.settled else "")


def attempt_from(values: Mapping[str, Any]) -> AttemptState:
    """An :class:`AttemptState` from a stored row (both stores keep the same fields)."""
    return AttemptState(
        attempt=str(values["attempt"]), run=str(values["run"]), process=str(values["process"]),
        started=float(values["started"]), seen=float(values["seen"]),
        positions={str(k): int(v) for k, v in _json(values["positions"]).items()},
        sequence=int(values["sequence"]), clean=bool(values["clean"]), ended=bool(values["ended"]),
        settled=bool(values["settled"]),
        reports={k: PrivacyReport.from_dict(v) for k, v in _json(values["reports"]).items()},
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


T = TypeVar("T")


def _guarded(method: Callable[..., T]) -> Callable[..., T]:
    """Every store failure as one line (:class:`BudgetError`), never a traceback."""

    @functools.wraps(method)
    def wrapper(self: BudgetStore, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except (BudgetError, BudgetExceededError):
            raise
        except (OSError, sqlite3.Error) as exc:
            raise BudgetError(f"the privacy budget store failed ({self.path}: {exc}); nothing was learned past its last "
                              "charge. Check free space and permissions of the state directory (--state-dir), then run "
                              "the same command again") from None
        except _ROW_ERRORS as exc:
            raise _invalid_row(self.path, exc) from None

    return wrapper


_ROW_ERRORS = (AccountingError, ValueError, KeyError, TypeError)
"""What reading a damaged or edited row raises before its check is compared."""


def _invalid_row(path: Path, exc: BaseException) -> BudgetError:
    return BudgetError(f"the budget store {path} holds an invalid row ({type(exc).__name__}: {exc}); it was edited or "
                       "damaged")


@dataclass
class _Stored:
    """A row as read: its rowid, its values by column, its check."""

    rowid: int
    values: dict[str, Any]
    chk: str


class _Writer:
    """The writes of one transaction, keeping every row's check and the sum of checks."""

    def __init__(self, db: sqlite3.Connection, store_id: str) -> None:
        self.db = db
        self.store_id = store_id
        self.delta = 0
        self.changed = False

    def check(self, table: str, values: Mapping[str, Any]) -> str:
        return rules.row_check(self.store_id, table, [values[c] for c in COLUMNS[table]])

    def put(self, table: str, values: Mapping[str, Any]) -> None:
        chk = self.check(table, values)
        columns = (*COLUMNS[table], "chk")
        self.db.execute(f"INSERT INTO {table}({','.join(columns)}) VALUES ({','.join('?' * len(columns))})",
                        [*(values[c] for c in COLUMNS[table]), chk])
        self.delta += int(chk, 16)
        self.changed = True

    def replace(self, table: str, row: _Stored, values: Mapping[str, Any]) -> None:
        new = {**row.values, **values}
        chk = self.check(table, new)
        assignments = ",".join(f"{c}=?" for c in (*COLUMNS[table], "chk"))
        self.db.execute(f"UPDATE {table} SET {assignments} WHERE rowid=?", [*(new[c] for c in COLUMNS[table]), chk, row.rowid])
        self.delta += int(chk, 16) - int(row.chk, 16)
        row.values, row.chk = new, chk
        self.changed = True

    def remove(self, table: str, row: _Stored) -> None:
        self.db.execute(f"DELETE FROM {table} WHERE rowid=?", (row.rowid,))
        self.delta -= int(row.chk, 16)
        self.changed = True


def _select(db: sqlite3.Connection, table: str, store_id: str, path: Path, where: str = "", params: Iterable[Any] = (),
            order: str = "rowid") -> list[_Stored]:
    """Rows of ``table`` (``where``: an SQL condition), each verified against its check."""
    columns = COLUMNS[table]
    sql = f"SELECT rowid, {','.join(columns)}, chk FROM {table}" + (f" WHERE {where}" if where else "") + f" ORDER BY {order}"
    rows = []
    for rowid, *values, chk in db.execute(sql, tuple(params)):
        named = dict(zip(columns, values))
        if rules.row_check(store_id, table, values) != chk:
            raise BudgetError(f"the budget store {path}: a row of {table} fails its integrity check (the file was damaged "
                              "or edited by hand); refusing to use it. Restore the store from its newest copy")
        rows.append(_Stored(rowid, named, chk))
    return rows


def _create(path: Path) -> None:
    """Create an empty store at ``path`` unless one exists: built under a temporary name, complete,
    then linked into place (``link`` never replaces a file another process created meanwhile)."""
    if path.exists():
        return
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
    fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_MODE)
    os.close(fd)
    try:
        db = sqlite3.connect(temporary, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=DELETE")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                db.execute(statement)
            store_id = secrets.token_hex(16)
            _write_meta(db, store_id, 0, 0)
            db.execute("COMMIT")
        finally:
            db.close()
        fd = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        fsync_directory(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def _meta_check(store_id: str, generation: int, digest: int) -> str:
    return rules.row_check(store_id, "meta", [SCHEMA_VERSION, store_id, generation, f"{digest:032x}"])


def _write_meta(db: sqlite3.Connection, store_id: str, generation: int, digest: int) -> None:
    values = {"schema_version": str(SCHEMA_VERSION), "store_id": store_id, "generation": str(generation),
              "digest": f"{digest:032x}", "check": _meta_check(store_id, generation, digest)}
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())


def _use_rollback_journal(db: sqlite3.Connection, path: Path) -> None:
    """Leave WAL mode (module docstring, "Durability, atomicity and signals"): a store written by an
    earlier panpriv is converted, which needs every other connection to be closed; retried with
    backoff for up to the lock timeout."""
    deadline = time.monotonic() + _LOCK_TIMEOUT
    pause = 0.001
    while True:
        try:
            mode = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode != "wal" or str(db.execute("PRAGMA journal_mode=DELETE").fetchone()[0]).lower() != "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise BudgetError(f"the budget store {path} is in WAL mode and in use by another process (an older panpriv?); "
                              "stop it, then run again")
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
        self._process = rules.process_identity()
        self._attempts: dict[str, str] = {}  # run -> this process's attempt
        self._seen_at: dict[str, float] = {}  # attempt -> when its "seen" was last written
        self._generation = -1
        self._db: sqlite3.Connection | None = None
        refuse_non_directory(self.directory)
        try:
            self.directory.mkdir(mode=PRIVATE_DIRECTORY_MODE, parents=True, exist_ok=True)
            _create(self.path)
            if self.path.stat().st_size == 0:
                raise BudgetError(f"{self.path} is not a budget store (an empty file); refusing to take it for a new "
                                  "store: the uses it held would be forgotten. Restore it from its newest copy")
            self._db = sqlite3.connect(self.path, timeout=_LOCK_TIMEOUT, isolation_level=None)
            self._db.execute("PRAGMA mmap_size=0")
            _use_rollback_journal(self._db, self.path)
            self._db.execute("PRAGMA synchronous=FULL")
            self._store_id = self._open_schema()
            self._check_structure()
            self._verify()
        except BudgetError:
            self._close_quietly()
            raise
        except _ROW_ERRORS as exc:
            self._close_quietly()
            raise _invalid_row(self.path, exc) from None
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise BudgetError(f"{self.path} is not a budget store ({exc}); refusing to use it") from None
        except (OSError, sqlite3.Error) as exc:
            self._close_quietly()
            raise BudgetError(
                f"cannot open the budget store {self.path} ({exc}); set [budget] state_dir or --state-dir "
                "to a writable local directory"
            ) from None

    # -- opening -------------------------------------------------------------------------------------

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise BudgetError(f"the budget store {self.path} is closed")
        return self._db

    def _open_schema(self) -> str:
        """The store's id, after migrating a version 1 store; refuses anything else."""
        tables = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            raise BudgetError(f"{self.path} is not a budget store (a database without panpriv's tables); refusing to use it")
        version = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version is not None and version[0] == "1":
            self._migrate_from_1()
            version = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version is None or version[0] != str(SCHEMA_VERSION):
            raise BudgetError(f"{self.path}: budget store schema_version {version[0] if version else None}; this panpriv "
                              f"reads {SCHEMA_VERSION}")
        store_id = self.db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        if store_id is None:  # a flipped or edited key: the meta row's check cannot even be computed
            raise BudgetError(f"the budget store {self.path}: its meta row fails its integrity check (damaged or edited "
                              "by hand); refusing to use it")
        return str(store_id[0])

    def _meta(self, db: sqlite3.Connection) -> tuple[str, int, int]:
        """(store id, generation, digest), verified."""
        values = dict(db.execute("SELECT key, value FROM meta").fetchall())
        try:
            store_id, generation, digest = values["store_id"], int(values["generation"]), int(values["digest"], 16)
            # The texts as written, not only their numbers: a flipped bit can leave a number's value
            # (a hex letter's case, a leading zero turned into a space) and the check would pass.
            canonical = values["generation"] == str(generation) and values["digest"] == f"{digest:032x}"
            valid = canonical and values.get("check") == _meta_check(store_id, generation, digest)
        except (KeyError, ValueError):
            valid = False
        if not valid:
            raise BudgetError(f"the budget store {self.path}: its meta row fails its integrity check (damaged or edited "
                              "by hand); refusing to use it")
        if generation < self._generation or (self._generation >= 0 and store_id != self._store_id):
            raise BudgetError(f"the budget store {self.path} went back to generation {generation:,} (it was at "
                              f"{self._generation:,} while this process had it open) or was replaced: a backup was "
                              "restored under a running process; stopping")
        self._generation = generation
        return store_id, generation, digest

    def _check_structure(self) -> None:
        """SQLite's own integrity check: the row checks cover the tables, not the indexes, and a bit
        flipped in ``charges_by_source`` made the charges of a data key vanish from the queries that
        use it (a run saw the records as never used) while every row passed its check."""
        problems = [str(row[0]) for row in self.db.execute("PRAGMA integrity_check(1)")]
        if problems != ["ok"]:
            raise BudgetError(f"the budget store {self.path} is damaged (SQLite's integrity check: {problems[0]}); "
                              "refusing to use it. Restore it from its newest copy")

    def _verify(self) -> None:
        """Every row's check and their sum against the meta row (module docstring, "Integrity")."""
        with self._read() as db:
            _, _, digest = self._meta(db)
            total = 0
            for table in COLUMNS:
                total += sum(int(row.chk, 16) for row in _select(db, table, self._store_id, self.path))
            if total % _DIGEST_MODULUS != digest:
                raise BudgetError(f"the budget store {self.path}: rows were added or removed by hand (the sum of the "
                                  "row checks does not match the store's); refusing to use it")

    def _migrate_from_1(self) -> None:
        """Schema 1 → 2: the new columns and the attempts table; each run's state becomes one ended
        attempt (``legacy:<run>``) owning its charges; checks, id and generation 1."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] != "1":
                db.execute("ROLLBACK")  # another process migrated it meanwhile
                return
            for statement in (
                "ALTER TABLE instances ADD COLUMN provisional INTEGER NOT NULL DEFAULT 0",
                "ALTER TABLE instances ADD COLUMN chk TEXT NOT NULL DEFAULT ''",
                "ALTER TABLE charges ADD COLUMN attempt TEXT NOT NULL DEFAULT ''",
                "ALTER TABLE charges ADD COLUMN ord TEXT NOT NULL DEFAULT ''",
                "ALTER TABLE charges ADD COLUMN chk TEXT NOT NULL DEFAULT ''",
                "ALTER TABLE runs ADD COLUMN chk TEXT NOT NULL DEFAULT ''",
            ):
                db.execute(statement)
            for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                db.execute(statement)
            db.execute("UPDATE charges SET attempt = 'legacy:' || "
                       "COALESCE((SELECT run FROM instances WHERE instances.instance = charges.instance), '')")
            for run, sequence, positions, clean, started in db.execute(
                    "SELECT run, sequence, positions, clean, started FROM runs").fetchall():
                reports = {name: json.loads(text) for name, text in db.execute(
                    "SELECT instance, report FROM instances WHERE run = ?", (run,))}
                db.execute(f"INSERT INTO attempts VALUES ({','.join('?' * 12)})",
                           (f"legacy:{run}", run, "", started, started, positions, sequence, clean, 1, int(bool(clean)),
                            _dumps(reports), ""))
            store_id = secrets.token_hex(16)
            total = 0
            for table, columns in COLUMNS.items():
                for rowid, *values in db.execute(f"SELECT rowid, {','.join(columns)} FROM {table}").fetchall():
                    chk = rules.row_check(store_id, table, values)
                    db.execute(f"UPDATE {table} SET chk = ? WHERE rowid = ?", (chk, rowid))
                    total += int(chk, 16)
            _write_meta(db, store_id, 1, total % _DIGEST_MODULUS)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _close_quietly(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None

    def close(self) -> None:
        """End this process's attempts (they are no longer live) and close the file. Never raises:
        a store that cannot be written any more is left as it is (its attempts then count as
        crashed once this process is gone)."""
        if self._db is None:
            return
        try:
            if self._attempts:
                with self._transaction() as writer:
                    for row in self._my_attempts(writer.db):
                        writer.replace("attempts", row, {"ended": 1, "seen": time.time()})
        except (BudgetError, sqlite3.Error, OSError):
            pass
        finally:
            self._attempts.clear()
            self._close_quietly()

    # -- transactions --------------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[_Writer]:
        """One ``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back on an exception): the write lock is
        taken first, so a check and the write it allows see no other writer in between. A
        transaction that wrote anything advances the generation and the sum of checks."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            store_id, generation, digest = self._meta(db)
            writer = _Writer(db, store_id)
            yield writer
            if writer.changed:
                _write_meta(db, store_id, generation + 1, (digest + writer.delta) % _DIGEST_MODULUS)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        if writer.changed:
            self._generation = generation + 1

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read (one deferred transaction)."""
        db = self.db
        db.execute("BEGIN")
        try:
            self._meta(db)
            yield db
        finally:
            db.execute("COMMIT")

    def _select(self, db: sqlite3.Connection, table: str, where: str = "", params: Iterable[Any] = ()) -> list[_Stored]:
        return _select(db, table, self._store_id, self.path, where, params)

    def _my_attempts(self, db: sqlite3.Connection) -> list[_Stored]:
        mine = list(self._attempts.values())
        return self._select(db, "attempts", f"attempt IN ({','.join('?' * len(mine))})", mine) if mine else []

    # -- the store's place in time ---------------------------------------------------------------------

    @property
    def store_id(self) -> str:
        return self._store_id

    @property
    @_guarded
    def generation(self) -> int:
        """The number of write transactions so far (it only grows)."""
        with self._read() as db:
            return self._meta(db)[1]

    def mark(self) -> dict[str, Any]:
        """What an output directory records of this store: its id and current generation."""
        return {"store": self._store_id, "generation": self.generation}

    def check_seen(self, seen: Mapping[str, Any] | None, where: str) -> None:
        """Refuse (:class:`BudgetError`) to serve an output directory that recorded ``seen`` at
        ``where`` if this store is another one or behind it (:func:`panpriv.streamer.budget.rules.check_seen`)."""
        why = rules.check_seen(self._store_id, self.generation, seen, where, str(self.path))
        if why is not None:
            raise BudgetError(why)

    # -- runs and instances --------------------------------------------------------------------------

    @_guarded
    def begin_run(self, run: str, out: Path | str, source: str, positions: Mapping[str, int] | None = None
                  ) -> RunState | None:
        """Register run ``run`` (or find it again on resume) and this process's attempt at it, whose
        durable marks start at ``positions`` (data keys; ``None``: the run's highest marks). Refuses
        (:class:`BudgetError`) while another process's attempt at the run is live. Returns the state
        stored before this call (``None`` for a new run)."""
        now = time.time()
        with self._transaction() as writer:
            db = writer.db
            previous = self._run_state(db, run)
            for stored in self._select(db, "attempts", "run = ?", (run,)):
                state = attempt_from(stored.values)
                if state.attempt not in self._attempts.values() and state.live(now):
                    raise BudgetError(
                        f"instance {run} is in use by another live process ({rules.describe_process(state.process)}, "
                        f"started {_when(state.started)}): one process per instance; stop it first, or use another --out")
            rows = self._select(db, "runs", "run = ?", (run,))
            if rows:
                writer.replace("runs", rows[0], {"clean": 0, "out": str(out)})
            else:
                writer.put("runs", {"run": run, "out": str(out), "source": source, "started": now, "sequence": 0,
                                    "positions": "{}", "clean": 0, "losses": 0})
            for row in self._select(db, "attempts", "attempt = ?", (self._attempts.get(run, ""),)):
                writer.replace("attempts", row, {"ended": 1})  # this process begins the run again
            marks = dict(positions) if positions is not None else (previous.positions if previous else {})
            attempt = f"{uuid.uuid4().hex[:16]}"
            writer.put("attempts", {"attempt": attempt, "run": run, "process": self._process, "started": now, "seen": now,
                                    "positions": _dumps(marks), "sequence": previous.sequence if previous else 0,
                                    "clean": 0, "ended": 0, "settled": 0, "reports": "{}"})
            self._attempts[run] = attempt
            self._seen_at[attempt] = now
        return previous

    @_guarded
    def run_state(self, run: str) -> RunState | None:
        with self._read() as db:
            return self._run_state(db, run)

    def _run_state(self, db: sqlite3.Connection, run: str) -> RunState | None:
        rows = self._select(db, "runs", "run = ?", (run,))
        if not rows:
            return None
        v = rows[0].values
        positions = {str(k): int(p) for k, p in json.loads(v["positions"]).items()}
        return RunState(v["run"], v["out"], v["source"], v["started"], v["sequence"], positions, bool(v["clean"]),
                        v["losses"])

    @_guarded
    def attempts(self, run: str | None = None) -> list[AttemptState]:
        """Every attempt (of ``run``), oldest first."""
        with self._read() as db:
            rows = self._select(db, "attempts", "run = ?", (run,)) if run is not None else self._select(db, "attempts")
        return sorted((attempt_from(r.values) for r in rows), key=lambda a: a.started)

    @_guarded
    def register(self, instance: str, run: str, report: PrivacyReport, out: Path | str, provisional: bool = False) -> None:
        """Add ``instance`` of ``run`` or update its report (durable when this returns). A stored
        report never gets stronger (componentwise maximum with the new one), unless it was
        ``provisional`` (registered before the instance's own report was known)."""
        now = time.time()
        text = _dumps(report.to_dict())
        with self._transaction() as writer:
            rows = self._select(writer.db, "instances", "instance = ?", (instance,))
            if not rows:
                writer.put("instances", {"instance": instance, "run": run, "report": text, "out": str(out),
                                         "started": now, "updated": now, "provisional": int(provisional)})
            else:
                stored = rows[0]
                if stored.values["provisional"]:
                    writer.replace("instances", stored, {"report": text, "updated": now, "provisional": int(provisional)})
                elif not provisional:
                    kept = weakest(PrivacyReport.from_dict(json.loads(stored.values["report"])), report)
                    writer.replace("instances", stored, {"report": _dumps(kept.to_dict()), "updated": now})
            if not provisional:
                self._note_report(writer, run, instance, report, now)

    def _note_report(self, writer: _Writer, run: str, instance: str, report: PrivacyReport, now: float) -> None:
        """Keep ``report`` as this process's last report for ``instance`` (its attempt at ``run``)."""
        attempt = self._attempts.get(run)
        if attempt is None:
            return
        rows = self._select(writer.db, "attempts", "attempt = ?", (attempt,))
        if not rows:
            return
        reports = json.loads(rows[0].values["reports"])
        previous = reports.get(instance)
        kept = report if previous is None else weakest(PrivacyReport.from_dict(previous), report)
        reports[instance] = kept.to_dict()
        writer.replace("attempts", rows[0], {"reports": _dumps(reports), "seen": now})
        self._seen_at[attempt] = now

    @_guarded
    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool = False) -> None:
        """Note that ``run``'s checkpoint ``sequence``, at ``positions`` (data keys), is durable
        (``clean``: the process stops cleanly after it). Marks never go down."""
        now = time.time()
        with self._transaction() as writer:
            rows = self._select(writer.db, "runs", "run = ?", (run,))
            if rows:
                v = rows[0].values
                writer.replace("runs", rows[0], {
                    "sequence": max(int(v["sequence"]), sequence), "clean": int(clean),
                    "positions": _dumps(rules.merged_marks(json.loads(v["positions"]), positions)),
                })
            attempt = self._attempts.get(run)
            for row in self._select(writer.db, "attempts", "attempt = ?", (attempt,)) if attempt else []:
                v = row.values
                writer.replace("attempts", row, {
                    "sequence": max(int(v["sequence"]), sequence), "clean": int(clean), "seen": now,
                    "positions": _dumps(rules.merged_marks(json.loads(v["positions"]), positions)),
                })

    # -- charges -------------------------------------------------------------------------------------

    def _attempt_of(self, db: sqlite3.Connection, instance: str) -> str:
        row = db.execute("SELECT run FROM instances WHERE instance = ?", (instance,)).fetchone()
        return self._attempts.get(row[0], "") if row else ""

    @_guarded
    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], limit: float | None = None,
               orders: Mapping[str, str] | None = None) -> Excess | None:
        """Charge ``ranges`` (data key → ``[start, stop)``, in the serialisation ``orders[key]``,
        default ``""``) to ``instance``, durably, unless a record's ε would then exceed ``limit``:
        then nothing is written and the :class:`Excess` is returned. Check and charge are one
        transaction."""
        ranges = {k: (int(a), int(b)) for k, (a, b) in ranges.items() if b > a}
        if not ranges:
            return None
        orders = dict(orders or {})
        with self._transaction() as writer:
            db = writer.db
            attempt = self._attempt_of(db, instance)
            if limit is not None:
                new = [Charge(instance, k, a, b, orders.get(k, "")) for k, (a, b) in ranges.items()]
                excess = self._exceeds(db, new, limit)
                if excess is not None:
                    return excess
            for source, (start, stop) in ranges.items():
                order = orders.get(source, "")
                rows = self._select(db, "charges", "instance = ? AND source = ? AND stop = ? AND attempt = ? AND ord = ?",
                                    (instance, source, start, attempt, order))
                if rows:
                    writer.replace("charges", rows[0], {"stop": stop})
                else:
                    writer.put("charges", {"instance": instance, "source": source, "start": start, "stop": stop,
                                           "attempt": attempt, "ord": order})
            self._touch(writer, attempt)
        return None

    def _touch(self, writer: _Writer, attempt: str) -> None:
        """Refresh the attempt's "seen" time now and then (liveness across machines)."""
        now = time.time()
        if attempt and now - self._seen_at.get(attempt, 0.0) > _SEEN_EVERY_S:
            for row in self._select(writer.db, "attempts", "attempt = ?", (attempt,)):
                writer.replace("attempts", row, {"seen": now})
            self._seen_at[attempt] = now

    @_guarded
    def check(self, instance: str, report: PrivacyReport, ranges: Mapping[str, tuple[int, int]], limit: float,
              orders: Mapping[str, str] | None = None) -> Excess | None:
        """Whether charging ``ranges`` to ``instance`` (with ``report`` if it is not registered yet)
        would exceed ``limit`` — the start-up check, without writing."""
        new = [Charge(instance, k, int(a), int(b), (orders or {}).get(k, "")) for k, (a, b) in ranges.items() if b > a]
        with self._read() as db:
            return self._exceeds(db, new, limit, {instance: report})

    def _exceeds(self, db: sqlite3.Connection, new: list[Charge], limit: float,
                 extra: Mapping[str, PrivacyReport] | None = None) -> Excess | None:
        charges = self._charges(db, {c.source for c in new})
        names = {c.instance for c in charges} | {c.instance for c in new}
        reports = self._reports(db, names)
        for name, report in (extra or {}).items():
            reports.setdefault(name, report)
        missing = names - set(reports)
        if missing:
            raise BudgetError(f"{self.path}: instances {sorted(missing)} charge before they are registered")
        return exceeds_after(reports, charges, new, limit, self.max_records_per_user)

    @_guarded
    def reclassify_lost(self, instance: str, durable: Mapping[str, int], lost_instance: str, lost_report: PrivacyReport
                        ) -> dict[str, tuple[int, int]]:
        """Move to ``lost_instance`` what processes of ``instance``'s run held in a state no
        checkpoint keeps (:func:`panpriv.streamer.budget.rules.relabel`): this process's charges of
        ``instance`` at or beyond ``durable[key]`` (a batch it drops), and the charges of every
        dead attempt that did not stop cleanly beyond its own marks (raised to ``durable``). The
        lost instance's report is ``lost_report``, weakened by each dead process's last stored
        report. Returns the lost ranges per key (their hull)."""
        now = time.time()
        with self._transaction() as writer:
            db = writer.db
            owner = db.execute("SELECT run, out FROM instances WHERE instance = ?", (instance,)).fetchone()
            if owner is None:
                return {}
            run, out = owner
            mine = self._attempts.get(run)
            edges: dict[str, Mapping[str, int]] = {mine or "": dict(durable)}
            dead = [row for row in self._select(db, "attempts", "run = ?", (run,))
                    if row.values["attempt"] != mine and not row.values["settled"] and not row.values["clean"]
                    and not attempt_from(row.values).live(now)]
            report = lost_report
            for row in dead:
                state = attempt_from(row.values)
                edges[state.attempt] = rules.merged_marks(state.positions, durable)
                if instance in state.reports:
                    report = weakest(report, lost_state_report(state.reports[instance]))
                writer.replace("attempts", row, {"settled": 1})
            stored = {row.rowid: row for row in self._select(db, "charges", "instance = ?", (instance,))}
            plan = rules.relabel((rules.Row(rowid, r.values["instance"], r.values["source"], r.values["start"],
                                            r.values["stop"], r.values["attempt"], r.values["ord"])
                                  for rowid, r in stored.items()), edges)
            if not plan.moved:
                return {}
            self._register_lost(writer, lost_instance, run, out, report, now)
            for rowid, stop in plan.shorten.items():
                writer.replace("charges", stored[rowid], {"stop": stop})
            for rowid in plan.delete:
                writer.remove("charges", stored[rowid])
            for piece, start, stop in plan.moved:
                writer.put("charges", {"instance": lost_instance, "source": piece.source, "start": start, "stop": stop,
                                       "attempt": piece.attempt, "ord": piece.order})
            self._count_loss(writer, run)
        return plan.hull()

    @_guarded
    def charge_lost(self, run: str, ranges: Mapping[str, tuple[int, int]], lost_instance: str,
                    lost_report: PrivacyReport, orders: Mapping[str, str] | None = None) -> int:
        """For a learner that cannot say which records it learned since its checkpoint: charge
        ``ranges`` to ``lost_instance`` once per dead attempt of ``run`` that did not stop cleanly
        (and mark them accounted), in one transaction. Returns how many there were."""
        now = time.time()
        with self._transaction() as writer:
            db = writer.db
            mine = self._attempts.get(run)
            dead = [row for row in self._select(db, "attempts", "run = ?", (run,))
                    if row.values["attempt"] != mine and not row.values["settled"] and not row.values["clean"]
                    and not attempt_from(row.values).live(now)]
            if not dead:
                return 0
            report = lost_report
            out = self._select(db, "runs", "run = ?", (run,))
            for row in dead:
                state = attempt_from(row.values)
                if run in state.reports:
                    report = weakest(report, lost_state_report(state.reports[run]))
                writer.replace("attempts", row, {"settled": 1})
            self._register_lost(writer, lost_instance, run, out[0].values["out"] if out else "", report, now)
            for row in dead:
                for source, (start, stop) in ranges.items():
                    if stop > start:
                        writer.put("charges", {"instance": lost_instance, "source": source, "start": int(start),
                                               "stop": int(stop), "attempt": row.values["attempt"],
                                               "ord": (orders or {}).get(source, "")})
            self._count_loss(writer, run)
        return len(dead)

    @_guarded
    def attempts_charging(self, instance: str, ranges: Mapping[str, tuple[int, int]]) -> set[str]:
        """The attempts whose charges of ``instance`` overlap ``ranges`` (data key → ``[start, stop)``)."""
        found: set[str] = set()
        with self._read() as db:
            for source, (start, stop) in ranges.items():
                rows = self._select(db, "charges", "instance = ? AND source = ? AND start < ? AND stop > ?",
                                    (instance, source, int(stop), int(start)))
                found.update(row.values["attempt"] for row in rows)
        return found

    @_guarded
    def uncharge(self, instance: str, positions: Mapping[str, int]) -> None:
        """Give back this process's charges of ``instance`` at or beyond ``positions[key]``, for a
        process that stops cleanly at those positions of a sequential source (whose positions only
        grow): it never learned them (charged ahead, :mod:`panpriv.streamer.budget.ahead`)."""
        with self._transaction() as writer:
            attempt = self._attempt_of(writer.db, instance)
            if not attempt:
                return
            for source, position in positions.items():
                for row in self._select(writer.db, "charges", "instance = ? AND source = ? AND attempt = ? AND stop > ?",
                                        (instance, source, attempt, int(position))):
                    if row.values["start"] < position:
                        writer.replace("charges", row, {"stop": int(position)})
                    else:
                        writer.remove("charges", row)

    def _register_lost(self, writer: _Writer, lost_instance: str, run: str, out: str, report: PrivacyReport,
                       now: float) -> None:
        rows = self._select(writer.db, "instances", "instance = ?", (lost_instance,))
        if rows:
            kept = weakest(PrivacyReport.from_dict(json.loads(rows[0].values["report"])), report)
            writer.replace("instances", rows[0], {"report": _dumps(kept.to_dict()), "updated": now, "provisional": 0})
        else:
            writer.put("instances", {"instance": lost_instance, "run": run, "report": _dumps(report.to_dict()),
                                     "out": out, "started": now, "updated": now, "provisional": 0})

    def _count_loss(self, writer: _Writer, run: str) -> None:
        for row in self._select(writer.db, "runs", "run = ?", (run,)):
            writer.replace("runs", row, {"losses": int(row.values["losses"]) + 1})

    @_guarded
    def holds(self, prefix: str) -> bool:
        """Whether some charge's data key starts with ``prefix``."""
        with self._read() as db:
            return db.execute("SELECT 1 FROM charges WHERE substr(source, 1, ?) = ? LIMIT 1",
                              (len(prefix), prefix)).fetchone() is not None

    @_guarded
    def adopt(self, old_key: str, new_key: str, order: str) -> int:
        """Rename the charges of data key ``old_key`` to ``new_key``, made in ``order`` (a file's
        byte-digest key of schema 1 becomes its content key; positions are line indices in both).
        Returns the rows renamed."""
        with self._transaction() as writer:
            rows = self._select(writer.db, "charges", "source = ?", (old_key,))
            for row in rows:
                writer.replace("charges", row, {"source": new_key, "ord": order})
        return len(rows)

    # -- reading -------------------------------------------------------------------------------------

    def _charges(self, db: sqlite3.Connection, sources: Iterable[str] | None) -> list[Charge]:
        """Charges (of ``sources``; ``None``: all) in the order they were made."""
        if sources is None:
            rows = self._select(db, "charges")
        else:
            keys = sorted(set(sources))
            rows = []
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                rows += self._select(db, "charges", f"source IN ({','.join('?' * len(chunk))})", chunk)
            rows.sort(key=lambda r: r.rowid)
        return [Charge(r.values["instance"], r.values["source"], r.values["start"], r.values["stop"], r.values["ord"])
                for r in rows]

    def _reports(self, db: sqlite3.Connection, names: Iterable[str]) -> dict[str, PrivacyReport]:
        names = sorted(set(names))
        reports: dict[str, PrivacyReport] = {}
        for i in range(0, len(names), 500):
            chunk = names[i : i + 500]
            for row in self._select(db, "instances", f"instance IN ({','.join('?' * len(chunk))})", chunk):
                reports[row.values["instance"]] = PrivacyReport.from_dict(json.loads(row.values["report"]))
        return reports

    @_guarded
    def ledger(self, sources: Iterable[str] | None = None) -> PrivacyLedger:
        """Every use of ``sources`` (data keys; ``None``: all) by every run, composed."""
        with self._read() as db:
            charges = self._charges(db, sources)
            reports = self._reports(db, {c.instance for c in charges})
        missing = {c.instance for c in charges} - set(reports)
        if missing:
            raise BudgetError(f"{self.path}: charges name instances {sorted(missing)} without a report (damaged store)")
        return compose(reports, charges, self.max_records_per_user)

    @_guarded
    def instances(self) -> dict[str, InstanceInfo]:
        with self._read() as db:
            rows = self._select(db, "instances")
        return {
            r.values["instance"]: InstanceInfo(r.values["instance"], r.values["run"],
                                               PrivacyReport.from_dict(json.loads(r.values["report"])), r.values["out"],
                                               r.values["started"])
            for r in rows
        }

    @_guarded
    def runs(self) -> list[RunState]:
        with self._read() as db:
            names = [row.values["run"] for row in self._select(db, "runs")]
            states = [self._run_state(db, name) for name in names]
        return sorted((s for s in states if s is not None), key=lambda s: s.started)


def _when(timestamp: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


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
    every run (output directory, start, last durable checkpoint, its attempts) and its instances'
    reports; the identification rule."""
    refuse_non_directory(Path(directory))
    path = Path(directory) / DATABASE_NAME
    if not path.exists():
        return f"budget store {path}: empty (no run has used this state directory)"
    return describe_opened(BudgetStore(Path(directory)), contains)


def describe_opened(store: Any, contains: str | None = None) -> str:
    """:func:`describe_store` for an opened store (SQLite or Kafka); closes it."""
    from panpriv.accounting.budget import per_source
    from panpriv.streamer.sources.identity import IDENTIFICATION_RULE

    path = store.path
    try:
        ledger = store.ledger()
        instances = store.instances()
        runs = store.runs()
        attempts = store.attempts()
        generation = store.generation
    finally:
        store.close()
    now = time.time()
    lines = [f"budget store {path} (store {store.store_id}, generation {generation:,})",
             f"  identification: {IDENTIFICATION_RULE}"]
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
        mine = [a for a in attempts if a.run == run.run]
        ended = "; ".join(f"{a.attempt}: {a.state(now)}" for a in mine[-3:]) or (
            "stopped cleanly" if run.clean else "running, or crashed")
        lines.append(
            f"    {run.run}: out {run.out}, source {run.source}, started {_when(run.started)}, last durable checkpoint "
            f"{run.sequence}, {len(mine)} process(es) (latest: {ended})"
            + (f", {run.losses} crash loss(es) accounted" if run.losses else "")
        )
        for info in sorted(instances.values(), key=lambda i: i.instance):
            if info.run == run.run:
                lines.append(f"      {info.instance}: output {info.report.output}, intrusion {info.report.intrusion}")
    return "\n".join(lines)
