"""panpriv.streamer.io.codec: every reject reason, clipping, and batching invariance of validation."""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter

import numpy as np
import pytest

from panpriv.streamer.config import load_config
from panpriv.streamer.io import codec as codec_module
from panpriv.streamer.io.codec import AdultCodec, BinaryBatchCodec, CsvCodec, JsonCodec, Reason, clip_rows, encode_batch, encode_json

JSON_DECODERS = pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])


def records(**extra):
    base = {"source.url": "kafka://h:1/t", "records.dim": 3, "records.feature_bound": 1.0}
    return load_config(None, {**base, **extra}).records


BAD_JSON = [
    (b"\xff\xfe", Reason.UNDECODABLE),
    (b"{not json", Reason.UNDECODABLE),
    (b"[1, 2, 3]", Reason.WRONG_TYPE),
    (b'{"y": 1}', Reason.MISSING_FIELD),
    (b'{"x": [0.1, 0.2, 0.3]}', Reason.MISSING_FIELD),
    (b'{"x": "0.1,0.2,0.3", "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": null, "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, 0.2, 0.3], "y": "1"}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, 0.2, 0.3], "y": true}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, "a", 0.3], "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, null, 0.3], "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, [1], 0.3], "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, 0.2], "y": 1}', Reason.WRONG_DIMENSION),
    (b'{"x": [0.1, 0.2, 0.3, 0.4], "y": 1}', Reason.WRONG_DIMENSION),
    (b'{"x": [0.1, NaN, 0.3], "y": 1}', Reason.NON_FINITE),
    (b'{"x": [0.1, 1e400, 0.3], "y": 1}', Reason.NON_FINITE),
    (b'{"x": [0.1, 0.2, 0.3], "y": Infinity}', Reason.NON_FINITE),
    (b'{"x": [0.1, 0.2, 0.3], "y": -Infinity}', Reason.NON_FINITE),
    # issue 15 (1): a label integer beyond float64's range raised OverflowError (a crash loop)
    (b'{"x": [0.1, 0.2, 0.3], "y": ' + b"9" * 400 + b"}", Reason.NON_FINITE),
    (b'{"x": [0.1, 0.2, 0.3], "y": -' + b"9" * 309 + b"}", Reason.NON_FINITE),
    (b'{"x": [0.1, ' + b"9" * 400 + b', 0.3], "y": 1}', Reason.NON_FINITE),
    (b'{"x": [0.1, 0.2, 0.3], "y": ' + b"1" * 5000 + b"}", Reason.UNDECODABLE),  # beyond Python's int-parsing limit
    (b'{"x": [0.1, 0.2, 0.3], "y": 1e999}', Reason.NON_FINITE),
    (b'{"x": [0.1, 0.2, 0.3], "y": -0.0}', Reason.LABEL_OUT_OF_RANGE),
    (b"[" * 100_000 + b"]" * 100_000, Reason.UNDECODABLE),
    (b'{"x": [0.1, 0.2, 0.3], "y": 0.5}', Reason.LABEL_OUT_OF_RANGE),
    (b'{"x": [0.1, 0.2, 0.3], "y": 2}', Reason.LABEL_OUT_OF_RANGE),
]
GOOD = encode_json([0.1, 0.2, 0.3], 1.0)


@JSON_DECODERS
@pytest.mark.parametrize(("payload", "reason"), BAD_JSON)
def test_json_rejects_with_reason_and_keeps_the_good_neighbours(payload, reason, fast) -> None:
    decoded = JsonCodec(records(), fast=fast).decode([GOOD, payload, GOOD])
    assert [(r.index, r.reason, r.count) for r in decoded.rejects] == [(1, reason, 1)]
    assert decoded.X.shape == (2, 3) and decoded.y.tolist() == [1.0, 1.0]
    assert decoded.reject_counts() == {reason.value: 1}


def test_validation_does_not_depend_on_how_the_stream_is_batched() -> None:
    payloads = [GOOD, *(p for p, _ in BAD_JSON), encode_json([3, 4, 0], -1), GOOD]
    codec = JsonCodec(records())
    whole = codec.decode(payloads)
    parts = [codec.decode([p]) for p in payloads]
    np.testing.assert_array_equal(whole.X, np.vstack([d.X for d in parts if len(d.y)]))
    assert sorted(whole.reject_counts().items()) == sorted(
        {k: sum(d.reject_counts().get(k, 0) for d in parts) for k in whole.reject_counts()}.items()
    )
    assert len(whole.y) == 3 and len(whole.rejects) == len(BAD_JSON)


def test_valid_records_are_clipped_to_the_declared_bound() -> None:
    decoded = JsonCodec(records()).decode([encode_json([3.0, 4.0, 0.0], 1.0), encode_json([0.3, 0.4, 0.0], -1.0)])
    np.testing.assert_allclose(decoded.X[0], [0.6, 0.8, 0.0])  # ‖x‖ = 5 → scaled onto the unit sphere
    np.testing.assert_array_equal(decoded.X[1], [0.3, 0.4, 0.0])  # inside the ball: unchanged
    X = np.random.default_rng(0).standard_normal((1000, 7)) * 10
    clipped = clip_rows(X, 2.5)
    assert np.linalg.norm(clipped, axis=1).max() <= 2.5 * (1 + 1e-12)
    # Directions are preserved.
    np.testing.assert_allclose(clipped / np.linalg.norm(clipped, axis=1, keepdims=True), X / np.linalg.norm(X, axis=1, keepdims=True))


def test_the_clip_by_blocks_is_bitwise_the_clip_of_one_matrix_and_leaves_its_factors_zeroed() -> None:
    """The codec's clip writes the factors a block of rows at a time (codec_module.clip_block_rows):
    the same products as one matrix of factors, for every block size, and the work block, the
    norms and the factors are zeroed after."""
    from panpriv.protocols import losses

    X = np.random.default_rng(3).standard_normal((50, 4)) * 2.0
    expected = losses.clip_rows(X, 1.5)  # the protocols' clip: one matrix of factors
    for rows in (1, 7, 50, 64):
        work, norms = np.empty((min(rows, 50), 4)), np.sqrt(np.einsum("ij,ij->i", X, X))
        clipped = codec_module._clip(X.copy(), norms, 1.5, in_place=True, work=work)
        assert clipped.tobytes() == expected.tobytes()
        assert not work.any() and not norms.any()
    assert codec_module.clip_block_rows(100) == codec_module.CLIP_BLOCK_BYTES // 800
    assert codec_module.clip_block_rows(1000) == 256


def test_custom_field_names_and_label_range() -> None:
    config = records(**{"records.x_field": "features", "records.y_field": "target", "records.label_values": [],
                        "records.label_min": 0.0, "records.label_max": 10.0})
    codec = JsonCodec(config)
    ok = json.dumps({"features": [0, 0, 0], "target": 9.5}).encode()
    out = json.dumps({"features": [0, 0, 0], "target": -0.5}).encode()
    decoded = codec.decode([ok, out, GOOD])
    assert decoded.y.tolist() == [9.5]
    assert [r.reason for r in decoded.rejects] == [Reason.LABEL_OUT_OF_RANGE, Reason.MISSING_FIELD]


def test_binary_batches_round_trip_and_reject_per_record() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((256, 3)) * 0.1
    y = np.where(rng.random(256) < 0.5, -1.0, 1.0)
    X[5, 1] = np.nan
    y[9] = 7.0
    codec = BinaryBatchCodec(records())
    decoded = codec.decode([encode_batch(X, y, "float64"), b"short", encode_batch(np.ones((4, 2)), np.ones(4)), encode_batch(X[:0], y[:0])])
    keep = np.ones(256, dtype=bool)
    keep[[5, 9]] = False
    np.testing.assert_array_equal(decoded.X, X[keep])
    assert decoded.reject_counts() == {"non_finite": 1, "label_out_of_range": 1, "undecodable": 1, "wrong_dimension": 4,
                                       "empty_batch": 1}
    # float32 batches decode to the float32 values.
    decoded32 = codec.decode([encode_batch(X[keep], y[keep])])
    np.testing.assert_array_equal(decoded32.X, X[keep].astype(np.float32).astype(np.float64))


def test_a_float32_signalling_nan_is_a_non_finite_reject_without_a_warning() -> None:
    """Random bytes (the fuzz corpus) hold float32 signalling NaNs, whose cast to float64 raises
    numpy's "invalid value" warning; the record is rejected as non-finite like any NaN, quietly.
    Positive control: the same cast outside the codec warns."""
    X = np.full((3, 3), 0.25, dtype=np.float32)
    y = np.ones(3, dtype=np.float32)
    signalling = np.array([0x7F800001], dtype="<u4").view("<f4")[0]
    X[1, 2] = signalling
    y[2] = signalling
    with pytest.warns(RuntimeWarning, match="invalid value"):
        np.empty(1)[:] = X[1, 2:]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoded = BinaryBatchCodec(records()).decode([encode_batch(X, y)])
    assert decoded.X.tolist() == [[0.25] * 3] and decoded.reject_counts() == {"non_finite": 2}


def test_csv_rows() -> None:
    codec = CsvCodec(records())
    decoded = codec.decode([b"0.1,0.2,0.3,1", b"0.1,x,0.3,1", b"0.1,0.2,1", b"0.1,0.2,0.3,0.4,1", b"\xff,1,1,1", b"0.1,0.2,0.3,nan"])
    assert decoded.X.tolist() == [[0.1, 0.2, 0.3]]
    assert [r.reason.value for r in decoded.rejects] == ["wrong_type", "missing_field", "wrong_dimension", "undecodable", "non_finite"]
    first = CsvCodec(records(**{"records.csv_label_column": 0})).decode([b"-1,0.1,0.2,0.3"])
    assert first.y.tolist() == [-1.0] and first.X.tolist() == [[0.1, 0.2, 0.3]]


def test_adult_lines() -> None:
    codec = AdultCodec(load_config().records)
    line = b"39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K"
    decoded = codec.decode([line, line.replace(b"State-gov", b"Moon-gov"), b"1, 2", line.replace(b"<=50K", b"maybe"), line.replace(b"39", b"old", 1)])
    assert decoded.y.tolist() == [-1.0]
    assert [r.reason.value for r in decoded.rejects] == ["wrong_type", "missing_field", "label_out_of_range", "wrong_type"]
    assert not codec.is_record_line(b"|1x3 Cross validator\n") and not codec.is_record_line(b"\n")


@pytest.mark.parametrize(
    "payload",
    [
        b'{"x": [0.1, 0.2, 0.3], "y": 1}', b' {"x": [0.1, 0.2, 0.3], "y": 1}\n', b"\xef\xbb\xbf" + GOOD,
        '{"x": [0.1, 0.2, 0.3], "y": 1}'.encode("utf-16"), '{"x": [1, 2, 3], "y": 1}'.encode("utf-32-le"),
        b'{"x": [NaN, -Infinity, 1e400], "y": 1}', b'{"x": [1, 2, 3], "y": 1} {"x": [1, 2, 3], "y": 1}',
        b'{"x": [1, 2, 3], "y": 123456789012345678901234567890}', b'{"y": 1, "y": -1, "x": [true, false, 0]}',
        b'{"x": [1, 2, 3], "y": 1}x', b"", b" ", b"\x00", b'"\x00"', b'{"a\x01": 1}', b"[" * 5 + b"]" * 5,
    ],
)
def test_the_fast_json_path_reads_exactly_what_json_loads_reads(payload) -> None:
    """panpriv.streamer.io.codec._loads: same value, or the same kind of error, as json.loads on the bytes."""
    try:
        expected = json.loads(payload)
    except ValueError as error:
        with pytest.raises(type(error)):
            codec_module._loads(payload)
        return
    got = codec_module._loads(payload)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


# What the two JSON decoders each make of the inputs where orjson and json.loads differ (or might).
PARSER_EDGES: list[tuple[bytes, Reason | list[float]]] = [
    (b'{"x": [NaN, 0, 0], "y": 1}', Reason.NON_FINITE),  # json reads NaN, orjson refuses: validation decides
    (b'{"x": [0, 0, 0], "y": -Infinity}', Reason.NON_FINITE),
    (b'{"x": [1e400, 0, 0], "y": 1}', Reason.NON_FINITE),
    (b'{"x": [' + b"9" * 400 + b', 0, 0], "y": 1}', Reason.NON_FINITE),
    (b'{"x": [0, 0, 0], "y": -' + b"9" * 400 + b"}", Reason.NON_FINITE),
    (b'{"x": [' + str(2**64 + 2**11).encode() + b', 0, 0], "y": 1}', [1.0, 0.0, 0.0]),  # clipped
    (b'{"x": [0.5, 0, 0], "x": [0.25, 0, 0], "y": 1, "y": -1}', [0.25, 0.0, 0.0]),  # duplicate keys: the last
    (b'{"x": [true, false, 0.5], "y": 1}', [0.8944271909999159, 0.0, 0.4472135954999579]),  # booleans read 1/0
    (b'{"x": [0.1, 0.2, 0.3], "y": 1}\xff', Reason.UNDECODABLE),
    (b'{"x": [0.1, 0.2, 0.3], "y": "\xed\xa0\x80"}', Reason.WRONG_TYPE),  # an encoded surrogate: json reads it
    (b'{"x": [0.1, 0.2, 0.3], "y": 1, "z": "\\ud800"}', [0.1, 0.2, 0.3]),  # a lone surrogate escape
    (b"\xef\xbb\xbf" + GOOD, [0.1, 0.2, 0.3]),  # a UTF-8 BOM: json.loads reads the bytes after it
    ('{"x": [0.1, 0.2, 0.3], "y": 1}'.encode("utf-16"), [0.1, 0.2, 0.3]),
    (GOOD + b" \r\n\t", [0.1, 0.2, 0.3]),
    (GOOD + b"\x0c", Reason.UNDECODABLE),  # not JSON whitespace
    (b'{"x": [[0.1], 0.2, 0.3], "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, 0.2, 0.3], "y": [1]}', Reason.WRONG_TYPE),
    (b'{"x": {"0": 0.1}, "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, 0.2], "y": 1}', Reason.WRONG_DIMENSION),
    (b'{"x": [0, 0, ' + b"[" * 1000 + b"1" + b"]" * 1000 + b'], "y": 1}', Reason.UNDECODABLE),  # json's recursion limit
    (b'{"x": [0, 0, ' + b"[" * 100 + b"1" + b"]" * 100 + b'], "y": 1}', Reason.WRONG_TYPE),
    (b'{"x": [0.1, 0.2, 0.3], "y": 1, "z": ' + b"[" * 1000 + b"]" * 1000 + b"}", Reason.UNDECODABLE),  # in another field
    (b'{"x": [0.1, 0.2, 0.3], "y": 1, "z": {"a": [[]]}, "id": 7}', [0.1, 0.2, 0.3]),
]


@JSON_DECODERS
@pytest.mark.parametrize(("payload", "outcome"), PARSER_EDGES)
def test_both_json_decoders_on_the_inputs_where_the_parsers_differ(payload, outcome, fast) -> None:
    decoded = JsonCodec(records(), fast=fast).decode([payload])
    if isinstance(outcome, Reason):
        assert decoded.reject_counts() == {outcome.value: 1} and decoded.X.shape == (0, 3)
    else:
        assert decoded.rejects == ()
        np.testing.assert_allclose(decoded.X, [outcome], rtol=1e-15)


@JSON_DECODERS
def test_a_micro_batch_decodes_as_its_messages_one_by_one(fast) -> None:
    """The whole-batch reading of plainly valid micro-batches (JsonCodec._parse_plain) and the loop
    per message make the same decisions: every edge input among good neighbours, and every accepted
    one in a batch of its own kind, decodes as it does alone."""
    codec = JsonCodec(records(), fast=fast)
    alone = [codec.decode([payload]) for payload, _ in PARSER_EDGES]
    accepted = [payload for (payload, _), one in zip(PARSER_EDGES, alone) if not one.rejects]
    for batch in [[GOOD, payload, GOOD] for payload, _ in PARSER_EDGES] + [accepted, [GOOD] * 5]:
        decoded = codec.decode(batch)
        singles = [codec.decode([payload]) for payload in batch]
        assert decoded.reject_counts() == dict(sum((Counter(one.reject_counts()) for one in singles), Counter()))
        assert [r.index for r in decoded.rejects] == [i for i, one in enumerate(singles) if one.rejects]
        np.testing.assert_array_equal(decoded.X, np.vstack([one.X for one in singles]))
        np.testing.assert_array_equal(decoded.y, np.concatenate([one.y for one in singles]))
        assert decoded.origin.tolist() == [i for i, one in enumerate(singles) if not one.rejects]


def test_the_orjson_decoder_is_the_default_when_importable_and_logged_once(monkeypatch, caplog) -> None:
    """orjson is in the test extra, so the default here is the fast path; the choice is logged once
    at DEBUG per decoder, not per codec."""
    assert codec_module.FAST_JSON_AVAILABLE
    monkeypatch.setattr(codec_module, "_announced", set())
    with caplog.at_level(logging.DEBUG, logger="panpriv.codec"):
        assert JsonCodec(records()).fast and JsonCodec(records()).fast
        assert not JsonCodec(records(), fast=False).fast
    assert [r.getMessage() for r in caplog.records] == [
        "JSON records decoded with orjson", "JSON records decoded with json (standard library)"
    ]


def test_absurdly_nested_json_is_undecodable_not_a_crash() -> None:
    decoded = JsonCodec(records()).decode([GOOD, b"[" * 100_000 + b"]" * 100_000, GOOD])
    assert decoded.reject_counts() == {"undecodable": 1} and len(decoded.y) == 2


def test_huge_finite_rows_are_clipped_onto_the_sphere_not_rejected_or_zeroed() -> None:
    """Squares of entries ≳ 1e154 overflow; such a row is finite and must be scaled to the bound."""
    codec = JsonCodec(records())
    decoded = codec.decode([encode_json([3e200, 4e200, 0.0], 1.0), encode_json([1e300, -1e300, 1e300], -1.0)])
    np.testing.assert_allclose(decoded.X, [[0.6, 0.8, 0.0], [3**-0.5, -(3**-0.5), 3**-0.5]], rtol=1e-15)
    assert decoded.rejects == () and decoded.origin.tolist() == [0, 1]


def test_rows_whose_norm_exceeds_the_largest_float_keep_their_direction() -> None:
    """‖(1.7e308, 1.7e308, -1.7e308)‖ is not a float: the row must still land on the sphere in its
    own direction, not be scaled by bound/inf = 0."""
    decoded = JsonCodec(records()).decode([encode_json([1.7e308, 1.7e308, -1.7e308], 1.0)])
    np.testing.assert_allclose(decoded.X, [[3**-0.5, 3**-0.5, -(3**-0.5)]], rtol=1e-15)


def test_arrays_from_outside_are_never_clipped_in_place_and_origin_names_the_message() -> None:
    X = np.array([[3.0, 4.0, 0.0], [0.1, 0.1, 0.1], [np.nan, 0, 0]])
    before = X.copy()
    decoded = BinaryBatchCodec(records()).validate_arrays(X, np.array([1.0, -1.0, 1.0]))
    np.testing.assert_array_equal(X, before)
    np.testing.assert_allclose(decoded.X, [[0.6, 0.8, 0.0], [0.1, 0.1, 0.1]])
    assert decoded.origin.tolist() == [0, 1]
    batches = [encode_batch(np.full((2, 3), 0.1), np.ones(2)), b"bad", encode_batch(np.full((3, 3), 0.2), -np.ones(3))]
    assert BinaryBatchCodec(records()).decode(batches).origin.tolist() == [0, 0, 2, 2, 2]


def test_json_edge_numbers_that_are_finite_are_accepted_as_their_float64() -> None:
    """Subnormals, −0, integers beyond 64 bits but within float64's range: ordinary finite values."""
    payloads = [
        b'{"x": [5e-324, -0.0, 0.0], "y": 1}',
        b'{"x": [2.2250738585072014e-308, 1e-320, -1e-310], "y": -1}',
        b'{"x": [' + str(10**30).encode() + b', 0, 0], "y": 1}',
        b'{"x": [0.1, 0.2, 0.3], "y": ' + str(-(10**300)).encode() + b"}",
    ]
    decoded = JsonCodec(records(**{"records.label_values": [-1, 1, -1e300]})).decode(payloads)
    assert decoded.rejects == ()
    assert decoded.X[0].tolist() == [5e-324, 0.0, 0.0] and np.signbit(decoded.X[0, 1])
    np.testing.assert_allclose(decoded.X[2], [1.0, 0.0, 0.0], rtol=1e-15)  # 1e30 clipped to the bound 1
    assert decoded.y.tolist() == [1.0, -1.0, 1.0, -1e300]


@pytest.mark.parametrize("fast", [False, True] if codec_module.FAST_JSON_AVAILABLE else [False])
def test_values_are_the_records_as_numbers_whatever_the_encoding_and_settings(fast) -> None:
    """What identifies a file's records (panpriv.streamer.sources.identity): JSON, CSV and binary
    batches of the same numbers give the same rows, unclipped, whatever the label domain, with
    -0 read as 0; messages that are not dim finite numbers and a finite label are left out."""
    X = np.array([[3.0, 4.0, -0.0], [0.1, 0.2, 0.3], [1e300, 1e300, 0.0]])
    y = np.array([1.0, 7.0, -1.0])  # 7 is outside the default labels {-1, 1}
    json_rows = [encode_json(x, v) for x, v in zip(X, y)] + [b'{"x": [1, 2], "y": 1}', b'{"x": [NaN, 0, 0], "y": 1}']
    csv_rows = [",".join(repr(float(v)) for v in [*x, label]).encode() for x, label in zip(X, y)] + [b"1,2,1", b"nan,0,0,1"]
    readings = [JsonCodec(records(), fast=fast).values(json_rows), CsvCodec(records()).values(csv_rows),
                BinaryBatchCodec(records()).values([encode_batch(X, y, "float64")])]
    for read in readings:
        np.testing.assert_array_equal(read.X, np.array([[3.0, 4.0, 0.0], [0.1, 0.2, 0.3], [1e300, 1e300, 0.0]]))
        np.testing.assert_array_equal(read.y, y)
        assert not np.signbit(read.X).any()
    assert list(readings[0].origin) == [0, 1, 2]
    decoded = JsonCodec(records(), fast=fast).decode(json_rows)  # the run itself: clipped, label 7 rejected
    assert len(decoded.y) == 2 and np.all(np.linalg.norm(decoded.X, axis=1) <= 1.0 + 1e-12)
