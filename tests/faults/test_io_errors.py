"""I/O failures and foreign checkpoints end in one line naming the problem, never a traceback
(issue 15, failure 4), and the last good checkpoint survives a full disk."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from panpriv.streamer.commands.cli import main
from panpriv.streamer.state.checkpoint import CheckpointStore
from panpriv.streamer.state.integrity import seal_document
from tests.faults.conftest import synthetic_args
from tests.faults.harness import assert_no_traceback, run_panpriv, slow_synthetic_run, start_panpriv, wait_for


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if ": error:" in line]


def fill_file_system(directory: Path) -> Path:
    """Fill ``directory``'s file system to the last byte with a file there; return the file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 512):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def manifest(out):  # noqa: ANN001
    return out / "checkpoints" / "checkpoint.json"


def resealed(out, change) -> bytes:  # noqa: ANN001
    """The real manifest with ``change(body)`` applied and a valid checksum (a well-formed but wrong file)."""
    body = json.loads(manifest(out).read_text())
    body.pop("sha256")
    change(body)
    return bytes(seal_document(body).view())


CORRUPTIONS = {
    "empty list": lambda out: b"[]",
    "null": lambda out: b"null",
    "not utf-8": lambda out: b"\xff\xfe{\x00",
    "empty file": lambda out: b"",
    "truncated": lambda out: manifest(out).read_bytes()[:100],
    "foreign json": lambda out: b'{"hello": "world"}',
    "unknown ledger schema": lambda out: resealed(out, lambda b: b["ledger"].update(schema_version=99)),
    "negative position": lambda out: resealed(out, lambda b: b["positions"].update({next(iter(b["positions"])): -5})),
    "unknown key": lambda out: resealed(out, lambda b: b.update(surprise=1)),
    "position as text": lambda out: resealed(out, lambda b: b["positions"].update({next(iter(b["positions"])): "5"})),
}
EXPECTED = {
    "empty list": "not an object", "null": "not an object", "not utf-8": "not UTF-8", "empty file": "not valid JSON",
    "truncated": "not valid JSON", "foreign json": "unknown keys", "unknown ledger schema": "schema_version 99",
    "negative position": "positions must map", "unknown key": "unknown keys ['surprise']",
    "position as text": "positions must map",
}


@pytest.mark.parametrize("command", ["run", "inspect"])
@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_foreign_or_corrupt_checkpoint_is_one_line_error(name, command, run_copy, capsys) -> None:
    """In-process through the CLI's entry point (fast); any exception escaping fails the test."""
    manifest(run_copy).write_bytes(CORRUPTIONS[name](run_copy))
    argv = synthetic_args(run_copy) if command == "run" else ["inspect", str(run_copy)]
    code = main(argv)
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2, output
    errors = error_lines(output)
    assert len(errors) == 1 and EXPECTED[name] in errors[0] and "checkpoint.json" in errors[0], output


@pytest.mark.parametrize("command", ["run", "inspect"])
def test_corrupt_checkpoint_as_a_process_no_traceback(command, run_copy, tmp_path) -> None:
    manifest(run_copy).write_bytes(b"[]")
    argv = synthetic_args(run_copy) if command == "run" else ["inspect", str(run_copy)]
    code, output = run_panpriv(argv, tmp_path)
    assert code == 2 and len(error_lines(output)) == 1, output
    assert_no_traceback(output)


@pytest.mark.parametrize("command", ["run", "inspect"])
def test_checkpoint_that_is_a_directory(command, run_copy, tmp_path) -> None:
    manifest(run_copy).unlink()
    manifest(run_copy).mkdir()
    argv = synthetic_args(run_copy) if command == "run" else ["inspect", str(run_copy)]
    code, output = run_panpriv(argv, tmp_path)
    assert code == 2 and "is a directory" in output, output
    assert_no_traceback(output)


def test_out_is_a_file(tmp_path) -> None:
    out = tmp_path / "out"
    out.write_text("not a directory")
    code, output = run_panpriv(synthetic_args(out), tmp_path)
    assert code == 1 and "--out" in output and "not a directory" in output, output
    assert_no_traceback(output)


def test_out_not_writable(tmpfs, tmp_path) -> None:
    readonly = tmpfs("64k", "ro")
    code, output = run_panpriv(synthetic_args(readonly / "out"), tmp_path)
    assert code == 1 and "Read-only file system" in output and "writable" in output, output
    assert_no_traceback(output)


@pytest.mark.slow
def test_disk_full_keeps_the_last_good_checkpoint_and_no_tmp(tmpfs, tmp_path) -> None:
    disk = tmpfs("512k")
    out = disk / "out"
    child = start_panpriv(slow_synthetic_run(out, rate=4000), tmp_path)
    try:
        store = CheckpointStore(out / "checkpoints")
        wait_for(lambda: store.path.exists() and store.load().records > 0, 30, "a first checkpoint")
        filler = fill_file_system(disk)
        code = child.wait(30)
    finally:
        child.stop()
    output = child.output()
    assert code == 1, output
    assert_no_traceback(output)
    assert "No space left on device" in output and "free space" in output, output
    assert store.load().records > 0  # the last good checkpoint is intact and verifies
    assert not (out / "checkpoints" / "checkpoint.json.tmp").exists()
    filler.unlink()
    resumed = start_panpriv(slow_synthetic_run(out, rate=4000), tmp_path, "resume")  # space freed: the same command
    try:
        wait_for(lambda: "resuming from checkpoint" in resumed.output(), 30, "the resume")
        resumed.process.send_signal(signal.SIGTERM)
        assert resumed.wait(30) == 0, resumed.output()
    finally:
        resumed.stop()


@pytest.mark.slow
def test_full_budget_store_disk_is_one_line_error(tmpfs, tmp_path) -> None:
    """The budget store (SQLite) on a full file system: the run stops with one line naming the store
    and the fix, no traceback, and nothing is learned past the last durable charge."""
    disk = tmpfs("512k")
    out = tmp_path / "out"
    child = start_panpriv([*slow_synthetic_run(out, rate=4000), "--state-dir", str(disk)], tmp_path)
    try:
        store = CheckpointStore(out / "checkpoints")
        wait_for(store.path.exists, 30, "a first checkpoint")  # (pan-acsa's first batch boundary may come later)
        fill_file_system(disk)
        code = child.wait(60)
    finally:
        child.stop()
    output = child.output()
    assert code == 1, output
    assert_no_traceback(output)
    assert "budget store failed" in output and "--state-dir" in output, output
