"""Helpers shared by the fault-injection tests: the real ``panpriv`` as a child process.

A child runs ``python -m panpriv`` from the repository root (so this checkout's code runs)
in its own session, with stdout and stderr in files the test reads afterwards. Every child is
stopped by its own PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Child:
    """A running ``panpriv`` command and the files holding its output."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s (cleanup only: tests send their own signals)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_panpriv(args: list[str], logs: Path, name: str = "panpriv") -> Child:
    """Start ``panpriv ARGS`` with its output in ``logs/<name>.out`` and ``logs/<name>.err``."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "panpriv", *args], stdout=out, stderr=err, cwd=ROOT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return Child(process, stdout, stderr)


def run_panpriv(args: list[str], logs: Path, name: str = "panpriv", timeout_s: float = 60) -> tuple[int, str]:
    """Run ``panpriv ARGS`` to completion; return its exit code and its whole output."""
    child = start_panpriv(args, logs, name)
    try:
        code = child.wait(timeout_s)
    finally:
        child.stop()
    return code, child.output()


def wait_for(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001 - any zero-argument callable
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text, text[-3000:]


def slow_synthetic_run(out: Path, n: int = 1_000_000, rate: int = 2000) -> list[str]:
    """``panpriv run`` arguments for a paced synthetic run that lasts until stopped."""
    return [
        "run", "--source", f"synthetic:n={n}&dim=5", "--dim", "5", "--feature-bound", "1", "--rate", str(rate),
        "--out", str(out), "--metrics-port", "0", "--checkpoint-every", "500", "--progress", "off",
    ]
