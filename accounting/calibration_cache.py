"""A file cache of tight PVEC calibrations, so a learner's set-up takes milliseconds after the first.

:func:`panpriv.accounting.binomial.tight_parameters` searches (b, p) with a numerical accountant: 1–6 s
per (n, d, ε, δ, γ). Shuffle learners build one encoder per round size, and every restart builds
them again, so the results are kept in one JSON file: ``$PANPRIV_CACHE_DIR/pvec-tight.json``, else
``$XDG_CACHE_HOME/panpriv/…``, else ``~/.cache/panpriv/…``. ``PANPRIV_CACHE_DIR=off`` (or empty)
disables it.

What is stored is public: the calibration's arguments and its (g, b, p) and the Rényi order at
which its δ bound was found. No data, no randomness.

A cached entry is a search result, not a guarantee: the caller recomputes the δ bound at the
stored parameters and order (one evaluation of the accountant, ~10–40 ms) and uses the entry only
if that bound meets the target. A stale, corrupted or edited file can therefore cost a new search,
never a weaker guarantee. Writing is best-effort (an unwritable cache only costs time) and atomic
(a temporary file renamed over the old one); concurrent writers may drop each other's newest
entry, which again only costs a later search.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "cache_file", "load_entry", "store_entry"]

CACHE_ENV = "PANPRIV_CACHE_DIR"
_FILE_NAME = "pvec-tight.json"
_MAX_ENTRIES = 4096  # oldest entries are dropped beyond this (a cache, not a record)

_log = logging.getLogger(__name__)


def cache_file() -> Path | None:
    """Where the cache lives, or None when disabled (``PANPRIV_CACHE_DIR=off`` or empty)."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return None if configured.strip() in ("", "off") else Path(configured) / _FILE_NAME
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "panpriv" / _FILE_NAME


def load_entry(key: str) -> dict[str, Any] | None:
    """The stored entry for ``key``, or None (absent, disabled, unreadable or malformed file)."""
    entries = _read(cache_file())
    entry = entries.get(key)
    return entry if isinstance(entry, dict) else None


def store_entry(key: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` under ``key`` (best-effort: a failure is logged at debug level only)."""
    path = cache_file()
    if path is None:
        return
    entries = _read(path)
    entries.pop(key, None)
    entries[key] = entry
    while len(entries) > _MAX_ENTRIES:
        entries.pop(next(iter(entries)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".pvec-", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(entries, out)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        _log.debug("calibration cache not written (%s): %s", path, exc)


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        if not isinstance(exc, FileNotFoundError):
            _log.debug("calibration cache ignored (%s): %s", path, exc)
        return {}
    return entries if isinstance(entries, dict) else {}
