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
