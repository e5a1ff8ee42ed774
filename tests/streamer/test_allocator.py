"""The long-running commands restart themselves with the allocator that erases what it frees, and say so.

The re-execution itself (panpriv.streamer.runtime.allocator) is checked on the real process: its
environment while it runs, the line it logs at start, the statement it prints; with
``PANPRIV_ALLOCATOR=default`` it runs as it was started, warns, and its statement says that raw
records read earlier may remain. What the allocator achieves is measured by
tests/streamer/test_service_intruder.py (no raw record older than K micro-batches).
"""

from __future__ import annotations

import time

import pytest

from panpriv.streamer.runtime import allocator
from tests.faults.harness import run_panpriv, start_panpriv

pytestmark = pytest.mark.skipif(not allocator.supported(), reason="the wiping allocator needs Linux with glibc")


def args(out) -> list[str]:  # noqa: ANN001
    return ["run", "--source", "synthetic:n=3000&dim=4", "--dim", "4", "--feature-bound", "1", "--out", str(out),
            "--metrics-port", "0", "--progress", "off"]


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        pairs = [entry.split(b"=", 1) for entry in handle.read().split(b"\0") if b"=" in entry]
    return {k.decode(): v.decode() for k, v in pairs}


def test_run_restarts_with_the_wiping_allocator_and_states_it(tmp_path) -> None:
    child = start_panpriv([*args(tmp_path / "out"), "--rate", "500"], tmp_path)
    try:
        deadline = time.monotonic() + 30
        while environment(child.process.pid).get("PANPRIV_ALLOCATOR") != "wiping":
            assert time.monotonic() < deadline, child.output()[-2000:]
            time.sleep(0.05)
        env = environment(child.process.pid)  # the same PID: re-executed in place
        assert env["PYTHONMALLOC"] == allocator.PYTHONMALLOC
        assert env["GLIBC_TUNABLES"].startswith("glibc.malloc.perturb=255")  # glibc splits the rest at ':' in place
        assert child.wait(60) == 0
    finally:
        child.stop()
    output = child.output()
    assert "memory: freed memory is overwritten" in output
    assert "raw records of at most the last 2 micro-batches" in output  # the statement printed at the end
    assert "checkpoints on disk hold the learner state at its last batch boundary" in output


def test_the_switch_turns_it_off_and_the_statement_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PANPRIV_ALLOCATOR", "default")
    code, output = run_panpriv(args(tmp_path / "out"), tmp_path)
    assert code == 0, output[-2000:]
    assert "the wiping allocator is off" in output
    assert "raw records read earlier may remain in freed memory" in output
