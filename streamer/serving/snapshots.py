"""Serving released snapshots: load one from a snapshots file and score records with it.

A snapshot record (:mod:`panpriv.streamer.io.sinks`) holds the released parameters and, from schema version 2,
the model description (:class:`panpriv.protocols.base.ModelSpec`: loss, link, intercept, dimension, feature
bound and clipping rule, feature names). :func:`load_snapshot` turns one into a
:class:`panpriv.protocols.base.Snapshot` whose ``predict_many`` applies the training-time clipping; ``panpriv
predict`` (:func:`predict_source`) scores every record of a source with it. Scoring is
post-processing of a release and costs no privacy; the records scored are the user's own input and
nothing about them is exported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.base import ModelSpec, Snapshot
from panpriv.protocols.losses import as_loss
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.source_url import AdultUrl, parse_source_url
from panpriv.streamer.sources.local import LineFileSource


def snapshot_records(path: Path) -> list[dict[str, Any]]:
    """Every complete snapshot record of a snapshots JSONL file (a torn last line is ignored)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"--snapshot {path}: no such file (a snapshots.jsonl written by panpriv run --out)") from None
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines):
                raise ConfigError(f"{path}:{number}: not a snapshot record (invalid JSON)") from None
    if not records:
        raise ConfigError(f"{path}: holds no snapshot yet")
    return records


def load_snapshot(
    path: str | Path,
    sequence: int | None = None,
    *,
    loss: Any = None,
    feature_bound: float | None = None,
) -> Snapshot:
    """The last snapshot of ``path`` (or the one with checkpoint ``sequence``), ready to predict.

    ``loss`` and ``feature_bound`` describe the model of a version-1 record (which lacks its
    ``model`` field); for a version-2 record they must be left out or agree with it.
    """
    path = Path(path)
    records = snapshot_records(path)
    chosen = records[-1] if sequence is None else next((r for r in records if r.get("sequence") == sequence), None)
    if chosen is None:
        raise ConfigError(f"{path}: no snapshot with sequence {sequence} (have {[r.get('sequence') for r in records]})")
    return snapshot_from_record(chosen, loss=loss, feature_bound=feature_bound)


def snapshot_from_record(record: Mapping[str, Any], *, loss: Any = None, feature_bound: float | None = None) -> Snapshot:
    """A :class:`Snapshot` from one snapshot record (see :func:`load_snapshot` for the options)."""
    params = np.asarray(record["params"], dtype=np.float64)
    model_data = record.get("model")
    if model_data is not None:
        model = ModelSpec.from_dict(model_data)
        if loss is not None and as_loss(loss, "load_snapshot") != model.loss:
            raise ConfigError(f"load_snapshot: loss {loss!r} disagrees with the snapshot's {model.loss!r}")
        if feature_bound is not None and feature_bound != model.feature_bound:
            raise ConfigError(f"load_snapshot: feature_bound {feature_bound} disagrees with the snapshot's {model.feature_bound}")
    elif loss is not None and feature_bound is not None:
        spec_loss = as_loss(loss, "load_snapshot")
        model = ModelSpec(spec_loss, params.size - int(spec_loss.intercept), float(feature_bound))
    else:
        model = None
    privacy = PrivacyReport.from_dict(record["privacy"])
    return Snapshot(str(record["learner"]), int(record["records"]), params, privacy, model)


@dataclass(frozen=True)
class Scored:
    """One micro-batch of scored records: predictions (labels or values), probabilities for a
    logistic model (else ``None``), the records' own labels (NaN for an unlabelled record), how
    many were rejected, and ``lines``: one output line per input message, in input order — where
    it was (``line``: the 1-based line number of a line file; ``key`` and ``offset`` in a
    recording), its ``id`` when the schema names an id field, and its ``prediction`` (with
    ``probability``) or the ``rejected`` reason."""

    predictions: NDArray[np.float64]
    probabilities: NDArray[np.float64] | None
    labels: NDArray[np.float64]
    rejected: int
    lines: tuple[dict[str, Any], ...] = ()


def predict_source(snapshot: Snapshot, url: str, record_format: str | None = None, batch: int = 4096) -> Iterator[Scored]:
    """Score every record of the source ``url`` (a file or ``adult:test``), read and clipped by the
    same codec as ``panpriv run`` with the snapshot's dimension, feature bound and schema (named
    fields). A record needs no label to be scored; a record that cannot be read is reported by
    reason, in its place (:class:`Scored`)."""
    from panpriv.streamer.config import load_config
    from panpriv.streamer.io.formats import make_codec
    from panpriv.streamer.sources.open import open_source

    model = snapshot.model
    if model is None:
        raise ConfigError("this snapshot has no model description (schema version 1): load it in Python with load_snapshot(..., loss=..., feature_bound=...)")
    overrides: dict[str, Any] = {"source.url": url}
    if not isinstance(parse_source_url(url), AdultUrl):
        overrides.update({"records.dim": model.dim, "records.feature_bound": model.feature_bound})
        if model.schema is not None:
            overrides["records.fields"] = model.schema.to_dict()
    if record_format is not None:
        overrides["records.format"] = record_format
    config = load_config(None, overrides)
    codec = make_codec(config.records, labels_required=False)
    source = open_source(config.source, codec, {})
    logistic = model.loss.name == "logistic"
    line_file = isinstance(source, LineFileSource)
    try:
        while not source.exhausted:
            polled = source.poll(batch, 0.0)
            if polled is None:
                continue
            decoded = codec.validate_arrays(*polled.arrays) if polled.arrays is not None else codec.decode(polled.payloads)
            predictions = snapshot.predict_many(decoded.X)
            probabilities = snapshot.predict_proba_many(decoded.X) if logistic else None
            ids = codec.record_ids(polled.payloads)
            places = [
                {"line": position + 1} if line_file else {"key": key, "offset": position}
                for key, position in zip(polled.keys, polled.positions)
            ]
            if ids is not None:
                for place, record_id in zip(places, ids):
                    place["id"] = record_id
            lines: list[dict[str, Any]] = []
            rows = iter(range(len(decoded.y)))
            rejects = iter(decoded.rejects)
            reject = next(rejects, None)
            row = next(rows, None)
            for message, place in enumerate(places):  # rows and rejects are both in message order
                while row is not None and decoded.origin[row] == message:
                    line = {**place, "prediction": float(predictions[row])}
                    if probabilities is not None:
                        line["probability"] = float(probabilities[row])
                    lines.append(line)
                    row = next(rows, None)
                while reject is not None and reject.index == message:
                    lines.append({**place, "rejected": reject.reason.value, **({"count": reject.count} if reject.count > 1 else {})})
                    reject = next(rejects, None)
            yield Scored(predictions, probabilities, decoded.y, sum(decoded.reject_counts().values()), tuple(lines))
    finally:
        source.close()
