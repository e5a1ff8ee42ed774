"""Where the learners' noise randomness comes from, and why none of it stays in memory.

Pan-privacy (Cheu et al. 2022, Def. C.2) lets an intruder read the internal state once. If the
state held a pseudo-random generator, the intruder could predict every noise vector still to be
added — and, since PCG64's LCG can be stepped backwards (O'Neill 2014), *regenerate* every noise
vector already added and subtract it from the accumulator. The intruder of the threat model reads
the whole process memory, freed buffers included, so "no generator is kept" is not enough: the
freed generator, its seed and its seed sequence must not be readable either.

So, by default (``rng=None``), :meth:`NoiseSource.draw` keys one long-lived PCG64 bit generator
with 256 bits read from the OS (``/dev/urandom`` via ``os.readv``, straight into the bit
generator's own state words: no Python ``int``, ``bytes`` or copy holds them), lets the caller
draw, and then overwrites the bit generator's state (state, increment, buffered half-word) with
zeros. No
``SeedSequence`` is ever built from secret entropy. Between draws the generator's state is zero:
there is nothing to predict or regenerate. The noise values themselves are drawn straight into
buffers the caller owns and wipes (:meth:`NoiseSource.add_gaussian` adds into an accumulator
through a scratch buffer it zeroes). The distribution is numpy's own (ziggurat normal etc.), so the
learners' mechanisms are unchanged.

The PCG64 state is written through ``BitGenerator.ctypes.state_address`` (numpy's documented
ctypes interface); the layout (a pointer to {state, inc} as 128-bit little-endian words) is checked
once per process against ``BitGenerator.state``, and a mismatch refuses to run rather than leave
state behind.

Noise of the records in flight: one key per sub-block
-----------------------------------------------------
The learners that draw per record (``pnsgd``, ``checkin``) key the generator once per sub-block of
at most :data:`NOISE_BLOCK_ROWS` records of the micro-batch being learned and draw that
sub-block's noise (and other randomness) from it, instead of re-keying per record. The formal
intrusion (Cheu et al. 2022, App. C) happens between record updates; a read of the process
*inside* ``learn_many`` finds the micro-batch in flight in the clear anyway (its features and
labels are in scratch: docs/privacy.md, "Process memory"), and those records have no intrusion
guarantee against such a read. What a read inside a sub-block can add is the randomness of that
sub-block's records only — records in flight. Randomness of earlier records is gone (their
sub-blocks' buffers are zeroed and each key was zeroed before the next was read from the OS:
PCG64 stepped backwards from one key never reaches another key's stream), and that of later
records is not drawn. Everything such an intruder sees is a function of the state at the
sub-block's start, of the in-flight records and their randomness, and (for outputs after the
read) of later records and fresh randomness — identical in two neighbouring streams that differ
in a record outside the sub-block — so every record outside the sub-block keeps the guarantee of
one read of the state at the sub-block's start: its stated intrusion guarantee. Between
micro-batches nothing of it remains (buffers zeroed, generator state zeroed), so the state an
intrusion between micro-batches reads is exactly what it was with a key per record.

Passing an explicit ``rng`` (a seed or a ``numpy.random.Generator``) is the labelled replay/testing
mode (Scientific Python SPEC 7): reproducible, and *not* pan-private, because the generator then
lives in the learner's memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os

import numpy as np
from numpy.typing import NDArray

RngLike = int | np.random.Generator | None

_STATE_WORDS = 4  # PCG64: 128-bit state + 128-bit increment, as four little-endian uint64 words

NOISE_BLOCK_ROWS = 128
"""Records per key of the per-record learners (module docstring, "Noise of the records in
flight"): a read inside ``learn_many`` finds at most this many records' randomness."""


def fill_from_os(buffer: NDArray) -> None:
    """Fill ``buffer`` (C-contiguous) with OS entropy, in place (no intermediate bytes object)."""
    _read_entropy(memoryview(buffer.data).cast("B"))


def _read_entropy(view: memoryview) -> None:
    """Fill the bytes of ``view`` from ``/dev/urandom`` (one ``readv`` unless the read is short)."""
    fd = _urandom_fd()
    filled = 0
    while filled < len(view):
        read = os.readv(fd, [view[filled:] if filled else view])
        if read <= 0:
            raise OSError("reading /dev/urandom returned no data")
        filled += read


@functools.cache
def _urandom_fd() -> int:
    return os.open("/dev/urandom", os.O_RDONLY | os.O_CLOEXEC)


class _KeyedPCG64:
    """A PCG64 generator whose state is set from OS entropy for one draw and zeroed after it."""

    def __init__(self) -> None:
        self._bit_generator = np.random.PCG64(0)  # seed 0: a public placeholder, overwritten per draw
        self.generator = np.random.Generator(self._bit_generator)
        address = self._bit_generator.ctypes.state_address
        # numpy's pcg64_state: {pcg64_random_t *pcg_state; int has_uint32; uint32_t uinteger;}
        pcg_state = ctypes.c_void_p.from_address(address).value
        if pcg_state is None:
            raise RuntimeError("numpy's PCG64 has no state pointer: cannot key it from OS entropy")
        self._pcg_state: int = pcg_state
        self._buffered = address + ctypes.sizeof(ctypes.c_void_p)
        # The generator's own state words, as an array: OS entropy is read straight into them, so
        # the key never exists anywhere else (no copy to wipe).
        self._state = np.ctypeslib.as_array((ctypes.c_uint64 * _STATE_WORDS).from_address(pcg_state))
        self._state_bytes = memoryview(self._state.data).cast("B")  # made once: rekeying runs per draw
        self._increment_low = ctypes.c_uint8.from_address(pcg_state + 16)  # low byte of inc's low word
        # has_uint32 and the buffered 32-bit half-word (8 bytes after the state pointer).
        self._buffered_words = np.ctypeslib.as_array((ctypes.c_uint64 * 1).from_address(self._buffered))
        _check_layout(self)

    def rekey(self) -> None:
        _read_entropy(self._state_bytes)
        self._increment_low.value |= 1  # PCG64's increment must be odd

    def __enter__(self) -> np.random.Generator:
        try:
            self.rekey()
        except BaseException:
            self.wipe()  # a failed read may have keyed part of the state
            raise
        return self.generator

    def __exit__(self, *exc_info: object) -> None:
        self.wipe()

    def wipe(self) -> None:
        self._state.fill(0)
        self._buffered_words.fill(0)


def _check_layout(keyed: _KeyedPCG64) -> None:
    """Refuse to run if numpy's PCG64 state is not where :class:`_KeyedPCG64` writes it."""
    keyed._state[:] = np.array([1, 2, 2, 5], dtype=np.uint64)  # the odd-making byte turns 2 into 3
    keyed._increment_low.value |= 1
    state = keyed._bit_generator.state["state"]
    keyed.wipe()
    if state != {"state": 2 << 64 | 1, "inc": 5 << 64 | 3} or keyed._bit_generator.state["state"] != {
        "state": 0,
        "inc": 0,
    }:
        raise RuntimeError(
            "panpriv.protocols.randomness: this numpy's PCG64 state layout is not the one expected; the "
            "noise generator could not be wiped after use, so the pan-private mode refuses to run"
        )


class NoiseSource:
    """Hands out the randomness of noise draws.

    Parameters
    ----------
    rng
        ``None`` (default): every :meth:`draw` keys a generator with 256 bits from the OS and zeroes
        its state afterwards (module docstring). An int or ``Generator``: one seeded generator
        reused for every draw — reproducible, for tests and replays only.
    """

    def __init__(self, rng: RngLike = None) -> None:
        self._fixed = None if rng is None else np.random.default_rng(rng)
        self._keyed = _KeyedPCG64() if rng is None else None
        self._scratch = np.zeros(0)

    @property
    def is_seeded(self) -> bool:
        """True in the explicit replay/testing mode (a fixed generator is held in memory)."""
        return self._fixed is not None

    def draw(self) -> contextlib.AbstractContextManager[np.random.Generator]:
        """A generator for one draw (or one block of draws), valid inside the ``with`` block only:
        on exit its state is zeroed (OS-entropy mode). Whatever the caller draws into arrays of its
        own, the caller wipes. (A reused context object, not a generator function: the per-draw
        overhead matters to the learners that draw once per record.)"""
        if self._fixed is not None:
            return contextlib.nullcontext(self._fixed)
        assert self._keyed is not None
        return self._keyed

    def add_gaussian(self, out: NDArray[np.float64], std: float) -> None:
        """``out += N(0, std² I)`` in place, through a reused scratch buffer zeroed afterwards: no
        array holding the pure noise outlives the call. In the seeded mode this is bitwise the
        same as ``out + generator.normal(0.0, std, out.shape)``."""
        size = out.size
        if self._scratch.size < size:
            self._scratch.fill(0.0)
            self._scratch = np.zeros(size)
        noise = self._scratch[:size].reshape(out.shape)
        try:
            with self.draw() as generator:
                generator.standard_normal(out=noise)
            noise *= std
            out += noise
        finally:
            noise.fill(0.0)

    def add_laplace(self, out: NDArray[np.float64], scale: float) -> None:
        """``out += Laplace(0, scale)`` per coordinate, in place; the drawn array is zeroed before
        it is dropped (``Generator.laplace`` has no ``out=``)."""
        with self.draw() as generator:
            noise = generator.laplace(0.0, scale, size=out.shape)
        try:
            out += noise
        finally:
            noise.fill(0.0)


def wipe(*arrays: NDArray) -> None:
    """Overwrite arrays with zeros in place (scratch that held clean data or pure noise)."""
    for array in arrays:
        array.fill(0)


SEEDED_WARNING = (
    "noise generator explicitly seeded (replay/testing mode): the noise is reproducible and an "
    "intruder who reads the process memory can predict future noise, so the pan-private guarantee "
    "does not hold in this mode"
)
