"""Two processes on one ``--out``: the second is refused, naming the holder's PID (issue 15, failure 2)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from panpriv.streamer.errors import OutputBusyError
from panpriv.streamer.state.lock import LOCK_NAME, OutputLock
from tests.faults.harness import assert_no_traceback, run_panpriv, slow_synthetic_run, start_panpriv, wait_for


def holder_pid(out) -> str:  # noqa: ANN001
    try:
        return (out / LOCK_NAME).read_text().strip()
    except FileNotFoundError:
        return ""


@pytest.mark.slow
def test_second_process_on_the_same_out_is_refused_with_the_holders_pid(tmp_path) -> None:
    out = tmp_path / "out"
    first = start_panpriv(slow_synthetic_run(out), tmp_path, "first")
    try:
        wait_for(lambda: holder_pid(out) == str(first.pid), 30, "the first process holding the lock")
        code, output = run_panpriv(slow_synthetic_run(out), tmp_path, "second", timeout_s=30)
        assert code != 0
        assert_no_traceback(output)
        errors = [line for line in output.splitlines() if "error" in line]
        assert len(errors) == 1 and f"PID {first.pid}" in errors[0] and "--out" in errors[0], output
        assert first.process.poll() is None  # the holder is untouched
        first.process.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
    finally:
        first.stop()
    assert holder_pid(out) == ""  # released on a clean stop: no stale PID


@pytest.mark.slow
def test_lock_is_released_by_kill_9(tmp_path) -> None:
    out = tmp_path / "out"
    first = start_panpriv(slow_synthetic_run(out), tmp_path, "first")
    try:
        wait_for(lambda: holder_pid(out) == str(first.pid), 30, "the first process holding the lock")
        first.process.kill()
        first.wait(10)
    finally:
        first.stop()
    second = start_panpriv(slow_synthetic_run(out), tmp_path, "second")
    try:
        wait_for(lambda: holder_pid(out) == str(second.pid), 30, "the restarted process taking over the lock")
    finally:
        second.stop()
    assert second.process.returncode == 0


def test_lock_in_one_process_refuses_a_second_holder(tmp_path) -> None:
    with OutputLock(tmp_path):
        with pytest.raises(OutputBusyError, match=f"PID {os.getpid()}"):
            OutputLock(tmp_path).acquire()
    with OutputLock(tmp_path):  # released: can be taken again
        pass


def test_deleting_the_lock_file_does_not_admit_a_second_holder(tmp_path) -> None:
    """The lock is held on the directory's open descriptor, not only on the file (issue 35, point
    4: a deleted ``panpriv.lock`` let a second run start on the same ``--out``)."""
    with OutputLock(tmp_path):
        (tmp_path / LOCK_NAME).unlink()
        with pytest.raises(OutputBusyError, match="in use by another panpriv process"):
            OutputLock(tmp_path).acquire()
        (tmp_path / LOCK_NAME).write_text("0\n")  # replaced by another file: still held
        with pytest.raises(OutputBusyError):
            OutputLock(tmp_path).acquire()


def test_the_lock_file_is_private_whatever_the_umask(tmp_path) -> None:
    previous = os.umask(0)
    try:
        with OutputLock(tmp_path / "out"):
            assert (tmp_path / "out" / LOCK_NAME).stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(previous)


def role_args(role: str, out: Path, keys: Path) -> list[str]:
    """A process of ``role`` holding the lock of ``out``: ``run`` paced, a role waiting for a broker
    that never answers (``PANPRIV_KAFKA__CONNECT_TIMEOUT_S``: until the test stops it)."""
    from panpriv.streamer.esa.keys import generate
    from tests.streamer.test_role_state import analyze_args, worker_args

    if role == "run":
        return slow_synthetic_run(out)
    if role == "worker":
        return worker_args(out)
    analyzer = keys / "analyzer"
    private = next(analyzer.glob("analyzer-*.key"), None) or generate(analyzer, "analyzer").private
    return analyze_args(out, private)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["run", "worker", "analyze"])
def test_deleting_the_lock_file_of_a_running_process_admits_no_second_one(role: str, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35, point 4, with real processes: ``panpriv.lock`` deleted while a run (or a role on its
    state directory) holds it; a second process on the same directory is still refused, with one
    line and exit 1, and the holder runs on."""
    monkeypatch.setenv("PANPRIV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PANPRIV_KAFKA__CONNECT_TIMEOUT_S", "3600")
    out = tmp_path / "out"
    holder = start_panpriv(role_args(role, out, tmp_path / "keys"), tmp_path, "holder")
    try:
        wait_for(lambda: holder_pid(out) == str(holder.pid) or holder.process.poll() is not None, 120,
                 "the first process holding the lock")
        assert holder.process.poll() is None, holder.output()
        (out / LOCK_NAME).unlink()
        code, output = run_panpriv(role_args(role, out, tmp_path / "keys"), tmp_path, "second", timeout_s=120)
        assert code == 1, output
        assert_no_traceback(output)
        errors = [line for line in output.splitlines() if "error" in line]
        assert len(errors) == 1 and "is in use by another panpriv process" in errors[0], output
        assert holder.process.poll() is None, holder.output()  # the holder is untouched
        holder.process.send_signal(signal.SIGTERM)
        assert holder.wait(60) == 0, holder.output()
    finally:
        holder.stop()
