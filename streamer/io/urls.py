"""Credentials in source URLs: refused (they belong in ``[kafka]``), and never printed.

``kafka://user:password@host/topic`` looks like it authenticates, but the Kafka security settings
live in the ``[kafka]`` section with the password in the environment (:mod:`panpriv.streamer.kafka.client`):
connecting with the URL's credentials ignored would silently be unauthenticated. :func:`refuse_credentials` turns such a URL into a clear error
instead. :func:`redact` removes the ``user:password@`` part of every URL in a text; it is applied
to everything that leaves the process as text (error messages, the resume hint, log records), so a
password typed into a URL is never echoed whatever path the URL takes.
"""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^\s'\"]*@")
"""``scheme://`` followed by anything up to the last ``@`` of the same token. Greedy on purpose: a
password may hold ``/``, ``:`` or ``@``; over-redacting a group name holding ``@`` is harmless."""

REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with the user-info part of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def has_credentials(url: str) -> bool:
    """True if the URL's authority (before its query) carries ``user[:password]@``."""
    return "://" in url and "@" in url.split("?", 1)[0]


def refuse_credentials(url: str, what: str = "Kafka source") -> None:
    """Raise ``ValueError`` (redacted) if ``url`` carries credentials (module docstring)."""
    if has_credentials(url):
        raise ValueError(
            f"{what} {redact(url)} carries credentials (user:password@), which panpriv does not read from "
            "URLs (it would connect unauthenticated); remove them and set [kafka] security_protocol, sasl_mechanism and sasl_username, with the "
            "password in PANPRIV_KAFKA__SASL_PASSWORD (and rotate it if this command line was logged or shared)"
        )


class RedactingFilter(logging.Filter):
    """A handler filter that redacts URLs in every formatted log message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "@" in message:
            record.msg, record.args = redact(message), None
        return True


def redact_logs() -> None:
    """Install :class:`RedactingFilter` on every handler of the root logger."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
