"""An exclusive lock on an output directory: one ``panpriv run`` per ``--out`` at a time.

Two processes writing one directory would interleave checkpoints and release snapshots twice
under a ledger that counts them once. The first process takes an exclusive ``flock`` on
``<out>/panpriv.lock`` and writes its PID into the file; a second one fails at once with
:class:`~panpriv.streamer.errors.OutputBusyError` naming that PID. The operating system releases the lock
when the holder exits in any way (``kill -9`` included), so a stale lock file never blocks a
restart; the PID in it is informational only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from panpriv.streamer.errors import OutputBusyError, OutputError
from panpriv.streamer.ioerrors import fix_for

LOCK_NAME = "panpriv.lock"


def prepare_output_directory(out: Path) -> None:
    """Create ``out`` (and its parents) or raise :class:`OutputError` saying why it cannot be used."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"--out {out} exists and is not a directory; choose a directory path") from None
    except OSError as exc:
        raise OutputError(f"cannot create the output directory --out {out}: {exc.strerror}; {fix_for(exc)}") from None
    if not out.is_dir():  # a symlink to a file, for instance
        raise OutputError(f"--out {out} is not a directory; choose a directory path")


class OutputLock:
    """Hold ``<out>/panpriv.lock`` exclusively while in the ``with`` block (see the module docstring)."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        prepare_output_directory(self.out)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot open the lock file {self.path}: {exc.strerror}; {fix_for(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise OutputBusyError(
                f"--out {self.out} is in use by another panpriv process (PID {holder}, lock {self.path}); "
                "stop that process or choose another --out"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise OutputError(f"cannot write the lock file {self.path}: {exc.strerror}; {fix_for(exc)}") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)  # no stale PID for the next reader
            except OSError:
                pass  # the lock is released by close() whatever happens here
            os.close(fd)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    """The PID written by the holder ('unknown' if it has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
