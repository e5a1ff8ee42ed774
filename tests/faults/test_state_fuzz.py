"""Corrupted state through the real command line: one line and a fixed exit code, never a traceback
(issue 35, point 3 and "No traceback anywhere").

* The budget store: a bit flipped in one value of one row (the store's rows carry keyed checks,
  streamer/budget/store.py), and a bit flipped anywhere in the file, then ``panpriv budget`` and
  ``panpriv run`` over the same records on that store.
* The roles' states: a bit flipped anywhere in a sealed ``analyzer.json`` or ``worker.json``,
  then ``panpriv analyze`` / ``panpriv worker`` on that directory.

Each command runs through :func:`panpriv.streamer.commands.cli.main`, which prints one line and
returns a code of streamer/commands/exit_codes.py for every error it knows and re-raises a bug:
a traceback here is an exception out of ``main``. The CLI as a child process takes the same path
(tests/streamer/test_role_state.py runs it so).
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.budget.store import COLUMNS, DATABASE_NAME, BudgetError, BudgetStore
from panpriv.streamer.commands.cli import main
from panpriv.streamer.commands.exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from panpriv.streamer.esa.keys import generate
from panpriv.streamer.scaleout.worker import worker_state
from panpriv.streamer.state.role_state import RoleState
from tests.faults.figures import FIGURES
from tests.streamer.test_role_state import analyze_args, new_analyzer_state, worker_args

FLIPS = 100
SOAK_FLIPS = 500
"""Flips per target in ``make soak`` (marker ``soak``); the normal suite runs :data:`FLIPS`."""

EVERY_COUNT = pytest.mark.parametrize("flips", [FLIPS, pytest.param(SOAK_FLIPS, marks=pytest.mark.soak)])


def outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``panpriv ARGV``'s exit code and its error lines (an exception out of main fails the test)."""
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if ": error: " in line]


def flip_file(path: Path, clean: bytes, rng: random.Random) -> None:
    data = bytearray(clean)
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


# -- the budget store ---------------------------------------------------------------------------


@pytest.fixture
def charged_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """A budget store charged by a finished run, and the ``run`` arguments that use it again."""
    rng = np.random.default_rng(35)
    data = tmp_path / "data.jsonl"
    X = rng.uniform(-0.5, 0.5, (400, 3))
    data.write_text("".join(f'{{"x": {list(x)}, "y": {1 if x[0] > 0 else -1}}}\n' for x in X))
    state = tmp_path / "state"
    monkeypatch.setenv("PANPRIV_STATE_DIR", str(state))

    def run(out: str) -> list[str]:
        return ["-q", "run", "--source", f"file:{data}", "--dim", "3", "--feature-bound", "1", "--rate", "0",
                "--metrics-port", "0", "--progress", "off", "--out", str(tmp_path / out)]

    assert main(run("first")) == EXIT_OK
    return state / DATABASE_NAME, run("again")


def flip_a_row(store: Path, rng: random.Random) -> str:
    """Flip one bit of one value of one row (a table of COLUMNS or meta); return what was flipped."""
    db = sqlite3.connect(store)
    db.text_factory = bytes
    try:
        tables = [t for t in (*COLUMNS, "meta") if db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]]  # noqa: S608
        table = rng.choice(tables)
        rowid, *values = rng.choice(db.execute(f"SELECT rowid, * FROM {table}").fetchall())  # noqa: S608
        names = [d[0] for d in db.execute(f"SELECT * FROM {table} LIMIT 1").description]  # noqa: S608
        column = rng.randrange(len(values))
        value = values[column]
        if isinstance(value, bytes) and value:
            flipped = bytearray(value)
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            new: object = bytes(flipped).decode("utf-8", "surrogateescape").encode("utf-8", "surrogateescape")
            db.execute(f"UPDATE {table} SET {names[column]} = CAST(? AS TEXT) WHERE rowid = ?", (new, rowid))  # noqa: S608
        elif isinstance(value, int):
            db.execute(f"UPDATE {table} SET {names[column]} = ? WHERE rowid = ?", (value ^ (1 << rng.randrange(16)), rowid))  # noqa: S608
        elif isinstance(value, float):
            db.execute(f"UPDATE {table} SET {names[column]} = ? WHERE rowid = ?", (value + 2.0 ** rng.randrange(-8, 8), rowid))  # noqa: S608
        else:
            return ""
        db.commit()
        return f"{table}.{names[column]}"
    finally:
        db.close()


@EVERY_COUNT
def test_a_flipped_value_in_a_budget_store_row_is_one_line_and_exit_1(charged_store: tuple[Path, list[str]],
                                                                       capsys: pytest.CaptureFixture[str], flips: int) -> None:
    store, run = charged_store
    clean = store.read_bytes()
    rng = random.Random(35 + flips)
    flipped: Counter[str] = Counter()
    for _ in range(flips):
        store.write_bytes(clean)
        where = flip_a_row(store, rng)
        if not where:
            continue
        flipped[where] += 1
        for argv in (["budget"], run):
            code, errors = outcome(argv, capsys)
            assert code == EXIT_FAILURE and len(errors) == 1, (where, " ".join(argv[:2]), code, errors)
            assert "budget" in errors[0], errors
    assert sum(flipped.values()) >= flips * 9 // 10, flipped
    FIGURES.flipped("budget store (a value of a row; budget and run)", {"refused": sum(flipped.values())})
    print(f"\n{sum(flipped.values())} row flips refused: {dict(sorted(flipped.items()))}")


def ledger_of(store: Path) -> dict[str, object]:
    opened = BudgetStore(store.parent)
    try:
        return opened.ledger().to_dict()
    finally:
        opened.close()


@EVERY_COUNT
def test_a_bit_flipped_anywhere_in_the_budget_store_is_one_line_or_harmless(charged_store: tuple[Path, list[str]],
                                                                            capsys: pytest.CaptureFixture[str],
                                                                            flips: int) -> None:
    """A flip in free space, an index or a page header may leave every row intact (``budget`` reads
    it: exit 0, and the store's ledger is the clean one's); otherwise one line and exit 1."""
    store, _ = charged_store
    clean = store.read_bytes()
    ledger = ledger_of(store)
    rng = random.Random(36 + flips)
    codes: Counter[int] = Counter()
    for _ in range(flips):
        flip_file(store, clean, rng)
        code, errors = outcome(["budget"], capsys)
        assert code in (EXIT_OK, EXIT_FAILURE) and len(errors) == (code != EXIT_OK), (code, errors)
        assert code != EXIT_OK or ledger_of(store) == ledger, "a flipped store read as another ledger"
        codes[code] += 1
    print(f"\n{flips} file flips: exit codes {dict(codes)}")
    FIGURES.flipped("budget store (any bit of the file; budget)", {"refused": codes[EXIT_FAILURE], "harmless": codes[EXIT_OK]})
    assert codes[EXIT_FAILURE] > 0


def index_page(store: Path, index: str) -> tuple[int, int]:
    """The byte range of ``index``'s root page in ``store``."""
    db = sqlite3.connect(store)
    try:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()
    return (root - 1) * size, root * size


def test_a_bit_flipped_in_an_index_never_hides_charges(charged_store: tuple[Path, list[str]],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Every row passed its check when a bit flipped in ``charges_by_source`` made the charges of a
    data key vanish from the queries that use that index: ``panpriv run`` saw the records as never
    used (on the base, 1 of 300 random flips of the whole store did so, and 2 of these 100 flips
    within the index's page). Now SQLite's integrity check refuses such a store when it is opened."""
    store, run = charged_store
    clean = store.read_bytes()
    start, stop = index_page(store, "charges_by_source")
    rng = random.Random(37)
    codes: Counter[int] = Counter()
    for _ in range(FLIPS):
        data = bytearray(clean)
        data[rng.randrange(start, stop)] ^= 1 << rng.randrange(8)
        store.write_bytes(bytes(data))
        try:
            opened = BudgetStore(store.parent)
        except BudgetError as exc:
            assert "\n" not in str(exc)
        else:
            try:
                every = opened.ledger().to_dict()
                assert opened.ledger(sources=list(every["sources"])).to_dict() == every  # through the index
            finally:
                opened.close()
        code, errors = outcome(["budget"], capsys)
        assert code in (EXIT_OK, EXIT_FAILURE) and len(errors) == (code != EXIT_OK), (code, errors)
        codes[code] += 1
    print(f"\n{FLIPS} flips of the index's page: exit codes {dict(codes)}")


# -- the roles' states --------------------------------------------------------------------------


@EVERY_COUNT
@pytest.mark.parametrize("role", ["analyze", "worker"])
def test_a_bit_flipped_anywhere_in_a_role_state_is_refused_with_one_line_and_exit_2(
        role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flips: int) -> None:
    """Every flip that changes the state is refused (exit 2, the file named) before any broker is
    contacted; a flip that leaves the parsed state identical (``e``/``E`` in an exponent) reaches
    the broker wait, which ends at once here (exit 1, "no Kafka broker") — checked: the flipped
    file loads as exactly the clean state (no silent resume)."""
    monkeypatch.setenv("PANPRIV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PANPRIV_KAFKA__CONNECT_TIMEOUT_S", "0.01")
    out = tmp_path / "out"
    if role == "analyze":
        new_analyzer_state(out, "shuffle-gaussian")
        argv = analyze_args(out, generate(tmp_path / "keys", "analyzer").private)
        path = out / "analyzer.json"
    else:
        worker_state(out).save({"instance": "scaleout:default/worker-0123456789ab"},
                               budget_mark={"store": "ab" * 16, "generation": 0})
        argv = worker_args(out)
        path = out / "worker.json"
    clean = path.read_bytes()
    kind = "esa-analyzer" if role == "analyze" else "scaleout-worker"
    state = RoleState(out, path.name, kind).load()
    rng = random.Random(f"{role}-{flips}")
    codes: Counter[int] = Counter()
    for _ in range(flips):
        flip_file(path, clean, rng)
        code, errors = outcome(["-q", *argv], capsys)
        assert len(errors) == 1, errors
        if code == EXIT_USAGE:
            assert str(path) in errors[0], errors
        else:
            assert code == EXIT_FAILURE and "no Kafka broker" in errors[0], (code, errors)
            assert RoleState(out, path.name, kind).load() == state, "a flipped state resumed as another state"
        codes[code] += 1
    shutil.rmtree(tmp_path / "state", ignore_errors=True)
    print(f"\n{flips} flips of {path.name}: exit codes {dict(codes)}")
    FIGURES.flipped(path.name, {"refused": codes[EXIT_USAGE], "harmless": codes[EXIT_FAILURE]})
    assert codes[EXIT_USAGE] >= flips * 9 // 10


@EVERY_COUNT
def test_a_bit_flipped_in_a_shuffle_gd_client_state_is_refused_or_harmless(tmp_path: Path, flips: int) -> None:
    """The state of ``panpriv encode`` for shuffle-gd (the rounds a user answered). On the base, of
    100 flips of the unsealed file, 73 ended ``encode`` with a traceback (``JSONDecodeError``,
    ``UnicodeDecodeError``, ``KeyError``, ``ValueError``: no exit code) and 27 loaded a changed
    state (an answered round dropped lets her answer it twice). Now each is refused with one line
    (``CheckpointError``: exit 2) or loads the same state (``e``/``E``-style flips)."""
    from panpriv.streamer.commands.exit_codes import exit_code
    from panpriv.streamer.errors import CheckpointError
    from panpriv.streamer.esa.gd_client import STATE_FORMAT, AnsweredRounds

    path = tmp_path / "users.gd-rounds.json"
    plan = {"deployment": "default", "rounds": 8, "calibration": {"sigma": 1.5}}
    legacy = json.dumps({"format": STATE_FORMAT, "plan": plan, "rounds": [0, 1, 2, 5]}, sort_keys=True).encode()
    path.write_bytes(legacy)  # the format before sealing: loaded, and sealed at the next answer
    state = AnsweredRounds(path)
    assert (state.plan, state.rounds) == (plan, [0, 1, 2, 5])
    state._file.save({"format": STATE_FORMAT, "plan": state.plan, "rounds": state.rounds})
    state.close()
    clean = path.read_bytes()
    assert b'"sha256"' in clean and (path.stat().st_mode & 0o777) == 0o600
    rng = random.Random(38 + flips)
    outcomes: Counter[str] = Counter()
    for _ in range(flips):
        flip_file(path, clean, rng)
        try:
            loaded = AnsweredRounds(path)
        except CheckpointError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc) and exit_code(exc) == EXIT_USAGE
            outcomes["refused"] += 1
            continue
        loaded.close()
        assert (loaded.plan, loaded.rounds) == (plan, [0, 1, 2, 5])
        outcomes["same"] += 1
    print(f"\n{flips} flips of a shuffle-gd client state: {dict(outcomes)}")
    FIGURES.flipped("encode --state (shuffle-gd client)", {"refused": outcomes["refused"], "harmless": outcomes["same"]})
    assert outcomes["refused"] >= flips * 9 // 10
