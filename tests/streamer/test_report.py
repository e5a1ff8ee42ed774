"""panpriv report: pictures and a page drawn from a run's released snapshots."""

from __future__ import annotations

import json
from pathlib import Path

from panpriv.streamer.commands.cli import main
from panpriv.streamer.runtime.processor import Processor
from tests.streamer.test_holdout import configure, write_records

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_run_with_a_holdout_gets_three_pictures_and_a_page(tmp_path: Path, capsys) -> None:
    holdout = write_records(tmp_path / "holdout.jsonl", 400, seed=5)
    result = Processor(configure(tmp_path, **{"snapshots.holdout": str(holdout)})).run()
    assert main(["report", str(tmp_path / "out")]) == 0
    written = [Path(line) for line in capsys.readouterr().out.split()]
    names = [path.name for path in written]
    assert names == ["privacy.png", "holdout.png", "throughput.png", "report.md"]
    for path in written[:3]:
        assert path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000  # a drawn picture, not an empty canvas
    page = written[3].read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and line[2].isdigit()]
    snapshots = [json.loads(line) for line in (tmp_path / "out" / "snapshots.jsonl").read_text().splitlines()]
    assert len(rows) == result.snapshots == len(snapshots)
    assert f"{snapshots[-1]['holdout']['auc']:.4f}" in rows[-1] and "![holdout.png](holdout.png)" in page


def test_without_a_holdout_there_is_no_holdout_picture_and_to_picks_the_directory(tmp_path: Path, capsys) -> None:
    Processor(configure(tmp_path)).run()
    assert main(["report", str(tmp_path / "out"), "--to", str(tmp_path / "pictures")]) == 0
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == ["privacy.png", "report.md", "throughput.png"]


def test_a_directory_without_snapshots_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no snapshots.jsonl" in capsys.readouterr().err


def test_the_pictures_carry_the_learner_the_limit_the_deltas_and_the_baselines(tmp_path: Path, monkeypatch) -> None:
    """Issue 36: the ε picture was a flat line with the intrusion series hidden under the output
    series and no budget line; the hold-out picture had no baseline. Each figure is read here as
    drawn: its title, its legend, and the horizontal lines it holds."""
    import panpriv.streamer.commands.report as report

    drawn: dict[str, tuple[str, list[str], list[float]]] = {}
    save = report._save

    def inspect_then_save(plt, figure, path):  # noqa: ANN001 - matplotlib's objects
        axes = figure.axes[0]
        lines = [line.get_ydata()[0] for line in axes.get_lines() if len(set(line.get_ydata())) == 1]
        drawn[path.name] = (axes.get_title(), [t.get_text() for t in axes.get_legend().get_texts()], lines)
        return save(plt, figure, path)

    monkeypatch.setattr(report, "_save", inspect_then_save)
    holdout = write_records(tmp_path / "holdout.jsonl", 400, seed=5)
    Processor(configure(tmp_path, **{"snapshots.holdout": str(holdout), "learner.max_epsilon": 5.0})).run()
    last = json.loads((tmp_path / "out" / "snapshots.jsonl").read_text().splitlines()[-1])
    assert last["max_epsilon"] == 5.0
    report.write_report(tmp_path / "out")

    title, legend, lines = drawn["privacy.png"]
    assert title.startswith(f"{last['learner']}: ") and "intrusion (1, 1e-06)" in title
    assert "--max-epsilon 5" in legend and 5.0 in lines
    assert any(text.startswith("outputs (final δ = 1e-06)") for text in legend)
    assert any(text.startswith("one intrusion + outputs (final δ = ") for text in legend)
    title, legend, lines = drawn["holdout.png"]
    majority = last["holdout"]["majority_accuracy"]
    assert "baselines" in title and 0.5 in lines and majority in lines
    assert f"majority class ({majority:.3f})" in legend
