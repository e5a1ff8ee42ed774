"""Logging set-up of the ``panpriv`` command: level, text or JSON lines, redaction.

``--log-format json`` writes one JSON object per line (``time`` in UTC ISO 8601, ``level``,
``logger``, ``message``, and the ``status`` object of a status line, :mod:`panpriv.streamer.runtime.status`),
for log collectors; ``text`` (default) is the human format. ``--log-level`` sets the level
(``-q`` is ``--log-level WARNING``). Kafka's client library logs at ERROR only. Every message
passes :func:`panpriv.streamer.io.urls.redact_logs` (no ``user:password@`` leaves the process).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from panpriv.streamer.io.urls import redact_logs

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module docstring).

    Kept by hand rather than python-json-logger (issue 36): the keys are a fixed schema, and that
    library adds every ``extra=`` attribute of a record — a library's, too — to the object, where
    :func:`panpriv.streamer.io.urls.redact_logs` (which redacts the message) does not reach. What
    leaves the process is what this class names, in a dozen lines.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        status = getattr(record, "status", None)
        if status is not None:
            entry["status"] = status
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger for ``level`` and ``fmt``: one stderr handler, replacing one this
    function installed before. Like :func:`logging.basicConfig`, it adds none when another owner
    (an embedding application, pytest) has configured the root logger; it then sets the level only."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "panpriv", False)]:
        root.removeHandler(old)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.panpriv = True  # type: ignore[attr-defined]
        if fmt == "json":
            handler.setFormatter(JsonFormatter())
        else:
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    redact_logs()
