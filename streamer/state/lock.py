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
informational only (a refusal reads it only from a file the holder still locks, and otherwise
says it was removed or replaced). The file is created 0600.

A client's state *file* (``panpriv encode --state``) is locked alone, not its folder, which other
users' files may share: :class:`StateFileLock`.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from panpriv.streamer.errors import OutputBusyError, OutputError
from panpriv.streamer.ioerrors import fix_for
from panpriv.streamer.state.atomic_files import PRIVATE_DIRECTORY_MODE

LOCK_NAME = "panpriv.lock"


def prepare_output_directory(out: Path, option: str = "--out") -> None:
    """Create ``out`` (0700; its missing parents as the umask says) or raise :class:`OutputError`
    saying why it cannot be used. ``option`` names ``out`` as the user gave it: ``--out`` (a state
    directory) or, for a state file's folder, ``"the folder of --state FILE:"``."""
    try:
        out.mkdir(mode=PRIVATE_DIRECTORY_MODE, parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{option} {out} exists and is not a directory; choose a directory path") from None
    except OSError as exc:
        raise OutputError(f"cannot create the directory {option} {out}: {exc.strerror}; {fix_for(exc)}") from None
    if not out.is_dir():  # a symlink to a file, for instance
        raise OutputError(f"{option} {out} is not a directory; choose a directory path")


def folder_of(option: str, path: Path) -> str:
    """How messages name the folder of a state *file* the user gave with ``option`` (``--state``)."""
    return f"the folder of {option} {path}:"


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
            _hold_pid_file(self.path, self._lock, self._fds)
        except BaseException:
            self._close()
            raise

    def _lock(self, fd: int) -> None:
        _lock_or_refuse(fd, lambda: f"--out {self.out} is in use by another panpriv process "
                        f"({_holder(self.path, self.out)}); stop that process or choose another --out")

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


class StateFileLock:
    """Hold one state *file* exclusively (a client's ``--state``, in a folder other clients may
    share: locking the folder as :class:`OutputLock` does would refuse them all).

    Two locks, both ``flock`` on open descriptors held for the whole run:

    * ``<file>.lock`` beside the file (created 0600, the holder's PID written in it), which exists
      before the first state is saved;
    * the state file itself, once it exists — re-taken on each new file after every atomic
      replacement (:meth:`follow`), so that deleting or replacing ``<file>.lock`` does not admit a
      second process on a saved state (it is refused by the file's lock).

    Before the first save there is no state file to lock: if ``<file>.lock`` is deleted then, a
    second process can take a new one, and the holder finds out before it writes (:meth:`check`)
    and stops with one line — so at most one process ever writes the state.

    A second process is refused with one line (:class:`OutputBusyError`) naming the option the
    user gave (``--state``). The operating system drops both locks when the holder exits.
    """

    def __init__(self, path: Path, option: str = "--state") -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.option = option
        self._fds: list[int] = []  # the lock file's, then the state file's (when it exists)

    def acquire(self) -> None:
        prepare_output_directory(self.path.parent, folder_of(self.option, self.path))
        self._fds = []
        try:
            _hold_pid_file(self.lock_path, self._lock, self._fds)
            self.follow()
        except BaseException:
            self.release()
            raise

    def check(self) -> None:
        """Raise :class:`OutputBusyError` if ``<file>.lock`` is no longer the file this process
        locked (deleted or replaced: another process may hold the new one); call before a write."""
        if not self._fds:
            raise OutputBusyError(f"{self.option} {self.path} is not locked by this process (released); not writing it")
        try:
            current = os.stat(self.lock_path, follow_symlinks=False)
        except OSError:
            current = None
        mine = os.fstat(self._fds[0])
        if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            raise OutputBusyError(f"the lock file {self.lock_path} of {self.option} {self.path} was removed or replaced "
                                  "while this process ran, so another process may hold it now; stopping before writing "
                                  f"{self.path}: run one process per {self.option}")

    def follow(self) -> None:
        """Lock the state file as it is now (after it was created or replaced), then let the
        previous one go."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OutputError(f"cannot open {self.option} {self.path}: {exc.strerror}; {fix_for(exc)}") from None
        try:
            self._lock(fd)
        except BaseException:
            os.close(fd)
            raise
        if len(self._fds) == 2:
            os.close(self._fds.pop())
        self._fds.append(fd)

    def _lock(self, fd: int) -> None:
        _lock_or_refuse(fd, lambda: f"{self.option} {self.path} is in use by another panpriv process "
                        f"({_holder(self.lock_path, self.path)}); stop that process, or give each process its own "
                        f"{self.option}")

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            os.close(fd)


def _lock_or_refuse(fd: int, refusal: Callable[[], str]) -> None:
    """An exclusive ``flock`` on ``fd`` now, or :class:`OutputBusyError` with ``refusal()``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputBusyError(refusal()) from None


def _hold_pid_file(path: Path, lock: Callable[[int], None], fds: list[int]) -> None:
    """Open the lock file ``path`` (created 0600) onto ``fds``, ``lock`` it, and write this
    process's PID into it (informational: :func:`_holder`)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise OutputError(f"cannot open the lock file {path}: {exc.strerror}; {fix_for(exc)}") from None
    fds.append(fd)
    lock(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        raise OutputError(f"cannot write the lock file {path}: {exc.strerror}; {fix_for(exc)}") from None


def _holder(path: Path, held: Path) -> str:
    """Who holds ``held``, as far as its lock file ``path`` tells: "PID n, lock PATH", or why the
    PID cannot be read. A lock file that nobody has locked (the holder's was deleted, or replaced
    by another file) is not the holder's: its content says nothing about the holder."""
    unreadable = (f"the holder's PID cannot be read: its lock file {path} was removed or replaced while it ran; "
                  f"the lock on {held} itself still holds (lsof {held} lists the holder)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return unreadable
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # locked: the holder's file
            pid = _read_pid(fd)
            return f"PID {pid}, lock {path}" if pid != "unknown" else f"lock {path}; the holder has not written its PID yet"
        return unreadable
    finally:
        os.close(fd)


def _read_pid(fd: int) -> str:
    """The PID written by the holder ('unknown' if it has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
