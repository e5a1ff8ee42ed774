"""``panpriv inspect``: a readable summary of a checkpoint, a snapshots file, or an output directory.

Shows counts, positions, ledger coverage and the privacy statement — never learner state arrays
(noisy, but not useful to read) and never anything else: these files hold no records.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.errors import CheckpointError
from panpriv.streamer.io.recording import RecordingReader, is_recording
from panpriv.streamer.io.sinks import read_snapshots
from panpriv.streamer.state.checkpoint import MANIFEST_NAME, read_manifest


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
    checkpoint = read_manifest(path)
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
    lines = [
        f"snapshots {path}: {len(records)} records",
        f"  last: sequence {last['sequence']}, {last['records']:,} records, created {last['created']}, "
        f"{len(last['params'])} parameters",
        f"  record counts never decrease: {'yes' if monotone else 'NO'}",
    ]
    scored = [r for r in records if "holdout" in r]
    if scored:  # --holdout: each snapshot scored on the user's public hold-out file (panpriv.streamer.serving.holdout)
        lines.append(f"  hold-out scores (public file, {int(scored[-1]['holdout']['records']):,} records):")
        lines.extend(
            f"    sequence {r['sequence']} ({r['records']:,} records): "
            + ", ".join(f"{k} {v:.4f}" for k, v in sorted(r["holdout"].items()) if k != "records")
            for r in scored[-10:]
        )
    lines.append("  privacy: " + report.statement())
    return "\n".join(lines)


def describe_recording(path: Path) -> str:
    reader = RecordingReader(path)
    return "\n".join(
        [
            f"recording {path}: {reader.count():,} messages from {reader.header['source']}",
            f"  recorded {reader.header['created']}; keys: {', '.join(reader.keys)}",
        ]
    )


# -- JSON (panpriv inspect --json) ----------------------------------------------------------------


def summary(path: Path) -> dict[str, object]:
    """The same summary as :func:`describe`, as one JSON-ready object (``checkpoint``,
    ``snapshots`` and/or ``recording`` keys), for scripts; no learner state, no parameters."""
    if path.is_dir():
        manifest, snapshots = path / "checkpoints" / MANIFEST_NAME, path / "snapshots.jsonl"
        found: dict[str, object] = {}
        if manifest.exists():
            found["checkpoint"] = checkpoint_summary(manifest)
        if snapshots.exists():
            found["snapshots"] = snapshots_summary(snapshots)
        if not found:
            raise CheckpointError(f"{path} holds neither checkpoints/{MANIFEST_NAME} nor snapshots.jsonl")
        return found
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if is_recording(path):
        reader = RecordingReader(path)
        return {"recording": {"path": str(path), "messages": reader.count(), "source": reader.header["source"],
                              "created": reader.header["created"], "keys": list(reader.keys)}}
    if path.suffix == ".jsonl":
        return {"snapshots": snapshots_summary(path)}
    return {"checkpoint": checkpoint_summary(path)}


def checkpoint_summary(path: Path) -> dict[str, object]:
    checkpoint = read_manifest(path)
    ledger = PrivacyLedger.from_dict(checkpoint.ledger)
    report = dataclasses.replace(ledger.report(), records=checkpoint.records)
    return {
        "path": str(path), "sequence": checkpoint.sequence, "created": _time(checkpoint.created),
        "finished": checkpoint.finished, "learner": checkpoint.learner, "instance": checkpoint.instance,
        "records": checkpoint.records, "snapshots": checkpoint.snapshots, "rejects": dict(sorted(checkpoint.rejects.items())),
        "config_hash": checkpoint.config_hash, "positions": dict(sorted(checkpoint.positions.items())),
        "coverage": {key: [[s.start, s.stop, len(s.uses)] for s in ledger.coverage(key)] for key in sorted(ledger.sources)},
        "privacy": report.to_dict(),
    }


def snapshots_summary(path: Path) -> dict[str, object]:
    records = read_snapshots(path)
    if not records:
        return {"path": str(path), "count": 0}
    last = records[-1]
    counts = [r["records"] for r in records]
    return {
        "path": str(path), "count": len(records), "last_sequence": last["sequence"], "last_records": last["records"],
        "last_created": last["created"], "parameters": len(last["params"]),
        "records_never_decrease": all(a <= b for a, b in zip(counts, counts[1:], strict=False)),
        "privacy": last["privacy"],
        "holdout": [{"sequence": r["sequence"], "records": r["records"], **r["holdout"]} for r in records if "holdout" in r],
    }
