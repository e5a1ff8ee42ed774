"""Named fields to feature positions: the one declared mapping from a record's fields to a vector.

A user's events are objects with named fields (``{"age": 37, "country": "fr", "clicked": 1}``);
a linear learner needs a vector of ``dim`` numbers. A :class:`FeatureSchema` declares the
mapping once, from public knowledge only (names, documented ranges, the list of categories —
never a statistic of the data, which would leak it outside the accounting), and every entry point
uses it: the service's JSON and CSV decoding (:mod:`panpriv.streamer.io.codec`), a learner's
``learn_one``/``predict_one`` given a mapping (:meth:`panpriv.protocols.base.Learner.use_schema`),
and ``panpriv predict`` (the schema travels in the snapshot's model description).

Each feature is one of

- a **number**, used as it is, or, with public ``min`` and ``max``, scaled to
  ``(v − min)/(max − min)`` and clipped to [0, 1] (as :mod:`panpriv.streamer.datasets.adult`
  scales its continuous attributes); JSON ``true``/``false`` read as 1/0;
- a **category** with a declared vocabulary ``categories``: one position per value, 1 at the
  record's value and 0 elsewhere (scikit-learn's ``DictVectorizer`` names these positions
  ``name=value``, and so does :attr:`FeatureSchema.feature_names`).

A feature with a ``default`` takes it when the record lacks the field (River treats an absent
feature as 0; here that is the declared ``default = 0``); without one, a record lacking it is
rejected as ``missing_field``. A value of the wrong kind is ``wrong_type``, a category outside
the vocabulary ``unknown_category``, and a field the schema does not know is ``unknown_field``
unless the schema lists it in ``ignore`` or sets ``unknown = "ignore"`` — the strict default turns a
misspelt feature name into counted rejects instead of a feature silently stuck at its default.
The label field (``label``) and the record's id field (``id``, echoed by ``panpriv predict``) are
known fields. Rejects are per record, decided from that record alone.

The schema is a small JSON or TOML document (:meth:`FeatureSchema.load`)::

    label = "clicked"
    id = "event"
    ignore = ["timestamp"]

    [[features]]
    name = "age"
    min = 17
    max = 90

    [[features]]
    name = "country"
    categories = ["de", "fr", "us"]

    [[features]]
    name = "visits"
    default = 0

With bounds on every number, each feature contributes at most 1 to ‖x‖₂² (a one-hot block
exactly 1), so :meth:`FeatureSchema.natural_bound` = √(number of features) is a feature bound that
holds by construction.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.errors import InvalidInputError

MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
UNKNOWN_FIELD = "unknown_field"
UNKNOWN_CATEGORY = "unknown_category"
NON_FINITE = "non_finite"


@dataclass(frozen=True)
class Feature:
    """One named field: a number (optionally scaled by public ``min``/``max``) or a category with
    its vocabulary; ``default`` is used when a record lacks the field."""

    name: str
    min: float | None = None
    max: float | None = None
    categories: tuple[str, ...] | None = None
    default: float | str | None = None

    def __post_init__(self) -> None:
        where = f"schema feature {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError(f"schema: every feature needs a non-empty name (got {self.name!r})")
        if (self.min is None) != (self.max is None):
            raise InvalidInputError(f"{where}: give both min and max (public bounds) or neither")
        if self.min is not None and self.max is not None:
            if not (math.isfinite(self.min) and math.isfinite(self.max) and self.min < self.max):
                raise InvalidInputError(f"{where}: min must be < max, both finite (got {self.min}, {self.max})")
        if self.categories is not None:
            if self.min is not None:
                raise InvalidInputError(f"{where}: a category has a vocabulary, not min/max")
            if not self.categories or len(set(self.categories)) != len(self.categories):
                raise InvalidInputError(f"{where}: categories must be a non-empty list of distinct values")
            if self.default is not None and str(self.default) not in self.categories:
                raise InvalidInputError(f"{where}: the default {self.default!r} is not one of its categories")
        elif self.default is not None and (isinstance(self.default, str) or not math.isfinite(self.default)):
            raise InvalidInputError(f"{where}: a number's default must be a finite number")

    @property
    def width(self) -> int:
        """Positions this feature takes: 1, or one per category."""
        return 1 if self.categories is None else len(self.categories)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of its positions: ``name``, or ``name=value`` per category."""
        if self.categories is None:
            return (self.name,)
        return tuple(f"{self.name}={value}" for value in self.categories)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.min is not None:
            out.update(min=self.min, max=self.max)
        if self.categories is not None:
            out["categories"] = list(self.categories)
        if self.default is not None:
            out["default"] = self.default
        return out


_FEATURE_KEYS = frozenset({"name", "min", "max", "categories", "default"})
_SCHEMA_KEYS = frozenset({"features", "label", "id", "ignore", "unknown"})


@dataclass(frozen=True)
class FeatureSchema:
    """The declared mapping from named fields to positions (module docstring)."""

    features: tuple[Feature, ...]
    label: str = "y"
    id: str | None = None
    ignore: tuple[str, ...] = ()
    unknown: Literal["reject", "ignore"] = "reject"
    _plan: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    _known: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.features:
            raise InvalidInputError("schema: declare at least one feature")
        names = [f.name for f in self.features]
        reserved = {self.label, *(() if self.id is None else (self.id,))}
        if len(set(names)) != len(names) or reserved & set(names) or self.label == self.id:
            raise InvalidInputError(
                "schema: feature names, the label field and the id field must all be distinct"
            )
        if self.unknown not in ("reject", "ignore"):
            raise InvalidInputError(f"schema: unknown must be 'reject' or 'ignore' (got {self.unknown!r})")
        plan: list[tuple[Any, ...]] = []
        column = 0
        for f in self.features:
            if f.categories is not None:
                plan.append((f.name, column, None, 1.0, {v: column + j for j, v in enumerate(f.categories)}, f.default))
            else:
                low = 0.0 if f.min is None else f.min
                scale = 1.0 if f.max is None or f.min is None else 1.0 / (f.max - f.min)
                plan.append((f.name, column, f.min is not None, (low, scale), None, f.default))
            column += f.width
        object.__setattr__(self, "_plan", tuple(plan))
        object.__setattr__(self, "_known", frozenset({*names, *reserved, *self.ignore}))

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSchema:
        """A schema from its JSON/TOML form (:meth:`to_dict`); unknown keys are refused by name."""
        if not isinstance(data, Mapping):
            raise InvalidInputError("schema: expected a table with 'features' (and 'label', 'id', 'ignore', 'unknown')")
        extra = set(data) - _SCHEMA_KEYS
        if extra:
            raise InvalidInputError(f"schema: unknown setting(s) {sorted(extra)}; expected {sorted(_SCHEMA_KEYS)}")
        features = []
        for item in data.get("features") or ():
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, Mapping) or set(item) - _FEATURE_KEYS:
                raise InvalidInputError(f"schema: a feature is a name or a table with keys {sorted(_FEATURE_KEYS)} (got {item!r})")
            categories = item.get("categories")
            features.append(
                Feature(
                    str(item.get("name", "")),
                    None if item.get("min") is None else float(item["min"]),
                    None if item.get("max") is None else float(item["max"]),
                    None if categories is None else tuple(str(v) for v in categories),
                    item.get("default"),
                )
            )
        return cls(
            tuple(features),
            str(data.get("label", "y")),
            None if data.get("id") is None else str(data["id"]),
            tuple(str(v) for v in data.get("ignore", ())),
            data.get("unknown", "reject"),
        )

    @classmethod
    def of_names(cls, names: Iterable[str], label: str = "y") -> FeatureSchema:
        """Plain numeric features in the given order (what ``use_schema(["age", …])`` means)."""
        return cls(tuple(Feature(str(n)) for n in names), label)

    @classmethod
    def load(cls, path: Path) -> FeatureSchema:
        """Read a schema file: TOML (``.toml``) or JSON (anything else)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = tomllib.loads(text) if Path(path).suffix == ".toml" else json.loads(text)
        except OSError as exc:
            raise InvalidInputError(f"schema file {path}: {exc.strerror or exc}") from None
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise InvalidInputError(f"schema file {path} is not valid {'TOML' if Path(path).suffix == '.toml' else 'JSON'}: {exc}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (in the snapshot's model description and the privacy settings)."""
        out: dict[str, Any] = {"features": [f.to_dict() for f in self.features], "label": self.label}
        if self.id is not None:
            out["id"] = self.id
        if self.ignore:
            out["ignore"] = list(self.ignore)
        if self.unknown != "reject":
            out["unknown"] = self.unknown
        return out

    # -- the mapping --------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """The vector's dimension: one position per number, one per category value."""
        return sum(f.width for f in self.features)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The name of every position (``name`` or ``name=value``), in order."""
        return tuple(name for f in self.features for name in f.names)

    def natural_bound(self) -> float | None:
        """√(number of features) when every number has public bounds (each feature then adds at most
        1 to ‖x‖₂²); ``None`` if some number is unbounded."""
        if any(f.categories is None and f.min is None for f in self.features):
            return None
        return math.sqrt(len(self.features))

    def fill(self, record: Mapping[str, Any], out: NDArray[np.float64], text: bool = False) -> str | None:
        """Write ``record``'s vector into ``out`` (shape (dim,), overwritten); return ``None``, or
        the reason the record is rejected (``out`` is then zeroed). ``text``: values are strings
        (a CSV row), so a number is read from its text; otherwise (JSON) a number must be a
        number and a category a string (or an integer, read as its digits)."""
        if self.unknown == "reject" and not record.keys() <= self._known:
            out.fill(0.0)
            return UNKNOWN_FIELD
        out.fill(0.0)
        for name, column, bounded, numeric, vocabulary, default in self._plan:
            value = record.get(name)
            if value is None or (text and value == ""):
                if default is None:
                    out.fill(0.0)
                    return MISSING_FIELD
                value = default
            if vocabulary is not None:
                if type(value) is int and not text:
                    value = str(value)
                elif type(value) is not str:
                    out.fill(0.0)
                    return WRONG_TYPE
                position = vocabulary.get(value.strip() if text else value)
                if position is None:
                    out.fill(0.0)
                    return UNKNOWN_CATEGORY
                out[position] = 1.0
                continue
            kind = type(value)
            if kind is float or kind is int or kind is bool:
                try:
                    number = float(value)
                except OverflowError:  # an integer beyond float64's range
                    out.fill(0.0)
                    return NON_FINITE
            elif text and kind is str:
                try:
                    number = float(value)
                except ValueError:
                    out.fill(0.0)
                    return WRONG_TYPE
            else:
                out.fill(0.0)
                return WRONG_TYPE
            if not math.isfinite(number):
                out.fill(0.0)
                return NON_FINITE
            if bounded:
                low, scale = numeric
                number = min(1.0, max(0.0, (number - low) * scale))
            out[column] = number
        return None

    def vector(self, record: Mapping[str, Any], owner: str = "schema") -> NDArray[np.float64]:
        """``record``'s vector, or :class:`InvalidInputError` naming the reason (the Python API)."""
        out = np.zeros(self.dim)
        reason = self.fill(record, out)
        if reason is not None:
            fields = sorted(set(record) - self._known) if reason == UNKNOWN_FIELD else None
            detail = f" ({', '.join(map(str, fields))}; list them in the schema's 'ignore')" if fields else ""
            raise InvalidInputError(f"{owner}: the record is rejected as {reason}{detail}")
        return out

    def label_of(self, record: Mapping[str, Any], text: bool = False) -> float | str:
        """The record's label as a float, ``math.nan`` when it has none (an unlabelled record), or
        the reason it is unusable (``wrong_type``: not a number)."""
        value = record.get(self.label)
        if value is None or (text and value == ""):
            return math.nan
        kind = type(value)
        try:
            if kind is float or kind is int or (text and kind is str):
                return float(value)
        except (ValueError, OverflowError):
            return WRONG_TYPE if kind is str else NON_FINITE
        return WRONG_TYPE
