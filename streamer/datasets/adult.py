"""The UCI Adult ("Census Income") data: the canonical loader and feature encoder.

The encoder maps one line of ``adult.data``/``adult.test`` to a feature vector using only PUBLIC
information — the attribute lists in ``adult.names`` (shipped next to the data and parsed at import)
and documented value ranges of the 1994 Current Population Survey public-use file the data was
extracted from. No statistic of the data (mean, standard deviation, observed minimum or maximum,
category frequency) enters the encoding: such a statistic is a function of the records and would
leak information about them outside the privacy accounting.

Features (``DIM = 105``), every coordinate in [0, 1]:

- ``bias``: the constant 1, so that a linear model has an intercept.
- five continuous attributes, scaled by fixed public ranges and clipped to [0, 1]:

  ===================  =============================  =============================================
  attribute            map                            public range
  ===================  =============================  =============================================
  age                  (age − 17) / (90 − 17)         ``AAGE > 16`` (adult.names extraction rule);
                                                      CPS top-codes age at 90
  education-num        (e − 1) / 15                   the 16 education levels listed in adult.names
  capital-gain         log(1 + v) / log(1 + 99999)    dollars ≥ 0; CPS top-code 99999
  capital-loss         log(1 + v) / log(1 + 99999)    dollars ≥ 0; same top-code (no separate public
                                                      bound is documented)
  hours-per-week       (h − 1) / (99 − 1)             ``HRSWK > 0`` (extraction rule); CPS top-code 99
  ===================  =============================  =============================================

- one-hot blocks for the eight categorical attributes, in the order and with the values that
  ``adult.names`` lists (workclass 8, education 16, marital-status 7, occupation 14,
  relationship 6, race 5, sex 2, native-country 41). The unknown marker ``?`` encodes as an
  all-zero block.

``fnlwgt`` is not used: it is the CPS sampling weight of the record (adult.names describes how it
is raked to population controls), not an attribute of the person, and it has no documented range.

Hence every encoded vector has ‖x‖₂² ≤ 1 + 5 + 8 = 14, so ``FEATURE_BOUND = √14`` is a bound that
holds by construction (clipping to it never changes an encoded Adult record).

Labels: ``>50K`` → +1, ``<=50K`` → −1 (``adult.test`` writes them with a trailing period).

References
----------
Becker, B. and Kohavi, R. (1996). Adult. UCI Machine Learning Repository, DOI 10.24432/C5XW20,
CC BY 4.0 (attribution in ``streamer/datasets/adult/README.md``).
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

DATA_DIR = Path(str(resources.files("panpriv.streamer.datasets").joinpath("adult")))
TRAIN_PATH = DATA_DIR / "adult.data.gz"
TEST_PATH = DATA_DIR / "adult.test.gz"
NAMES_PATH = DATA_DIR / "adult.names"

TRAIN_RECORDS = 32_561
TEST_RECORDS = 16_281

UNKNOWN = "?"
POSITIVE_LABEL = ">50K"
NEGATIVE_LABEL = "<=50K"


@dataclass(frozen=True)
class Continuous:
    """A continuous attribute mapped to ``clip((transform(v) − low) / (high − low), 0, 1)``."""

    name: str
    low: float
    high: float
    log: bool = False

    def scale(self, value: float) -> float:
        v = math.log1p(max(value, 0.0)) if self.log else value
        lo = math.log1p(self.low) if self.log else self.low
        hi = math.log1p(self.high) if self.log else self.high
        return min(1.0, max(0.0, (v - lo) / (hi - lo)))


CONTINUOUS = (
    Continuous("age", 17.0, 90.0),
    Continuous("education-num", 1.0, 16.0),
    Continuous("capital-gain", 0.0, 99_999.0, log=True),
    Continuous("capital-loss", 0.0, 99_999.0, log=True),
    Continuous("hours-per-week", 1.0, 99.0),
)
IGNORED = ("fnlwgt",)


@dataclass(frozen=True)
class Schema:
    """The attribute order of a data line and the category lists, as ``adult.names`` states them."""

    attributes: tuple[str, ...]
    categories: dict[str, tuple[str, ...]]

    @property
    def feature_names(self) -> tuple[str, ...]:
        names = ["bias"] + [c.name for c in CONTINUOUS]
        for attribute in self.attributes:
            for value in self.categories.get(attribute, ()):
                names.append(f"{attribute}={value}")
        return tuple(names)


def parse_names(text: str) -> Schema:
    """Read the attribute list (``name: continuous.`` or ``name: v1, v2, ….``) of ``adult.names``.

    The attribute section is the block of ``name: …`` lines after the class line
    ``>50K, <=50K.``; lines starting with ``|`` are comments.
    """
    attributes: list[str] = []
    categories: dict[str, tuple[str, ...]] = {}
    in_attributes = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("|"):
            continue
        if line.rstrip(".").replace(" ", "") == f"{POSITIVE_LABEL},{NEGATIVE_LABEL}":
            in_attributes = True
            continue
        if not in_attributes or ":" not in line:
            continue
        name, _, spec = line.partition(":")
        name, spec = name.strip(), spec.strip().rstrip(".")
        attributes.append(name)
        if spec != "continuous":
            categories[name] = tuple(v.strip() for v in spec.split(","))
    expected = {c.name for c in CONTINUOUS} | set(IGNORED)
    missing = expected - set(attributes)
    if len(attributes) != 14 or missing:
        raise ValueError(f"adult.names: expected 14 attributes including {sorted(expected)}; got {attributes}")
    return Schema(tuple(attributes), categories)


@cache
def schema() -> Schema:
    """The schema parsed from the shipped ``adult.names``."""
    return parse_names(NAMES_PATH.read_text(encoding="latin-1"))


def _layout() -> tuple[dict[str, int], dict[str, dict[str, int]], int]:
    s = schema()
    continuous_index = {c.name: 1 + i for i, c in enumerate(CONTINUOUS)}
    offsets: dict[str, dict[str, int]] = {}
    cursor = 1 + len(CONTINUOUS)
    for attribute in s.attributes:
        values = s.categories.get(attribute)
        if values is None:
            continue
        offsets[attribute] = {v: cursor + j for j, v in enumerate(values)}
        cursor += len(values)
    return continuous_index, offsets, cursor


_CONTINUOUS_INDEX, _CATEGORY_INDEX, DIM = _layout()
FEATURE_NAMES = schema().feature_names
FEATURE_BOUND = math.sqrt(1 + len(CONTINUOUS) + len(_CATEGORY_INDEX))
"""‖x‖₂ ≤ √(1 + 5 + 8) = √14 for every encoded record (each block contributes at most 1)."""


class RecordError(ValueError):
    """A line that is not a valid Adult record; ``reason`` is the codec's reject reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def is_record_line(line: str) -> bool:
    """False for blank lines and ``|`` comment lines (``adult.test`` starts with one)."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("|")


def encode_line(line: str, out: NDArray[np.float64]) -> float:
    """Encode one data line into ``out`` (shape ``(DIM,)``, overwritten) and return the label.

    Raises :class:`RecordError` with reason ``missing_field`` (not 15 fields), ``wrong_type`` (a
    continuous field that is not a finite number, or a category not listed in adult.names) or
    ``label_out_of_range``. The message names the attribute, never the value.
    """
    fields = [f.strip() for f in line.split(",")]
    s = schema()
    if len(fields) != len(s.attributes) + 1:
        raise RecordError("missing_field", f"expected {len(s.attributes) + 1} fields, got {len(fields)}")
    out[:] = 0.0
    out[0] = 1.0
    for attribute, value in zip(s.attributes, fields):
        column = _CATEGORY_INDEX.get(attribute)
        if column is not None:
            if value == UNKNOWN:
                continue
            index = column.get(value)
            if index is None:
                raise RecordError("wrong_type", f"{attribute}: value not in the adult.names list")
            out[index] = 1.0
            continue
        if attribute in IGNORED:
            continue
        try:
            number = float(value)
        except ValueError:
            raise RecordError("wrong_type", f"{attribute}: not a number") from None
        if not math.isfinite(number):
            raise RecordError("wrong_type", f"{attribute}: not a finite number")
        spec = CONTINUOUS[_CONTINUOUS_INDEX[attribute] - 1]
        out[_CONTINUOUS_INDEX[attribute]] = spec.scale(number)
    label = fields[-1].rstrip(".")
    if label == POSITIVE_LABEL:
        return 1.0
    if label == NEGATIVE_LABEL:
        return -1.0
    raise RecordError("label_out_of_range", f"label is neither {POSITIVE_LABEL} nor {NEGATIVE_LABEL}")


def encode_lines(
    lines: Iterable[str],
) -> tuple[NDArray[np.float64], NDArray[np.float64], list[tuple[int, str]]]:
    """Encode data lines; return ``(X, y, rejects)`` with ``rejects`` = ``[(line index, reason)]``.

    Every line is a candidate record (filter comments and blank lines with :func:`is_record_line`
    first). ``X`` has one row per valid line, in order.
    """
    lines = list(lines)
    X = np.empty((len(lines), DIM), dtype=np.float64)
    y = np.empty(len(lines), dtype=np.float64)
    rejects: list[tuple[int, str]] = []
    kept = 0
    for i, line in enumerate(lines):
        try:
            y[kept] = encode_line(line, X[kept])
        except RecordError as exc:
            rejects.append((i, exc.reason))
            continue
        kept += 1
    return X[:kept], y[:kept], rejects


def iter_lines(path: Path) -> Iterator[str]:
    """Lines of a (possibly gzip-compressed) Adult file, comment and blank lines removed."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="latin-1") as handle:
        yield from (line for line in handle if is_record_line(line))


def load(split: Literal["train", "test"]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The encoded training (32,561 records) or test (16,281 records) set.

    Raises ``ValueError`` if any shipped line fails to encode (none does: the files are the
    originals, checked by ``SHA256SUMS``).
    """
    path = {"train": TRAIN_PATH, "test": TEST_PATH}[split]
    X, y, rejects = encode_lines(iter_lines(path))
    if rejects:
        raise ValueError(f"{path.name}: {len(rejects)} lines failed to encode (first: {rejects[0]})")
    return X, y
