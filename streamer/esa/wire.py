"""The bytes on the three topics of Encode–Shuffle–Analyze (Bittau et al. 2017, §3).

**Message** (client → messages topic), fixed size for a given parameter count p, so its length
says nothing about its content::

    b"PPM1" | round (u64, big-endian) | key id (8 bytes) | sealed box of: round (u64) | p × float64 (LE)

The round and key id are the only clear-text fields (the shuffler needs the round to group, the
analyzer the key id to pick its key; rotation keeps old keys readable). The round is repeated
inside the sealed box: a shuffler that moved a message to another round is caught
(``round_mismatch``). The sealed box is PyNaCl's ``SealedBox`` (X25519 + XSalsa20-Poly1305 with an
ephemeral sender key): anonymous and authenticated encryption to the analyzer's public key.

**Batch** (shuffler → shuffled topic), one Kafka record per released round::

    b"PPB1" | round (u64) | count (u32) | message size (u32) | batch id (32 bytes) | count × message

The batch id is the SHA-256 of the round and the sorted messages: the same messages give the same
id whatever their order, so a batch the shuffler released twice across a crash is recognised and
dropped by the analyzer (:mod:`panpriv.streamer.esa.shuffler`).

**Share message** (``shuffle-sgd``, ``shuffle-acsa``: split-and-mix shares of a PVEC count vector,
:mod:`panpriv.protocols.secure_sum`), one per user, so her m shares arrive atomically; fixed size for
given (d, m)::

    b"PPS1" | round (u64) | key id (8 bytes) | m (u32) | m × sealed box of: round (u64) | d × uint32 (LE)

Each share is sealed on its own (its own ephemeral key), so the boxes are unlinkable once apart.
The shuffler cuts the message into its m boxes and frames each as a **unit**, the batch's element::

    b"PPU1" | round (u64) | key id (8 bytes) | sealed box

and a batch (``PPB1`` as above) of a share round holds B·m units of B complete users.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

MESSAGE_MAGIC = b"PPM1"
BATCH_MAGIC = b"PPB1"
SHARES_MAGIC = b"PPS1"
UNIT_MAGIC = b"PPU1"
KEY_ID_BYTES = 8
SEAL_OVERHEAD = 48
"""A sealed box adds an ephemeral public key (32 bytes) and a Poly1305 tag (16 bytes)."""

_MESSAGE_HEAD = struct.Struct(">4sQ8s")
_SHARES_HEAD = struct.Struct(">4sQ8sI")
_BATCH_HEAD = struct.Struct(">4sQII32s")
_ROUND = struct.Struct(">Q")


class WireError(ValueError):
    """Bytes that are not a well-formed message or batch (the reason is the message)."""


def message_size(params: int) -> int:
    """Bytes of every message for ``params`` coordinates."""
    return _MESSAGE_HEAD.size + SEAL_OVERHEAD + _ROUND.size + 8 * params


def plaintext(round_: int, vector: NDArray[np.float64]) -> bytes:
    """The sealed part of a message: the round and the vector (little-endian float64)."""
    return _ROUND.pack(round_) + np.ascontiguousarray(vector, dtype="<f8").tobytes()


def parse_plaintext(data: bytes, params: int) -> tuple[int, NDArray[np.float64]]:
    """Inverse of :func:`plaintext`; raises :class:`WireError` on a wrong length."""
    if len(data) != _ROUND.size + 8 * params:
        raise WireError("wrong_size")
    (round_,) = _ROUND.unpack_from(data)
    return round_, np.frombuffer(data, dtype="<f8", offset=_ROUND.size).astype(np.float64)


def message(round_: int, key_id: bytes, sealed: bytes) -> bytes:
    """A whole message: the clear header and the sealed box."""
    return _MESSAGE_HEAD.pack(MESSAGE_MAGIC, round_, key_id) + sealed


@dataclass(frozen=True)
class Header:
    """The clear fields of a message."""

    round: int
    key_id: bytes


def parse_message(data: bytes, magic: bytes = MESSAGE_MAGIC) -> tuple[Header, bytes]:
    """The header and the sealed box of a message (``magic`` :data:`UNIT_MAGIC`: of a unit);
    :class:`WireError` if it is not one."""
    if len(data) < _MESSAGE_HEAD.size + SEAL_OVERHEAD or data[:4] != magic:
        raise WireError("malformed")
    magic, round_, key_id = _MESSAGE_HEAD.unpack_from(data)
    return Header(round_, key_id), data[_MESSAGE_HEAD.size:]


def message_round(data: bytes, size: int) -> int:
    """The clear round of a message of exactly ``size`` bytes (the shuffler's only look inside)."""
    if len(data) != size:
        raise WireError("wrong_size")
    return parse_message(data)[0].round


def share_plaintext(round_: int, share: NDArray[np.uint32]) -> bytes:
    """The sealed part of one share: the round and the share (little-endian uint32)."""
    return _ROUND.pack(round_) + np.ascontiguousarray(share, dtype="<u4").tobytes()


def parse_share_plaintext(data: bytes, dim: int) -> tuple[int, NDArray[np.uint32]]:
    """Inverse of :func:`share_plaintext`; raises :class:`WireError` on a wrong length."""
    if len(data) != _ROUND.size + 4 * dim:
        raise WireError("wrong_size")
    (round_,) = _ROUND.unpack_from(data)
    return round_, np.frombuffer(data, dtype="<u4", offset=_ROUND.size).astype(np.uint32)


def sealed_share_size(dim: int) -> int:
    """Bytes of one sealed share of ``dim`` coordinates."""
    return SEAL_OVERHEAD + _ROUND.size + 4 * dim


def shares_message_size(dim: int, shares: int) -> int:
    """Bytes of every share message: m sealed shares of ``dim`` coordinates."""
    return _SHARES_HEAD.size + shares * sealed_share_size(dim)


def unit_size(dim: int) -> int:
    """Bytes of every unit of a share batch."""
    return _MESSAGE_HEAD.size + sealed_share_size(dim)


def shares_message(round_: int, key_id: bytes, sealed: Sequence[bytes]) -> bytes:
    """A whole share message: the clear header and the m sealed shares (all of one size)."""
    if len({len(box) for box in sealed}) > 1:
        raise WireError("the sealed shares of a message must have one size")
    return _SHARES_HEAD.pack(SHARES_MAGIC, round_, key_id, len(sealed)) + b"".join(sealed)


def shares_message_round(data: bytes, size: int, shares: int) -> int:
    """The clear round of a share message of exactly ``size`` bytes and ``shares`` shares."""
    if len(data) != size or len(data) < _SHARES_HEAD.size:
        raise WireError("wrong_size")
    magic, round_, _, count = _SHARES_HEAD.unpack_from(data)
    if magic != SHARES_MAGIC or count != shares:
        raise WireError("malformed")
    return int(round_)


def units(data: bytes, shares: int) -> list[bytes]:
    """The shuffler's cut of a share message (already checked by :func:`shares_message_round`)
    into its ``shares`` units, each framed with the message's round and key id."""
    _, round_, key, _ = _SHARES_HEAD.unpack_from(data)
    size = (len(data) - _SHARES_HEAD.size) // shares
    head = _MESSAGE_HEAD.pack(UNIT_MAGIC, round_, key)
    return [head + data[_SHARES_HEAD.size + i * size:_SHARES_HEAD.size + (i + 1) * size] for i in range(shares)]


def batch_id(round_: int, messages: Sequence[bytes]) -> bytes:
    """SHA-256 of the round and the sorted messages: independent of their order."""
    digest = hashlib.sha256(_ROUND.pack(round_))
    for item in sorted(messages):
        digest.update(item)
    return digest.digest()


@dataclass(frozen=True)
class Batch:
    """One released round: its id, round and messages (in the shuffler's order)."""

    id: bytes
    round: int
    messages: tuple[bytes, ...]


def encode_batch(round_: int, messages: Sequence[bytes]) -> bytes:
    """A batch record of equally sized ``messages`` (already permuted)."""
    size = len(messages[0]) if messages else 0
    if any(len(item) != size for item in messages):
        raise WireError("messages of a batch must have one size")
    return _BATCH_HEAD.pack(BATCH_MAGIC, round_, len(messages), size, batch_id(round_, messages)) + b"".join(messages)


def batch_bytes(count: int, size: int) -> int:
    """The bytes of a batch record of ``count`` messages (or units) of ``size`` bytes."""
    return _BATCH_HEAD.size + count * size


def parse_batch(data: bytes) -> Batch:
    """Inverse of :func:`encode_batch`; :class:`WireError` if the framing does not add up."""
    if len(data) < _BATCH_HEAD.size or data[:4] != BATCH_MAGIC:
        raise WireError("malformed_batch")
    _, round_, count, size, ident = _BATCH_HEAD.unpack_from(data)
    body = memoryview(data)[_BATCH_HEAD.size:]
    if len(body) != count * size:
        raise WireError("malformed_batch")
    messages = tuple(bytes(body[i * size:(i + 1) * size]) for i in range(count))
    return Batch(ident, round_, messages)
