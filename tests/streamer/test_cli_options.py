"""Learner options from the command line of ``panpriv run`` (--options, --set, --radius, --intercept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from panpriv.streamer.commands.cli import build_parser, main


def write_records(path: Path, n: int, dim: int) -> Path:
    with open(path, "w") as handle:
        for i in range(n):
            handle.write(json.dumps({"x": [0.1 * ((i + j) % 3 - 1) for j in range(dim)], "y": 1 if i % 2 else -1}) + "\n")
    return path


def run_args(tmp_path: Path, *extra: str) -> list[str]:
    data = write_records(tmp_path / "d.jsonl", 300, 4)
    return ["run", "--source", f"file:{data}", "--dim", "4", "--feature-bound", "1", "--rate", "0",
            "--metrics-port", "0", "--out", str(tmp_path / "out"), *extra]


def test_every_way_of_setting_options_reaches_the_learner_and_the_summary(tmp_path: Path, capsys) -> None:
    code = main(run_args(tmp_path, "--learner", "pnsgd", "--options", '{"eta": 0.5, "C1": 50}', "--set", "eta=0.05",
                         "--set", "loss.ridge=0.01", "--radius", "3", "--intercept"))
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.strip().startswith("options"))
    assert "eta=0.05" in line and "C1=50" in line and "radius=3.0" in line  # --set after --options wins
    assert '"intercept": true' in line and '"ridge": 0.01' in line and '"name": "logistic"' in line


def test_pnsgd_runs_with_data_settings_only_and_accepts_eta_at_two_over_beta(tmp_path: Path, capsys) -> None:
    """Issue 38: pnsgd needs no option (its step size and pan floor are its own defaults), and
    eta = 2/beta is accepted although beta = (1 + 1)/4 computes to 0.5000000000000001."""
    assert main(run_args(tmp_path, "--learner", "pnsgd")) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("options"))
    assert 'schedule="floor"' in line and "pan_delta=1e-06" in line and "radius=2.0" in line
    assert main(run_args(tmp_path, "--learner", "pnsgd", "--set", "eta=4", "--out", str(tmp_path / "out2"))) == 0
    assert "eta=4" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "message"), [
    (["--options", "{radius: 3}"], "--options: not valid JSON"),
    (["--options", "[3]"], "--options: must be a JSON object"),
    (["--set", "radius"], "expected KEY=VALUE"),
    (["--set", "radus=3"], "learner.options.radus: PanPrivateACSA has no parameter 'radus'; accepted: "),
])
def test_bad_options_name_the_option(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    assert main(run_args(tmp_path, *flags)) == 2
    assert message in capsys.readouterr().err


def test_radius_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--radius", "0"])
