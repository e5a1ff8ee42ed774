"""Every file panpriv writes is its owner's alone, whatever the umask (issue 35, point 5).

On the base, under umask 000, a run left ``snapshots.jsonl`` and the metrics textfile 0666 and
``--out``, its ``checkpoints/`` and ``--state-dir`` 0777 (anyone could delete or plant files in
them), and ``keygen`` wrote the public and verify keys 0666 (anyone could replace the key clients
encrypt to). Now: state and records 0600 in 0700 directories; the files made for others to read
(public and verify keys, the textfile node_exporter reads) 0644 in a 0755 public directory.
Each test runs under umask 000 (restored after).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from panpriv.streamer.budget.store import DATABASE_NAME, BudgetStore
from panpriv.streamer.commands.cli import main
from panpriv.streamer.scaleout.worker import worker_state
from tests.faults.conftest import synthetic_args


@pytest.fixture
def no_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_under(root: Path) -> dict[str, int]:
    """The mode of ``root`` and of everything below it, by path relative to ``root``'s parent."""
    found = {root.name: mode(root)}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            path = Path(directory) / name
            found[str(path.relative_to(root.parent))] = mode(path)
    return found


@pytest.mark.usefixtures("no_umask")
def test_a_run_writes_private_files_in_private_directories(tmp_path: Path) -> None:
    out, state, textfile = tmp_path / "out", tmp_path / "state", tmp_path / "metrics.prom"
    args = [*synthetic_args(out, "--checkpoint-every", "500"), "-q", "--state-dir", str(state),
            "--metrics-textfile", str(textfile)]
    assert main(args) == 0
    files = {**modes_under(out), **modes_under(state)}
    assert {"out/snapshots.jsonl", "out/panpriv.lock", "out/checkpoints/checkpoint.json", "state/budget.sqlite"} <= set(files)
    directories = {name for name in files if (tmp_path / name).is_dir()}
    assert directories == {"out", "out/checkpoints", "state"}
    assert {name: m for name, m in files.items() if m != (0o700 if name in directories else 0o600)} == {}
    assert mode(textfile) == 0o644


@pytest.mark.usefixtures("no_umask")
def test_a_snapshot_file_of_an_earlier_version_becomes_private(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    (out / "snapshots.jsonl").write_bytes(b"")
    (out / "snapshots.jsonl").chmod(0o666)
    assert main([*synthetic_args(out), "-q", "--state-dir", str(tmp_path / "state")]) == 0
    assert mode(out / "snapshots.jsonl") == 0o600


@pytest.mark.usefixtures("no_umask")
def test_the_budget_stores_journal_is_private(tmp_path: Path) -> None:
    """SQLite gives its rollback journal the database file's mode: held open mid-transaction here."""
    BudgetStore(tmp_path / "state").close()
    db = sqlite3.connect(tmp_path / "state" / DATABASE_NAME, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE probe(x)")
        db.execute("INSERT INTO probe VALUES (1)")
        journal = tmp_path / "state" / f"{DATABASE_NAME}-journal"
        assert journal.exists() and mode(journal) == 0o600
        db.execute("ROLLBACK")
    finally:
        db.close()


@pytest.mark.usefixtures("no_umask")
def test_role_states_are_private(tmp_path: Path) -> None:
    state = worker_state(tmp_path / "worker")
    lock = state.lock()
    try:
        state.save({"instance": "scaleout:default/worker-0123456789ab"})
    finally:
        lock.release()
    assert modes_under(tmp_path / "worker") == {"worker": 0o700, "worker/panpriv.lock": 0o600, "worker/worker.json": 0o600}


@pytest.mark.usefixtures("no_umask")
def test_keys_private_and_public_files_have_their_own_modes(tmp_path: Path) -> None:
    assert main(["-q", "keygen", str(tmp_path / "keys"), "--role", "shuffler", "--public-dir", str(tmp_path / "public")]) == 0
    keys = modes_under(tmp_path / "keys")
    assert keys.pop("keys") == 0o700
    assert sorted(keys.values()) == [0o600, 0o644, 0o644] and all(
        m == (0o600 if name.endswith(".key") else 0o644) for name, m in keys.items())
    public = modes_under(tmp_path / "public")
    assert public.pop("public") == 0o755
    assert len(public) == 2 and set(public.values()) == {0o644}
