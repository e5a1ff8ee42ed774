"""The README and the documentation pages: one copy of each section (a mangled edit that pasted a
document into itself — it happened once, 420 lines — shows as a repeated heading), a README that
fits on a screen or two and links every page of the documentation, and no page that points users
at the team's internal material."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import yaml

from tests.docs.pages import DOCS, ROOT, pages

README = ROOT / "README.md"
PAGES = [page.relative_to(ROOT).as_posix() for page in pages()]


@pytest.mark.parametrize("document", PAGES)
def test_no_section_appears_twice(document: str) -> None:
    text = re.sub(r"^```.*?^```", "", (ROOT / document).read_text(encoding="utf-8"), flags=re.S | re.M)  # code comments start with '#'
    headings = [line for line in text.splitlines() if re.match(r"#{1,3} ", line)]
    repeated = [heading for heading, count in Counter(headings).items() if count > 1]
    assert not repeated, repeated


def test_the_readme_fits_a_screen_or_two() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) < 250


def site_pages() -> set[str]:
    """Every page of the site's menu (mkdocs.yml's nav), relative to docs/."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)  # the toc slugify hook
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)

    def walk(entry: object) -> set[str]:
        if isinstance(entry, str):
            return {entry}
        if isinstance(entry, dict):
            return set().union(*(walk(value) for value in entry.values()))
        if isinstance(entry, list):
            return set().union(*(walk(value) for value in entry))
        return set()

    return walk(config["nav"])


def test_the_readme_links_every_page_of_the_documentation() -> None:
    """What the README no longer says in full, it links: every page of the site's menu (the API
    reference through its index page, the changelog as CHANGELOG.md)."""
    links = set(re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", README.read_text(encoding="utf-8")))
    documented = {f"docs/{page}" for page in site_pages()
                  if page not in ("changelog.md", "index.md") and not (page.startswith("reference/") and page != "reference/index.md")}
    assert documented <= links, f"pages the README does not link: {sorted(documented - links)}"
    assert all((ROOT / link).is_file() for link in links), links
    assert "](CHANGELOG.md)" in README.read_text(encoding="utf-8")


def test_every_page_is_in_the_menu() -> None:
    on_disk = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")} - {"img/report.md"}
    assert on_disk == site_pages()


SEED = re.compile(r"(?<![\d.,/x×_-])0{2}[0-4](?![\d.,])")
"""A seed paper's number (000–004) standing alone; not the digits of 0.001, 1,000 or a hash."""


@pytest.mark.parametrize("document", PAGES + ["CHANGELOG.md", "deploy/README.md"])
def test_no_page_points_users_at_internal_material(document: str) -> None:
    """The seed papers and the shared folder exist only on the team's side: papers are cited by
    author and year (docs/references.md)."""
    text = (ROOT / document).read_text(encoding="utf-8")
    assert "shared/" not in text
    assert not SEED.findall(text), [text[max(0, m.start() - 40): m.end() + 40] for m in SEED.finditer(text)]


PATH = re.compile(r"`((?:accounting|protocols|streamer|tests|benchmarks|deploy|docs|panpriv)/[\w./-]*)`")
"""A repository path written as code: ``streamer/runtime/processor.py``, ``tests/esa/``."""


@pytest.mark.parametrize("document", PAGES + ["CHANGELOG.md", "deploy/README.md"])
def test_every_repository_path_a_page_names_exists(document: str) -> None:
    """Modules move (streamer/ was reorganised into folders): a page that names a file names one
    that is there."""
    text = (ROOT / document).read_text(encoding="utf-8")
    missing = sorted({path for path in PATH.findall(text) if "<" not in path and not (ROOT / path.rstrip("/")).exists()})
    assert not missing, missing
