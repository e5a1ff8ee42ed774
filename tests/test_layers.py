"""The layering rule, checked on the source: ``streamer → protocols → accounting``, nothing runs
back up. ``accounting`` is pure privacy math, ``protocols`` the mechanisms without I/O, ``streamer``
the service; a lower layer importing a higher one (even lazily, inside a function) fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("accounting", "protocols", "streamer")


def imported_modules(path: Path) -> set[str]:
    """Dotted names of the modules ``path`` imports anywhere (module level or inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imported_packages(path: Path) -> set[str]:
    """The layers (``accounting``, ``protocols``, ``streamer``) that ``path`` imports, as
    ``panpriv.<layer>``, anywhere (module level or inside functions)."""
    parts = (name.split(".") for name in imported_modules(path))
    return {p[1] for p in parts if len(p) > 1 and p[0] == "panpriv" and p[1] in LAYERS}


@pytest.mark.parametrize("layer", LAYERS)
def test_no_module_imports_a_higher_layer(layer: str) -> None:
    higher = set(LAYERS[LAYERS.index(layer) + 1:])
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) & higher)
        for path in sorted((ROOT / layer).rglob("*.py"))
        if imported_packages(path) & higher
    }
    assert offenders == {}, f"{layer} must not import {sorted(higher)}: {offenders}"


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from panpriv.streamer.cli import main\n    import panpriv.protocols.base\n")
    assert imported_packages(module) == {"streamer", "protocols"}


def test_nothing_imports_the_layers_by_their_folder_names() -> None:
    """The installed names are ``panpriv.accounting`` etc.; ``import streamer`` would load a second
    copy of a module from the repository root (or another distribution's ``streamer``)."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(n for n in imported_modules(path) if n.split(".")[0] in LAYERS)
        for folder in (*LAYERS, "panpriv", "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not (ROOT / folder).is_symlink() and any(n.split(".")[0] in LAYERS for n in imported_modules(path))
    }
    assert offenders == {}
