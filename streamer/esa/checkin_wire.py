"""The bytes of ``checkin`` in Encode–Shuffle–Analyze (random check-ins, Balle et al. 2020 Algs 1–2).

A check-in message is an ordinary onion-sealed message of :mod:`panpriv.streamer.esa.wire` whose
round is the client's **wake slot** (public: her record's position) and whose body, inside the
shuffler's layer, is her choice and her update::

    b"PPE2" | wake slot (u64) | shuffler key id | sealed box to the SHUFFLER of:
        wake slot (u64) | chosen slot (u64; 2^64 − 1: no check-in) | choice key (u64) | unit

The **unit** is the update sealed to the **analyzer** (a vector unit, ``PPU2``), its sealed round the
chosen slot (the wake slot for a client who does not check in)::

    b"PPU2" | analyzer key id | sealed box to the ANALYZER of: chosen slot (u64) | p × float64

A client who does not check in seals the randomizer applied to the zero vector instead (same size,
same work: :mod:`panpriv.streamer.esa.checkin_client`). The shuffler opens its layer only: it learns
the chosen slot and the choice key, never the update. It releases a slot as a signed batch
(:mod:`panpriv.streamer.esa.batches`, round = the slot) of units, byte for byte as the clients sealed
them — so the analyzer's input holds no client identity, wake slot or key, and no released unit
appears on the messages topic (there it is inside the shuffler's box).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from panpriv.streamer.esa import wire

NO_SLOT = (1 << 64) - 1
"""The chosen slot of a client who does not check in."""

_CHOICE = struct.Struct(">QQ")


def unit_size(params: int) -> int:
    """Bytes of every update unit (a vector unit of ``params`` coordinates)."""
    return wire.vector_unit_size(params)


def message_size(params: int) -> int:
    """Bytes of every check-in message for ``params`` coordinates."""
    return wire.message_size_for(_CHOICE.size + unit_size(params))


def body(slot: int | None, key: int, unit: bytes) -> bytes:
    """What the client seals to the shuffler after the wake slot: the chosen slot (``None``: no
    check-in), her choice key, the unit."""
    return _CHOICE.pack(NO_SLOT if slot is None else slot, key) + unit


@dataclass(frozen=True)
class Choice:
    """The opened outer layer: the chosen slot (``None``: no check-in), the key, the unit."""

    slot: int | None
    key: int
    unit: bytes


def parse_body(data: bytes, params: int) -> Choice:
    """Inverse of :func:`body`; :class:`panpriv.streamer.esa.wire.WireError` on a wrong length or a unit
    that is not one."""
    if len(data) != _CHOICE.size + unit_size(params) or data[_CHOICE.size:_CHOICE.size + 4] != wire.UNIT_MAGIC:
        raise wire.WireError("malformed")
    slot, key = _CHOICE.unpack_from(data)
    return Choice(None if slot == NO_SLOT else int(slot), int(key), data[_CHOICE.size:])
