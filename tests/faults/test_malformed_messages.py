"""Malformed and forged messages on the roles' input topics: skipped or counted, never a traceback
(issue 35, "No traceback anywhere").

On the base, one JSON record could end a role with a traceback: on a model topic (read by every
E-S-A client and scale-out worker through kafka/topic_reader.NewestRecord) a JSON array or number
(``AttributeError``), a number where an integer belongs set to ``Infinity`` (``OverflowError``) or
nesting deeper than the recursion limit (``RecursionError``); on the gradients topic the same
``OverflowError`` and ``RecursionError`` out of ``GradientRecord.from_json`` ended the coordinator.
A 148-byte shuffled-topic record declaring 2³²−1 units of 0 bytes made the analyzer build them all
before checking the signature (15 s for 5·10⁷). The model readers run against the real broker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyzer import Analyzer
from panpriv.streamer.esa.keys import load_private
from panpriv.streamer.esa.model import ModelRecord, ModelWatcher
from panpriv.streamer.scaleout.wire import GradientRecord, ModelReader, ModelVersion, WireError
from tests.esa import parts
from tests.faults.harness import ROOT
from tests.realparts import KafkaBroker

DEEP = 5_000  # beyond the JSON decoder's nesting limit (the interpreter's recursion limit, 1,000)
ODD_VALUES: list[Any] = [float("inf"), float("-inf"), float("nan"), 10**400, -(10**30), [], {}, "x", None, True, [[1.0]]]
"""JSON values put in place of each field (``10**400`` is written as a 401-digit integer)."""


def malformed(valid: bytes) -> Iterator[bytes]:
    """Messages derived from the JSON object ``valid``: whole-message oddities, then every field
    replaced by each of :data:`ODD_VALUES`, then deep nesting in each field."""
    yield from (b"", b"\xff\xfe", b"[]", b"1", b"null", b'"model"', b"[" * DEEP + b"]" * DEEP, valid[: len(valid) // 2])
    record = json.loads(valid)
    for key in record:
        for odd in ODD_VALUES:
            yield json.dumps({**record, key: odd}).encode()
        yield json.dumps({**record, key: None}).encode().replace(b"null", b"[" * DEEP + b"]" * DEEP)


def refused(parse: Callable[[bytes], Any], messages: list[bytes]) -> int:
    """How many of ``messages`` ``parse`` raises on (whatever it raises)."""
    count = 0
    for message in messages:
        try:
            parse(message)
        except Exception:  # noqa: BLE001 - counting, not judging: the reader must skip each of these
            count += 1
    return count


def test_a_malformed_gradient_record_is_a_wire_error_and_nothing_else() -> None:
    """The coordinator skips (and counts) a :class:`WireError`; anything else ended it."""
    valid = GradientRecord("default", 3, "worker-1", 8, np.full(3, 0.25), {"kafka:c/t/0": (0, 8)}).to_json()
    outcomes: dict[str, int] = {}
    for message in malformed(valid):
        try:
            GradientRecord.from_json(message)
            outcomes["parsed"] = outcomes.get("parsed", 0) + 1
        except WireError:
            outcomes["refused"] = outcomes.get("refused", 0) + 1
    assert outcomes["refused"] > 50, outcomes
    assert GradientRecord.from_json(valid).to_json() == valid
    # A mean whose ranges do not hold its records (none at all, on the base accepted by the
    # coordinator: the soak's forged means found it): published with nothing to check its charge by.
    for ranges in ({}, {"kafka:c/t/0": (0, 7)}, {"kafka:c/t/0": (8, 0)}, {"kafka:c/t/0": (-8, 0)}):
        forged = json.loads(valid)
        forged["ranges"] = ranges
        with pytest.raises(WireError, match="ranges do not hold its records"):
            GradientRecord.from_json(json.dumps(forged).encode())


_FORGED_BATCH = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a regression runs out of memory here, not on the machine
from panpriv.streamer.esa import wire
forged = wire._BATCH_HEAD.pack(wire.BATCH_MAGIC, b"d" * 32, 1, 2**32 - 1, 0, b"x" * 32, b"s" * 8, b"g" * 64)
try:
    wire.parse_batch(forged)
except wire.WireError as exc:
    print(exc)
"""


def test_a_batch_of_empty_units_is_malformed_at_once() -> None:
    """In a child limited to 1 GiB: on the base it built the 2³²−1 units until it ran out of memory."""
    done = subprocess.run([sys.executable, "-c", _FORGED_BATCH], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "malformed_batch", done.stderr[-2000:]
    empty = wire._BATCH_HEAD.pack(wire.BATCH_MAGIC, b"d" * 32, 1, 0, 0, b"x" * 32, b"s" * 8, b"g" * 64)
    assert wire.parse_batch(empty).units == ()  # a batch of no unit stays well formed


def out_of_range(messages: list[bytes], field: str) -> int:
    """How many of ``messages`` hold an integer ``field`` outside [0, 2^63) (the model readers' order)."""
    count = 0
    for message in messages:
        try:
            value = json.loads(message)
        except (ValueError, RecursionError):
            continue
        order = value.get(field) if isinstance(value, dict) else None
        count += type(order) is int and not 0 <= order < 2**63
    return count


@pytest.fixture
def model_topic(kafka_broker: KafkaBroker, unique_name: Callable[[str], str]) -> str:
    return kafka_broker.create_topic(unique_name("malformed-model"))


@pytest.mark.integration
def test_an_esa_client_skips_every_malformed_model_record(kafka_broker: KafkaBroker, model_topic: str, tmp_path) -> None:  # noqa: ANN001
    keys = parts.key_pairs(tmp_path)
    learner = ShuffleGaussianSGD(dim=3, loss="logistic", epsilon=4.0, delta=1e-5, batch_size=8, radius=2.0)
    valid = Analyzer(learner, [load_private(keys[0].private)], "default").model().to_json()
    bad = list(malformed(valid))
    parts.send(kafka_broker.bootstrap, model_topic, [*bad, valid])
    watcher = ModelWatcher(kafka_broker.bootstrap, model_topic, "default")
    try:
        model = watcher.current(timeout_s=60)
        # Some replacements still parse (``true`` for the round: round 1, as a forged record could say
        # anyway: who may write the model topic is the deployment's ACLs' business, docs/privacy.md);
        # none ends the client, and a round out of [0, 2^63) is skipped by its reason instead of
        # winning as the newest model for ever after (on the base: round 10^400).
        assert model is not None and model.round == 1
        assert watcher._newest.skipped_by_reason == {"malformed": refused(ModelRecord.from_json, bad),
                                                     "order_out_of_range": out_of_range(bad, "round")}
        assert watcher._newest.skipped_by_reason["malformed"] > 50
    finally:
        watcher.close()


@pytest.mark.integration
def test_a_scaleout_worker_skips_every_malformed_model_record(kafka_broker: KafkaBroker, model_topic: str) -> None:
    valid = ModelVersion("default", 2, 2, 8, {"dim": 3}, {"theta": {"array": [0.0, 0.0, 0.0]}}, np.zeros(3), 4, 16).to_json()
    bad = list(malformed(valid))
    parts.send(kafka_broker.bootstrap, model_topic, [*bad, valid])
    reader = ModelReader([kafka_broker.bootstrap], model_topic, "default")
    try:
        model = reader.read_to_end(timeout_s=60)
        # On the base a 401-digit version parsed and won: every later (real) version was older.
        assert model is not None and model.version == 2
        assert reader._newest.skipped_by_reason == {"malformed": refused(ModelVersion.from_json, bad),
                                                    "order_out_of_range": out_of_range(bad, "version")}
        assert reader._newest.skipped_by_reason["malformed"] > 50
    finally:
        reader.close()
