"""``panpriv shuffle --checkin``: the shuffler of ``checkin`` in Encode–Shuffle–Analyze (random
check-ins, Balle et al. 2020 Algs 1–2, §4.2; Bittau et al. 2017 §3).

Each client sends one check-in message at her wake slot w (:mod:`panpriv.streamer.esa.checkin_wire`):
an onion-sealed message like every learner's, whose outer layer holds her chosen slot (or "no
check-in"), her choice key and her update (a unit sealed to the analyzer). The shuffler holds its
own key (``panpriv keygen --role shuffler``), opens the outer layer only and forwards units byte for
byte; it holds no key that opens one.

**Release rule (public).** With position slots every wake slot has exactly ``slot_length``
clients, and every wake slot that can choose slot s is ≤ s (sliding windows: s − m + 1, …, s;
fixed windows: the previous round). So slot s is released as soon as wake slot s is complete —
the first ``slot_length`` messages of wake slot s in offset order — in slot order, exactly once,
as a signed batch (:mod:`panpriv.streamer.esa.batches`):

- ``update = "single"`` (Alg. 1): the candidate with the least choice key (ties: the least unit).
  Keys are uniform and drawn by the clients, as the in-process learner's candidates draw theirs,
  so the pick is uniform and independent of the data, and a restarted shuffler picks the same one.
  An **empty slot gets a dummy**: the learner's randomizer on the zero vector, sealed to the
  analyzer like a client's update, both pseudorandom from the shuffler's key, the deployment and
  the slot, so a restarted shuffler releases the same bytes (:func:`dummy_sealer`) — the analyzer
  must not learn which slots were empty (that would tell it where a client's record was used, and
  the amplified bound's proof, :func:`panpriv.accounting.checkin.per_slot_epsilons`, gives the adversary
  the slots' outputs only). Every single-update release is one unit of one size and one key id.
- ``update = "averaged"`` (Alg. 2): every candidate, permuted with OS entropy (its count is
  revealed, as in process; the guarantee of averaged updates is not amplified).

**The key of a slot (rotation).** The shuffler follows the model topic: slot s's release is sealed
to the analyzer key that the model of round s names (:class:`ModelKeys`; the analyzer fixes a
round's key when the round begins and keeps it across restarts), the dummy included. A candidate
whose update is sealed to another key — a client who woke before a key change, for a slot after
it — is not used (as if she had not checked in: her chance of being used only falls), so a key
change is a window boundary and every release of slot s carries slot s's key id: after a rotation
a dummy is told from a client's update neither by its key id nor by its size. (Dropping the clear
key id would not do: the analyzer sees which of its keys opens a unit.) A slot whose model is
already past it was released and analysed before a restart: it is not released again.

**Deployment-bound dummies.** The dummy's noise and its box's ephemeral key are derived from the
shuffler's key *and* the deployment id (``esa:<cluster>/<messages topic>``), so two deployments that
share a shuffler key release different dummies at the same slot (an analyzer of both would
otherwise see equal bytes where both slots were empty).

Slots before the first window (``window = "fixed"``: round 0) are released empty.

**Dropped** (counted; the counts are public): ``malformed`` (size or magic; an outer box that
opens to a wrong framing), ``old_format`` (a check-in of the format before onion sealing),
``unknown_key`` (sealed to another shuffler key), ``undecryptable``, ``round_mismatch`` (the sealed
wake slot is not the clear one), ``bad_slot`` (a chosen slot outside the client's window),
``late`` (a message of a wake slot that is already complete, or whose chosen slot is released),
``too_early`` (a wake slot past the current one: its model does not exist yet). Never counted or
exported: how many clients checked in, were not chosen or not used, or which slots got a dummy —
those depend on the clients' choices, which only the shuffler may see. ``waiting`` is the number
of messages of the current wake slot (public).

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
derived rather than drawn and sealed to the key of the slot's model, which does not change — so
the analyzer drops it as ``duplicate_batch`` whether the slot was empty or not (with OS-entropy
dummies a re-released empty slot differed, and an analyzer reading its rejects learned that the
slot was empty); if the analyzer has already moved past the slot, it is not released again. An
extra message of a complete wake slot (no honest client sends one, but a straggler of a wake slot
closed by the deadline is one) is ``late``, except after a restart if the wake slot's first
messages lie below the committed offset or it was closed by the deadline: it may then join a
later release.

The Kafka loop is :func:`panpriv.streamer.esa.shuffler.run` (one partition, commit after acknowledged
releases, signing); this module is the state machine and its set-up (:func:`run`).
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
from typing import TYPE_CHECKING, Any

import numpy as np
from nacl.bindings import crypto_box, crypto_box_NONCEBYTES
from nacl.public import PrivateKey, PublicKey, SealedBox

from panpriv.protocols.checkin import window_start
from panpriv.protocols.randomizers import LocalRandomizer
from panpriv.streamer.errors import ConfigError, StreamerError
from panpriv.streamer.esa import checkin_wire, wire
from panpriv.streamer.esa.families import FAMILIES
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.permute import permuted

if TYPE_CHECKING:
    from panpriv.streamer.esa.keys import ShufflerKeys
    from panpriv.streamer.esa.model import ModelWatcher

log = logging.getLogger("panpriv.shuffle")

DROP_REASONS = ("malformed", "old_format", "unknown_key", "undecryptable", "round_mismatch", "bad_slot", "late",
                "too_early", "short_wake_slot")
"""Every reason :class:`SlotShuffler` drops a message for (module docstring)."""

SlotKey = Callable[[int], "PublicKey | None"]
"""The analyzer key slot s's release is sealed to, or ``None`` if the analyzer is already past slot s
(:class:`ModelKeys`)."""

Dummy = Callable[[int, PublicKey], bytes]
"""The dummy unit of an empty slot, sealed to the given analyzer key (:func:`dummy_sealer`)."""


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


def dummy_sealer(randomizer: LocalRandomizer, params: int, secret: bytes, deployment: str) -> Dummy:
    """The dummy of an empty single-update slot: the randomizer on the zero vector, sealed to the
    given analyzer key exactly as a client's update (:mod:`panpriv.streamer.esa.checkin_client`) — the
    same bytes for the same (deployment, key, slot) in every shuffler holding ``secret`` (the
    shuffler's private key), other bytes in another deployment.

    Why deterministic. A release the dead process made and a restarted one makes again must be
    identical, or the analyzer, seeing a second, different release of a slot (its
    ``replayed_batch`` rejects), learns that the slot had no candidate — a client's sealed update is
    re-released byte for byte, only a fresh dummy would differ. So the dummy's randomness and the
    sealed box's ephemeral key are derived from ``secret`` with keyed BLAKE2b (:func:`_derived`)
    over the deployment id, the key id and the slot: pseudorandom to anyone without the shuffler's
    key (the analyzer), which is all a dummy needs — it is R(0), a function of no record, and hides
    only *that* the slot was empty, which the shuffler knows anyway. Why the deployment: two
    deployments sharing a shuffler key would otherwise release equal dummies at a slot empty in
    both, which an analyzer of both would see.
    """
    scope = wire.deployment_digest(deployment)

    def seal(slot: int, analyzer_key: PublicKey) -> bytes:
        ident = key_id(analyzer_key)
        seed_bytes = _derived(secret, b"panpriv checkin dummy noise", scope + ident + slot.to_bytes(8, "little"))
        vector = randomizer.dummy(1, params, np.random.Generator(np.random.PCG64(int.from_bytes(seed_bytes, "little"))))[0]
        try:
            return wire.unit(ident, _deterministic_seal(wire.plaintext(slot, vector), analyzer_key, secret, scope))
        finally:
            vector.fill(0.0)

    return seal


def _derived(secret: bytes, label: bytes, data: bytes) -> bytes:
    """32 pseudorandom bytes: BLAKE2b keyed with ``secret`` over ``label`` and ``data``."""
    return hashlib.blake2b(label + b"\0" + data, key=secret, digest_size=32).digest()


def _deterministic_seal(plaintext: bytes, recipient: PublicKey, secret: bytes, scope: bytes) -> bytes:
    """libsodium's sealed box (``crypto_box_seal``: ephemeral public key, then ``crypto_box`` of the
    message under the nonce BLAKE2b-192(epk ‖ pk)), with the ephemeral key derived from ``secret``,
    the deployment ``scope``, the recipient and the plaintext instead of drawn:
    ``SealedBox(recipient's private key).decrypt`` opens it, its size is a sealed box's, and equal
    inputs give equal boxes. Distinct plaintexts or recipients get distinct ephemeral keys, so no
    (key, nonce) pair ever seals two messages."""
    ephemeral = PrivateKey(_derived(secret, b"panpriv checkin dummy box", scope + bytes(recipient) + plaintext))
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
    slot_key
        The analyzer key of each slot's release (module docstring; :class:`ModelKeys`).
    last_released
        The last slot already released (−1: none).
    close_after_s
        Close an incomplete wake slot this long after the previous release (``None``: wait).
    """

    def __init__(self, private_key: PrivateKey, rules: SlotRules, dummy: Dummy, slot_key: SlotKey,
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
        self._slot_key = slot_key
        self._clock = clock
        self._since = clock()
        self._wakes: dict[int, WakeSlot] = {}
        self._candidates: dict[int, list[tuple[int, bytes]]] = {}
        self._reach = rules.slots if rules.window == "sliding" else 2 * rules.slots

    def offer(self, offset: int, value: bytes | None) -> list[tuple[int, list[bytes]]]:
        """Take one input record; return the slots it completes as (slot, units to release)."""
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
            self._candidates.setdefault(choice.slot, []).append((choice.key, choice.unit))
        if wake == current and state.count == self.rules.slot_length:
            return self._release(current)
        return []

    def _open(self, value: bytes) -> tuple[int, checkin_wire.Choice] | str:
        """(wake slot, opened outer layer) of a message, or why it is dropped."""
        opened = wire.open_message(value, self.size, self._key_id, self._box)
        if isinstance(opened, str):
            return opened
        try:
            return opened[0], checkin_wire.parse_body(opened[1], self.rules.params)
        except wire.WireError:
            return "malformed"

    def _release(self, slot: int) -> list[tuple[int, list[bytes]]]:
        """The release of ``slot`` (module docstring); its candidates are forgotten. Empty when the
        analyzer is already past ``slot`` (released before a restart): the slot is then closed here."""
        candidates = self._candidates.pop(slot, [])
        if slot < int(window_start(0, self.rules.slots, self.rules.window)):
            return [(slot, [])]
        key = self._slot_key(slot)
        if key is None:
            log.info("slot %d was released and analysed before this process started: not released again", slot)
            self._close(slot)
            return []
        ident = key_id(key)
        usable = [(choice, unit) for choice, unit in candidates if wire.unit_key_id(unit) == ident]
        if self.rules.update == "averaged":
            return [(slot, permuted([unit for _, unit in usable]))]
        dummy = self._dummy(slot, key)  # made and sealed for every slot: the release takes the same work either way
        return [(slot, [min(usable)[1] if usable else dummy])]

    def mark_released(self, slot: int) -> None:
        """Slot ``slot``'s release is acknowledged: its wake slot is complete, earlier slots are gone."""
        self.released += 1
        self._close(slot)

    def _close(self, slot: int) -> None:
        self.last_released = max(self.last_released, slot)
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
        return self._release(current)

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


class ModelKeys:
    """The analyzer key each slot's release is sealed to: the key the model of round s names, read
    from the model topic (module docstring, "The key of a slot").

    ``watcher`` reads the deployment's model records; ``public_keys`` are the analyzer public keys
    the shuffler was given, by id; a model naming another key stops the shuffler with the file to
    give it. ``timeout_s``: how long to wait for the model of a slot whose wake slot is complete."""

    def __init__(self, watcher: ModelWatcher, public_keys: dict[bytes, PublicKey], timeout_s: float) -> None:
        self._watcher = watcher
        self._keys = public_keys
        self._timeout = timeout_s

    def __call__(self, slot: int) -> PublicKey | None:
        model = self._watcher.current(self._timeout)
        try:
            if model is None or model.round < slot:
                model = self._watcher.wait_for(slot, self._timeout)
        except TimeoutError as exc:
            raise StreamerError(f"panpriv shuffle --checkin: slot {slot} is complete but {exc}") from None
        if model.round > slot:
            return None
        key = self._keys.get(bytes.fromhex(model.key_id))
        if key is None:
            raise ConfigError(f"the model of slot {slot} names analyzer key {model.key_id}, which this shuffler does not "
                              f"hold: give it analyzer-{model.key_id}.pub (--analyzer-key FILE or DIR)")
        return key


@dataclass
class CheckinShuffleOptions:
    """What ``panpriv shuffle --checkin`` needs besides :class:`panpriv.streamer.esa.shuffler.ShuffleOptions`."""

    analyzer_keys: list[Path]
    model_topic: str
    name: str = "default"
    close_after_s: float | None = None
    model_timeout_s: float = 120.0
    expect: dict[str, int] = field(default_factory=dict)


def run(options: Any, checkin: CheckinShuffleOptions, stop: threading.Event | None = None) -> SlotShuffler:
    """Serve :class:`SlotShuffler` through :func:`panpriv.streamer.esa.shuffler.run`, built in its
    set-up from the deployment's public configuration on the model topic (waiting for round 0), and
    following the model topic for each slot's key."""
    from panpriv.streamer.esa import shuffler
    from panpriv.streamer.esa.keys import load_public_keys
    from panpriv.streamer.esa.model import ModelWatcher
    from panpriv.streamer.kafka import client as kafka_client

    public_keys = load_public_keys(checkin.analyzer_keys)
    watchers: list[ModelWatcher] = []

    def make_state(last: int, keys: ShufflerKeys, deployment: str) -> SlotShuffler:
        watcher = ModelWatcher(options.bootstrap, checkin.model_topic, checkin.name, consumer=kafka_client.consumer(
            options.bootstrap, enable_auto_commit=False, group_id=None))
        watchers.append(watcher)
        rules, randomizer = _deployment(watcher, checkin, public_keys)
        dummy = dummy_sealer(randomizer, rules.params, bytes(keys.box), deployment)
        return SlotShuffler(keys.box, rules, dummy, ModelKeys(watcher, public_keys, checkin.model_timeout_s), last,
                            checkin.close_after_s)

    options.make_state = make_state
    try:
        state = shuffler.run(options, stop)
    finally:
        for watcher in watchers:
            watcher.close()
    assert isinstance(state, SlotShuffler)
    return state


def _deployment(watcher: ModelWatcher, checkin: CheckinShuffleOptions,
                public_keys: dict[bytes, PublicKey]) -> tuple[SlotRules, LocalRandomizer]:
    """The rules and the local randomizer of the deployment whose model ``watcher`` reads."""
    from panpriv.streamer.esa.checkin_client import local_randomizer

    model = watcher.current() or watcher.wait_for(0, checkin.model_timeout_s)
    if FAMILIES.get(model.learner) is None or FAMILIES[model.learner].shuffler != "slots":
        raise ConfigError(f"--checkin: the model topic {checkin.model_topic} is for {model.learner!r}, whose shuffler does "
                          "not release check-in slots")
    rules = SlotRules.from_calibration(dict(model.calibration))
    for name, value in checkin.expect.items():
        if value != getattr(rules, name):
            raise ConfigError(f"--checkin: the model's {name} is {getattr(rules, name)}, not {value}")
    log.info("checkin shuffler: %d clients per wake slot, %s windows of %d slots, %s updates; analyzer keys %s",
             rules.slot_length, rules.window, rules.slots, rules.update, sorted(k.hex() for k in public_keys))
    return rules, local_randomizer(model.calibration)
