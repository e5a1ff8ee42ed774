"""Memory hygiene for per-record *scalars*: after ``learn_many`` no record's norm, margin or slope is left.

:mod:`tests.protocols.test_memory_residue` looks for clean vectors (feature and gradient rows,
partial sums, noise). A clean scalar per record — the feature row's norm ‖z_i‖ (and its square),
the margin ⟨θ, z_i⟩, the loss's slope φ′ — is just as much a record's data, and it travels by
other roads: Python floats freed onto CPython's free list (pnsgd and checkin compute them per
record), and numpy's ufunc iteration buffers, which hold broadcast copies of per-row factors
(``M *= c[:, None]``). :mod:`panpriv.protocols.scalar_residue` closes both; this test is the intruder.

Each learner runs in a child in the replay mode (a fixed seed, so that a twin in the parent goes
through exactly the same values; the scalar arithmetic is the same as with OS entropy). The child
learns a warm-up micro-batch (so the model is not at 0, where every slope is ±½), then the target
micro-batch, zeroes its inputs and waits; the parent reads all its writable memory. The twin
learns the same micro-batches with the losses' link derivative spied on, which gives every margin
and slope the learner computed for the target records. Only values that are distinctive are
looked for: unique among the targets and not 0, ±½ or ±1 (any 64-bit pattern of a continuous
value found by chance is out of the question).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from panpriv.protocols import scratch
from panpriv.protocols.base import Learner
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.pan_ftrl import PanPrivateFTRL
from panpriv.protocols.pnsgd import OnlinePNSGD
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.protocols.shuffle_sgd import ShuffleSGD
from tests.memscan import child_memory_words

LOSS = {"name": "logistic", "intercept": True}
SQUARED = {"name": "squared", "intercept": True, "label_bound": 2.0}
DIM = 20
SEED = 7
WARM_UP, TARGET = 200, 300

LEARNERS: dict[str, Callable[[], Learner]] = {
    "pnsgd": lambda: OnlinePNSGD(DIM, LOSS, 1.0, eta=0.1, radius=1.0, rng=SEED),
    # 50 slots: several slots close inside a sub-block, so messages are formed a few at a time
    "checkin": lambda: RandomCheckinSGD(DIM, LOSS, 1.0, 1e-6, randomizer="gaussian", slots=50, rng=SEED),
    "checkin-l2": lambda: RandomCheckinSGD(DIM, LOSS, 1.0, 1e-6, randomizer="l2", slots=50, rng=SEED),
    "pan-acsa": lambda: PanPrivateACSA(DIM, LOSS, 1.0, 1e-6, horizon=20_000, batch_size=64, rng=SEED),
    "pan-ftrl": lambda: PanPrivateFTRL(DIM, LOSS, 1.0, 1e-6, horizon=20_000, leaf_size=64, rng=SEED),
    "shuffle-sgd": lambda: ShuffleSGD(DIM, LOSS, 1.0, 1e-6, batch_size=64, rng=SEED),
    "shuffle-acsa": lambda: ShuffleACSA(DIM, LOSS, 1.0, 1e-6, horizon=20_000, batch_size=64, rng=SEED),
    "shuffle-gaussian": lambda: ShuffleGaussianSGD(DIM, LOSS, 1.0, 1e-6, batch_size=64, rng=SEED),
    # learn_one, one record per call (pan-acsa's row path: Python floats, scrubbed after each call)
    "pan-acsa-learn-one": lambda: PanPrivateACSA(DIM, LOSS, 1.0, 1e-6, horizon=20_000, batch_size=64, rng=SEED),
    # real-valued labels: each one is a record's data too
    "pnsgd-squared": lambda: OnlinePNSGD(DIM, SQUARED, 1.0, eta=0.1, radius=1.0, rng=SEED),
    "checkin-squared": lambda: RandomCheckinSGD(DIM, SQUARED, 1.0, 1e-6, randomizer="gaussian", slots=50, rng=SEED),
    "pan-acsa-learn-one-squared": lambda: PanPrivateACSA(DIM, SQUARED, 1.0, 1e-6, horizon=20_000, batch_size=64, rng=SEED),
}


def learn(name: str, learner: Learner, X: np.ndarray, y: np.ndarray) -> None:
    """``learn_many`` of the micro-batch, or, for the ``learn-one`` cases, ``learn_one`` per record
    (each label given as a 0-d view of ``y``: a Python float made by this loop would be the
    caller's residue, not the learner's)."""
    if "learn-one" not in name:
        learner.learn_many(X, y)
        return
    for row in range(len(y)):
        learner.learn_one(X[row], y[row : row + 1].reshape(()))


def _records(m: int, seed: int, continuous: bool) -> tuple[np.ndarray, np.ndarray]:
    """m records with features of distinct norms in [0.3, 0.95] (inside the bound 1) and labels
    that are 0/1 and, for the squared loss, continuous (0/1 plus a uniform [0, 0.5)), built in
    place (no scaled copy of them is left behind in the child)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, DIM))
    scale = rng.uniform(0.3, 0.95, m)
    scale /= np.sqrt(np.einsum("ij,ij->i", X, X))
    X *= scale[:, None]
    scale.fill(0.0)
    y = (rng.random(m) < 0.5).astype(np.float64)
    if continuous:  # in place: a temporary 0.5·U would equal every label drawn as 0 + 0.5·U
        fraction = rng.random(m)
        fraction *= 0.5
        y += fraction
        fraction.fill(0.0)
    return X, y


def _child(conn: Any, name: str, sabotage: str | None) -> None:
    """Warm up, learn the target micro-batch, zero the inputs, wait (``sabotage``: a control)."""
    if sabotage == "broadcast":  # the old product, through numpy's iteration buffer
        import panpriv.protocols.checkin as checkin

        def broadcast(rows: np.ndarray, factors: np.ndarray, work: np.ndarray) -> np.ndarray:
            rows *= factors[:, None]
            return rows

        checkin.scale_rows = broadcast  # type: ignore[assignment]
    elif sabotage == "unscrubbed":  # the floats' values left on the free list
        import panpriv.protocols.pnsgd as pnsgd

        pnsgd.scrub_freed_floats = lambda: None  # type: ignore[assignment]
    elif sabotage == "unscrubbed-row":  # learn_one's floats left on the free list
        import types

        import panpriv.protocols.pan_acsa as pan_acsa
        from panpriv.protocols import scalar_residue

        pan_acsa.scalar_residue = types.SimpleNamespace(  # type: ignore[assignment]
            reserve_float_room=scalar_residue.reserve_float_room, scrub_call_floats=lambda room: None
        )
    learner = LEARNERS[name]()
    for m, seed in ((WARM_UP, 1), (TARGET, 2)):
        X, y = _records(m, seed, name.endswith("squared"))
        learn(name, learner, X, y)
        X.fill(0.0)
        y.fill(0.0)
    conn.send("learned")
    conn.recv()


def _target_scalars(name: str) -> dict[str, np.ndarray]:
    """Every norm, squared norm, label, margin and slope the learner computes for the target
    records (from a twin with the same seed, its link derivatives spied on: the scalar form of
    pnsgd and checkin and the array form of the others)."""
    margins: list[float] = []
    slopes: list[float] = []
    scalar_dphi = scratch.scalar_dphi

    def spied_scalar_dphi(loss: Any) -> Any:
        dphi = scalar_dphi(loss)
        if dphi is None:
            return None

        def spy(s: float, y: float) -> float:
            slope = dphi(s, y)
            margins.append(s)
            slopes.append(slope)
            return slope

        return spy

    continuous = name.endswith("squared")
    scratch.scalar_dphi = spied_scalar_dphi  # type: ignore[assignment]
    try:
        twin: Any = LEARNERS[name]()
        learn(name, twin, *_records(WARM_UP, 1, continuous))
        margins.clear()
        slopes.clear()
        array = twin.loss._dphi

        def array_spy(s: np.ndarray, y: np.ndarray) -> np.ndarray:
            slope = array(s, y)
            margins.extend(np.ravel(s).tolist())
            slopes.extend(np.ravel(slope).tolist())
            return slope

        twin.loss._dphi = array_spy
        X, y = _records(TARGET, 2, continuous)
        learn(name, twin, X, y)
    finally:
        scratch.scalar_dphi = scalar_dphi
    Z = twin.loss.features(X, twin.feature_bound)
    squares = np.einsum("ij,ij->i", Z, Z)
    return {
        "norm": np.sqrt(squares),
        "squared norm": squares,
        "label": twin.loss.labels(y),
        "margin": np.array(margins),
        "slope": np.array(slopes),
    }


def _distinctive(values: np.ndarray) -> np.ndarray:
    unique, counts = np.unique(values, return_counts=True)
    once = unique[counts == 1]
    return once[~np.isin(once, [0.0, 0.5, -0.5, 1.0, -1.0])]


def _present(targets: np.ndarray, words: np.ndarray) -> np.ndarray:
    """The values of sorted ``targets`` that occur in ``words`` (a binary search per word: the
    memory is hundreds of MB, the targets a few thousand)."""
    where = np.searchsorted(targets, words).clip(max=targets.size - 1)
    return np.unique(words[targets[where] == words])


def scan(name: str, sabotage: str | None = None) -> dict[str, str]:
    """Run learner ``name`` in a child; per kind of scalar, how many of the distinctive target
    values are in its memory (only kinds with hits are listed)."""
    words = child_memory_words(_child, (name, sabotage), "learned")
    targets = {kind: _distinctive(values).view(np.uint64) for kind, values in _target_scalars(name).items()}
    present = _present(np.unique(np.concatenate(list(targets.values()))), words)
    found = {}
    for kind, bits in targets.items():
        hits = int(np.isin(bits, present).sum())
        if hits:
            found[kind] = f"{hits} of {bits.size}"
    return found


def _can_read_child_memory() -> bool:
    return sys.platform == "linux" and os.path.exists("/proc/self/mem")


needs_proc_mem = pytest.mark.skipif(not _can_read_child_memory(), reason="needs Linux /proc/<pid>/mem")


@pytest.mark.slow
@needs_proc_mem
@pytest.mark.parametrize("name", list(LEARNERS))
def test_no_record_norm_margin_or_slope_left_in_memory(name: str) -> None:
    assert scan(name) == {}


@pytest.mark.slow
@needs_proc_mem
def test_the_scan_finds_slopes_left_in_a_broadcast_buffer() -> None:
    """Control: checkin's messages formed by ``messages *= slopes[:, None]`` (the code before
    :func:`panpriv.protocols.scalar_residue.scale_rows`) leave the slopes in numpy's freed buffer."""
    assert "slope" in scan("checkin", sabotage="broadcast")


@pytest.mark.slow
@needs_proc_mem
def test_the_scan_finds_margins_left_on_the_float_free_list() -> None:
    """Control: pnsgd without :func:`panpriv.protocols.scalar_residue.scrub_freed_floats` leaves its last
    steps' margins or slopes in freed Python floats."""
    found = scan("pnsgd", sabotage="unscrubbed")
    assert "margin" in found or "slope" in found


@pytest.mark.slow
@needs_proc_mem
def test_the_scan_finds_the_last_learn_one_values_without_the_call_scrub() -> None:
    """Control: pan-acsa's ``learn_one`` without :func:`panpriv.protocols.scalar_residue.scrub_call_floats`
    leaves its last record's margin or slope in freed Python floats."""
    found = scan("pan-acsa-learn-one", sabotage="unscrubbed-row")
    assert "margin" in found or "slope" in found
