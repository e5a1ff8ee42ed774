"""Encode–Shuffle–Analyze without a broker: the wire format, keys, the client encoder against the
in-process learner, the analyzer's rejections, the shuffler's rules (Bittau et al. 2017 §3)."""

from __future__ import annotations

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
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.esa.shuffler import Shuffler
from tests.esa import parts

DIM, B = 5, 16


def learner(seed: int | None = None) -> ShuffleGaussianSGD:
    return ShuffleGaussianSGD(dim=DIM, loss="logistic", epsilon=2.0, delta=1e-5, batch_size=B, radius=3.0, rng=seed)


P = learner().calibration()["params"]


def records(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return parts.separable(n, DIM, seed)


def test_wire_roundtrip_and_fixed_size() -> None:
    key = PrivateKey.generate()
    model = Analyzer(learner(), [key], "t").model()
    X, y = records(8)
    messages = Encoder(key.public_key, model).encode(X, y)
    assert {len(m) for m in messages} == {wire.message_size(P)}
    header, sealed = wire.parse_message(messages[0])
    assert header.round == 0 and header.key_id == key_id(key.public_key)
    round_, vector = wire.parse_plaintext(SealedBox(key).decrypt(sealed), P)
    assert round_ == 0 and vector.shape == (P,)
    batch = wire.parse_batch(wire.encode_batch(3, messages))
    assert batch.round == 3 and batch.messages == tuple(messages)
    assert batch.id == wire.batch_id(3, list(reversed(messages))), "the batch id does not depend on the order"
    assert ModelRecord.from_json(model.to_json()).round == 0


def test_keygen_modes_and_refusals(tmp_path: Path) -> None:
    files = keys.generate(tmp_path / "k")
    assert files.private.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o700
    private = keys.load_private(files.private)
    assert key_id(keys.load_public(files.public)) == key_id(private.public_key)
    assert files.key_id == key_id(private.public_key).hex()
    os.chmod(files.private, 0o644)
    with pytest.raises(PermissionError):
        keys.load_private(files.private)


def test_client_and_analyzer_reproduce_the_in_process_learner() -> None:
    """With the same seeded noise, clients + analyzer take the in-process learner's steps (in its
    per-user mode): the messages are the same bits (the same function, local_messages), only the
    mean's rounding differs."""
    rounds = 5
    X, y = records(rounds * B, seed=1)
    in_process = learner(seed=7)
    in_process.pooled_noise = False  # every message formed as a client forms it: the same draws
    in_process.learn_many(X, y)
    key = PrivateKey.generate()
    analyzer = Analyzer(learner(), [key], "t")
    noise = np.random.default_rng(7)
    for t in range(rounds):
        rows = slice(t * B, (t + 1) * B)
        messages = Encoder(key.public_key, analyzer.model(), rng=noise).encode(X[rows], y[rows])
        assert analyzer.handle(wire.encode_batch(t, messages[::-1]))
    assert analyzer.round == rounds and analyzer.learner.records_seen == in_process.records_seen
    np.testing.assert_allclose(analyzer.learner.release(), in_process.release(), rtol=1e-9, atol=1e-12)
    report = analyzer.report()
    assert report.output == in_process.privacy().output
    assert report.intrusion == in_process.local_guarantee()
    assert any(DEPLOYMENT in a for a in report.assumptions)
    assert not any(a.startswith("a trusted shuffler") for a in report.assumptions)
    assert any("Bittau et al. 2017" in r for r in report.references)


def test_analyzer_rejects_by_reason() -> None:
    key, other = PrivateKey.generate(), PrivateKey.generate()
    analyzer = Analyzer(learner(), [key], "t")
    X, y = records(B)
    good = Encoder(key.public_key, analyzer.model()).encode(X, y)
    params = P
    to_other = wire.message(0, key_id(other.public_key), SealedBox(other.public_key).encrypt(wire.plaintext(0, np.zeros(params))))
    moved = wire.message(0, key_id(key.public_key), SealedBox(key.public_key).encrypt(wire.plaintext(5, np.zeros(params))))
    nan = wire.message(0, key_id(key.public_key), SealedBox(key.public_key).encrypt(wire.plaintext(0, np.full(params, np.nan))))
    garbage = wire.message(0, key_id(key.public_key), os.urandom(len(good[0]) - 20))
    retagged = wire.message(1, key_id(key.public_key), wire.parse_message(good[0])[1])
    bad = [good[1], to_other, moved, nan, garbage, retagged[:-1] + b"x"]
    batch = [*good[:8], good[0], *bad[1:], b"\0" * len(good[0])]
    batch += good[8 : 8 + B - len(batch)]
    assert len(batch) == B
    assert not analyzer.handle(wire.encode_batch(1, batch)), "a batch for another round is stale"
    assert analyzer.rejected["stale_round"] == B
    assert not analyzer.handle(wire.encode_batch(0, batch[:-1])), "a short batch is never analysed"
    assert analyzer.rejected["wrong_batch_size"] == B - 1
    assert not analyzer.handle(b"junk")
    assert analyzer.handle(wire.encode_batch(0, batch))
    assert analyzer.rejected["duplicate_message"] == 1
    assert analyzer.rejected["unknown_key"] == 1
    assert analyzer.rejected["round_mismatch"] == 2  # sealed round 5; clear tag 1 in a batch of round 0
    assert analyzer.rejected["non_finite"] == 1
    assert analyzer.rejected["undecryptable"] == 1
    assert analyzer.rejected["malformed"] == 1
    assert analyzer.rejected["malformed_batch"] == 1
    assert analyzer.min_valid == B - 7 and analyzer.round == 1
    assert analyzer.report().output.epsilon > learner().privacy().output.epsilon, "fewer valid messages, weaker bound"
    assert not analyzer.handle(wire.encode_batch(0, batch))
    assert analyzer.rejected["duplicate_batch"] == 1


def test_encoder_refuses_a_weak_or_foreign_model() -> None:
    key = PrivateKey.generate()
    model = Analyzer(learner(), [key], "t").model()
    with pytest.raises(RefusedModel, match="local"):
        Encoder(key.public_key, model, max_local_epsilon=0.01)
    with pytest.raises(RefusedModel, match="key"):
        Encoder(PrivateKey.generate().public_key, model)


def test_shuffler_thresholds_drops_late_and_commits_safely() -> None:
    key = PrivateKey.generate()
    analyzer = Analyzer(learner(), [key], "t")
    size = wire.message_size(P)
    encoder = Encoder(key.public_key, analyzer.model())
    X, y = records(2 * B)
    round0 = encoder.encode(X[:B], y[:B])
    now = [0.0]
    shuffler = Shuffler(B, size, drop_short_after_s=5.0, clock=lambda: now[0])
    round1 = [wire.message(1, key_id(key.public_key), wire.parse_message(m)[1]) for m in round0]
    out = []
    offset = 0
    for item in [*round0[: B - 1], b"bad", round0[B - 1]]:
        out += shuffler.offer(offset, item)
        offset += 1
    assert len(out) == 1 and out[0][0] == 0 and sorted(out[0][1]) == sorted(round0)
    assert shuffler.commit_offset(offset) == offset
    shuffler.mark_released(0)
    far = wire.message(2, key_id(key.public_key), wire.parse_message(round0[0])[1])
    for item in [round1[0], round0[0], far]:
        assert shuffler.offer(offset, item) == []
        offset += 1
    assert shuffler.dropped == {"malformed": 1, "late": 1, "too_early": 1}
    assert shuffler.commit_offset(offset) == B + 1, "the waiting round-1 message pins the commit"
    now[0] = 6.0
    shuffler.expire()
    assert shuffler.dropped["short_round"] == 1 and shuffler.commit_offset(offset) == offset


def test_client_imports_nothing_of_the_service() -> None:
    assert parts.streamer_modules_after_import("panpriv.streamer.esa.client") == ["panpriv.streamer", "panpriv.streamer.esa", "panpriv.streamer.esa.client", "panpriv.streamer.esa.families", "panpriv.streamer.esa.keys", "panpriv.streamer.esa.model", "panpriv.streamer.esa.wire"]
