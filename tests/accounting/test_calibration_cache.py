"""The file cache of tight PVEC calibrations: same answer, fast, and never a weaker guarantee."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from panpriv.accounting import binomial, calibration_cache

ARGUMENTS = (20_000, 20, 1.0, 1e-6, 1.0)
"""A search of some seconds whose answer is inside (0, 1/2): the cache must beat it by far."""
QUICK = (2_000, 20, 1.0, 1e-6, 1.0)
"""A search of about a second (its p is 1/2), for the tests of what a cache may hold."""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(calibration_cache.CACHE_ENV, str(tmp_path))
    binomial.tight_parameters.cache_clear()
    yield tmp_path
    binomial.tight_parameters.cache_clear()


def _entries(cache_dir: Path) -> dict:
    return json.loads((cache_dir / "pvec-tight.json").read_text())


def test_a_cached_calibration_is_the_searched_one_and_fast(cache_dir: Path) -> None:
    start = time.perf_counter()
    searched = binomial.tight_parameters(*ARGUMENTS)
    search_seconds = time.perf_counter() - start
    (entry,) = _entries(cache_dir).values()
    assert (entry["b"], entry["p"]) == (searched.b, searched.p)
    binomial.tight_parameters.cache_clear()
    start = time.perf_counter()
    cached = binomial.tight_parameters(*ARGUMENTS)
    cached_seconds = time.perf_counter() - start
    assert cached == searched  # the same (g, b, p) and the same delta bound, recomputed
    assert cached_seconds < search_seconds / 3


def test_an_entry_that_does_not_meet_delta_is_searched_again(cache_dir: Path) -> None:
    """An edited entry (too little noise) must cost a search, never the guarantee."""
    searched = binomial.tight_parameters(*QUICK)
    entries = _entries(cache_dir)
    (key,) = entries
    entries[key]["b"] = max(1, searched.b // 4)
    entries[key]["p"] = 0.5
    (cache_dir / "pvec-tight.json").write_text(json.dumps(entries))
    binomial.tight_parameters.cache_clear()
    again = binomial.tight_parameters(*QUICK)
    assert again == searched and again.delta <= QUICK[3]
    assert _entries(cache_dir)[key]["b"] == searched.b  # the search rewrote it


@pytest.mark.parametrize(
    "content", ["not json", "[1, 2]", json.dumps({"x": "y"}), "BROKEN_ENTRY"]
)
def test_unreadable_or_malformed_caches_are_ignored(cache_dir: Path, content: str) -> None:
    expected = binomial.tight_parameters(*QUICK)
    if content == "BROKEN_ENTRY":
        (key,) = _entries(cache_dir)
        content = json.dumps({key: {"b": "14", "p": 2.0, "log_order_m1": None}})
    (cache_dir / "pvec-tight.json").write_text(content)
    binomial.tight_parameters.cache_clear()
    assert binomial.tight_parameters(*QUICK) == expected


def test_disabled_or_unwritable_cache_costs_only_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(calibration_cache.CACHE_ENV, "off")
    assert calibration_cache.cache_file() is None
    binomial.tight_parameters.cache_clear()
    expected = binomial.tight_parameters(*QUICK)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(calibration_cache.CACHE_ENV, str(blocker / "below-a-file"))
    binomial.tight_parameters.cache_clear()
    assert binomial.tight_parameters(*QUICK) == expected
    binomial.tight_parameters.cache_clear()


def test_default_location_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(calibration_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert calibration_cache.cache_file() == tmp_path / "panpriv" / "pvec-tight.json"
