"""Encode–Shuffle–Analyze without a broker: the wire format, keys, the client encoder against the
in-process learner, the analyzer's rejections, the shuffler's rules (Bittau et al. 2017 §3)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from nacl.public import PrivateKey, SealedBox

from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.streamer.esa import keys, wire
from panpriv.streamer.esa.analyzer import Analyzer
from panpriv.streamer.esa.client import Encoder, RefusedModel
from panpriv.streamer.esa.deployment import DEPLOYMENT
from panpriv.streamer.esa.keys import ShufflerKeys, key_id
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.esa.shuffler import Shuffler
from tests.esa import parts

DIM, B = 5, 16
SHUFFLER = ShufflerKeys.from_private(PrivateKey.generate())


def learner(seed: int | None = None) -> ShuffleGaussianSGD:
    return ShuffleGaussianSGD(dim=DIM, loss="logistic", epsilon=2.0, delta=1e-5, batch_size=B, radius=3.0, rng=seed)


P = learner().calibration()["params"]


def records(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return parts.separable(n, DIM, seed)


def analyzer_for(key: PrivateKey, shuffler: ShufflerKeys = SHUFFLER) -> Analyzer:
    return parts.bound(Analyzer(learner(), [key], "t"), shuffler)


def encoder(key: PrivateKey, model: ModelRecord, **options: object) -> Encoder:
    return Encoder(key.public_key, SHUFFLER.box.public_key, model, **options)  # type: ignore[arg-type]


def shuffled(messages: list[bytes], round_: int = 0, shuffler: ShufflerKeys = SHUFFLER) -> list[bytes]:
    """The units the shuffler releases for ``messages`` (b of them, of ``round_``)."""
    state = Shuffler(shuffler.box, len(messages), P, last_released=round_ - 1)
    released = [r for offset, item in enumerate(messages) for r in state.offer(offset, item)]
    ((released_round, units),) = released
    assert released_round == round_
    return units


def test_onion_wire_roundtrip_and_fixed_sizes() -> None:
    """A message is the unit sealed to the analyzer, sealed again to the shuffler: the shuffler's
    key opens the outer layer to exactly one unit, the analyzer's key opens the unit, and neither
    opens the other's layer."""
    key = PrivateKey.generate()
    model = analyzer_for(key).model()
    X, y = records(8)
    messages = encoder(key, model).encode(X, y)
    assert {len(m) for m in messages} == {wire.message_size(P)}
    round_, shuffler_id, sealed = wire.message_header(messages[0], wire.message_size(P))
    assert round_ == 0 and shuffler_id == SHUFFLER.key_id
    opened = wire.open_message(messages[0], wire.message_size(P), SHUFFLER.key_id, SealedBox(SHUFFLER.box))
    assert not isinstance(opened, str) and opened[0] == 0
    (unit,) = wire.split_units(opened[1], 1, wire.vector_unit_size(P))
    ident, inner = wire.parse_unit(unit, wire.vector_unit_size(P))
    assert ident == key_id(key.public_key)
    inner_round, vector = wire.parse_plaintext(SealedBox(key).decrypt(inner), P)
    assert inner_round == 0 and vector.shape == (P,)
    with pytest.raises(Exception):
        SealedBox(key).decrypt(sealed)  # the analyzer's key does not open the outer layer
    with pytest.raises(Exception):
        SealedBox(SHUFFLER.box).decrypt(inner)  # the shuffler's key does not open a unit
    record = parts.signed(SHUFFLER, 3, list(reversed(messages)))
    batch = wire.parse_batch(record)
    assert batch.round == 3 and batch.units == tuple(reversed(messages))
    assert batch.digest == wire.batch_digest(3, messages), "the digest does not depend on the order"
    assert ModelRecord.from_json(model.to_json()).round == 0


def test_keygen_modes_and_refusals(tmp_path: Path) -> None:
    files = keys.generate(tmp_path / "k")
    assert files.private.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o700
    private = keys.load_private(files.private)
    assert key_id(keys.load_public(files.public)) == key_id(private.public_key)
    assert files.key_id == key_id(private.public_key).hex() and files.verify is None
    os.chmod(files.private, 0o644)
    with pytest.raises(PermissionError):
        keys.load_private(files.private)
    shuffler = keys.generate(tmp_path / "s", "shuffler")
    assert shuffler.verify is not None and shuffler.private.name.startswith("shuffler-")
    loaded = keys.load_shuffler(shuffler.private)
    (verify,) = keys.load_verify_keys([tmp_path / "s"])
    assert bytes(verify) == bytes(loaded.verify_key) and loaded.key_id.hex() == shuffler.key_id
    message = b"a batch header"
    verify.verify(loaded.signer.sign(message))  # the verify key checks the shuffler's signatures
    assert bytes(keys.signing_key(loaded.box)) == bytes(loaded.signer), "derived from the private file alone"


def test_client_shuffler_and_analyzer_reproduce_the_in_process_learner() -> None:
    """With the same seeded noise, clients + shuffler + analyzer take the in-process learner's steps
    (in its per-user mode): the messages are the same bits (the same function, local_messages), only
    the mean's rounding differs."""
    rounds = 5
    X, y = records(rounds * B, seed=1)
    in_process = learner(seed=7)
    in_process.pooled_noise = False  # every message formed as a client forms it: the same draws
    in_process.learn_many(X, y)
    key = PrivateKey.generate()
    analyzer = analyzer_for(key)
    noise = np.random.default_rng(7)
    for t in range(rounds):
        rows = slice(t * B, (t + 1) * B)
        messages = encoder(key, analyzer.model(), rng=noise).encode(X[rows], y[rows])
        assert analyzer.handle(parts.signed(SHUFFLER, t, shuffled(messages, t)))
    assert analyzer.round == rounds and analyzer.learner.records_seen == in_process.records_seen
    np.testing.assert_allclose(analyzer.learner.release(), in_process.release(), rtol=1e-9, atol=1e-12)
    report = analyzer.report()
    assert report.output == in_process.privacy().output
    assert report.intrusion == report.output, "the analyzer's key opens released, shuffled units only"
    assert any(DEPLOYMENT in a for a in report.assumptions)
    assert not any(a.startswith("a trusted shuffler") for a in report.assumptions)
    assert any("Bittau et al. 2017" in r for r in report.references)


def test_the_shuffled_topic_cannot_be_linked_to_the_messages_topic() -> None:
    """shuffle-gaussian: a reader of both topics holding the analyzer's key links no released unit
    to its message — by bytes, size, key or order (:func:`tests.esa.parts.assert_unlinkable`)."""
    key = PrivateKey.generate()
    analyzer = analyzer_for(key)
    X, y = records(6 * B, seed=2)
    messages, batches = [], []
    for t in range(6):
        sent = encoder(key, analyzer.model()).encode(X[t * B:(t + 1) * B], y[t * B:(t + 1) * B])
        units = shuffled(sent, t)
        assert analyzer.handle(parts.signed(SHUFFLER, t, units))
        messages += sent
        batches.append(units)
    box = SealedBox(SHUFFLER.box)
    owner = {}
    for index, item in enumerate(messages):
        opened = wire.open_message(item, wire.message_size(P), SHUFFLER.key_id, box)
        assert not isinstance(opened, str)
        owner[opened[1]] = index
    parts.assert_unlinkable(messages, batches, [key], owner)
    with pytest.raises(AssertionError, match="bytes"):  # positive control: the format before onion sealing
        parts.assert_unlinkable(messages, [[messages[0][10:200]]], [key], {messages[0][10:200]: 0})


def test_analyzer_rejects_units_by_reason() -> None:
    key, other = PrivateKey.generate(), PrivateKey.generate()
    analyzer = analyzer_for(key)
    X, y = records(B)
    good = shuffled(encoder(key, analyzer.model()).encode(X, y))
    kid = key_id(key.public_key)
    to_other = wire.seal_unit(SealedBox(other.public_key), key_id(other.public_key), wire.plaintext(0, np.zeros(P)))
    moved = wire.seal_unit(SealedBox(key.public_key), kid, wire.plaintext(5, np.zeros(P)))
    nan = wire.seal_unit(SealedBox(key.public_key), kid, wire.plaintext(0, np.full(P, np.nan)))
    garbage = wire.unit(kid, os.urandom(len(good[0]) - 12))
    batch = [*good[:10], good[0], to_other, moved, nan, garbage, b"\0" * len(good[0])]
    assert len(batch) == B
    assert analyzer.handle(parts.signed(SHUFFLER, 0, batch))
    assert dict(analyzer.rejected) == {"duplicate_message": 1, "unknown_key": 1, "round_mismatch": 1, "non_finite": 1,
                                       "undecryptable": 1, "malformed": 1}
    assert analyzer.min_valid == B - 6 and analyzer.round == 1
    assert analyzer.report().output.epsilon > learner().privacy().output.epsilon, "fewer valid messages, weaker bound"


def test_forged_replayed_resigned_duplicated_and_out_of_order_batches_are_refused() -> None:
    """Every batch not signed by the shuffler for this deployment, of another round or already
    applied is refused before anything of it is opened, charged or learned, and counted once by
    reason; the statement's ε does not move (:func:`tests.esa.parts.assert_refuses_bad_batches`).
    The real next round is then learned."""
    key = PrivateKey.generate()
    analyzer = analyzer_for(key)
    charged: list[int] = []
    analyzer.gate = lambda round_, report: charged.append(round_)
    X, y = records(2 * B, seed=3)
    first = parts.signed(SHUFFLER, 0, shuffled(encoder(key, analyzer.model()).encode(X[:B], y[:B])))
    assert analyzer.handle(first) and charged == [0]
    round1 = shuffled(encoder(key, analyzer.model()).encode(X[B:], y[B:]), 1)
    parts.assert_refuses_bad_batches(analyzer, SHUFFLER, first, round1, charged)
    assert analyzer.min_valid == B
    assert analyzer.handle(parts.signed(SHUFFLER, 1, round1)) and charged == [0, 1], "the real round 1 is learned"


def test_an_analyzer_refuses_a_checkpoint_of_another_deployment_and_the_format_before() -> None:
    from panpriv.streamer.errors import CheckpointError

    key = PrivateKey.generate()
    analyzer = analyzer_for(key)
    data = analyzer.checkpoint()
    restored = Analyzer.restore(data, [key])
    with pytest.raises(CheckpointError, match="another cluster or messages topic"):
        parts.bound(restored, SHUFFLER, deployment="esa:cluster=other/messages")
    with pytest.raises(CheckpointError, match="panpriv keygen DIR --role shuffler"):
        Analyzer.restore({**data, "format": "panpriv-esa-analyzer/1"}, [key])


def test_a_rotated_key_takes_effect_at_the_next_round() -> None:
    """The model of a round names the key that was newest when the round began, also after a
    restart with a newer key; the next round names the newest."""
    old, new = PrivateKey.generate(), PrivateKey.generate()
    analyzer = analyzer_for(old)
    assert analyzer.model().key_id == key_id(old.public_key).hex()
    restarted = parts.bound(Analyzer.restore(analyzer.checkpoint(), [new, old]), SHUFFLER)
    assert restarted.model().key_id == key_id(old.public_key).hex(), "round 0 keeps its key"
    X, y = records(B, seed=4)
    messages = encoder(old, restarted.model()).encode(X, y)
    assert restarted.handle(parts.signed(SHUFFLER, 0, shuffled(messages)))
    assert restarted.model().key_id == key_id(new.public_key).hex(), "round 1 takes the newest key"
    again = Analyzer.restore(restarted.checkpoint(), [new])
    assert again.model().key_id == key_id(new.public_key).hex()


def test_encoder_refuses_a_weak_or_foreign_model() -> None:
    key = PrivateKey.generate()
    model = analyzer_for(key).model()
    with pytest.raises(RefusedModel, match="local"):
        encoder(key, model, max_local_epsilon=0.01)
    with pytest.raises(RefusedModel, match="key"):
        Encoder(PrivateKey.generate().public_key, SHUFFLER.box.public_key, model)


def test_shuffler_opens_thresholds_drops_and_commits_safely() -> None:
    key = PrivateKey.generate()
    analyzer = analyzer_for(key)
    X, y = records(2 * B)
    round0 = encoder(key, analyzer.model()).encode(X[:B], y[:B])
    now = [0.0]
    shuffler = Shuffler(SHUFFLER.box, B, P, drop_short_after_s=5.0, clock=lambda: now[0])
    other = parts.shuffler_keys()
    size = wire.message_size(P)
    header = round0[0][:20]
    to_other = Encoder(key.public_key, other.box.public_key, analyzer.model()).encode(X[:1], y[:1])[0]
    round1 = encoder(key, dataclasses.replace(analyzer.model(), round=1)).encode(X[B:], y[B:])
    retagged = round1[1][:4] + (0).to_bytes(8, "big") + round1[1][12:]  # clear round 0, sealed round 1
    legacy = b"PPM1" + round0[0][4:]
    garbled = header + bytes(size - 20)
    out = []
    offset = 0
    for item in [*round0[: B - 1], b"bad", legacy, to_other, garbled, retagged, round0[B - 1]]:
        out += shuffler.offer(offset, item)
        offset += 1
    assert shuffler.dropped == {"malformed": 1, "old_format": 1, "unknown_key": 1, "undecryptable": 1,
                                "round_mismatch": 1}
    ((round_, units),) = out
    box = SealedBox(SHUFFLER.box)
    inside = [wire.open_message(m, size, SHUFFLER.key_id, box)[1] for m in round0]  # type: ignore[index]
    assert round_ == 0 and sorted(units) == sorted(inside), "exactly the units inside the b messages"
    assert not set(units) & set(round0)
    assert shuffler.commit_offset(offset) == offset
    shuffler.mark_released(0)
    far = encoder(key, dataclasses.replace(analyzer.model(), round=2)).encode(X[:1], y[:1])[0]
    for item in [round1[0], round0[0], far]:
        assert shuffler.offer(offset, item) == []
        offset += 1
    assert shuffler.dropped["late"] == 1 and shuffler.dropped["too_early"] == 1
    assert shuffler.commit_offset(offset) == offset - 3, "the waiting round-1 message pins the commit"
    now[0] = 6.0
    shuffler.expire()
    assert shuffler.dropped["short_round"] == 1 and shuffler.commit_offset(offset) == offset


def test_client_imports_nothing_of_the_service() -> None:
    assert parts.streamer_modules_after_import("panpriv.streamer.esa.client") == [
        "panpriv.streamer", "panpriv.streamer.esa", "panpriv.streamer.esa.client", "panpriv.streamer.esa.families",
        "panpriv.streamer.esa.keys", "panpriv.streamer.esa.model", "panpriv.streamer.esa.wire"]


def test_keygen_migrates_a_shuffler_key_and_publishes_the_public_files(tmp_path: Path) -> None:
    """``keygen --role shuffler --if-missing`` writes the verify key of a shuffler key made before
    batches were signed; ``--public-dir`` copies the public files (never the private one) where the
    other roles read them; a shuffler reads its key from the directory keygen wrote."""
    from panpriv.streamer.commands.cli import build_parser

    files = keys.generate(tmp_path / "s", "shuffler")
    assert files.verify is not None
    files.verify.unlink()
    args = build_parser().parse_args(["keygen", str(tmp_path / "s"), "--role", "shuffler", "--if-missing",
                                      "--public-dir", str(tmp_path / "public")])
    assert args.handler(args) == 0 and keys.verify_path(files.private).exists()
    assert sorted(p.name for p in (tmp_path / "public").iterdir()) == sorted([files.public.name, files.verify.name])
    assert keys.load_shuffler(tmp_path / "s").key_id.hex() == files.key_id
    assert bytes(keys.load_verify_keys([tmp_path / "public"])[0]) == bytes(keys.load_shuffler(files.private).verify_key)


def test_a_client_refuses_a_model_record_of_the_format_before_onion_sealing() -> None:
    from panpriv.streamer.esa.model import UnknownModelFormat

    record = analyzer_for(PrivateKey.generate()).model().to_json().replace(b"panpriv-esa-model/2", b"panpriv-esa-model/1")
    with pytest.raises(UnknownModelFormat, match="upgraded"):
        ModelRecord.from_json(record)
