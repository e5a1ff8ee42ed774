"""The bytes on the topics of Encode–Shuffle–Analyze: onion-sealed messages, the units the shuffler
releases, and signed batches (Bittau et al. 2017, §3 and §4.1: "nested encryption").

**Unit** (the inner layer, sealed to the ANALYZER; what a batch releases), fixed size per learner::

    b"PPU2" | analyzer key id (8 bytes) | sealed box to the analyzer of: round (u64) | payload

The payload is a vector (p × float64, little-endian; ``shuffle-gaussian``, ``checkin``) or one
split-and-mix share (d × uint32, little-endian; ``shuffle-sgd``, ``shuffle-acsa``, ``shuffle-gd``,
:mod:`panpriv.protocols.secure_sum`). The round inside lets the analyzer catch a unit moved to
another round (``round_mismatch``); the key id picks its key (rotation keeps old keys readable).
Each unit is sealed on its own (its own ephemeral key: PyNaCl's ``SealedBox``, X25519 +
XSalsa20-Poly1305), so units are unlinkable once apart.

**Message** (client → messages topic, the outer layer, sealed to the SHUFFLER), fixed size per
learner, so its length says nothing about its content::

    b"PPE2" | round (u64) | shuffler key id (8 bytes) | sealed box to the shuffler of: round (u64) | body

The body is one vector unit (``shuffle-gaussian``), the m share units of one user
(``shuffle-sgd``, ``shuffle-acsa``, ``shuffle-gd``: her shares arrive atomically), or a check-in
(:mod:`panpriv.streamer.esa.checkin_wire`). The clear round (for ``checkin``: the wake slot) and the
shuffler's key id are all the broker and the analyzer can read of a message: the analyzer's key
opens nothing on the messages topic. The shuffler removes its layer (:func:`open_message`) and
releases units that are new bytes — a fresh ciphertext inside another fresh ciphertext — so no
unit on the shuffled topic equals, or is contained in, anything on the messages topic, and every
unit of a learner has one size.

**Batch** (shuffler → shuffled topic, one Kafka record per released round), signed by the shuffler
(:mod:`panpriv.streamer.esa.batches`)::

    b"PPB2" | deployment digest (32) | round (u64) | count (u32) | unit size (u32) | batch digest (32)
            | signer key id (8) | Ed25519 signature (64) | count × unit

The batch digest is the SHA-256 of the round and the sorted units: the same units give the same
digest whatever their order, so a batch the shuffler released twice across a crash is recognised
and dropped by the analyzer (``duplicate_batch``).

**Formats before onion sealing** (``PPM1`` and ``PPS1`` messages sealed to the analyzer alone, and
``PPK1`` check-ins; ``PPB1`` unsigned batches) are refused by name: ``old_format``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from nacl.public import SealedBox

MESSAGE_MAGIC = b"PPE2"
UNIT_MAGIC = b"PPU2"
BATCH_MAGIC = b"PPB2"
LEGACY_MESSAGE_MAGICS = (b"PPM1", b"PPS1", b"PPK1")
"""Messages of the format before onion sealing: refused as ``old_format``."""
LEGACY_BATCH_MAGIC = b"PPB1"
"""Unsigned batches of the format before signed batches: refused as ``old_format``."""
KEY_ID_BYTES = 8
SEAL_OVERHEAD = 48
"""A sealed box adds an ephemeral public key (32 bytes) and a Poly1305 tag (16 bytes)."""
DIGEST_BYTES = 32
SIGNATURE_BYTES = 64

_MESSAGE_HEAD = struct.Struct(">4sQ8s")
_UNIT_HEAD = struct.Struct(">4s8s")
_BATCH_HEAD = struct.Struct(">4s32sQII32s8s64s")
_ROUND = struct.Struct(">Q")


class WireError(ValueError):
    """Bytes that are not a well-formed message, unit or batch (the reason is the message)."""


# -- the inner layer: units sealed to the analyzer --------------------------------------------------


def plaintext(round_: int, vector: NDArray[np.float64]) -> bytes:
    """The sealed part of a vector unit: the round and the vector (little-endian float64)."""
    return _ROUND.pack(round_) + np.ascontiguousarray(vector, dtype="<f8").tobytes()


def parse_plaintext(data: bytes, params: int) -> tuple[int, NDArray[np.float64]]:
    """Inverse of :func:`plaintext`; raises :class:`WireError` on a wrong length."""
    if len(data) != _ROUND.size + 8 * params:
        raise WireError("wrong_size")
    (round_,) = _ROUND.unpack_from(data)
    return round_, np.frombuffer(data, dtype="<f8", offset=_ROUND.size).astype(np.float64)


def share_plaintext(round_: int, share: NDArray[np.uint32]) -> bytes:
    """The sealed part of a share unit: the round and the share (little-endian uint32)."""
    return _ROUND.pack(round_) + np.ascontiguousarray(share, dtype="<u4").tobytes()


def parse_share_plaintext(data: bytes, dim: int) -> tuple[int, NDArray[np.uint32]]:
    """Inverse of :func:`share_plaintext`; raises :class:`WireError` on a wrong length."""
    if len(data) != _ROUND.size + 4 * dim:
        raise WireError("wrong_size")
    (round_,) = _ROUND.unpack_from(data)
    return round_, np.frombuffer(data, dtype="<u4", offset=_ROUND.size).astype(np.uint32)


def unit(analyzer_key_id: bytes, sealed: bytes) -> bytes:
    """A unit: the analyzer's key id and the box sealed to it."""
    return _UNIT_HEAD.pack(UNIT_MAGIC, analyzer_key_id) + sealed


def parse_unit(data: bytes, size: int) -> tuple[bytes, bytes]:
    """(analyzer key id, sealed box) of a unit of exactly ``size`` bytes; :class:`WireError` otherwise."""
    if len(data) != size or data[:4] != UNIT_MAGIC:
        raise WireError("malformed")
    return data[4:_UNIT_HEAD.size], data[_UNIT_HEAD.size:]


def unit_key_id(data: bytes) -> bytes:
    """The analyzer key id of a unit (already checked by :func:`parse_unit` or its framing)."""
    return data[4:_UNIT_HEAD.size]


def vector_unit_size(params: int) -> int:
    """Bytes of every vector unit of ``params`` coordinates."""
    return _UNIT_HEAD.size + SEAL_OVERHEAD + _ROUND.size + 8 * params


def share_unit_size(dim: int) -> int:
    """Bytes of every share unit of ``dim`` coordinates."""
    return _UNIT_HEAD.size + SEAL_OVERHEAD + _ROUND.size + 4 * dim


def seal_unit(box: SealedBox, analyzer_key_id: bytes, sealed_plaintext: bytes) -> bytes:
    """A unit sealing ``sealed_plaintext`` (:func:`plaintext` or :func:`share_plaintext`) to ``box``'s key."""
    return unit(analyzer_key_id, box.encrypt(sealed_plaintext))


# -- the outer layer: messages sealed to the shuffler -----------------------------------------------


def message_size_for(body: int) -> int:
    """Bytes of every message whose body (what the shuffler's layer holds after the round) has ``body`` bytes."""
    return _MESSAGE_HEAD.size + SEAL_OVERHEAD + _ROUND.size + body


def message_size(params: int) -> int:
    """Bytes of every ``shuffle-gaussian`` message (one vector unit of ``params`` coordinates)."""
    return message_size_for(vector_unit_size(params))


def shares_message_size(dim: int, shares: int) -> int:
    """Bytes of every share message: m share units of ``dim`` coordinates."""
    return message_size_for(shares * share_unit_size(dim))


def seal_message(box: SealedBox, shuffler_key_id: bytes, round_: int, body: bytes) -> bytes:
    """A whole message: the clear header (round, shuffler key id) and ``body`` sealed to the shuffler
    with the round again inside."""
    return _MESSAGE_HEAD.pack(MESSAGE_MAGIC, round_, shuffler_key_id) + box.encrypt(_ROUND.pack(round_) + body)


def message_header(data: bytes, size: int) -> tuple[int, bytes, bytes]:
    """(clear round, shuffler key id, sealed box) of a message of exactly ``size`` bytes;
    :class:`WireError` ``old_format`` for a message of the format before onion sealing, else
    ``malformed``."""
    if data[:4] in LEGACY_MESSAGE_MAGICS:
        raise WireError("old_format")
    if len(data) != size or data[:4] != MESSAGE_MAGIC:
        raise WireError("malformed")
    _, round_, key = _MESSAGE_HEAD.unpack_from(data)
    return int(round_), key, data[_MESSAGE_HEAD.size:]


def open_message(data: bytes, size: int, shuffler_key_id: bytes, box: SealedBox) -> tuple[int, bytes] | str:
    """The shuffler's removal of its layer: (round, body) of a message, or why it is dropped —
    ``old_format``, ``malformed`` (size or magic), ``unknown_key`` (sealed to another shuffler key),
    ``undecryptable``, ``round_mismatch`` (the clear round is not the sealed one: the message was
    retagged on its way)."""
    from nacl.exceptions import CryptoError

    try:
        round_, key, sealed = message_header(data, size)
    except WireError as exc:
        return str(exc)
    if key != shuffler_key_id:
        return "unknown_key"
    try:
        opened = box.decrypt(sealed)
    except CryptoError:
        return "undecryptable"
    (inner_round,) = _ROUND.unpack_from(opened)
    if inner_round != round_:
        return "round_mismatch"
    return round_, opened[_ROUND.size:]


def split_units(body: bytes, count: int, size: int) -> list[bytes]:
    """The ``count`` units of ``size`` bytes a share message's body holds; :class:`WireError` if
    the body is not exactly that."""
    if len(body) != count * size:
        raise WireError("malformed")
    units = [body[i * size:(i + 1) * size] for i in range(count)]
    if any(item[:4] != UNIT_MAGIC for item in units):
        raise WireError("malformed")
    return units


# -- batches ---------------------------------------------------------------------------------------


def deployment_digest(deployment: str) -> bytes:
    """The 32 bytes that name a deployment in every batch (its id: the data key
    ``esa:<cluster>/<messages topic>``, :func:`panpriv.streamer.esa.deployment.data_key`)."""
    return hashlib.sha256(b"panpriv-esa-deployment/2\0" + deployment.encode()).digest()


def batch_digest(round_: int, units: Sequence[bytes]) -> bytes:
    """SHA-256 of the round, the count and the sorted units: independent of their order."""
    digest = hashlib.sha256(b"panpriv-esa-batch/2\0" + _ROUND.pack(round_) + len(units).to_bytes(4, "big"))
    for item in sorted(units):
        digest.update(item)
    return digest.digest()


def signed_part(deployment: bytes, round_: int, count: int, size: int, digest: bytes, signer_id: bytes) -> bytes:
    """What the shuffler's signature covers: a domain label and every header field before it."""
    return b"panpriv-esa-signed-batch/2\0" + _BATCH_HEAD.pack(
        BATCH_MAGIC, deployment, round_, count, size, digest, signer_id, bytes(SIGNATURE_BYTES))[:-SIGNATURE_BYTES]


def batch_record(deployment: bytes, round_: int, units: Sequence[bytes], digest: bytes, signer_id: bytes,
                 signature: bytes) -> bytes:
    """A batch record from its fields (:mod:`panpriv.streamer.esa.batches` signs it)."""
    size = len(units[0]) if units else 0
    if any(len(item) != size for item in units):
        raise WireError("units of a batch must have one size")
    head = _BATCH_HEAD.pack(BATCH_MAGIC, deployment, round_, len(units), size, digest, signer_id, signature)
    return head + b"".join(units)


class Batch:
    """One released round as read from the shuffled topic: its header fields and its units (in
    the shuffler's order). ``signed``: the bytes its signature covers."""

    __slots__ = ("deployment", "round", "count", "size", "digest", "signer_id", "signature", "units")

    def __init__(self, deployment: bytes, round_: int, count: int, size: int, digest: bytes, signer_id: bytes,
                 signature: bytes, units: tuple[bytes, ...]) -> None:
        self.deployment, self.round, self.count, self.size = deployment, round_, count, size
        self.digest, self.signer_id, self.signature, self.units = digest, signer_id, signature, units

    @property
    def signed(self) -> bytes:
        return signed_part(self.deployment, self.round, self.count, self.size, self.digest, self.signer_id)


def batch_bytes(count: int, size: int) -> int:
    """The bytes of a batch record of ``count`` messages (or units) of ``size`` bytes."""
    return _BATCH_HEAD.size + count * size


def parse_batch(data: bytes) -> Batch:
    """The fields of a batch record; :class:`WireError` ``old_format`` for an unsigned batch of the
    format before signed batches, ``malformed_batch`` if the framing does not add up."""
    if data[:4] == LEGACY_BATCH_MAGIC:
        raise WireError("old_format")
    if len(data) < _BATCH_HEAD.size or data[:4] != BATCH_MAGIC:
        raise WireError("malformed_batch")
    _, deployment, round_, count, size, digest, signer, signature = _BATCH_HEAD.unpack_from(data)
    body = memoryview(data)[_BATCH_HEAD.size:]
    if len(body) != count * size or (size == 0 and count != 0):  # 2³² empty units would fit in 148 bytes
        raise WireError("malformed_batch")
    units = tuple(bytes(body[i * size:(i + 1) * size]) for i in range(count))
    return Batch(deployment, int(round_), int(count), int(size), digest, signer, signature, units)


def legacy_batch_round(data: bytes) -> int | None:
    """The round of an unsigned batch of the format before signed batches (``PPB1``), else ``None``."""
    if len(data) >= 12 and data[:4] == LEGACY_BATCH_MAGIC:
        return int(_ROUND.unpack_from(data, 4)[0])
    return None
