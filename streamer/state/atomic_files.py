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

``os.replace`` unlinks the previous file but leaves its blocks on the disk until they are reused.
With ``wipe_replaced`` the previous file is opened before the rename, and once the new one is
durable its content — now in no directory — is overwritten with zeros and ``fsync``-ed, unless
another hard link still names it (a user's backup). That erases it on file systems that
overwrite in place (ext4, XFS); copy-on-write file systems (btrfs, ZFS) and SSD wear levelling
write the zeros elsewhere and keep the old blocks, so encrypt the disk there (docs/privacy.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from panpriv.streamer.errors import OutputError
from panpriv.streamer.ioerrors import fix_for

log = logging.getLogger("panpriv.checkpoint")

PRIVATE_MODE = 0o600
"""Every file panpriv writes: readable and writable by its owner only, whatever the umask."""
PUBLIC_MODE = 0o644
"""A file made for other users and processes to read (a public or verify key, the metrics
textfile node_exporter reads): readable by all, writable by its owner only, whatever the umask."""
PRIVATE_DIRECTORY_MODE = 0o700
"""A directory panpriv creates for its state (``--out``, its checkpoints, ``--state-dir``, keys)."""
PUBLIC_DIRECTORY_MODE = 0o755
"""A directory panpriv creates for others to read (``keygen --public-dir``): nobody else may add,
remove or replace a file in it."""


def create_private(path: Path, mode: int = PRIVATE_MODE) -> int:
    """A new file at ``path`` opened for writing (``O_EXCL | O_NOFOLLOW``, ``mode``); returns the fd."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def write_atomically(path: Path, data: bytes | memoryview, what: str = "file", wipe_replaced: bool = False,
                     mode: int = PRIVATE_MODE) -> None:
    """Replace ``path`` by ``data`` durably (a file of ``mode``), or raise :class:`OutputError`
    leaving it unchanged; ``wipe_replaced``: zero the replaced file once the new one is durable
    (module docstring)."""
    tmp = path.with_name(path.name + ".tmp")
    previous = _open_previous(path) if wipe_replaced else None
    try:
        fd = create_private(tmp, mode)
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
        if previous is not None:
            os.close(previous)
        raise OutputError(f"cannot write the {what} {path}: {exc.strerror or exc}; {fix_for(exc)}") from None
    if previous is not None:
        _zero_unlinked(previous)


def _open_previous(path: Path) -> int | None:
    """A descriptor of the regular file at ``path`` (never through a symlink), or ``None``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


_ZEROS = bytes(1 << 16)


def _zero_unlinked(fd: int) -> None:
    """Overwrite the file behind ``fd`` with zeros and ``fsync`` it, if no name links to it any
    more; close ``fd``. Best effort: the new file is already durable, so a failure only leaves
    the old blocks, and is logged."""
    try:
        info = os.fstat(fd)
        if info.st_nlink == 0:
            at = 0
            while at < info.st_size:
                at += os.pwrite(fd, memoryview(_ZEROS)[: min(len(_ZEROS), info.st_size - at)], at)
            os.fsync(fd)
    except OSError as exc:
        log.warning("could not overwrite the replaced file's content: %s", exc.strerror or exc)
    finally:
        os.close(fd)


def fsync_directory(directory: Path) -> None:
    """Make a rename or a file creation in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
