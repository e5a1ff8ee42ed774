"""The README and docs/privacy.md keep one copy of each section: a mangled edit that pasted a
document into itself (it happened once, 420 lines) shows as a repeated top-level heading."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("document", ["README.md", "docs/privacy.md"])
def test_no_top_level_section_appears_twice(document: str) -> None:
    headings = [line for line in (ROOT / document).read_text().splitlines() if line.startswith("## ")]
    repeated = [heading for heading, count in Counter(headings).items() if count > 1]
    assert headings and not repeated, repeated
