"""``panpriv shuffle``: the shuffler of Encode–Shuffle–Analyze (Bittau et al. 2017, "Prochlo", §3).

What it does with each record of the messages topic (one partition; see "Order" below):

1. keeps the value only — the record's key, headers, timestamp and offset never leave the process;
2. checks the framing the protocol makes public (magic, the fixed size) and reads the clear round
   tag; a record that fails is dropped (``malformed``; ``old_format`` for a message of the format
   before onion sealing), one for a round already released is dropped (``late``): the analyzer
   has moved on and a second batch of a round would only be rejected; one for a round more than
   ``max_ahead`` (default 1) past the last released is dropped (``too_early``): no honest client
   can answer a round whose model does not exist yet, and holding such messages would let anyone
   pin the shuffler's memory and its committed offset;
3. **removes its layer** (onion sealing, :mod:`panpriv.streamer.esa.wire`): opens the box sealed to
   its key and keeps the units inside, each sealed to the analyzer; a message to another shuffler
   key is dropped (``unknown_key``), one that does not open (``undecryptable``), whose sealed round
   is not its clear one (``round_mismatch``) or whose body is not the learner's units
   (``malformed``) too. What it releases are therefore bytes that appear nowhere on the messages
   topic (there they are inside its box), of one size;
4. groups by round and **releases a round only at exactly b messages** (the batch size of the
   model's calibration): the first b messages of the round in offset order that opened. A short
   round waits — the threshold is never lowered, so every released batch hides each message among
   b − 1 others. With ``drop_short_after_s`` a round that stays short that long after its first
   message is dropped (``short_round``): a public rule on public counts and times;
5. permutes the units with OS entropy (:mod:`panpriv.streamer.esa.permute`), **signs** the batch with
   its key for the deployment (:class:`panpriv.streamer.esa.batches.BatchSigner`) and produces it as
   one record with ``acks=all``, and waits for the acknowledgement;
6. only then commits the input offset: the smallest offset of a message still waiting, or the end
   of what was read when none is waiting.

It holds its own private key only: it opens the outer layer of a message, never a unit (sealed to
the analyzer), so it learns rounds, sizes and the broker's metadata, not content.

**Share messages** (``shares`` = m; ``shuffle-sgd``, ``shuffle-acsa``, ``shuffle-gd``,
:mod:`panpriv.protocols.secure_sum`): each message holds one user's m share units. The threshold
still counts users — a round is released at exactly b complete messages — and the batch holds
their b·m units, all permuted together, so no unit's position says which user, or which other
units, it came with. A message with another m is ``malformed``.

**Exactly once with respect to its input.** *No loss*: an offset is committed only once every
message below it is in an acknowledged batch or was dropped by a rule above (step 6). *No
duplicate*: rounds are released in increasing order (round t + 1 cannot exist before the analyzer
has the batch of round t and publishes its model), so the shuffler's release state is one number,
the last released round, which it reads back from the last record of the shuffled topic when it
starts. After a crash it re-reads from the committed offset: messages of rounds up to that one are
``late`` (they were released, or were the extras of a released round); for the next round, the
first b messages in offset order are the same messages it would have released, because none of
them lies below the committed offset (they were waiting). The one window left — a batch produced
by the dead process that becomes visible only after the restart read the topic's end — gives a
second batch with the **same digest and signature** (the digest is a hash of the round and the
sorted units — opening a box is deterministic, so the units are the same bytes — independent of
the permutation, and Ed25519 signs deterministically), which the analyzer drops as
``duplicate_batch``. Tested with SIGKILL (``tests/esa``).

**Deployment.** The shuffler signs for the deployment id ``esa:<cluster>/<messages topic>`` (the
data key of :func:`panpriv.streamer.esa.deployment.data_key`), computed from the broker's cluster id: an
analyzer of another deployment refuses its batches even if the two share a shuffler key. A shuffled
topic whose last record is an unsigned batch of the format before signed batches is refused with
the migration to take.

**Order.** Determinism of "the first b messages of a round" needs one total order of the input,
so the messages topic must have one partition, and so must the shuffled topic the analyzer reads
in order. Every role of a deployment creates the topics it names with that layout when they are
missing and refuses another partition count with one line (:func:`deployment_topics`,
:mod:`panpriv.streamer.kafka.topics`). Scaling out is one messages topic per shuffler/deployment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nacl.public import PrivateKey, SealedBox

from panpriv.streamer.errors import ConfigError
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.permute import permuted

if TYPE_CHECKING:
    from panpriv.streamer.esa.keys import ShufflerKeys
    from panpriv.streamer.esa.metrics import ShufflerMetrics
    from panpriv.streamer.kafka.topics import TopicSpec

log = logging.getLogger("panpriv.shuffle")

MAX_BATCH_BYTES = 256 * 1024 * 1024

OPEN_REASONS = ("malformed", "old_format", "unknown_key", "undecryptable", "round_mismatch")
"""Why a message's outer layer does not give units (:func:`panpriv.streamer.esa.wire.open_message`)."""

DROP_REASONS = (*OPEN_REASONS, "late", "too_early", "short_round")
"""Every reason :class:`Shuffler` drops a message for (module docstring)."""


@dataclass
class Pending:
    """Messages of one round not yet released: (offset, the units inside it), in offset order."""

    first_seen: float
    items: list[tuple[int, list[bytes]]] = field(default_factory=list)


class Shuffler:
    """The shuffler's state machine, separated from Kafka for testing.

    Parameters
    ----------
    private_key
        The shuffler's own key (opens the outer layer of messages).
    batch_size
        b, the messages of every released round.
    params
        Coordinates per vector (shares: per share): fixes the message and unit sizes.
    last_released
        The last round already released (−1: none).
    drop_short_after_s
        Drop a round still short this long after its first message (``None``: wait forever).
    max_ahead
        Drop messages for rounds beyond ``last_released + max_ahead``.
    shares
        m: each message is a share message of m units, released as units (``None``: single messages).
    """

    def __init__(self, private_key: PrivateKey, batch_size: int, params: int, last_released: int = -1,
                 drop_short_after_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 max_ahead: int = 1, shares: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.batch_size = batch_size
        self.unit_size = wire.vector_unit_size(params) if shares is None else wire.share_unit_size(params)
        self.message_size = wire.message_size_for((shares or 1) * self.unit_size)
        self._box = SealedBox(private_key)
        self._key_id = key_id(private_key.public_key)
        self.last_released = last_released
        self.drop_short_after_s = drop_short_after_s
        self.max_ahead = max_ahead
        self.shares = shares
        self.dropped: Counter[str] = Counter()
        self.released = 0
        self._pending: dict[int, Pending] = {}
        self._clock = clock

    def offer(self, offset: int, value: bytes | None) -> list[tuple[int, list[bytes]]]:
        """Take one input record; return the rounds it completes as (round, permuted units)."""
        value = value or b""
        try:
            round_, _, _ = wire.message_header(value, self.message_size)
        except wire.WireError as exc:
            self.dropped[str(exc)] += 1
            return []
        if round_ <= self.last_released:
            self.dropped["late"] += 1
            return []
        if round_ > self.last_released + self.max_ahead:
            self.dropped["too_early"] += 1
            return []
        units = self._units(value)
        if isinstance(units, str):
            self.dropped[units] += 1
            return []
        pending = self._pending.setdefault(round_, Pending(self._clock()))
        pending.items.append((offset, units))
        if len(pending.items) < self.batch_size:
            return []
        del self._pending[round_]
        return [(round_, permuted([unit for _, units in pending.items for unit in units]))]

    def _units(self, value: bytes) -> list[bytes] | str:
        """The units inside a message's outer layer, or why it is dropped (module docstring, step 3)."""
        opened = wire.open_message(value, self.message_size, self._key_id, self._box)
        if isinstance(opened, str):
            return opened
        try:
            return wire.split_units(opened[1], self.shares or 1, self.unit_size)
        except wire.WireError:
            return "malformed"

    def mark_released(self, round_: int) -> None:
        """Round ``round_`` is acknowledged on the shuffled topic: rounds before it can never be
        released any more (the analyzer has moved past them), so their waiting messages are late."""
        self.last_released = max(self.last_released, round_)
        self.released += 1
        for stale in [r for r in self._pending if r <= self.last_released]:
            self.dropped["late"] += len(self._pending.pop(stale).items)

    def expire(self) -> None:
        """Apply the short-round rule (``drop_short_after_s``)."""
        if self.drop_short_after_s is None:
            return
        now = self._clock()
        for round_ in [r for r, p in self._pending.items() if now - p.first_seen >= self.drop_short_after_s]:
            self.dropped["short_round"] += len(self._pending.pop(round_).items)

    def commit_offset(self, next_offset: int) -> int:
        """The input offset that is safe to commit: the smallest waiting offset, else ``next_offset``."""
        waiting = [p.items[0][0] for p in self._pending.values() if p.items]
        return min(waiting) if waiting else next_offset

    @property
    def waiting(self) -> int:
        return sum(len(p.items) for p in self._pending.values())


def last_released_round(consumer: Any, topic: str) -> int:
    """The round of the last batch on ``topic`` (one partition), −1 if it is empty;
    :class:`panpriv.streamer.errors.ConfigError` if it is an unsigned batch of the format before
    signed batches (the migration is a new deployment)."""
    from kafka import TopicPartition

    from panpriv.streamer.kafka.calls import beginning_offsets, end_offsets

    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    end = end_offsets(consumer, [tp])[tp]
    if end <= beginning_offsets(consumer, [tp])[tp]:
        return -1
    consumer.seek(tp, end - 1)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                if record.offset == end - 1:
                    if wire.legacy_batch_round(record.value) is not None:
                        raise ConfigError(
                            f"the shuffled topic {topic} ends with an unsigned batch of the format before onion "
                            "sealing and signed batches (PPB1): migrate by starting a new deployment with new messages "
                            "and shuffled topics, a shuffler key (`panpriv keygen DIR --role shuffler`) and a new "
                            "analyzer --out (docs/privacy.md, 'Migrating')")
                    return wire.parse_batch(record.value).round
    raise TimeoutError(f"could not read the last batch of {topic}")


def deployment_topics(messages: str | None = None, shuffled: str | None = None, model: str | None = None,
                      release_bytes: int | None = None) -> list[TopicSpec]:
    """The topics of an E-S-A deployment a role names, with the layout every role needs: the
    messages and shuffled topics one partition each (one total order: module docstring), the
    shuffled one admitting a release of ``release_bytes``; the model topic compacted (its newest
    record per deployment is the public state; any partition count is read)."""
    from panpriv.streamer.kafka.topics import TopicSpec

    specs = []
    if messages:
        specs.append(TopicSpec(messages, "shuffler", "its batches are the first b messages of a round in one total order"))
    if shuffled:
        specs.append(TopicSpec(shuffled, "analyzer", "it reads the shuffler's batches in their order, from partition 0",
                               max_message_bytes=release_bytes))
    if model:
        specs.append(TopicSpec(model, "analyzer", "its newest record per deployment is the public model", partitions=None,
                               compacted=True))
    return specs


@dataclass
class ShuffleOptions:
    """What ``panpriv shuffle`` needs."""

    bootstrap: list[str]
    messages_topic: str
    shuffled_topic: str
    batch_size: int
    params: int
    group: str
    shuffler_key: Path
    """The shuffler's private key file (``panpriv keygen DIR --role shuffler``)."""
    drop_short_after_s: float | None = None
    max_rounds: int | None = None
    idle_exit_s: float | None = None
    max_ahead: int = 1
    metrics: ShufflerMetrics | None = None
    shares: int | None = None
    make_state: Callable[[int, ShufflerKeys, str], Any] | None = None
    """Another state machine with :class:`Shuffler`'s interface, built from the last released round,
    the shuffler's keys and the deployment id (``checkin``:
    :class:`panpriv.streamer.esa.slot_shuffler.SlotShuffler`); ``None``: :class:`Shuffler`."""


def run(options: ShuffleOptions, stop: threading.Event | None = None) -> Shuffler:
    """Serve until SIGTERM/SIGINT (or ``stop``), ``max_rounds`` releases, or ``idle_exit_s`` without
    input, in the role loop (:mod:`panpriv.streamer.runtime.role_loop`)."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    from panpriv.streamer.esa.batches import BatchSigner
    from panpriv.streamer.esa.deployment import data_key
    from panpriv.streamer.esa.keys import load_shuffler
    from panpriv.streamer.kafka import calls as kafka_calls
    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.kafka.topics import ensure_topics
    from panpriv.streamer.runtime.role_loop import RoleLoop
    from panpriv.streamer.sources.identity import kafka_cluster_identity

    def status() -> str:
        return (f"last released round {state.last_released}, {state.waiting} messages waiting, "
                f"dropped {dict(state.dropped) or 'none'}")

    with RoleLoop("shuffler", stop=stop, status=status) as loop:
        keys = load_shuffler(options.shuffler_key)
        unit = (wire.vector_unit_size(options.params) if options.shares is None
                else wire.share_unit_size(options.params))
        ensure_topics(options.bootstrap, deployment_topics(options.messages_topic, options.shuffled_topic, release_bytes=(
            wire.batch_bytes(options.batch_size * (options.shares or 1), unit))))
        reader = kafka_client.consumer(options.bootstrap, enable_auto_commit=False, group_id=None)
        try:
            last = last_released_round(reader, options.shuffled_topic)
            deployment = data_key(kafka_cluster_identity(reader, options.bootstrap), options.messages_topic)
        finally:
            reader.close()
        signer = BatchSigner(keys, deployment)
        state = (options.make_state(last, keys, deployment) if options.make_state is not None else
                 Shuffler(keys.box, options.batch_size, options.params, last, options.drop_short_after_s,
                          max_ahead=options.max_ahead, shares=options.shares))
        consumer = kafka_client.consumer(options.bootstrap, group_id=options.group, enable_auto_commit=False,
                                         auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024)
        loop.close_on_exit(consumer.close, "messages consumer")
        producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0, max_request_size=MAX_BATCH_BYTES,
                                         retries=5)
        loop.close_on_exit(producer.close, "shuffled producer")
        tp = TopicPartition(options.messages_topic, 0)
        consumer.assign([tp])
        start = kafka_calls.committed(consumer, tp)
        if start is not None:
            consumer.seek(tp, start)
        else:
            consumer.seek_to_beginning(tp)
        log.info("shuffler: key %s (signer %s), deployment %s, batch size %d, last released round %d, reading %s "
                 "from %s", keys.key_id.hex(), keys.signer_id.hex(), deployment, options.batch_size, last,
                 options.messages_topic, "the beginning" if start is None else f"the committed offset {start}")
        if options.metrics is not None:
            options.metrics.observe_state(state.last_released, state.waiting, state.dropped)
        committed = start
        idle_since = time.monotonic()

        def commit(safe: int) -> None:
            """Commit ``safe`` (step 6 of the module docstring) unless it is already committed."""
            nonlocal committed
            if safe != committed:
                kafka_calls.commit(consumer, {tp: OffsetAndMetadata(safe, "", -1)})
                committed = safe

        def release(released: list[tuple[int, list[bytes]]]) -> None:
            for round_, units in released:
                producer.send(options.shuffled_topic, value=signer.record(round_, units)).get(timeout=60)
                state.mark_released(round_)
                if options.metrics is not None:
                    options.metrics.observe_release(len(units))
                log.info("released round %d (%d units)", round_, len(units))

        def step() -> None:
            nonlocal idle_since
            polled = consumer.poll(timeout_ms=200)
            next_offset = consumer.position(tp)
            if not polled:
                release(state.expire() or [])  # Shuffler.expire drops; SlotShuffler.expire may close a slot
                if options.idle_exit_s is not None and time.monotonic() - idle_since > options.idle_exit_s:
                    loop.finish("idle")
            else:
                idle_since = time.monotonic()
            for records in polled.values():
                for record in records:
                    released = state.offer(record.offset, record.value)
                    release(released)
                    if released:  # commit after every acknowledged release, not once per poll: a crash
                        commit(state.commit_offset(record.offset + 1))  # re-sends less
            if options.metrics is not None:
                options.metrics.observe_state(state.last_released, state.waiting, state.dropped)
            commit(state.commit_offset(next_offset))

        loop.run(step, done=lambda: options.max_rounds is not None and state.released >= options.max_rounds)
    log.info("shuffler stopped: %d rounds released, %d messages waiting, dropped %s", state.released, state.waiting,
             dict(state.dropped) or "none")
    return state
