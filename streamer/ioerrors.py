"""Operating-system I/O errors as one line for the operator: what failed, why, and what to do.

Used where panpriv turns an ``OSError`` into a :class:`~panpriv.streamer.errors.StreamerError` (the output
directory, the checkpoint) and by the CLI as the last boundary for any other file error, so a full
disk or a read-only directory never reaches the user as a traceback.
"""

from __future__ import annotations

import errno


def fix_for(exc: OSError) -> str:
    """What the operator can do about ``exc`` on a file panpriv writes."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that file system (the last good checkpoint is kept) and run the same command again"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make it writable for this user, or choose another --out"
    return "check the path and the file system, or choose another --out"


def describe(exc: OSError) -> str:
    """``exc`` as ``I/O error on PATH: REASON; FIX``."""
    where = f" on {exc.filename}" if exc.filename else ""
    return f"I/O error{where}: {exc.strerror or exc}; {fix_for(exc)}"
