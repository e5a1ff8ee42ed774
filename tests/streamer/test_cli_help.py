"""``--help`` of every command (nested ones too): plain text, every option explained, an example
that parses, the flags the documentation's command-line reference names, one name per concept
(the Kafka budget store is ``--budget-kafka``; its old names warn once and still work)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from panpriv.streamer.commands import help_text
from panpriv.streamer.commands.cli import build_parser, main
from panpriv.streamer.commands.role_options import budget_settings

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "cli.md"
MARKUP = re.compile(r"``|`|:(?:mod|class|func|meth|data|attr):|panpriv\.(?:streamer|protocols|accounting)\b"
                    r"|\b(?:streamer|protocols|accounting)/|\w\.py\b")


def all_commands() -> dict[str, argparse.ArgumentParser]:
    return dict(help_text.commands(build_parser()))


def shown_options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions if action.help != argparse.SUPPRESS for option in action.option_strings}


def test_every_command_is_walked() -> None:
    assert {"run", "budget", "analyze", "worker", "coordinate", "topics", "topics create", "predict"} <= set(all_commands())


@pytest.mark.parametrize("name", sorted(all_commands()))
def test_help_is_plain_text_and_explains_every_option(name: str) -> None:
    parser = all_commands()[name]
    text = parser.format_help()
    assert not MARKUP.findall(text), (name, MARKUP.findall(text))
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:  # only an old name of a flag is hidden
            assert isinstance(action, help_text.DeprecatedFlag), (name, action.option_strings)
        else:
            assert action.help and action.help.strip(), (name, action.option_strings or action.dest)


@pytest.mark.parametrize("name", sorted(all_commands()))
def test_every_command_shows_an_example_that_parses(name: str) -> None:
    parser = all_commands()[name]
    text = parser.format_help()
    assert "\nExample:\n" in text, name
    example = help_text.EXAMPLES[name].replace("\\\n", " ")
    commands = [part.split("#")[0].strip() for line in example.splitlines() for part in line.split("&&")]
    assert any(command.startswith(f"panpriv {name}") for command in commands), example
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "panpriv", command
        build_parser().parse_args(argv[1:])  # a usage error would exit 2 (SystemExit fails the test)


def test_the_top_level_help_has_examples_and_no_markup() -> None:
    text = build_parser().format_help()
    assert "Examples:" in text and not MARKUP.findall(text)


def test_the_documentation_names_exactly_the_flags_each_command_takes() -> None:
    """docs/reference/cli.md is the program's own --help (help_text.reference_markdown): per
    command, the same flags, none missing and none extra (regenerate it after changing a flag)."""
    page = REFERENCE.read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## panpriv (.+?)\n\n```text\n(.*?)```", page, re.S | re.M))
    commands = all_commands()
    assert set(sections) == set(commands)
    for name, parser in commands.items():
        invocations = re.findall(r"^  (-.+?)(?:\s{2,}|$)", sections[name], re.M)  # the options' first column
        documented = {option for column in invocations for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", column)}
        assert shown_options(parser) <= documented, (name, shown_options(parser) - documented)
        assert documented - shown_options(parser) <= {"-h"}, (name, documented - shown_options(parser))


def test_one_flag_name_for_the_kafka_budget_store() -> None:
    """The budget command and every role that charges the store name it --budget-kafka; the old
    names are not shown."""
    for name in ("budget", "analyze", "worker"):
        options = shown_options(all_commands()[name])
        assert "--budget-kafka" in options and not {"--kafka", "--budget-topic"} & options, name


def test_old_budget_flag_names_still_work_and_warn_once(capsys: pytest.CaptureFixture[str]) -> None:
    help_text._warned.clear()
    common = ["worker", "--bootstrap", "b1:9092,b2:9092", "--data-topic", "d", "--gradients-topic", "g", "--model-topic", "m"]
    old = build_parser().parse_args([*common, "--budget-topic", "panpriv-budget"])
    build_parser().parse_args([*common, "--budget-topic", "panpriv-budget"])
    new = build_parser().parse_args([*common, "--budget-kafka", "kafka://b1:9092,b2:9092/panpriv-budget"])
    assert budget_settings(old) == budget_settings(new)
    assert budget_settings(new).kafka_topic == "panpriv-budget"
    assert budget_settings(new).kafka_bootstrap == ("b1:9092", "b2:9092")
    budget = build_parser().parse_args(["budget", "--kafka", "kafka://b1:9092/panpriv-budget"])
    assert budget.budget_kafka == "kafka://b1:9092/panpriv-budget"
    err = capsys.readouterr().err
    assert err.count("--budget-topic is deprecated") == 1 and err.count("--kafka is deprecated") == 1
    assert "use --budget-kafka" in err


def test_the_old_and_new_budget_flags_exclude_each_other_and_the_state_directory(tmp_path: Path) -> None:
    for argv in (["budget", "--state-dir", str(tmp_path), "--budget-kafka", "kafka://h:1/t"],
                 ["budget", "--budget-kafka", "kafka://h:1/t", "--kafka", "kafka://h:1/u"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2


def test_one_flag_name_for_the_deployment_and_the_old_one_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    """The E-S-A roles name the deployment --deployment, as the scale-out roles do; --name warns once."""
    for name in ("encode", "shuffle", "analyze", "worker", "coordinate"):
        options = shown_options(all_commands()[name])
        assert "--deployment" in options and "--name" not in options, name
    help_text._warned.clear()
    encode = ["encode", "--bootstrap", "b:9092", "--model-topic", "m", "--messages-topic", "s", "--analyzer-key", "a.pub",
              "--shuffler-key", "s.pub", "--source", "users.jsonl"]
    assert build_parser().parse_args([*encode, "--name", "first"]).deployment == "first"
    assert build_parser().parse_args([*encode, "--name", "first"]).deployment == "first"
    assert build_parser().parse_args([*encode, "--deployment", "first"]).deployment == "first"
    assert build_parser().parse_args(encode).deployment == "default"
    assert capsys.readouterr().err.count("--name is deprecated and will be removed; use --deployment NAME") == 1
