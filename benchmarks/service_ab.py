"""Before/after throughput of the service: this working tree against a git revision, runs interleaved.

Run: ``.venv/bin/python benchmarks/service_ab.py --against REV`` (``--kafka`` adds the Kafka
source against the test broker; ``--help`` for sizes).

The dev machine is shared and its load changes from minute to minute, so two separate runs of
``benchmarks/service.py`` cannot be compared. Here every measurement is a fresh subprocess running
the same code path — :func:`benchmarks.service.run_service` on
:func:`benchmarks.service.service_config` (pan-AC-SA at ε = 1, δ = 1e-6, checkpoint and snapshot
every 100,000 records), steady-state records/s — alternately from ``REV`` (``git archive`` into a
temporary directory) and from this tree, ``--rounds`` times, on the same input; the table shows the
medians and their ratio. Cases: replay of a recording of binary batch messages (256 float32 records
each) and of a recording of JSON messages (one record each), d ∈ ``--dims``; with ``--kafka``, the
same two encodings consumed from a 3-partition topic, next to kafka-python's raw consume + decode
rate measured in the same rounds (the issue's ratio). ``REV`` must have ``benchmarks/service.py``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = """
import sys, tempfile, uuid
from pathlib import Path
tree, what, url, fmt, dim, n = sys.argv[1:7]
sys.path.insert(0, tree)
from benchmarks.service import raw_consume, run_service, service_config
assert run_service.__code__.co_filename.startswith(tree), "imported from the wrong tree"
if what == "raw":
    bootstrap, topic = url.removeprefix("kafka://").split("/")
    print(raw_consume(bootstrap, topic, int(n), fmt, int(dim)))
else:
    if url.startswith("kafka://"):
        url += f"?group=ab-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        print(run_service(service_config(url, fmt, int(dim), int(n), Path(tmp) / "out")).steady.rate)
"""


def measure(tree: Path, what: str, url: str, fmt: str, dim: int, n: int) -> float:
    """Records/s of one subprocess run with ``tree``'s code."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tree), what, url, fmt, str(dim), str(n)],
        capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )
    if done.returncode:
        raise RuntimeError(f"measurement in {tree} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def export(revision: str, where: Path) -> Path:
    """The files of ``revision`` under ``where`` (``git archive``)."""
    archive = where / "before.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), revision], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(where / "before", filter="data")
    return where / "before"


def write_json_recording(path: Path, n: int, dim: int) -> None:
    """A recording of ``n`` synthetic records, one JSON message each (one key)."""
    from benchmarks.service import SEED
    from panpriv.streamer.commands.produce import synthetic_messages
    from panpriv.streamer.io.recording import RecordingWriter

    writer = RecordingWriter(path, "bench", ["bench/0"], {"bench/0": 0}, "bench")
    for offset, (_, message) in enumerate(synthetic_messages(n, dim, SEED, "json", 1)):
        writer.write("bench/0", offset, 0, message)
    writer.close()


def row(label: str, rates: dict[str, list[float]]) -> str:
    median = {name: statistics.median(values) for name, values in rates.items()}
    text = f"{label:<22} {median['before']:>12,.0f} {median['after']:>12,.0f} {median['after'] / median['before']:>8.2f}"
    if "raw" in median:
        text += f" {median['raw']:>12,.0f} {median['before'] / median['raw']:>10.2f} {median['after'] / median['raw']:>9.2f}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="git revision to compare with (e.g. HEAD~3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--binary-records", type=int, default=1_000_000)
    parser.add_argument("--json-records", type=int, default=200_000)
    parser.add_argument("--kafka", action="store_true", help="also consume from the test broker")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.service import BATCH_RECORDS, PARTITIONS, SEED, write_recording

    with tempfile.TemporaryDirectory(prefix="panpriv-ab-") as tmp:
        work = Path(tmp)
        trees = {"before": export(args.against, work), "after": ROOT}
        cases = []
        for dim in args.dims:
            for fmt, n in (("binary", args.binary_records), ("json", args.json_records)):
                path = work / f"{fmt}-{dim}.rec"
                (write_recording if fmt == "binary" else write_json_recording)(path, n, dim)
                cases.append((f"replay {fmt} d={dim}", f"file:{path}", fmt, dim, n, False))
        broker = None
        if args.kafka:
            from panpriv.streamer.commands.produce import produce
            from tests.realparts import KafkaBroker

            (work / "kafka").mkdir()
            broker = KafkaBroker(work / "kafka")
            for dim in args.dims:
                for fmt, n in (("binary", args.binary_records), ("json", args.json_records // 2)):
                    topic = broker.create_topic(f"ab-{fmt}-{dim}-{uuid.uuid4().hex[:6]}", partitions=PARTITIONS)
                    produce(broker.bootstrap, topic, n, dim, SEED, fmt, BATCH_RECORDS)
                    cases.append((f"kafka {fmt} d={dim}", f"kafka://{broker.bootstrap}/{topic}", fmt, dim, n, True))
        try:
            print(f"records/s, medians of {args.rounds} interleaved runs; before = {args.against}, after = this tree")
            print(f"{'case':<22} {'before':>12} {'after':>12} {'after/bef':>8}" + (
                f" {'raw':>12} {'before/raw':>10} {'after/raw':>9}" if args.kafka else ""))
            for label, url, fmt, dim, n, kafka in cases:
                rates: dict[str, list[float]] = {"before": [], "after": []} | ({"raw": []} if kafka else {})
                for _ in range(args.rounds):
                    if kafka:
                        rates["raw"].append(measure(ROOT, "raw", url, fmt, dim, n))
                    for name, tree in trees.items():
                        rates[name].append(measure(tree, "service", url, fmt, dim, n))
                print(row(label, rates), flush=True)
        finally:
            if broker is not None:
                broker.stop()


if __name__ == "__main__":
    main()
