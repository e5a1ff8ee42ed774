"""Binary messages that hold no record are counted by a reason (issue 35, point 6).

On the base, 800 binary batch messages with ``m = 0`` were neither learned nor counted by any
reason: the run's summary, its checkpoint and ``panpriv_records_rejected_total`` showed nothing.
They are now rejects of reason ``empty_batch`` (one per message), exported from the start at 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from panpriv.streamer.commands.cli import main
from panpriv.streamer.io.codec import Reason, encode_batch
from panpriv.streamer.io.recording import RecordingWriter

DIM = 3
EMPTY = 800
FULL = 100  # batches of 10 records each: the run learns 1,000 records besides the empty messages


def recording(path: Path) -> Path:
    rng = np.random.default_rng(35)
    writer = RecordingWriter(path, "test", ["b/0"], {"b/0": 0}, "now")
    for offset in range(EMPTY + FULL):
        if offset % 9 == 8 and offset // 9 < FULL:
            X = rng.uniform(-0.5, 0.5, (10, DIM))
            message = encode_batch(X, np.where(X[:, 0] > 0, 1.0, -1.0))
        else:
            message = encode_batch(np.zeros((0, DIM)), np.zeros(0), "float64" if offset % 2 else "float32")
        writer.write("b/0", offset, 0, message)
    writer.close()
    return path


def test_zero_record_messages_are_counted_as_empty_batches_in_the_checkpoint_and_the_metric(tmp_path: Path) -> None:
    source = recording(tmp_path / "empty.pprec")
    textfile = tmp_path / "metrics.prom"
    out = tmp_path / "out"
    assert main(["-q", "run", "--source", f"file:{source}", "--format", "binary", "--dim", str(DIM), "--feature-bound", "1",
                 "--rate", "0", "--out", str(out), "--state-dir", str(tmp_path / "state"), "--metrics-port", "0",
                 "--progress", "off", "--metrics-textfile", str(textfile)]) == 0
    manifest = json.loads((out / "checkpoints" / "checkpoint.json").read_bytes())
    assert manifest["rejects"] == {Reason.EMPTY_BATCH.value: EMPTY} and manifest["records"] == 10 * FULL
    assert f'panpriv_records_rejected_total{{reason="{Reason.EMPTY_BATCH.value}"}} {float(EMPTY)}' in textfile.read_text()
