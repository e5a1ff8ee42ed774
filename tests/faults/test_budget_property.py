"""The budget store never states less than the truth (issue 33): a property test.

Hypothesis draws sequences of operations on one small data set — runs to the end, runs stopped
cleanly after some micro-batches, runs killed after a charge (before the batch is learned, with no
final checkpoint: the process's store is closed as by the operating system), rollbacks of an output
directory's checkpoint to any earlier one, deleted checkpoints, output directories copied over
each other — each run over one of six serialisations of the same records (JSONL, compact JSONL,
a shuffle, the reverse order, CSV, a ``panpriv record`` recording). An oracle counts every use of every record: a use
is an *output* use if the record entered a state that a durable checkpoint kept (it may be
released), a *lost* use if it entered a state that the kill destroyed. By the ledger's rule
(pan-acsa at ε = 1 per use) a record's true guarantee is output ε = its output uses and intrusion
ε = output uses + 1 if it had a lost use. After every operation:

- the statement of a run that ended is at least the truth of every record its instance learned;
- the budget store's composition, worst record, is at least the worst truth.

``make test`` runs :data:`SEQUENCES` sequences; ``make soak`` (marker ``soak``) :data:`SOAK_SEQUENCES`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panpriv.accounting.budget import per_source
from panpriv.streamer.budget.store import BudgetStore
from panpriv.streamer.config import load_config
from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.state.checkpoint import CheckpointStore

SEQUENCES = 50
SOAK_SEQUENCES = 400
N, DIM, BATCH = 30, 3, 5
VARIANTS = ("jsonl", "compact", "shuffled", "reversed", "csv", "recording")


class Killed(BaseException):  # noqa: N818 - a simulated kill, not an error
    """Raised from inside a micro-batch after its charge: the run ends without a final checkpoint."""


@dataclass
class World:
    """The files, the output directories and the oracle of one sequence."""

    root: Path
    seed: int
    variants: tuple[str, str]  # the serialisation each of the two output directories reads
    files: dict[str, Path] = field(default_factory=dict)
    order: dict[str, list[int]] = field(default_factory=dict)  # variant -> record id at each position
    saved: dict[str, list[bytes]] = field(default_factory=dict)  # out -> checkpoints seen, oldest first
    output: np.ndarray = field(default_factory=lambda: np.zeros(N, dtype=int))
    lost: np.ndarray = field(default_factory=lambda: np.zeros(N, dtype=int))
    learned: dict[str, set[int]] = field(default_factory=dict)  # instance -> records with an output use

    def __post_init__(self) -> None:
        rng = np.random.default_rng(11)
        X = rng.standard_normal((N, DIM)) / 2
        rows = [([float(v) for v in x], 1.0 if x[0] > 0 else -1.0) for x in X]
        shuffled = list(range(N))
        random.Random(self.seed).shuffle(shuffled)
        for variant in VARIANTS:
            self.order[variant] = {"shuffled": shuffled, "reversed": list(range(N))[::-1]}.get(variant, list(range(N)))
        lines = [encode_json(*rows[i]) for i in range(N)]
        self._write("jsonl", b"\n".join(lines) + b"\n")
        self._write("compact", b"\n".join(line.replace(b", ", b",").replace(b": ", b":") for line in lines) + b"\n")
        self._write("shuffled", b"\n".join(lines[i] for i in shuffled) + b"\n")
        self._write("reversed", b"\n".join(lines[::-1]) + b"\n")
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([[*map(repr, x), repr(y)] for x, y in rows])
        self._write("csv", buffer.getvalue().encode())
        path = self.root / "data.pprec"
        writer = RecordingWriter(path, "kafka://127.0.0.1:1/t?group=g", ["t/0"], {"t/0": 0}, "now", cluster="cluster=p")
        for offset, line in enumerate(lines):
            writer.write("t/0", offset, 0, line)
        writer.close()
        self.files["recording"] = path

    def _write(self, variant: str, data: bytes) -> None:
        path = self.root / f"{variant}.{'csv' if variant == 'csv' else 'jsonl'}"
        path.write_bytes(data)
        self.files[variant] = path

    def out(self, k: int) -> Path:
        return self.root / f"out-{k}"

    def config(self, variant: str, out: Path) -> Any:
        return load_config(None, {
            "source.url": f"file:{self.files[variant]}", "records.format": "csv" if variant == "csv" else "json",
            "records.dim": DIM, "records.feature_bound": 1.0, "source.batch_records": BATCH,
            "checkpoint.every_records": 2 * BATCH, "snapshots.every_records": 2 * BATCH, "metrics.port": None,
            "out": str(out),
        })

    def position(self, variant: str, out: Path) -> tuple[int, str | None]:
        saved = CheckpointStore(out / "checkpoints").load() if (out / "checkpoints" / "checkpoint.json").exists() else None
        if saved is None:
            return 0, None
        key = "t/0" if variant == "recording" else f"file:{self.files[variant].resolve()}"
        return int(saved.positions.get(key, 0)), saved.instance

    # -- the operations ----------------------------------------------------------------------------

    def run(self, k: int, mode: str, batches: int) -> None:
        variant, out = self.variants[k], self.out(k)
        start, _ = self.position(variant, out)
        original, save = StreamDriver._process, CheckpointStore.save
        calls = {"n": 0}
        history = self.saved.setdefault(str(out), [])

        def process(driver: StreamDriver, batch: Any) -> tuple[int, int]:
            calls["n"] += 1
            if mode == "kill" and calls["n"] == batches:
                raise Killed  # charged, not learned, no final checkpoint
            result = original(driver, batch)
            if mode == "stop" and calls["n"] >= batches:
                driver._stop.set()
            return result

        def saving(store: CheckpointStore, checkpoint: Any) -> Any:  # every checkpoint is a rollback target
            durable = save(store, checkpoint)
            history.append(store.path.read_bytes())
            return durable

        StreamDriver._process = process  # type: ignore[method-assign]
        CheckpointStore.save = saving  # type: ignore[method-assign]
        try:
            result = Processor(self.config(variant, out), stop=threading.Event()).run()
        except Killed:
            result = None
        finally:
            StreamDriver._process = original  # type: ignore[method-assign]
            CheckpointStore.save = save  # type: ignore[method-assign]
        durable, instance = self.position(variant, out)
        end = min(N, start + BATCH * batches) if mode != "finish" else N
        if result is not None:
            durable = end
        for position in range(start, end):
            record = self.order[variant][position]
            if position < durable:
                self.output[record] += 1
                self.learned.setdefault(str(instance), set()).add(record)
            else:
                self.lost[record] += 1
        if result is not None:
            records = self.learned.get(result.instance, set())
            if records:
                assert result.report.output.epsilon >= max(self.output[r] for r in records) - 1e-9
                assert result.report.intrusion.epsilon >= max(self.truth_intrusion(r) for r in records) - 1e-9

    def rollback(self, k: int, which: int) -> None:
        """Restore one of the checkpoints the directory held, behind its current one if there is one."""
        history = self.saved.get(str(self.out(k)), [])
        path = self.out(k) / "checkpoints" / "checkpoint.json"
        current = path.read_bytes() if path.exists() else None
        behind = [c for c in history if c != current and self._records(c) < (self._records(current) if current else 1 << 62)]
        choices = behind or history
        if choices:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(choices[which % len(choices)])

    @staticmethod
    def _records(checkpoint: bytes) -> int:
        return int(json.loads(checkpoint)["records"])

    def delete(self, k: int) -> None:
        shutil.rmtree(self.out(k) / "checkpoints", ignore_errors=True)

    def copy(self, k: int) -> None:
        """Output directory ``k`` copied over the other one (which then reads ``k``'s serialisation)."""
        source, target = self.out(k), self.out(1 - k)
        if source.exists():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
            self.saved[str(target)] = list(self.saved.get(str(source), []))
            variants = list(self.variants)
            variants[1 - k] = variants[k]
            self.variants = (variants[0], variants[1])

    # -- the truth -----------------------------------------------------------------------------------

    def truth_intrusion(self, record: int) -> int:
        return int(self.output[record]) + (1 if self.lost[record] else 0)

    def check_store(self) -> None:
        store = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"]))
        try:
            totals = per_source(store.ledger())
        finally:
            store.close()
        if not self.output.any() and not self.lost.any():
            return
        content = [g for key, g in totals.items() if key.startswith("records:")]
        assert len(content) == 1, totals.keys()  # five serialisations, one source
        output, intrusion = content[0]
        assert output.epsilon >= self.output.max() - 1e-9
        assert intrusion.epsilon >= max(self.truth_intrusion(r) for r in range(N)) - 1e-9


OUT = st.sampled_from([0, 0, 0, 1])  # mostly one directory: its runs, rollbacks and resumes interleave
RUN = st.tuples(st.just("run"), OUT, st.sampled_from(["finish", "stop", "kill"]), st.integers(1, 7))
ROLLBACK = st.tuples(st.just("rollback"), OUT, st.integers(0, 40))
OPERATION = st.one_of(RUN, RUN, RUN, ROLLBACK, ROLLBACK, st.tuples(st.just("delete"), OUT), st.tuples(st.just("copy"), OUT))
PAIR = st.tuples(st.sampled_from(VARIANTS), st.sampled_from(VARIANTS))


def check_sequence(variants: tuple[str, str], operations: list[tuple[Any, ...]], seed: int) -> None:
    with tempfile.TemporaryDirectory(prefix="panpriv-budget-property-") as directory:
        previous = os.environ.get("PANPRIV_STATE_DIR")
        os.environ["PANPRIV_STATE_DIR"] = str(Path(directory) / "state")
        try:
            world = World(Path(directory), seed, variants)
            for name, *arguments in operations:
                getattr(world, name)(*arguments)
                world.check_store()
        finally:
            if previous is None:
                del os.environ["PANPRIV_STATE_DIR"]
            else:
                os.environ["PANPRIV_STATE_DIR"] = previous


@settings(max_examples=SEQUENCES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(PAIR, st.lists(OPERATION, min_size=3, max_size=10), st.integers(0, 2**32 - 1))
def test_the_store_never_states_less_than_the_oracle(variants: tuple[str, str], operations: list[tuple[Any, ...]],
                                                     seed: int) -> None:
    check_sequence(variants, operations, seed)


@pytest.mark.soak
@settings(max_examples=SOAK_SEQUENCES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(PAIR, st.lists(OPERATION, min_size=3, max_size=16), st.integers(0, 2**32 - 1))
def test_the_store_never_states_less_than_the_oracle_soak(variants: tuple[str, str], operations: list[tuple[Any, ...]],
                                                          seed: int) -> None:
    check_sequence(variants, operations, seed)
