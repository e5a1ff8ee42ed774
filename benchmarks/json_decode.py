"""The JSON decoder, side by side: the standard library's path against the orjson path (issue 18).

For d in {20, 100, 1000}, on the same seeded synthetic records (:mod:`panpriv.streamer.commands.produce`), one
record per message, measured in one run with the rounds interleaved (best of ``--rounds``):

- **decode**: :meth:`panpriv.streamer.io.codec.JsonCodec.decode` on micro-batches of 1,024 messages, with
  ``fast=False`` (``json``'s scanner, the fallback) and ``fast=True`` (orjson) — parse, check,
  stack, validate and clip; process CPU time. Next to them the floor the issue measured:
  ``orjson.loads`` of every message and the ``x`` rows stacked into an array, nothing checked.
- **replay**: the real processing loop (:class:`panpriv.streamer.runtime.processor.Processor`, pan-acsa at
  ε = 1, δ = 1e-6, checkpoints and snapshots as in ``benchmarks.service``) replaying a JSONL file
  of the same records, once with each decoder; steady-state records/s (wall time after the first
  micro-batch, as ``benchmarks.service`` measures it).

Ratios are orjson / stdlib (the issue's target: JSON replay at least 2× the stdlib path). Run
``python -m benchmarks.json_decode`` (needs the ``fast-json`` extra; ``OPENBLAS_NUM_THREADS=1``
for one core).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from benchmarks.service import SteadyRate, service_config
from panpriv.streamer.commands.produce import synthetic_messages
from panpriv.streamer.io.codec import JsonCodec
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.processor import Processor

MICRO_BATCH = 1024
SEED = 2026


class _SteadyMetrics(ServiceMetrics):
    """ServiceMetrics that also times the batches after the first (:class:`benchmarks.service.SteadyRate`)."""

    def __init__(self) -> None:
        super().__init__()
        self.steady = SteadyRate()

    def observe_batch(self, records: int, seconds: float, messages: int | None = None, rejected: int = 0) -> None:
        super().observe_batch(records, seconds, messages, rejected)
        self.steady.batch_done(records)


def _cpu_seconds(run: Callable[[], None]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def _messages(n: int, dim: int) -> list[bytes]:
    return [message for _, message in synthetic_messages(n, dim, SEED, "json", 1)]


def decode_rates(dim: int, n: int, rounds: int) -> dict[str, float]:
    """Records/s of each decoder (and the bare orjson floor) on ``n`` one-record messages."""
    messages = _messages(n, dim)
    batches = [messages[i : i + MICRO_BATCH] for i in range(0, n, MICRO_BATCH)]
    records = service_config("file:unused.jsonl", "json", dim, n, Path("unused")).records
    stdlib, fast = JsonCodec(records, fast=False), JsonCodec(records, fast=True)
    first = batches[0]
    expected = stdlib.decode(first)
    got = fast.decode(first)
    if got.X.tobytes() != expected.X.tobytes() or got.rejects != expected.rejects:
        raise RuntimeError("the two JSON decoders disagree on the benchmark's records")

    def floor() -> None:
        for batch in batches:
            np.array([orjson.loads(m)["x"] for m in batch])

    cases: dict[str, Callable[[], None]] = {
        "stdlib": lambda: [stdlib.decode(batch) for batch in batches] and None,
        "orjson": lambda: [fast.decode(batch) for batch in batches] and None,
        "floor": floor,
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, run in cases.items():
            best[name] = min(best[name], _cpu_seconds(run))
    return {name: n / seconds for name, seconds in best.items()}


def replay_rates(dim: int, n: int, rounds: int, workdir: Path) -> dict[str, float]:
    """Steady-state records/s of the processing loop replaying a JSONL file, with each decoder."""
    path = workdir / f"records-{dim}.jsonl"
    with path.open("wb") as handle:
        for message in _messages(n, dim):
            handle.write(message + b"\n")
    best = {"stdlib": 0.0, "orjson": 0.0}
    for round_ in range(rounds):
        for name in best:
            config = service_config(f"file:{path}", "json", dim, n, workdir / f"out-{dim}-{name}-{round_}")
            metrics = _SteadyMetrics()
            processor = Processor(config, metrics=metrics)
            processor.codec = JsonCodec(config.records, fast=name == "orjson")
            result = processor.run()
            if result.outcome != "finished" or result.records != n:
                raise RuntimeError(f"replay ended with {result.outcome} after {result.records} of {n} records")
            best[name] = max(best[name], metrics.steady.rate)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records at d = 20 (fewer at larger d: similar bytes)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--no-replay", action="store_true", help="only the decoder, not the processing loop")
    args = parser.parse_args()
    print(f"JSON, one record per message, micro-batches of {MICRO_BATCH}; best of {args.rounds} interleaved rounds")
    print(f"{'':14s} {'d':>5s} {'records':>8s} {'stdlib rec/s':>13s} {'orjson rec/s':>13s} {'orjson/stdlib':>14s}"
          f" {'floor rec/s':>12s} {'orjson/floor':>13s}")
    with tempfile.TemporaryDirectory(prefix="panpriv-json-bench-") as tmp:
        for dim in args.dims:
            n = max(MICRO_BATCH * 4, args.records * 20 // max(dim, 20))
            rates = decode_rates(dim, n, args.rounds)
            print(f"{'decode (CPU)':14s} {dim:5d} {n:8,d} {rates['stdlib']:13,.0f} {rates['orjson']:13,.0f}"
                  f" {rates['orjson'] / rates['stdlib']:13.2f}x {rates['floor']:12,.0f} {rates['orjson'] / rates['floor']:12.2f}x",
                  flush=True)
            if not args.no_replay:
                replay = replay_rates(dim, n, args.rounds, Path(tmp))
                print(f"{'replay (wall)':14s} {dim:5d} {n:8,d} {replay['stdlib']:13,.0f} {replay['orjson']:13,.0f}"
                      f" {replay['orjson'] / replay['stdlib']:13.2f}x", flush=True)


if __name__ == "__main__":
    main()
