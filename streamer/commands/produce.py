"""``panpriv produce``: a load generator that writes synthetic records to a Kafka topic.

The records are those of the seeded synthetic source (:class:`panpriv.streamer.sources.local.SyntheticSource`:
record ``i`` depends only on ``(seed, i)``), encoded as the service reads them: one JSON object per
message (``{"x": [...], "y": ±1}``, :func:`panpriv.streamer.io.codec.encode_json`), binary batches of
``--batch-records`` records per message (:func:`panpriv.streamer.io.codec.encode_batch`, float32), or
text batches of as many (``json-batch``, ``ndjson``, ``csv-batch``:
:func:`panpriv.streamer.io.batch_formats.encode_records`, float64 exactly). It feeds the deploy
stack's topic (deploy/docker-compose.yml, profile ``load``), demos and benchmarks.

This is test data, not user data, and the generator is unrelated to any learner's noise.

Wiring (the CLI's parser lives in :mod:`panpriv.streamer.commands.cli`)::

    produce = commands.add_parser("produce", help=HELP, description=DESCRIPTION)
    add_produce_arguments(produce)
    produce.set_defaults(handler=run_produce)
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from typing import Literal

from panpriv.streamer.arg_types import positive_float, positive_int
from panpriv.streamer.commands.exit_codes import EXIT_OK
from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.batch_formats import FORMATS as BATCH_FORMATS
from panpriv.streamer.io.batch_formats import encode_records
from panpriv.streamer.io.codec import encode_batch, encode_json
from panpriv.streamer.sources.local import SyntheticSource

log = logging.getLogger("panpriv.produce")

HELP = "load generator: write synthetic records to a Kafka topic"
DESCRIPTION = (
    "Write the seeded synthetic stream (x with N(0, 1/dim) coordinates, y = ±1 from a fixed linear "
    "rule) to a Kafka topic, as JSON records, binary batches or text batches (JSON arrays, NDJSON, CSV "
    "blocks), as fast as possible or at --rate."
)
FORMATS = ("json", "binary", *BATCH_FORMATS)
"""What ``--format`` writes: one JSON record a message, or ``--batch-records`` records a message."""
Format = Literal["json", "binary", "json-batch", "ndjson", "csv-batch"]
UNBOUNDED = 2**62
"""Stream length used when ``--n`` is omitted (the synthetic source needs one; never reached)."""


def synthetic_messages(
    n: int | None, dim: int, seed: int, fmt: Format, batch_records: int
) -> Iterator[tuple[int, bytes]]:
    """``(records in the message, message bytes)`` for the first ``n`` synthetic records (all if None)."""
    source = SyntheticSource(UNBOUNDED if n is None else n, dim, seed, positions={})
    chunk = 4096 if fmt == "json" else batch_records
    while (batch := source.poll(chunk, 0.0)) is not None:
        assert batch.arrays is not None  # the synthetic source always yields arrays
        X, y = batch.arrays
        if fmt == "binary":
            yield len(y), encode_batch(X, y)
        elif fmt in BATCH_FORMATS:
            yield len(y), encode_records(fmt, X, y)
        else:
            for row, label in zip(X.tolist(), y.tolist(), strict=True):
                yield 1, encode_json(row, label)


class Pacer:
    """Sleeps so that ``records`` sent by time t never exceed ``rate × (t − start)`` (None: no limit)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.start = time.monotonic()

    def wait(self, records: int) -> None:
        if self.rate is None:
            return
        ahead = records / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


def produce(
    bootstrap: str, topic: str, n: int | None, dim: int, seed: int = 0,
    fmt: Format = "json", batch_records: int = 256, rate: float | None = None,
) -> int:
    """Send the synthetic records to ``topic`` at ``bootstrap``; return the number of records sent."""
    from kafka.errors import KafkaError

    from panpriv.streamer.kafka import client as kafka_client

    try:
        producer = kafka_client.producer(bootstrap.split(","), linger_ms=20, acks=1,
                                 max_request_size=16 * 1024 * 1024)
    except KafkaError as exc:
        raise SourceError(f"cannot connect to Kafka at {bootstrap}: {exc}") from None
    pacer = Pacer(rate)
    sent = 0
    last_log = time.monotonic()
    try:
        for records, message in synthetic_messages(n, dim, seed, fmt, batch_records):
            producer.send(topic, message)
            sent += records
            pacer.wait(sent)
            if time.monotonic() - last_log >= 10.0:
                log.info("produced %d records to %s", sent, topic)
                last_log = time.monotonic()
        producer.flush()
    finally:
        producer.close()
    return sent


def add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``panpriv produce``."""
    parser.add_argument("--bootstrap", required=True, help="Kafka brokers, host:port[,host:port]")
    parser.add_argument("--topic", required=True, help="topic to write to")
    parser.add_argument("--n", type=positive_int, help="number of records (default: until stopped)")
    parser.add_argument("--dim", type=positive_int, default=20, help="feature dimension (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic stream (default 0)")
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="one JSON record per message, or batches: binary, json-batch (a JSON array), ndjson, "
                             "csv-batch (default json)")
    parser.add_argument("--batch-records", type=positive_int, default=256,
                        help="records per batch message (default 256)")
    parser.add_argument("--rate", type=positive_float, help="records per second (default: as fast as possible)")


def run_produce(args: argparse.Namespace) -> int:
    """The ``produce`` command: send, print the count, exit 0."""
    sent = produce(args.bootstrap, args.topic, args.n, args.dim, args.seed, args.format,
                   args.batch_records, args.rate)
    print(f"panpriv produce: wrote {sent:,} records to {args.topic}")
    return EXIT_OK
