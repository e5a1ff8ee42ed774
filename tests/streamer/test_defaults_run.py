"""Issue 38, "defaults that run and spend what they are given": every catalogued learner through
``panpriv run --learner NAME`` with the data settings only (source, dimension, feature bound) and
the default δ: it finishes, stays within δ, spends the requested ε, and beats θ = 0.

What "spends" means per learner: the guarantee it is calibrated to reaches the request to within
:data:`EPSILON_TOLERANCE` (relative) and no guarantee it is calibrated to exceeds it. That guarantee
is the one intrusion plus all outputs for the pan-private learners (pan-acsa, pan-ftrl, and the
PNSGD learners, whose pan floor is the request), and the outputs for the shuffle-model learners,
whose intrusion guarantee is a message's local one (stated before the run by ``panpriv privacy``).
pan-ftrl's outputs alone get a smaller ε than the request (two draws per node); the report says so.

The stream: d = 5, a well-specified logistic model (Bayes AUC about 0.93); 12,000 training and
3,000 public hold-out records (``--holdout``). θ = 0 has log-loss log 2 on any labels; every
learner but the PNSGD pair does better at ε = 1 here — checkin in the median of three runs: one
run's hold-out log-loss was above log 2 − 0.02 in 2 of 360 runs (0.56 %; median 0.57, maximum
0.684), and once in `make test` (0.710), so a single run failed about one run in 200; the median of
three fails about 3p² ≈ 10⁻⁴ of the time. pnsgd and shuffled-pnsgd cannot
reliably: their pan floor puts noise of the full (ε, δ) on every single step, and their hold-out
log-loss over 12 runs each (OS-entropy noise, these defaults) ranged 0.51–0.83 and 0.57–0.73 — 4
and 2 of the 12 worse than θ = 0. A smaller step makes them reliable but useless (0.67–0.69 at
r/(10 G√n)); the default keeps the textbook step r/(G√n), whose median is the best of those
measured, and the test checks only that they run and spend ε.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols.catalogue import CATALOGUE
from panpriv.streamer.commands.cli import main

EPSILON_TOLERANCE = 1e-5
"""Relative: the accountants round their figures up by at most 1e-9 (shuffle-gd's per-round
increments), and the shuffle-gaussian and checkin calibrations stop their searches on the safe
side within 4e-6 of the request (measured: 0.9999965 and 0.9999975 at ε = 1)."""

CALIBRATED_TO_INTRUSION = {"pan-acsa", "pan-ftrl", "pnsgd", "shuffled-pnsgd"}
NOT_RELIABLY_BETTER_THAN_ZERO = {"pnsgd", "shuffled-pnsgd"}
BETTER_THAN_ZERO_IN_THE_MEDIAN = {"checkin"}  # module docstring: one run in 200 is not


def write_stream(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5)) / math.sqrt(5)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-2 * X @ np.array([3.0, -2.0, 1.5, 0.0, 1.0]))), 1, -1)
    path.write_text("".join(json.dumps({"x": row.round(6).tolist(), "y": int(label)}) + "\n" for row, label in zip(X, y)))
    return path


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("defaults")
    return write_stream(directory / "train.jsonl", 12_000, 1), write_stream(directory / "holdout.jsonl", 3_000, 2)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_every_learner_runs_on_data_settings_only_and_spends_the_requested_epsilon(name, stream, tmp_path, capsys) -> None:
    last = _run(name, stream, tmp_path / "run0", capsys)
    output, intrusion = last["privacy"]["output"], last["privacy"]["intrusion"]
    assert last["records"] == 12_000 * (20 if name == "shuffle-gd" else 1)  # shuffle-gd: its 20 passes
    assert output["delta"] <= 1e-6 and intrusion["delta"] <= 1e-6  # within the default delta, no flag
    target = intrusion if name in CALIBRATED_TO_INTRUSION else output
    assert target["epsilon"] == pytest.approx(1.0, rel=EPSILON_TOLERANCE)
    assert output["epsilon"] <= 1.0 * (1 + EPSILON_TOLERANCE)
    if name in BETTER_THAN_ZERO_IN_THE_MEDIAN:
        losses = [last["holdout"]["log_loss"], *(_run(name, stream, tmp_path / f"run{k}", capsys)["holdout"]["log_loss"]
                                               for k in (1, 2))]
        assert sorted(losses)[1] < math.log(2) - 0.02, losses  # better than theta = 0 in the median
    elif name not in NOT_RELIABLY_BETTER_THAN_ZERO:
        assert last["holdout"]["log_loss"] < math.log(2) - 0.02, last["holdout"]  # better than theta = 0


def _run(name: str, stream: tuple[Path, Path], directory: Path, capsys) -> dict:  # noqa: ANN001
    """``panpriv run --learner NAME`` on the data settings only; its last snapshot."""
    train, holdout = stream
    code = main(["-q", "run", "--learner", name, "--source", f"file:{train}", "--dim", "5", "--feature-bound", "1",
                 "--holdout", str(holdout), "--rate", "0", "--metrics-port", "0", "--out", str(directory / "out"),
                 "--state-dir", str(directory / "state")])
    assert code == 0, capsys.readouterr().err
    return json.loads((directory / "out" / "snapshots.jsonl").read_text().splitlines()[-1])
