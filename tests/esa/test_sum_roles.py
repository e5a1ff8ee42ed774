"""Encode–Shuffle–Analyze for ``shuffle-acsa`` and ``shuffle-sgd`` over secure summation, without a
broker: the share wire format, the client against the in-process learner, the analyzer's
rejections, the shuffler's unit release (Bittau et al. 2017 §3; Ishai et al. 2006;
:mod:`panpriv.protocols.secure_sum`; Cheu et al. 2022 Algs 3 and 4)."""

from __future__ import annotations

import numpy as np
import pytest
from nacl.public import PrivateKey, SealedBox

from panpriv.protocols.catalogue import learner_names, load_learner
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.secure_sum import recombine
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_base import SequentialLearner
from panpriv.protocols.shuffle_sgd import ShuffleSGD
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.client import RefusedModel
from panpriv.streamer.esa.deployment import DEPLOYMENT
from panpriv.streamer.esa.keys import key_id
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.esa.shuffler import Shuffler
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer
from panpriv.streamer.esa.sum_client import SUM_LEARNERS, SharesEncoder
from tests.esa import parts

DIM, B, ROUNDS = 4, 16, 5


def learner(seed: int | None = None, rounds: int = ROUNDS, kind: str = "shuffle-acsa") -> SequentialLearner:
    if kind == "shuffle-sgd":
        return ShuffleSGD(dim=DIM, loss="logistic", epsilon=2.0, delta=1e-5, batch_size=B, radius=2.0, rng=seed)
    return ShuffleACSA(dim=DIM, loss="logistic", epsilon=2.0, delta=1e-5, horizon=rounds * B, batch_size=B, radius=2.0,
                       rng=seed)


def records(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return parts.separable(n, DIM, seed)


@pytest.fixture(scope="module")
def key() -> PrivateKey:
    return PrivateKey.generate()


def test_share_wire_roundtrip_and_units(key: PrivateKey) -> None:
    analyzer = SumAnalyzer(learner(), [key], "t")
    model = analyzer.model()
    assert ModelRecord.from_json(model.to_json()).calibration == model.calibration
    encoder = SharesEncoder(key.public_key, model)
    X, y = records(3)
    messages = encoder.encode(X, y)
    m, size = analyzer.shares, wire.shares_message_size(DIM, analyzer.shares)
    assert encoder.shares == m and {len(item) for item in messages} == {size}
    assert wire.shares_message_round(messages[0], size, m) == 0
    units = wire.units(messages[0], m)
    assert len(units) == m and {len(u) for u in units} == {wire.unit_size(DIM)}
    shares = []
    for unit in units:
        header, sealed = wire.parse_message(unit, wire.UNIT_MAGIC)
        assert header.round == 0 and header.key_id == key_id(key.public_key)
        round_, share = wire.parse_share_plaintext(SealedBox(key).decrypt(sealed), DIM)
        assert round_ == 0
        shares.append(share)
    total = recombine(np.stack(shares), analyzer.bits)
    assert np.all(total <= analyzer.max_count), "one user's shares add up to her PVEC count vector"
    with pytest.raises(wire.WireError):
        wire.shares_message_round(messages[0], size, m + 1)
    with pytest.raises(wire.WireError):
        wire.parse_message(units[0])  # a unit is not a single message


def test_sum_learners_are_the_sequential_learners_of_the_catalogue() -> None:
    assert set(SUM_LEARNERS) == {name for name in learner_names() if issubclass(load_learner(name), SequentialLearner)}


@pytest.mark.parametrize("kind", SUM_LEARNERS)
def test_clients_shuffler_and_analyzer_reproduce_the_in_process_learner(key: PrivateKey, kind: str) -> None:
    """With the same seeded PVEC noise, clients + shuffler logic + analyzer take exactly the
    in-process learner's steps (AC-SA, Cheu et al. 2022 Alg. 4; SGD, Alg. 3) in its per-user mode
    (``pooled_noise = False``; its default pools the binomial noise, the same law but other draws):
    the counts are the same (the same functions draw them), the shares sum back to them, and the analysis and step are
    the learner's own."""
    X, y = records(ROUNDS * B, seed=1)
    in_process = learner(seed=7, kind=kind)
    in_process.pooled_noise = False  # every user's message drawn as her client draws it (the per-user reference)
    in_process.learn_many(X, y)
    analyzer = SumAnalyzer(learner(kind=kind), [key], "t")
    size = wire.shares_message_size(DIM, analyzer.shares)
    shuffler = Shuffler(B, size, shares=analyzer.shares)
    noise = np.random.default_rng(7)
    offset = 0
    for t in range(ROUNDS):
        rows = slice(t * B, (t + 1) * B)
        messages = SharesEncoder(key.public_key, analyzer.model(), rng=noise).encode(X[rows], y[rows])
        released = []
        for item in messages:
            released += shuffler.offer(offset, item)
            offset += 1
        (round_, units), = released
        assert round_ == t and len(units) == B * analyzer.shares
        shuffler.mark_released(t)
        assert analyzer.handle(wire.encode_batch(t, units))
    assert analyzer.round == ROUNDS and analyzer.skipped == 0 and analyzer.rejected == {}
    assert analyzer.learner.finished == in_process.finished == (kind == "shuffle-acsa")  # shuffle-sgd has no horizon
    if in_process.finished:
        np.testing.assert_array_equal(analyzer.model().theta, analyzer.learner.release())
        with pytest.raises(InvalidInputError, match="no round left"):
            analyzer.learner.learn_totals(np.zeros(DIM, dtype=np.int64))
    else:
        np.testing.assert_allclose(analyzer.model().theta, in_process.query_point(), rtol=1e-12, atol=1e-15)
    assert analyzer.model().learner == kind and analyzer.learner.records_seen == in_process.records_seen == ROUNDS * B
    np.testing.assert_allclose(analyzer.learner.release(), in_process.release(), rtol=1e-12, atol=1e-15)
    report = analyzer.report()
    assert report.output.epsilon == in_process.privacy().output.epsilon
    assert in_process.privacy().output.delta < report.output.delta < in_process.privacy().output.delta * (1 + 1e-9)
    assert any(DEPLOYMENT in a for a in report.assumptions) and any("secure summation" in a for a in report.assumptions)
    restored = SumAnalyzer.restore(analyzer.checkpoint(), [key])
    np.testing.assert_array_equal(restored.learner.release(), analyzer.learner.release())
    assert restored.round == ROUNDS and restored.learner.name == kind
    if kind == "shuffle-acsa":  # a checkpoint written before shuffle-sgd names no learner
        legacy = {k: v for k, v in analyzer.checkpoint().items() if k != "learner"}
        assert SumAnalyzer.restore(legacy, [key]).learner.name == kind


def test_analyzer_rejects_by_reason_and_skips_bad_rounds(key: PrivateKey) -> None:
    """Bad rounds are skipped; the budget gate sees the out-of-range one (an output of the honest
    users' totals) and the learned one, never a round whose units did not open."""
    other = PrivateKey.generate()
    analyzer = SumAnalyzer(learner(), [key], "t")
    charged: list[int] = []
    analyzer.gate = lambda round_, report: charged.append(round_)
    m = analyzer.shares
    X, y = records(3 * B)

    def units_of(round_: int, rows: slice) -> list[bytes]:
        model = analyzer.model()
        return [u for item in SharesEncoder(key.public_key, model).encode(X[rows], y[rows]) for u in wire.units(item, m)]

    good = units_of(0, slice(0, B))
    assert not analyzer.handle(wire.encode_batch(1, good)) and analyzer.rejected["stale_round"] == B * m
    assert not analyzer.handle(wire.encode_batch(0, good[:-1])) and analyzer.rejected["wrong_batch_size"] == B * m - 1
    assert not analyzer.handle(b"junk") and analyzer.rejected["malformed_batch"] == 1
    # Round 0: one unit sealed to another key, one replayed, one garbage: skipped as a whole.
    seal_other = SealedBox(other.public_key).encrypt(wire.share_plaintext(0, np.zeros(DIM, dtype=np.uint32)))
    bad = [*good[:-3], wire.message(0, key_id(other.public_key), seal_other)[:4].replace(b"PPM1", b"PPU1")
           + wire.message(0, key_id(other.public_key), seal_other)[4:], good[0], b"\0" * len(good[0])]
    assert analyzer.handle(wire.encode_batch(0, bad))
    assert analyzer.rejected["unknown_key"] == 1 and analyzer.rejected["duplicate_message"] == 1
    assert analyzer.rejected["malformed"] == 1 and analyzer.rejected["invalid_units"] == 1
    assert analyzer.round == 1 and analyzer.skipped == 1 and analyzer.learner.records_seen == 0
    assert not analyzer.handle(wire.encode_batch(0, bad)) and analyzer.rejected["duplicate_batch"] == 1
    # Round 1: a malicious client shifts her last share: the sum leaves the range (w.h.p.).
    units = units_of(1, slice(B, 2 * B))
    header, sealed = wire.parse_message(units[-1], wire.UNIT_MAGIC)
    _, share = wire.parse_share_plaintext(SealedBox(key).decrypt(sealed), DIM)
    shifted = (share.astype(np.int64) + (1 << (analyzer.bits - 1))) % (1 << analyzer.bits)
    forged = SealedBox(key.public_key).encrypt(wire.share_plaintext(1, shifted.astype(np.uint32)))
    units[-1] = units[-1][:20] + forged
    assert analyzer.handle(wire.encode_batch(1, units))
    assert analyzer.rejected["out_of_range"] == 1 and analyzer.skipped == 2 and analyzer.learner.records_seen == 0
    # Round 2: the units of one user sealed to a second key of the analyzer: skipped (two crowds).
    second = PrivateKey.generate()
    two_keys = SumAnalyzer(learner(), [key, second], "t")
    two_keys.round = 2
    mixed = units_of(2, slice(2 * B, 3 * B))[m:]
    mixed += [wire.message(2, key_id(second.public_key),
                           SealedBox(second.public_key).encrypt(wire.share_plaintext(2, np.zeros(DIM, dtype=np.uint32))))
              .replace(wire.MESSAGE_MAGIC, wire.UNIT_MAGIC, 1) for _ in range(m)]
    assert two_keys.handle(wire.encode_batch(2, mixed))
    assert two_keys.rejected == {"mixed_keys": 1, "invalid_units": 1} and two_keys.skipped == 1
    # Round 2: honest, learned (the learner's first round).
    assert analyzer.handle(wire.encode_batch(2, units_of(2, slice(2 * B, 3 * B))))
    assert analyzer.round == 3 and analyzer.skipped == 2 and analyzer.learner.records_seen == B
    assert charged == [1, 2], "charged: the out-of-range round 1 and the learned round 2; not round 0"


def test_encoder_refuses_a_foreign_or_doctored_model(key: PrivateKey) -> None:
    model = SumAnalyzer(learner(), [key], "t").model()
    with pytest.raises(RefusedModel, match="key"):
        SharesEncoder(PrivateKey.generate().public_key, model)
    fewer = ModelRecord(model.learner, model.deployment, model.round, model.theta,
                        {**model.calibration, "shares": model.calibration["shares"] - 1}, model.key_id, model.local_guarantee)
    with pytest.raises(RefusedModel, match="shares"):
        SharesEncoder(key.public_key, fewer)
    less_noise = ModelRecord(model.learner, model.deployment, model.round, model.theta,
                             {**model.calibration, "b": model.calibration["b"] // 2}, model.key_id, model.local_guarantee)
    with pytest.raises(RefusedModel, match="PVEC"):
        SharesEncoder(key.public_key, less_noise)


def test_shuffler_releases_units_of_complete_users_only(key: PrivateKey) -> None:
    analyzer = SumAnalyzer(learner(), [key], "t")
    m = analyzer.shares
    size = wire.shares_message_size(DIM, m)
    X, y = records(B)
    messages = SharesEncoder(key.public_key, analyzer.model()).encode(X, y)
    shuffler = Shuffler(B, size, shares=m)
    out = []
    for offset, item in enumerate([*messages[:-1], messages[0][:-1], wire.message(0, b"\0" * 8, b"\0" * (size - 20)),
                                   messages[-1]]):
        out += shuffler.offer(offset, item)
    assert shuffler.dropped == {"malformed": 2}
    (round_, units), = out
    assert round_ == 0 and sorted(units) == sorted(u for item in messages for u in wire.units(item, m))


def test_learn_totals_refuses_what_no_round_can_sum() -> None:
    fresh = learner()
    top = fresh.round_sum().n * (fresh.round_sum().g + fresh.round_sum().b)
    for bad in (np.full(DIM, top + 1), np.full(DIM, -1), np.zeros(DIM + 1, dtype=np.int64), np.zeros(DIM)):
        with pytest.raises(InvalidInputError):
            fresh.learn_totals(bad)
    assert fresh.records_seen == 0
    fresh.learn_totals(np.full(DIM, top // 2))
    assert fresh.records_seen == B


def test_one_batch_size_is_required(key: PrivateKey) -> None:
    uneven = ShuffleACSA(dim=DIM, loss="logistic", epsilon=2.0, delta=1e-5, horizon=5 * B + 3, batch_size=B, radius=2.0)
    with pytest.raises(ValueError, match="one size"):
        SumAnalyzer(uneven, [key], "t")


def test_sum_client_imports_nothing_of_the_service() -> None:
    assert parts.streamer_modules_after_import("panpriv.streamer.esa.sum_client") == ["panpriv.streamer", "panpriv.streamer.esa", "panpriv.streamer.esa.client", "panpriv.streamer.esa.families", "panpriv.streamer.esa.keys", "panpriv.streamer.esa.model", "panpriv.streamer.esa.sum_client", "panpriv.streamer.esa.wire"]
