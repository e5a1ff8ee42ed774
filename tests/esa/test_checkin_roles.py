"""``checkin`` in three roles without a broker: clients (:mod:`panpriv.streamer.esa.checkin_client`), the
slot shuffler's state machine and the analyzer against the in-process learner (Balle et al. 2020
Algs 1–2; Bittau et al. 2017 §3)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from nacl.public import PrivateKey, PublicKey, SealedBox

from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.streamer.esa import checkin_wire, wire
from panpriv.streamer.esa.checkin_analyzer import CheckinAnalyzer
from panpriv.streamer.esa.checkin_client import CheckinEncoder, local_randomizer
from panpriv.streamer.esa.keys import ShufflerKeys, key_id
from panpriv.streamer.esa.slot_shuffler import SlotRules, SlotShuffler, dummy_sealer
from tests.esa import parts

DIM = 5


def learner(seed: Any = None, **options: Any) -> RandomCheckinSGD:
    config = {"dim": DIM, "loss": "logistic", "epsilon": 2.0, "delta": 1e-5, "slots": 8, "slot_length": 4,
              "radius": math.sqrt(DIM), "rng": seed, **options}
    return RandomCheckinSGD(**config)


def records(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, DIM)) / np.sqrt(DIM) * 1.5
    y = np.where(X @ np.arange(1, DIM + 1) > 0, 1.0, -1.0)
    y[rng.random(n) < 0.05] *= -1
    return X, y


class Deployment:
    """One analyzer, one shuffler state machine and the clients of every wake slot, in process. The
    shuffler seals each slot's release to the key the model of that round names (``model_keys``,
    filled as models are published: what :class:`panpriv.streamer.esa.slot_shuffler.ModelKeys`
    reads from the model topic)."""

    def __init__(self, deployment: str = parts.DEPLOYMENT_ID, shuffler: ShufflerKeys | None = None,
                 analyzer_key: PrivateKey | None = None, **options: Any) -> None:
        self.analyzer_key = analyzer_key or PrivateKey.generate()
        self.shuffler_keys = shuffler or parts.shuffler_keys()
        self.shuffler_key = self.shuffler_keys.box
        self.deployment = deployment
        self.analyzer = parts.bound(CheckinAnalyzer(learner(**options), [self.analyzer_key], "t"), self.shuffler_keys,
                                    deployment)
        self.public_keys = {key_id(self.analyzer_key.public_key): self.analyzer_key.public_key}
        self.model_keys: dict[int, PublicKey] = {}
        cal = self.analyzer.model().calibration
        self.rules = SlotRules.from_calibration(dict(cal))
        self.dummy = dummy_sealer(local_randomizer(cal), self.rules.params, bytes(self.shuffler_key), deployment)
        self.shuffler = SlotShuffler(self.shuffler_key, self.rules, self.dummy, self.slot_key)
        self.offset = 0
        self.sent: list[bytes] = []
        self.releases: list[bytes] = []

    def slot_key(self, slot: int) -> PublicKey:
        return self.model_keys[slot]

    def model(self) -> Any:
        """The analyzer's current model, as published (its key noted for the shuffler)."""
        model = self.analyzer.model()
        self.model_keys[model.round] = self.public_keys[bytes.fromhex(model.key_id)]
        return model

    def rotate(self) -> PrivateKey:
        """Restart the analyzer with a new key (newest first, the old one still held): the current
        round keeps its key, the next round's model names the new one."""
        new = PrivateKey.generate()
        self.public_keys[key_id(new.public_key)] = new.public_key
        self.analyzer = parts.bound(CheckinAnalyzer.restore(self.analyzer.checkpoint(), [new, self.analyzer_key]),
                                    self.shuffler_keys, self.deployment)
        return new

    def encode(self, X: np.ndarray, y: np.ndarray, rng: Any = None) -> list[bytes]:
        model = self.model()
        public = self.model_keys[model.round]
        return CheckinEncoder(public, self.shuffler_key.public_key, model, rng=rng).encode(X, y)

    def offer(self, messages: list[bytes]) -> None:
        for item in messages:
            self.sent.append(item)
            for slot, released in self.shuffler.offer(self.offset, item):
                record = parts.signed(self.shuffler_keys, slot, released, self.deployment)
                self.releases.append(record)
                self.shuffler.mark_released(slot)
                assert self.analyzer.handle(record), self.analyzer.rejected
            self.offset += 1

    def run(self, X: np.ndarray, y: np.ndarray, rng: Any = None) -> None:
        L = self.rules.slot_length
        for w in range(len(y) // L):
            assert self.analyzer.round == w
            rows = slice(w * L, (w + 1) * L)
            self.offer(self.encode(X[rows], y[rows], rng))

    def choices(self, messages: list[bytes] | None = None) -> list[tuple[int, checkin_wire.Choice]]:
        """(wake slot, choice) of every message sent (or of ``messages``: the shuffler's view; the
        test holds its key)."""
        box = SealedBox(self.shuffler_key)
        out = []
        for item in self.sent if messages is None else messages:
            opened = wire.open_message(item, self.shuffler.size, self.shuffler_keys.key_id, box)
            assert not isinstance(opened, str)
            out.append((opened[0], checkin_wire.parse_body(opened[1], self.rules.params)))
        return out


def learn_per_wake_slot(reference: RandomCheckinSGD, X: np.ndarray, y: np.ndarray) -> None:
    """Feed the in-process learner one wake slot (``slot_length`` records) per ``learn_many``."""
    size = int(reference.slot_length)
    for start in range(0, len(y), size):
        reference.learn_many(X[start : start + size], y[start : start + size])


def test_averaged_gaussian_clients_shuffler_analyzer_are_the_in_process_learner_bit_for_bit() -> None:
    """``update="averaged"``, the Gaussian randomizer and p₀ = 1: every draw of the clients (check-in,
    offset, noise) is the in-process learner's, in its order, so with one seeded generator the three
    roles take the same steps (the shuffler's permutation only reorders each slot's sum: rounding).
    Single updates cannot be matched draw for draw (in process only the winner randomizes and the
    learner draws the dummies; here every client randomizes and the shuffler draws the dummies):
    they are compared in distribution below. The in-process learner draws per sub-block of
    in-flight clients (check-ins, offsets, then their noise: panpriv.protocols.randomness.NOISE_BLOCK_ROWS),
    so the reference is fed one wake slot per micro-batch: each sub-block is then one wake slot's
    clients, whose draws come in a client's order. The draw-order-free test below checks the same
    without relying on that."""
    X, y = records(4 * 60, seed=1)
    options = {"update": "averaged", "randomizer": "gaussian"}
    in_process = learner(seed=7, **options)
    in_process.learn_many(X, y)
    esa = Deployment(**options)
    esa.run(X, y, rng=np.random.default_rng(7))
    # In process, a slot closes when the next wake slot's first record arrives: one slot fewer.
    assert esa.analyzer.round == 60 and in_process.state_dict()["clock"] == 59
    reference = learner(seed=7, **options)
    learn_per_wake_slot(reference, np.vstack([X, X[:1]]), np.append(y, y[:1]))  # one more record closes slot 59
    np.testing.assert_allclose(esa.analyzer.learner.release(), reference.release(), rtol=1e-9, atol=1e-12)
    report = esa.analyzer.report()
    assert report.output == in_process.privacy().output
    assert report.intrusion == report.output, "the analyzer's key opens only released updates"
    assert any(a.startswith("deployment: trusted shuffler, separate process") for a in report.assumptions)
    assert not any(a.startswith("pan-privacy: the state holds") for a in report.assumptions)
    assert esa.analyzer.rejected == {}


@pytest.mark.parametrize("window", ["sliding", "fixed"])
def test_without_check_in_randomness_the_three_roles_take_the_in_process_steps(window: str) -> None:
    """A check that does not depend on the order of anyone's draws: p₀ = 1 and m = 1 (every client
    checks into her wake slot, or for fixed windows the slot one round later), averaged updates and
    a Gaussian randomizer with little noise (ε = 300: σ ≈ 0.1, 64 clients per slot): the slots'
    updates are then the means of the same clipped gradients at the same models plus noise of
    about 0.012 per coordinate, so the three roles' model is the in-process one up to that noise
    (the seeded test above is exact, but only while the in-process learner draws in the clients'
    order). The gap is compared with the models' own spread over repeated in-process runs."""
    X, y = records(64 * 40, seed=10)
    options = {"update": "averaged", "randomizer": "gaussian", "slots": 1, "window": window, "epsilon": 300.0,
               "slot_length": 64}
    esa = Deployment(**options)
    esa.run(X, y)
    X1, y1 = np.vstack([X, X[:1]]), np.append(y, y[:1])
    runs = []
    for _ in range(6):
        reference = learner(**options)
        reference.learn_many(X1, y1)
        runs.append(reference.release())
    spread = np.ptp(np.asarray(runs), axis=0).max()
    gap = np.abs(esa.analyzer.learner.release() - np.mean(runs, axis=0)).max()
    print(f"{window}: |ESA - in process| = {gap:.4f}, in-process spread {spread:.4f}, |theta| = {np.linalg.norm(runs[0]):.3f}")
    assert gap <= 3 * spread + 1e-3 and spread < 0.3
    assert np.linalg.norm(runs[0]) > 0.5, "the models moved: the comparison is not vacuous"


@pytest.mark.parametrize("update", ["single", "averaged"])
def test_three_roles_agree_with_the_in_process_learner_in_distribution(update: str) -> None:
    """The ℓ2 randomizer, p₀ = 0.7: 24 runs each of the three roles and of the in-process learner
    on the same stream; the released models' mean coordinates agree within 5 standard errors of
    their difference (a false failure about 6e-7 per coordinate under a normal approximation)."""
    X, y = records(4 * 40, seed=2)
    options = {"update": update, "checkin_probability": 0.7, "epsilon": 4.0}
    esa_models, process_models = [], []
    for _ in range(24):
        esa = Deployment(**options)
        esa.run(X, y)
        # the in-process learner needs one more record to close the last slot
        esa_models.append(esa.analyzer.learner.release())
        reference = learner(**options)
        reference.learn_many(np.vstack([X, X[:1]]), np.append(y, y[:1]))
        process_models.append(reference.release())
    a, b = np.asarray(esa_models), np.asarray(process_models)
    se = np.sqrt(a.var(axis=0, ddof=1) / len(a) + b.var(axis=0, ddof=1) / len(b))
    print(f"{update}: ESA mean {a.mean(axis=0).round(3)}, in process {b.mean(axis=0).round(3)}, se {se.round(3)}")
    assert np.all(np.abs(a.mean(axis=0) - b.mean(axis=0)) <= 5 * se)


def test_the_shuffler_forwards_sealed_updates_byte_for_byte_and_releases_no_identity() -> None:
    """What the shuffler releases are the units exactly as the clients sealed them (it holds no
    analyzer key: it cannot open one), in signed batches whose units show only the analyzer's key
    id: no wake slot, client, check-in key or offset reaches the analyzer."""
    esa = Deployment(update="averaged", checkin_probability=0.8)
    X, y = records(4 * 30, seed=3)
    esa.run(X, y)
    sealed_inner = {choice.unit: (wake, choice.slot) for wake, choice in esa.choices() if choice.slot is not None}
    released = [wire.parse_batch(record) for record in esa.releases]
    forwarded = [u for batch in released for u in batch.units]
    assert forwarded and set(forwarded) <= set(sealed_inner), "every released unit is a client's update, unchanged"
    assert len(forwarded) == len(set(forwarded))
    for batch in released:
        for unit in batch.units:
            ident, sealed = wire.parse_unit(unit, checkin_wire.unit_size(DIM))
            assert batch.round == sealed_inner[unit][1]
            assert wire.parse_plaintext(SealedBox(esa.analyzer_key).decrypt(sealed), DIM)[0] == batch.round
            assert ident == key_id(esa.analyzer_key.public_key)
    with pytest.raises(Exception):  # the shuffler's key does not open a unit
        esa.shuffler._box.decrypt(forwarded[0][12:])
    secrets = [v._private_key for v in vars(esa.shuffler).values() if isinstance(v, SealedBox)]
    assert secrets == [bytes(esa.shuffler_key)], "the shuffler's only private key is its own"
    dummy_cells = [c.cell_contents for c in esa.shuffler._dummy.__closure__ or ()]
    assert not any(isinstance(c, SealedBox) and c._private_key is not None for c in dummy_cells), \
        "it seals dummies with the analyzer's public key only"


@pytest.mark.parametrize("update", ["single", "averaged"])
def test_the_shuffled_topic_cannot_be_linked_to_the_messages_topic(update: str) -> None:
    """checkin: a reader of both topics holding the analyzer's key links no released update to its
    message — by bytes, size, key or order (:func:`tests.esa.parts.assert_unlinkable`)."""
    esa = Deployment(update=update, checkin_probability=0.8, slots=4)
    X, y = records(4 * 20, seed=11)
    esa.run(X, y)
    owner = {choice.unit: i for i, (_, choice) in enumerate(esa.choices())}
    batches = [list(wire.parse_batch(record).units) for record in esa.releases]
    dummies = {u for batch in batches for u in batch if u not in owner}
    owner.update({u: -1 for u in dummies})  # a dummy came in no message
    parts.assert_unlinkable(esa.sent, [b for b in batches if b], [esa.analyzer_key], owner)


@pytest.mark.parametrize("update", ["single", "averaged"])
def test_forged_replayed_resigned_and_duplicated_batches_are_refused(update: str) -> None:
    esa = Deployment(update=update, checkin_probability=1.0, slots=2)
    charged: list[int] = []
    esa.analyzer.gate = lambda round_, report: charged.append(round_)
    X, y = records(4 * 3, seed=12)
    esa.run(X[:8], y[:8])
    assert charged == [0, 1]
    esa.offer(esa.encode(X[8:11], y[8:11]))  # wake slot 2 is incomplete: its release is not made yet
    units = [u for _, choice in esa.choices()[8:11] if (u := choice.unit)][:1 if update == "single" else 3]
    parts.assert_refuses_bad_batches(esa.analyzer, esa.shuffler_keys, esa.releases[-1], units, charged)
    esa.offer(esa.encode(X[11:], y[11:]))
    assert esa.analyzer.round == 3 and charged == [0, 1, 2], "the real slot 2 is learned"


def test_shuffler_drops_by_reason_and_commits_only_released_work() -> None:
    esa = Deployment(update="averaged", slots=3)
    X, y = records(12, seed=5)
    good = esa.encode(X[:4], y[:4])
    other = PrivateKey.generate()
    foreign = CheckinEncoder(esa.analyzer_key.public_key, other.public_key, esa.model()).encode(X[:1], y[:1])[0]
    too_early = CheckinEncoder(esa.analyzer_key.public_key, esa.shuffler_key.public_key,
                               dataclasses.replace(esa.model(), round=5)).encode(X[:1], y[:1])[0]
    shuffler_box = SealedBox(esa.shuffler_key.public_key)
    forged = good[0][:20] + bytes(len(good[0]) - 20)
    unit = wire.unit(key_id(esa.analyzer_key.public_key), bytes(checkin_wire.unit_size(DIM) - 12))
    bad_slot = wire.seal_message(shuffler_box, esa.shuffler_keys.key_id, 0, checkin_wire.body(7, 0, unit))
    not_a_unit = wire.seal_message(shuffler_box, esa.shuffler_keys.key_id, 0, checkin_wire.body(0, 0, b"\1" * len(unit)))
    legacy = b"PPK1" + good[0][4:]
    shuffler = esa.shuffler
    out = []
    for offset, item in enumerate([good[0], b"junk", foreign, too_early, forged, bad_slot, not_a_unit, legacy, *good[1:]]):
        out += shuffler.offer(offset, item)
    assert shuffler.dropped == {"malformed": 2, "unknown_key": 1, "too_early": 1, "undecryptable": 1, "bad_slot": 1,
                                "old_format": 1}
    assert [slot for slot, _ in out] == [0]
    shuffler.mark_released(0)
    # wake slot 0's candidates for slots 1, 2 are still waiting: the commit stays at its first message
    reach = max(choice.slot or 0 for _, choice in esa.choices(good))
    assert shuffler.commit_offset(12) == (0 if reach > 0 else 12)
    assert shuffler.offer(13, good[1]) == [] and shuffler.dropped["late"] == 1, "wake slot 0 is complete"


def test_a_restarted_shuffler_releases_the_same_batches() -> None:
    """Replay from the committed offset with the last released slot read back: the releases that
    follow are byte for byte the ones the uninterrupted shuffler made — same candidates, and for
    an empty slot the same dummy (derived from the shuffler's key, not drawn), so an analyzer
    cannot tell a re-released empty slot from a re-released candidate (docs/privacy.md, "Exactly
    once"). Positive control: a shuffler with another key releases different dummies."""
    esa = Deployment(update="single", checkin_probability=0.25, slots=4)
    X, y = records(4 * 24, seed=6)
    esa.run(X, y, rng=np.random.default_rng(6))  # seeded clients: the slots that are empty are fixed
    messages, digests = esa.sent, [wire.parse_batch(r).digest for r in esa.releases]
    cal = esa.analyzer.model().calibration

    def replay(secret: bytes) -> list[tuple[int, bytes]]:
        dummy = dummy_sealer(local_randomizer(cal), esa.rules.params, secret, esa.deployment)
        first = SlotShuffler(esa.shuffler_key, esa.rules, dummy, esa.slot_key)
        for offset, item in enumerate(messages):
            for slot, _ in first.offer(offset, item):
                first.mark_released(slot)
            if first.last_released == crash_after:
                safe = first.commit_offset(offset + 1)
                break
        again = SlotShuffler(esa.shuffler_key, esa.rules, dummy, esa.slot_key, last_released=crash_after)
        replayed = []
        for offset in range(safe, len(messages)):
            for slot, units in again.offer(offset, messages[offset]):
                again.mark_released(slot)
                replayed.append((slot, wire.batch_digest(slot, units)))
        return replayed

    crash_after = 5
    chosen = {choice.slot for _, choice in esa.choices()}
    released_slots = list(range(crash_after + 1, len(digests)))
    empty = [slot for slot in released_slots if slot not in chosen]
    assert 5 <= len(empty) <= len(released_slots) - 5, ("the check needs empty and chosen slots", empty)
    assert replay(bytes(esa.shuffler_key)) == [(slot, digests[slot]) for slot in released_slots]
    other = dict(replay(bytes(PrivateKey.generate())))
    assert [slot for slot in empty if other[slot] == digests[slot]] == []
    assert [slot for slot in released_slots if slot in chosen and other[slot] != digests[slot]] == []


def test_after_a_key_rotation_dummies_look_like_client_updates() -> None:
    """The rotation test (beside the restart test). The analyzer is restarted with a new key at
    wake slot 10 (its round 10 keeps the old key, round 11 on name the new one). Every release of a
    slot carries the key id its model names and one size — a client's update or a dummy — so after
    the rotation an adversary who flags releases by key id finds no empty slot: before the fix the
    shuffler kept sealing dummies to the old key and flagged 7 of 7 empty slots with no false
    positive (positive control below, the old behaviour). Candidates sealed to the old key for a
    slot after the rotation are not used (a key change is a window boundary); the analyzer rejects
    nothing and closes every slot."""
    esa = Deployment(update="single", checkin_probability=0.5, slots=4)
    X, y = records(4 * 40, seed=13)
    L, rotation = esa.rules.slot_length, 10
    esa.run(X[: rotation * L], y[: rotation * L], rng=np.random.default_rng(1))
    old = esa.model_keys[rotation - 1]
    new = esa.rotate()
    for w in range(rotation, 40):
        esa.offer(esa.encode(X[w * L:(w + 1) * L], y[w * L:(w + 1) * L], np.random.default_rng(w)))
    assert esa.analyzer.rejected == {} and esa.analyzer.round == 40
    assert esa.model_keys[rotation] == old and esa.model_keys[rotation + 1] == new.public_key
    clients = {choice.unit for _, choice in esa.choices()}
    releases = [wire.parse_batch(record) for record in esa.releases]
    after = [b for b in releases if b.round > rotation]
    dummies = [b.units[0] for b in after if b.units[0] not in clients]
    updates = [b.units[0] for b in after if b.units[0] in clients]
    assert dummies and updates, "the check needs empty and used slots after the rotation"
    for batch in releases:
        assert wire.unit_key_id(batch.units[0]) == key_id(esa.model_keys[batch.round]), batch.round
    assert {(wire.unit_key_id(u), len(u)) for u in dummies} == {(wire.unit_key_id(u), len(u)) for u in updates} \
        == {(key_id(new.public_key), checkin_wire.unit_size(DIM))}
    stale = [(w, c.slot) for w, c in esa.choices() if c.slot is not None and w <= rotation < c.slot]
    assert stale and not {c.unit for w, c in esa.choices() if (w, c.slot) in stale} & {b.units[0] for b in releases}, \
        "old-key candidates for slots after the rotation are not released"
    # Positive control: the old behaviour, dummies sealed to the old key whatever the model names.
    flagged = [b.round for b in after if wire.unit_key_id(
        esa.dummy(b.round, old) if b.units[0] not in clients else b.units[0]) == key_id(old)]
    assert sorted(flagged) == sorted(b.round for b in after if b.units[0] not in clients)


def test_two_deployments_sharing_a_shuffler_key_release_different_dummies() -> None:
    """Two deployments with the same shuffler key, the same analyzer key and the same (seeded)
    clients leave the same slots empty; their dummies there differ, because the deployment id is
    part of the dummy's derivation. Control: the same deployment id gives the same dummies."""
    shuffler, analyzer_key = parts.shuffler_keys(), PrivateKey.generate()
    X, y = records(4 * 24, seed=14)
    runs = {}
    for name, deployment in (("a", "esa:cluster=one/messages"), ("b", "esa:cluster=two/messages"),
                             ("a again", "esa:cluster=one/messages")):
        esa = Deployment(deployment, shuffler, analyzer_key, update="single", checkin_probability=0.3, slots=4)
        esa.run(X, y, rng=np.random.default_rng(2))
        clients = {choice.unit for _, choice in esa.choices()}
        runs[name] = {wire.parse_batch(r).round: wire.parse_batch(r).units[0] for r in esa.releases
                      if wire.parse_batch(r).units[0] not in clients}
    assert runs["a"] and runs["a"].keys() == runs["b"].keys(), "the same slots are empty in both"
    assert not set(runs["a"].values()) & set(runs["b"].values()), "no dummy of one deployment is the other's"
    assert runs["a again"] == runs["a"]
    opened = [wire.parse_plaintext(SealedBox(analyzer_key).decrypt(u[12:]), DIM)[1] for u in
              (runs["a"][min(runs["a"])], runs["b"][min(runs["a"])])]
    assert not np.array_equal(*opened), "their noise differs too, not only the boxes"


def test_the_shufflers_dummy_is_a_sealed_box_of_the_randomizer_on_zero() -> None:
    """The derived dummy opens with the analyzer's key like a client's update, has its size, is
    the same for the same slot and key, and differs between slots and keys; its vectors have the
    law of R(0) (ℓ2 randomizer: ±B·u with u uniform on the sphere, so norm B and mean zero).
    Positive control: dummies of one slot repeated are one vector, which the mean test rejects."""
    esa = Deployment(update="single")
    cal = esa.analyzer.model().calibration
    randomizer = local_randomizer(cal)
    seal = dummy_sealer(randomizer, esa.rules.params, bytes(esa.shuffler_key), esa.deployment)
    key = esa.analyzer_key.public_key
    opened = SealedBox(esa.analyzer_key)
    assert seal(3, key) == seal(3, key) and seal(3, key) != seal(4, key)
    assert seal(3, key) != seal(3, PrivateKey.generate().public_key)
    size = checkin_wire.unit_size(esa.rules.params)
    vectors = []
    for slot in range(2000):
        sealed = seal(slot, key)
        assert len(sealed) == size
        ident, box = wire.parse_unit(sealed, size)
        round_, vector = wire.parse_plaintext(opened.decrypt(box), esa.rules.params)
        assert ident == key_id(key) and round_ == slot
        vectors.append(vector)
    V = np.array(vectors)
    bound = randomizer.dummy(1, esa.rules.params, np.random.default_rng(0))[0]
    assert np.allclose(np.linalg.norm(V, axis=1), np.linalg.norm(bound))
    z = np.abs(V.mean(axis=0)) / (V.std(axis=0) / math.sqrt(len(V)))
    assert z.max() < 4.5, z
    repeated = np.repeat(V[:1], len(V), axis=0) + 1e-12 * np.arange(len(V))[:, None]
    assert (np.abs(repeated.mean(axis=0)) / (repeated.std(axis=0) / math.sqrt(len(V)))).max() > 4.5


def test_analyzer_rejects_by_reason_and_never_steps_on_a_stale_or_repeated_release() -> None:
    esa = Deployment(update="averaged")
    box = SealedBox(esa.analyzer_key.public_key)
    kid = key_id(esa.analyzer_key.public_key)
    good = wire.seal_unit(box, kid, wire.plaintext(0, np.ones(DIM) * 0.1))
    moved = wire.seal_unit(box, kid, wire.plaintext(3, np.zeros(DIM)))
    nan = wire.seal_unit(box, kid, wire.plaintext(0, np.full(DIM, np.nan)))
    analyzer = esa.analyzer
    keys = esa.shuffler_keys
    assert not analyzer.handle(parts.signed(keys, 1, [good])) and analyzer.rejected["out_of_order"] == 1
    record = parts.signed(keys, 0, [good, good, moved, nan])
    assert analyzer.handle(record)
    assert analyzer.rejected["duplicate_message"] == 1 and analyzer.rejected["round_mismatch"] == 1
    assert analyzer.rejected["non_finite"] == 1 and analyzer.last_valid == 1 and analyzer.round == 1
    assert not analyzer.handle(record)
    assert analyzer.rejected["duplicate_batch"] == 1
    single = Deployment(update="single")
    assert not single.analyzer.handle(parts.signed(single.shuffler_keys, 0, [good, moved]))
    assert single.analyzer.rejected["wrong_batch_size"] == 1
    assert single.analyzer.handle(parts.signed(single.shuffler_keys, 0, [nan])) and single.analyzer.round == 1, \
        "a rejected single update: a dummy step"
    restored = CheckinAnalyzer.restore(analyzer.checkpoint(), [esa.analyzer_key])
    assert restored.round == 1 and np.array_equal(restored.learner.release(), analyzer.learner.release())


def test_position_slots_only() -> None:
    with pytest.raises(ValueError, match="position slots"):
        CheckinAnalyzer(learner(time="timestamp", slot_length=60.0), [PrivateKey.generate()], "t")


def test_a_wake_slot_with_missing_clients_closes_at_the_public_deadline() -> None:
    """Dropouts: with ``close_after_s`` the current wake slot closes with the clients that arrived
    (counted per missing client) and its slot is released; a straggler is then late."""
    esa = Deployment(update="single", slots=2)
    now = [0.0]
    shuffler = SlotShuffler(esa.shuffler_key, esa.rules, esa.dummy, esa.slot_key, close_after_s=5.0, clock=lambda: now[0])
    X, y = records(4, seed=8)
    messages = esa.encode(X, y)
    esa.model_keys[1] = esa.model_keys[0]
    assert all(shuffler.offer(i, m) == [] for i, m in enumerate(messages[:3]))
    assert shuffler.expire() == [] and shuffler.waiting == 3
    now[0] = 5.0
    (slot, released), = shuffler.expire()
    assert slot == 0 and len(released) == 1 and shuffler.dropped["short_wake_slot"] == 1
    shuffler.mark_released(0)
    assert shuffler.offer(3, messages[3]) == [] and shuffler.dropped["late"] >= 1
    now[0] = 11.0
    (slot, released), = shuffler.expire()  # nobody woke at slot 1: it closes empty, with a dummy
    assert slot == 1 and len(released) == 1 and shuffler.dropped["short_wake_slot"] == 1 + 4


def test_checkin_client_imports_nothing_of_the_service() -> None:
    assert parts.streamer_modules_after_import("panpriv.streamer.esa.checkin_client") == ["panpriv.streamer", "panpriv.streamer.esa", "panpriv.streamer.esa.checkin_client", "panpriv.streamer.esa.checkin_wire", "panpriv.streamer.esa.client", "panpriv.streamer.esa.families", "panpriv.streamer.esa.keys", "panpriv.streamer.esa.model", "panpriv.streamer.esa.wire"]


@pytest.mark.parametrize("update", ["single", "averaged"])
def test_fixed_windows_in_three_roles(update: str) -> None:
    """``window="fixed"``: round 0's slots are released empty and not stepped on (as in process,
    whose clock starts at the first window); later slots as for sliding windows. Averaged updates
    with the Gaussian randomizer and p₀ = 1 again match the seeded in-process learner."""
    options = {"window": "fixed", "slots": 5, "update": update, "randomizer": "gaussian"}
    X, y = records(4 * 30, seed=9)
    esa = Deployment(**options)
    esa.run(X, y, rng=np.random.default_rng(3))
    released = [wire.parse_batch(record) for record in esa.releases]
    assert [b.round for b in released] == list(range(30)) and all(not b.units for b in released[:5])
    assert esa.analyzer.rejected == {} and esa.analyzer.round == 30
    if update == "averaged":
        reference = learner(seed=3, **options)
        learn_per_wake_slot(reference, np.vstack([X, X[:1]]), np.append(y, y[:1]))
        np.testing.assert_allclose(esa.analyzer.learner.release(), reference.release(), rtol=1e-9, atol=1e-12)
