"""panpriv.streamer.budget.store: the store shared by every run, with real files and real processes.

The store itself (durable across processes and ``kill -9``; compact; atomic check-and-charge;
crash-loss reclassification), then the service on files: deleting or rolling back a checkpoint,
or copying a file or a recording under another name, does not reset what was spent; a run past
``max_epsilon`` over all runs is refused; a run killed with SIGKILL and restarted reports, for the
records it learned twice, the composition of both uses. The real-broker version is
tests/streamer/test_budget_kafka.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.budget.store import BudgetError, BudgetExceededError, BudgetStore
from panpriv.streamer.commands.cli import main
from panpriv.streamer.config import load_config
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.sources.identity import line_file_identity
from panpriv.streamer.state.checkpoint import CheckpointStore
from tests.realparts import wait_until

ROOT = Path(__file__).resolve().parents[2]
N = 2000
DIM = 3


def report(out: float = 1.0, intr: float = 1.0) -> PrivacyReport:
    return PrivacyReport("m", 0, Guarantee(out, 1e-6), Guarantee(intr, 1e-6))


def rows(n: int = N, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, DIM)) / 2
    return [encode_json(x, 1.0 if x[0] > 0 else -1.0) for x in X]


@pytest.fixture
def jsonl(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join(rows()) + b"\n")
    return path


def recording(path: Path, cluster: str | None = "cluster=test-cluster", seed: int = 7) -> Path:
    """A recording of topic ``t`` holding ``rows(seed=seed)`` (other records than :func:`jsonl`'s)."""
    writer = RecordingWriter(path, "kafka://127.0.0.1:1/t?group=g", ["t/0"], {"t/0": 0}, "2026-01-01T00:00:00", cluster=cluster)
    for offset, value in enumerate(rows(seed=seed)):
        writer.write("t/0", offset, 0, value)
    writer.close()
    return path


def configure(source: Path, out: Path, **extra):
    overrides = {
        "source.url": f"file:{source}", "records.format": "json", "records.dim": DIM, "records.feature_bound": 1.0,
        "source.batch_records": 100, "checkpoint.every_records": 500, "snapshots.every_records": 1000,
        "metrics.port": None, "out": str(out), **extra,
    }
    return load_config(None, overrides)


def data_key(path: Path) -> str:
    """The budget store's data key of a JSONL file of this module (its records by content)."""
    return line_file_identity(path, make_codec(configure(path, path.parent / "unused").records)).key


# -- the store -------------------------------------------------------------------------------------


def test_charges_persist_across_processes_and_extend_one_row(tmp_path) -> None:
    store = BudgetStore(tmp_path)
    store.begin_run("r", tmp_path / "out", "file:x")
    store.register("r", "r", report(), tmp_path / "out")
    for start in range(0, 1000, 100):
        assert store.charge("r", {"k": (start, start + 100)}) is None
    store.close()
    # Another process opens the same file: one compact row, the whole range, the report.
    code = textwrap.dedent(f"""
        import sqlite3, json
        from panpriv.streamer.budget.store import BudgetStore
        store = BudgetStore({str(tmp_path)!r})
        ledger = store.ledger()
        rows = sqlite3.connect({str(tmp_path / 'budget.sqlite')!r}).execute('SELECT instance, source, start, stop FROM charges').fetchall()
        print(json.dumps([[(s.start, s.stop, list(s.uses)) for s in ledger.coverage('k')], rows,
                          ledger.instances['r'].output.epsilon]))
    """)
    answer = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True).stdout)
    assert answer == [[[0, 1000, ["r"]]], [["r", "k", 0, 1000]], 1.0]


def test_a_refused_charge_writes_nothing(tmp_path) -> None:
    store = BudgetStore(tmp_path)
    for name in ("a", "b"):
        store.register(name, name, report(), tmp_path)
    store.charge("a", {"k": (0, 10)})
    excess = store.charge("b", {"k": (5, 15)}, limit=1.5)
    assert excess is not None and excess.epsilon == 2.0 and [n for n, _ in excess.spent_by] == ["a"]
    assert [(s.start, s.stop, s.uses) for s in store.ledger().coverage("k")] == [(0, 10, ("a",))]
    assert store.charge("b", {"k": (10, 15)}, limit=1.5) is None


def test_reclassify_lost_moves_what_lies_beyond_the_durable_positions(tmp_path) -> None:
    store = BudgetStore(tmp_path)
    store.begin_run("r", tmp_path, "s")
    store.register("r", "r", report(), tmp_path)
    store.charge("r", {"k": (0, 700), "j": (0, 50)})
    lost = store.reclassify_lost("r", {"k": 500}, "r/lost-001", report(0.0, 1.0))
    assert lost == {"k": (500, 700), "j": (0, 50)}  # a key absent from the checkpoint: all of it was lost
    ledger = store.ledger()
    assert [(s.start, s.stop, s.uses) for s in ledger.coverage("k")] == [(0, 500, ("r",)), (500, 700, ("r/lost-001",))]
    assert store.run_state("r").losses == 1


CHARGER = """
import sys, time
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.budget.store import BudgetStore
store = BudgetStore(sys.argv[1])
store.register("r", "r", PrivacyReport("m", 0, Guarantee(1.0, 1e-6), Guarantee(1.0, 1e-6)), "out")
position = 0
while True:
    store.charge("r", {"k": (position, position + 100)})
    position += 100
    print(position, flush=True)  # only now would the service learn [position - 100, position)
"""


def test_kill_9_never_loses_a_charge_that_was_reported_durable(tmp_path) -> None:
    """A child charges ranges in a loop and prints each charged end only after charge() returned;
    SIGKILL at an arbitrary moment: every printed range is in the store."""
    process = subprocess.Popen([sys.executable, "-c", CHARGER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        printed = 0
        while printed < 3000:
            printed = int(process.stdout.readline())
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    tail = process.stdout.read().split()
    printed = int(tail[-1]) if tail else printed
    coverage = BudgetStore(tmp_path).ledger().coverage("k")
    assert len(coverage) == 1 and coverage[0].start == 0 and coverage[0].stop >= printed


def _open_when_released(directory: str, barrier: Any, failures: Any) -> None:
    """A forked child: wait for its siblings, then open (and close) the store in ``directory``."""
    barrier.wait()
    try:
        BudgetStore(Path(directory)).close()
    except BudgetError as exc:
        failures.put(str(exc))


def test_many_processes_opening_a_new_store_at_once_all_succeed(tmp_path) -> None:
    """The scale-out workers and coordinator open one fresh store together. Converting a new file to
    WAL takes an exclusive lock without SQLite's busy handler, so before the fix some openers got
    "database is locked" at once. Positive control (measured on the old open, 16 forked openers per
    trial): 4 of 60 trials failed in each of three runs, so these 60 trials miss the defect with
    probability about (56/60)^60 ≈ 1.6 %."""
    context = multiprocessing.get_context("fork")
    failures = context.Queue()
    for trial in range(60):
        barrier = context.Barrier(16)
        children = [context.Process(target=_open_when_released, args=(str(tmp_path / str(trial)), barrier, failures))
                    for _ in range(16)]
        for child in children:
            child.start()
        for child in children:
            child.join(timeout=120)
            assert child.exitcode == 0
    assert failures.empty(), failures.get()


# -- the service on files ----------------------------------------------------------------------------


def test_deleting_the_checkpoint_does_not_reset_the_budget(jsonl, tmp_path) -> None:
    out = tmp_path / "out"
    first = Processor(configure(jsonl, out)).run()
    assert first.report.output.epsilon == 1.0
    shutil.rmtree(out / "checkpoints")
    with pytest.raises(BudgetExceededError, match=rf"refusing to start: .*ε = 2 > max_epsilon = 1.5.*{first.instance}"):
        Processor(configure(jsonl, out, **{"learner.max_epsilon": 1.5})).run()
    second = Processor(configure(jsonl, out)).run()
    assert second.instance != first.instance and second.records == first.records
    assert (second.report.output.epsilon, second.report.intrusion.epsilon) == (2.0, 2.0)
    assert any(first.instance in text for text in second.report.assumptions)
    ledger = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"])).ledger()
    assert [(s.start, s.stop, len(s.uses)) for s in ledger.coverage(data_key(jsonl))] == [(0, N, 2)]


def test_restoring_an_old_checkpoint_charges_the_relearned_records_again(jsonl, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    stop = StreamDriver._process
    calls = {"n": 0}

    def stop_after_8(self, batch):  # noqa: ANN001 - learn the batch, then stop like SIGTERM does
        calls["n"] += 1
        if calls["n"] == 8:
            self._stop.set()
        return stop(self, batch)

    monkeypatch.setattr(StreamDriver, "_process", stop_after_8)
    Processor(configure(jsonl, out)).run()
    monkeypatch.undo()
    backup = (out / "checkpoints" / "checkpoint.json").read_bytes()
    old_position = CheckpointStore(out / "checkpoints").load().records
    assert 0 < old_position < N
    Processor(configure(jsonl, out)).run()  # to the end
    (out / "checkpoints" / "checkpoint.json").write_bytes(backup)  # restore the backup
    result = Processor(configure(jsonl, out)).run()
    assert result.resumed and result.records == N
    coverage = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"])).ledger().coverage(data_key(jsonl))
    # The stop after 8 batches of 100 came inside a pan-acsa batch: the checkpoint holds its last
    # boundary (old_position), and the records read after it were in a state never saved, charged
    # as lost when the second run resumed.
    run, lost = result.instance, f"{result.instance}/lost-001"
    assert [(s.start, s.stop, s.uses) for s in coverage] == [
        (0, old_position, (run,)), (old_position, 800, (run, run, lost)), (800, N, (run, run))
    ]
    assert result.report.output.epsilon == 2.0


def test_a_copied_file_or_recording_is_the_same_data(jsonl, tmp_path) -> None:
    copy = tmp_path / "renamed-copy.jsonl"
    shutil.copyfile(jsonl, copy)
    Processor(configure(jsonl, tmp_path / "a")).run()
    assert Processor(configure(copy, tmp_path / "b")).run().report.output.epsilon == 2.0

    original = recording(tmp_path / "topic.pprec")
    moved = tmp_path / "elsewhere" / "x.pprec"
    moved.parent.mkdir()
    shutil.copyfile(original, moved)
    Processor(configure(original, tmp_path / "c")).run()
    again = Processor(configure(moved, tmp_path / "d")).run()
    assert again.report.output.epsilon == 2.0
    keys = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"])).ledger().sources
    assert "kafka:cluster=test-cluster/t/0" in keys


def test_a_run_refused_by_the_shared_budget_exits_3_naming_the_runs(jsonl, tmp_path, capsys) -> None:
    common = ["run", "--source", f"file:{jsonl}", "--format", "json", "--dim", str(DIM), "--feature-bound", "1",
              "--metrics-port", "0", "--progress", "off", "--rate", "0"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "b"), "--max-epsilon", "1.5"]) == 3
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "refusing to start" in error and str(tmp_path / "a") in error
    assert not (tmp_path / "b" / "snapshots.jsonl").exists()
    assert main(["budget", "--source", "records:"]) == 0
    listing = capsys.readouterr().out
    assert data_key(jsonl) in listing and str(tmp_path / "a") in listing


def test_a_seeded_run_refuses_to_resume(jsonl, tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    original = StreamDriver._process
    calls = {"n": 0}

    def stop_after_3(self, batch):  # noqa: ANN001
        calls["n"] += 1
        learned = original(self, batch)
        if calls["n"] == 3:
            self._stop.set()  # a stop request: the driver sees it before it polls (and charges) another batch
        return learned

    monkeypatch.setattr(StreamDriver, "_process", stop_after_3)
    assert Processor(configure(jsonl, out, **{"learner.seed": 5})).run().outcome == "stopped"
    monkeypatch.undo()
    stated = json.loads((out / "snapshots.jsonl").read_text().splitlines()[-1])["privacy"]
    assert any("only against an analyst who does not know the seed" in text for text in stated["assumptions"])
    with pytest.raises(ConfigError, match="learner.seed: refusing to resume the seeded run"):
        Processor(configure(jsonl, out, **{"learner.seed": 5})).run()


def panpriv(args: list[str], log: Path) -> subprocess.Popen:
    handle = open(log, "ab")  # noqa: SIM115 - inherited by the child
    return subprocess.Popen([sys.executable, "-m", "panpriv", *args], stdout=handle, stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_kill_9_then_restart_reports_the_composition_of_both_uses(tmp_path) -> None:
    """SIGKILL between checkpoints: the records charged after the last durable checkpoint were in
    a lost state; the restarted run re-learns them and its intrusion guarantee for them is the
    composition of both uses (basic composition: ε_intrusion + ε_output = 2), the output one
    stays 1 (the lost state released nothing)."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\n".join(rows(20_000, seed=1)) + b"\n")
    out = tmp_path / "out"
    args = ["run", "--source", f"file:{path}", "--format", "json", "--dim", str(DIM), "--feature-bound", "1",
            "--out", str(out), "--checkpoint-every", "3000", "--snapshot-every", "3000", "--metrics-port", "0",
            "--progress", "off"]
    log = tmp_path / "run.log"
    process = panpriv([*args, "--rate", "8000"], log)
    checkpoints = CheckpointStore(out / "checkpoints")
    state = Path(os.environ["PANPRIV_STATE_DIR"])
    key = data_key(path)
    try:
        def charged_past_checkpoint() -> bool:
            saved = checkpoints.load()
            if saved is None or saved.records < 3000 or not (state / "budget.sqlite").exists():
                return False
            coverage = BudgetStore(state).ledger([key]).coverage(key)
            return bool(coverage) and coverage[-1].stop >= saved.positions[f"file:{path.resolve()}"] + 500

        wait_until(lambda: process.poll() is None and charged_past_checkpoint(), 60, "charges beyond a checkpoint")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    killed = checkpoints.load()
    durable = killed.positions[f"file:{path.resolve()}"]
    charged = BudgetStore(state).ledger([key]).coverage(key)[-1].stop
    assert durable < charged
    assert panpriv(args, log).wait(timeout=120) == 0, log.read_text()[-3000:]
    final = checkpoints.load()
    assert final.finished and final.instance == killed.instance
    coverage = BudgetStore(state).ledger([key]).coverage(key)
    lost = f"{killed.instance}/lost-001"
    assert [(s.start, s.uses) for s in coverage][:2] == [(0, (killed.instance,)), (durable, tuple(sorted((killed.instance, lost))))]
    assert coverage[1].stop == charged and coverage[-1].uses == (killed.instance,)
    last = json.loads((out / "snapshots.jsonl").read_text().splitlines()[-1])
    stated = PrivacyReport.from_dict(last["privacy"])
    assert stated.output == Guarantee(1.0, 1e-6)
    assert stated.intrusion == Guarantee(2.0, 2e-6)
    assert any(lost in text for text in stated.assumptions)


def test_metrics_export_the_budget_composed_over_all_runs_per_data_source(jsonl, tmp_path) -> None:
    Processor(configure(jsonl, tmp_path / "a")).run()
    metrics = ServiceMetrics()
    result = Processor(configure(jsonl, tmp_path / "b"), metrics=metrics).run()
    source = data_key(jsonl)
    for guarantee in ("output", "intrusion"):
        assert metrics.registry.get_sample_value("panpriv_budget_epsilon", {"source": source, "guarantee": guarantee}) == 2.0
        assert metrics.registry.get_sample_value("panpriv_privacy_epsilon", {"guarantee": guarantee}) == 2.0
    assert result.report.output.epsilon == 2.0
