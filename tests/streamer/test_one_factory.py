"""Every entry point builds its learner through the one factory (streamer/runtime/learners.py):
``panpriv run``'s config, the Python constructor, ``panpriv analyze`` and ``panpriv coordinate``
give equal learners — equal ``config()`` — from equal settings, for every catalogued learner a
role can run; a role refuses, with one line, a learner it cannot run.

The Python constructor matches once the learners own their defaults (radius √d, the intercept,
PNSGD's pan floor: the constructors' defaults in ``protocols/``). Until then the factory adds them
(:data:`panpriv.streamer.runtime.learners.DEFAULT_OPTIONS`) and that comparison is an expected
failure: it turns into a failure of its own (XPASS, strict) the moment the defaults move, so the
marker cannot outlive the move."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from panpriv.protocols.batch_worker import supports_batch_workers
from panpriv.protocols.catalogue import learner_names, load_learner
from panpriv.streamer.commands import esa as esa_commands
from panpriv.streamer.commands import scaleout as scaleout_commands
from panpriv.streamer.commands.cli import _load_run_config, build_parser
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.esa.families import FAMILIES
from panpriv.streamer.runtime import learners

DIM, EPSILON, DELTA, BOUND, N = 5, 1.0, 1e-6, 1.0, 1024
OPTIONS = {"eta": 0.1}  # pnsgd and shuffled-pnsgd need a step size (no default: it bounds the guarantee)
ROOT = Path(__file__).resolve().parents[2]


def options_for(name: str) -> dict[str, Any]:
    accepted = learners.learner_class(name).__init__.__code__.co_varnames
    return {k: v for k, v in OPTIONS.items() if k in accepted}


def run_learner(name: str) -> Any:
    """``panpriv run --learner NAME …`` with the settings, through the CLI's config loading."""
    import json

    args = build_parser().parse_args(["run", "--learner", name, "--source", f"synthetic:n={N}&dim={DIM}", "--dim", str(DIM),
                                      "--feature-bound", str(BOUND), "--epsilon", str(EPSILON), "--delta", str(DELTA),
                                      "--options", json.dumps(options_for(name))])
    args.argv = []
    return learners.build_learner(_load_run_config(args), N)


def analyze_learner(name: str) -> Any:
    """``panpriv analyze --learner NAME …`` with the same settings (the stream length is --horizon,
    or --batch-size for a family whose rounds ask every user)."""
    import json

    length = ["--batch-size", str(N)] if FAMILIES[name].batch_option in ("n", "horizon") else ["--horizon", str(N)]
    args = build_parser().parse_args(["analyze", "--bootstrap", "B", "--shuffled-topic", "s", "--model-topic", "m",
                                      "--messages-topic", "msg", "--analyzer-key", "k", "--shuffler-verify-key", "v",
                                      "--out", "o", "--learner", name,
                                      "--dim", str(DIM), "--epsilon", str(EPSILON), "--delta", str(DELTA),
                                      "--feature-bound", str(BOUND), *length, "--options", json.dumps(options_for(name))])
    return esa_commands.analyzer_learner(args)()


def coordinate_args(name: str) -> Any:
    import json

    return build_parser().parse_args(["coordinate", "--bootstrap", "B", "--gradients-topic", "g", "--model-topic", "m",
                                      "--workers", "3", "--learner", name, "--dim", str(DIM), "--n", str(N),
                                      "--epsilon", str(EPSILON), "--delta", str(DELTA), "--feature-bound", str(BOUND),
                                      "--options", json.dumps(options_for(name))])


def python_learner(name: str) -> Any:
    """The class called as the README's "From Python" does: the settings, and nothing else."""
    cls = load_learner(name)
    parameters = cls.__init__.__code__.co_varnames
    arguments = {"dim": DIM, "epsilon": EPSILON, "delta": DELTA, "feature_bound": BOUND, "horizon": N, "n": N,
                 **options_for(name)}
    return cls(**{k: v for k, v in arguments.items() if k in parameters})


@pytest.mark.parametrize("name", learner_names())
def test_run_and_analyze_and_coordinate_build_equal_learners(name: str) -> None:
    from_run = run_learner(name).config()
    if name in FAMILIES:
        assert analyze_learner(name).config() == from_run
    else:
        with pytest.raises(SystemExit):  # argparse: not among analyze's --learner choices (exit 2)
            build_parser().parse_args(["analyze", "--learner", name])
    if supports_batch_workers(load_learner(name)):
        assert scaleout_commands.coordinator_learner(coordinate_args(name))().config() == from_run
    else:
        with pytest.raises(ConfigError, match="cannot run on many workers"):
            scaleout_commands.coordinator_learner(coordinate_args(name))


DEFAULTS_IN_THE_SERVICE = bool(getattr(learners, "DEFAULT_OPTIONS", None))


@pytest.mark.xfail(DEFAULTS_IN_THE_SERVICE, strict=True, raises=(AssertionError, TypeError),
                   reason="the defaults (radius, intercept, pan_delta) still live in runtime/learners.DEFAULT_OPTIONS")
@pytest.mark.parametrize("name", learner_names())
def test_the_python_constructor_builds_the_learner_run_builds(name: str) -> None:
    assert python_learner(name).config() == run_learner(name).config()


def test_the_analyze_help_lists_every_learner_it_accepts() -> None:
    parser = build_parser()
    analyze = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith(" analyze"))  # type: ignore[union-attr]
    choices = next(a.choices for a in analyze._actions if a.dest == "learner")
    assert tuple(choices) == tuple(FAMILIES)
    assert all(name in analyze.format_help() for name in FAMILIES)


ROLE_MODULES = ("streamer/esa", "streamer/scaleout", "streamer/commands")


def test_no_role_calls_a_learner_constructor() -> None:
    """Learners are built (and restored) by the one factory: no module of the roles or commands
    names a learner class and calls it, or calls ``from_config``/``from_state_dict`` on one."""
    classes = {load_learner(name).__name__ for name in learner_names()}
    offenders = []
    for folder in ROLE_MODULES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = func.id if isinstance(func, ast.Name) else (
                        func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                        and func.attr in ("from_config", "from_state_dict") else None)
                    if called in classes:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
