"""The documentation site builds with warnings as errors (``mkdocs build --strict``: broken links
and anchors, pages missing from the menu, docstrings that do not parse), and its API reference
covers the public Python surface with the docstrings' reST roles turned into links or code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import panpriv
from panpriv.protocols.catalogue import CATALOGUE
from tests.docs.pages import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-5000:]
    return target


def reference_html(site: Path) -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in sorted((site / "reference").rglob("index.html")))


def test_every_public_name_and_every_learner_has_a_reference_entry(site: Path) -> None:
    html = reference_html(site)
    anchors = set(re.findall(r'id="(panpriv\.[\w.]+)"', html))
    public = {f"panpriv.{name}" for name in panpriv.__all__ if name != "__version__"}
    assert public <= anchors, f"in panpriv.__all__ but not in docs/reference/: {sorted(public - anchors)}"
    classes = {target.split(":")[1] for target in CATALOGUE.values()}
    documented = {anchor.rsplit(".", 1)[-1] for anchor in anchors}
    assert classes <= documented, f"catalogued learners missing from docs/reference/learners.md: {sorted(classes - documented)}"
    assert "panpriv.protocols.catalogue" in anchors and "panpriv.protocols.base.Learner" in anchors


def test_the_reference_renders_the_docstrings_sections_and_roles(site: Path) -> None:
    html = reference_html(site)
    assert not re.search(r":(mod|class|func|meth|attr|data|obj|exc):`", html), "a reST role was rendered as text"
    assert 'href="#panpriv.protocols.base.Learner.predict_many"' in html, "a role whose target is documented is a link"
    learners = (site / "reference" / "learners" / "index.html").read_text(encoding="utf-8")
    section = learners[learners.index('id="panpriv.PanPrivateACSA"'):]
    for parameter in ("epsilon", "delta", "horizon", "radius", "feature_bound"):
        assert f"<code>{parameter}</code>" in section, f"PanPrivateACSA's parameter table lacks {parameter}"


def test_the_site_points_users_at_no_internal_material(site: Path) -> None:
    """The project's seed papers and shared folder exist only on the team's side; papers are cited
    by author and year (docs/references.md)."""
    for page in site.rglob("*.html"):
        text = re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))
        assert "shared/" not in text, page
        assert not re.search(r"\b(?:seeds?|papers?|paper)\s+\(?0{2}[0-4]\b", text, re.I), page
