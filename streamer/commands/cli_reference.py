"""Print the CLI reference page, every command's ``--help`` (:func:`help_text.reference_markdown`)::

    python -m panpriv.streamer.commands.cli_reference > docs/reference/cli.md

A module of its own because it needs the whole parser (:mod:`panpriv.streamer.commands.cli`),
which imports :mod:`panpriv.streamer.commands.help_text`: kept out of it, no import circle.
"""

from __future__ import annotations

import sys

from panpriv.streamer.commands.cli import build_parser
from panpriv.streamer.commands.help_text import reference_markdown

if __name__ == "__main__":
    sys.stdout.write(reference_markdown(build_parser()))
