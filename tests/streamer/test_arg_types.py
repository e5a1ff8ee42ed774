"""The shared argument types (streamer/arg_types.py) and that every command uses them."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from panpriv.streamer.arg_types import json_object, port_or_zero, positive_float, positive_int

ROOT = Path(__file__).resolve().parents[2]


def test_positive_int() -> None:
    assert positive_int("3") == 3
    for bad in ("0", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="integer >= 1"):
            positive_int(bad)
    with pytest.raises(ValueError):
        positive_int("1.5")


def test_positive_float() -> None:
    assert positive_float("0.5") == 0.5
    for bad in ("0", "-2", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0"):
            positive_float(bad)


def test_port_or_zero() -> None:
    assert port_or_zero("0") == 0
    assert port_or_zero("9477") == 9477
    for bad in ("-1", "65536"):
        with pytest.raises(argparse.ArgumentTypeError, match="port"):
            port_or_zero(bad)


def test_json_object() -> None:
    assert json_object('{"radius": 4}') == {"radius": 4}
    with pytest.raises(argparse.ArgumentTypeError, match="not JSON"):
        json_object("{radius: 4}")
    with pytest.raises(argparse.ArgumentTypeError, match="must be a JSON object"):
        json_object("[3]")


def test_argparse_reports_a_usage_error() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=positive_int)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--n", "0"])
    assert exit_.value.code == 2


def test_no_command_module_defines_its_own() -> None:
    """One definition: no module of streamer/ defines a function of the same name again."""
    names = {"positive_int", "positive_float", "_positive_int", "_positive_float", "port_or_zero"}
    for path in sorted((ROOT / "streamer").rglob("*.py")):
        if path.name == "arg_types.py":
            continue
        tree = ast.parse(path.read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert not defined & names, f"{path.relative_to(ROOT)} defines {sorted(defined & names)}"
