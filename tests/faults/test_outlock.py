"""Two processes on one ``--out`` (or one client ``--state`` file): the second is refused with one
line, naming the holder's PID or saying why it cannot be read (issue 15, failure 2; issue 35)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from panpriv.streamer.errors import OutputBusyError, OutputError
from panpriv.streamer.esa.gd_client import AnsweredRounds
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.state.lock import LOCK_NAME, OutputLock
from tests.faults.harness import ROOT, assert_no_traceback, run_panpriv, slow_synthetic_run, start_panpriv, wait_for


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
        second.process.send_signal(signal.SIGTERM)
        # A clean stop ends with a durable checkpoint (fsyncs): under load, beside other suites'
        # writes, it took longer than stop()'s 10-s grace once, and stop() then killed it (-9).
        assert second.wait(60) == 0, second.output()[-3000:]
    finally:
        second.stop()


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


def test_a_refusal_after_the_lock_file_was_deleted_says_why_the_pid_is_unknown(tmp_path) -> None:
    """On the base the second process said "PID unknown" once ``panpriv.lock`` was deleted, and
    "PID 0" when it was replaced by a file holding 0: neither is the holder. Now it says that the
    lock file was removed or replaced, that the directory's lock still holds, and how to find the
    holder."""
    with OutputLock(tmp_path):
        (tmp_path / LOCK_NAME).unlink()
        with pytest.raises(OutputBusyError) as deleted:
            OutputLock(tmp_path).acquire()
        (tmp_path / LOCK_NAME).write_text("0\n")
        with pytest.raises(OutputBusyError) as replaced:
            OutputLock(tmp_path).acquire()
    for refusal in (str(deleted.value), str(replaced.value)):
        assert "unknown" not in refusal and "PID 0" not in refusal and "\n" not in refusal, refusal
        assert f"lock file {tmp_path / LOCK_NAME} was removed or replaced" in refusal, refusal
        assert f"lsof {tmp_path}" in refusal, refusal


def rounds_model(round_: int = 0) -> ModelRecord:
    """A shuffle-gd model record: only its plan (deployment, learner, calibration) and round matter
    to :class:`AnsweredRounds`."""
    import numpy as np

    return ModelRecord("shuffle-gd", "default", round_, np.zeros(3), {"rounds": 4, "batch_size": 8}, "k", (1.0, 1e-6))


_HOLD_STATE = """
import sys, time
from pathlib import Path
from panpriv.streamer.errors import OutputBusyError
from panpriv.streamer.esa.gd_client import AnsweredRounds
try:
    state = AnsweredRounds(Path(sys.argv[1]))
except OutputBusyError as exc:
    print(f"refused: {exc}", flush=True)
    sys.exit(1)
print("held", flush=True)
time.sleep(600)
"""
"""A client process holding the state file ``argv[1]`` (or refused: one line, exit 1)."""


def test_two_clients_on_one_state_file_the_second_is_refused_with_one_line(tmp_path: Path) -> None:
    """``panpriv encode --state`` (a shuffle-gd user's answered rounds). On the base the file was
    sealed but not locked: a second client on it ran, and both answered the rounds the other had
    not recorded yet. Now the file is locked (not its folder, which other users' files may share):
    a second process is refused with one line naming ``--state``, also after ``<file>.lock`` was
    deleted (the saved state file itself is locked too); another file in the same folder is free."""
    path = tmp_path / "users" / "alice.gd-rounds.json"
    first = AnsweredRounds(path)
    first.record(rounds_model(0))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_STATE, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = holder.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        holder.kill()
        out, err = holder.communicate()
    assert holder.returncode == 1 and out.startswith(f"refused: --state {path} is in use") and not err, (out, err)
    first.close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_STATE, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for deleted in (False, True):
            if deleted:
                path.with_name(path.name + ".lock").unlink()
            with pytest.raises(OutputBusyError) as refused:
                AnsweredRounds(path)
            message = str(refused.value)
            assert message.startswith(f"--state {path} is in use by another panpriv process") and "\n" not in message
            assert "--out" not in message and (f"PID {holder.pid}" in message) != deleted, message
        other = AnsweredRounds(path.with_name("bob.gd-rounds.json"))  # the folder is not locked
        other.close()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    again = AnsweredRounds(path)  # kill -9 released it
    assert again.rounds == [0]
    again.close()


def test_a_client_whose_lock_file_was_deleted_before_its_first_save_stops_before_writing(tmp_path: Path) -> None:
    """Before the first answer there is no state file to lock: a deleted ``<file>.lock`` then lets
    a second process take a new one. The first finds out before it writes and stops (one line), so
    only one of them ever records an answered round."""
    path = tmp_path / "alice.json"
    first = AnsweredRounds(path)
    path.with_name(path.name + ".lock").unlink()
    second = AnsweredRounds(path)
    with pytest.raises(OutputBusyError, match="was removed or replaced while this process ran"):
        first.record(rounds_model(0))
    assert not path.exists()
    second.record(rounds_model(0))
    second.close()
    first.close()


def test_a_client_state_in_an_unusable_folder_names_state_not_out(tmp_path: Path) -> None:
    """``prepare_output_directory`` said "--out" for the folder of a client's ``--state`` file too
    (here a dangling symbolic link: nothing to read, and no folder to write the state in)."""
    (tmp_path / "users").symlink_to(tmp_path / "gone")
    path = tmp_path / "users" / "alice.json"
    with pytest.raises(OutputError) as refused:
        state = AnsweredRounds(path)  # refused here now; on the base at the first answer
        state.record(rounds_model(0))
    message = str(refused.value)
    assert "--out" not in message and f"the folder of --state {path}: {tmp_path / 'users'}" in message, message


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


def second_process_is_refused(role: str, tmp_path: Path) -> str:
    """Start a process of ``role`` holding ``tmp_path/out``, delete ``panpriv.lock``, start a second
    one on the same directory: it must be refused with one line and exit 1, the holder untouched
    and ending cleanly on SIGTERM. Returns the refusal."""
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
        assert "was removed or replaced" in errors[0] and "unknown" not in errors[0], errors[0]
        assert holder.process.poll() is None, holder.output()  # the holder is untouched
        holder.process.send_signal(signal.SIGTERM)
        assert holder.wait(60) == 0, holder.output()
    finally:
        holder.stop()
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("role", ["run", "worker", "analyze"])
def test_deleting_the_lock_file_of_a_running_process_admits_no_second_one(role: str, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35, point 4, with real processes: ``panpriv.lock`` deleted while a run (or a role on its
    state directory) holds it; a second process on the same directory is still refused, with one
    line and exit 1, and the holder runs on."""
    monkeypatch.setenv("PANPRIV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PANPRIV_KAFKA__CONNECT_TIMEOUT_S", "3600")
    second_process_is_refused(role, tmp_path)


@pytest.mark.soak
def test_soak_two_processes_on_one_state_per_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The soak's "two processes on one state, per role": the service (``run``), a scale-out worker
    and an E-S-A analyzer on one directory, each with its lock file deleted, and a shuffle-gd client
    on one ``--state`` file (the other roles keep no state: the shuffler's is its consumer group's
    offsets, the coordinator's the model topic). Each second process is refused with one line."""
    from tests.faults.figures import FIGURES

    monkeypatch.setenv("PANPRIV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PANPRIV_KAFKA__CONNECT_TIMEOUT_S", "3600")
    for role in ("run", "worker", "analyze"):
        second_process_is_refused(role, tmp_path / role)
        FIGURES.second_refused[role] += 1
    test_two_clients_on_one_state_file_the_second_is_refused_with_one_line(tmp_path / "client")
    FIGURES.second_refused["encode --state"] += 1
