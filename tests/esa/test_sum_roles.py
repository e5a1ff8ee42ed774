"""Encode–Shuffle–Analyze for ``shuffle-acsa`` and ``shuffle-sgd`` over secure summation, without a
broker: the onion-sealed share messages, the client against the in-process learner, the
analyzer's rejections, the shuffler's unit release, the honest fraction in m and τ (Bittau et al.
2017 §3; Ishai et al. 2006; :mod:`panpriv.protocols.secure_sum`; Cheu et al. 2022 Algs 3 and 4)."""

from __future__ import annotations

import dataclasses

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
SHUFFLER = parts.shuffler_keys()


def learner(seed: int | None = None, rounds: int = ROUNDS, kind: str = "shuffle-acsa",
            honest_fraction: float = 1.0) -> SequentialLearner:
    if kind == "shuffle-sgd":
        return ShuffleSGD(dim=DIM, loss={"name": "logistic", "intercept": False}, epsilon=2.0, delta=1e-5, batch_size=B, radius=2.0, rng=seed,
                          honest_fraction=honest_fraction)
    return ShuffleACSA(dim=DIM, loss={"name": "logistic", "intercept": False}, epsilon=2.0, delta=1e-5, horizon=rounds * B, batch_size=B, radius=2.0,
                       rng=seed, honest_fraction=honest_fraction)


def records(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return parts.separable(n, DIM, seed)


@pytest.fixture(scope="module")
def key() -> PrivateKey:
    return PrivateKey.generate()


def analyzer_for(key: PrivateKey, **options: object) -> SumAnalyzer:
    return parts.bound(SumAnalyzer(learner(**options), [key], "t"), SHUFFLER)  # type: ignore[arg-type]


def encoder(key: PrivateKey, model: ModelRecord, **options: object) -> SharesEncoder:
    return SharesEncoder(key.public_key, SHUFFLER.box.public_key, model, **options)  # type: ignore[arg-type]


def shuffled(analyzer: SumAnalyzer, messages: list[bytes], round_: int) -> list[bytes]:
    """The B·m units the shuffler releases for ``messages`` as ``round_``."""
    state = Shuffler(SHUFFLER.box, len(messages), DIM, last_released=round_ - 1, shares=analyzer.shares)
    ((released_round, units),) = [r for offset, item in enumerate(messages) for r in state.offer(offset, item)]
    assert released_round == round_
    return units


def inside(message: bytes, m: int) -> list[bytes]:
    """The m units of a share message (the shuffler's view; the test holds its key)."""
    opened = wire.open_message(message, wire.shares_message_size(DIM, m), SHUFFLER.key_id, SealedBox(SHUFFLER.box))
    assert not isinstance(opened, str), opened
    return wire.split_units(opened[1], m, wire.share_unit_size(DIM))


def test_share_messages_and_units(key: PrivateKey) -> None:
    analyzer = analyzer_for(key)
    model = analyzer.model()
    assert ModelRecord.from_json(model.to_json()).calibration == model.calibration
    enc = encoder(key, model)
    X, y = records(3)
    messages = enc.encode(X, y)
    m, size = analyzer.shares, wire.shares_message_size(DIM, analyzer.shares)
    assert enc.shares == m and {len(item) for item in messages} == {size}
    units = inside(messages[0], m)
    assert len(units) == m and {len(u) for u in units} == {wire.share_unit_size(DIM)}
    shares = []
    for unit in units:
        ident, sealed = wire.parse_unit(unit, wire.share_unit_size(DIM))
        assert ident == key_id(key.public_key)
        round_, share = wire.parse_share_plaintext(SealedBox(key).decrypt(sealed), DIM)
        assert round_ == 0
        shares.append(share)
    total = recombine(np.stack(shares), analyzer.bits)
    assert np.all(total <= analyzer.max_count), "one user's shares add up to her PVEC count vector"
    assert not any(unit in messages[0] for unit in units), "no unit is readable on the messages topic"
    state = Shuffler(SHUFFLER.box, B, DIM, shares=m + 1)
    assert state.offer(0, messages[0]) == [] and state.dropped == {"malformed": 1}, "another m: malformed"


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
    analyzer = analyzer_for(key, kind=kind)
    noise = np.random.default_rng(7)
    for t in range(ROUNDS):
        rows = slice(t * B, (t + 1) * B)
        messages = encoder(key, analyzer.model(), rng=noise).encode(X[rows], y[rows])
        units = shuffled(analyzer, messages, t)
        assert len(units) == B * analyzer.shares
        assert analyzer.handle(parts.signed(SHUFFLER, t, units))
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
    assert report.intrusion == report.output, "the analyzer's key opens released, shuffled shares only"
    assert any(DEPLOYMENT in a for a in report.assumptions) and any("secure summation" in a for a in report.assumptions)
    assert any("honest fraction gamma = 1" in a and "outside the model" in a for a in report.assumptions)
    restored = SumAnalyzer.restore(analyzer.checkpoint(), [key])
    np.testing.assert_array_equal(restored.learner.release(), analyzer.learner.release())
    assert restored.round == ROUNDS and restored.learner.name == kind


@pytest.mark.parametrize("kind", SUM_LEARNERS)
def test_the_shuffled_topic_cannot_be_linked_to_the_messages_topic(key: PrivateKey, kind: str) -> None:
    """A reader of both topics holding the analyzer's key links no released share to its user's
    message — by bytes, size, key or order (:func:`tests.esa.parts.assert_unlinkable`)."""
    analyzer = analyzer_for(key, kind=kind)
    X, y = records(3 * B, seed=2)
    messages, batches = [], []
    for t in range(3):
        sent = encoder(key, analyzer.model()).encode(X[t * B:(t + 1) * B], y[t * B:(t + 1) * B])
        units = shuffled(analyzer, sent, t)
        assert analyzer.handle(parts.signed(SHUFFLER, t, units))
        messages += sent
        batches.append(units)
    owner = {unit: i for i, item in enumerate(messages) for unit in inside(item, analyzer.shares)}
    parts.assert_unlinkable(messages, batches, [key], owner)


@pytest.mark.parametrize("kind", SUM_LEARNERS)
def test_forged_replayed_resigned_and_duplicated_batches_are_refused(key: PrivateKey, kind: str) -> None:
    analyzer = analyzer_for(key, kind=kind)
    charged: list[int] = []
    analyzer.gate = lambda round_, report: charged.append(round_)
    X, y = records(2 * B, seed=3)
    first = parts.signed(SHUFFLER, 0, shuffled(analyzer, encoder(key, analyzer.model()).encode(X[:B], y[:B]), 0))
    assert analyzer.handle(first) and charged == [0]
    round1 = shuffled(analyzer, encoder(key, analyzer.model()).encode(X[B:], y[B:]), 1)
    parts.assert_refuses_bad_batches(analyzer, SHUFFLER, first, round1, charged)
    assert analyzer.handle(parts.signed(SHUFFLER, 1, round1)) and charged == [0, 1]


def test_analyzer_rejects_by_reason_and_skips_bad_rounds(key: PrivateKey) -> None:
    """Bad rounds are skipped; the budget gate is asked for every round whose units the analyzer
    opens, before it opens any — the skipped ones too (it saw their shares) — and a round the gate
    refuses is not opened at all."""
    other = PrivateKey.generate()
    analyzer = analyzer_for(key)
    charged: list[int] = []
    analyzer.gate = lambda round_, report: charged.append(round_)
    m = analyzer.shares
    X, y = records(3 * B)

    def units_of(round_: int, rows: slice, target: SumAnalyzer = analyzer) -> list[bytes]:
        return shuffled(target, encoder(key, target.model()).encode(X[rows], y[rows]), round_)

    good = units_of(0, slice(0, B))
    assert not analyzer.handle(parts.signed(SHUFFLER, 0, good[:-1])) and analyzer.rejected["wrong_batch_size"] == 1
    # Round 0: one unit sealed to another key, one replayed, one garbage: skipped as a whole.
    to_other = wire.seal_unit(SealedBox(other.public_key), key_id(other.public_key),
                              wire.share_plaintext(0, np.zeros(DIM, dtype=np.uint32)))
    bad = [*good[:-3], to_other, good[0], b"\0" * len(good[0])]
    assert analyzer.handle(parts.signed(SHUFFLER, 0, bad))
    assert analyzer.rejected["unknown_key"] == 1 and analyzer.rejected["duplicate_message"] == 1
    assert analyzer.rejected["malformed"] == 1 and analyzer.rejected["invalid_units"] == 1
    assert analyzer.round == 1 and analyzer.skipped == 1 and analyzer.learner.records_seen == 0
    # Round 1: a malicious client shifts her last share: the sum leaves the range (w.h.p.).
    units = units_of(1, slice(B, 2 * B))
    ident, sealed = wire.parse_unit(units[-1], wire.share_unit_size(DIM))
    _, share = wire.parse_share_plaintext(SealedBox(key).decrypt(sealed), DIM)
    shifted = (share.astype(np.int64) + (1 << (analyzer.bits - 1))) % (1 << analyzer.bits)
    units[-1] = wire.seal_unit(SealedBox(key.public_key), ident, wire.share_plaintext(1, shifted.astype(np.uint32)))
    assert analyzer.handle(parts.signed(SHUFFLER, 1, units))
    assert analyzer.rejected["out_of_range"] == 1 and analyzer.skipped == 2 and analyzer.learner.records_seen == 0
    # Round 2: the units of one user sealed to a second key of the analyzer: skipped (two crowds).
    second = PrivateKey.generate()
    two_keys = parts.bound(SumAnalyzer(learner(), [key, second], "t"), SHUFFLER)
    two_keys.round = 2
    mixed = units_of(2, slice(2 * B, 3 * B), two_keys)[m:]
    mixed += [wire.seal_unit(SealedBox(second.public_key), key_id(second.public_key),
                             wire.share_plaintext(2, np.zeros(DIM, dtype=np.uint32))) for _ in range(m)]
    assert two_keys.handle(parts.signed(SHUFFLER, 2, mixed))
    assert two_keys.rejected == {"mixed_keys": 1, "invalid_units": 1} and two_keys.skipped == 1
    # Round 2: honest, learned (the learner's first round).
    assert analyzer.handle(parts.signed(SHUFFLER, 2, units_of(2, slice(2 * B, 3 * B))))
    assert analyzer.round == 3 and analyzer.skipped == 2 and analyzer.learner.records_seen == B
    assert charged == [0, 1, 2], "charged: the invalid round 0, the out-of-range round 1 and the learned round 2"
    # Round 3, refused by the budget: stopped before any unit is opened (the garbage unit is not even counted).
    analyzer.gate = lambda round_, report: "refused"
    refused = [*units_of(3, slice(0, B))[:-1], b"\0" * len(good[0])]
    before = dict(analyzer.rejected)
    assert not analyzer.handle(parts.signed(SHUFFLER, 3, refused))
    assert analyzer.stopped == "refused" and analyzer.rejected == before and analyzer.round == 3


def test_m_and_tau_cover_the_declared_honest_users(key: PrivateKey) -> None:
    """``honest_fraction`` γ declared in the plan: m and τ are the secure sum's at ⌈γB⌉ honest
    users (PVEC's noisy users), q still covers all B; the statement prints γ and ⌈γB⌉; a client
    recomputes the same m and refuses a model asking for the all-honest one."""
    gamma = 0.75
    honest = parts.bound(SumAnalyzer(learner(honest_fraction=gamma), [key], "t"), SHUFFLER)
    everyone = analyzer_for(key)
    assert honest.plan.honest == 12 == honest._vector_sum.parameters.noisy_users and everyone.plan.honest == B
    assert honest.bits >= everyone.bits and honest.shares > everyone.shares
    from panpriv.protocols.secure_sum import distance_bound, shares_needed

    assert honest.shares == shares_needed(12, DIM * honest.bits)
    assert honest.tau == distance_bound(12, honest.shares, DIM * honest.bits) <= 2.0**-64
    line = next(a for a in honest.report().assumptions if a.startswith("colluding clients"))
    assert "gamma = 0.75" in line and "ceil(gamma n) = 12 honest users of n = 16" in line and "up to 4 clients" in line
    model = honest.model()
    assert encoder(key, model).shares == honest.shares
    with pytest.raises(RefusedModel, match="honest users"):
        encoder(key, dataclasses.replace(model, calibration={**model.calibration, "shares": everyone.shares}))


def test_encoder_refuses_a_foreign_or_doctored_model(key: PrivateKey) -> None:
    model = analyzer_for(key).model()
    with pytest.raises(RefusedModel, match="key"):
        SharesEncoder(PrivateKey.generate().public_key, SHUFFLER.box.public_key, model)
    fewer = dataclasses.replace(model, calibration={**model.calibration, "shares": model.calibration["shares"] - 1})
    with pytest.raises(RefusedModel, match="shares"):
        encoder(key, fewer)
    less_noise = dataclasses.replace(model, calibration={**model.calibration, "b": model.calibration["b"] // 2})
    with pytest.raises(RefusedModel, match="PVEC"):
        encoder(key, less_noise)


def test_shuffler_releases_units_of_complete_users_only(key: PrivateKey) -> None:
    analyzer = analyzer_for(key)
    m = analyzer.shares
    X, y = records(B)
    messages = encoder(key, analyzer.model()).encode(X, y)
    shuffler = Shuffler(SHUFFLER.box, B, DIM, shares=m)
    garbled = messages[0][:20] + bytes(len(messages[0]) - 20)
    out = []
    for offset, item in enumerate([*messages[:-1], messages[0][:-1], garbled, messages[-1]]):
        out += shuffler.offer(offset, item)
    assert shuffler.dropped == {"malformed": 1, "undecryptable": 1}
    ((round_, units),) = out
    assert round_ == 0 and sorted(units) == sorted(u for item in messages for u in inside(item, m))


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
    uneven = ShuffleACSA(dim=DIM, loss={"name": "logistic", "intercept": False}, epsilon=2.0, delta=1e-5, horizon=5 * B + 3, batch_size=B, radius=2.0)
    with pytest.raises(ValueError, match="one size"):
        SumAnalyzer(uneven, [key], "t")


def test_sum_client_imports_nothing_of_the_service() -> None:
    assert parts.streamer_modules_after_import("panpriv.streamer.esa.sum_client") == [
        "panpriv.streamer", "panpriv.streamer.esa", "panpriv.streamer.esa.client", "panpriv.streamer.esa.families",
        "panpriv.streamer.esa.keys", "panpriv.streamer.esa.model", "panpriv.streamer.esa.sum_client",
        "panpriv.streamer.esa.wire"]
