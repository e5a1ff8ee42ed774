"""An exclusive lock on a state directory: one process per ``--out`` at a time, for every role.

Two processes writing one directory would interleave checkpoints and release snapshots twice
under a ledger that counts them once (``panpriv run``), or become one budget instance whose
restart relabels the other's published charges (two scale-out workers), or analyse the same
rounds twice (two analyzers). The first process takes an exclusive ``flock`` on the directory
itself, held on an open descriptor for as long as it runs, and on ``<out>/panpriv.lock`` (the lock
of earlier versions, so that an older process is excluded too), and writes its PID into that file;
a second one fails at once with :class:`~panpriv.streamer.errors.OutputBusyError` naming that PID.
Deleting or replacing ``panpriv.lock`` does not admit a second process: the directory's lock does
not depend on the file. The operating system releases both when the holder exits in any way
(``kill -9`` included), so a stale lock file never blocks a restart; the PID in it is
informational only. The file is created 0600.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from panpriv.streamer.errors import OutputBusyError, OutputError
from panpriv.streamer.ioerrors import fix_for
from panpriv.streamer.state.atomic_files import PRIVATE_DIRECTORY_MODE

LOCK_NAME = "panpriv.lock"


def prepare_output_directory(out: Path) -> None:
    """Create ``out`` (0700; its missing parents as the umask says) or raise :class:`OutputError`
    saying why it cannot be used."""
    try:
        out.mkdir(mode=PRIVATE_DIRECTORY_MODE, parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"--out {out} exists and is not a directory; choose a directory path") from None
    except OSError as exc:
        raise OutputError(f"cannot create the output directory --out {out}: {exc.strerror}; {fix_for(exc)}") from None
    if not out.is_dir():  # a symlink to a file, for instance
        raise OutputError(f"--out {out} is not a directory; choose a directory path")


class OutputLock:
    """Hold the directory ``out`` exclusively while in the ``with`` block (see the module docstring).

    Kept by hand rather than filelock or portalocker (issue 36): both lock a lock file, so a
    deleted or replaced ``panpriv.lock`` admits a second process; this lock is on the directory
    itself (and on the file, for older versions), which is what one-process-per-``--out`` needs.
    """

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self._fds: list[int] = []  # the directory's, then the lock file's

    def acquire(self) -> None:
        prepare_output_directory(self.out)
        try:
            directory = os.open(self.out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise OutputError(f"cannot open the directory {self.out}: {exc.strerror}; {fix_for(exc)}") from None
        self._fds = [directory]
        try:
            self._lock(directory)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise OutputError(f"cannot open the lock file {self.path}: {exc.strerror}; {fix_for(exc)}") from None
            self._fds.append(fd)
            self._lock(fd)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                raise OutputError(f"cannot write the lock file {self.path}: {exc.strerror}; {fix_for(exc)}") from None
        except BaseException:
            self._close()
            raise

    def _lock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputBusyError(
                f"--out {self.out} is in use by another panpriv process (PID {_holder(self.path)}, lock {self.path}); "
                "stop that process or choose another --out"
            ) from None

    def release(self) -> None:
        if len(self._fds) == 2:
            try:
                os.ftruncate(self._fds[1], 0)  # no stale PID for the next reader
            except OSError:
                pass  # the lock is released by close() whatever happens here
        self._close()

    def _close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            os.close(fd)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _holder(path: Path) -> str:
    """The PID the holder wrote into ``path`` ('unknown' if none can be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "unknown"
    try:
        return _read_pid(fd)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> str:
    """The PID written by the holder ('unknown' if it has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
