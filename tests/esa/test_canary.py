"""Canary: the analyzer of an ESA deployment never holds a raw record, in its memory or its files.

Clients encode records whose feature rows are known; after the analyzer process has learned every
round, its writable memory (read through ``/proc/<pid>/mem``, tests/memscan.py) and every file it
wrote are searched for each raw row, each clipped feature row (the client's first transform) and the
JSON text of the rows' coordinates. A positive control runs the same search on a child process
that holds the rows, and finds them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.esa.keys import generate
from tests.esa import parts
from tests.memscan import Memory, read_memory
from tests.realparts import KafkaBroker, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM, B, ROUNDS = 20, 16, 4


def canaries(memory: Memory, raw: bytes, X: np.ndarray) -> list[str]:
    """What of the rows ``X`` the memory holds: rows (float64), clipped rows, coordinate texts."""
    clipped = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0)
    found = [f"raw row {i}" for i, row in enumerate(X) if memory.find_vector(row, 0.0)]
    found += [f"clipped row {i}" for i, row in enumerate(clipped) if memory.find_vector(row, 0.0)]
    found += [f"text of row {i}" for i, row in enumerate(X) if json.dumps(float(row[3])).encode() in raw]
    return found


def scan_an_esa_run(broker: KafkaBroker, names: dict[str, str], tmp_path: Path, analyzer_args: list[str],
                    shuffler_args: list[str]) -> None:
    """Run one client, the shuffler and the analyzer over B·ROUNDS known rows, then search the
    analyzer's memory and files for the rows (with the positive control of the module docstring)."""
    keys = parts.key_pairs(tmp_path)
    X, y = parts.synthetic(B * ROUNDS, DIM, seed=5)
    source = parts.write_jsonl(tmp_path / "records.jsonl", X, y)
    out = tmp_path / "analyzer"
    shuffler = parts.panpriv(["shuffle", "--bootstrap", broker.bootstrap, "--messages-topic", names["messages"],
                              "--shuffled-topic", names["shuffled"], "--batch-size", str(B), "--params", str(DIM),
                              "--shuffler-key", str(keys[1].private), *shuffler_args], tmp_path / "shuffler.log")
    analyzer = parts.panpriv(["analyze", "--bootstrap", broker.bootstrap, "--shuffled-topic", names["shuffled"],
                              "--model-topic", names["model"], "--messages-topic", names["messages"],
                              "--state-dir", str(out / "budget"), "--analyzer-key", str(keys[0].private), "--out", str(out),
                              "--shuffler-verify-key", str(keys[1].verify),
                              "--dim", str(DIM), "--batch-size", str(B), "--epsilon", "2", "--delta", "1e-5",
                              "--options", json.dumps({"loss": "logistic", "radius": math.sqrt(DIM)}), *analyzer_args],
                             tmp_path / "analyzer.log")
    client = parts.panpriv(parts.encode_args(broker, names, keys, source), tmp_path / "client.log")
    holder = subprocess.Popen([sys.executable, "-c", "import json, time, numpy as np, sys; "
                               "X = np.array([json.loads(l)['x'] for l in open(sys.argv[1])]); "
                               "print('ready', flush=True); time.sleep(120)", str(source)],
                              stdout=subprocess.PIPE, env=parts.env())
    try:
        assert client.process.wait(timeout=120) == 0, client.log_path.read_text()[-3000:]

        def done() -> bool:
            analyzer.check_alive()
            return bool(parts.analyzer_state(out / "analyzer.json")["round"] == ROUNDS)

        wait_until(done, 60, "the analyzer's last round")
        time.sleep(0.5)
        raw = read_memory(analyzer.pid)
        found = canaries(Memory(raw), raw, X)
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
        control_raw = read_memory(holder.pid)
        control = canaries(Memory(control_raw), control_raw, X)
    finally:
        holder.kill()
        holder.wait()
        for process in (client, shuffler, analyzer):
            process.stop()
    assert len([c for c in control if c.startswith("raw row")]) == len(X), "the scan finds rows a process holds"
    assert found == [], f"the analyzer's memory holds {found[:5]}"
    files = [path for path in out.rglob("*") if path.is_file()]
    assert files, "the analyzer wrote its checkpoint"
    for path in files:
        content = path.read_bytes()
        memory = Memory(content + b"\0" * (-len(content) % 8))
        assert canaries(memory, content, X) == [], f"{path} holds a record"


def test_the_analyzer_process_and_files_hold_no_raw_record(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """shuffle-gaussian: one sealed Gaussian message per user."""
    scan_an_esa_run(kafka_broker, parts.topics(kafka_broker, unique_name), tmp_path, [], [])


def test_the_shuffle_acsa_analyzer_process_and_files_hold_no_raw_record(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """shuffle-acsa over secure summation: m sealed shares of a PVEC count vector per user."""
    from panpriv.protocols.shuffle_acsa import ShuffleACSA
    from panpriv.streamer.esa.keys import load_private
    from panpriv.streamer.esa.sum_analyzer import SumAnalyzer

    learner = ShuffleACSA(dim=DIM, loss="logistic", epsilon=2.0, delta=1e-5, horizon=B * ROUNDS, batch_size=B,
                          radius=math.sqrt(DIM))
    shares = SumAnalyzer(learner, [load_private(generate(tmp_path / "plan-keys").private)], "plan").shares
    scan_an_esa_run(kafka_broker, parts.topics(kafka_broker, unique_name), tmp_path,
                    ["--learner", "shuffle-acsa", "--horizon", str(B * ROUNDS)],
                    ["--shares", str(shares)])
