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
dropped by the analyzer (:mod:`streamer.esa.shuffler`).
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
KEY_ID_BYTES = 8
SEAL_OVERHEAD = 48
"""A sealed box adds an ephemeral public key (32 bytes) and a Poly1305 tag (16 bytes)."""

_MESSAGE_HEAD = struct.Struct(">4sQ8s")
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


def parse_message(data: bytes) -> tuple[Header, bytes]:
    """The header and the sealed box of a message; :class:`WireError` if it is not one."""
    if len(data) < _MESSAGE_HEAD.size + SEAL_OVERHEAD or data[:4] != MESSAGE_MAGIC:
        raise WireError("malformed")
    magic, round_, key_id = _MESSAGE_HEAD.unpack_from(data)
    return Header(round_, key_id), data[_MESSAGE_HEAD.size:]


def message_round(data: bytes, size: int) -> int:
    """The clear round of a message of exactly ``size`` bytes (the shuffler's only look inside)."""
    if len(data) != size:
        raise WireError("wrong_size")
    return parse_message(data)[0].round


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
