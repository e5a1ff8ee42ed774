"""How many raw records a whole-process memory dump still finds, after N micro-batches.

The learners leave no clean per-record value behind (tests/protocols/test_memory_residue.py), but
the service's input path — file/Kafka read buffers, the payload ``bytes`` objects, the codec's
parsed Python floats and decoded arrays — is outside them. This measures it on the file replay
path the service uses (``panpriv.streamer.sources.open.open_source`` on a JSON-lines file, ``JsonCodec.decode``,
``PanPrivateACSA.learn_many``): a child process learns N micro-batches and stops; the parent reads
its writable memory (:mod:`tests.memscan`) and counts, per record read so far,

- ``rows``: its decoded feature vector (float64, contiguous) is in memory;
- ``text``: its JSON payload line (the first 48 bytes of it) is in memory.

It reports the counts, and the age (in records, 0 = the last one read) of the oldest record
found. ``--zero-decoded`` zeroes each micro-batch's decoded arrays after learning (what a caller
owning them can do) to show what that changes.

    python benchmarks/memory_residue.py --batches 1 4 16 --batch-records 1024 --dim 20
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.memscan import Memory, read_memory  # noqa: E402

PREFIX = 48


def _write_records(path: Path, n: int, dim: int) -> np.ndarray:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((n, dim))
    X *= (0.9 / np.sqrt(np.einsum("ij,ij->i", X, X)))[:, None]
    with path.open("w") as handle:
        for i, row in enumerate(X):
            handle.write(json.dumps({"x": row.tolist(), "y": float(2 * (i % 2) - 1)}) + "\n")
    return X


def _child(conn: Any, path: str, dim: int, batches: int, batch_records: int, zero_decoded: bool) -> None:
    from panpriv.protocols.pan_acsa import PanPrivateACSA
    from panpriv.streamer.config import RecordsConfig, SourceConfig
    from panpriv.streamer.io.formats import make_codec
    from panpriv.streamer.sources.open import open_source

    codec = make_codec(RecordsConfig(format="json", dim=dim, feature_bound=1.0))
    source = open_source(SourceConfig(url=f"file:{path}", batch_records=batch_records), codec, {})
    learner = PanPrivateACSA(dim, {"name": "logistic", "intercept": True}, 1.0, 1e-6, horizon=10**6)
    done = 0
    while done < batches:
        batch = source.poll(batch_records, 1.0)
        if batch is None:
            continue
        decoded = codec.decode(batch.payloads)
        learner.learn_many(decoded.X, decoded.y)
        if zero_decoded:
            decoded.X.fill(0.0)
            decoded.y.fill(0.0)
        del batch, decoded
        done += 1
    conn.send(done * batch_records)
    conn.recv()


def measure(path: Path, X: np.ndarray, batches: int, batch_records: int, zero_decoded: bool) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    child = context.Process(target=_child, args=(there, str(path), X.shape[1], batches, batch_records, zero_decoded))
    child.start()
    try:
        read = here.recv()
        raw = read_memory(child.pid)
    finally:
        here.send("done")
        child.join(60)
    memory = Memory(raw)
    lines = path.read_bytes().splitlines()[:read]
    present_text = {m.group(0) for m in re.finditer(rb'\{"x": \[.{%d}' % (PREFIX - 7), raw, re.DOTALL)}
    rows = [k for k in range(read) if memory.find_vector(X[k], 1e-12)]
    text = [k for k in range(read) if lines[k][:PREFIX] in present_text]
    return {
        "batches": batches,
        "records_read": read,
        "rows_found": len(rows),
        "oldest_row_age": read - 1 - min(rows) if rows else None,
        "text_found": len(text),
        "oldest_text_age": read - 1 - min(text) if text else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--batch-records", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--zero-decoded", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.jsonl"
        X = _write_records(path, max(args.batches) * args.batch_records, args.dim)
        for batches in args.batches:
            print(json.dumps({**measure(path, X, batches, args.batch_records, args.zero_decoded),
                              "batch_records": args.batch_records, "dim": args.dim,
                              "zero_decoded": args.zero_decoded}), flush=True)


if __name__ == "__main__":
    main()
