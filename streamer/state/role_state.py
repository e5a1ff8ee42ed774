"""A role's state file, sealed and locked like the service's checkpoint.

``panpriv run`` keeps its state in a sealed manifest (:mod:`panpriv.streamer.state.checkpoint`) in
an output directory that one process holds (:mod:`panpriv.streamer.state.lock`). The other roles
keep theirs — the E-S-A analyzer's ``analyzer.json``, a scale-out worker's ``worker.json`` — the same
way, through :class:`RoleState`:

* **Locked.** :meth:`RoleState.lock` takes the directory's lock (:class:`OutputLock`) before the
  state is read; the role holds it until it exits. A second process on the same directory is
  refused with one line naming the holder's PID. A client's state file, in a folder other clients
  may share, is locked alone instead (:meth:`RoleState.lock_file`, :class:`StateFileLock`).
* **Sealed.** The file is an envelope ``{"kind", "version", "state", "sha256"}`` whose ``sha256``
  is the SHA-256 of the canonical JSON of the rest (:func:`panpriv.streamer.state.integrity.canonical`),
  written atomically (:func:`panpriv.streamer.state.atomic_files.write_atomically`, 0600). On load
  any change to the content — a flipped bit, a truncation, an edit, another role's file — is
  refused with one line naming the file and the fix, before anything in it is used. (As for the
  checkpoint: the digest detects corruption, not an attacker who can rewrite the file.)
* **The budget store's mark.** Like the service's checkpoint (``extra.budget``), the envelope
  records the budget store's id and generation when the state was saved (``budget``, optional:
  :attr:`RoleState.budget_mark`); the role refuses a store that is another one or behind it
  (:meth:`panpriv.streamer.budget.session.BudgetSession.begin_role`). A save without a new mark keeps
  the one the file held, so a mark, once recorded, is never dropped.
* **Migrated.** A state written before sealing (panpriv 0.1: a bare JSON object) is recognised by
  the role's ``legacy`` rule (its ``format`` string, its exact keys), loaded with a warning and
  sealed at its next save (or refused naming the migration, where the role's rule says an earlier
  state must not be resumed); anything else without an envelope is refused, and so is an envelope
  of a later version (naming the version).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from panpriv.streamer.errors import CheckpointError
from panpriv.streamer.state.atomic_files import write_atomically
from panpriv.streamer.state.integrity import DIGEST_KEY, canonical, digest_matches, parse_object
from panpriv.streamer.state.lock import OutputLock, StateFileLock, folder_of, prepare_output_directory

log = logging.getLogger("panpriv.state")

VERSION = 1
"""The envelope's version."""

ENVELOPE_KEYS = frozenset({"kind", "version", "state", DIGEST_KEY})
BUDGET_MARK_KEY = "budget"
"""The optional envelope field holding the budget store's mark (module docstring)."""


class RoleState:
    """The sealed state file ``directory/name`` of a role of ``kind`` (module docstring).

    Parameters
    ----------
    directory
        The role's state directory (``--out``), created if missing.
    name
        The file's name (``analyzer.json``, ``worker.json``).
    kind
        What the file holds (``esa-analyzer``, ``scaleout-worker``): an envelope of another kind is
        refused.
    legacy
        Recognises a state written before sealing (an unsealed JSON object), to migrate it; it may
        instead raise :class:`CheckpointError` naming the migration for an earlier state that must
        not be loaded (the E-S-A analyzer's: :func:`panpriv.streamer.esa.analyze_service.state_file`).
    fix
        What the user can do about a refused file (ends every refusal).
    option
        The option the user named the state with: ``--out`` (the directory) or, for a client's
        state file, ``--state`` (the file); messages about the directory name it.
    """

    def __init__(self, directory: Path, name: str, kind: str, legacy: Callable[[Mapping[str, Any]], bool] | None = None,
                 fix: str = "restore it from a backup, or start afresh with another --out", option: str = "--out") -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self.kind = kind
        self._legacy = legacy
        self._fix = fix
        self.option = option
        self.migrated = False  # the last load found a state written before sealing
        self.budget_mark: dict[str, Any] | None = None  # the budget store's mark the file holds (last load or save)
        self._file_lock: StateFileLock | None = None

    def lock(self) -> OutputLock:
        """The directory's lock, acquired (release it when the role exits)."""
        lock = OutputLock(self.directory)
        lock.acquire()
        return lock

    def lock_file(self) -> StateFileLock:
        """The lock of this one file (a client's state, in a folder it may share with others),
        acquired and followed across saves (release it when the process exits)."""
        lock = StateFileLock(self.path, self.option)
        lock.acquire()
        self._file_lock = lock
        return lock

    def load(self) -> dict[str, Any] | None:
        """The state, or ``None`` if there is none yet; :class:`CheckpointError` for a file that is
        not an intact state of this kind."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc.strerror}") from None
        body = parse_object(raw, str(self.path), f"a panpriv {self.kind} state", self._fix)
        if "kind" not in body and DIGEST_KEY not in body:
            if self._legacy is not None and self._legacy(body):
                log.warning("%s was written before role states were sealed (panpriv 0.1): loaded, and sealed at its next "
                            "save", self.path)
                self.migrated = True
                return body
            raise CheckpointError(f"{self.path} is not a panpriv {self.kind} state (no seal, and not a state of an "
                                  f"earlier version); {self._fix}")
        if set(body) - {BUDGET_MARK_KEY} != ENVELOPE_KEYS or not digest_matches(body):
            raise CheckpointError(f"{self.path} is corrupted: its content does not match its SHA-256 checksum; {self._fix}")
        if body["kind"] != self.kind:
            raise CheckpointError(f"{self.path} holds a {body['kind']!r} state, not a {self.kind!r} one; {self._fix}")
        if body["version"] != VERSION:
            raise CheckpointError(f"{self.path} is a {self.kind} state of version {body['version']!r}, written by another "
                                  f"panpriv; this one reads version {VERSION}: run the panpriv that wrote it, or {self._fix}")
        state, mark = body["state"], body.get(BUDGET_MARK_KEY)
        if type(state) is not dict or not (mark is None or _is_mark(mark)):
            raise CheckpointError(f"{self.path} is not a panpriv {self.kind} state (its state is not an object, or its "
                                  f"budget mark is malformed); {self._fix}")
        self.budget_mark = mark
        return state

    def save(self, state: Mapping[str, Any], budget_mark: Mapping[str, Any] | None = None) -> None:
        """Replace the file by ``state`` sealed, atomically (0600), with ``budget_mark`` (the budget
        store's :meth:`~panpriv.streamer.budget.session.BudgetSession.mark`; default: the mark the
        file held)."""
        if self._file_lock is not None:
            self._file_lock.check()
        prepare_output_directory(self.directory, self.option if self.option == "--out" else folder_of(self.option, self.path))
        if budget_mark is not None:
            self.budget_mark = {"store": str(budget_mark["store"]), "generation": int(budget_mark["generation"])}
        envelope: dict[str, Any] = {"kind": self.kind, "version": VERSION, "state": dict(state)}
        if self.budget_mark is not None:
            envelope[BUDGET_MARK_KEY] = dict(self.budget_mark)
        envelope[DIGEST_KEY] = hashlib.sha256(canonical(envelope)).hexdigest()
        write_atomically(self.path, json.dumps(envelope, sort_keys=True, allow_nan=False).encode(), f"{self.kind} state")
        if self._file_lock is not None:
            self._file_lock.follow()


def _is_mark(mark: Any) -> bool:
    """A budget store's mark: ``{"store": <hex id>, "generation": <int ≥ 0>}``."""
    return (type(mark) is dict and set(mark) == {"store", "generation"} and type(mark["store"]) is str
            and type(mark["generation"]) is int and mark["generation"] >= 0)
