"""A stop signal during a long set-up (shuffle-gd's tight PVEC calibration: seconds) stops the run at
once, with nothing learned, charged or checkpointed; shuffle-gd's default plan is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols.shuffle_gd import DEFAULT_ROUND_CAP, ShuffleGD, default_rounds, theorem_rounds
from tests.realparts import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_plan_is_the_theorem_capped_at_a_public_bound() -> None:
    assert theorem_rounds(100_000, 21, 1.0, 1e-6) > 10_000  # Thm 4.9: a pass over the recording per round
    assert default_rounds(100_000, 21, 1.0, 1e-6) == DEFAULT_ROUND_CAP
    assert default_rounds(100, 20, 4.0, 1e-6) == theorem_rounds(100, 20, 4.0, 1e-6) == 17  # below the cap: unchanged
    learner = ShuffleGD(3, "logistic", 1.0, 1e-6, n=100_000, calibration="paper")
    assert learner.planned_rounds == DEFAULT_ROUND_CAP and learner.passes == DEFAULT_ROUND_CAP


def test_sigterm_during_set_up_stops_within_seconds_with_nothing_learned(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    X = rng.uniform(-0.3, 0.3, size=(200_000, 4))
    data = tmp_path / "big.jsonl"
    with open(data, "w") as handle:
        for x, label in zip(X.tolist(), np.where(X[:, 0] > 0, 1, -1).tolist(), strict=True):
            handle.write(json.dumps({"x": x, "y": label}) + "\n")
    out, log = tmp_path / "out", tmp_path / "run.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "panpriv", "run", "--learner", "shuffle-gd", "--accept-larger-delta",
             "--source", f"file:{data}", "--dim", "4", "--feature-bound", "1", "--metrics-port", "0",
             "--out", str(out), "--progress", "off"],
            stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_until(lambda: b"indexed 200,000 valid records" in log.read_bytes(), 60, "the recording indexed")
        process.send_signal(signal.SIGTERM)  # now in the learner's calibration (seconds for n = 200,000)
        sent = time.monotonic()
        if b"new run:" in log.read_bytes():
            pytest.skip("the learner was built before the signal arrived (a much faster machine)")
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 0 and time.monotonic() - sent < 10, text[-2000:]  # a clean stop
    assert "during set-up: stopping now; nothing was learned" in text and "panpriv run: stopped during set-up" in text
    assert not (out / "checkpoints" / "checkpoint.json").exists() and not (out / "snapshots.jsonl").exists()
