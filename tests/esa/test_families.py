"""The E-S-A family registry (streamer/esa/families.py) is the one list of the learners that run in
three roles, and the roles use it instead of testing for learner names or classes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from panpriv.protocols.catalogue import learner_names, load_learner
from panpriv.streamer.esa.families import FAMILIES, UnknownFamilyError, analyzer_for_format, family, learners_with

ROOT = Path(__file__).resolve().parents[2]


def test_every_family_is_a_catalogued_learner_with_an_analyzer_and_a_client() -> None:
    assert set(FAMILIES) <= set(learner_names())
    formats = [entry.checkpoint_format for entry in FAMILIES.values()]
    for name, entry in FAMILIES.items():
        assert entry.learner == name and entry.reject_reasons and entry.checkpoint_format
        assert analyzer_for_format(entry.checkpoint_format) is entry.analyzer_class()
    assert len(set(formats)) == len({entry.analyzer for entry in FAMILIES.values()}), "one state format per analyzer"
    with pytest.raises(UnknownFamilyError, match="these do: shuffle-gaussian"):
        family("pan-acsa")


def test_the_clients_serve_the_families_the_registry_gives_them() -> None:
    from panpriv.streamer.esa.sum_client import SUM_LEARNERS

    assert learners_with(shuffler="messages") == ("shuffle-gaussian",)
    assert set(SUM_LEARNERS) == {"shuffle-acsa", "shuffle-sgd"}
    assert learners_with(client="every-round") == ("shuffle-gd",) and learners_with(client="check-in") == ("checkin",)
    assert set().union(*(learners_with(shuffler=mode) for mode in ("messages", "shares", "slots"))) == set(FAMILIES)


def names_and_classes() -> tuple[set[str], set[str]]:
    classes = {load_learner(name).__name__ for name in learner_names()}
    classes |= {entry.analyzer_class().__name__ for entry in FAMILIES.values()}
    return set(learner_names()), classes


@pytest.mark.parametrize("module", ["streamer/esa/analyze_service.py", "streamer/commands/esa.py",
                                    "streamer/commands/scaleout.py", "streamer/scaleout/worker.py",
                                    "streamer/scaleout/coordinator.py"])
def test_the_roles_dispatch_on_no_learner_name_or_class(module: str) -> None:
    """No ``isinstance(x, <a learner or analyzer class>)`` and no comparison with a learner name:
    the role asks the registry (E-S-A) or the declared capability (scale-out)."""
    names, classes = names_and_classes()
    offenders = []
    for node in ast.walk(ast.parse((ROOT / module).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(isinstance(k, ast.Name) and k.id in classes for k in kinds):
                offenders.append(node.lineno)
        if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in names
                                                 for c in [node.left, *node.comparators]):
            offenders.append(node.lineno)
    assert offenders == [], f"{module}: lines {offenders}"
