"""Checkpoint integrity: a SHA-256 over the canonical content, and a strict schema check.

A checkpoint decides what a resumed run believes (the learner's state, which records are already
used, the privacy ledger); a silently altered one resumes the wrong state. :func:`seal_document`
adds ``"sha256"``, the SHA-256 of the document's canonical JSON (sorted keys, no whitespace,
ASCII, the ``sha256`` key itself left out), and :func:`open_document` checks it before anything is
read: any change to the content (a flipped bit, a truncation, an edit) is refused with
:class:`~panpriv.streamer.errors.CheckpointError`. A change that leaves the parsed content identical (e.g.
``1e-05`` ↔ ``1E-05``) is harmless by construction, since only the parsed content is used.

The digest protects against corruption, not against an attacker who can write the file (they can
recompute it). Manifests written before the digest existed (no ``sha256`` key) still load, with a
warning. :func:`check_schema` then refuses unknown keys and values of the wrong type or sign
(negative positions or counts), which a checksum-less manifest is otherwise trusted for.

Arrays never pass through Python strings. A document's numpy arrays (anywhere in it) are written
as ``{"ndarray": {"dtype", "shape", "base64"}}`` — raw little-endian bytes, so a resumed state is
bit-identical — but their base64 text is computed straight into the :class:`OwnedBytes` buffer
that holds the sealed document (:mod:`panpriv.streamer.state.owned_bytes`): the JSON text around
them is made with placeholders (``json`` sees only counters, positions, the ledger, the
configuration), and the digest is fed the pieces in order. Reading does the reverse: the base64
values are located in the file's bytes, the rest is parsed with placeholders, and each array is
decoded from the buffer. The caller wipes the buffer. So no copy of a serialised state is left in
the process's freed memory (tests/streamer/test_persisted_states.py). This is the one sealed
format: the service's checkpoint and the roles' state files use it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from panpriv.accounting.errors import AccountingError
from panpriv.accounting.ledger import PrivacyLedger
from panpriv.streamer.errors import CheckpointError
from panpriv.streamer.state.owned_bytes import (
    OwnedBytes,
    array_bytes,
    b64_length,
    b64decode_into,
    b64decoded_length,
    b64encode_into,
)

log = logging.getLogger("panpriv.checkpoint")

DIGEST_KEY = "sha256"

TOP_LEVEL_KEYS = frozenset({
    "schema_version", "sequence", "created", "finished", "config_hash", "privacy_config", "instance",
    "learner", "positions", "ledger", "rejects", "records", "snapshots", "extra", DIGEST_KEY,
})
LEARNER_KEYS = frozenset({"name", "config", "state"})


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes the digest is computed over: ``body`` without its digest, canonical JSON (for a
    document without arrays; :func:`seal_document` computes the same over one with arrays)."""
    content = {k: v for k, v in body.items() if k != DIGEST_KEY}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


@dataclass(frozen=True)
class _Skeleton:
    """A document with every array replaced by a placeholder string, and the arrays in order."""

    body: dict[str, Any]
    arrays: list[np.ndarray]
    tokens: list[str]

    def pieces(self, **dump: Any) -> Iterator[str | int]:
        """``json.dumps(body, **dump)`` as text pieces and, where a placeholder stood, the index of
        its array (each placeholder must occur exactly once).

        Placeholders are found by one pattern compiled once (:data:`_QUOTED_TOKEN`), each match
        kept only if it is one of this document's: a pattern built per document from its random
        nonce missed ``re``'s cache and was compiled at every checkpoint (sealing a pan-acsa state
        at d = 20 took 0.59 ms of CPU, now 0.41; issue 37), and as an alternation of the
        placeholders it took placeholder 1 for the start of placeholder 10, refusing a document
        of more than ten arrays."""
        text = json.dumps(self.body, ensure_ascii=True, allow_nan=False, **dump)
        where = {json.dumps(token)[1:-1]: k for k, token in enumerate(self.tokens)}
        parts: list[str | int] = []
        at = 0
        for match in _QUOTED_TOKEN.finditer(text) if where else ():
            k = where.get(match.group())
            if k is not None:
                parts += [text[at : match.start()], k]
                at = match.end()
        parts.append(text[at:])
        if sorted(p for p in parts[1::2]) != list(range(len(where))):
            raise CheckpointError("internal error: a placeholder of the sealed document occurs twice or not at all")
        yield from parts


_QUOTED_TOKEN = re.compile(r"\\u0000[0-9a-f]*:[0-9]+")
"""A placeholder (``"\\x00<nonce hex>:<index>"``) as it appears inside a JSON string."""


def _skeleton(body: Any, arrays: list[np.ndarray], tokens: list[str], nonce: str, copies: list[np.ndarray]) -> Any:
    """``body`` with every array replaced by a placeholder (appended to ``arrays`` and ``tokens``
    in visiting order); the little-endian contiguous copies it had to make go to ``copies``."""
    if isinstance(body, np.ndarray):
        if body.dtype.hasobject:
            raise CheckpointError("the state holds an object array; only numeric arrays can be checkpointed")
        little = np.ascontiguousarray(body, dtype=body.dtype.newbyteorder("<"))
        if little is not body and not np.shares_memory(little, body):
            copies.append(little)
        token = f"\x00{nonce}:{len(arrays)}"
        arrays.append(little)
        tokens.append(token)
        return {"ndarray": {"dtype": little.dtype.str, "shape": list(little.shape), "base64": token}}
    if isinstance(body, dict):
        return {k: _skeleton(v, arrays, tokens, nonce, copies) for k, v in body.items()}
    if isinstance(body, (list, tuple)):
        return [_skeleton(v, arrays, tokens, nonce, copies) for v in body]
    return body


def seal_document(body: dict[str, Any]) -> OwnedBytes:
    """``body`` (JSON-ready values and numpy arrays) as the bytes of a sealed JSON document with its
    ``sha256`` added, in a buffer the caller wipes (module docstring)."""
    arrays: list[np.ndarray] = []
    tokens: list[str] = []
    copies: list[np.ndarray] = []  # byte-swapped or contiguous copies made here: zeroed below
    try:
        skeleton = _Skeleton(_skeleton({k: v for k, v in body.items() if k != DIGEST_KEY}, arrays, tokens,
                                       secrets.token_hex(8), copies), arrays, tokens)
        digest = hashlib.sha256()
        for piece in skeleton.pieces(sort_keys=True, separators=(",", ":")):
            if isinstance(piece, str):
                digest.update(piece.encode("ascii"))
            else:
                with OwnedBytes(b64_length(arrays[piece].nbytes)) as text:
                    b64encode_into(array_bytes(arrays[piece]), text.array)
                    digest.update(text.view())
        skeleton.body[DIGEST_KEY] = digest.hexdigest()
        pieces = list(skeleton.pieces(sort_keys=True))
        size = sum(len(p) if isinstance(p, str) else b64_length(arrays[p].nbytes) for p in pieces)
        sealed = OwnedBytes(size)
        at = 0
        for piece in pieces:
            if isinstance(piece, str):
                encoded = piece.encode("ascii")
                sealed.array[at : at + len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
                at += len(encoded)
            else:
                length = b64_length(arrays[piece].nbytes)
                b64encode_into(array_bytes(arrays[piece]), sealed.array[at : at + length])
                at += length
        return sealed
    finally:
        for little in copies:
            little.fill(0)


_BASE64_VALUE = re.compile(rb'"base64": "([A-Za-z0-9+/=]*)"')


def open_document(raw: OwnedBytes, where: str) -> dict[str, Any]:
    """Parse the sealed document in ``raw``, verify its digest and return its content (without the
    digest), arrays decoded into numpy arrays in native byte order. ``raw`` stays the caller's to
    wipe. Raises :class:`CheckpointError` naming ``where`` and the problem for anything else: not
    UTF-8, not JSON, not an object, an array that does not decode, a digest mismatch."""
    nonce = secrets.token_hex(8)
    spans: list[tuple[int, int]] = []
    parts: list[bytes] = []
    previous = 0
    for match in _BASE64_VALUE.finditer(raw.view()):
        start, stop = match.span(1)
        parts += [bytes(raw.view(previous, start)), json.dumps(f"\x00{nonce}:{len(spans)}")[1:-1].encode("ascii")]
        spans.append((start, stop))
        previous = stop
    parts.append(bytes(raw.view(previous)))
    body = parse_object(b"".join(parts), where, "a panpriv checkpoint", _FIX)
    tokens = [f"\x00{nonce}:{k}" for k in range(len(spans))]
    found = list(_placeholders(body, set(tokens)))
    if sorted(found) != sorted(tokens):  # as text: placeholder 10 sorts before placeholder 2
        raise CheckpointError(f"{where} is not a valid panpriv checkpoint: an array value out of place; {_FIX}")
    digest = body.get(DIGEST_KEY)
    if digest is None:
        log.warning("%s has no checksum (written by an older panpriv); its content cannot be verified", where)
    else:
        skeleton = _Skeleton({k: v for k, v in body.items() if k != DIGEST_KEY}, [], tokens)
        check = hashlib.sha256()
        for piece in skeleton.pieces(sort_keys=True, separators=(",", ":")):
            check.update(piece.encode("ascii") if isinstance(piece, str) else raw.view(*spans[piece]))
        if digest != check.hexdigest():
            raise CheckpointError(f"{where} is corrupted: its content does not match its SHA-256 checksum; {_FIX}")
    body.pop(DIGEST_KEY, None)
    try:
        return _with_arrays(body, raw, spans, nonce)
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{where} is not a valid panpriv checkpoint (an array does not decode: {exc}); {_FIX}") from None


def _placeholders(body: Any, tokens: set[str]) -> Iterator[str]:
    """The placeholders of ``body`` that stand where an array's base64 belongs."""
    if isinstance(body, dict):
        spec = body.get("ndarray") if len(body) == 1 else None
        if isinstance(spec, dict) and spec.get("base64") in tokens:
            yield spec["base64"]
            return
        for value in body.values():
            yield from _placeholders(value, tokens)
    elif isinstance(body, list):
        for value in body:
            yield from _placeholders(value, tokens)


def _with_arrays(body: Any, raw: OwnedBytes, spans: list[tuple[int, int]], nonce: str) -> Any:
    if isinstance(body, dict):
        spec = body.get("ndarray") if len(body) == 1 else None
        if isinstance(spec, dict) and isinstance(spec.get("base64"), str) and spec["base64"].startswith(f"\x00{nonce}:"):
            start, stop = spans[int(spec["base64"].rsplit(":", 1)[1])]
            text = raw.array[start:stop]
            dtype = np.dtype(spec["dtype"])
            if dtype.hasobject:
                raise ValueError("an object array")
            decoded = OwnedBytes(b64decoded_length(text))
            try:
                b64decode_into(text, decoded.array)
                array = np.empty([int(n) for n in spec["shape"]], dtype=dtype.newbyteorder("="))
                if array.nbytes != decoded.size:
                    raise ValueError(f"{decoded.size} bytes for shape {spec['shape']} of {spec['dtype']}")
                np.copyto(array.reshape(-1), decoded.array.view(dtype), casting="equiv")
                return array
            finally:
                decoded.wipe()
        return {k: _with_arrays(v, raw, spans, nonce) for k, v in body.items()}
    if isinstance(body, list):
        return [_with_arrays(v, raw, spans, nonce) for v in body]
    return body


def digest_matches(body: dict[str, Any]) -> bool:
    """``body``'s ``sha256`` is the digest of the rest of it (a document without arrays)."""
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
