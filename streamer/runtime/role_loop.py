"""The loop every long-running process runs in: ``panpriv run`` and the roles ``shuffle``,
``analyze``, ``worker`` and ``coordinate``.

What a role does per step is its own (poll a topic, release a round, learn a batch); how it starts,
stops and cleans up is this module's, so every process behaves the same:

* **Signals.** While the loop is open, SIGTERM and SIGINT are handled and the previous handlers
  are restored when it closes. During set-up (before :meth:`RoleLoop.ready`: a calibration, a
  checkpoint being loaded, the first broker calls) a signal raises
  :class:`~panpriv.streamer.errors.StoppedDuringSetUp` — nothing was learned, so the process stops at
  once (exit 0). Afterwards it only requests a stop: the current step ends, the role's clean-up
  runs (a final checkpoint, a clean mark in the budget store), and the loop returns. Off the main
  thread no handler is installed; an embedding program passes ``stop`` instead.
* **Resources.** Everything registered with :meth:`RoleLoop.close_on_exit` is closed on the way
  out, the last registered first, each close guarded: a failing close is logged, never allowed to
  hide why the loop ended.
* **Pacing.** ``rate`` records/s through :class:`panpriv.streamer.runtime.pacing.Pacer` (the
  service's ``--rate``; a worker's ``--rate``).
* **Heartbeat.** Work due every so many seconds between steps (:meth:`RoleLoop.every`): metrics
  refreshes, and a status line from the role's ``status()`` every ``status_every_s`` seconds (what
  it holds and what it waits for: counts only), as ``panpriv run`` logs off a terminal.
* **Stop conditions.** A stop signal or the ``stop`` event, a step calling :meth:`RoleLoop.finish`
  (the model is done, a budget refusal), or the ``done`` predicate of :meth:`RoleLoop.run`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType

from panpriv.streamer.errors import StoppedDuringSetUp
from panpriv.streamer.runtime.pacing import Pacer

log = logging.getLogger("panpriv.runtime")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

STATUS_EVERY_S = 30.0
"""How often a role logs its status line (``panpriv run``'s ``--status-every`` default)."""


@dataclass
class _Periodic:
    interval_s: float
    due: float  # monotonic
    work: Callable[[], object]


class RoleLoop:
    """Signals, resources, pacing, heartbeat and stop conditions of one process (module docstring).

    Parameters
    ----------
    role
        The process's name in its log lines (``analyzer``, ``worker``, …).
    stop
        An event that stops the loop as a signal does (embedding, tests); set by a signal too.
    rate
        Records per second (``None`` or 0: unpaced); :attr:`pacer`.
    status
        The role's status line (counts only), logged every ``status_every_s`` seconds (``None``
        or 0: never).
    """

    def __init__(self, role: str, stop: threading.Event | None = None, rate: float | None = None,
                 status: Callable[[], str] | None = None, status_every_s: float | None = STATUS_EVERY_S) -> None:
        self.role = role
        self.stop_event = stop if stop is not None else threading.Event()
        self.pacer = Pacer(rate or None)
        self.reason: str | None = None
        self._ready = False
        self._previous: dict[int, object] = {}
        self._closers: contextlib.ExitStack = contextlib.ExitStack()
        self._periodic: list[_Periodic] = []
        if status is not None and status_every_s:
            self.every(status_every_s, lambda: log.info("%s: %s", role, status()), start_now=False)

    # -- the context --------------------------------------------------------------------------------

    def __enter__(self) -> RoleLoop:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._closers.close()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self._ready:  # still setting up: nothing to save
            log.info("received %s during set-up: stopping now; nothing was learned", name)
            raise StoppedDuringSetUp
        log.info("received %s: stopping after the current step", name)
        self.stop_event.set()

    def ready(self) -> None:
        """Set-up is over: from now on a signal requests a stop instead of ending the process."""
        self._ready = True

    def close_on_exit(self, close: Callable[[], object], what: str) -> None:
        """Call ``close`` when the loop closes (last registered, first closed); a failure is logged."""

        def guarded() -> None:
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - closing must not mask why the loop ended
                log.warning("%s: closing the %s failed: %s", self.role, what, type(exc).__name__)

        self._closers.callback(guarded)

    # -- stopping -----------------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """A stop was requested (signal, ``stop`` event) or a step finished the loop."""
        return self.stop_event.is_set() or self.reason is not None

    def finish(self, reason: str) -> None:
        """End the loop after the current step, for ``reason`` (the role's outcome)."""
        if self.reason is None:
            self.reason = reason

    # -- the heartbeat ------------------------------------------------------------------------------

    def every(self, interval_s: float, work: Callable[[], object], start_now: bool = True) -> None:
        """Run ``work`` between steps every ``interval_s`` seconds (first at the first beat, or
        after one interval)."""
        self._periodic.append(_Periodic(interval_s, time.monotonic() + (0.0 if start_now else interval_s), work))

    def beat(self) -> None:
        """The periodic work that is due."""
        now = time.monotonic()
        for entry in self._periodic:
            if now >= entry.due:
                entry.due = now + entry.interval_s
                entry.work()

    # -- the loop -----------------------------------------------------------------------------------

    def run(self, step: Callable[[], object], done: Callable[[], bool] | None = None) -> str:
        """Call ``step`` until a stop, :meth:`finish` or ``done()``, beating between steps; the
        reason it ended (``"stopped"``, ``"done"`` or the reason given to :meth:`finish`)."""
        self.ready()
        while not self.stopping:
            if done is not None and done():
                return "done"
            step()
            self.beat()
        return self.reason or "stopped"
