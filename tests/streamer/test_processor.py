"""panpriv.streamer.runtime.processor in-process: exactly-once across stops and crashes, budgets, snapshot order.

The kill -9 version against the real broker is tests/streamer/test_service_kafka.py; these tests
use a JSONL file so that every interruption point can be chosen deterministically.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger
from panpriv.streamer.config import load_config
from panpriv.streamer.io.sinks import read_snapshots
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.learners import restore_learner
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.sources.base import Batch
from panpriv.streamer.state.checkpoint import CheckpointStore

N_LINES = 3000
BAD = {7: b"\xff", 100: b'{"x": [1, 2], "y": 1}', 1500: b'{"x": [0, 0, NaN], "y": 1}', 2999: b'{"x": [0, 0, 0], "y": 5}'}
EXPECTED_REJECTS = {"undecodable": 1, "wrong_dimension": 1, "non_finite": 1, "label_out_of_range": 1}


@pytest.fixture
def stream(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "stream.jsonl"
    with open(path, "wb") as handle:
        for i in range(N_LINES):
            line = BAD.get(i) or json.dumps({"x": rng.standard_normal(3).tolist(), "y": float(rng.choice([-1, 1]))}).encode()
            handle.write(line + b"\n")
    return path


def configure(stream, out, **extra):
    overrides = {
        "source.url": f"file:{stream}",
        "source.batch_records": 97,
        "records.dim": 3,
        "records.feature_bound": 1.0,
        "checkpoint.every_records": 250,
        "snapshots.every_records": 500,
        "metrics.port": None,
        "out": str(out),
        **extra,
    }
    return load_config(None, overrides)


def stop_after(monkeypatch, batches: int, crash: bool) -> None:
    """Make the next Processor stop (cleanly, or by an exception = a crash) after ``batches`` batches."""
    original = StreamDriver._process
    seen = {"n": 0}

    def process(self, batch):
        seen["n"] += 1
        if seen["n"] > batches:  # a crash after the batch was charged, before it is learned
            raise RuntimeError("simulated crash")
        learned = original(self, batch)
        if seen["n"] == batches and not crash:
            self._stop.set()  # a stop request: the driver sees it before it polls (and charges) another batch
        return learned

    monkeypatch.setattr(StreamDriver, "_process", process)


def in_complete_batches(checkpoint, records: int) -> int:
    """How many of ``records`` records the checkpoint's pan-acsa holds once the stream ends: those of
    its complete batches (the open batch's reach no output; the learner saves batch boundaries)."""
    learner = restore_learner(checkpoint.learner, checkpoint.learner_config, {**checkpoint.learner_state, "records": 0,
                              "epoch": 0, "phase": 0, "step": 1, "batch": 1}, None)
    learner.learn_many(np.zeros((records, 3)), np.ones(records))
    return learner.state_records


def assert_exactly_once(out, stream) -> None:
    checkpoint = CheckpointStore(out / "checkpoints").load()
    ledger = PrivacyLedger.from_dict(checkpoint.ledger)
    key = f"file:{stream.resolve()}"
    segments = ledger.coverage(key)
    assert [(s.start, s.stop, s.uses) for s in segments] == [(0, N_LINES, (checkpoint.instance,))]
    assert checkpoint.positions == {key: N_LINES}
    assert checkpoint.rejects == EXPECTED_REJECTS
    valid = N_LINES - len(BAD)
    assert checkpoint.records == in_complete_batches(checkpoint, valid) == checkpoint.learner_state["records"]
    assert 0 < valid - checkpoint.records < 300  # the open batch when the stream ended
    assert checkpoint.finished
    snapshots = read_snapshots(out / "snapshots.jsonl")
    counts = [s["records"] for s in snapshots]
    assert counts == sorted(counts) and counts[-1] == checkpoint.records
    assert [s["sequence"] for s in snapshots] == sorted(s["sequence"] for s in snapshots)


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "crash"])
def test_interrupted_runs_learn_every_record_exactly_once(stream, tmp_path, monkeypatch, crash) -> None:
    out = tmp_path / "out"
    for batches in (3, 5, 11):  # three interruptions at different points, then a full run
        stop_after(monkeypatch, batches, crash)
        if crash:
            with pytest.raises(RuntimeError, match="simulated crash"):
                Processor(configure(stream, out)).run()
        else:
            assert Processor(configure(stream, out)).run().outcome == "stopped"
        monkeypatch.undo()
    result = Processor(configure(stream, out)).run()
    assert result.outcome == "finished" and result.resumed
    assert_exactly_once(out, stream)


def test_uninterrupted_run_matches(stream, tmp_path) -> None:
    out = tmp_path / "out"
    result = Processor(configure(stream, out)).run()
    assert (result.outcome, result.records, result.rejects) == ("finished", N_LINES - len(BAD), EXPECTED_REJECTS)
    assert_exactly_once(out, stream)
    # Snapshots follow checkpoints: every one is covered by positions no later than the final ones.
    for snapshot in read_snapshots(out / "snapshots.jsonl"):
        assert snapshot["privacy"]["output"] == {"epsilon": 1.0, "delta": 1e-6}
        # the model covers the records up to its last batch boundary; the guarantee, every record read
        assert snapshot["privacy"]["records"] >= snapshot["records"]
        assert len(snapshot["params"]) == 4  # 3 features and the default intercept


def test_a_replayed_range_composes_and_the_budget_stops_before_spending(stream, tmp_path) -> None:
    out = tmp_path / "out"
    Processor(configure(stream, out)).run()
    store = CheckpointStore(out / "checkpoints")
    rewound = store.load()
    # Rewind the positions (as an operator resetting a consumer group would): the same learner
    # instance will read the same records again.
    store.save(dataclasses.replace(rewound, positions={f"file:{stream.resolve()}": 2000}))
    result = Processor(configure(stream, out, **{"learner.max_epsilon": 1.5})).run()
    assert result.outcome == "budget_exhausted"
    assert "would raise ε to 2" in result.message
    assert result.records == rewound.records  # nothing more was learned
    # Without a budget the replay happens and the ledger composes: ε = 2 on the replayed range.
    result = Processor(configure(stream, out)).run()
    assert result.outcome == "finished"
    ledger = PrivacyLedger.from_dict(store.load().ledger)
    segments = ledger.coverage(f"file:{stream.resolve()}")
    assert [(s.start, s.stop, len(s.uses)) for s in segments] == [(0, 2000, 1), (2000, N_LINES, 2)]
    assert result.report.output.epsilon == pytest.approx(2.0)


def test_changed_privacy_settings_are_refused_on_resume(stream, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    stop_after(monkeypatch, 3, crash=False)
    Processor(configure(stream, out)).run()
    monkeypatch.undo()
    from panpriv.streamer.errors import CheckpointError

    with pytest.raises(CheckpointError, match="learner.epsilon: 1.0 in the checkpoint, 0.5 now"):
        Processor(configure(stream, out, **{"learner.epsilon": 0.5})).run()


def test_stop_event_from_another_thread(stream, tmp_path) -> None:
    stop = threading.Event()
    stop.set()  # already set: the loop stops before reading anything, yet checkpoints
    result = Processor(configure(stream, tmp_path / "out", **{"source.rate": 10.0}), stop=stop).run()
    assert result.outcome == "stopped" and result.records == 0
    assert CheckpointStore(tmp_path / "out" / "checkpoints").load().sequence == 1


def test_seeded_mode_is_labelled_and_reproducible(stream, tmp_path) -> None:
    a = Processor(configure(stream, tmp_path / "a", **{"learner.seed": 3})).run()
    b = Processor(configure(stream, tmp_path / "b", **{"learner.seed": 3})).run()
    np.testing.assert_array_equal(a.last_snapshot["params"], b.last_snapshot["params"])
    assert not a.report.intrusion.is_meaningful  # no pan-private guarantee with a seed in memory
    assert any("seeded" in text for text in a.report.assumptions)


def test_a_learner_refusing_validated_records_stops_without_quoting_them(stream, tmp_path, capsys) -> None:
    """Labels 0/2 pass [records] validation here but not the logistic loss (0/1 or ±1): the run
    stops with a message that does not contain the offending value, and takes no checkpoint."""
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps({"x": [0.1, 0.2, 0.3], "y": 2.0}) + "\n" for _ in range(50)))
    from panpriv.streamer.commands.cli import main

    argv = ["run", "--source", f"file:{path}", "--dim", "3", "--feature-bound", "1", "--metrics-port", "0",
            "--out", str(tmp_path / "out"), "--config", str(tmp_path / "c.toml")]
    (tmp_path / "c.toml").write_text("[records]\nlabel_values = [0, 2]\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "refused a validated micro-batch" in err and "2.0" not in err
    assert CheckpointStore(tmp_path / "out" / "checkpoints").load() is None


def test_a_finished_run_resumed_releases_nothing_new(stream, tmp_path) -> None:
    out = tmp_path / "out"
    first = Processor(configure(stream, out)).run()
    again = Processor(configure(stream, out)).run()
    assert again.outcome == "finished" and again.records == first.learner.state_records  # nothing new learned
    assert again.snapshots == first.snapshots  # no second release of the same state
    assert len(read_snapshots(out / "snapshots.jsonl")) == first.snapshots


class LaggingSource:
    """A Kafka-like source: ten records per poll, 10 ms apart, and a lag that shrinks as it is read."""

    name = "lagging"
    exhausted = False

    def __init__(self, polls: int) -> None:
        self.polls, self.position, self.asked = polls, 0, []

    def poll(self, max_records, timeout_s, max_bytes=None):
        if self.polls == 0:
            self.exhausted = True
            return None
        time.sleep(0.01)
        self.polls -= 1
        start, self.position = self.position, self.position + 10
        return Batch({"t/0": (start, self.position)}, arrays=(np.full((10, 3), 0.1), np.ones(10)))

    def lag(self):
        self.asked.append(time.monotonic())
        return {"t/0": 1000 - self.position}

    def total_positions(self):
        return None

    def count_records(self):
        return None

    def acknowledge(self, positions, strict=False):
        pass

    def close(self):
        pass


def test_lag_is_refreshed_between_checkpoints_at_a_bounded_rate(stream, tmp_path, monkeypatch) -> None:
    source = LaggingSource(polls=60)
    monkeypatch.setattr("panpriv.streamer.runtime.processor.open_source", lambda *args, **kwargs: source)
    seen = []

    class Metrics(ServiceMetrics):
        def observe_lag(self, lags):
            super().observe_lag(lags)
            seen.append(lags["t/0"])

    cfg = configure(stream, tmp_path / "out", **{
        "learner.n": 1000, "metrics.lag_interval_s": 0.05, "checkpoint.every_records": 10**6,
        "checkpoint.every_seconds": 3600, "snapshots.every_records": 10**6,
    })
    started = time.monotonic()
    result = Processor(cfg, metrics=Metrics()).run()
    elapsed = time.monotonic() - started
    assert result.records == 600 and CheckpointStore(tmp_path / "out" / "checkpoints").load().sequence == 1
    # Several refreshes during the run (no checkpoint but the final one), never two within the
    # interval except the one forced by that checkpoint; the last value is the drained lag.
    assert len(seen) >= 4 and seen == sorted(seen, reverse=True) and seen[-1] == 400
    gaps = np.diff(source.asked[:-1])
    assert np.all(gaps >= 0.05) and len(source.asked) <= elapsed / 0.05 + 2
