"""``panpriv inspect``: a readable summary of a checkpoint, a snapshots file, or an output directory.

Shows counts, positions, ledger coverage and the privacy statement — never learner state arrays
(noisy, but not useful to read) and never anything else: these files hold no records.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from accounting.ledger import PrivacyLedger, PrivacyReport
from streamer.checkpoint import MANIFEST_NAME, Checkpoint
from streamer.errors import CheckpointError
from streamer.recording import RecordingReader, is_recording
from streamer.sinks import read_snapshots


def describe(path: Path) -> str:
    """The summary of ``path`` (a directory written by ``panpriv run``, or one of its files)."""
    if path.is_dir():
        parts = []
        manifest = path / "checkpoints" / MANIFEST_NAME
        snapshots = path / "snapshots.jsonl"
        if manifest.exists():
            parts.append(describe_checkpoint(manifest))
        if snapshots.exists():
            parts.append(describe_snapshots(snapshots))
        if not parts:
            raise CheckpointError(f"{path} holds neither checkpoints/{MANIFEST_NAME} nor snapshots.jsonl")
        return "\n\n".join(parts)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if is_recording(path):
        return describe_recording(path)
    if path.suffix == ".jsonl":
        return describe_snapshots(path)
    return describe_checkpoint(path)


def _time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


def describe_checkpoint(path: Path) -> str:
    checkpoint = Checkpoint.from_json(path.read_text(encoding="utf-8"), where=str(path))
    ledger = PrivacyLedger.from_dict(checkpoint.ledger)
    report = dataclasses.replace(ledger.report(), records=checkpoint.records)
    lines = [
        f"checkpoint {path}",
        f"  sequence {checkpoint.sequence}, written {_time(checkpoint.created)}"
        + (" (final: the source was exhausted)" if checkpoint.finished else ""),
        f"  learner {checkpoint.learner} (instance {checkpoint.instance}), {checkpoint.records:,} records learned, "
        f"{checkpoint.snapshots} snapshots released",
        "  rejected: " + (", ".join(f"{k} {v:,}" for k, v in sorted(checkpoint.rejects.items())) or "none"),
        f"  config hash {checkpoint.config_hash[:16]}…",
        "  positions and ledger coverage (positions used, and how many times):",
    ]
    for key in sorted(set(checkpoint.positions) | set(ledger.sources)):
        segments = ledger.coverage(key)
        covered = ", ".join(f"[{s.start}, {s.stop}) x{len(s.uses)}" for s in segments[:4])
        more = f", … ({len(segments)} segments)" if len(segments) > 4 else ""
        lines.append(f"    {key}: next {checkpoint.positions.get(key, '-')}; {covered or 'nothing charged'}{more}")
    lines.append("  privacy (this run's own ledger): " + report.statement())
    lines.append(
        "  other runs over the same records (other --out, groups, replays, deleted checkpoints) compose with this "
        "one in the budget store: `panpriv budget`"
    )
    return "\n".join(lines)


def describe_snapshots(path: Path) -> str:
    records = read_snapshots(path)
    if not records:
        return f"snapshots {path}: empty"
    last = records[-1]
    counts = [r["records"] for r in records]
    monotone = all(a <= b for a, b in zip(counts, counts[1:]))
    report = PrivacyReport.from_dict(last["privacy"])
    return "\n".join(
        [
            f"snapshots {path}: {len(records)} records",
            f"  last: sequence {last['sequence']}, {last['records']:,} records, created {last['created']}, "
            f"{len(last['params'])} parameters",
            f"  record counts never decrease: {'yes' if monotone else 'NO'}",
            "  privacy: " + report.statement(),
        ]
    )


def describe_recording(path: Path) -> str:
    reader = RecordingReader(path)
    return "\n".join(
        [
            f"recording {path}: {reader.count():,} messages from {reader.header['source']}",
            f"  recorded {reader.header['created']}; keys: {', '.join(reader.keys)}",
        ]
    )
