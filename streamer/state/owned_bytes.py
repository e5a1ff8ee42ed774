"""Bytes that exist only in buffers panpriv owns and wipes, and base64 computed inside them.

A state written to disk passes through serialised forms — raw array bytes, base64 text, the JSON
document, the sealed manifest. Made with ``ndarray.tobytes``, ``base64.b64encode``, ``json.dumps``
or ``str.encode``, each form is an immutable Python object whose memory is freed, not erased, when
it is dropped: a later read of the process finds every copy ever written (issue 32 found the two
states of one batch that way). :class:`OwnedBytes` is a byte buffer in a numpy array, zeroed by
its owner once used; :func:`b64encode_into` and :func:`b64decode_into` convert between raw bytes
and base64 text inside such buffers, through integer work arrays that are zeroed too, so the text
of an array never exists as a Python ``str`` or ``bytes``.

How numpy is kept from making copies of its own: every ufunc runs with ``out=`` on operands of one
dtype (a cast would go through numpy's iteration buffer, freed unwiped), the uint8 → intp widening
is an assignment (:func:`numpy.copyto` casts element by element, without a buffer), and the table
lookups are ``numpy.take(..., out=, mode="clip")`` with intp indices, which neither converts the
indices nor buffers the output. The last one or two bytes of a buffer whose length is not a
multiple of three are handled on Python ints below 256, which CPython preallocates once and never
frees (no value leaves a trace). ``tests/streamer/test_persisted_states.py`` reads the memory of a
process that wrote and read checkpoints and finds none of these forms.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

_ALPHABET_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_ALPHABET = np.frombuffer(_ALPHABET_BYTES, dtype=np.uint8)
_INVALID = 64
_VALUES = np.full(256, _INVALID, dtype=np.intp)
_VALUES[_ALPHABET] = np.arange(64)
_PAD = ord("=")


class OwnedBytes:
    """``size`` bytes in a numpy buffer that :meth:`wipe` (or leaving a ``with`` block) zeroes."""

    def __init__(self, size: int) -> None:
        self.array: NDArray[np.uint8] = np.zeros(size, dtype=np.uint8)

    @property
    def size(self) -> int:
        return int(self.array.size)

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        """The bytes ``[start, stop)`` as a memoryview (no copy)."""
        return memoryview(self.array.data)[start:stop]

    def wipe(self) -> None:
        self.array.fill(0)

    def __enter__(self) -> OwnedBytes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.wipe()


def read_owned(path: Path) -> OwnedBytes:
    """The whole file at ``path`` read into an :class:`OwnedBytes` (``readv`` straight into the
    buffer: no ``bytes`` object holds the content). Raises ``OSError`` as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        owned = OwnedBytes(size)
        filled = 0
        view = owned.view()
        while filled < size:
            read = os.readv(fd, [view[filled:]])
            if read == 0:  # the file shrank while being read
                break
            filled += read
        if filled < size:
            shorter = OwnedBytes(filled)
            shorter.array[:] = owned.array[:filled]
            owned.wipe()
            return shorter
        return owned
    finally:
        os.close(fd)


def b64_length(size: int) -> int:
    """Characters of the padded base64 text of ``size`` bytes."""
    return 4 * -(-size // 3)


def array_bytes(array: NDArray[Any]) -> NDArray[np.uint8]:
    """The raw bytes of a C-contiguous ``array``, as a uint8 view (no copy)."""
    return array.reshape(-1).view(np.uint8)


def b64encode_into(data: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
    """Write the padded base64 text of ``data`` into ``out`` (of :func:`b64_length` bytes), through
    work arrays that are zeroed before returning (module docstring)."""
    full = data.size // 3
    body = out[: 4 * full].reshape(full, 4)
    wide = np.zeros((full, 3), dtype=np.intp)
    sextets = np.zeros((full, 4), dtype=np.intp)
    spare = np.zeros(full, dtype=np.intp)
    try:
        np.copyto(wide, data[: 3 * full].reshape(full, 3))
        a, b, c = wide[:, 0], wide[:, 1], wide[:, 2]
        np.right_shift(a, 2, out=sextets[:, 0])
        np.bitwise_and(a, 3, out=sextets[:, 1])
        np.left_shift(sextets[:, 1], 4, out=sextets[:, 1])
        np.right_shift(b, 4, out=spare)
        np.bitwise_or(sextets[:, 1], spare, out=sextets[:, 1])
        np.bitwise_and(b, 15, out=sextets[:, 2])
        np.left_shift(sextets[:, 2], 2, out=sextets[:, 2])
        np.right_shift(c, 6, out=spare)
        np.bitwise_or(sextets[:, 2], spare, out=sextets[:, 2])
        np.bitwise_and(c, 63, out=sextets[:, 3])
        np.take(_ALPHABET, sextets, out=body, mode="clip")
    finally:
        wide.fill(0)
        sextets.fill(0)
        spare.fill(0)
    rest = data.size - 3 * full
    if rest:  # one or two bytes: small Python ints (``item`` makes no numpy scalar; module docstring)
        first = data.item(3 * full)
        second = data.item(3 * full + 1) if rest == 2 else 0
        tail = out[4 * full :]
        tail[0] = _ALPHABET_BYTES[first >> 2]
        tail[1] = _ALPHABET_BYTES[((first & 3) << 4) | (second >> 4)]
        tail[2] = _ALPHABET_BYTES[(second & 15) << 2] if rest == 2 else _PAD
        tail[3] = _PAD


def b64decoded_length(text: NDArray[np.uint8]) -> int:
    """Bytes encoded by the padded base64 ``text``; ``ValueError`` if its length is not a
    multiple of four."""
    if text.size % 4:
        raise ValueError("base64 text whose length is not a multiple of 4")
    padding = (text.item(-1) == _PAD) + (text.item(-2) == _PAD) if text.size else 0
    return 3 * (text.size // 4) - padding


def b64decode_into(text: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
    """Decode the padded base64 ``text`` into ``out`` (of :func:`b64decoded_length` bytes), through
    work arrays zeroed before returning; ``ValueError`` for a character outside the alphabet."""
    size = out.size
    quads = text.size // 4
    if size < 3 * quads:  # the last quad is padded: decode it separately
        quads -= 1
    wide = np.zeros((quads, 4), dtype=np.intp)
    values = np.zeros((quads, 4), dtype=np.intp)
    spare = np.zeros(quads, dtype=np.intp)
    triples = np.zeros((quads, 3), dtype=np.intp)
    bad = np.zeros(1, dtype=np.intp)
    try:
        np.copyto(wide, text[: 4 * quads].reshape(quads, 4))
        np.take(_VALUES, wide, out=values, mode="clip")
        np.max(values.reshape(1, -1), axis=1, out=bad, initial=0)
        if bad.item(0) == _INVALID:
            raise ValueError("a character outside the base64 alphabet")
        v0, v1, v2, v3 = values[:, 0], values[:, 1], values[:, 2], values[:, 3]
        np.left_shift(v0, 2, out=triples[:, 0])
        np.right_shift(v1, 4, out=spare)
        np.bitwise_or(triples[:, 0], spare, out=triples[:, 0])
        np.bitwise_and(v1, 15, out=triples[:, 1])
        np.left_shift(triples[:, 1], 4, out=triples[:, 1])
        np.right_shift(v2, 2, out=spare)
        np.bitwise_or(triples[:, 1], spare, out=triples[:, 1])
        np.bitwise_and(v2, 3, out=triples[:, 2])
        np.left_shift(triples[:, 2], 6, out=triples[:, 2])
        np.bitwise_or(triples[:, 2], v3, out=triples[:, 2])
        np.copyto(out[: 3 * quads].reshape(quads, 3), triples, casting="unsafe")
    finally:
        for work in (wide, values, spare, triples, bad):
            work.fill(0)
    rest = size - 3 * quads
    if rest:  # the padded quad: small Python ints
        chars = [text.item(4 * quads + i) for i in range(4)]
        sextets = [_VALUES.item(ch) for ch in chars[: rest + 1]]
        if _INVALID in sextets or chars[rest + 1 :] != [_PAD] * (3 - rest):
            raise ValueError("a character outside the base64 alphabet")
        out[3 * quads] = ((sextets[0] << 2) | (sextets[1] >> 4)) & 255
        if rest == 2:
            out[3 * quads + 1] = ((sextets[1] & 15) << 4 | (sextets[2] >> 2)) & 255
