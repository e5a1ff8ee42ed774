"""Analyzer key pairs for Encode–Shuffle–Analyze (``panpriv keygen``; Bittau et al. 2017 §3).

A key pair is X25519 (PyNaCl ``PrivateKey``). Files, in a directory of the operator's choice:

- ``analyzer-<id>.key``: the private key, 64 hex digits, created with mode 0600 (``O_EXCL``: an
  existing file is never overwritten). Only the analyzer reads it.
- ``analyzer-<id>.pub``: the public key, 64 hex digits, given to clients out of band (its
  authenticity is the clients' trust anchor; the model topic only names the key id in use).

A directory of key pairs (``panpriv analyze --analyzer-keys DIR``, the deploy/ stack): every
``analyzer-*.key`` in it is accepted, and the newest (by modification time) is the one clients are
asked to use — rotation is ``panpriv keygen DIR`` and a restart; an old key is retired by deleting
its file once no client uses it.

The key id is the first 8 bytes of BLAKE2b(public key), written in hex in the file names and sent
in the clear with every message, so an analyzer holding several keys (rotation) picks the right
one and rejects messages to a key it does not hold (``unknown_key``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from nacl.public import PrivateKey, PublicKey

from panpriv.streamer.esa.wire import KEY_ID_BYTES

PRIVATE_MODE = 0o600


def key_id(public: PublicKey) -> bytes:
    """The 8-byte id of a public key."""
    return hashlib.blake2b(bytes(public), digest_size=KEY_ID_BYTES).digest()


@dataclass(frozen=True)
class KeyFiles:
    """Where :func:`generate` wrote a pair, and its id (hex)."""

    private: Path
    public: Path
    key_id: str


ROLES = ("analyzer", "shuffler")
"""Who holds a key pair: the analyzer (every ESA learner) or the ``checkin`` shuffler, which opens the
outer layer of a check-in message (:mod:`panpriv.streamer.esa.checkin_wire`). Files ``<role>-<id>.key``/``.pub``."""


def generate(directory: Path, role: str = "analyzer") -> KeyFiles:
    """Write a fresh key pair into ``directory`` (created 0700 if missing); the private file is 0600."""
    if role not in ROLES:
        raise ValueError(f"a key pair is for one of {ROLES}, not {role!r}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = PrivateKey.generate()
    ident = key_id(private.public_key).hex()
    private_path = directory / f"{role}-{ident}.key"
    public_path = directory / f"{role}-{ident}.pub"
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_MODE)
    with os.fdopen(fd, "w") as handle:
        handle.write(bytes(private).hex() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    public_path.write_text(bytes(private.public_key).hex() + "\n")
    return KeyFiles(private_path, public_path, ident)


def _hex_key(path: Path, what: str) -> bytes:
    try:
        raw = bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise ValueError(f"{path} is not a {what} file (64 hex digits)") from None
    if len(raw) != 32:
        raise ValueError(f"{path} is not a {what} file (64 hex digits)")
    return raw


def load_public(path: Path) -> PublicKey:
    """A public key file (``analyzer-<id>.pub``)."""
    return PublicKey(_hex_key(path, "public key"))


def load_private(path: Path) -> PrivateKey:
    """A private key file; refused unless only its owner can read it (mode 0600 or stricter)."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} has mode {mode:o}: a private key must be readable by its owner only (chmod 600)")
    return PrivateKey(_hex_key(path, "private key"))


def private_files(directory: Path, role: str = "analyzer") -> list[Path]:
    """The private key files of ``role`` in ``directory``, newest first (modification time, then name)."""
    files = [p for p in directory.glob(f"{role}-*.key") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)


def load_directory(directory: Path) -> list[PrivateKey]:
    """Every private key in ``directory``, the newest first (the one clients are asked to use)."""
    files = private_files(directory)
    if not files:
        raise FileNotFoundError(f"no analyzer-*.key in {directory} (create one with `panpriv keygen {directory}`)")
    return [load_private(path) for path in files]
