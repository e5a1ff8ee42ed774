"""Memory hygiene: after ``learn_many`` returns, the process holds no pure noise and no clean data.

Pan-privacy lets an intruder read the learner's state once; an intruder who reads the whole
process memory also sees freed buffers. Each test runs one learner (OS-entropy noise, the
pan-private mode) in a child process, lets it learn one micro-batch, and then — while the child
waits on a pipe, allocating nothing — reads every writable mapping of the child through
``/proc/<pid>/mem`` (:mod:`tests.memscan`). The parent recomputes the clean contribution from the
same records and the query point the child reported *before* learning, and fails if memory holds:

- a clean per-record gradient row (clipped, as the learner adds it) or a raw feature row (the
  child zeroes its own input arrays in place first);
- pan-acsa: the clean partial batch sum or mean (``Σ g_i`` and ``Σ g_i / b``); with
  ``noise="secure"``, the clean integer sum in grid units; pan-ftrl: the clean partial leaf sum;
- the pure noise: a vector V such that another vector W in memory satisfies W − V = the clean
  contribution (pan-acsa: Z_t and Z_t + Σ g_i/b; pan-ftrl: an open node's Z and Z + Σ g_i; PNSGD: the step's draw and gradient + draw;
  shuffle-gaussian/checkin: one user's noise and her message) — found without knowing the noise;
- PVEC learners (shuffle-sgd/acsa/gd): a user's fixed-point encoding s = (x + Δ₂)g/Δ or its
  randomized rounding ⌊s + U⌋ (float64 or int64) — her message minus the binomial noise, which
  reveals x to within Δ/g per coordinate.

A last test looks for the noise draw itself (pan-acsa, float and secure): the child's OS entropy
is a seeded stream the parent replays, so the parent knows the batch's first draw and counts its
coordinates in the child's memory, against plain draw buffers as the control.

Modes: ``mid`` stops inside a batch/round, ``end`` right after one completes. Dimensions: d = 20
(p = 21: buffers of ≤ 128 floats, which numpy caches and hands to the next same-size allocation)
and d = 300 (malloc'd buffers). The child sends only Python ints/bytes after learning, never a
numpy array, so it cannot overwrite residue with the test's own allocations.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from panpriv.protocols import secure_noise
from panpriv.protocols.base import Learner
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.discrete_gaussian import GeneratorUniform, sample_discrete_gaussian
from panpriv.protocols.losses import clip_rows
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.pan_ftrl import PanPrivateFTRL
from panpriv.protocols.pnsgd import OnlinePNSGD
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.protocols.shuffle_gd import ShuffleGD
from panpriv.protocols.shuffle_sgd import ShuffleSGD
from tests.memscan import Memory, child_memory_words, read_memory

LOSS = {"name": "logistic", "intercept": True}
BATCH = 64
RELATIVE_TOLERANCE = 1e-9
"""Vectors match within this fraction of the target's largest coordinate (summation order may
differ between the learner and the test; any random coincidence over ≥ 21 coordinates at this
tolerance is impossible in practice)."""


def _records(dim: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """m records with features of norm 0.9 (< the feature bound 1: clipping is the identity) and
    0/1 labels, the same in child and parent; built in place (no scaled copy left behind)."""
    rng = np.random.default_rng(1000 + dim + m)
    X = rng.standard_normal((m, dim))
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    np.divide(0.9, norms, out=norms)
    X *= norms[:, None]
    y = (rng.random(m) < 0.5).astype(np.float64)
    return X, y


@dataclass(frozen=True)
class Case:
    """One learner: how to build it, where its next gradients are taken, how many records to feed
    for each mode, the gradient clip norm, and which residue checks apply."""

    make: Callable[[int, Any], Learner]
    query: Callable[[Any], np.ndarray]
    records: Callable[[Any, str], int]
    clip: Callable[[Any], float]
    kind: str  # "accumulator" (pan-acsa), "grid" (secure pan-acsa), "tree" (pan-ftrl), "step" (pnsgd), "pvec",
    # "additive" (Gaussian messages), "rows" (rows only)
    modes: tuple[str, ...] = ("mid", "end")
    one_at_a_time: bool = False  # the records through learn_one, one call each (pan-acsa's row path)


def _pvec_round(learner: Any, mode: str) -> int:
    n = learner._round_sum().n
    return n // 2 if mode == "mid" else n


def _acsa_batch(learner: Any, mode: str) -> int:
    b = learner.current_plan().batch_size(learner._iterate.batch)
    return b // 2 if mode == "mid" else b


CASES: dict[str, Case] = {
    "pan-acsa": Case(
        make=lambda d, rng: PanPrivateACSA(d, LOSS, 1.0, 1e-6, horizon=20_000, batch_size=BATCH, rng=rng),
        query=lambda learner: learner._iterate.theta_md,
        records=_acsa_batch,
        clip=lambda learner: learner.gradient_norm_bound,
        kind="accumulator",
    ),
    "pan-acsa-secure": Case(
        make=lambda d, rng: PanPrivateACSA(
            d, LOSS, 1.0, 1e-6, horizon=20_000, batch_size=BATCH, noise="secure", rng=rng
        ),
        query=lambda learner: learner._iterate.theta_md,
        records=_acsa_batch,
        clip=lambda learner: learner.gradient_norm_bound,
        kind="grid",
    ),
    "pan-ftrl": Case(
        make=lambda d, rng: PanPrivateFTRL(d, LOSS, 1.0, 1e-6, horizon=20_000, leaf_size=BATCH, rng=rng),
        query=lambda learner: learner._theta,
        records=lambda learner, mode: BATCH // 2 if mode == "mid" else BATCH,
        clip=lambda learner: learner.gradient_norm_bound,
        kind="tree",
    ),
    "pnsgd": Case(
        make=lambda d, rng: OnlinePNSGD(d, LOSS, 1.0, eta=0.1, radius=1.0, rng=rng),
        query=lambda learner: learner._theta,
        records=lambda learner, mode: 1,  # one step: its query point is the one the child reports
        clip=lambda learner: learner._lipschitz,
        kind="step",
        modes=("mid",),
    ),
    "shuffle-sgd": Case(
        make=lambda d, rng: ShuffleSGD(d, LOSS, 1.0, 1e-6, batch_size=BATCH, rng=rng),
        query=lambda learner: learner._sgd.theta,
        records=_pvec_round,
        clip=lambda learner: learner._lipschitz,
        kind="pvec",
    ),
    "shuffle-acsa": Case(
        make=lambda d, rng: ShuffleACSA(d, LOSS, 1.0, 1e-6, horizon=20_000, batch_size=BATCH, rng=rng),
        query=lambda learner: learner._iterate.theta_md,
        records=_pvec_round,
        clip=lambda learner: learner._lipschitz,
        kind="pvec",
    ),
    "shuffle-gd": Case(
        make=lambda d, rng: ShuffleGD(d, LOSS, 1.0, 1e-6, n=BATCH, rng=rng),
        query=lambda learner: learner._sgd.theta,
        records=_pvec_round,
        clip=lambda learner: learner._lipschitz,
        kind="pvec",
    ),
    "shuffle-gaussian": Case(
        make=lambda d, rng: ShuffleGaussianSGD(d, LOSS, 1.0, 1e-6, batch_size=BATCH, rng=rng),
        query=lambda learner: learner._sgd.theta,
        records=lambda learner, mode: learner._round.window // 2 if mode == "mid" else learner._round.window,
        clip=lambda learner: learner._clip,
        kind="additive",
    ),
    "checkin": Case(
        make=lambda d, rng: RandomCheckinSGD(d, LOSS, 1.0, 1e-6, randomizer="gaussian", slots=1000, rng=rng),
        query=lambda learner: learner._sgd.theta,
        records=lambda learner, mode: 40,
        clip=lambda learner: learner._clip,
        kind="additive",
        modes=("mid",),
    ),
    "checkin-l2": Case(  # the l2-ball randomizer is not additive: clean rows and features only
        make=lambda d, rng: RandomCheckinSGD(d, LOSS, 1.0, 1e-6, randomizer="l2", slots=1000, rng=rng),
        query=lambda learner: learner._sgd.theta,
        records=lambda learner, mode: 40,
        clip=lambda learner: learner._clip,
        kind="rows",
        modes=("mid",),
    ),
}

CASES["pan-acsa-learn-one"] = replace(CASES["pan-acsa"], one_at_a_time=True)  # learn_one's row path

def _child(conn: Any, name: str, dim: int, mode: str) -> None:
    """Learn one micro-batch with OS-entropy noise, zero the inputs in place, then wait."""
    case = CASES[name]
    learner = case.make(dim, None)
    m = case.records(learner, mode)
    X, y = _records(dim, m)
    conn.send((m, case.query(learner).tobytes()))
    if case.one_at_a_time:
        for row in range(m):
            learner.learn_one(X[row], y[row : row + 1].reshape(()))  # a 0-d view: no float of the caller's
    else:
        learner.learn_many(X, y)
    X.fill(0.0)
    y.fill(0.0)
    conn.send("learned")
    conn.recv()


def _tolerance(target: np.ndarray) -> float:
    return RELATIVE_TOLERANCE * float(np.max(np.abs(target)))


def _findings(name: str, dim: int, m: int, theta: np.ndarray, memory: Memory) -> list[str]:
    """What the intruder finds, as readable lines (empty: clean)."""
    case = CASES[name]
    twin = case.make(dim, 0)
    X, y = _records(dim, m)
    Z, labels = twin.loss.features(X, twin.feature_bound), twin.loss.labels(y)
    G = clip_rows(twin.loss.gradient(theta, Z, labels), case.clip(twin))
    found: list[str] = []

    def look(label: str, hits: list[Any]) -> None:
        if hits:
            found.append(f"{label}: {len(hits)} hit(s)")

    sample = sorted({0, m // 2, m - 1}) if case.kind != "step" else [0]
    for k in sample:
        look(f"clean gradient row {k}", memory.find_vector(G[k], _tolerance(G[k])))
        look(f"raw feature row {k}", memory.find_vector(X[k], _tolerance(X[k])))
    if case.kind == "accumulator":
        total = G.sum(axis=0)
        batch = twin.current_plan().batch_size(1)
        look("clean batch sum", memory.find_vector(total, _tolerance(total)))
        look("clean batch mean", memory.find_vector(total / batch, _tolerance(total)))
        look("pure noise (V, V + clean mean)", memory.find_difference(total / batch, _tolerance(total / batch)))
    elif case.kind == "tree":  # pan-ftrl: every open node holds its draw Z plus the leaf's records
        total = G.sum(axis=0)
        look("clean leaf sum", memory.find_vector(total, _tolerance(total)))
        look("pure noise (Z, Z + clean leaf sum)", memory.find_difference(total, _tolerance(total)))
    elif case.kind == "grid":  # secure pan-acsa: the clean batch sum in integer grid units
        total = secure_noise.grid_sum(G, case.clip(twin))
        look("clean batch sum (grid units, int64)", memory.find_int_rows(total, total))
    elif case.kind in ("step", "additive"):
        for k in sample[:2]:
            look(f"pure noise of record {k} (V, V + gradient)", memory.find_difference(G[k], _tolerance(G[k])))
    elif case.kind == "pvec":
        vector_sum = twin._round_sum()
        encoded = np.clip(G * (vector_sum.g / (2.0 * vector_sum.l2_bound)) + 0.5 * vector_sum.g, 0.0, vector_sum.g)
        for k in sample:
            look(f"encoding s of user {k}", memory.find_vector(encoded[k], _tolerance(encoded[k])))
            low = np.floor(encoded[k] - 1e-9)
            high = np.floor(encoded[k] + 1e-9) + 1.0
            look(f"rounded encoding of user {k} (float64)", memory.find_float_rows(np.maximum(low, 1e-30), high))
            look(f"rounded encoding of user {k} (int64)", memory.find_int_rows(low.astype(np.int64), high.astype(np.int64)))
    return found


def scan(name: str, dim: int, mode: str) -> list[str]:
    """Run learner ``name`` in a child, read its memory after ``learn_many``, return the findings."""
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    child = context.Process(target=_child, args=(there, name, dim, mode), daemon=True)
    child.start()
    try:
        if not here.poll(120):
            raise TimeoutError(f"{name}: child did not start learning")
        m, theta_bytes = here.recv()
        if not here.poll(120) or here.recv() != "learned":
            raise TimeoutError(f"{name}: child did not finish learn_many")
        memory = Memory(read_memory(child.pid))
        return _findings(name, dim, m, np.frombuffer(theta_bytes, dtype=np.float64), memory)
    finally:
        here.send("done")
        child.join(30)
        if child.is_alive():
            child.kill()


def _can_read_child_memory() -> bool:
    return sys.platform == "linux" and os.path.exists("/proc/self/mem")


LARGE_IN_MAKE_TEST = ("pan-acsa", "pan-acsa-learn-one", "pan-acsa-secure", "pan-ftrl")
"""Learners whose d = 300 scans run in ``make test``; the others' (4-35 s each) run in ``make soak``.
Every learner's own buffers are scanned at d = 20 here; d = 300 adds numpy's large-buffer
allocation path (no small-block cache), which pan-acsa exercises in both noise modes, and pan-ftrl."""

PARAMETERS = [
    pytest.param(
        name, dim, mode, id=f"{name}-d{dim}-{mode}",
        marks=[pytest.mark.soak] if dim > 20 and name not in LARGE_IN_MAKE_TEST else [],
    )
    for name, case in CASES.items()
    for dim in (20, 300)
    for mode in case.modes
]


@pytest.mark.slow
@pytest.mark.skipif(not _can_read_child_memory(), reason="needs Linux /proc/<pid>/mem")
@pytest.mark.parametrize(("name", "dim", "mode"), PARAMETERS)
def test_no_pure_noise_or_clean_data_left_in_memory(name: str, dim: int, mode: str) -> None:
    assert scan(name, dim, mode) == []


@pytest.mark.slow
@pytest.mark.skipif(not _can_read_child_memory(), reason="needs Linux /proc/<pid>/mem")
def test_the_scan_finds_a_planted_vector() -> None:
    """The scanner itself works: it finds a vector the child keeps, and a pair (V, V + c)."""
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    child = context.Process(target=_planted_child, args=(there,), daemon=True)
    child.start()
    try:
        assert here.poll(120)
        planted = np.frombuffer(here.recv(), dtype=np.float64)
        memory = Memory(read_memory(child.pid))
        assert memory.find_vector(planted, _tolerance(planted))
        assert memory.find_difference(planted - 1.0, 1e-12)  # (base, shifted) in the child
    finally:
        here.send("done")
        child.join(30)


def _planted_child(conn: Any) -> None:
    kept = np.random.default_rng(7).standard_normal(21)
    base = np.full(21, 1.5)
    shifted = base + (kept - 1.0)
    conn.send(kept.tobytes())
    conn.recv()
    assert shifted.size == base.size == 21  # both stay alive until the parent has read them


_KNOWN_KEY = (0x1234567890ABCDEF, 0x0FEDCBA987654321, 0x1111222233334445, 0x5555666677778888)
_PCG64_MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645


def _known_key_child(conn: Any, name: str, dim: int, wipe: bool) -> None:
    """Learn one micro-batch with the OS key replaced by a known one, so that the parent can
    recompute every PCG64 state the draws went through."""
    import panpriv.protocols.randomness as randomness

    def known(view: memoryview) -> None:
        np.frombuffer(view, dtype=np.uint64)[:] = np.array(_KNOWN_KEY, dtype=np.uint64)

    randomness._read_entropy = known  # where every OS read goes (fill_from_os and the rekeying)
    case = CASES[name]
    learner = case.make(dim, None)
    if not wipe:  # the control: the scan must find the state when it is not zeroed
        learner._noise._keyed.wipe = lambda: None
    X, y = _records(dim, case.records(learner, "mid"))
    learner.learn_many(X, y)
    conn.send("learned")
    conn.recv()


def _pcg64_states_found(name: str, dim: int, wipe: bool, steps: int = 20_000) -> list[int]:
    """Steps k ≤ ``steps`` whose PCG64 state (low or high 64-bit word) is in the child's memory."""
    words = set(child_memory_words(_known_key_child, (name, dim, wipe), "learned").tolist())
    state = _KNOWN_KEY[1] << 64 | _KNOWN_KEY[0]
    increment = _KNOWN_KEY[3] << 64 | _KNOWN_KEY[2] | 1
    found = []
    for k in range(1, steps + 1):
        state = (state * _PCG64_MULTIPLIER + increment) % (1 << 128)
        if state & (2**64 - 1) in words or state >> 64 in words:
            found.append(k)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not _can_read_child_memory(), reason="needs Linux /proc/<pid>/mem")
@pytest.mark.parametrize(
    "name", ["pan-acsa", pytest.param("shuffle-sgd", marks=pytest.mark.soak), pytest.param("shuffle-gaussian", marks=pytest.mark.soak)]
)  # one shared NoiseSource: pan-acsa in make test, the others in make soak
def test_no_generator_state_of_the_draws_is_left_in_memory(name: str) -> None:
    """No PCG64 state a draw went through (from which the LCG regenerates the draw, backwards
    and forwards) is anywhere in memory — not in the bit generator, not spilled to the stack; the
    same scan finds it when the zeroing is disabled."""
    assert _pcg64_states_found(name, 20, wipe=True) == []
    assert _pcg64_states_found(name, 20, wipe=False) != []


# -- the noise draw itself --------------------------------------------------------------------------

_ENTROPY_SEED = 20_240_432
"""The OS entropy is replaced, in the child and in the parent alike, by this seeded stream: the
parent then knows every draw the child made."""


def _known_entropy() -> Callable[[memoryview], None]:
    generator = np.random.Generator(np.random.PCG64(_ENTROPY_SEED))

    def fill(view: memoryview) -> None:
        np.frombuffer(view, dtype=np.uint8)[:] = generator.integers(0, 256, size=len(view), dtype=np.uint8)

    return fill


def _plain_add_gaussian(self: Any, out: np.ndarray, std: float) -> None:
    """The float control: the draw made into a fresh array that stays referenced (a freed one is
    soon overwritten by the batch's own allocations at this size, so only a kept copy shows that
    the scan finds a float draw wherever it is)."""
    with self.draw() as generator:
        noise = generator.standard_normal(out.shape) * std
    out += noise
    self.kept_draw = noise


def _draw_child(conn: Any, name: str, dim: int, wipe: bool) -> None:
    """Learn half a batch with the OS entropy replaced by :func:`_known_entropy`; with ``wipe``
    False, the draws' buffers are left as a plain implementation leaves them (the control)."""
    import panpriv.protocols.randomness as randomness
    from panpriv.protocols import discrete_gaussian

    randomness._read_entropy = _known_entropy()
    if not wipe:
        discrete_gaussian.Kept.wipe = lambda self: None
        randomness.NoiseSource.add_gaussian = _plain_add_gaussian
    case = CASES[name]
    learner = case.make(dim, None)
    X, y = _records(dim, case.records(learner, "mid"))
    learner.learn_many(X, y)
    X.fill(0.0)
    y.fill(0.0)
    conn.send("learned")
    conn.recv()


def _first_draw(name: str, dim: int, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The child's first noise draw, recomputed here from the same entropy stream: the accumulator
    right after it (it starts from zero)."""
    import panpriv.protocols.randomness as randomness

    monkeypatch.setattr(randomness, "_read_entropy", _known_entropy())
    case = CASES[name]
    twin = case.make(dim, None)
    twin._grad.fill(0)
    twin._add_noise(twin.current_plan().batch_size(1))
    return twin._grad.copy()


def _coordinates_found(words: np.ndarray, draw: np.ndarray) -> int:
    """How many coordinates of ``draw`` (or, for integers, of ±draw) occur as an 8-byte word anywhere."""
    present = set(words.tolist())
    if draw.dtype == np.int64:
        return sum(1 for v in draw.tolist() if (v & (2**64 - 1)) in present or (-v & (2**64 - 1)) in present)
    return sum(1 for v in draw.view(np.uint64).tolist() if v in present)


@pytest.mark.slow
@pytest.mark.skipif(not _can_read_child_memory(), reason="needs Linux /proc/<pid>/mem")
@pytest.mark.parametrize("name", ["pan-acsa", "pan-acsa-secure"])
def test_the_noise_draw_itself_is_not_left_in_memory(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No coordinate of the batch's first draw Z_t — known here because the child's OS entropy is a
    seeded stream the parent replays — is in the child's memory once ``learn_many`` returns (the
    live accumulator holds Z_t + the partial sum, a different vector). Controls: the same scan on a
    child whose draw buffers are left as a plain implementation leaves them (discrete Gaussian:
    its uniforms, magnitudes and signs not wiped — every coordinate is found; float: the draw kept
    in an array of its own) finds most coordinates; and fresh draws the child never made are found
    no more often than by chance."""
    dim = 20
    draw = _first_draw(name, dim, monkeypatch)
    p = draw.size
    wiped = child_memory_words(_draw_child, (name, dim, True), "learned")
    plain = child_memory_words(_draw_child, (name, dim, False), "learned")
    if draw.dtype == np.int64:
        sigma2 = secure_noise.calibrate_draw(1.0, 1e-6).sigma2
        unused = sample_discrete_gaussian(sigma2, p, GeneratorUniform(np.random.default_rng(5)))
    else:
        unused = np.random.default_rng(5).standard_normal(p) * float(np.std(draw))
    found, control, chance = _coordinates_found(wiped, draw), _coordinates_found(plain, draw), _coordinates_found(wiped, unused)
    print(f"\n{name}: {found} of {p} coordinates of the draw found; plain buffers: {control}; unused draws: {chance}")
    assert control >= p // 2, "the control does not find the draw: the scan does not test anything"
    assert found <= max(2, chance + 1), f"{found} of {p} coordinates of the noise draw are in memory"
