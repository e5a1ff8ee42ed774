"""pan-acsa's checkpoints hold batch boundaries, and every record still enters the surviving state once.

A checkpoint taken while a pan-acsa batch is open persists the state at the batch's start (never
the accumulator Z_t + partial sum) with that boundary's positions, ledger and reject counts; a
resume re-reads the records after it. These tests interrupt runs (clean stops and crashes) on
streams whose boundaries fall inside micro-batches and — with binary messages of seven records
over two partitions — inside messages, and check that the resumed runs end in exactly the state
an uninterrupted run reaches. The learner's noise is switched off here (``_add_noise`` is a no-op):
the runs are then deterministic up to summation order, so a record learned twice or never would
show in the final iterates; the privacy of the boundaries is tested in
tests/streamer/test_persisted_states.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.streamer.config import load_config
from panpriv.streamer.io.codec import encode_batch
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.state.checkpoint import CheckpointStore

DIM = 3
PER_MESSAGE = 7
MESSAGES = 120  # per partition
KEYS = ("t/0", "t/1")


def binary_recording(path, per_message: int = PER_MESSAGE):
    """Two partitions of binary batch messages, interleaved; every 11th message has a NaN row (a
    per-row reject inside a message)."""
    rng = np.random.default_rng(3)
    writer = RecordingWriter(path, "kafka://127.0.0.1:1/t?group=g", list(KEYS), dict.fromkeys(KEYS, 0),
                             "2026-01-01T00:00:00", cluster="cluster=boundaries")
    for offset in range(MESSAGES):
        for key in KEYS:
            X = rng.standard_normal((per_message, DIM)) * 0.3
            y = np.where(X[:, 0] + 0.1 * rng.standard_normal(per_message) > 0, 1.0, -1.0)
            if offset % 11 == 5:
                X[per_message // 2, 1] = np.nan
            writer.write(key, offset, 0, encode_batch(X, y, dtype="float64"))
    writer.close()
    return path


def configure(source, out, **extra):
    return load_config(None, {
        "source.url": f"file:{source}", "records.format": "binary", "records.dim": DIM, "records.feature_bound": 1.0,
        "learner.name": "pan-acsa", "learner.options": {"batch_size": 50}, "source.batch_records": 4,
        "checkpoint.every_records": 30, "snapshots.every_records": 200, "metrics.port": None, "out": str(out),
        **extra,
    })


@pytest.fixture
def noiseless(monkeypatch):
    """pan-acsa without its draws (see the module docstring)."""
    monkeypatch.setattr(PanPrivateACSA, "_add_noise", lambda self, batch: None)


def interrupt_after(monkeypatch, batches: int, crash: bool) -> None:
    original = StreamDriver._process
    seen = {"n": 0}

    def process(self, batch):
        seen["n"] += 1
        if seen["n"] > batches:
            if crash:
                raise RuntimeError("simulated crash")
            self._stop.set()
            return 0, 0
        return original(self, batch)

    monkeypatch.setattr(StreamDriver, "_process", process)


def test_interrupted_runs_end_in_the_uninterrupted_state(noiseless, tmp_path, monkeypatch) -> None:
    source = binary_recording(tmp_path / "stream.pprec")
    reference = Processor(configure(source, tmp_path / "reference")).run()
    expected = CheckpointStore(tmp_path / "reference" / "checkpoints").load()
    out = tmp_path / "out"
    partial_seen = []
    for batches, crash in ((3, False), (5, True), (8, False), (6, True), (9, False)):
        with monkeypatch.context() as patch:
            interrupt_after(patch, batches, crash)
            if crash:
                with pytest.raises(RuntimeError, match="simulated crash"):
                    Processor(configure(source, out)).run()
            else:
                assert Processor(configure(source, out)).run().outcome == "stopped"
        saved = CheckpointStore(out / "checkpoints").load()
        assert not {"grad", "grad_units", "filled"} & set(saved.learner_state)  # a boundary, never an open batch
        partial_seen.append(bool(saved.partial))
    assert any(partial_seen), "no interruption left a boundary inside a message: the test does not test that"
    result = Processor(configure(source, out)).run()
    assert result.outcome == "finished" and result.resumed
    final = CheckpointStore(out / "checkpoints").load()
    assert (final.records, final.positions, final.rejects) == (expected.records, expected.positions, expected.rejects)
    assert final.records == reference.learner.state_records
    for key in ("theta", "theta_ag", "theta_md"):
        np.testing.assert_allclose(final.learner_state[key], expected.learner_state[key], rtol=1e-9, atol=1e-12)
    ledger = PrivacyLedger.from_dict(final.ledger)
    for key in KEYS:
        segments = [(s.start, s.stop, len(s.uses)) for s in ledger.coverage(f"t/{key[-1]}")]
        assert segments == [(0, MESSAGES, 1)], segments


def test_a_checkpoint_inside_a_batch_holds_its_start(noiseless, tmp_path, monkeypatch) -> None:
    """Stopped inside a batch: the checkpoint's state, positions and counts are those of the batch's
    first record; the records since are not in it (and their budget-store charges become a lost
    state when the run resumes, tests/streamer/test_budget.py)."""
    source = binary_recording(tmp_path / "stream.pprec", per_message=1)  # one record per message
    with monkeypatch.context() as patch:
        interrupt_after(patch, 9, crash=False)  # 90 messages of one record: inside the second batch
        result = Processor(configure(source, tmp_path / "out", **{"source.batch_records": 10})).run()
    saved = CheckpointStore(tmp_path / "out" / "checkpoints").load()
    first = result.learner.epoch_plans(0)[0].batch_size(1)
    assert first < result.learner.records_seen == 90 - sum(result.rejects.values()) < 2 * first
    assert saved.records == saved.learner_state["records"] == first and saved.learner_state["batch"] == 2
    assert sum(saved.positions.values()) == first + sum(saved.rejects.values())
    assert not saved.partial
    ledger = PrivacyLedger.from_dict(saved.ledger)
    assert {key: ledger.coverage(key)[-1].stop for key in saved.positions} == saved.positions


def test_cut_positions_and_marks_of_a_kafka_batch() -> None:
    """A cut in a batch of two partitions (keys interleaved, a gap in one): each key's position is
    its first message at or after the cut, a partly learned message keeps its own position, and the
    offset-regression mark is the timestamp of the record just before a position (none across a gap)."""
    from panpriv.streamer.runtime.stream_driver import cut_marks, cut_positions
    from panpriv.streamer.sources.base import Batch

    batch = Batch({"t/0": (10, 14), "t/1": (20, 25)}, [b""] * 6, ["t/0", "t/1", "t/0", "t/1", "t/0", "t/1"],
                  [10, 20, 11, 21, 13, 24], timestamps=[100, 200, 101, 201, 103, 204])
    positions, partial = cut_positions(batch, 4, 0)  # before the fifth message (t/0 offset 13)
    assert (positions, partial) == ({"t/0": 13, "t/1": 24}, {})
    assert cut_marks(batch, 4, positions) == {}  # 13 − 1 = 12 is a gap; 24 − 1 = 23 too
    positions, partial = cut_positions(batch, 2, 3)  # three rows into t/0's offset 11
    assert (positions, partial) == ({"t/0": 11, "t/1": 21}, {"t/0": 3})
    assert cut_marks(batch, 2, positions) == {"t/0": 100, "t/1": 200}
    assert cut_positions(batch, 6, 0) == ({"t/0": 14, "t/1": 25}, {})  # after the last message: the range ends
