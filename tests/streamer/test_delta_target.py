"""The requested δ is a promise (panpriv.streamer.runtime.delta_target): refused at start unless accepted, never exceeded silently."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from panpriv.streamer.budget.store import BudgetStore
from panpriv.streamer.commands.cli import main
from panpriv.streamer.config import load_config
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.runtime.learners import build_learner, constructor_arguments
from panpriv.streamer.sources.identity import line_file_identity
from tests.streamer.test_cli_options import run_args


def final_privacy(out: Path) -> dict:
    return json.loads((out / "snapshots.jsonl").read_text().splitlines()[-1])["privacy"]


LOOSE_FLOOR = ("--set", "eta=0.5", "--set", "pan_delta=0.001")
"""shuffled-pnsgd with a pan floor above the requested delta (its default floor is the request:
with Thm 5's noise alone, Sordello et al. 2021's schedule, the service can no longer build it)."""


def test_a_learner_above_the_requested_delta_is_refused_before_anything_is_learned_or_charged(tmp_path: Path, capsys) -> None:
    code = main(run_args(tmp_path, "--learner", "shuffled-pnsgd", *LOOSE_FLOOR))
    error = capsys.readouterr().err
    assert code == 2, error
    assert "learner.delta: shuffled-pnsgd would report delta = " in error and "above the requested 1e-06" in error
    assert "--accept-larger-delta" in error and "Nothing was learned" in error
    assert not (tmp_path / "out" / "checkpoints" / "checkpoint.json").exists()
    records = load_config(None, {"source.url": f"file:{tmp_path / 'd.jsonl'}", "records.dim": 4,
                                 "records.feature_bound": 1.0}).records
    charged = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"])).ledger().sources
    assert line_file_identity(tmp_path / "d.jsonl", make_codec(records)).key not in charged


def test_an_accepted_larger_delta_runs_and_reports_at_most_the_planned_figure(tmp_path: Path, capsys) -> None:
    assert main(run_args(tmp_path, "--learner", "shuffled-pnsgd", *LOOSE_FLOOR, "--accept-larger-delta")) == 0
    capsys.readouterr()
    config = load_config(None, {"source.url": "synthetic:n=1&dim=4", "records.dim": 4, "records.feature_bound": 1.0,
                                "learner.name": "shuffled-pnsgd", "learner.options": {"eta": 0.5, "pan_delta": 0.001}})
    planned = build_learner(config, 300).planned_privacy()
    reported = final_privacy(tmp_path / "out")
    assert 1e-6 < reported["output"]["delta"] <= planned.output.delta
    assert reported["intrusion"]["delta"] <= planned.intrusion.delta


def test_pnsgd_takes_the_requested_delta_as_its_pan_floor_and_never_exceeds_it(tmp_path: Path, capsys) -> None:
    config = load_config(None, {"source.url": "synthetic:n=1&dim=4", "records.dim": 4, "records.feature_bound": 1.0,
                                "learner.name": "pnsgd", "learner.delta": 1e-5, "learner.options": {"eta": 0.5}})
    assert constructor_arguments(config, 300)["pan_delta"] == 1e-5
    assert main(run_args(tmp_path, "--learner", "pnsgd", "--set", "eta=0.5", "--delta", "1e-5")) == 0
    capsys.readouterr()
    reported = final_privacy(tmp_path / "out")
    assert 0.0 < reported["output"]["delta"] <= 1e-5 and 0.0 < reported["intrusion"]["delta"] <= 1e-5


def test_a_pan_floor_above_the_request_is_refused_naming_the_option(tmp_path: Path, capsys) -> None:
    assert main(run_args(tmp_path, "--learner", "pnsgd", "--set", "eta=0.5", "--set", "pan_delta=0.001")) == 2
    error = capsys.readouterr().err
    assert "pnsgd would report delta = 0.001" in error and "learner.options.pan_delta" in error


@pytest.mark.parametrize(("learner", "options", "warned"), [
    ("shuffled-pnsgd", '{"eta": 0.5, "pan_delta": 0.001}', True),
    ("shuffled-pnsgd", "{}", False),
    ("pnsgd", '{"eta": 0.5}', False),
    ("pan-acsa", "{}", False),
])
def test_panpriv_privacy_states_the_planned_delta(learner: str, options: str, warned: bool, capsys) -> None:
    assert main(["privacy", "--learner", learner, "--n", "1000", "--dim", "4", "--feature-bound", "1",
                 "--options", options]) == 0
    out = capsys.readouterr().out
    assert ("WARNING: delta = " in out and "--accept-larger-delta" in out) == warned
    assert main(["privacy", "--learner", learner, "--n", "1000", "--dim", "4", "--feature-bound", "1",
                 "--options", options, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["delta_above_request"] == warned
    assert (answer["planned"]["output"]["delta"] > 1e-6) == warned
