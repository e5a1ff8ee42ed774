"""Checkpoint integrity: a SHA-256 over the canonical content, and a strict schema check.

A checkpoint decides what a resumed run believes (the learner's state, which records are already
used, the privacy ledger); a silently altered one resumes the wrong state. :func:`seal` adds
``"sha256"``, the SHA-256 of the manifest's canonical JSON (sorted keys, no whitespace, ASCII, the
``sha256`` key itself left out), and :func:`open_sealed` checks it before anything is read: any
change to the content (a flipped bit, a truncation, an edit) is refused with
:class:`~panpriv.streamer.errors.CheckpointError`. A change that leaves the parsed content identical (e.g.
``1e-05`` ↔ ``1E-05``) is harmless by construction, since only the parsed content is used.

The digest protects against corruption, not against an attacker who can write the file (they can
recompute it). Manifests written before the digest existed (no ``sha256`` key) still load, with a
warning. :func:`check_schema` then refuses unknown keys and values of the wrong type or sign
(negative positions or counts), which a checksum-less manifest is otherwise trusted for.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any

from panpriv.accounting.errors import AccountingError
from panpriv.accounting.ledger import PrivacyLedger
from panpriv.streamer.errors import CheckpointError

log = logging.getLogger("panpriv.checkpoint")

DIGEST_KEY = "sha256"

TOP_LEVEL_KEYS = frozenset({
    "schema_version", "sequence", "created", "finished", "config_hash", "privacy_config", "instance",
    "learner", "positions", "ledger", "rejects", "records", "snapshots", "extra", DIGEST_KEY,
})
LEARNER_KEYS = frozenset({"name", "config", "state"})


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes the digest is computed over: ``body`` without its digest, canonical JSON."""
    content = {k: v for k, v in body.items() if k != DIGEST_KEY}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def seal(text: str) -> str:
    """The manifest ``text`` (a JSON object) with its ``sha256`` added."""
    body = json.loads(text)
    body[DIGEST_KEY] = hashlib.sha256(canonical(body)).hexdigest()
    return json.dumps(body, sort_keys=True, allow_nan=False)


def open_sealed(raw: bytes, where: str) -> dict[str, Any]:
    """Parse a manifest, verify its digest and schema; return its content (without the digest).

    Raises :class:`CheckpointError` naming ``where`` and the problem for anything else: not
    UTF-8, not JSON, not an object, a digest mismatch, a schema violation.
    """
    body = parse_object(raw, where, "a panpriv checkpoint", _FIX)
    if body.get(DIGEST_KEY) is None:
        log.warning("%s has no checksum (written by an older panpriv); its content cannot be verified", where)
    elif not digest_matches(body):
        raise CheckpointError(f"{where} is corrupted: its content does not match its SHA-256 checksum; {_FIX}")
    check_schema(body, where)
    body.pop(DIGEST_KEY, None)
    return body


def digest_matches(body: dict[str, Any]) -> bool:
    """``body``'s ``sha256`` is the digest of the rest of it."""
    return body.get(DIGEST_KEY) == hashlib.sha256(canonical(body)).hexdigest()


def parse_object(raw: bytes, where: str, what: str, fix: str) -> dict[str, Any]:
    """``raw`` as a JSON object (no NaN or infinity), or :class:`CheckpointError` saying that
    ``where`` is not ``what`` and why, then ``fix``."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise CheckpointError(f"{where} is not {what} (not UTF-8 text); {fix}") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{where} is not {what} (not valid JSON: {exc}); {fix}") from None
    if type(body) is not dict:
        raise CheckpointError(f"{where} is not {what} (a JSON {type(body).__name__}, not an object); {fix}")
    return body


_FIX = (
    "restore it from a backup, or start a new run with another --out (a resumed run must not guess "
    "which records it has learned)"
)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def check_schema(body: dict[str, Any], where: str) -> None:
    """Refuse unknown keys and wrongly typed or negative fields (module docstring)."""
    problems: list[str] = []
    unknown = set(body) - TOP_LEVEL_KEYS
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}")
    for name in ("sequence", "records", "snapshots"):
        if name in body and not _count(body[name]):
            problems.append(f"{name} must be an integer >= 0")
    if "created" in body and not (type(body["created"]) in (int, float) and math.isfinite(body["created"])):
        problems.append("created must be a finite number")
    if "finished" in body and type(body["finished"]) is not bool:
        problems.append("finished must be true or false")
    for name in ("config_hash", "instance"):
        if name in body and type(body[name]) is not str:
            problems.append(f"{name} must be a string")
    for name in ("privacy_config", "ledger", "extra"):
        if name in body and type(body[name]) is not dict:
            problems.append(f"{name} must be an object")
    for name in ("positions", "rejects"):
        if name in body:
            table = body[name]
            if type(table) is not dict or not all(_count(v) for v in table.values()):
                problems.append(f"{name} must map names to integers >= 0")
    learner = body.get("learner")
    if learner is not None:
        if type(learner) is not dict:
            problems.append("learner must be an object")
        else:
            if set(learner) != LEARNER_KEYS:
                problems.append(f"learner must have exactly the keys {sorted(LEARNER_KEYS)}")
            if type(learner.get("name")) is not str:
                problems.append("learner.name must be a string")
            for name in ("config", "state"):
                if type(learner.get(name)) is not dict:
                    problems.append(f"learner.{name} must be an object")
    if problems:
        raise CheckpointError(f"{where} is not a valid panpriv checkpoint: {'; '.join(problems)}; {_FIX}")


def check_ledger(ledger: dict[str, Any], where: str) -> None:
    """Refuse a ledger the accounting package cannot read (an unknown schema version, a malformed
    segment), with the accounting package's reason."""
    try:
        PrivacyLedger.from_dict(ledger)
    except AccountingError as exc:
        raise CheckpointError(f"{where}: its privacy ledger cannot be read ({exc}); {_FIX}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{where}: its privacy ledger is malformed ({type(exc).__name__}: {exc}); {_FIX}") from None


def _count(value: object) -> bool:
    return type(value) is int and value >= 0
