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
    module.write_text("def f():\n    from panpriv.streamer.commands.cli import main\n    import panpriv.protocols.base\n")
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


def streamer_import_graph() -> dict[str, set[str]]:
    """Module → the ``panpriv.streamer`` modules it imports (anywhere in it), by dotted name
    relative to ``panpriv.streamer`` (a package is named by its folder)."""
    folder = ROOT / "streamer"
    modules = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("panpriv.streamer"):
                base = node.module.removeprefix("panpriv.streamer").lstrip(".")  # type: ignore[union-attr]
                targets = [f"{base}.{a.name}".lstrip(".") for a in node.names]
                targets = [t if t in modules else base for t in targets]
            elif isinstance(node, ast.Import):
                targets = [a.name.removeprefix("panpriv.streamer.") for a in node.names if a.name.startswith("panpriv.streamer.")]
            else:
                continue
            graph[name].update(t for t in map(known, targets) if t and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_between_streamer_modules() -> None:
    assert circles(streamer_import_graph()) == []


FOUNDATIONS = {"config", "errors", "ioerrors", "arg_types", "datasets", "datasets.adult"}
"""Root modules every folder may use; they import no folder above ``io``."""


def test_streamer_folders_import_one_way() -> None:
    """The folders (``runtime``, ``budget``, ``sources``, ``io``, …) form a graph without circles,
    so a folder tells a reader which lines can depend on it."""
    folders: dict[str, set[str]] = {}
    for module, targets in streamer_import_graph().items():
        if module in FOUNDATIONS or "." not in module and module not in {"esa", "scaleout"}:
            continue
        folder = module.split(".")[0]
        folders.setdefault(folder, set()).update(
            t.split(".")[0] for t in targets if t not in FOUNDATIONS and t.split(".")[0] != folder
        )
    assert circles(folders) == [], folders


def test_the_circle_check_finds_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
