"""No silent composition (issue 36): a run over records that earlier runs used says so in one line at
start (the runs, ε so far, ε after this run); a run that reads past its planned n warns once with
what that means for its learner; the demos keep their own budget store."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from panpriv.streamer.config import load_config
from panpriv.streamer.runtime.processor import Processor

ROOT = Path(__file__).resolve().parents[2]


def records_file(path: Path, n: int = 300) -> Path:
    rng = np.random.default_rng(3)
    X = rng.uniform(-0.5, 0.5, (n, 3))
    path.write_text("".join(f'{{"x": [{a!r}, {b!r}, {c!r}], "y": {1 if a > 0 else -1}}}\n' for a, b, c in X.tolist()))
    return path


def run(source: Path, out: Path, state: Path, **extra: Any) -> Any:
    overrides = {"source.url": f"file:{source}", "records.dim": 3, "records.feature_bound": 1.0, "metrics.port": None,
                 "out": str(out), "budget.state_dir": str(state), "source.batch_records": 50, **extra}
    return Processor(load_config(None, overrides)).run()


def notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "were used before" in r.getMessage()]


def test_a_run_over_used_records_says_so_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = records_file(tmp_path / "records.jsonl")
    caplog.set_level(logging.INFO, logger="panpriv")
    first = run(source, tmp_path / "a", tmp_path / "state")
    assert notices(caplog) == []  # fresh records: nothing to say
    caplog.clear()
    run(source, tmp_path / "b", tmp_path / "state")
    (line,) = notices(caplog)
    assert f"by 1 run(s) ({first.instance})" in line
    assert "ε = 1 so far, up to ε = 2 after this run" in line
    caplog.clear()
    third = run(source, tmp_path / "c", tmp_path / "state", **{"learner.epsilon": 0.5})
    (line,) = notices(caplog)
    assert "by 2 run(s)" in line and "ε = 2 so far, up to ε = 2.5 after this run" in line
    assert third.report.output.epsilon == pytest.approx(2.5)  # what the line announced is what the run reports
    caplog.clear()
    run(source, tmp_path / "d", tmp_path / "other-state")  # another store: these records are fresh there
    assert notices(caplog) == []


def test_reading_past_the_planned_n_warns_once_with_the_consequence(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = records_file(tmp_path / "records.jsonl", 300)
    caplog.set_level(logging.WARNING, logger="panpriv")
    result = run(source, tmp_path / "a", tmp_path / "state", **{"learner.n": 100})
    assert result.records == 300
    warnings = [r.getMessage() for r in caplog.records if "read past the planned n" in r.getMessage()]
    assert len(warnings) == 1  # once, not once per micro-batch
    assert "n = 100 records" in warnings[0]
    assert "further epochs" in warnings[0] and "guarantee is unchanged" in warnings[0]
    caplog.clear()
    run(source, tmp_path / "b", tmp_path / "state2", **{"learner.n": 300})
    assert not [r for r in caplog.records if "read past the planned n" in r.getMessage()]


def test_make_report_and_make_run_keep_their_own_budget_store() -> None:
    makefile = (ROOT / "Makefile").read_text()
    report = re.search(r"^report:.*?(?=^\S)", makefile, re.S | re.M).group(0)
    assert "run --metrics-port 0 --out out/report-demo --state-dir out/report-demo/budget" in report
    assert "rm -rf out/report-demo" in report  # so every `make report` draws one run's ε
    demo = re.search(r"^run:.*?(?=^\S|\Z)", makefile, re.S | re.M).group(0)
    assert "--state-dir out/" in demo


def test_the_benchmarks_service_runs_keep_their_own_budget_store(tmp_path: Path) -> None:
    from benchmarks.service import service_config

    config = service_config("file:x.jsonl", "json", 3, 10, tmp_path / "out")
    assert config.budget.state_dir == tmp_path / "out" / "budget"
