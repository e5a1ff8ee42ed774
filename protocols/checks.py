"""Conformance checks that every learner's tests run (in the spirit of River's ``checks``).

Each check is a plain function taking a *factory* — ``factory(rng) -> Learner``, building a fresh
learner with the given ``rng`` (always a seed or generator here: checks run in the labelled
replay/testing mode) — and a small stream ``X, y`` suited to the learner. A check raises
``AssertionError`` with an explanation when the learner breaks the contract of
:mod:`panpriv.protocols.base`, and returns ``None`` otherwise. :func:`run_all` runs them all.

Usage from a learner's tests::

    from panpriv.protocols import checks

    def factory(rng):
        return MyLearner(dim=3, ..., batch_size=5, rng=rng)

    @pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
    def test_conformance(check):
        X, y = checks.make_stream(dim=3, records=40, binary=True)
        check(factory, X, y)

Streams should cover several of the learner's internal batches and end mid-batch, so that state
is checked with partial accumulators too. Keep them small: the statistical check builds
2 × ``replicates`` learners.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.stats import ks_2samp, levene

from panpriv.protocols.base import Learner, StateValue
from panpriv.protocols.randomness import RngLike

Factory = Callable[[RngLike], Learner]
Array = NDArray[np.float64]


# -- helpers -------------------------------------------------------------------------------------


def make_stream(dim: int, records: int, *, binary: bool, seed: int = 0) -> tuple[Array, Array]:
    """A small stream with ‖x‖ ≤ 1: labels 0/1 if ``binary``, else real in [−1, 1]."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(records, dim)) / np.sqrt(dim)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    score = X @ np.linspace(-1.0, 1.0, dim)
    if binary:
        return X, (rng.uniform(size=records) < 1.0 / (1.0 + np.exp(-3.0 * score))).astype(np.float64)
    return X, np.clip(score + 0.1 * rng.normal(size=records), -1.0, 1.0)


def split_points(records: int, sizes: Sequence[int]) -> list[slice]:
    """Consecutive slices of the given sizes, cycling through ``sizes`` until ``records`` are used."""
    slices, start, i = [], 0, 0
    while start < records:
        stop = min(records, start + sizes[i % len(sizes)])
        slices.append(slice(start, stop))
        start, i = stop, i + 1
    return slices


def learn_in_chunks(learner: Learner, X: Array, y: Array, sizes: Sequence[int]) -> Learner:
    """Feed ``X, y`` to ``learner`` in micro-batches of the given (cycled) sizes."""
    for rows in split_points(X.shape[0], sizes):
        learner.learn_many(X[rows], y[rows])
    return learner


def state_to_json(state: Mapping[str, StateValue]) -> str:
    """JSON text of a state dict: arrays as ``{"ndarray": nested lists, "dtype": name}``.

    Floats are written with ``repr`` precision, so the round trip is exact.
    """
    def encode(value: StateValue) -> Any:
        if isinstance(value, np.ndarray):
            return {"ndarray": value.tolist(), "dtype": value.dtype.name}
        if isinstance(value, np.generic):
            return value.item()
        return value

    return json.dumps({key: encode(value) for key, value in state.items()}, allow_nan=False)


def state_from_json(text: str) -> dict[str, StateValue]:
    """Inverse of :func:`state_to_json`."""
    decoded = json.loads(text)
    return {
        key: np.asarray(value["ndarray"], dtype=value["dtype"]) if isinstance(value, dict) else value
        for key, value in decoded.items()
    }


def _float_arrays(state: Mapping[str, StateValue]) -> dict[str, Array]:
    """Float entries of a state dict, each flattened to one dimension (a 2-D state array is
    compared coordinate by coordinate like any other)."""
    return {
        key: np.asarray(value, dtype=np.float64).ravel()
        for key, value in state.items()
        if isinstance(value, (np.ndarray, float)) and not isinstance(value, bool)
    }


def _counters(state: Mapping[str, StateValue], noisy: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Integer, string and boolean entries of a state dict, except the ``noisy`` ones."""
    return {
        key: value.tolist() if isinstance(value, np.ndarray) else value
        for key, value in state.items()
        if key not in noisy
        and (isinstance(value, (int, str, bool)) or (isinstance(value, np.ndarray) and value.dtype.kind in "iub"))
    }


def _distributed(state: Mapping[str, StateValue], noisy: frozenset[str]) -> dict[str, Array]:
    """The entries whose distribution :func:`check_micro_batch_invariance` compares: float arrays
    and the learner's noise-dependent integers (:attr:`panpriv.protocols.base.Learner.noisy_counters`; for
    integers the KS p-value, computed as for continuous data, is conservative)."""
    extra = {key: np.asarray(state[key], dtype=np.float64).ravel() for key in noisy if key in state}
    return {**_float_arrays(state), **extra}


def _assert_states_equal(a: Mapping[str, StateValue], b: Mapping[str, StateValue], what: str) -> None:
    assert set(a) == set(b), f"{what}: state keys differ: {sorted(set(a) ^ set(b))}"
    for key in a:
        va, vb = a[key], b[key]
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            assert isinstance(va, np.ndarray) and isinstance(vb, np.ndarray), f"{what}: {key!r} changed type"
            assert va.dtype == vb.dtype and va.shape == vb.shape, f"{what}: {key!r} changed dtype/shape"
            assert np.array_equal(va, vb), f"{what}: {key!r} differs"
        else:
            assert type(va) is type(vb) and va == vb, f"{what}: {key!r} differs ({va!r} vs {vb!r})"


# -- the checks ------------------------------------------------------------------------------------


def check_inputs_not_mutated(factory: Factory, X: Array, y: Array) -> None:
    """``learn_many`` and ``predict_many`` leave their inputs unchanged, and accept read-only arrays."""
    learner = factory(0)
    X_in, y_in = X.copy(), y.copy()
    X_in.flags.writeable = False
    y_in.flags.writeable = False
    learner.learn_many(X_in, y_in)
    learner.predict_many(X_in)
    assert np.array_equal(X_in, X) and np.array_equal(y_in, y), "inputs were modified"
    X_rw = X.copy()
    learner.learn_many(X_rw, y.copy())
    assert np.array_equal(X_rw, X), "learn_many modified a writable X"


def check_config_round_trip(factory: Factory, X: Array, y: Array) -> None:
    """``config()`` is JSON-ready, survives JSON, and rebuilds a learner with the same config."""
    learner = factory(0)
    config = learner.config()
    text = json.dumps(config, allow_nan=False)
    loaded = json.loads(text)
    assert loaded == config, "config() changes through JSON (tuples, numpy scalars, NaN?)"
    rebuilt = type(learner).from_config(loaded, rng=0)
    assert rebuilt.config() == config, "a learner built from config() reports a different config()"


def check_state_round_trip(factory: Factory, X: Array, y: Array) -> None:
    """``state_dict`` → JSON → ``from_state_dict`` restores the learner exactly, mid-stream.

    Restored and original learners must agree on ``state_dict``, ``release``, the records the state
    covers (:attr:`~panpriv.protocols.base.Learner.state_records`: ``records_seen``, or the last
    batch boundary's count for a learner with boundaries), the guarantees and predictions; given
    the generator as it was when the saved state was the live one, the restored learner then
    continues identically after re-reading the records since then (which also shows that the
    rebuild itself draws no noise).
    """
    half = X.shape[0] // 2 + 1
    generator = np.random.default_rng(12345)
    learner = factory(generator)
    saved_generator = _copy_generator(generator)
    fed = 0
    while fed < half:  # up to each batch boundary, keeping the generator as it was there
        to_boundary = learner.records_to_boundary()
        take = half - fed if to_boundary is None else min(half - fed, to_boundary)
        learner.learn_many(X[fed : fed + take], y[fed : fed + take])
        fed += take
        if learner.state_records == learner.records_seen:
            saved_generator = _copy_generator(generator)
    state = learner.state_dict()
    for value in learner.state_dict().values():  # the caller's copies: a writer wipes them after use
        if isinstance(value, np.ndarray):
            value.fill(0)
    _assert_states_equal(state, learner.state_dict(), "after the caller zeroed the arrays of a state_dict")
    text = state_to_json(state)
    restored = type(learner).from_state_dict(
        json.loads(json.dumps(learner.config())), state_from_json(text), rng=saved_generator
    )
    _assert_states_equal(state, restored.state_dict(), "after the round trip")
    assert restored.records_seen == restored.state_records == learner.state_records
    assert np.array_equal(restored.release(), learner.release()), "release() differs after restore"
    assert np.array_equal(restored.predict_many(X), learner.predict_many(X))
    mine, theirs = learner.privacy(), restored.privacy()
    assert (mine.output, mine.intrusion, mine.assumptions) == (theirs.output, theirs.intrusion, theirs.assumptions)
    learner.learn_many(X[half:], y[half:])
    for part in (slice(restored.records_seen, half), slice(half, None)):  # the pieces the learner had
        if part.start is None or part.start < X.shape[0]:
            restored.learn_many(X[part], y[part])
    _assert_states_equal(learner.state_dict(), restored.state_dict(), "continuing after restore")


def check_checkpoint_restores(factory: Factory, X: Array, y: Array) -> None:
    """What the service persists, ``checkpoint_state()``, survives JSON and rebuilds a learner that,
    after ``resumed()``, learns the rest of the stream (from ``state_records``, the records that
    state holds) with the same counters as the original.

    A learner may change its noisy accumulators around a persisted copy (pan-ftrl re-noises its open
    nodes), so only the structure is compared: the same keys, dtypes and shapes, the same integer
    counters except the learner's ``noisy_counters``, and finite releases."""
    half = X.shape[0] // 2 + 1
    learner = factory(np.random.default_rng(2024))
    learner.learn_many(X[:half], y[:half])
    persisted = learner.checkpoint_state()
    reference = learner.state_dict()
    assert set(persisted) == set(reference), "checkpoint_state() and state_dict() hold different keys"
    noisy = type(learner).noisy_counters
    assert _counters(persisted, noisy) == _counters(reference, noisy), "checkpoint_state() changed a counter"
    restored = type(learner).from_state_dict(
        json.loads(json.dumps(learner.config())), state_from_json(state_to_json(persisted)), rng=np.random.default_rng(7)
    )
    restored.resumed()
    saved = learner.state_records  # a learner with batch boundaries persists the last boundary's state
    assert restored.records_seen == saved
    learner.learn_many(X[half:], y[half:])
    restored.learn_many(X[saved:], y[saved:])
    after, original = restored.state_dict(), learner.state_dict()
    assert _counters(after, noisy) == _counters(original, noisy), "a restored learner's counters diverge"
    for key, value in after.items():
        if isinstance(value, np.ndarray):
            assert value.shape == np.shape(original[key]) and value.dtype == np.asarray(original[key]).dtype, key
    assert np.all(np.isfinite(restored.release())), "a restored learner releases non-finite parameters"


def check_saved_states_are_boundaries(factory: Factory, X: Array, y: Array) -> None:
    """A learner with batch boundaries (:meth:`~panpriv.protocols.base.Learner.records_to_boundary`
    not ``None``) saves the same state at every point of a batch — the state at the batch's start —
    so no two saved states of one batch differ by the records between them; ``state_records``
    counts the records up to that boundary. Learners without boundaries pass trivially."""
    learner = factory(3)
    if learner.records_to_boundary() is None:
        return
    at_boundary = learner.state_dict()
    for i in range(X.shape[0]):
        before = learner.records_to_boundary()
        learner.learn_many(X[i : i + 1], y[i : i + 1])
        state = learner.state_dict()
        if learner.state_records == learner.records_seen:
            assert before == 1, f"a boundary after record {i + 1}, announced {before} records ahead"
            at_boundary = state
            continue
        assert before is not None and learner.records_to_boundary() == before - 1, "records_to_boundary does not count down"
        _assert_states_equal(at_boundary, state, f"mid-batch after record {i + 1}")


def _copy_generator(generator: np.random.Generator) -> np.random.Generator:
    copy = np.random.default_rng()
    copy.bit_generator.state = generator.bit_generator.state
    return copy


_ALLOWED_SCALARS = (bool, int, float, str)


def check_state_contents(factory: Factory, X: Array, y: Array) -> None:
    """``state_dict`` holds only noisy arrays and counters: no generator, no raw record.

    - Types: numpy float/int/bool arrays and Python bool/int/float/str only (a ``Generator``,
      a ``BitGenerator`` state dict, lists or objects fail).
    - Sentinel: streams ending in a record with distinctive feature values; none of those values
      may appear anywhere in the state (the sentinel row has norm 0.3, below any sane feature
      bound, so clipping does not change it).
    - Noise: every float array either changes with the noise seed (it is randomised) or does not
      change when the last record changes (it is data-independent, e.g. an initial point).
    Checked after several stream prefixes, including ones that end mid-batch.
    """
    dim = X.shape[1]
    sentinel = 0.0123456789 * (1.0 + np.arange(dim) / 7.0)
    sentinel *= 0.3 / np.linalg.norm(sentinel)
    lengths = sorted({1, 2, max(1, X.shape[0] // 3), max(1, X.shape[0] // 2), X.shape[0]})
    for k in lengths:
        with_sentinel = np.vstack([X[: k - 1], sentinel[None, :]])
        other = np.vstack([X[: k - 1], -sentinel[None, :] * 0.5])
        a = factory(1)
        a.learn_many(with_sentinel, y[:k])
        state = a.state_dict()
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                assert value.dtype.kind in "fiub", f"state[{key!r}] has dtype {value.dtype}"
            else:
                assert isinstance(value, _ALLOWED_SCALARS), (
                    f"state[{key!r}] is a {type(value).__name__}: only arrays and counters may be stored"
                )
        for key, value in _float_arrays(state).items():
            hits = np.isclose(value[..., None], sentinel, rtol=1e-12, atol=0.0)
            assert not hits.any(), f"state[{key!r}] contains a raw feature value of the last record"
        b = factory(2)
        b.learn_many(with_sentinel, y[:k])
        c = factory(1)
        c.learn_many(other, y[:k])
        noisy_b, changed_c = _float_arrays(b.state_dict()), _float_arrays(c.state_dict())
        for key, value in _float_arrays(state).items():
            if np.array_equal(value, noisy_b[key]):
                assert np.array_equal(value, changed_c[key]), (
                    f"state[{key!r}] after {k} records depends on the data but not on the noise"
                )


def check_report_consistency(factory: Factory, X: Array, y: Array) -> None:
    """``privacy()`` and ``snapshot()`` agree with the learner, and guarantees never shrink.

    After each micro-batch: the report counts ``records_seen`` records and the snapshot the records
    its state covers (``state_records``), the mechanism is
    the learner's ``name``, snapshot parameters equal ``release()``, the report survives
    ``to_dict``/JSON/``from_dict``, and the output and intrusion guarantees dominate the
    previous ones (a guarantee once printed cannot become stronger).
    """
    from panpriv.accounting.ledger import PrivacyReport

    learner = factory(0)
    previous = learner.privacy()
    assert previous.records == 0 == learner.records_seen
    seen = 0
    for rows in split_points(X.shape[0], [1, 4, 9]):
        learner.learn_many(X[rows], y[rows])
        seen += rows.stop - rows.start
        release = learner.release()
        snapshot = learner.snapshot()
        report = learner.privacy()
        assert learner.records_seen == seen == report.records
        assert snapshot.records == learner.state_records <= seen
        assert report.mechanism == learner.name == snapshot.learner
        assert np.array_equal(snapshot.params, release), "snapshot params differ from release()"
        assert report.output.dominates(previous.output), "output guarantee became stronger"
        assert report.intrusion.dominates(previous.intrusion), "intrusion guarantee became stronger"
        assert report.references, "a report must cite the theorems it rests on"
        data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
        assert PrivacyReport.from_dict(data).to_dict() == report.to_dict()
        previous = report


def check_micro_batch_invariance(
    factory: Factory,
    X: Array,
    y: Array,
    *,
    splits: tuple[Sequence[int], Sequence[int]] = ((1,), (7, 2, 13)),
    replicates: int = 200,
    alpha: float = 1e-3,
) -> None:
    """Splitting the stream differently gives the same distribution of state (statistical).

    ``replicates`` learners learn ``X, y`` in micro-batches of sizes ``splits[0]``, and as many
    with independent seeds in sizes ``splits[1]``. Integer state (counters) must agree exactly,
    except the learner's ``noisy_counters``, which join the float arrays: every coordinate is compared between the two groups with a two-sample
    Kolmogorov–Smirnov test (any difference of distribution) and a Brown–Forsythe test (a
    difference of spread, e.g. noise drawn per micro-batch, which KS detects poorly), all
    Bonferroni-corrected.

    False-failure probability: at most ``alpha`` (1e-3 by default) for a conforming learner,
    over the choice of seeds (Bonferroni over all tests; exact KS p-values are valid under H0,
    Brown–Forsythe's are approximate but accurate at these sample sizes). The default seeds
    are fixed, so a given learner passes or fails deterministically. Power needs the state to
    show the noise: a tiny Θ on whose boundary every state sits can hide a defect.
    """
    groups: list[list[dict[str, StateValue]]] = [[], []]
    for g, sizes in enumerate(splits):
        for r in range(replicates):
            learner = learn_in_chunks(factory(1_000_003 * (g + 1) + r), X, y, sizes)
            groups[g].append(learner.state_dict())
    noisy = type(learner).noisy_counters
    reference = _counters(groups[0][0], noisy)
    for g in (0, 1):
        for state in groups[g]:
            assert _counters(state, noisy) == reference, (
                f"counters depend on the split: {_counters(state, noisy)} vs {reference}"
            )
    arrays = [{k: np.stack([_distributed(s, noisy)[k] for s in grp]) for k in _distributed(grp[0], noisy)} for grp in groups]
    level = alpha / (2 * sum(v[0].size for v in arrays[0].values()))
    for key, first in arrays[0].items():
        second = arrays[1][key]
        for j in range(first.shape[1]):
            a, b = first[:, j], second[:, j]
            if np.all(a == a[0]) and np.all(b == b[0]):  # constant in each group: compare the constants
                assert a[0] == b[0], (
                    f"state[{key!r}][{j}] has a different distribution under splits {splits[0]} and "
                    f"{splits[1]} (always {a[0]!r} vs always {b[0]!r})"
                )
                continue
            for test, p in (("KS", ks_2samp(a, b).pvalue), ("Brown-Forsythe", levene(a, b, center="median").pvalue)):
                assert p >= level, (
                    f"state[{key!r}][{j}] has a different distribution under splits {splits[0]} "
                    f"and {splits[1]} ({test} p = {p:.2e} < {level:.2e})"
                )


def check_seeded_split_determinism(
    factory: Factory, X: Array, y: Array, *, splits: tuple[Sequence[int], Sequence[int]] = ((1,), (7, 2, 13))
) -> None:
    """With the same seed, different splits give the same state up to rounding.

    A stronger form of micro-batch invariance for learners whose noise draws (their number,
    order and shapes) do not depend on how the stream is split — true of PanPrivateACSA, which
    draws per internal batch. Learners that draw per micro-batch by design should skip it.
    """
    a = learn_in_chunks(factory(7), X, y, splits[0]).state_dict()
    b = learn_in_chunks(factory(7), X, y, splits[1]).state_dict()
    assert _counters(a) == _counters(b), "counters depend on the split"
    fa, fb = _float_arrays(a), _float_arrays(b)
    for key in fa:
        np.testing.assert_allclose(fa[key], fb[key], rtol=1e-9, atol=1e-12, err_msg=f"state[{key!r}]")


ALL_CHECKS: tuple[Callable[[Factory, Array, Array], None], ...] = (
    check_inputs_not_mutated,
    check_config_round_trip,
    check_state_round_trip,
    check_checkpoint_restores,
    check_saved_states_are_boundaries,
    check_state_contents,
    check_report_consistency,
    check_micro_batch_invariance,
)
"""Checks every learner must pass (:func:`check_seeded_split_determinism` is opt-in)."""


def run_all(factory: Factory, X: Array, y: Array) -> None:
    """Run every check of :data:`ALL_CHECKS`."""
    for check in ALL_CHECKS:
        check(factory, X, y)
