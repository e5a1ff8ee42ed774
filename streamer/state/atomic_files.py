"""Temporary files that cannot be redirected, and atomic replacement with clean failure.

Every temporary file panpriv writes (the checkpoint's ``.tmp``, a recording's ``.tmp``) is created
by :func:`create_private`: a leftover file or symlink at that path is removed first (``unlink``
removes a symlink itself, never its target), then the file is created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600. Whoever can plant a symlink at the temporary path
therefore cannot make panpriv write through it, and a file holding raw records (a recording) is
readable by its owner only.

:func:`write_atomically` writes, ``fsync``-s and renames over the destination, then ``fsync``-s the
directory. If any step fails (disk full, permissions), the temporary file is removed and an
:class:`~panpriv.streamer.errors.OutputError` names the file, the reason and the fix; the destination keeps
its previous content (the last good checkpoint stays valid).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from panpriv.streamer.errors import OutputError
from panpriv.streamer.ioerrors import fix_for

PRIVATE_MODE = 0o600


def create_private(path: Path, mode: int = PRIVATE_MODE) -> int:
    """A new file at ``path`` opened for writing (``O_EXCL | O_NOFOLLOW``, ``mode``); returns the fd."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def write_atomically(path: Path, data: bytes, what: str = "file") -> None:
    """Replace ``path`` by ``data`` durably, or raise :class:`OutputError` leaving it unchanged."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = create_private(tmp)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write the {what} {path}: {exc.strerror or exc}; {fix_for(exc)}") from None


def fsync_directory(directory: Path) -> None:
    """Make a rename or a file creation in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
