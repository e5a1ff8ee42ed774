"""Fuzz corpus for every record format: each record is accepted or counted under one reason.

Hypothesis generates malformed and well-formed messages (JSON with huge integers, subnormals, −0,
NaN/Infinity literals, absurd nesting, wrong types, mutated bytes; CSV rows with odd numerals and
random text; binary batches with corrupted headers, truncated bodies and arbitrary float bit
patterns; raw random bytes for all). For every micro-batch the codec must not raise, and for every
message the records it accepted plus those it rejected equal the records the message holds. Each
accepted row is finite, within the feature bound, with a declared label.

The normal suite runs a fast subset; ``-m soak`` (``make soak``) runs at least 10⁴ records per
format and prints the per-reason figures.
"""

from __future__ import annotations

import json
import struct
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.codec import BATCH_MAGIC, Codec, make_codec
from streamer.config import load_config

DIM = 3
BOUND = 1.0
FAST_EXAMPLES = 100
SOAK_RECORDS = 10_000
SOAK_EXAMPLES = 1_000  # batches of up to 16 messages, repeated until SOAK_RECORDS records


def codec_for(fmt: str) -> Codec:
    overrides = {"source.url": "kafka://h:1/t", "records.format": fmt, "records.dim": DIM, "records.feature_bound": BOUND}
    return make_codec(load_config(None, overrides).records)


# -- generators ---------------------------------------------------------------------------------

EDGE_NUMBERS = [
    "0", "-0", "-0.0", "0.0", "5e-324", "-5e-324", "2.2250738585072014e-308", "1e-320", "1.7976931348623157e308",
    "-1.7976931348623157e308", "1e309", "-1e309", "1e400", "NaN", "Infinity", "-Infinity", "9" * 309, "-" + "9" * 400,
    "1" * 4301, str(2**63), str(2**64 + 1), str(-(2**63) - 1), "1", "-1", "1.0", "-1.0", "0.5", "1E+2", "true", "false",
]
json_number = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
)
json_scalar = st.one_of(json_number, st.sampled_from(['"a"', "null", '""', "[]", "{}", "[1]", '"1"']))


@st.composite
def json_record(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        depth = draw(st.sampled_from([10, 1000, 100_000]))
        return draw(st.sampled_from([b"[", b'{"x":'])) * depth
    width = draw(st.sampled_from([DIM, DIM, DIM, DIM - 1, DIM + 1, 0]))
    xs = ", ".join(draw(st.lists(json_scalar, min_size=width, max_size=width)))
    label = draw(st.one_of(st.sampled_from(["1", "-1", "1.0", "-1.0"]), json_scalar))
    fields = [f'"x": [{xs}]', f'"y": {label}']
    if kind == 2:
        fields = draw(st.permutations(fields))[: draw(st.integers(0, 2))]
    text = "{" + ", ".join(fields) + "}"
    if kind == 3:
        text = f"[{text}]"
    data = text.encode()
    if kind == 4 and data:  # flip one byte
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    return data


csv_field = st.one_of(
    st.sampled_from(EDGE_NUMBERS + ["nan", "inf", "-inf", "+inf", "infinity", " 1 ", "1_0", "0x10", "", " ", "1e", "--1"]),
    st.floats().map(repr),
    st.text(max_size=8),
)


@st.composite
def csv_record(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 7)) == 0:
        return draw(st.binary(max_size=64))
    width = draw(st.sampled_from([DIM + 1, DIM + 1, DIM + 1, DIM, DIM + 2]))
    fields = draw(st.lists(csv_field, min_size=width, max_size=width))
    if draw(st.booleans()):
        fields[-1] = draw(st.sampled_from(["1", "-1", "1.0", "-0", "2"]))
    return ",".join(fields).encode("utf-8", "surrogatepass")


@st.composite
def binary_record(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=64))
    code = draw(st.sampled_from([1, 2, 1, 2, 0, 3, 255]))
    itemsize = {1: 4, 2: 8}.get(code, 4)
    dim = draw(st.sampled_from([DIM, DIM, DIM, 0, 1, DIM + 1, 65535]))
    m = draw(st.integers(0, 6))
    body = draw(st.binary(min_size=m * (dim + 1) * itemsize, max_size=m * (dim + 1) * itemsize)) if dim < 100 else b""
    if kind == 1 and body:  # labels from the declared set, features arbitrary bit patterns
        labels = np.array(draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=m, max_size=m)), dtype="<f4" if code == 1 else "<f8")
        body = body[: len(body) - m * itemsize] + labels.tobytes()
    magic = BATCH_MAGIC if kind != 2 else draw(st.binary(min_size=4, max_size=4))
    header_m = m if kind != 3 else draw(st.integers(0, 2**32 - 1))
    payload = struct.pack("<4sBBHI", magic, code, draw(st.integers(0, 255)), dim, header_m) + body
    if kind == 4:
        payload = payload[: draw(st.integers(0, len(payload)))]
    return payload


GENERATORS = {"json": json_record(), "csv": csv_record(), "binary": binary_record()}


# -- the invariant --------------------------------------------------------------------------------


def records_held(fmt: str, codec: Codec, payload: bytes) -> int:
    """How many records a message holds: 1, or a well-formed binary batch's count."""
    if fmt != "binary":
        return 1
    header = struct.Struct("<4sBBHI")
    if len(payload) < header.size:
        return 1
    magic, code, _, dim, m = header.unpack_from(payload)
    itemsize = {1: 4, 2: 8}.get(code)
    if magic != BATCH_MAGIC or itemsize is None or len(payload) != header.size + m * (dim + 1) * itemsize:
        return 1
    return m


def check_batch(fmt: str, codec: Codec, payloads: list[bytes], tally: Counter[str]) -> None:
    decoded = codec.decode(payloads)  # must not raise
    accepted = Counter(decoded.origin.tolist())
    rejected: Counter[int] = Counter()
    for reject in decoded.rejects:
        rejected[reject.index] += reject.count
    for i, payload in enumerate(payloads):
        assert accepted[i] + rejected[i] == records_held(fmt, codec, payload), (fmt, payload[:80])
    assert decoded.X.shape == (len(decoded.y), DIM)
    assert np.isfinite(decoded.X).all() and np.isfinite(decoded.y).all()
    assert (np.linalg.norm(decoded.X, axis=1) <= BOUND * (1 + 1e-12)).all()
    assert set(decoded.y.tolist()) <= {-1.0, 1.0}
    tally["accepted"] += len(decoded.y)
    for reason, count in decoded.reject_counts().items():
        tally[reason] += count


def fuzz(fmt: str, examples: int) -> Counter[str]:
    codec = codec_for(fmt)
    tally: Counter[str] = Counter()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(GENERATORS[fmt], min_size=1, max_size=16))
    def run(payloads: list[bytes]) -> None:
        check_batch(fmt, codec, payloads, tally)

    run()
    return tally


@pytest.mark.parametrize("fmt", sorted(GENERATORS))
def test_fuzzed_records_are_accepted_or_counted_by_reason(fmt: str) -> None:
    tally = fuzz(fmt, FAST_EXAMPLES)
    assert sum(tally.values()) > FAST_EXAMPLES  # the generator produced records, and every one was counted
    assert len(tally) >= 3  # several outcomes were exercised, not only one reason


@pytest.mark.soak
@pytest.mark.parametrize("fmt", sorted(GENERATORS))
def test_soak_fuzz_ten_thousand_records_per_format(fmt: str) -> None:
    tally: Counter[str] = Counter()
    while sum(tally.values()) < SOAK_RECORDS:
        tally += fuzz(fmt, SOAK_EXAMPLES)
    total = sum(tally.values())
    print(f"\nfuzz {fmt}: {total:,} records: " + json.dumps(dict(sorted(tally.items()))))
    assert total >= SOAK_RECORDS


def test_edge_corpus_every_format_counted() -> None:
    """A fixed corpus of the edge values in every format, checked without Hypothesis."""
    for fmt in ("json", "csv"):
        codec = codec_for(fmt)
        tally: Counter[str] = Counter()
        for number in EDGE_NUMBERS:
            if fmt == "json":
                payloads = [f'{{"x": [{number}, 0, 0], "y": 1}}'.encode(), f'{{"x": [0, 0, 0], "y": {number}}}'.encode()]
            else:
                payloads = [f"{number},0,0,1".encode(), f"0,0,0,{number}".encode()]
            check_batch(fmt, codec, payloads, tally)
        assert tally["accepted"] > 0 and tally["non_finite"] > 0
