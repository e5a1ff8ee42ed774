"""The E-S-A and scale-out walkthroughs (docs/how-to/esa.md, docs/how-to/scale-out.md, linked from
the README) work on ``panpriv dev-broker`` as written: the commands of their first blocks, run in
their order against a fresh dev broker, with no topic
created beforehand — the roles create theirs (streamer/kafka/topics.py), where the broker's
producers would auto-create topics with 4 partitions (0 of 7 worker means arrived and no E-S-A
round was ever released when the roles read partition 0 of such topics). Only what a test must
change is changed: the broker's address for ``B``, a temporary directory for ``/var/lib/panpriv``,
``keys/`` and ``shuffler-keys/`` (the key files' ``<id>`` is the one keygen wrote), free ports for
the metrics, and the records (a few rounds or steps, not a million)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.docs.pages import DOCS, code_blocks, panpriv_commands
from tests.esa.parts import panpriv
from tests.realparts import ManagedProcess, free_loopback_port, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def dev_broker(tmp_path: Path) -> Iterator[str]:
    """``panpriv dev-broker`` as the README starts it; its bootstrap address."""
    port = free_loopback_port()
    out = tmp_path / "dev-broker.out"
    with open(out, "w") as handle:
        broker = subprocess.Popen([sys.executable, "-m", "panpriv", "dev-broker", "--port", str(port)], stdout=handle,
                                  stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_until(lambda: "Kafka protocol on" in out.read_text(), 60, "panpriv dev-broker")
        yield f"127.0.0.1:{port}"
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=30)


def walkthrough(page: str) -> list[list[str]]:
    """The ``panpriv`` commands of the first shell block of ``docs/how-to/PAGE``."""
    return panpriv_commands(code_blocks(DOCS / "how-to" / page, "sh")[0])


KEY_DIRECTORIES = ("keys/", "shuffler-keys/")
"""The walkthrough's key directories (the analyzer's, the shuffler's), made under the test's tmp_path."""


def as_run_here(args: list[str], bootstrap: str, tmp_path: Path, i: int = 0) -> list[str]:
    """A README command with the test's substitutions (module docstring); ``i`` for the shell loop's ``$i``."""
    out = []
    for arg in args:
        arg = arg.replace("/var/lib/panpriv", str(tmp_path / "var")).replace("$i", str(i))
        directory, _, name = arg.partition("/")
        if f"{directory}/" in KEY_DIRECTORIES and name:  # keys/analyzer-<id>.pub (<id> parsed as 0123): keygen's file
            role, _, suffix = name.partition("-")
            arg = str(next((tmp_path / directory).glob(f"{role}-*{Path(suffix).suffix}")))
        elif arg in KEY_DIRECTORIES:
            arg = str(tmp_path / arg)
        elif arg == "records.jsonl":
            arg = str(tmp_path / "records.jsonl")
        out.append(arg)
    joined = " ".join(out)
    joined = re.sub(r"--bootstrap B\b", f"--bootstrap {bootstrap}", joined)
    joined = re.sub(r"--metrics-port \d+", f"--metrics-port {free_loopback_port()}", joined)
    return joined.split(" ")


def records(path: Path, n: int, dim: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim)
    y = np.where(X @ np.arange(1, dim + 1) > 0, 1, -1)
    path.write_text("".join(json.dumps({"x": row.tolist(), "y": int(label)}) + "\n" for row, label in zip(X, y)))


def stop(process: ManagedProcess) -> int:
    process.process.send_signal(signal.SIGTERM)
    try:
        return process.process.wait(timeout=60)
    finally:
        process.stop()


def test_the_esa_walkthrough_on_the_dev_broker(dev_broker: str, tmp_path: Path) -> None:
    commands = walkthrough("esa.md")
    assert [c[0] for c in commands] == ["keygen", "keygen", "analyze", "shuffle", "encode"]
    *keygens, analyze, shuffle, encode = commands
    for keygen in keygens:  # the analyzer's key pair, the shuffler's
        assert subprocess.run([sys.executable, "-m", "panpriv", *as_run_here(keygen, dev_broker, tmp_path)], cwd=ROOT,
                              capture_output=True, timeout=60).returncode == 0
    records(tmp_path / "records.jsonl", 2 * 256, 20)  # two rounds of the walkthrough's 256 users
    analyzer = panpriv(as_run_here(analyze, dev_broker, tmp_path), tmp_path / "analyzer.log")
    shuffler = panpriv(as_run_here(shuffle, dev_broker, tmp_path), tmp_path / "shuffler.log")
    try:
        client = subprocess.run([sys.executable, "-m", "panpriv", *as_run_here(encode, dev_broker, tmp_path)],
                                cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert client.returncode == 0, client.stdout + client.stderr + analyzer.log_path.read_text()[-2000:]
        assert "sent 512 messages over 2 rounds" in client.stdout
        wait_until(lambda: "round 1 done, model of round 2 published" in analyzer.log_path.read_text(), 120, "round 2")
    finally:
        codes = [stop(shuffler), stop(analyzer)]
    assert codes == [0, 0], analyzer.log_path.read_text()[-2000:] + shuffler.log_path.read_text()[-2000:]
    log = analyzer.log_path.read_text()
    assert "run the shuffler with --batch-size 256 --params 21" in log  # what the README's shuffler line says


def test_the_scaleout_walkthrough_on_the_dev_broker(dev_broker: str, tmp_path: Path) -> None:
    commands = walkthrough("scale-out.md")
    assert [c[0] for c in commands] == ["coordinate", "worker"]
    coordinate, worker = commands
    produced = subprocess.run([sys.executable, "-m", "panpriv", "produce", "--bootstrap", dev_broker, "--topic", "events",
                               "--n", "100000", "--dim", "20"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    # The README's dev-broker block: `events` auto-created by the producer (4 partitions). With the
    # walkthrough's --n 1000000, a step takes K·w = 3·9,259 records: 100,000 hold two steps even for
    # the worker that got one partition of four.
    assert produced.returncode == 0, produced.stderr
    coordinator = panpriv(as_run_here(coordinate, dev_broker, tmp_path), tmp_path / "coordinator.log")
    workers = [panpriv(as_run_here(worker, dev_broker, tmp_path, i=i), tmp_path / f"worker{i}.log") for i in (1, 2, 3)]
    try:
        deadline = time.monotonic() + 300
        while "version 2 published" not in coordinator.log_path.read_text():
            for process in (coordinator, *workers):
                process.check_alive()
            assert time.monotonic() < deadline, coordinator.log_path.read_text()[-2000:]
            time.sleep(0.5)
    finally:
        codes = [stop(process) for process in (*workers, coordinator)]
    assert codes == [0, 0, 0, 0], "\n".join(p.log_path.read_text()[-1500:] for p in (*workers, coordinator))
