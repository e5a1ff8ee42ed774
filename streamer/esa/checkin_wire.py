"""The bytes of ``checkin`` in Encode–Shuffle–Analyze (random check-ins, Balle et al. 2020 Algs 1–2).

**Check-in message** (client → messages topic), one per client, sent at her wake slot whether or
not she checked in, fixed size for a parameter count p::

    b"PPK1" | wake slot (u64) | shuffler key id (8 bytes) | sealed box to the SHUFFLER of:
        chosen slot (u64; 2^64 − 1: no check-in) | choice key (u64) | inner message

The wake slot is public (it is the record's public position) and the shuffler's key id picks its
key; nothing else is in the clear. The **inner message** is an ordinary ``PPM1`` message of
:mod:`panpriv.streamer.esa.wire` sealed to the **analyzer**, tagged with the chosen slot (as its round)::

    b"PPM1" | chosen slot (u64) | analyzer key id | sealed box to the ANALYZER of: chosen slot | p × float64

A client who does not check in seals the randomizer applied to the zero vector instead (same size,
same work: :mod:`panpriv.streamer.esa.checkin_client`). The shuffler opens the outer box only: it learns
the chosen slot and the choice key, never the update. It releases a slot as a ``PPB1`` batch
(:func:`panpriv.streamer.esa.wire.encode_batch`, round = the slot) of inner messages, byte for byte as the
clients sealed them — so the analyzer's input holds no client identity, wake slot or key.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from panpriv.streamer.esa import wire

CHECKIN_MAGIC = b"PPK1"
NO_SLOT = (1 << 64) - 1
"""The chosen slot of a client who does not check in."""

_HEAD = struct.Struct(">4sQ8s")
_CHOICE = struct.Struct(">QQ")


def inner_size(params: int) -> int:
    """Bytes of every inner message (a ``PPM1`` message of ``params`` coordinates)."""
    return wire.message_size(params)


def message_size(params: int) -> int:
    """Bytes of every check-in message for ``params`` coordinates."""
    return _HEAD.size + wire.SEAL_OVERHEAD + _CHOICE.size + inner_size(params)


def outer_plaintext(slot: int | None, key: int, inner: bytes) -> bytes:
    """What the client seals to the shuffler: the chosen slot (``None``: no check-in), her choice key, the inner message."""
    return _CHOICE.pack(NO_SLOT if slot is None else slot, key) + inner


def message(wake: int, shuffler_key_id: bytes, sealed: bytes) -> bytes:
    """A whole check-in message: the clear header (wake slot, shuffler key id) and the sealed box."""
    return _HEAD.pack(CHECKIN_MAGIC, wake, shuffler_key_id) + sealed


@dataclass(frozen=True)
class Choice:
    """The opened outer layer: the chosen slot (``None``: no check-in), the key, the inner message."""

    slot: int | None
    key: int
    inner: bytes


def parse_header(data: bytes, size: int) -> tuple[int, bytes, bytes]:
    """(wake slot, shuffler key id, sealed box) of a check-in message of exactly ``size`` bytes."""
    if len(data) != size or data[:4] != CHECKIN_MAGIC:
        raise wire.WireError("malformed")
    _, wake, key = _HEAD.unpack_from(data)
    return int(wake), key, data[_HEAD.size:]


def parse_outer_plaintext(data: bytes, params: int) -> Choice:
    """Inverse of :func:`outer_plaintext`; :class:`panpriv.streamer.esa.wire.WireError` on a wrong length."""
    if len(data) != _CHOICE.size + inner_size(params):
        raise wire.WireError("malformed")
    slot, key = _CHOICE.unpack_from(data)
    return Choice(None if slot == NO_SLOT else int(slot), int(key), data[_CHOICE.size:])
