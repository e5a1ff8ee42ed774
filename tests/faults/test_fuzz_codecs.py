"""Fuzz corpus for every record format: each record is accepted or counted under one reason.

Hypothesis generates malformed and well-formed messages (JSON with huge integers, subnormals, −0,
NaN/Infinity literals, absurd nesting, wrong types, mutated bytes; CSV rows with odd numerals and
random text; binary batches with corrupted headers, truncated bodies and arbitrary float bit
patterns; raw random bytes for all). For every micro-batch the codec must not raise, and for every
message the records it accepted plus those it rejected equal the records the message holds (a
binary batch that holds none is counted once, as ``empty_batch``: issue 35). Each
accepted row is finite, within the feature bound, with a declared label. The batched text formats
(``json-batch``, ``ndjson``, ``csv-batch``: issue 37) hold the fuzzed JSON and CSV records, many a
message, and broken or empty batches; the same invariant holds per message.

The JSON corpus also runs through both JSON decoders (orjson and the standard library's, see
:func:`panpriv.streamer.io.codec._loads_fast`), which must return identical :class:`~panpriv.streamer.io.codec.Decoded`
results: the same rows bit for bit, labels, origins and rejects. For that it adds the inputs where
the two parsers differ: BOMs, UTF-16, surrounding whitespace, duplicate keys, lone surrogates,
nesting near the recursion limit, and integers and decimals exactly halfway between two floats.

The normal suite runs a fast subset; ``-m soak`` (``make soak``) runs at least 10⁴ records per
format and prints the per-reason figures.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panpriv.streamer.config import load_config
from panpriv.streamer.io.batch_formats import JsonArrayCodec
from panpriv.streamer.io.codec import BATCH_MAGIC, Codec, Decoded, JsonCodec
from panpriv.streamer.io.formats import make_codec

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
    # halfway between two floats (ties to even), and either side of float64's largest value
    str(2**64 + 2**11), str(2**64 + 3 * 2**11), str(2**1024 - 2**970), str(2**1024 - 2**970 - 1), "1e-400", "-1e-400",
    "1.00000000000000011102230246251565404236316680908203125", "9007199254740993.0", "2.4703282292062327e-324",
]


@st.composite
def halfway_number(draw: st.DrawFn) -> str:
    """An integer or a decimal exactly halfway between two adjacent float64s, or one unit off: where
    a parser that does not round correctly (to nearest, ties to even) gives another float."""
    mantissa = draw(st.integers(2**52, 2**53 - 1))
    if draw(st.booleans()):
        shift = draw(st.integers(11, 980))
        value = mantissa * 2**shift + 2 ** (shift - 1) + draw(st.sampled_from([-1, 0, 0, 1]))
        return str(value * draw(st.sampled_from([1, -1])))
    exponent = draw(st.integers(-1075, 959))  # the midpoint (2m + 1)·2^exponent, written out exactly
    odd = 2 * mantissa + 1
    midpoint = Decimal(odd * 2**exponent) if exponent >= 0 else Decimal(f"{odd * 5**-exponent}E{exponent}")  # exact: no context
    text = format(midpoint, "e")
    return text.replace("e", "1e") if draw(st.booleans()) else text


json_number = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    halfway_number(),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
)
json_scalar = st.one_of(
    json_number, st.sampled_from(['"a"', "null", '""', "[]", "{}", "[1]", '"1"', '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"'])
)
NESTING = [10, 63, 64, 65, 900, 990, 1000, 1023, 1024, 1025]  # json's RecursionError is near 1,000; orjson's limit 1,024


@st.composite
def json_record(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        depth = draw(st.sampled_from([10, 1000, 100_000]))
        return draw(st.sampled_from([b"[", b'{"x":'])) * depth
    width = draw(st.sampled_from([DIM, DIM, DIM, DIM - 1, DIM + 1, 0]))
    values = json_number if kind >= 7 else json_scalar  # kinds 7-9: numbers only, so many records are accepted
    scalars = draw(st.lists(values, min_size=width, max_size=width))
    if width and draw(st.integers(0, 9)) == 0:  # one value nested deep, closed
        depth = draw(st.sampled_from(NESTING))
        scalars[0] = "[" * depth + scalars[0] + "]" * depth
    xs = ", ".join(scalars)
    label = draw(st.one_of(st.sampled_from(["1", "-1", "1.0", "-1.0"]), json_scalar if kind < 7 else st.just("1")))
    fields = [f'"x": [{xs}]', f'"y": {label}']
    if kind == 2:
        fields = draw(st.permutations(fields))[: draw(st.integers(0, 2))]
    if draw(st.integers(0, 9)) == 0:  # duplicate keys: the last one counts
        fields.append(draw(st.sampled_from(['"y": -1', '"x": [1, 0, 0]', '"x": [true, false, true]', '"x": null', '"z": [[[1]]]', '"z": ' + "[" * 1000 + "]" * 1000, '"id": 7'])))
    text = "{" + ", ".join(fields) + "}"
    if kind == 3:
        text = f"[{text}]"
    if draw(st.integers(0, 3)) == 0:  # surrounding JSON whitespace, and characters that are not
        text = draw(st.sampled_from(["", " ", "\n", "\t\r\n", "\x0c", "\u00a0"])) + text
        text += draw(st.sampled_from(["", " ", "\n", "\r\n", " x", "\x00", "{}"]))
    data = text.encode("utf-8", "surrogatepass")
    encoding = draw(st.integers(0, 19))
    if encoding == 0:
        data = b"\xef\xbb\xbf" + data  # a UTF-8 BOM: json.loads reads it, orjson refuses
    elif encoding == 1:
        data = text.encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32-be"])), "surrogatepass")
    if kind == 4 and data:  # flip one byte
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    return data


@st.composite
def numeric_json_record(draw: st.DrawFn) -> bytes:
    """A well-formed record of numbers (edge, halfway, arbitrary floats and integers), mostly
    accepted: where the two JSON decoders must build the same rows bit for bit."""
    xs = ", ".join(draw(st.lists(json_number, min_size=DIM, max_size=DIM)))
    return f'{{"x": [{xs}], "y": {draw(st.sampled_from(["1", "-1", "1.0", "-1e0"]))}}}'.encode()


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


@st.composite
def json_batch_message(draw: st.DrawFn) -> bytes:
    """A ``json-batch`` message: an array of fuzzed JSON records (each written as its message's
    text where that is JSON, so a broken record breaks the whole array), or a broken array."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        return draw(st.sampled_from([b"[]", b" [ ] ", b"{}", b"[", b"[1, 2]", b'"x"', b"null", b"[" * 1000 + b"]" * 1000]))
    records = draw(st.lists(st.one_of(json_record(), numeric_json_record()), min_size=1, max_size=8))
    data = b"[" + b",".join(records) + b"]"
    if kind == 2 and data:  # flip one byte
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    return data


@st.composite
def line_batch_message(draw: st.DrawFn, record: st.SearchStrategy[bytes]) -> bytes:
    """An ``ndjson`` or ``csv-batch`` message: fuzzed records (with their line breaks, which make
    more records) joined by ``\n`` or ``\r\n``, blank lines between, or no record at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([b"", b"\n", b"\r\n\r\n", b" \n\t"]))
    records = draw(st.lists(record, min_size=1, max_size=8))
    return draw(st.sampled_from([b"\n", b"\r\n", b"\n\n"])).join(records) + draw(st.sampled_from([b"", b"\n"]))


GENERATORS = {
    "json": json_record(), "csv": csv_record(), "binary": binary_record(),
    "json-batch": json_batch_message(), "ndjson": line_batch_message(json_record()), "csv-batch": line_batch_message(csv_record()),
}


# -- the invariant --------------------------------------------------------------------------------


def records_held(fmt: str, codec: Codec, payload: bytes) -> int:
    """How many records a message holds: 1, a well-formed binary batch's count, a JSON array's
    length (0 for ``[]``; 1 for a message that is not an array) or a text batch's lines that are
    not blank (0 for none), read independently of the codec."""
    if fmt == "json-batch":
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):
            return 1
        return len(value) if isinstance(value, list) else 1
    if fmt in ("ndjson", "csv-batch"):
        return sum(1 for line in payload.split(b"\n") if line.strip())
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
        assert accepted[i] + rejected[i] == (records_held(fmt, codec, payload) or 1), (fmt, payload[:80])
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


WIDE_BOUND = 1.7976931348623157e308  # the largest float: no finite row is clipped, so no last bit hides


def json_codecs(bound: float = BOUND, fmt: str = "json") -> tuple[Codec, Codec]:
    """The orjson and the standard-library JSON codecs on the same settings (orjson is in the test
    extra: ``fast=True`` fails here if it is missing rather than skipping the comparison);
    ``fmt="json-batch"``: the batch codecs."""
    overrides = {"source.url": "kafka://h:1/t", "records.format": fmt, "records.dim": DIM, "records.feature_bound": bound}
    records = load_config(None, overrides).records
    kind = JsonCodec if fmt == "json" else JsonArrayCodec
    return kind(records, fast=True), kind(records, fast=False)


def assert_same_decoded(fast: Decoded, stdlib: Decoded, payloads: list[bytes]) -> None:
    """Identical results: rows bit for bit (so −0 and every last bit), labels, origins, rejects."""
    context = [p[:80] for p in payloads]
    assert fast.rejects == stdlib.rejects, context
    assert fast.origin.tolist() == stdlib.origin.tolist(), context
    assert fast.X.shape == stdlib.X.shape and fast.X.tobytes() == stdlib.X.tobytes(), context
    assert fast.y.tobytes() == stdlib.y.tobytes(), context


def fuzz_json_decoders(examples: int, bound: float = BOUND, fmt: str = "json") -> Counter[str]:
    fast, stdlib = json_codecs(bound, fmt)
    tally: Counter[str] = Counter()
    messages = st.one_of(json_record(), numeric_json_record()) if fmt == "json" else json_batch_message()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(messages, min_size=1, max_size=16))
    def run(payloads: list[bytes]) -> None:
        expected = stdlib.decode(payloads)
        assert_same_decoded(fast.decode(payloads), expected, payloads)
        tally["accepted"] += len(expected.y)
        tally.update(expected.reject_counts())

    run()
    return tally


@pytest.mark.parametrize("fmt", ["json", "json-batch"])
@pytest.mark.parametrize("bound", [BOUND, WIDE_BOUND])
def test_both_json_decoders_decide_and_decode_every_fuzzed_record_alike(bound: float, fmt: str) -> None:
    tally = fuzz_json_decoders(2 * FAST_EXAMPLES, bound, fmt)
    assert tally["accepted"] > 0 and len(tally) >= 5  # good records and most reasons were exercised


@pytest.mark.soak
@pytest.mark.parametrize("fmt", ["json", "json-batch"])
def test_soak_both_json_decoders_ten_thousand_records(fmt: str) -> None:
    tally: Counter[str] = Counter()
    while sum(tally.values()) < SOAK_RECORDS:
        tally += fuzz_json_decoders(SOAK_EXAMPLES, BOUND, fmt) + fuzz_json_decoders(SOAK_EXAMPLES, WIDE_BOUND, fmt)
    print(f"\nfuzz {fmt}, orjson vs json: " + json.dumps(dict(sorted(tally.items()))))


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


def test_edge_corpus_through_both_json_decoders() -> None:
    """The fixed corpus, each number in x and as the label, and nested to each depth of NESTING."""
    payloads = [p for n in EDGE_NUMBERS for p in (f'{{"x": [{n}, 0, 0], "y": 1}}'.encode(), f'{{"x": [0, 0, 0], "y": {n}}}'.encode())]
    payloads += [b'{"x": [' + b"[" * k + b"1" + b"]" * k + b', 0, 0], "y": 1}' for k in NESTING]
    payloads += [b"[" * k + b"]" * k for k in NESTING]
    for bound in (BOUND, WIDE_BOUND):
        fast, stdlib = json_codecs(bound)
        assert_same_decoded(fast.decode(payloads), stdlib.decode(payloads), payloads)
