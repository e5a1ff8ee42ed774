"""The budget store tells the truth (issue 33): every case below under-stated ε, or crashed, on
main before it was fixed.

1. A rollback of the checkpoint, a clean stop, then a resume: the released uses stay uses (no
   "lost" relabelling of what a cleanly stopped process released); two cycles give 2, then 3.
2. One live process per budget instance (the store refuses a second one).
3. A lost instance carries the dead process's last stored report; stored reports never shrink.
4. Re-serialised data is the same data: a file's records are identified by content.
5. A store restored from a backup, a 0-byte or foreign store, flipped rows, a store made
   immutable mid-run: refused or stopped with one line, never a traceback or a signal.

The SQLite store throughout; the same semantics on the Kafka store are in
``tests/streamer/test_budget_kafka.py``; the property test over random sequences in
``tests/faults/test_budget_property.py``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.budget.store import BudgetError, BudgetStore
from panpriv.streamer.commands.cli import main
from panpriv.streamer.config import load_config
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.runtime.processor import Processor, RunResult
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.state.checkpoint import CheckpointStore
from tests.realparts import wait_until

ROOT = Path(__file__).resolve().parents[2]
N = 1200
DIM = 3
RULE = "a different selection of records (a split, a subset, a superset) is different data"


def state_dir() -> Path:
    return Path(os.environ["PANPRIV_STATE_DIR"])


def records(n: int = N, seed: int = 0) -> list[tuple[list[float], float]]:
    """Records with 17-significant-digit features and ±1 labels."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, DIM)) / 2
    return [([float(v) for v in x], 1.0 if x[0] > 0 else -1.0) for x in X]


def jsonl(rows: list[tuple[list[float], float]], *, compact: bool = False, y_first: bool = False, digits: int | None = None,
          integer_labels: bool = False, newline: bytes = b"\n", final: bytes = b"\n") -> bytes:
    """One serialisation of ``rows`` as JSON lines (the shortest round-trip digits by default)."""
    comma, colon = (",", ":") if compact else (", ", ": ")
    lines = []
    for x, y in rows:
        features = "[" + comma.join(f"{v:.{digits}g}" if digits else repr(v) for v in x) + "]"
        fields = [f'"x"{colon}{features}', f'"y"{colon}{int(y) if integer_labels else repr(y)}']
        lines.append(("{" + comma.join(reversed(fields) if y_first else fields) + "}").encode())
    return newline.join(lines) + final


def csv_text(rows: list[tuple[list[float], float]], header: bool = False) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow([*(f"x{i}" for i in range(DIM)), "y"])
    for x, y in rows:
        writer.writerow([*map(repr, x), repr(y)])
    return buffer.getvalue().encode()


def configure(source: Path, out: Path, **extra: Any) -> Any:
    """pan-acsa with batches of 100 records, one micro-batch each: its batch boundaries (the only
    states it saves, issue 32) fall at every micro-batch, so a stop saves what was learned and these
    tests see the store's rules alone (a stop inside a batch: tests/streamer/test_budget.py)."""
    overrides = {
        "learner.options": {"batch_size": 100},
        "source.url": f"file:{source}", "records.format": "csv" if source.suffix == ".csv" else "json",
        "records.dim": DIM, "records.feature_bound": 1.0, "source.batch_records": 100, "checkpoint.every_records": 300,
        "snapshots.every_records": 300, "metrics.port": None, "out": str(out), **extra,
    }
    return load_config(None, overrides)


def stop_after(monkeypatch: pytest.MonkeyPatch, batches: int) -> None:
    """The next runs stop cleanly (like SIGTERM) once they have learned ``batches`` micro-batches (> 0)."""
    original = StreamDriver._process
    calls = {"n": 0}

    def process(self: StreamDriver, batch: Any) -> tuple[int, int]:
        calls["n"] += 1
        result = original(self, batch)
        if calls["n"] >= batches:
            self._stop.set()
        return result

    monkeypatch.setattr(StreamDriver, "_process", process)


def run(source: Path, out: Path, monkeypatch: pytest.MonkeyPatch | None = None, batches: int | None = None,
        **extra: Any) -> RunResult:
    """One run to the end, or stopped cleanly after ``batches`` micro-batches (0: before the first)."""
    stop = threading.Event()
    if batches == 0:
        stop.set()
    elif batches is not None:
        assert monkeypatch is not None
        stop_after(monkeypatch, batches)
    try:
        return Processor(configure(source, out, **extra), stop=stop).run()
    finally:
        if monkeypatch is not None:
            monkeypatch.undo()


def output_uses(source_key: str | None = None) -> list[tuple[int, int, float]]:
    """Per segment of the store's (single) data key: start, stop, composed output ε."""
    ledger = BudgetStore(state_dir()).ledger()
    keys = [source_key] if source_key else ledger.sources
    assert len(keys) == 1, keys
    return [(s.start, s.stop, ledger.record_guarantee(s.uses)[0].epsilon) for s in ledger.coverage(keys[0])]


# -- 1. rollback, clean stop, resume ----------------------------------------------------------------


def test_a_rollback_then_a_clean_stop_then_a_resume_keeps_every_released_use(tmp_path, monkeypatch) -> None:
    """The checkpoint is restored from a backup at position 300; the resumed process stops cleanly
    before learning anything (on main its final checkpoint lowered the run's durable mark to 300),
    and the next resume re-learns [300, N): those records were released by the first pass and by
    this one, two output uses — on main the first pass's charges became a "lost" instance and the
    statement said ε = 1. A second cycle (stopped after 3 batches this time) makes three."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    out = tmp_path / "out"
    first = run(path, out, monkeypatch, batches=3)
    backup = (out / "checkpoints" / "checkpoint.json").read_bytes()
    assert CheckpointStore(out / "checkpoints").load().positions[f"file:{path.resolve()}"] == 300
    assert run(path, out).report.output.epsilon == 1.0  # the first pass, completed

    for cycle, stopped_after in ((2, 0), (3, 3)):
        (out / "checkpoints" / "checkpoint.json").write_bytes(backup)  # the rollback
        assert run(path, out, monkeypatch, batches=stopped_after).outcome == "stopped"
        final = run(path, out)
        assert final.instance == first.instance and final.records == N
        assert final.report.output.epsilon == cycle, f"cycle {cycle - 1}"
        assert output_uses() == [(0, 300, 1.0), (300, N, float(cycle))]
        assert not [i for i in BudgetStore(state_dir()).instances() if "/lost-" in i], "a clean stop lost nothing"


def test_durable_marks_never_go_down(tmp_path) -> None:
    store = BudgetStore(tmp_path)
    store.begin_run("r", tmp_path, "s")
    store.mark_durable("r", 5, {"k": 900})
    store.mark_durable("r", 6, {"k": 300}, clean=True)  # a rolled-back checkpoint, then a clean stop
    state = store.run_state("r")
    assert state.positions == {"k": 900} and state.sequence == 6 and state.clean
    assert store.attempts("r")[0].positions == {"k": 900}


# -- 2. one live process per instance ------------------------------------------------------------------


BEGIN = """
import sys, time
from panpriv.streamer.budget.store import BudgetStore
store = BudgetStore(sys.argv[1])
store.begin_run("r", "out", "s")
print("began", flush=True)
time.sleep(60)
"""


def test_a_second_live_process_of_one_instance_is_refused_and_a_dead_one_is_not(tmp_path) -> None:
    """Two processes beginning the same instance (two workers sharing an --out, a copied output
    directory): the second is refused with one line while the first lives; once the first is
    killed, a restart is accepted."""
    first = subprocess.Popen([sys.executable, "-c", BEGIN, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert first.stdout is not None and first.stdout.readline() == b"began\n"
        with pytest.raises(BudgetError, match=rf"instance r is in use by another live process \(PID {first.pid} "):
            BudgetStore(tmp_path).begin_run("r", "out", "s")
    finally:
        first.kill()
        first.wait(timeout=10)
    again = BudgetStore(tmp_path)
    assert again.begin_run("r", "out", "s") is not None
    states = [a.state(0) for a in again.attempts("r")]
    assert states[0] == "ended without a clean stop" and states[1].startswith("running")


def test_a_copied_output_directory_cannot_run_beside_its_original(tmp_path, monkeypatch) -> None:
    """A run is going on in ``a``; ``b`` is a copy of ``a`` (same instance): refused, nothing learned."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    run(path, tmp_path / "a", monkeypatch, batches=3)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    started, release = threading.Event(), threading.Event()
    original = StreamDriver._process

    def slow(self: StreamDriver, batch: Any) -> tuple[int, int]:
        started.set()
        release.wait(30)
        return original(self, batch)

    monkeypatch.setattr(StreamDriver, "_process", slow)
    thread = threading.Thread(target=lambda: Processor(configure(path, tmp_path / "a")).run())
    thread.start()
    try:
        assert started.wait(30)
        with pytest.raises(BudgetError, match="is in use by another live process"):
            Processor(configure(path, tmp_path / "b")).run()
    finally:
        release.set()
        thread.join(60)
    assert CheckpointStore(tmp_path / "b" / "checkpoints").load().records == 300


# -- 3. the lost instance's report; reports never shrink ----------------------------------------------


def test_a_stored_report_never_shrinks(tmp_path) -> None:
    store = BudgetStore(tmp_path)
    big = PrivacyReport("m", 0, Guarantee(1.0, 1e-6), Guarantee(2.0, 2e-6))
    small = PrivacyReport("m", 0, Guarantee(1.0, 0.0), Guarantee(1.0, 1e-6))
    store.register("i", "r", big, tmp_path)
    store.register("i", "r", small, tmp_path)  # on main: replaced
    stored = store.instances()["i"].report
    assert (stored.output, stored.intrusion) == (big.output, big.intrusion)
    # A provisional report (a round registered before its own report is known) is replaced.
    store.register("p", "r", PrivacyReport("m", 0, Guarantee.none(), Guarantee.none()), tmp_path, provisional=True)
    store.register("p", "r", small, tmp_path)
    assert store.instances()["p"].report.output == small.output


CHILD_RUN = """
import json, sys
from panpriv.streamer.config import load_config
from panpriv.streamer.runtime.processor import Processor
Processor(load_config(None, json.loads(sys.argv[1]))).run()
"""


def test_a_lost_instance_carries_the_dead_process_s_last_report(tmp_path, monkeypatch) -> None:
    """``pnsgd``: its intrusion δ is 0 before it learns anything and 1e-6 after. A run stopped
    before learning checkpoints that fresh state; the resumed process learns, stores its report
    (δ 1e-6) and is killed with SIGKILL before its next checkpoint. On restart the lost instance
    must carry the dead process's report, not the restored one (δ 0): the re-learned records'
    intrusion is then (2, 2e-6) by the rule; main stated (2, 1e-6)."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records(20_000, seed=2)))
    out = tmp_path / "out"
    pnsgd = {"learner.name": "pnsgd", "learner.options": {"eta": 0.5}, "checkpoint.every_records": 1_000_000,
             "checkpoint.every_seconds": 3600.0, "snapshots.every_records": 1_000_000}
    assert run(path, out, monkeypatch, batches=0, **pnsgd).records == 0
    overrides = {"source.url": f"file:{path}", "records.format": "json", "records.dim": DIM, "records.feature_bound": 1.0,
                 "source.batch_records": 100, "metrics.port": None, "out": str(out), "source.rate": 4000.0, **pnsgd}
    child = subprocess.Popen([sys.executable, "-c", CHILD_RUN, json.dumps(overrides)], cwd=ROOT,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    instance = final_instance(out)

    def learned() -> bool:  # the resumed process stored its report (intrusion δ > 0) and charged records
        stored = BudgetStore(state_dir()).instances().get(instance)
        return stored is not None and stored.report.intrusion.delta > 0 and output_uses()[-1][1] >= 1000

    try:
        wait_until(lambda: child.poll() is None and learned(), 60, "the resumed process's report and charges in the store")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    last = BudgetStore(state_dir()).instances()[instance].report.intrusion  # the dead process's last report
    final = run(path, out, **pnsgd)
    lost = [info for name, info in BudgetStore(state_dir()).instances().items() if "/lost-" in name]
    assert len(lost) == 1 and lost[0].report.output == Guarantee(0.0, 0.0)
    assert lost[0].report.intrusion == last and last.delta > 0  # the dead process's; main: δ = 0, the restored one's
    print(f"lost instance {lost[0].report.intrusion}; statement: output {final.report.output}, intrusion "
          f"{final.report.intrusion}")
    assert final.report.intrusion.epsilon == 2.0
    assert final.report.intrusion.delta == pytest.approx(last.delta + final.report.output.delta, rel=1e-9)


def final_instance(out: Path) -> str:
    return CheckpointStore(out / "checkpoints").load().instance


# -- 4. identity by content ------------------------------------------------------------------------------


def _recording_and_export(tmp_path: Path, rows: list[tuple[list[float], float]]) -> tuple[Path, Path]:
    """A two-partition recording of ``rows`` and its values exported one per line (file order)."""
    recording = tmp_path / "topic.pprec"
    writer = RecordingWriter(recording, "kafka://127.0.0.1:1/t?group=g", ["t/0", "t/1"], {"t/0": 0, "t/1": 0}, "now",
                             cluster="cluster=test")
    values = jsonl(rows).splitlines()
    offsets = {"t/0": 0, "t/1": 0}
    for i, value in enumerate(values):
        key = f"t/{(i // 7) % 2}"
        writer.write(key, offsets[key], i, value)
        offsets[key] += 1
    writer.close()
    export = tmp_path / "export.jsonl"
    export.write_bytes(b"\n".join(values) + b"\n")
    return recording, export


VARIANTS: dict[str, Callable[[list[tuple[list[float], float]]], bytes]] = {
    "compact (jq -c)": lambda r: jsonl(r, compact=True),
    "another key order": lambda r: jsonl(r, y_first=True),
    "17 significant digits": lambda r: jsonl(r, digits=17),
    "labels written 1 for 1.0": lambda r: jsonl(r, integer_labels=True),
    "CRLF line ends": lambda r: jsonl(r, newline=b"\r\n", final=b"\r\n"),
    "no final newline": lambda r: jsonl(r, final=b""),
    "appended blank lines": lambda r: jsonl(r, final=b"\n\n\n"),
    "a blank line in the middle": lambda r: jsonl(r[: N // 2]) + b"\n" + jsonl(r[N // 2 :]),
    "shuffled": lambda r: jsonl(random.Random(5).sample(r, len(r))),
    "CSV": lambda r: csv_text(r),
    "CSV with a header": lambda r: csv_text(r, header=True),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_re_serialisation_of_the_same_records_is_the_same_source(variant, tmp_path) -> None:
    rows = records()
    original = tmp_path / "data.jsonl"
    original.write_bytes(jsonl(rows))
    other = tmp_path / ("variant.csv" if variant.startswith("CSV") else "variant.jsonl")
    other.write_bytes(VARIANTS[variant](rows))
    assert other.read_bytes() != original.read_bytes()
    first = run(original, tmp_path / "a")
    second = run(other, tmp_path / "b", **({"records.csv_header": True} if "header" in variant else {}))
    assert (first.report.output.epsilon, first.records, second.records) == (1.0, N, N)
    assert (second.report.output.epsilon, second.report.intrusion.epsilon) == (2.0, 2.0), variant
    assert any(first.instance in text for text in second.report.assumptions)


def test_a_recording_and_its_values_exported_to_jsonl_are_one_source(tmp_path) -> None:
    """A recording replayed five times, then its values as JSONL: the sixth use of those records
    (main: 1). The recording's runs compose with the topic's keys too."""
    recording, export = _recording_and_export(tmp_path, records())
    for i in range(5):
        assert run(recording, tmp_path / f"replay{i}").report.output.epsilon == i + 1
    assert run(export, tmp_path / "export").report.output.epsilon == 6.0
    assert run(recording, tmp_path / "replay-again").report.output.epsilon == 7.0
    keys = BudgetStore(state_dir()).ledger().sources
    assert {k for k in keys if k.startswith("kafka:")} == {"kafka:cluster=test/t/0", "kafka:cluster=test/t/1"}


def test_partial_runs_over_two_orders_are_never_under_counted(tmp_path, monkeypatch) -> None:
    """Positions of two orders name different records. Run a learns the whole file, its checkpoint
    is rolled back to 900 and it learns [900, N) again: those records have two uses. Run b reads
    the reverse order and stops after 300 records — exactly those records: their truth is 3. Its
    positions [0, 300) are the *first* records of a's order (used once), so composing by position
    would state 2; the store widens b's charge (another order) to every charged position: 3."""
    rows = records()
    forward, backward = tmp_path / "forward.jsonl", tmp_path / "backward.jsonl"
    forward.write_bytes(jsonl(rows))
    backward.write_bytes(jsonl(rows[::-1]))
    out = tmp_path / "a"
    run(forward, out, monkeypatch, batches=9)
    backup = (out / "checkpoints" / "checkpoint.json").read_bytes()
    run(forward, out)
    (out / "checkpoints" / "checkpoint.json").write_bytes(backup)
    assert run(forward, out).report.output.epsilon == 2.0
    partial = run(backward, tmp_path / "b", monkeypatch, batches=3)
    assert partial.records == 300 and partial.report.output.epsilon == 3.0


@pytest.mark.parametrize("change", ["first half (a split)", "one record less", "one record more"])
def test_another_selection_of_records_is_another_source_and_the_statement_says_so(change, tmp_path, capsys) -> None:
    rows = records()
    original = tmp_path / "data.jsonl"
    original.write_bytes(jsonl(rows))
    selection = {"first half (a split)": rows[: N // 2], "one record less": rows[1:],
                 "one record more": [*rows, records(1, seed=9)[0]]}[change]
    other = tmp_path / "other.jsonl"
    other.write_bytes(jsonl(selection))
    run(original, tmp_path / "a")
    second = run(other, tmp_path / "b")
    assert second.report.output.epsilon == 1.0
    assert any(RULE in text for text in second.report.assumptions)
    assert RULE in (tmp_path / "b" / "snapshots.jsonl").read_text().splitlines()[-1]
    assert main(["budget"]) == 0
    assert RULE in capsys.readouterr().out


def test_max_epsilon_is_not_bypassed_by_a_compact_copy(tmp_path, capsys) -> None:
    rows = records()
    original, compact = tmp_path / "data.jsonl", tmp_path / "compact.jsonl"
    original.write_bytes(jsonl(rows))
    compact.write_bytes(jsonl(rows, compact=True))
    common = ["--format", "json", "--dim", str(DIM), "--feature-bound", "1", "--metrics-port", "0", "--progress", "off",
              "--rate", "0"]
    assert main(["run", "--source", f"file:{original}", "--out", str(tmp_path / "a"), *common]) == 0
    summary = capsys.readouterr().out
    assert "identification  records are identified by their data" in summary and RULE in summary
    assert main(["run", "--source", f"file:{compact}", "--out", str(tmp_path / "b"), "--max-epsilon", "1.5", *common]) == 3
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "refusing to start" in error and "ε = 2 > max_epsilon = 1.5" in error


def test_a_store_written_before_content_keys_carries_its_uses_over(tmp_path) -> None:
    """A version-1 store (a file keyed by the SHA-256 of its bytes) is migrated; a run over the same
    file then composes with what the old store recorded."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    import hashlib

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    db = sqlite3.connect(legacy / "budget.sqlite")
    db.executescript(textwrap.dedent("""
        CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE instances(instance TEXT PRIMARY KEY, run TEXT NOT NULL, report TEXT NOT NULL,
            out TEXT NOT NULL, started REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE charges(instance TEXT NOT NULL, source TEXT NOT NULL, start INTEGER NOT NULL, stop INTEGER NOT NULL);
        CREATE TABLE runs(run TEXT PRIMARY KEY, out TEXT NOT NULL, source TEXT NOT NULL, started REAL NOT NULL,
            sequence INTEGER NOT NULL DEFAULT 0, positions TEXT NOT NULL DEFAULT '{}',
            clean INTEGER NOT NULL DEFAULT 0, losses INTEGER NOT NULL DEFAULT 0);
        INSERT INTO meta VALUES ('schema_version', '1');
    """))
    key = f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    report = PrivacyReport("pan-acsa", N, Guarantee(1.0, 1e-6), Guarantee(1.0, 1e-6))
    db.execute("INSERT INTO instances VALUES ('old', 'old', ?, 'x', 0, 0)", (json.dumps(report.to_dict()),))
    db.execute("INSERT INTO charges VALUES ('old', ?, 0, ?)", (key, N))
    db.execute("INSERT INTO runs VALUES ('old', 'x', 'file', 0, 3, ?, 1, 0)", (json.dumps({key: N}),))
    db.commit()
    db.close()
    result = run(path, tmp_path / "out", **{"budget.state_dir": str(legacy)})
    assert result.report.output.epsilon == 2.0 and any("old" in text for text in result.report.assumptions)


# -- 5. a store that detects rollback and tampering --------------------------------------------------------


def cli_run(path: Path, out: Path, *extra: str) -> tuple[int, str]:
    process = subprocess.run([sys.executable, "-m", "panpriv", "run", "--source", f"file:{path}", "--format", "json",
                              "--dim", str(DIM), "--feature-bound", "1", "--out", str(out), "--metrics-port", "0",
                              "--progress", "off", "--rate", "0", *extra], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    return process.returncode, process.stderr


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("panpriv")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_store_restored_from_a_backup_is_refused(tmp_path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    store = state_dir() / "budget.sqlite"
    assert cli_run(path, tmp_path / "a")[0] == 0
    backup = store.read_bytes()
    assert cli_run(path, tmp_path / "b")[0] == 0
    store.write_bytes(backup)  # the store goes back: it forgets run b
    code, stderr = cli_run(path, tmp_path / "b")
    assert code == 1 and "restored from a backup or rolled back" in one_line(stderr)
    code, stderr = cli_run(path, tmp_path / "b", "--state-dir", str(tmp_path / "another"))  # or a fresh store
    assert code == 1 and "was written with the budget store" in one_line(stderr)


def test_a_0_byte_or_foreign_store_is_not_a_budget_store(tmp_path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    assert cli_run(path, tmp_path / "a")[0] == 0
    store = state_dir() / "budget.sqlite"
    store.write_bytes(b"")
    code, stderr = cli_run(path, tmp_path / "b", "--max-epsilon", "1.5")
    assert code == 1 and "is not a budget store (an empty file)" in one_line(stderr)
    assert store.read_bytes() == b"" and not (tmp_path / "b" / "snapshots.jsonl").exists()
    store.write_bytes(b"these are not the bytes of a database" * 100)
    assert "is not a budget store" in one_line(cli_run(path, tmp_path / "b")[1])
    store.unlink()
    foreign = sqlite3.connect(store)
    foreign.execute("CREATE TABLE t(x)")
    foreign.close()
    assert "is not a budget store (a database without panpriv's tables)" in one_line(cli_run(path, tmp_path / "b")[1])


@pytest.mark.parametrize("edit", [
    "UPDATE charges SET stop = 3616 WHERE stop = 1200",
    "UPDATE charges SET instance = instance || 'x'",
    "UPDATE instances SET report = replace(report, '\"epsilon\":1.0', '\"epsilon\":0.1')",
    "DELETE FROM charges",
])
def test_an_edited_or_flipped_row_is_refused_with_one_line(edit, tmp_path, capsys) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    assert cli_run(path, tmp_path / "a")[0] == 0
    db = sqlite3.connect(state_dir() / "budget.sqlite")
    assert db.execute(edit).rowcount >= 1
    db.commit()
    db.close()
    code, stderr = cli_run(path, tmp_path / "b")
    line = one_line(stderr)
    assert code == 1 and ("integrity check" in line or "added or removed by hand" in line), line
    assert main(["budget"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_flipped_bit_anywhere_in_the_store_is_never_a_traceback(tmp_path) -> None:
    """Bit flips all over the file: each open is refused with one line or reads a store whose
    rows all pass their checks (a flip in free space or an index)."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    assert cli_run(path, tmp_path / "a")[0] == 0
    store = state_dir() / "budget.sqlite"
    clean = store.read_bytes()
    rng = random.Random(3)
    outcomes = {"refused": 0, "read": 0}
    for _ in range(60):
        data = bytearray(clean)
        where = rng.randrange(len(data))
        data[where] ^= 1 << rng.randrange(8)
        store.write_bytes(bytes(data))
        try:
            BudgetStore(state_dir()).ledger()
            outcomes["read"] += 1
        except BudgetError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
    print(f"60 single-bit flips of the store: {outcomes}")
    assert outcomes["refused"] > 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None, reason="chattr +i needs root")
def test_a_store_made_immutable_mid_run_stops_the_run_with_one_line(tmp_path) -> None:
    """``chattr +i`` on the store while a run charges it: WAL's shared-memory map gave SIGBUS
    (exit -7, no line) on main; the rollback journal's writes fail with an error instead."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records(40_000, seed=4)))
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "panpriv", "run", "--source", f"file:{path}", "--format", "json",
                                "--dim", str(DIM), "--feature-bound", "1", "--out", str(out), "--metrics-port", "0",
                                "--progress", "off", "--rate", "4000", "--checkpoint-every", "2000"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    frozen: list[Path] = []
    try:
        wait_until(lambda: (out / "checkpoints" / "checkpoint.json").exists(), 60, "a first checkpoint")
        for name in sorted(os.listdir(state_dir())):  # main: budget.sqlite, -wal, -shm; now: budget.sqlite (and a journal)
            if name.startswith("budget.sqlite") and subprocess.run(["chattr", "+i", str(state_dir() / name)]).returncode == 0:
                frozen.append(state_dir() / name)
        _, stderr = process.communicate(timeout=60)
    finally:
        for name in frozen:
            subprocess.run(["chattr", "-i", str(name)], check=False)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, (process.returncode, stderr[-2000:])
    assert "budget store failed" in one_line(stderr)


# -- the cost of a durable charge ---------------------------------------------------------------------


def test_a_run_charges_several_micro_batches_per_write_and_gives_back_what_it_did_not_learn(tmp_path, monkeypatch) -> None:
    """A rollback journal costs about four fsyncs a commit (no WAL: SIGBUS above), so a run over a
    source read in order charges eight micro-batches per write; a clean stop gives back what it
    charged beyond its final positions, so the store holds exactly what was learned."""
    from panpriv.streamer.budget.ahead import BATCHES, Lookahead

    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(records()))
    writes = {"charges": 0}
    original = BudgetStore.charge

    def counting(self: BudgetStore, *args: Any, **kwargs: Any) -> Any:
        writes["charges"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BudgetStore, "charge", counting)
    stopped = run(path, tmp_path / "a", monkeypatch, batches=5)  # (undoes the patches at the end)
    assert stopped.records == 500 and writes["charges"] == 1  # batches 1-8 charged at once; 5 learned
    assert output_uses() == [(0, 500, 1.0)]  # the clean stop gave [500, 800) back

    ahead = Lookahead()
    assert ahead.needed("i", {"k": (0, 100)}) == {"k": (0, 100)}
    assert Lookahead.widened({"k": (0, 100)}, {"k": (0, 100)}) == {"k": (0, 100 * BATCHES)}
    ahead.learned("i", {"k": (0, 100)}, {"k": (0, 800)})
    assert ahead.needed("i", {"k": (100, 200)}) == {}  # inside the window: no write
    ahead.learned("i", {"k": (100, 200)}, {})
    assert ahead.needed("i", {"k": (750, 850)}) == {"k": (800, 850)}  # past its end: from the end
    assert ahead.needed("i", {"k": (50, 150)}) == {"k": (50, 150)}  # a rewind: a new use from its start


def test_the_charge_ahead_window_lasts_about_half_a_second_at_any_rate() -> None:
    """One durable write per ~WINDOW_S: a window used up quickly doubles the next one (up to
    MAX_BATCHES micro-batches), a slow one halves it (down to BATCHES); the clock alone decides."""
    from panpriv.streamer.budget.ahead import BATCHES, MAX_BATCHES, WINDOW_S, Lookahead

    now = [0.0]
    ahead = Lookahead(clock=lambda: now[0])
    sizes = []
    for step in [0.0] + [WINDOW_S / 10] * 12 + [10 * WINDOW_S] * 3 + [WINDOW_S] * 2:
        now[0] += step
        sizes.append(ahead.window({"k": (0, 100)}, {"k": (0, 100)})["k"][1] // 100)
    assert sizes[:3] == [BATCHES, 2 * BATCHES, 4 * BATCHES]  # fast reading: fewer writes
    assert max(sizes) == MAX_BATCHES == sizes[12]  # capped
    assert sizes[13:16] == [MAX_BATCHES // 2, MAX_BATCHES // 4, MAX_BATCHES // 8]  # slow again: smaller windows
    assert sizes[16:] == [MAX_BATCHES // 8] * 2  # a window that lasts about WINDOW_S stays as it is
    for _ in range(10):
        now[0] += 10 * WINDOW_S
        window = ahead.window({"k": (0, 100)}, {"k": (0, 100)})
    assert window == {"k": (0, 100 * BATCHES)}  # never below BATCHES
