"""What ``panpriv --help`` and ``panpriv COMMAND --help`` print: plain text, an example per command.

Help is read in a terminal, not rendered, so it carries no reST markup and no module names.
:class:`PlainFormatter` wraps prose to the terminal and keeps an indented line (a command to
copy) as written; :data:`EXAMPLES` is each command's example, printed after its options;
:func:`finish` gives both to every command of the parser (the nested ``topics create`` too).

:class:`DeprecatedFlag` keeps an old flag name working, out of the help, with one warning per
process: one flag name per concept across commands (the Kafka budget store is ``--budget-kafka``
everywhere), without breaking the scripts that use the old names yet.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any

EXAMPLES: dict[str, str] = {
    "run": """\
  panpriv run                                  # UCI Adult through pan-private AC-SA (epsilon 1)
  panpriv run --source "kafka://localhost:9092/events?group=g1" --n 100000 --dim 20 --out out/events
  panpriv run --config service.toml --max-epsilon 2""",
    "record": "  panpriv record kafka://localhost:9092/events events.rec && panpriv run --source file:events.rec --dim 20",
    "privacy": """\
  panpriv privacy --learner pan-acsa --n 100000 --epsilon 1 --delta 1e-6 --dim 20
  panpriv privacy --noise-multiplier 4 --delta 1e-6""",
    "produce": "  panpriv produce --bootstrap localhost:9092 --topic events --dim 20 --n 100000",
    "dev-broker": "  panpriv dev-broker --port 9092",
    "keygen": """\
  panpriv keygen keys/analyzer
  panpriv keygen keys/shuffler --role shuffler""",
    "encode": """\
  panpriv encode --bootstrap localhost:9092 --model-topic model --messages-topic messages \\
      --analyzer-key keys/analyzer/analyzer-ID.pub --shuffler-key keys/shuffler/shuffler-ID.pub --source users.jsonl""",
    "shuffle": """\
  panpriv shuffle --bootstrap localhost:9092 --messages-topic messages --shuffled-topic shuffled \\
      --shuffler-key keys/shuffler --batch-size 1000 --params 21 --metrics-port 9478""",
    "analyze": """\
  panpriv analyze --bootstrap localhost:9092 --shuffled-topic shuffled --model-topic model \\
      --messages-topic messages --analyzer-keys keys/analyzer --shuffler-verify-key keys/shuffler \\
      --out state/analyzer --dim 20 --epsilon 1 --delta 1e-6 --max-epsilon 2""",
    "topics": "  panpriv topics create --bootstrap localhost:9092 messages shuffled && panpriv topics create "
              "--bootstrap localhost:9092 model --compact",
    "topics create": "  panpriv topics create --bootstrap localhost:9092 model --compact",
    "worker": """\
  panpriv worker --bootstrap localhost:9092 --data-topic events --gradients-topic gradients \\
      --model-topic model --out state/worker1 --budget-kafka kafka://localhost:9092/panpriv-budget""",
    "coordinate": """\
  panpriv coordinate --bootstrap localhost:9092 --gradients-topic gradients --model-topic model \\
      --workers 4 --dim 20 --n 100000 --epsilon 1 --delta 1e-6""",
    "inspect": "  panpriv inspect out/events          # or out/events/snapshots.jsonl, --json for scripts",
    "report": "  panpriv report out/events --to out/events/report",
    "predict": "  panpriv predict --snapshot out/events/snapshots.jsonl --source file:new.jsonl --out scores.jsonl",
    "budget": """\
  panpriv budget --source events
  panpriv budget --budget-kafka kafka://localhost:9092/panpriv-budget""",
}
"""Each command's example, keyed by its name (``"topics create"`` for the nested one)."""


class PlainFormatter(argparse.HelpFormatter):
    """argparse's formatter, paragraph by paragraph: prose is wrapped to the width, a line that
    starts with a space (an example command) is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        for paragraph in text.split("\n\n"):
            if paragraph.startswith(" "):
                lines.extend(indent + line for line in paragraph.splitlines())
            else:
                lines.append(textwrap.fill(" ".join(paragraph.split()), width, initial_indent=indent,
                                           subsequent_indent=indent))
            lines.append("")
        return "\n".join(lines[:-1])


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command of ``parser`` with its name, nested ones as ``"topics create"``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + name, sub
                yield from commands(sub, f"{prefix}{name} ")


def finish(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every command :class:`PlainFormatter` and its example (a command
    without one in :data:`EXAMPLES` is a bug: ``KeyError``)."""
    parser.formatter_class = PlainFormatter
    parser.epilog = "Examples:\n\n" + EXAMPLES["run"] + "\n\n'panpriv COMMAND --help' for a command's options and example."
    for name, sub in commands(parser):
        sub.formatter_class = PlainFormatter
        sub.epilog = "Example:\n\n" + EXAMPLES[name]


_warned: set[str] = set()


class DeprecatedFlag(argparse.Action):
    """An old name of a flag: stores its value like the new one and, the first time in this
    process, prints one line on stderr naming the new flag. Not shown in ``--help``."""

    def __init__(self, option_strings: Sequence[str], dest: str, use: str, **kwargs: Any) -> None:
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)
        self.use = use

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string not in _warned:
            _warned.add(str(option_string))
            print(f"panpriv: warning: {option_string} is deprecated and will be removed; use {self.use}", file=sys.stderr)
        setattr(namespace, self.dest, values)


REFERENCE_COLUMNS = 100
"""The width of the help in the documentation's command-line reference (a terminal's is its own)."""


def reference_markdown(parser: argparse.ArgumentParser) -> str:
    """The documentation's command-line reference (docs/reference/cli.md): every command's
    ``--help`` at :data:`REFERENCE_COLUMNS` columns, so the site names exactly the flags the
    program takes (tests/streamer/test_cli_help.py checks that it names exactly each command's flags)."""
    import os

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(REFERENCE_COLUMNS)  # argparse reads the width from it
    try:
        parts = ["# Command line", "",
                 "Every command's `--help`, as the program prints it (generated: "
                 "`python -m panpriv.streamer.commands.help_text > docs/reference/cli.md`).", "",
                 "```text", parser.format_help().rstrip(), "```"]
        for name, sub in commands(parser):
            parts += ["", f"## panpriv {name}", "", "```text", sub.format_help().rstrip(), "```"]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    from panpriv.streamer.commands.cli import build_parser

    sys.stdout.write(reference_markdown(build_parser()))
