"""Key pairs of Encode–Shuffle–Analyze (``panpriv keygen``; Bittau et al. 2017 §3).

Every deployment has two parties with keys (onion sealing, :mod:`panpriv.streamer.esa.wire`):

- the **analyzer** (``--role analyzer``, the default): an X25519 pair (PyNaCl ``PrivateKey``);
  clients seal each message's inner layer to its public key, and only it opens released units;
- the **shuffler** (``--role shuffler``): an X25519 pair whose public key clients seal the outer
  layer to (the shuffler opens that layer only), and an Ed25519 signing key derived from the same
  private file (keyed BLAKE2b of the X25519 private key, :func:`signing_key`), with which it signs
  every released batch; the analyzer holds the verify key and refuses a batch it did not sign.

Files, in a directory of the operator's choice:

- ``<role>-<id>.key``: the private key, 64 hex digits, created with mode 0600 (``O_EXCL``: an
  existing file is never overwritten). Only its role reads it.
- ``<role>-<id>.pub``: the X25519 public key, 64 hex digits, given to clients out of band (its
  authenticity is the clients' trust anchor; the model topic only names the analyzer key id in use).
  Mode 0644 whatever the umask, like the ``.verify`` file: others read it, nobody else may replace it.
- ``shuffler-<id>.verify``: the shuffler's Ed25519 verify key, 64 hex digits, given to the
  analyzer (``panpriv analyze --shuffler-verify-key``). ``keygen --role shuffler --if-missing``
  writes it for a shuffler key made before batches were signed (it is derived from the ``.key``).

A directory of analyzer key pairs (``panpriv analyze --analyzer-keys DIR``, the deploy/ stack):
every ``analyzer-*.key`` in it is accepted, and the newest (by modification time) is the one
clients are asked to use from the next round on — rotation is ``panpriv keygen DIR`` and a restart;
an old key is retired by deleting its file once no client uses it.

The key id is the first 8 bytes of BLAKE2b(public key), written in hex in the file names. The
analyzer's and the shuffler's box key ids travel with every message (the shuffler's in the clear,
the analyzer's inside the shuffler's layer), so a party holding several keys picks the right one
and drops a message to a key it does not hold (``unknown_key``); the verify key's id names the
signer of a batch.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from nacl.public import PrivateKey, PublicKey
from nacl.signing import SigningKey, VerifyKey

from panpriv.streamer.esa.wire import KEY_ID_BYTES

ROLES = ("analyzer", "shuffler")
"""Who holds a key pair. Files ``<role>-<id>.key``/``.pub`` (and ``shuffler-<id>.verify``)."""

_SIGNING_LABEL = b"panpriv esa shuffler batch signing key v1"


def key_id(public: PublicKey | VerifyKey | bytes) -> bytes:
    """The 8-byte id of a public (X25519) or verify (Ed25519) key."""
    return hashlib.blake2b(bytes(public), digest_size=KEY_ID_BYTES).digest()


def signing_key(private: PrivateKey) -> SigningKey:
    """The shuffler's Ed25519 signing key, derived from its X25519 private key (keyed BLAKE2b):
    one private file holds both, and a key made before batches were signed gets one too."""
    return SigningKey(hashlib.blake2b(_SIGNING_LABEL, key=bytes(private), digest_size=32).digest())


@dataclass(frozen=True)
class ShufflerKeys:
    """The shuffler's key material: ``box`` opens the outer layer of client messages, ``signer``
    signs released batches."""

    box: PrivateKey
    signer: SigningKey

    @classmethod
    def from_private(cls, private: PrivateKey) -> ShufflerKeys:
        return cls(private, signing_key(private))

    @property
    def key_id(self) -> bytes:
        """The id clients put in the clear on every message (of the X25519 public key)."""
        return key_id(self.box.public_key)

    @property
    def verify_key(self) -> VerifyKey:
        return self.signer.verify_key

    @property
    def signer_id(self) -> bytes:
        """The id every signed batch names (of the verify key)."""
        return key_id(self.signer.verify_key)


@dataclass(frozen=True)
class KeyFiles:
    """Where :func:`generate` wrote a pair, and its id (hex). ``verify``: the shuffler's verify key file."""

    private: Path
    public: Path
    key_id: str
    verify: Path | None = None


def generate(directory: Path, role: str = "analyzer") -> KeyFiles:
    """Write a fresh key pair into ``directory`` (created 0700 if missing); the private file is 0600."""
    if role not in ROLES:
        raise ValueError(f"a key pair is for one of {ROLES}, not {role!r}")
    from panpriv.streamer.state.atomic_files import (  # only keygen writes: a client imports nothing of the service
        PRIVATE_DIRECTORY_MODE,
        PRIVATE_MODE,
        PUBLIC_MODE,
        write_atomically,
    )

    directory.mkdir(mode=PRIVATE_DIRECTORY_MODE, parents=True, exist_ok=True)
    private = PrivateKey.generate()
    ident = key_id(private.public_key).hex()
    private_path = directory / f"{role}-{ident}.key"
    public_path = directory / f"{role}-{ident}.pub"
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_MODE)
    with os.fdopen(fd, "w") as handle:
        handle.write(bytes(private).hex() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    write_atomically(public_path, (bytes(private.public_key).hex() + "\n").encode(), "public key", mode=PUBLIC_MODE)
    verify = write_verify_key(private_path) if role == "shuffler" else None
    return KeyFiles(private_path, public_path, ident, verify)


def verify_path(private_path: Path) -> Path:
    """``shuffler-<id>.verify`` beside ``shuffler-<id>.key``."""
    return private_path.with_suffix(".verify")


def write_verify_key(private_path: Path) -> Path:
    """Write the verify key of the shuffler key in ``private_path`` beside it (public: mode 0644)."""
    from panpriv.streamer.state.atomic_files import PUBLIC_MODE, write_atomically

    path = verify_path(private_path)
    key = bytes(signing_key(load_private(private_path)).verify_key).hex() + "\n"
    write_atomically(path, key.encode(), "verify key", mode=PUBLIC_MODE)
    return path


class KeyFileError(ValueError):
    """A file given as a key that does not hold one (a usage error: exit code 2, one line)."""


def _hex_key(path: Path, what: str) -> bytes:
    try:
        raw = bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise KeyFileError(f"{path} is not a {what} file (64 hex digits)") from None
    if len(raw) != 32:
        raise KeyFileError(f"{path} is not a {what} file (64 hex digits)")
    return raw


def load_public(path: Path) -> PublicKey:
    """A public key file (``<role>-<id>.pub``)."""
    return PublicKey(_hex_key(path, "public key"))


def load_private(path: Path) -> PrivateKey:
    """A private key file; refused unless only its owner can read it (mode 0600 or stricter)."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} has mode {mode:o}: a private key must be readable by its owner only (chmod 600)")
    return PrivateKey(_hex_key(path, "private key"))


def load_shuffler(path: Path) -> ShufflerKeys:
    """The shuffler's key material from its private file (``shuffler-<id>.key``), or from the newest
    such file in a directory (the deploy/ stack mounts the directory keygen wrote)."""
    if path.is_dir():
        files = private_files(path, "shuffler")
        if not files:
            raise FileNotFoundError(f"no shuffler-*.key in {path} (create one with `panpriv keygen {path} --role shuffler`)")
        path = files[0]
    return ShufflerKeys.from_private(load_private(path))


def publish(private_path: Path, directory: Path) -> list[Path]:
    """Copy the public files of the key in ``private_path`` (``.pub``, and ``.verify`` for a
    shuffler key) into ``directory``, the one other roles and clients may read (created 0755)."""
    from panpriv.streamer.state.atomic_files import PUBLIC_DIRECTORY_MODE, PUBLIC_MODE, write_atomically

    directory.mkdir(mode=PUBLIC_DIRECTORY_MODE, parents=True, exist_ok=True)
    written = []
    for source in (private_path.with_suffix(".pub"), verify_path(private_path)):
        if source.exists():
            target = directory / source.name
            write_atomically(target, source.read_bytes(), "public key", mode=PUBLIC_MODE)
            written.append(target)
    return written


def load_verify_keys(paths: list[Path]) -> list[VerifyKey]:
    """Verify keys from ``shuffler-<id>.verify`` files, or every such file in a directory."""
    files: list[Path] = []
    for path in paths:
        found = sorted(path.glob("shuffler-*.verify")) if path.is_dir() else [path]
        if not found:
            raise FileNotFoundError(f"no shuffler-*.verify in {path} (`panpriv keygen DIR --role shuffler` writes one)")
        files += found
    return [VerifyKey(_hex_key(path, "verify key")) for path in files]


def load_public_keys(paths: list[Path]) -> dict[bytes, PublicKey]:
    """Analyzer public keys by id, from ``analyzer-<id>.pub`` files or every such file in a directory."""
    keys: dict[bytes, PublicKey] = {}
    for path in paths:
        found = sorted(path.glob("analyzer-*.pub")) if path.is_dir() else [path]
        if not found:
            raise FileNotFoundError(f"no analyzer-*.pub in {path}")
        for file in found:
            public = load_public(file)
            keys[key_id(public)] = public
    return keys


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
