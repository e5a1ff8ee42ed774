"""``panpriv inspect --json``: the text summary's numbers as one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from panpriv.streamer.commands.cli import main


def test_inspect_json_of_an_output_directory(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["-q", "run", "--source", "synthetic:n=500&dim=3&seed=2", "--dim", "3", "--feature-bound", "1",
                 "--rate", "0", "--metrics-port", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    checkpoint, snapshots = summary["checkpoint"], summary["snapshots"]
    assert checkpoint["records"] == 500 and checkpoint["finished"] is True and checkpoint["rejects"] == {}
    assert list(checkpoint["coverage"].values()) == [[[0, 500, 1]]]
    assert checkpoint["privacy"]["output"]["epsilon"] == 1.0
    assert snapshots["last_records"] == 500 and snapshots["records_never_decrease"] is True
    assert main(["inspect", str(out / "checkpoints" / "missing.json"), "--json"]) == 2
