"""The codec of a run's record format: :func:`make_codec`, the one factory every reader uses.

Single-record formats and binary batches are in :mod:`panpriv.streamer.io.codec`; many JSON or
CSV records per message (``json-batch``, ``ndjson``, ``csv-batch``) in
:mod:`panpriv.streamer.io.batch_formats`, which builds on it.
"""

from __future__ import annotations

from panpriv.streamer.config import RecordsConfig
from panpriv.streamer.io.batch_formats import FORMATS as BATCH_FORMATS
from panpriv.streamer.io.batch_formats import make_batch_codec
from panpriv.streamer.io.codec import AdultCodec, BinaryBatchCodec, Codec, CsvCodec, JsonCodec, NamedJsonCodec


def make_codec(records: RecordsConfig, labels_required: bool = True) -> Codec:
    """The codec for ``records.format`` (the config must be resolved: format, dim and bound set);
    JSON with a schema (``records.fields``) reads named fields. ``labels_required=False`` for
    scoring (:class:`Codec`)."""
    if records.format in BATCH_FORMATS:  # many JSON or CSV records per message
        return make_batch_codec(records, labels_required)
    classes: dict[str | None, type[Codec]] = {
        "json": JsonCodec if records.fields is None else NamedJsonCodec,
        "csv": CsvCodec,
        "binary": BinaryBatchCodec,
        "adult": AdultCodec,
    }
    return classes[records.format](records, labels_required)
