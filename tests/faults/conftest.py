"""Fixtures of the fault-injection suite: a real finished run to corrupt, small file systems."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.harness import run_panpriv

SYNTHETIC = "synthetic:n=3000&dim=5"


def synthetic_args(out: Path, *extra: str) -> list[str]:
    return ["run", "--source", SYNTHETIC, "--dim", "5", "--feature-bound", "1", "--rate", "0", "--out", str(out),
            "--metrics-port", "0", "--progress", "off", *extra]


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The --out directory of a real, finished synthetic run (do not modify: copy it). Its budget
    store is its own: the session's store is read by other session-scoped fixtures."""
    workdir = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PANPRIV_STATE_DIR", str(workdir / "state"))
        code, output = run_panpriv(synthetic_args(workdir / "out"), workdir)
    assert code == 0, output
    return workdir / "out"


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`finished_run`'s directory."""
    copy = tmp_path / "out"
    shutil.copytree(finished_run, copy)
    return copy


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``tmpfs(size="256k", options="")`` mounts a fresh tmpfs and returns its path (root only;
    the test is skipped with the reason when mounting is not possible)."""
    mounted: list[Path] = []

    def mount(size: str = "256k", options: str = "") -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        opts = f"size={size}" + (f",{options}" if options else "")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {result.stderr.strip()}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in mounted:
            with contextlib.suppress(Exception):
                subprocess.run(["umount", "-l", str(point)], check=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The soak campaign's figures table (tests/faults/figures.py), when ``-m soak`` selected it."""
    from tests.faults.figures import FIGURES

    if "soak" in (config.option.markexpr or "") and "not soak" not in config.option.markexpr and not FIGURES.empty():
        terminalreporter.write_sep("=", "soak figures")
        for line in FIGURES.table()[2:]:
            terminalreporter.write_line(line)
