"""At least 10⁴ fuzzed and forged messages on each role's input topic (issue 35's soak, ``make soak``
only), through the roles' own state machines (the code their Kafka loops call for every record)
and, for the model topic, through the real readers on the real broker:

* **messages → shuffler** (:class:`panpriv.streamer.esa.shuffler.Shuffler`): each round's b real
  client messages, preceded by mutated copies of them (bits flipped, bytes replaced, cut, extended,
  random) and messages of another round; every one is dropped by a reason
  (``Shuffler.dropped``), and each released batch holds exactly the units inside the b real
  messages.
* **shuffled → analyzer** (:class:`panpriv.streamer.esa.analyzer.Analyzer`): before each real
  batch, the forged, re-signed, replayed, duplicated and out-of-order batches of
  :func:`tests.esa.parts.assert_refuses_bad_batches` and mutated copies of the real batch; each is
  refused by a reason (``Analyzer.rejected``), and the model is the one an analyzer fed only the
  real batches computes, bit for bit.
* **gradients → coordinator** (:class:`panpriv.streamer.scaleout.coordinator.Coordinator`): before
  each version's real means, every field of a mean replaced by odd values
  (:func:`tests.faults.test_malformed_messages.malformed`), cut and random records, means of the
  wrong shape or size and of other versions; each is counted (``rejected`` by reason, ``stale``),
  and the model is the clean twin's. (Not sent: the real mean under another worker's name — a
  well-formed mean, which only the topic's write ACLs keep out, docs/privacy.md.)
* **model → workers and clients** (:class:`panpriv.streamer.scaleout.wire.ModelReader`,
  :class:`panpriv.streamer.esa.model.ModelWatcher`, on the broker): malformed and mutated model
  records, then the real one, of the highest version (round) the readers accept; each skipped by
  a reason (``skipped_by_reason``), or — a mutation that is still a well-formed record (a digit of
  θ changed) — read and outranked by the real one: the reader ends on the real record.

The figures go to :data:`tests.faults.figures.FIGURES` (a traceback would fail the test: none of
this runs in a child process). The normal suite's fast variants: tests/faults/test_malformed_messages.py,
tests/esa/test_roles.py, tests/scaleout/test_rule.py.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from nacl.public import PrivateKey, SealedBox

from panpriv.streamer.esa import wire
from tests.esa import parts
from tests.faults.figures import FIGURES
from tests.faults.test_malformed_messages import malformed

pytestmark = pytest.mark.soak

PER_TOPIC = 10_000
"""Fuzzed and forged messages per topic (at least)."""


def mutated(valid: bytes, rng: random.Random) -> bytes:
    """``valid`` damaged one way: a bit flipped, a few bytes replaced, cut, extended, or replaced
    by random bytes of its length (never ``valid`` itself)."""
    kind = rng.randrange(5)
    data = bytearray(valid)
    if kind == 0:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        for _ in range(rng.randint(2, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 2:
        del data[rng.randrange(len(data)):]
    elif kind == 3:
        data += rng.randbytes(rng.randint(1, 64))
    else:
        data = bytearray(rng.randbytes(len(data)))
    return bytes(data) if bytes(data) != valid else bytes(data) + b"\x00"


# -- messages → shuffler ------------------------------------------------------------------------


def test_soak_the_shuffler_drops_every_fuzzed_message_by_a_reason() -> None:
    from panpriv.streamer.esa.shuffler import Shuffler
    from tests.esa.test_roles import SHUFFLER, B, P, analyzer_for, encoder, records

    key = PrivateKey.generate()
    model = analyzer_for(key).model()
    shuffler = Shuffler(SHUFFLER.box, B, P)
    size = wire.message_size(P)
    box = SealedBox(SHUFFLER.box)
    rng = random.Random()
    rounds, per_round = 20, PER_TOPIC // 20
    X, y = records(rounds * B, seed=35)
    offset = sent = 0
    for t in range(rounds):
        real = encoder(key, dataclasses.replace(model, round=t)).encode(X[t * B:(t + 1) * B], y[t * B:(t + 1) * B])
        ahead = encoder(key, dataclasses.replace(model, round=t + 5)).encode(X[:1], y[:1])[0]
        late = encoder(key, dataclasses.replace(model, round=t - 1)).encode(X[:1], y[:1])[0] if t else ahead
        fuzz = [mutated(rng.choice(real), rng) for _ in range(per_round - 2)] + [ahead, late]
        for message in fuzz:
            assert shuffler.offer(offset, message) == [], "a damaged message completed a round"
            offset += 1
        sent += len(fuzz)
        assert shuffler.waiting == 0, "a damaged message was taken into a round"
        out = [r for i, message in enumerate(real) for r in shuffler.offer(offset + i, message)]
        offset += len(real)
        ((round_, units),) = out
        inside = [wire.open_message(m, size, SHUFFLER.key_id, box)[1] for m in real]  # type: ignore[index]
        assert round_ == t and sorted(units) == sorted(inside), "exactly the units inside the b real messages"
        shuffler.mark_released(t)
    assert sum(shuffler.dropped.values()) == sent >= PER_TOPIC
    FIGURES.counted("messages (shuffler)", shuffler.dropped)


# -- shuffled → analyzer ------------------------------------------------------------------------


def test_soak_the_analyzer_refuses_every_fuzzed_and_forged_batch_by_a_reason() -> None:
    from tests.esa.test_roles import SHUFFLER, B, analyzer_for, encoder, records, shuffled

    key = PrivateKey.generate()
    analyzer, clean = analyzer_for(key), analyzer_for(key)
    charged: list[int] = []
    analyzer.gate = lambda round_, report: charged.append(round_)
    rng = random.Random()
    rounds, per_round = 20, PER_TOPIC // 20
    X, y = records(rounds * B, seed=36)
    applied = b""
    sent = 0
    for t in range(rounds):
        units = shuffled(encoder(key, analyzer.model()).encode(X[t * B:(t + 1) * B], y[t * B:(t + 1) * B]), t)
        if applied:  # forged, re-signed, replayed, duplicated, out of order: each refused, counted once
            parts.assert_refuses_bad_batches(analyzer, SHUFFLER, applied, units, charged)
            sent += 9
        batch = parts.signed(SHUFFLER, t, units)
        for _ in range(per_round):
            assert not analyzer.handle(mutated(batch, rng)), "a damaged batch was applied"
        sent += per_round
        assert analyzer.round == t and charged == list(range(t)), "nothing of a refused batch charged or learned"
        assert analyzer.handle(batch) and clean.handle(batch)
        applied = batch
    assert sum(analyzer.rejected.values()) == sent >= PER_TOPIC
    np.testing.assert_array_equal(analyzer.learner.release(), clean.learner.release())
    assert analyzer.report().output == clean.report().output
    FIGURES.counted("shuffled (analyzer)", analyzer.rejected)


# -- gradients → coordinator --------------------------------------------------------------------


def forged_means(valid: bytes, version: int, w: int, params: int, rng: random.Random) -> Iterator[bytes]:
    """Malformed and forged gradient records around the real mean ``valid`` of ``version``."""
    from panpriv.streamer.scaleout.wire import GradientRecord

    real = json.loads(valid)
    for message in malformed(valid):
        try:
            value = json.loads(message)
        except (ValueError, RecursionError):
            yield message
            continue
        if isinstance(value, dict) and value.keys() == real.keys() and \
                [key for key in real if value[key] != real[key]] == ["worker"]:
            continue  # the real mean under another worker's name: who writes the topic is its ACLs' business
        yield message
    for _ in range(400):
        yield valid[: rng.randrange(len(valid))]
        yield rng.randbytes(rng.randint(1, 200))
    for shape, records, at in (((params + 1,), w, version), ((params - 1,), w, version), ((params,), w + 1, version),
                               ((params,), w, version + 1), ((params,), w, version - 1)):
        yield GradientRecord("d", at, "forger", records, np.full(shape, 0.5), {"k": (0, records)}).to_json()


def test_soak_the_coordinator_counts_every_fuzzed_mean_by_a_reason() -> None:
    from panpriv.streamer.scaleout.coordinator import Coordinator
    from panpriv.streamer.scaleout.wire import GradientRecord
    from tests.scaleout.test_rule import _learner

    workers = 2
    coordinator, clean = Coordinator(_learner(), workers, "d"), Coordinator(_learner(), workers, "d")
    rng = random.Random()
    sent = offset = foreign = 0
    while sent < PER_TOPIC and not coordinator.done:
        version, w, params = coordinator.version, coordinator.worker_batch, coordinator.learner.param_count
        means = [GradientRecord("d", version, f"worker-{i}", w, np.asarray([rng.uniform(-1, 1) for _ in range(params)]),
                                {f"k{i}": (version * w, (version + 1) * w)}).to_json() for i in range(workers)]
        for record in (m for mean in means for m in forged_means(mean, version, w, params, rng)):
            pending, counted = len(coordinator.pending), sum(coordinator.rejected.values()) + coordinator.stale
            assert not coordinator.handle(record, offset) and coordinator.version == version, record[:200]
            assert len(coordinator.pending) == pending, f"a malformed or forged mean was taken: {record[:200]!r}"
            if sum(coordinator.rejected.values()) + coordinator.stale == counted:  # not counted: not for this model
                assert json.loads(record)["deployment"] != "d", record[:200]
                foreign += 1
            offset += 1
            sent += 1
        for record in means:
            coordinator.handle(record, offset)
            clean.handle(record, offset)
            offset += 1
        assert coordinator.version == version + 1
    counted = {**coordinator.rejected, "stale": coordinator.stale, "another deployment's (ignored)": foreign}
    assert sent >= PER_TOPIC and sum(counted.values()) == sent, (sent, counted)
    np.testing.assert_array_equal(coordinator.learner.release(), clean.learner.release())
    FIGURES.counted("gradients (coordinator)", counted)


# -- model → workers and clients (the real broker) -------------------------------------------------


def model_fuzz(valid: bytes, rng: random.Random) -> list[bytes]:
    """:data:`PER_TOPIC` malformed and mutated copies of the model record ``valid``."""
    fuzz = list(malformed(valid))
    while len(fuzz) < PER_TOPIC:
        fuzz.append(mutated(valid, rng))
    return fuzz


def read_fuzzed(kafka_broker, topic: str, valid: bytes, reader: Callable[[], object], order: str) -> Counter[str]:  # noqa: ANN001
    """Send the fuzz then ``valid`` to ``topic``; read it with ``reader()`` (an object whose
    ``_newest`` is the :class:`~panpriv.streamer.kafka.topic_reader.NewestRecord`); the reasons."""
    rng = random.Random()
    fuzz = model_fuzz(valid, rng)
    parts.send(kafka_broker.bootstrap, topic, [*fuzz, valid])
    newest_reader = reader()
    try:
        newest = newest_reader._newest  # type: ignore[attr-defined]
        newest.current(timeout_s=120)
        best = json.loads(valid)[order]
        assert getattr(newest.newest, order) == best, "the reader does not end on the real record"
        counted = Counter(newest.skipped_by_reason)
    finally:
        newest_reader.close()  # type: ignore[attr-defined]
    # The rest is well formed (a digit of theta changed, another deployment's name): outranked by
    # the real record, whose order is the highest the wire allows, or not this deployment's.
    counted["well formed, outranked or foreign"] = len(fuzz) - newest.skipped
    assert newest.skipped_by_reason["order_out_of_range"] >= 2  # at least the 401-digit and the negative order
    return counted


@pytest.mark.integration
def test_soak_workers_and_clients_skip_every_fuzzed_model_record_by_a_reason(kafka_broker, unique_name) -> None:  # noqa: ANN001
    from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
    from panpriv.streamer.esa.analyzer import Analyzer
    from panpriv.streamer.esa.keys import load_private
    from panpriv.streamer.esa.model import ModelWatcher
    from panpriv.streamer.scaleout.wire import ModelReader, ModelVersion

    top = 2**63 - 1  # the highest order the readers accept: a mutated record of a higher one is out of range
    version = ModelVersion("default", top, 2, 8, {"dim": 3}, {"theta": {"array": [0.0, 0.0, 0.0]}}, np.zeros(3), 4, 16)
    topic = kafka_broker.create_topic(unique_name("soak-model"))
    counted = read_fuzzed(kafka_broker, topic, version.to_json(),
                          lambda: ModelReader([kafka_broker.bootstrap], topic, "default"), "version")
    FIGURES.counted("model (scale-out workers)", counted)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as keys:
        pair = parts.key_pairs(Path(keys))
        learner = ShuffleGaussianSGD(dim=3, loss="logistic", epsilon=4.0, delta=1e-5, batch_size=8, radius=2.0)
        record = Analyzer(learner, [load_private(pair[0].private)], "default").model()
    record = dataclasses.replace(record, round=top)
    topic = kafka_broker.create_topic(unique_name("soak-esa-model"))
    counted = read_fuzzed(kafka_broker, topic, record.to_json(),
                          lambda: ModelWatcher(kafka_broker.bootstrap, topic, "default"), "round")
    FIGURES.counted("model (E-S-A clients)", counted)
