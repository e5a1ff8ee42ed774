"""A griffe extension for the API reference: the docstrings' reST cross-reference roles as links.

The docstrings are numpydoc-style with Sphinx roles (``:class:`panpriv.protocols.base.Snapshot```,
``:meth:`predict_many```, ``:data:`~FIRST_EPOCH```). mkdocstrings renders docstrings as Markdown, where
a role would show as ``:class:`` followed by code. This extension rewrites each role, once the whole
package is loaded, into an *optional* mkdocs-autorefs reference: a link when its target is rendered
somewhere on the site, the same code span (no link, no warning) when it is not — most targets are
internal modules that the reference does not document, and ``mkdocs build --strict`` must stay
quiet about them.

A role's target is resolved as Sphinx would: as written, then relative to the documented object's
class, then to its module. ``~`` shows the last component only.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>mod|class|func|meth|attr|data|obj|exc|const):`(?P<target>[^`]+)`")


class RestRoles(griffe.Extension):
    """Rewrite the reST roles of every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda match: _reference(match, obj, loader), obj.docstring.value)


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    """``obj`` and every object defined in it (aliases are left to the objects they point to)."""
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_walk(member))  # type: ignore[arg-type]
    return found


def _reference(match: re.Match[str], obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
    target = match["target"].strip()
    short = target.startswith("~")
    target = target.lstrip("~.").removesuffix("()")
    title = target.rsplit(".", 1)[-1] if short else target
    identifier = _resolve(target, obj, loader)
    return f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(title)}</code></autoref>'


def _resolve(target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
    """The first of: ``target`` itself, relative to the enclosing class, relative to the module,
    that names a loaded object; ``target`` itself when none does."""
    scopes = []
    scope: griffe.Object | None = obj
    while scope is not None:
        if scope.is_class or scope.is_module:
            scopes.append(scope.path)
        scope = scope.parent  # type: ignore[assignment]
    for candidate in [target, *(f"{path}.{target}" for path in scopes)]:
        try:
            loader.modules_collection.get_member(candidate)
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        return candidate
    return target
