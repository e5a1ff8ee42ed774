"""The local randomizers leave no clean per-row value behind, and are bitwise the plain formulas.

:meth:`L2BallRandomizer.privatize` and :meth:`GaussianRandomizer.privatize` run wherever a user's
gradient is randomized (the Encode-Shuffle-Analyze check-in client). Written as plain numpy
expressions, they left every row's gradient norm in freed temporaries (``np.minimum(norms, C)``,
``clip_rows``' norms and factors) and in numpy's broadcast buffers. The rewritten forms compute
into arrays they zero; this file checks both that they are the same numbers as the plain formulas
(seeded, bit for bit) and, as an intruder would, that the norms are gone from the process's
memory afterwards (the plain formulas, run the same way, are the control).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from panpriv.protocols.encoder import VectorSum, _drawing
from panpriv.protocols.losses import clip_rows
from panpriv.protocols.randomizers import GaussianRandomizer, L2BallRandomizer, _l2_scale
from tests.memscan import child_memory_words
from tests.protocols.test_scalar_residue import _distinctive, _present, needs_proc_mem

CLIP, EPSILON0, SIGMA, DIM, ROWS = 1.0, 1.0, 2.0, 21, 300
RANDOMIZERS: dict[str, Any] = {
    "l2": L2BallRandomizer(CLIP, EPSILON0),
    "gaussian": GaussianRandomizer(CLIP, SIGMA, 1e-6),
}


def _gradients(seed: int = 4) -> np.ndarray:
    """ROWS rows with distinct norms in [0.2, 1.8] (half beyond C = 1), two zero rows; built in
    place, so that no array of their norms is left behind in the child (the scan would find it)."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((ROWS, DIM))
    scale = rng.uniform(0.2, 1.8, ROWS)  # the norms to be, overwritten in place below
    lengths = np.einsum("ij,ij->i", G, G)
    np.sqrt(lengths, out=lengths)
    scale /= lengths
    G *= scale[:, None]
    scale.fill(0.0)
    lengths.fill(0.0)
    G[:2] = 0.0
    return G


def _plain_l2(randomizer: L2BallRandomizer, G: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """Steps 1-3 of :class:`L2BallRandomizer` as plain numpy expressions (the former code)."""
    k, dim = G.shape
    uniforms = generator.random((k, 2))
    z = generator.standard_normal((k, dim))
    z /= np.maximum(np.sqrt(np.einsum("ij,ij->i", z, z)), np.finfo(np.float64).tiny)[:, None]
    norms = np.sqrt(np.einsum("ij,ij->i", G, G))
    along = np.einsum("ij,ij->i", z, G)
    toward = uniforms[:, 0] < 0.5 + np.minimum(norms, randomizer.clip) / (2.0 * randomizer.clip)
    keep = np.where(toward, along > 0.0, along < 0.0) == (uniforms[:, 1] < randomizer.keep_probability)
    scale = _l2_scale(randomizer.clip, randomizer.epsilon0, dim)
    return np.where(keep | (norms == 0.0), scale, -scale)[:, None] * z


def _plain_gaussian(randomizer: GaussianRandomizer, G: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    return clip_rows(G, randomizer.clip) + generator.normal(0.0, randomizer.noise_std, size=G.shape)


PLAIN = {"l2": _plain_l2, "gaussian": _plain_gaussian}


@pytest.mark.parametrize("name", list(RANDOMIZERS))
def test_privatize_is_bitwise_the_plain_formula(name: str) -> None:
    """Same seed, same messages, bit for bit (zero rows and rows beyond C included); the caller's
    rows are untouched. Control: another seed gives other messages."""
    G = _gradients()
    before = G.copy()
    messages = RANDOMIZERS[name].privatize(G, np.random.default_rng(9))
    np.testing.assert_array_equal(messages, PLAIN[name](RANDOMIZERS[name], G, np.random.default_rng(9)))
    np.testing.assert_array_equal(G, before)
    assert not np.array_equal(messages, RANDOMIZERS[name].privatize(G, np.random.default_rng(10)))


def test_dummy_is_privatize_of_zero_rows() -> None:
    """R(0) advances the generator as privatize of zero rows and gives the same messages."""
    randomizer = RANDOMIZERS["l2"]
    dummies = randomizer.dummy(50, DIM, np.random.default_rng(11))
    np.testing.assert_array_equal(dummies, randomizer.privatize(np.zeros((50, DIM)), np.random.default_rng(11)))


def _child(conn: Any, name: str, plain: bool) -> None:
    """Randomize the rows, zero them and the messages, wait for the parent's read."""
    G = _gradients()
    randomizer = RANDOMIZERS[name]
    generator = np.random.default_rng(12)
    messages = PLAIN[name](randomizer, G, generator) if plain else randomizer.privatize(G, generator)
    G.fill(0.0)
    messages.fill(0.0)
    conn.send("randomized")
    conn.recv()


def _norms_found(name: str, plain: bool) -> int:
    """How many of the rows' distinctive norms (and squared norms) are in the child's memory."""
    words = child_memory_words(_child, (name, plain), "randomized")
    G = _gradients()
    squares = np.einsum("ij,ij->i", G, G)
    targets = np.unique(np.concatenate([_distinctive(np.sqrt(squares)), _distinctive(squares)]).view(np.uint64))
    return int(_present(targets, words).size)


@pytest.mark.slow
@needs_proc_mem
@pytest.mark.parametrize("name", list(RANDOMIZERS))
def test_privatize_leaves_no_row_norm_in_memory(name: str) -> None:
    """After privatize (its input and output zeroed by the caller), no row's norm is left.
    Control: the plain formulas leave many."""
    assert _norms_found(name, plain=False) == 0
    assert _norms_found(name, plain=True) > ROWS // 10


# PVEC's literal per-user randomizer (VectorSum.randomize_bits, a client's wire messages)
PVEC = VectorSum(n=200, d=DIM, epsilon=1.0, delta=1e-5, l2_bound=1.0)
PVEC_USERS = 40


def _plain_randomize_bits(encoder: VectorSum, x: np.ndarray, rng: int) -> np.ndarray:
    """The former ``randomize_bits``, as plain expressions: the same messages, its temporaries
    (the encoding s, ⌊s⌋, s − ⌊s⌋, the uniforms) freed unerased."""
    encoded = np.clip(x * encoder._encode_scale + 0.5 * encoder.g, 0.0, encoder.g)
    floor = np.floor(encoded)
    with _drawing(rng) as generator:
        rounding_bit = generator.random(encoder.d) < encoded - floor
        noise_bits = generator.random((encoder.d, encoder.b)) < encoder.p
    ones = floor.astype(np.int64) + rounding_bit + noise_bits.sum(axis=1)
    per_label = encoder.g + encoder.b
    labels = np.repeat(np.arange(encoder.d, dtype=np.int64), per_label)
    bits = (np.arange(per_label)[None, :] < ones[:, None]).astype(np.int64).ravel()
    return np.stack([labels, bits], axis=1)


def _pvec_rows() -> np.ndarray:
    """Users' vectors of norm ≤ 0.9 (inside Δ₂ = 1), in place."""
    G = _gradients(5)[:PVEC_USERS]
    G *= 0.5
    return G


def test_randomize_bits_is_bitwise_the_plain_formula() -> None:
    """The wiped form sends the same messages as the plain one, seed for seed. Control: another
    seed sends others."""
    for i, x in enumerate(_pvec_rows()):
        np.testing.assert_array_equal(PVEC.randomize_bits(x, rng=i), _plain_randomize_bits(PVEC, x, i))
    x = _pvec_rows()[3]
    assert not np.array_equal(PVEC.randomize_bits(x, rng=1), PVEC.randomize_bits(x, rng=2))


def _bits_child(conn: Any, plain: bool) -> None:
    """Each user's messages, made and zeroed in turn; then wait for the parent's read."""
    X = _pvec_rows()
    for i, x in enumerate(X):
        messages = _plain_randomize_bits(PVEC, x, i) if plain else PVEC.randomize_bits(x, rng=i)
        messages.fill(0)
    X.fill(0.0)
    conn.send("randomized")
    conn.recv()


@pytest.mark.slow
@needs_proc_mem
def test_randomize_bits_leaves_no_encoding_in_memory() -> None:
    """After every user's messages (zeroed by the caller), none of their distinctive encodings
    s = x·g/Δ + g/2 or fractions s − ⌊s⌋ is in memory. Control: the plain form leaves the last
    users' values."""
    X = _pvec_rows()
    encoded = X * PVEC._encode_scale + 0.5 * PVEC.g
    targets = np.unique(np.concatenate([_distinctive(encoded.ravel()),
                                        _distinctive((encoded - np.floor(encoded)).ravel())]).view(np.uint64))

    def found(plain: bool) -> int:
        return int(_present(targets, child_memory_words(_bits_child, (plain,), "randomized")).size)

    assert found(plain=False) == 0
    assert found(plain=True) > 0
