"""The record formats side by side: what reading a record costs in each (issue 36).

For d in {20, 100}, on the same seeded records, 10^5 lines each, one record per message, decoded
by the service's codec (:func:`panpriv.streamer.io.formats.make_codec`, ``decode``: parse, map,
check, validate and clip) in micro-batches of 1,024; process CPU time, best of ``--rounds``:

- **csv**: plain ``x_1,…,x_d,y`` lines; **csv quoted**: the same rows written with
  ``csv.QUOTE_ALL`` (read by the :mod:`csv` module); **csv named**: ``QUOTE_ALL`` rows with a header,
  mapped by a schema of ``d`` named numbers;
- **json**: ``{"x": [...], "y": ...}``; **json named**: ``{"f0": …, "f1": …, "y": …}`` through the
  same schema.

Next to each, its floor: the same lines read with nothing checked and no per-record work the
format does not force — ``csv.reader`` over the whole batch and one ``np.array(..., float64)``
for the CSV rows; ``orjson.loads`` (or ``json.loads``) of each message and the values stacked for
JSON. Ratios are codec / floor. Run ``python -m benchmarks.codec_formats`` (``OPENBLAS_NUM_THREADS=1``
for one core).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
from collections.abc import Callable

import numpy as np

from panpriv.streamer.config import load_config
from panpriv.streamer.io.formats import make_codec

try:
    from orjson import loads as json_loads
except ImportError:  # pragma: no cover - without the fast-json extra
    json_loads = json.loads

MICRO_BATCH = 1024
SEED = 2026


def _rows(n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    X = rng.uniform(-1.0, 1.0, (n, dim)) / np.sqrt(dim)
    return X, np.where(X[:, 0] > 0, 1.0, -1.0)


def _csv_lines(X: np.ndarray, y: np.ndarray, quoting: int, header: list[str] | None = None) -> list[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=quoting, lineterminator="\n")
    if header:
        writer.writerow(header)
    writer.writerows([[*map(repr, map(float, x)), repr(float(v))] for x, v in zip(X, y)])
    return buffer.getvalue().encode().splitlines()


def formats(n: int, dim: int) -> dict[str, tuple[dict[str, object], list[bytes], Callable[[list[bytes]], object]]]:
    """Name → (record settings, messages, floor) for each format."""
    X, y = _rows(n, dim)
    names = [f"f{j}" for j in range(dim)]
    schema = {"features": names, "label": "y"}
    named = _csv_lines(X, y, csv.QUOTE_ALL, [*names, "y"])

    def csv_floor(lines: list[bytes]) -> object:
        return np.array(list(csv.reader(line.decode() for line in lines)), dtype=np.float64)

    def json_floor(lines: list[bytes]) -> object:
        return np.array([json_loads(line)["x"] for line in lines])

    def named_floor(lines: list[bytes]) -> object:
        return np.array([[obj[name] for name in names] for obj in map(json_loads, lines)])

    return {
        "csv": ({"records.format": "csv", "records.dim": dim}, _csv_lines(X, y, csv.QUOTE_MINIMAL), csv_floor),
        "csv quoted": ({"records.format": "csv", "records.dim": dim}, _csv_lines(X, y, csv.QUOTE_ALL), csv_floor),
        "csv named": ({"records.format": "csv", "records.fields": schema, "header": named[0]}, named[1:], csv_floor),
        "json": ({"records.format": "json", "records.dim": dim},
                 [json.dumps({"x": list(map(float, x)), "y": float(v)}).encode() for x, v in zip(X, y)], json_floor),
        "json named": ({"records.format": "json", "records.fields": schema},
                       [json.dumps({**dict(zip(names, map(float, x))), "y": float(v)}).encode() for x, v in zip(X, y)],
                       named_floor),
    }


def _cpu(run: Callable[[], object]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def measure(n: int, dim: int, rounds: int) -> list[tuple[str, float, float]]:
    """(format, codec records/s, floor records/s), best of ``rounds`` interleaved rounds."""
    results = []
    for name, (settings, lines, floor) in formats(n, dim).items():
        header = settings.pop("header", None)
        records = load_config(None, {"source.url": "file:x", "records.feature_bound": 1.0, **settings}).records
        codec = make_codec(records)
        if header is not None:
            codec.read_header(header)
        batches = [lines[i : i + MICRO_BATCH] for i in range(0, len(lines), MICRO_BATCH)]

        def decode() -> None:
            for batch in batches:
                decoded = codec.decode(batch)
                assert not decoded.rejects

        def read_floor() -> None:
            for batch in batches:
                floor(batch)

        best_codec = min(_cpu(decode) for _ in range(rounds))
        best_floor = min(_cpu(read_floor) for _ in range(rounds))
        results.append((name, n / best_codec, n / best_floor))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100])
    args = parser.parse_args(argv)
    print(f"{'format':<12} {'d':>4} {'codec rec/s':>12} {'floor rec/s':>12} {'codec/floor':>12}")
    for dim in args.dims:
        for name, rate, floor in measure(args.n, dim, args.rounds):
            print(f"{name:<12} {dim:>4} {rate:>12,.0f} {floor:>12,.0f} {rate / floor:>12.2f}")


if __name__ == "__main__":
    main()
