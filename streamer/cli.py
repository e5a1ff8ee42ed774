"""The ``panpriv`` command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``panpriv`` console script."""
    print(
        "panpriv: the streaming service is not implemented yet (tracked in the streamer issue); "
        "nothing was run.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
