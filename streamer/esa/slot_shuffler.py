"""``panpriv shuffle --checkin``: the shuffler of ``checkin`` in Encode–Shuffle–Analyze (random
check-ins, Balle et al. 2020 Algs 1–2, §4.2; Bittau et al. 2017 §3).

Each client sends one check-in message at her wake slot w (:mod:`panpriv.streamer.esa.checkin_wire`). The
shuffler holds its own X25519 key (``panpriv keygen --role shuffler``) and opens the **outer**
layer only: the chosen slot (or "no check-in") and the client's choice key. The inner message is
sealed to the analyzer; the shuffler holds no key that opens it and forwards it byte for byte.

**Release rule (public).** With position slots every wake slot has exactly ``slot_length``
clients, and every wake slot that can choose slot s is ≤ s (sliding windows: s − m + 1, …, s;
fixed windows: the previous round). So slot s is released as soon as wake slot s is complete —
the first ``slot_length`` messages of wake slot s in offset order — in slot order, exactly once:

- ``update = "single"`` (Alg. 1): the candidate with the least choice key (ties: the least inner
  message). Keys are uniform and drawn by the clients, as the in-process learner's candidates draw
  theirs, so the pick is uniform and independent of the data, and a restarted shuffler picks the
  same one. An **empty slot gets a dummy**: the learner's randomizer on the zero vector, sealed to
  the analyzer's public key like a client's message, both pseudorandom from the shuffler's key and
  the slot, so a restarted shuffler releases the same bytes (:func:`dummy_sealer`) — the analyzer
  must not learn which slots were empty (that would tell it where a client's record was used, and
  the amplified bound's proof, :func:`panpriv.accounting.checkin.per_slot_epsilons`, gives the adversary
  the slots' outputs only). Every single-update release is one message of one size.
- ``update = "averaged"`` (Alg. 2): every candidate, permuted with OS entropy (its count is
  revealed, as in process; the guarantee of averaged updates is not amplified).

Slots before the first window (``window = "fixed"``: round 0) are released empty.

**Dropped** (counted; the counts are public): ``malformed`` (size or magic; an outer box that
opens to a wrong framing), ``unknown_key`` (sealed to another shuffler key), ``undecryptable``,
``bad_slot`` (a chosen slot outside the client's window), ``late`` (a message of a wake slot that is
already complete, or whose chosen slot is released), ``too_early`` (a wake slot past the current
one: its model does not exist yet). Never counted or exported: how many clients checked in, were
not chosen, or which slots got a dummy — those depend on the clients' choices, which only the
shuffler may see. ``waiting`` is the number of messages of the current wake slot (public).

**Dropouts** (``close_after_s``): a wake slot still incomplete that long after the previous slot's
release closes with the messages it has (counted ``short_wake_slot`` per missing client) and its
slot is released. The amplified bound is unaffected: it holds conditionally on every other
client's check-in (Step 1 of :func:`panpriv.accounting.checkin.per_slot_epsilons`), so fewer clients in a
wake slot cannot weaken it. Without the rule a missing client stalls the deployment.

**Exactly once w.r.t. its input.** The committed offset is the first offset of the earliest wake
slot still open (incomplete, or with a candidate for a slot not yet released): a message is never
committed before its slot's release is acknowledged. After a crash the shuffler reads its last
released slot from the shuffled topic and re-reads from the committed offset; it recounts the wake
slots it sees from their first message (each open wake slot's first message is at or after that
offset), re-admits their candidates for unreleased slots, and releases the same candidates (the
least-key pick is deterministic). A release produced by the dead process that becomes visible
only after the restart is released again, byte for byte — a candidate, and a dummy too, which is
derived rather than drawn — so the analyzer drops it as ``duplicate_batch`` whether the slot was
empty or not (with OS-entropy dummies a re-released empty slot differed, and an analyzer reading
its ``stale_round`` rejects learned that the slot was empty). An extra message of a
complete wake slot (no honest client sends one, but a straggler of a wake slot closed by the
deadline is one) is ``late``, except after a restart if the wake slot's first messages lie below the
committed offset or it was closed by the deadline: it may then join a later release.

The Kafka loop is :func:`panpriv.streamer.esa.shuffler.run` (one partition, commit after acknowledged
releases); this module is the state machine and its set-up (:func:`run`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from nacl.bindings import crypto_box, crypto_box_NONCEBYTES
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from panpriv.protocols.checkin import window_start
from panpriv.protocols.randomizers import LocalRandomizer
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.esa import checkin_wire, wire
from panpriv.streamer.esa.families import FAMILIES
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.permute import permuted

log = logging.getLogger("panpriv.shuffle")

DROP_REASONS = ("malformed", "unknown_key", "undecryptable", "bad_slot", "late", "too_early", "short_wake_slot")
"""Every reason :class:`SlotShuffler` drops a message for (module docstring)."""


@dataclass
class WakeSlot:
    """The admitted messages of one wake slot: how many, the first one's offset, the latest chosen slot."""

    first_offset: int
    count: int = 0
    reach: int = -1


@dataclass(frozen=True)
class SlotRules:
    """The public configuration of a ``checkin`` deployment the shuffler applies."""

    params: int
    slot_length: int
    slots: int
    window: str
    update: str

    @classmethod
    def from_calibration(cls, calibration: dict[str, Any]) -> SlotRules:
        return cls(int(calibration["params"]), int(calibration["slot_length"]), int(calibration["slots"]),
                   str(calibration["window"]), str(calibration["update"]))


def dummy_sealer(randomizer: LocalRandomizer, analyzer_key: PublicKey, params: int,
                 secret: bytes) -> Callable[[int], bytes]:
    """The dummy of an empty single-update slot: the randomizer on the zero vector, sealed to the
    analyzer exactly as a client's inner message (:mod:`panpriv.streamer.esa.checkin_client`) — the same
    bytes for the same slot in every shuffler holding ``secret`` (the shuffler's private key).

    Why deterministic. A release the dead process made and a restarted one makes again must be
    identical, or the analyzer, seeing a second, different release of a slot (its ``stale_round``
    rejects), learns that the slot had no candidate — a client's sealed update is re-released byte
    for byte, only a fresh dummy would differ. So the dummy's randomness and the sealed box's
    ephemeral key are derived from ``secret`` with keyed BLAKE2b (:func:`_derived`): pseudorandom to
    anyone without the shuffler's key (the analyzer), which is all a dummy needs — it is R(0), a
    function of no record, and hides only *that* the slot was empty, which the shuffler knows anyway.
    """
    ident = key_id(analyzer_key)

    def seal(slot: int) -> bytes:
        seed = int.from_bytes(_derived(secret, b"panpriv checkin dummy noise", slot.to_bytes(8, "little")), "little")
        vector = randomizer.dummy(1, params, np.random.Generator(np.random.PCG64(seed)))[0]
        try:
            return wire.message(slot, ident, _deterministic_seal(wire.plaintext(slot, vector), analyzer_key, secret))
        finally:
            vector.fill(0.0)

    return seal


def _derived(secret: bytes, label: bytes, data: bytes) -> bytes:
    """32 pseudorandom bytes: BLAKE2b keyed with ``secret`` over ``label`` and ``data``."""
    return hashlib.blake2b(label + b"\0" + data, key=secret, digest_size=32).digest()


def _deterministic_seal(plaintext: bytes, recipient: PublicKey, secret: bytes) -> bytes:
    """libsodium's sealed box (``crypto_box_seal``: ephemeral public key, then ``crypto_box`` of the
    message under the nonce BLAKE2b-192(epk ‖ pk)), with the ephemeral key derived from ``secret``
    and the plaintext instead of drawn: ``SealedBox(recipient's private key).decrypt`` opens it, its
    size is a sealed box's, and equal plaintexts give equal boxes. Distinct plaintexts get distinct
    ephemeral keys, so no (key, nonce) pair ever seals two messages."""
    ephemeral = PrivateKey(_derived(secret, b"panpriv checkin dummy box", plaintext))
    ephemeral_public = bytes(ephemeral.public_key)
    nonce = hashlib.blake2b(ephemeral_public + bytes(recipient), digest_size=crypto_box_NONCEBYTES).digest()
    return ephemeral_public + crypto_box(plaintext, nonce, bytes(recipient), bytes(ephemeral))


class SlotShuffler:
    """The check-in shuffler's state machine (no Kafka; the interface :func:`panpriv.streamer.esa.shuffler.run` drives).

    Parameters
    ----------
    private_key
        The shuffler's own key (opens the outer layer of check-in messages).
    rules
        The deployment's public configuration.
    dummy
        Seals the dummy of an empty single-update slot (:func:`dummy_sealer`).
    last_released
        The last slot already released (−1: none).
    close_after_s
        Close an incomplete wake slot this long after the previous release (``None``: wait).
    """

    def __init__(self, private_key: PrivateKey, rules: SlotRules, dummy: Callable[[int], bytes],
                 last_released: int = -1, close_after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rules = rules
        self.size = checkin_wire.message_size(rules.params)
        self.last_released = last_released
        self.close_after_s = close_after_s
        self.released = 0
        self.dropped: Counter[str] = Counter()
        self._box = SealedBox(private_key)
        self._key_id = key_id(private_key.public_key)
        self._dummy = dummy
        self._clock = clock
        self._since = clock()
        self._wakes: dict[int, WakeSlot] = {}
        self._candidates: dict[int, list[tuple[int, bytes]]] = {}
        self._reach = rules.slots if rules.window == "sliding" else 2 * rules.slots

    def offer(self, offset: int, value: bytes | None) -> list[tuple[int, list[bytes]]]:
        """Take one input record; return the slots it completes as (slot, inner messages to release)."""
        opened = self._open(value or b"")
        if isinstance(opened, str):
            self.dropped[opened] += 1
            return []
        wake, choice = opened
        current = self.last_released + 1
        if wake > current:
            self.dropped["too_early"] += 1
            return []
        state = self._wakes.get(wake)
        if state is None and wake < current - self._reach:
            self.dropped["late"] += 1  # closed long ago: nothing of it can still be released
            return []
        state = self._wakes.setdefault(wake, WakeSlot(offset))
        if state.count >= self.rules.slot_length:
            self.dropped["late"] += 1
            return []
        first = int(window_start(wake, self.rules.slots, self.rules.window))
        if choice.slot is not None and not first <= choice.slot < first + self.rules.slots:
            self.dropped["bad_slot"] += 1
            return []
        state.count += 1
        if choice.slot is not None and choice.slot > self.last_released:
            state.reach = max(state.reach, choice.slot)
            self._candidates.setdefault(choice.slot, []).append((choice.key, choice.inner))
        if wake == current and state.count == self.rules.slot_length:
            return [self._release(current)]
        return []

    def _open(self, value: bytes) -> tuple[int, checkin_wire.Choice] | str:
        """(wake slot, opened outer layer) of a message, or why it is dropped."""
        try:
            wake, ident, sealed = checkin_wire.parse_header(value, self.size)
        except wire.WireError:
            return "malformed"
        if ident != self._key_id:
            return "unknown_key"
        try:
            plain = self._box.decrypt(sealed)
        except CryptoError:
            return "undecryptable"
        try:
            return wake, checkin_wire.parse_outer_plaintext(plain, self.rules.params)
        except wire.WireError:
            return "malformed"

    def _release(self, slot: int) -> tuple[int, list[bytes]]:
        """The release of ``slot`` (module docstring); its candidates are forgotten."""
        candidates = self._candidates.pop(slot, [])
        if slot < int(window_start(0, self.rules.slots, self.rules.window)):
            return slot, []
        if self.rules.update == "averaged":
            return slot, permuted([inner for _, inner in candidates])
        dummy = self._dummy(slot)  # drawn and sealed for every slot: the release takes the same work either way
        return slot, [min(candidates)[1] if candidates else dummy]

    def mark_released(self, slot: int) -> None:
        """Slot ``slot``'s release is acknowledged: its wake slot is complete, earlier slots are gone."""
        self.last_released = max(self.last_released, slot)
        self.released += 1
        self._since = self._clock()
        for gone in [s for s in self._candidates if s <= self.last_released]:
            self.dropped["late"] += len(self._candidates.pop(gone))
        for old in [w for w in self._wakes if w < self.last_released - self._reach]:
            del self._wakes[old]

    def expire(self) -> list[tuple[int, list[bytes]]]:
        """The dropout rule (``close_after_s``): close the current wake slot with what it has."""
        if self.close_after_s is None or self._clock() - self._since < self.close_after_s:
            return []
        current = self.last_released + 1
        state = self._wakes.setdefault(current, WakeSlot(-1))
        self.dropped["short_wake_slot"] += self.rules.slot_length - state.count
        state.count = self.rules.slot_length
        return [self._release(current)]

    def commit_offset(self, next_offset: int) -> int:
        """The first offset of the earliest open wake slot (module docstring), else ``next_offset``."""
        open_ = [s.first_offset for w, s in self._wakes.items() if s.first_offset >= 0 and (
            s.reach > self.last_released or (w > self.last_released and s.count < self.rules.slot_length))]
        return min(open_) if open_ else next_offset

    @property
    def waiting(self) -> int:
        """Messages of the current wake slot (a public count)."""
        state = self._wakes.get(self.last_released + 1)
        return 0 if state is None else state.count


@dataclass
class CheckinShuffleOptions:
    """What ``panpriv shuffle --checkin`` needs besides :class:`panpriv.streamer.esa.shuffler.ShuffleOptions`."""

    shuffler_key: Path
    analyzer_key: Path
    model_topic: str
    name: str = "default"
    close_after_s: float | None = None
    model_timeout_s: float = 120.0
    expect: dict[str, int] = field(default_factory=dict)


def run(options: Any, checkin: CheckinShuffleOptions, stop: threading.Event | None = None) -> SlotShuffler:
    """Serve :class:`SlotShuffler` through :func:`panpriv.streamer.esa.shuffler.run`, built in its
    set-up from the deployment's public configuration on the model topic (waiting for round 0)."""
    from panpriv.streamer.esa import shuffler
    from panpriv.streamer.esa.keys import load_private, load_public

    private = load_private(checkin.shuffler_key)
    analyzer = load_public(checkin.analyzer_key)

    def make_state(last: int) -> SlotShuffler:
        rules, dummy = _deployment(options.bootstrap, checkin, private, analyzer)
        return SlotShuffler(private, rules, dummy, last, checkin.close_after_s)

    options.make_state = make_state
    state = shuffler.run(options, stop)
    assert isinstance(state, SlotShuffler)
    return state


def _deployment(bootstrap: list[str], checkin: CheckinShuffleOptions, private: PrivateKey,
                analyzer: PublicKey) -> tuple[SlotRules, Callable[[int], bytes]]:
    """The rules and the dummy sealer of the deployment whose model topic ``checkin`` names."""
    from panpriv.streamer.esa.checkin_client import local_randomizer
    from panpriv.streamer.esa.model import ModelWatcher
    from panpriv.streamer.kafka.client import security_options

    watcher = ModelWatcher(bootstrap, checkin.model_topic, checkin.name, **security_options())
    try:
        model = watcher.current() or watcher.wait_for(0, checkin.model_timeout_s)
    finally:
        watcher.close()
    if FAMILIES.get(model.learner) is None or FAMILIES[model.learner].shuffler != "slots":
        raise ConfigError(f"--checkin: the model topic {checkin.model_topic} is for {model.learner!r}, whose shuffler does "
                          "not release check-in slots")
    if model.key_id != key_id(analyzer).hex():
        raise ConfigError(f"--checkin: the analyzer reads key {model.key_id}, --analyzer-key is {key_id(analyzer).hex()}")
    rules = SlotRules.from_calibration(dict(model.calibration))
    for name, value in checkin.expect.items():
        if value != getattr(rules, name):
            raise ConfigError(f"--checkin: the model's {name} is {getattr(rules, name)}, not {value}")
    dummy = dummy_sealer(local_randomizer(model.calibration), analyzer, rules.params, bytes(private))
    log.info("checkin shuffler: %s, %d clients per wake slot, %s windows of %d slots, %s updates", key_id(
        private.public_key).hex(), rules.slot_length, rules.window, rules.slots, rules.update)
    return rules, dummy
