"""Stop a run whose first records are (almost) all rejected, before it charges or commits anything.

A misconfiguration such as ``--dim 5`` on a topic of 20-feature records rejects every record: the
run used to exit 0 having learned nothing, while the privacy ledger and the budget store were
charged with the consumed offsets and the offsets were committed (issue 14). The guard looks at
the first ``records.guard_records`` records (default 1,000) of a run, batch by batch, *before*
each batch is charged: once it has seen that many and at least ``records.guard_ratio`` of them
(default 0.99) were rejected, it raises :class:`RejectRatioError` (exit 2) naming the top reason,
an example, and the likely fix. Nothing of that batch is charged or learned, and no checkpoint is
taken, so no offset is committed.

Privacy: the decision depends only on reject counts by reason, which are public in every
learner's statement (the guarantee covers neighbouring streams whose differing record has the same
validity), so stopping reveals nothing the statement does not already make public.

Limits: batches read before the guard has seen ``guard_records`` records (a source that delivers
fewer records per poll) are charged and learned as usual — a conservative over-count of the
budget, never an under-count. The guard runs only in a run's first window (a resumed run starts a
new window); ``guard_records = 0`` disables it. During the window each batch is decoded twice
(once here, once to learn), which costs at most ``guard_records`` decodes per run.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Sequence

from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import Codec, Decoded
from panpriv.streamer.sources.base import Batch


class RejectRatioError(ConfigError):
    """The first records of the run were (almost) all rejected (module docstring)."""


class RejectGuard:
    """Counts the first records of a run and stops it when nearly all are rejected."""

    def __init__(self, codec: Codec, records: int, ratio: float) -> None:
        self._codec = codec
        self._window = records
        self._ratio = ratio
        self.read = 0
        self.reasons: Counter[str] = Counter()

    @property
    def watching(self) -> bool:
        return self.read < self._window

    def check(self, batch: Batch) -> None:
        """Decode ``batch`` if still in the window; raise :class:`RejectRatioError` if the window is
        complete and at least the ratio was rejected."""
        if not self.watching:
            return
        if batch.arrays is not None:
            decoded = self._codec.validate_arrays(*batch.arrays)
        else:
            decoded = self._codec.decode(batch.payloads)
        counts = decoded.reject_counts()
        self.read += len(decoded.y) + sum(counts.values())
        self.reasons.update(counts)
        if batch.arrays is None:  # decoded from messages: our own copy, learned from a second decode; wipe it
            for array in (decoded.X, decoded.y):  # (arrays of a numeric batch are the batch's own: the processor wipes them)
                if array.flags.writeable:
                    array.fill(0.0)
        rejected = sum(self.reasons.values())
        if self.read >= self._window and rejected >= self._ratio * self.read:
            raise RejectRatioError(self._message(batch.payloads, decoded, rejected))

    def _message(self, payloads: Sequence[bytes], decoded: Decoded, rejected: int) -> str:
        reason, count = self.reasons.most_common(1)[0]
        example = next((r.index for r in decoded.rejects if r.reason.value == reason), None)
        payload = payloads[example] if example is not None and example < len(payloads) else None
        return (
            f"stopped before learning: {rejected:,} of the first {self.read:,} records ({rejected / self.read:.1%}) "
            f"were rejected, most as {reason!r} ({count:,}). {self._fix(reason, payload)} "
            "Nothing was learned from them, nothing was charged to the privacy budget and no offset was committed. "
            f"(This check: records.guard_records = {self._window:,}, records.guard_ratio = {self._ratio:g}; "
            "set records.guard_records = 0 to turn it off.)"
        )

    def _fix(self, reason: str, payload: bytes | None) -> str:
        records = self._codec.records
        if reason == "wrong_dimension":
            found = _dimension_of(payload, records.format, records.x_field, records.csv_label_column) if payload else None
            if found is not None:
                return (f"The records have {found} features but records.dim is {records.dim}: "
                        f"run with --dim {found} (and a feature bound for that dimension).")
            return f"records.dim is {records.dim}: set --dim to the records' number of features."
        if reason == "undecodable":
            return (f"The messages are not {records.format!r} records: check --format "
                    "(json, csv, binary; json-batch, ndjson, csv-batch for many records a message) against what the producer writes.")
        if reason == "missing_field":
            return (f"The records lack the field {records.x_field!r} or {records.y_field!r}: "
                    "set records.x_field / records.y_field to the producer's field names.")
        if reason == "label_out_of_range":
            allowed = list(records.label_values) if records.label_values else [records.label_min, records.label_max]
            return (f"The labels are outside {allowed}: set records.label_values "
                    "(e.g. [0, 1]) or [] with label_min/label_max for a regression target.")
        if reason == "empty_batch":
            return ("The messages hold no record (a binary batch header with m = 0, an empty JSON array, a text batch "
                    "without a record line): fix the producer's batching.")
        if reason == "non_finite":
            return "The records hold NaN or infinite values: fix the producer (a NaN cannot be clipped)."
        return "Check [records] against what the producer writes."


def _dimension_of(payload: bytes, fmt: str | None, x_field: str, label_column: int) -> int | None:
    """The number of features in one rejected message, if it can be read (JSON, CSV)."""
    try:
        if fmt == "json":
            x = json.loads(payload).get(x_field)
            return len(x) if isinstance(x, list) else None
        if fmt == "csv":
            row = next(csv.reader(io.StringIO(payload.decode("utf-8"))))
            return len(row) - 1 if len(row) > 1 and -len(row) <= label_column < len(row) else None
    except (ValueError, AttributeError, StopIteration, UnicodeDecodeError):
        return None
    return None
