"""The subcommands of ``panpriv``, one module per command or group (parsed and dispatched by :mod:`panpriv.streamer.commands.cli`)."""
