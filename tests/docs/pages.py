"""Reading the documentation's pages and their code blocks, for the tests that hold them to the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """Every Markdown page of the site, and the README."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def code_blocks(path: Path, language: str, after: str | None = None) -> list[str]:
    """The ``language`` code blocks of ``path`` (from the heading line ``after`` on, if given)."""
    text = path.read_text(encoding="utf-8")
    if after is not None:
        text = text[text.index(after):]
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def panpriv_commands(block: str) -> list[list[str]]:
    """The ``panpriv`` command lines of a shell block, as argument lists without the program name:
    continuation lines joined, comments, a trailing ``&`` and leading ``VAR=value`` dropped,
    ``<id>`` filled in."""
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line.replace("<id>", "0123"), comments=True)
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            words.pop(0)
        if words and words[-1] == "&":
            words.pop()
        if words and Path(words[0]).name == "panpriv":
            commands.append(words[1:])
    return commands
