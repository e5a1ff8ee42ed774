"""``python -m panpriv``: the ``panpriv`` command (:func:`panpriv.streamer.commands.cli.main`)."""

import sys

from panpriv.streamer.commands.cli import main

sys.exit(main())
