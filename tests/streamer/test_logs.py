"""Operator logs: the periodic status line off a terminal, JSON lines, --log-level, first rejects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from panpriv.streamer.commands.cli import _after_command, build_parser

REPOSITORY = Path(__file__).resolve().parents[2]


def write_records(path: Path, n: int, dim: int, bad: int = 0) -> Path:
    with open(path, "w") as handle:
        for i in range(n):
            x = [0.05] * (dim + 1 if i < bad else dim)
            handle.write(json.dumps({"x": x, "y": 1 if i % 2 else -1}) + "\n")
    return path


def panpriv(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A child process whose stdout and stderr are pipes (not a terminal)."""
    return subprocess.run([sys.executable, "-m", "panpriv", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={"PYTHONPATH": str(REPOSITORY), "PANPRIV_STATE_DIR": str(cwd / "state"),
                                        "PATH": "/usr/bin:/bin"})


def test_status_line_at_the_interval_as_json(tmp_path: Path) -> None:
    data = write_records(tmp_path / "d.jsonl", 3000, 4, bad=50)
    result = panpriv("run", "--source", f"file:{data}", "--dim", "4", "--feature-bound", "1", "--rate", "1500",
                     "--metrics-port", "0", "--out", str(tmp_path / "out"), "--status-every", "0.5",
                     "--log-format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]  # every line is one JSON object
    status = [e["status"] for e in entries if e["logger"] == "panpriv.status" and "status" in e]
    assert len(status) >= 2  # about 2 s of paced reading at one line per 0.5 s
    assert [s["records"] for s in status] == sorted(s["records"] for s in status)
    assert status[-1]["rejected"] == {"wrong_dimension": 50} and status[-1]["epsilon_output"] == 1.0
    assert {"lag_records", "next_checkpoint_records", "next_checkpoint_seconds"} <= status[0].keys()
    firsts = [e for e in entries if e["level"] == "WARNING" and "rejected as 'wrong_dimension'" in e["message"]]
    assert len(firsts) == 1 and "[0, " in firsts[0]["message"]


def test_log_level_after_the_subcommand_and_no_status_when_off(tmp_path: Path) -> None:
    data = write_records(tmp_path / "d.jsonl", 500, 3)
    result = panpriv("run", "--log-level", "warning", "--source", f"file:{data}", "--dim", "3", "--feature-bound", "1",
                     "--rate", "0", "--metrics-port", "0", "--out", str(tmp_path / "out"), "--status-every", "0",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert " INFO " not in result.stderr and "status:" not in result.stderr


def test_global_flags_with_values_before_the_subcommand_stay_out_of_the_resume_hint() -> None:
    argv = ["--log-level", "DEBUG", "--log-format", "json", "-q", "run", "--out", "a b"]
    assert _after_command(argv) == ["--out", "a b"]
    args = build_parser().parse_args(["run", "--log-format", "json", "--log-level", "debug"])
    assert (args.log_format, args.log_level) == ("json", "DEBUG")
