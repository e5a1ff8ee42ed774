"""``checkin`` in three roles without a broker: clients (:mod:`panpriv.streamer.esa.checkin_client`), the
slot shuffler's state machine and the analyzer against the in-process learner (Balle et al. 2020
Algs 1–2; Bittau et al. 2017 §3)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from nacl.public import PrivateKey, SealedBox

from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.streamer.esa import checkin_wire, wire
from panpriv.streamer.esa.checkin_analyzer import CheckinAnalyzer
from panpriv.streamer.esa.checkin_client import CheckinEncoder, local_randomizer
from panpriv.streamer.esa.keys import key_id
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
    """One analyzer, one shuffler state machine and the clients of every wake slot, in process."""

    def __init__(self, **options: Any) -> None:
        self.analyzer_key, self.shuffler_key = PrivateKey.generate(), PrivateKey.generate()
        self.analyzer = CheckinAnalyzer(learner(**options), [self.analyzer_key], "t")
        cal = self.analyzer.model().calibration
        self.rules = SlotRules.from_calibration(dict(cal))
        dummy = dummy_sealer(local_randomizer(cal), self.analyzer_key.public_key, self.rules.params,
                             bytes(self.shuffler_key))
        self.shuffler = SlotShuffler(self.shuffler_key, self.rules, dummy)
        self.offset = 0
        self.sent: list[bytes] = []
        self.releases: list[bytes] = []

    def encode(self, X: np.ndarray, y: np.ndarray, rng: Any = None) -> list[bytes]:
        return CheckinEncoder(self.analyzer_key.public_key, self.shuffler_key.public_key, self.analyzer.model(),
                              rng=rng).encode(X, y)

    def offer(self, messages: list[bytes]) -> None:
        for item in messages:
            self.sent.append(item)
            for slot, released in self.shuffler.offer(self.offset, item):
                record = wire.encode_batch(slot, released)
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
    """What the shuffler releases are the inner messages exactly as the clients sealed them (it
    holds no analyzer key: it cannot open one), in PPB1 batches whose only clear fields are the slot
    and the analyzer's key id: no wake slot, client, check-in key or offset reaches the analyzer."""
    esa = Deployment(update="averaged", checkin_probability=0.8)
    X, y = records(4 * 30, seed=3)
    esa.run(X, y)
    box = SealedBox(esa.shuffler_key)
    sealed_inner = {}
    for item in esa.sent:
        wake, _, sealed = checkin_wire.parse_header(item, checkin_wire.message_size(DIM))
        choice = checkin_wire.parse_outer_plaintext(box.decrypt(sealed), DIM)
        if choice.slot is not None:
            sealed_inner[choice.inner] = (wake, choice.slot)
    released = [wire.parse_batch(record) for record in esa.releases]
    forwarded = [m for batch in released for m in batch.messages]
    assert forwarded and set(forwarded) <= set(sealed_inner), "every released message is a client's inner box, unchanged"
    assert len(forwarded) == len(set(forwarded))
    for batch in released:
        for m in batch.messages:
            header, _ = wire.parse_message(m)
            assert header.round == batch.round == sealed_inner[m][1]
            assert header.key_id == key_id(esa.analyzer_key.public_key)
            assert len(m) == wire.message_size(DIM)
    shuffler_box = esa.shuffler._box
    with pytest.raises(Exception):  # the shuffler's key does not open an inner message
        shuffler_box.decrypt(wire.parse_message(forwarded[0])[1])
    secrets = [v._private_key for v in vars(esa.shuffler).values() if isinstance(v, SealedBox)]
    assert secrets == [bytes(esa.shuffler_key)], "the shuffler's only private key is its own"
    dummy_cells = [c.cell_contents for c in esa.shuffler._dummy.__closure__ or ()]
    assert not any(isinstance(c, SealedBox) and c._private_key is not None for c in dummy_cells), \
        "it seals dummies with the analyzer's public key only"


def test_single_releases_are_one_message_each_and_empty_slots_get_the_shufflers_dummy() -> None:
    """``single``: every slot is released as exactly one sealed update of one size — a client's
    or, for an empty slot, the shuffler's dummy — so the analyzer cannot tell empty slots apart."""
    esa = Deployment(update="single", checkin_probability=0.3, slots=4)
    X, y = records(4 * 30, seed=4)
    esa.run(X, y)
    released = [wire.parse_batch(record) for record in esa.releases]
    assert [b.round for b in released] == list(range(30)) and {len(b.messages) for b in released} == {1}
    assert {len(b.messages[0]) for b in released} == {wire.message_size(DIM)}
    box = SealedBox(esa.shuffler_key)
    clients = set()
    for item in esa.sent:
        choice = checkin_wire.parse_outer_plaintext(box.decrypt(checkin_wire.parse_header(item, esa.shuffler.size)[2]), DIM)
        clients.add(choice.inner)
    dummies = [b for b in released if b.messages[0] not in clients]
    assert dummies, "with p0 = 0.3 some slots are empty"
    assert esa.analyzer.rejected == {} and esa.analyzer.round == 30


def test_shuffler_drops_by_reason_and_commits_only_released_work() -> None:
    esa = Deployment(update="averaged", slots=3)
    X, y = records(12, seed=5)
    good = esa.encode(X[:4], y[:4])
    other = PrivateKey.generate()
    foreign = CheckinEncoder(esa.analyzer_key.public_key, other.public_key, esa.analyzer.model()).encode(X[:1], y[:1])[0]
    too_early = checkin_wire.message(5, key_id(esa.shuffler_key.public_key), good[0][20:])
    forged = checkin_wire.message(0, key_id(esa.shuffler_key.public_key), b"\0" * (len(good[0]) - 20))
    bad_slot = checkin_wire.message(0, key_id(esa.shuffler_key.public_key), SealedBox(esa.shuffler_key.public_key).encrypt(
        checkin_wire.outer_plaintext(7, 0, b"\1" * checkin_wire.inner_size(DIM))))
    shuffler = esa.shuffler
    out = []
    for offset, item in enumerate([good[0], b"junk", foreign, too_early, forged, bad_slot, *good[1:]]):
        out += shuffler.offer(offset, item)
    assert shuffler.dropped == {"malformed": 1, "unknown_key": 1, "too_early": 1, "undecryptable": 1, "bad_slot": 1}
    assert [slot for slot, _ in out] == [0]
    shuffler.mark_released(0)
    # wake slot 0's candidates for slots 1, 2 are still waiting: the commit stays at its first message
    reach = max(checkin_wire.parse_outer_plaintext(SealedBox(esa.shuffler_key).decrypt(m[20:]), DIM).slot or 0 for m in good)
    assert shuffler.commit_offset(9) == (0 if reach > 0 else 9)
    assert shuffler.offer(10, good[1]) == [] and shuffler.dropped["late"] == 1, "wake slot 0 is complete"


def test_a_restarted_shuffler_releases_the_same_batches() -> None:
    """Replay from the committed offset with the last released slot read back: the releases that
    follow are byte for byte the ones the uninterrupted shuffler made — same candidates, and for
    an empty slot the same dummy (derived from the shuffler's key, not drawn), so an analyzer
    cannot tell a re-released empty slot from a re-released candidate (docs/privacy.md, "Exactly
    once"). Positive control: a shuffler with another key releases different dummies."""
    esa = Deployment(update="single", checkin_probability=0.25, slots=4)
    X, y = records(4 * 24, seed=6)
    esa.run(X, y, rng=np.random.default_rng(6))  # seeded clients: the slots that are empty are fixed
    messages, ids = esa.sent, [wire.parse_batch(r).id for r in esa.releases]
    cal = esa.analyzer.model().calibration

    def replay(secret: bytes) -> list[tuple[int, bytes]]:
        dummy = dummy_sealer(local_randomizer(cal), esa.analyzer_key.public_key, esa.rules.params, secret)
        first = SlotShuffler(esa.shuffler_key, esa.rules, dummy)
        for offset, item in enumerate(messages):
            for slot, _ in first.offer(offset, item):
                first.mark_released(slot)
            if first.last_released == crash_after:
                safe = first.commit_offset(offset + 1)
                break
        again = SlotShuffler(esa.shuffler_key, esa.rules, dummy, last_released=crash_after)
        replayed = []
        for offset in range(safe, len(messages)):
            for slot, msgs in again.offer(offset, messages[offset]):
                again.mark_released(slot)
                replayed.append((slot, wire.parse_batch(wire.encode_batch(slot, msgs)).id))
        return replayed

    crash_after = 5
    box = SealedBox(esa.shuffler_key)
    chosen = {checkin_wire.parse_outer_plaintext(box.decrypt(checkin_wire.parse_header(item, len(item))[2]),
                                                 esa.rules.params).slot for item in messages}
    released_slots = list(range(crash_after + 1, len(ids)))
    empty = [slot for slot in released_slots if slot not in chosen]
    assert 5 <= len(empty) <= len(released_slots) - 5, ("the check needs empty and chosen slots", empty)
    assert replay(bytes(esa.shuffler_key)) == [(slot, ids[slot]) for slot in released_slots]
    other = dict(replay(bytes(PrivateKey.generate())))
    assert [slot for slot in empty if other[slot] == ids[slot]] == []
    assert [slot for slot in released_slots if slot in chosen and other[slot] != ids[slot]] == []


def test_the_shufflers_dummy_is_a_sealed_box_of_the_randomizer_on_zero() -> None:
    """The derived dummy opens with the analyzer's key like a client's message, has its size, is
    the same for the same slot and key, and differs between slots; its vectors have the law of
    R(0) (ℓ2 randomizer: ±B·u with u uniform on the sphere, so norm B and mean zero). Positive
    control: dummies of one slot repeated are one vector, which the mean test rejects."""
    esa = Deployment(update="single")
    cal = esa.analyzer.model().calibration
    randomizer = local_randomizer(cal)
    seal = dummy_sealer(randomizer, esa.analyzer_key.public_key, esa.rules.params, bytes(esa.shuffler_key))
    opened = SealedBox(esa.analyzer_key)
    assert seal(3) == seal(3) and seal(3) != seal(4)
    size = wire.message_size(esa.rules.params)
    vectors = []
    for slot in range(2000):
        sealed = seal(slot)
        assert len(sealed) == size
        header, box = wire.parse_message(sealed)
        round_, vector = wire.parse_plaintext(opened.decrypt(box), esa.rules.params)
        assert header.round == round_ == slot
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
    X, y = records(4, seed=7)
    box = SealedBox(esa.analyzer_key.public_key)
    kid = key_id(esa.analyzer_key.public_key)
    good = wire.message(0, kid, box.encrypt(wire.plaintext(0, np.ones(DIM) * 0.1)))
    moved = wire.message(0, kid, box.encrypt(wire.plaintext(3, np.zeros(DIM))))
    nan = wire.message(0, kid, box.encrypt(wire.plaintext(0, np.full(DIM, np.nan))))
    analyzer = esa.analyzer
    assert not analyzer.handle(wire.encode_batch(1, [good])) and analyzer.rejected["stale_round"] == 1
    assert analyzer.handle(wire.encode_batch(0, [good, good, moved, nan]))
    assert analyzer.rejected["duplicate_message"] == 1 and analyzer.rejected["round_mismatch"] == 1
    assert analyzer.rejected["non_finite"] == 1 and analyzer.last_valid == 1 and analyzer.round == 1
    assert not analyzer.handle(wire.encode_batch(0, [good, good, moved, nan]))
    assert analyzer.rejected["duplicate_batch"] == 1
    single = Deployment(update="single").analyzer
    assert not single.handle(wire.encode_batch(0, [good, moved])) and single.rejected["wrong_batch_size"] == 2
    assert single.handle(wire.encode_batch(0, [nan])) and single.round == 1, "a rejected single update: a dummy step"
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
    shuffler = SlotShuffler(esa.shuffler_key, esa.rules, esa.shuffler._dummy, close_after_s=5.0, clock=lambda: now[0])
    X, y = records(4, seed=8)
    messages = esa.encode(X, y)
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
    assert [b.round for b in released] == list(range(30)) and all(not b.messages for b in released[:5])
    assert esa.analyzer.rejected == {} and esa.analyzer.round == 30
    if update == "averaged":
        reference = learner(seed=3, **options)
        learn_per_wake_slot(reference, np.vstack([X, X[:1]]), np.append(y, y[:1]))
        np.testing.assert_allclose(esa.analyzer.learner.release(), reference.release(), rtol=1e-9, atol=1e-12)
