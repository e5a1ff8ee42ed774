"""Learners that read a recording by record index (panpriv.streamer.io.indexed, panpriv.streamer.runtime.recorded_driver, the processor).

What is pinned: the index returns exactly the records (validated and clipped) that the sequential
path learns, for every file format; one pass charges the same ledger ranges and counts the same
rejects as a sequential replay; a seeded ``shuffled-pnsgd`` run through the service equals the
learner driven directly over the same records; a pass interrupted by a stop or by ``kill -9``
restarts as a new ledger instance composed with what the interrupted pass released.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.protocols.pnsgd import ShuffledPNSGD
from panpriv.streamer.budget.session import PUBLIC_COUNTS
from panpriv.streamer.budget.store import BudgetStore
from panpriv.streamer.config import load_config
from panpriv.streamer.errors import ConfigError, SourceError
from panpriv.streamer.io.codec import encode_batch, encode_json
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.io.sinks import read_snapshots
from panpriv.streamer.runtime.heartbeat import Heartbeat
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.sources.base import iter_batches
from panpriv.streamer.sources.identity import IDENTIFICATION_RULE
from panpriv.streamer.sources.open import open_source
from panpriv.streamer.state.checkpoint import CheckpointStore, ReplayMarks
from tests.realparts import wait_until

DIM = 3
ROOT = Path(__file__).resolve().parents[2]
PNSGD = {"eta": 0.5, "radius": 2.0}


def rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, DIM)), rng.choice([-1.0, 1.0], size=n)


def bad_json() -> list[bytes]:
    return [b"\xff", b'{"x": [1, 2], "y": 1}', b'{"x": [0, 0, NaN], "y": 1}', b'{"x": [0, 0, 0], "y": 5}', b'{"y": 1}']


def jsonl_file(path: Path, n: int = 600) -> Path:
    X, y = rows(n, 1)
    lines = [encode_json(X[i], y[i]) for i in range(n)]
    for i, bad in zip((3, 50, 51, 300, n - 1), bad_json()):
        lines[i] = bad
    lines.insert(200, b"")  # a blank line: a position, not a record
    path.write_bytes(b"\n".join(lines))  # no newline after the last line
    return path


def csv_file(path: Path, n: int = 400) -> Path:
    X, y = rows(n, 2)
    lines = [b"a,b,c,label"] + [",".join(repr(float(v)) for v in [*X[i], y[i]]).encode() for i in range(n)]
    lines[10] = b"1,2,oops,1"
    lines[11] = b"1,2"
    lines[12] = b"1,nan,0,1"
    lines[n] = b"0,0,0,7"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def json_recording(path: Path, n: int = 600) -> Path:
    """Two partitions, offsets with a gap (a compacted topic), malformed messages, start offsets > 0."""
    X, y = rows(n, 3)
    writer = RecordingWriter(path, "test", ["t/0", "t/1"], {"t/0": 5, "t/1": 0}, "now")
    next_offset = {"t/0": 5, "t/1": 0}
    bad = dict(zip((0, 7, 8, 250, n - 2), bad_json()))
    for i in range(n):
        key = "t/0" if i % 3 else "t/1"
        next_offset[key] += 2 if i == 100 else 1
        writer.write(key, next_offset[key] - 1, 1000 + i, bad.get(i) or encode_json(X[i], y[i]))
    writer.close()
    return path


def binary_recording(path: Path) -> Path:
    """Binary batch messages: whole valid batches, batches with NaN rows and bad labels, a batch of
    the wrong dimension, an undecodable message and an empty batch."""
    writer = RecordingWriter(path, "test", ["b/0"], {"b/0": 0}, "now")
    messages = []
    for k in range(12):
        X, y = rows(7 + 13 * k, 10 + k)
        if k % 4 == 1:
            X[2, 1] = np.nan
            y[5] = 3.0
        messages.append(encode_batch(X * 2, y, "float64" if k % 2 else "float32"))
    messages[5] = encode_batch(*rows(4, 99)[:1], np.ones(4))[:-3]  # truncated
    messages[8] = encode_batch(np.zeros((6, DIM + 1)), np.ones(6))
    messages.append(encode_batch(np.zeros((0, DIM)), np.zeros(0)))
    for offset, message in enumerate(messages):
        writer.write("b/0", offset, 0, message)
    writer.close()
    return path


FILES = {
    "jsonl": (jsonl_file, "stream.jsonl", {}),
    "csv": (csv_file, "stream.csv", {"records.csv_header": True}),
    "recording-json": (json_recording, "json.pprec", {"records.format": "json"}),
    "recording-binary": (binary_recording, "binary.pprec", {"records.format": "binary"}),
}


def config(path: Path, out: Path | None = None, **extra):
    return load_config(None, {
        "source.url": f"file:{path}", "records.dim": DIM, "records.feature_bound": 1.0, "metrics.port": None,
        "out": str(out) if out else None, "learner.name": "shuffled-pnsgd", "learner.options": PNSGD,
        "learner.accept_larger_delta": True, **extra,  # PNSGD's delta is its schedule's (panpriv.streamer.runtime.delta_target)
    })


def sequential(path: Path, cfg) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, int]], dict[str, int]]:
    """What the sequential path learns, charges and rejects in one pass over ``path``."""
    codec = make_codec(cfg.records)
    source = open_source(cfg.source, codec, {})
    Xs, ys, extent, rejects = [], [], {}, {}
    for batch in iter_batches(source, 37):
        decoded = codec.decode(batch.payloads)
        Xs.append(decoded.X)
        ys.append(decoded.y)
        for key, (start, stop) in batch.ranges.items():
            extent[key] = (min(start, extent.get(key, (start,))[0]), stop)
        for reason, count in decoded.reject_counts().items():
            rejects[reason] = rejects.get(reason, 0) + count
    source.close()
    return np.vstack(Xs), np.concatenate(ys), extent, rejects


@pytest.mark.parametrize("decode_rows", [16_384, 5])
@pytest.mark.parametrize("kind", sorted(FILES))
def test_the_index_gives_the_records_charges_and_rejects_of_a_sequential_pass(kind, decode_rows, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("panpriv.streamer.io.indexed._DECODE_ROWS", decode_rows)  # 5: a fetch decodes in many groups
    make, name, extra = FILES[kind]
    path = make(tmp_path / name)
    cfg = config(path, **extra)
    X, y, extent, rejects = sequential(path, cfg)
    indexed = IndexedFile(path, make_codec(cfg.records))
    try:
        assert indexed.n == len(y) > 0 and indexed.count_records() == len(y)
        assert indexed.extent == extent and indexed.rejects == rejects and sum(rejects.values()) >= 4
        order = np.random.default_rng(0).permutation(indexed.n)
        for chunk in np.array_split(order, 5):
            got_X, got_y = indexed.fetch(chunk)
            np.testing.assert_array_equal(got_X, X[chunk])  # validated and clipped the same way
            np.testing.assert_array_equal(got_y, y[chunk])
        assert np.all(np.linalg.norm(X, axis=1) <= 1.0 + 1e-12)
        with pytest.raises(SourceError, match="record index outside"):
            indexed.fetch(np.array([indexed.n]))
    finally:
        indexed.close()


def test_a_file_changed_under_the_run_is_detected(tmp_path) -> None:
    path = jsonl_file(tmp_path / "s.jsonl")
    indexed = IndexedFile(path, make_codec(config(path).records))
    data = bytearray(path.read_bytes())
    data[data.index(b'"x"') + 1] = ord("z")  # the first record loses its "x" field, same length
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="changed while it was being read"):
        indexed.fetch(np.array([0]))
    indexed.close()


@pytest.mark.parametrize(
    ("url", "extra", "message"),
    [
        ("synthetic:n=100&dim=3", {}, "reads a recording by record index, so its source must be file:PATH"),
        ("file:{gz}", {}, "cannot be read by record index; decompress it"),
        ("file:{rec}", {"source.recorded_pace": True}, "chooses the order of the records"),
        ("file:{jsonl}", {"learner.n": 10}, "learner.n = 10, but learner 'shuffled-pnsgd' reads every record"),
    ],
)
def test_sources_a_recorded_learner_cannot_use_are_refused(url, extra, message, tmp_path) -> None:
    paths = {"jsonl": jsonl_file(tmp_path / "s.jsonl"), "rec": json_recording(tmp_path / "r.pprec"), "gz": tmp_path / "s.jsonl.gz"}
    paths["gz"].write_bytes(b"")
    cfg = load_config(None, {"source.url": url.format(**paths), "records.dim": DIM, "records.feature_bound": 1.0,
                             "records.format": "json", "metrics.port": None, "out": str(tmp_path / "out"),
                             "learner.name": "shuffled-pnsgd", "learner.options": PNSGD, **extra})
    with pytest.raises((SourceError, ConfigError), match=message.replace("(", r"\(").replace(")", r"\)")):
        Processor(cfg).run()


def test_seeded_shuffled_pnsgd_through_the_service_equals_the_learner_driven_directly(tmp_path) -> None:
    """Same seed, same records in file order: the service's fetches, batching, checkpoints and
    snapshots change nothing in the mechanism (the permutation and every noise draw agree)."""
    path = json_recording(tmp_path / "r.pprec")
    cfg = config(path, tmp_path / "out", **{"records.format": "json", "learner.seed": 11, "source.batch_records": 64,
                                              "checkpoint.every_records": 150, "snapshots.every_records": 10**6})
    result = Processor(cfg).run()
    X, y, extent, rejects = sequential(path, cfg)
    direct = ShuffledPNSGD(DIM, {"name": "logistic", "intercept": True}, 1.0, n=len(y), rng=11, **PNSGD)
    direct.learn_recorded(lambda indices: (X[indices], y[indices]), micro_batch=1000)
    assert (result.outcome, result.records, result.snapshots) == ("finished", len(y), 1)
    np.testing.assert_array_equal(result.last_snapshot["params"], direct.release())
    assert result.rejects == rejects
    ledger = PrivacyLedger.from_dict(CheckpointStore(tmp_path / "out" / "checkpoints").load().ledger)
    assert {key: [(s.start, s.stop, s.uses) for s in ledger.coverage(key)] for key in ledger.sources} == {
        key: [(start, stop, (result.instance,))] for key, (start, stop) in extent.items()
    }
    # One release, of the final iterate: Sordello et al. 2021 Thm 2 exactly (the learner's report, via the ledger).
    direct.snapshot()
    assert result.report.output == direct.privacy().output


def stop_mid_pass(monkeypatch, records: int) -> threading.Event:
    """A stop event for the next Processor, set once its learner has learned ``records`` records
    (checked after each micro-batch, as a SIGTERM arriving then would be)."""
    stop = threading.Event()
    original = Heartbeat.batch

    def batch(self, handled):  # noqa: ANN001
        original(self, handled)
        if self._state.learner.records_seen >= records:
            stop.set()

    monkeypatch.setattr(Heartbeat, "batch", batch)
    return stop


def test_a_pass_stopped_midway_restarts_as_a_new_instance_composed_in_the_ledger(tmp_path, monkeypatch) -> None:
    path = jsonl_file(tmp_path / "s.jsonl")
    key = f"file:{path.resolve()}"
    settings = {"source.batch_records": 50, "checkpoint.every_records": 100, "snapshots.every_records": 200}
    stop = stop_mid_pass(monkeypatch, 250)
    first = Processor(config(path, tmp_path / "out", **settings), stop=stop).run()
    monkeypatch.undo()
    assert first.outcome == "stopped" and 250 <= first.records < first.learner.n
    store = CheckpointStore(tmp_path / "out" / "checkpoints")
    saved = store.load()
    # The pass cannot resume (its permutation is gone): the checkpoint holds the pass's start.
    assert saved.replay == ReplayMarks(passes_charged=0, restart=True)
    assert saved.records == saved.learner_state["records"] == 0
    interrupted = PrivacyLedger.from_dict(saved.ledger).instances[first.instance]
    stated = PrivacyReport.from_dict(first.last_snapshot["privacy"])
    # The service adds what memory and disk hold, how records are identified and which counts are public.
    assert stated.assumptions[-2:] == (IDENTIFICATION_RULE, PUBLIC_COUNTS)
    assert stated.assumptions[-3].startswith("memory and disk: ")
    assert interrupted.output.delta > 0 and interrupted == dataclasses.replace(stated, assumptions=stated.assumptions[:-3])
    # A budget below the composition stops before the new pass uses anything.
    capped = Processor(config(path, tmp_path / "out", **settings, **{"learner.max_epsilon": 1.5})).run()
    assert capped.outcome == "budget_exhausted" and "raise ε to 2" in capped.message and capped.records == 0
    final = Processor(config(path, tmp_path / "out", **settings)).run()
    assert (final.outcome, final.records) == ("finished", first.learner.n)
    assert final.instance == capped.instance != first.instance  # the restarted pass, begun by the capped run
    ledger = PrivacyLedger.from_dict(store.load().ledger)
    assert [(s.start, s.stop, s.uses) for s in ledger.coverage(key)] == [
        (0, 601, tuple(sorted((first.instance, final.instance))))
    ]
    restarted = ledger.instances[final.instance]
    assert restarted.records == first.learner.n
    assert final.report.output.epsilon == 2.0
    assert final.report.output.delta == pytest.approx(interrupted.output.delta + restarted.output.delta, rel=1e-12)
    assert final.rejects == {k: 2 * v for k, v in IndexedFile(path, make_codec(config(path).records)).rejects.items()}
    # Snapshots of the interrupted pass, none at 0 records, then the restarted pass's.
    counts = [s["records"] for s in read_snapshots(tmp_path / "out" / "snapshots.jsonl")]
    assert 0 not in counts and counts[-1] == first.learner.n and counts.index(first.records) < len(counts) - 1


def panpriv(args: list[str], log: Path) -> subprocess.Popen:
    handle = open(log, "ab")  # noqa: SIM115 - inherited by the child
    return subprocess.Popen([sys.executable, "-m", "panpriv", *args], stdout=handle, stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_kill_9_mid_pass_then_the_pass_restarts_and_the_ledger_composes_both(tmp_path) -> None:
    """`panpriv run --learner shuffled-pnsgd` on a recording, SIGKILL-ed after its first mid-pass
    snapshot, then run again to the end."""
    path = json_recording(tmp_path / "r.pprec", n=3000)
    out = tmp_path / "out"
    (tmp_path / "c.toml").write_text("[learner.options]\neta = 0.5\nradius = 2.0\n")
    args = ["run", "--source", f"file:{path}", "--format", "json", "--dim", str(DIM), "--feature-bound", "1",
            "--learner", "shuffled-pnsgd", "--accept-larger-delta", "--config", str(tmp_path / "c.toml"), "--out", str(out),
            "--checkpoint-every", "200", "--snapshot-every", "400", "--metrics-port", "0", "--progress", "off"]
    log = tmp_path / "run.log"
    process = panpriv([*args, "--rate", "1500"], log)
    try:
        snapshots = out / "snapshots.jsonl"
        wait_until(lambda: process.poll() is None and snapshots.read_bytes().count(b"\n") >= 1, 60, "a mid-pass snapshot")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    store = CheckpointStore(out / "checkpoints")
    killed = store.load()
    assert killed.replay is not None and killed.replay.restart and killed.records == 0, log.read_text()[-2000:]
    released = PrivacyLedger.from_dict(killed.ledger).instances[killed.instance]
    assert released.output.delta > 0  # the interrupted pass released snapshots
    assert panpriv(args, log).wait(timeout=120) == 0, log.read_text()[-2000:]
    final = store.load()
    ledger = PrivacyLedger.from_dict(final.ledger)
    assert final.finished and final.records == final.learner_state["records"] == final.learner_config["n"]
    uses = tuple(sorted((killed.instance, final.instance)))
    indexed = IndexedFile(path, make_codec(config(path, **{"records.format": "json"}).records))
    assert {key: [(s.start, s.stop, s.uses) for s in ledger.coverage(key)] for key in ledger.sources} == {
        key: [(start, stop, uses)] for key, (start, stop) in indexed.extent.items()
    }
    assert ledger.instances[killed.instance] == released  # what the killed pass released, unchanged
    report = ledger.report()
    assert report.output.epsilon == 2.0
    assert report.output.delta == pytest.approx(released.output.delta + ledger.instances[final.instance].output.delta)
    assert final.rejects == {k: 2 * v for k, v in indexed.rejects.items()}
    assert json.loads((out / "snapshots.jsonl").read_text().splitlines()[-1])["records"] == final.records


SHUFFLE_OPTIONS = {"shuffle-sgd": {"calibration": "paper"}, "shuffle-acsa": {"calibration": "paper"},
                   "shuffle-gd": {"calibration": "paper", "rounds": 3}}


@pytest.mark.parametrize("name", sorted(SHUFFLE_OPTIONS))
def test_shuffle_learners_run_through_the_service_on_a_recording(name, tmp_path, monkeypatch) -> None:
    """Each shuffle learner on a small recording: stopped mid-run, resumed, finished. A sequential
    learner charges every position once; shuffle-gd (every record in each of its T rounds, read by
    index) charges each round as its own instance, so every position has T uses whose composition
    is the learner's own figure."""
    path = json_recording(tmp_path / "r.pprec")
    settings = {"records.format": "json", "learner.name": name, "learner.options": SHUFFLE_OPTIONS[name],
                "source.batch_records": 64, "checkpoint.every_records": 128, "snapshots.every_records": 256}
    stop = stop_mid_pass(monkeypatch, 700 if name == "shuffle-gd" else 300)  # shuffle-gd: in its second round
    first = Processor(config(path, tmp_path / "out", **settings), stop=stop).run()
    monkeypatch.undo()
    assert first.outcome == "stopped"
    final = Processor(config(path, tmp_path / "out", **settings)).run()
    checkpoint = CheckpointStore(tmp_path / "out" / "checkpoints").load()
    ledger = PrivacyLedger.from_dict(checkpoint.ledger)
    _, y, extent, _ = sequential(path, config(path, **settings))
    rounds = 3 if name == "shuffle-gd" else 1
    assert (final.outcome, final.records, final.instance) == ("finished", rounds * len(y), first.instance)
    assert checkpoint.finished and checkpoint.learner == name
    uses = {key: [(s.start, s.stop, len(s.uses)) for s in ledger.coverage(key)] for key in ledger.sources}
    assert uses == {key: [(start, stop, rounds)] for key, (start, stop) in extent.items()}
    # The budget store saw the same uses under the data keys (the recording's declared source), and
    # under its content key (frames in file order: all 600 of them, each used as often); the stated
    # guarantee composed over it is the ledger's: no round is left with its provisional report.
    shared = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"])).ledger()
    content = [key for key in shared.sources if key.startswith("records:")]
    assert len(content) == 1 and [(s.start, s.stop, len(s.uses)) for s in shared.coverage(content[0])] == [(0, 600, rounds)]
    assert {key.removeprefix("kafka:source=test/"): [(s.start, s.stop, len(s.uses)) for s in shared.coverage(key)]
            for key in shared.sources if key not in content} == uses
    assert (final.report.output, final.report.intrusion) == (ledger.report().output, ledger.report().intrusion)
    if name == "shuffle-gd":
        assert ledger.report().output.epsilon == pytest.approx(final.learner.privacy().output.epsilon, rel=1e-8)
        assert ledger.report().output.epsilon >= final.learner.privacy().output.epsilon
    assert final.report.output.is_meaningful
