"""The conformance checks can fail: each is run on a learner broken in the way it must detect.

(PanPrivateACSA passing them is in test_pan_acsa.py.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from panpriv.accounting.ledger import Guarantee
from panpriv.protocols import checks
from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA

X, Y = checks.make_stream(3, 40, binary=True)


class _Base(PanPrivateACSA):
    def __init__(self, **kwargs):
        kwargs.setdefault("dim", 3)
        kwargs.setdefault("loss", LogisticLoss())
        kwargs.setdefault("epsilon", 1.0)
        kwargs.setdefault("delta", 1e-5)
        kwargs.setdefault("horizon", 40)
        kwargs.setdefault("batch_size", 5)
        super().__init__(**kwargs)


class Mutating(_Base):
    def learn_many(self, X, y):
        if X.flags.writeable:
            X[:, 0] = 0.0
        super().learn_many(X, y)


class KeepsLastRecord(_Base):
    def learn_many(self, X, y):
        super().learn_many(X, y)
        self._last = np.array(X[-1], dtype=np.float64)

    def state_dict(self):
        return {**super().state_dict(), "last": getattr(self, "_last", np.zeros(3))}

    def load_state_dict(self, state):
        super().load_state_dict({k: v for k, v in state.items() if k != "last"})
        self._last = np.array(state["last"])


class KeepsNoiselessSum(KeepsLastRecord):
    def learn_many(self, X, y):
        super().learn_many(X, y)
        self._last = getattr(self, "_sum", 0.0) + 3.0 * np.asarray(X).sum(axis=0)  # no raw value, no noise
        self._sum = self._last


class KeepsGenerator(_Base):
    def state_dict(self):
        return {**super().state_dict(), "rng": np.random.default_rng(0)}


class NoisePerCall(_Base):
    """Draws extra noise at every learn_many call: the mechanism depends on the split."""

    def learn_many(self, X, y):
        super().learn_many(X, y)
        self._noise.add_gaussian(self._grad, self.batch_noise_std(5))


class TupleConfig(_Base):
    def config(self):
        return {**super().config(), "extra": (1, 2)}


class ForgetsIterate(_Base):
    def load_state_dict(self, state):
        super().load_state_dict({**state, "theta_md": np.zeros_like(state["theta_md"])})


class SavesOpenBatch(_Base):
    """Saves the live state mid-batch, accumulator included (what pan-acsa did before): two saved
    states of one batch then differ by the records between them."""

    def state_dict(self):
        return {**super().state_dict(), "records": self.records_seen, "filled": self._filled, "grad": self._grad.copy()}


class PersistsAnotherState(_Base):
    """Persists what it does not hold: a checkpoint that would restore another learner."""

    def checkpoint_state(self):
        return {**super().state_dict(), "filled": 0}


class Strengthening(_Base):
    def privacy(self):
        report = super().privacy()
        object.__setattr__(report, "output", Guarantee(1.0 / (1 + self.records_seen), 1e-5))
        return report


@pytest.mark.parametrize(
    "learner, check",
    [
        (Mutating, checks.check_inputs_not_mutated),
        (KeepsLastRecord, checks.check_state_contents),
        (KeepsNoiselessSum, checks.check_state_contents),
        (KeepsGenerator, checks.check_state_contents),
        (TupleConfig, checks.check_config_round_trip),
        (PersistsAnotherState, checks.check_checkpoint_restores),
        (ForgetsIterate, checks.check_state_round_trip),
        (SavesOpenBatch, checks.check_saved_states_are_boundaries),
        (Strengthening, checks.check_report_consistency),
        (NoisePerCall, checks.check_seeded_split_determinism),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_check_detects_the_defect(learner, check):
    with pytest.raises(AssertionError):
        check(lambda rng: learner(rng=rng), X, Y)
    # ... and the same check passes on the unbroken learner.
    check(lambda rng: _Base(rng=rng), X, Y)


@pytest.mark.statistical
def test_micro_batch_invariance_detects_split_dependent_noise():
    """The KS check rejects a learner whose noise grows with the number of learn_many calls.

    Deterministic (fixed seeds); its false-failure probability on a conforming learner is ≤ 1e-3.
    """
    # A radius large enough that projection onto Θ does not hide the extra noise.
    with pytest.raises(AssertionError, match="different distribution"):
        checks.check_micro_batch_invariance(lambda rng: NoisePerCall(radius=100.0, rng=rng), X, Y)
    checks.check_micro_batch_invariance(lambda rng: _Base(radius=100.0, rng=rng), X, Y)


class CountsCallsAsNoisy(_Base):
    """Declares a split-dependent integer (learn_many calls) as a noisy counter: its distribution
    differs between splits, which the check must see."""

    noisy_counters = _Base.noisy_counters | {"calls"}

    def learn_many(self, X, y):
        super().learn_many(X, y)
        self._calls = getattr(self, "_calls", 0) + 1

    def state_dict(self):
        return {**super().state_dict(), "calls": getattr(self, "_calls", 0)}

    def load_state_dict(self, state):
        super().load_state_dict({k: v for k, v in state.items() if k != "calls"})
        self._calls = state["calls"]


class CountsCalls(CountsCallsAsNoisy):
    noisy_counters = _Base.noisy_counters


@pytest.mark.statistical
def test_micro_batch_invariance_compares_noisy_counters_by_distribution():
    """pan-acsa's restart step is noise-dependent: compared by distribution, not equality (the
    conforming learners pass in test_pan_acsa.py). A split-dependent integer fails either way."""
    assert PanPrivateACSA.noisy_counters == {"step"}
    with pytest.raises(AssertionError, match="different distribution"):
        checks.check_micro_batch_invariance(lambda rng: CountsCallsAsNoisy(radius=100.0, rng=rng), X, Y)
    with pytest.raises(AssertionError, match="counters depend on the split"):
        checks.check_micro_batch_invariance(lambda rng: CountsCalls(radius=100.0, rng=rng), X, Y)


class MatrixState(_Base):
    """A conforming learner whose state also holds a 2-D noisy array (its iterate, twice)."""

    def state_dict(self):
        state = super().state_dict()
        return {**state, "theta_matrix": np.stack([state["theta"], state["theta"]])}

    def load_state_dict(self, state):
        super().load_state_dict({k: v for k, v in state.items() if k != "theta_matrix"})


@pytest.mark.statistical
def test_micro_batch_invariance_handles_two_dimensional_state():
    """2-D float state is compared per coordinate (it used to crash the KS test). False-failure
    probability on this conforming learner ≤ 1e-3 (fixed seeds)."""
    checks.check_micro_batch_invariance(lambda rng: MatrixState(radius=100.0, rng=rng), X, Y)


def test_state_json_round_trip_is_exact():
    state = {"a": np.array([0.1, 1e-300, -2.5]), "n": np.array([1, 2], dtype=np.int64), "k": 3, "s": "x"}
    back = checks.state_from_json(checks.state_to_json(state))
    assert back["a"].dtype == np.float64 and np.array_equal(back["a"], state["a"])
    assert back["n"].dtype == np.int64 and back["k"] == 3 and back["s"] == "x"
    with pytest.raises(ValueError):  # NaN is not JSON
        checks.state_to_json({"a": np.array([np.nan])})
    assert json.loads(checks.state_to_json(state))["k"] == 3


def test_split_points_cover_the_stream_once():
    slices = checks.split_points(20, [7, 2])
    assert [(s.start, s.stop) for s in slices] == [(0, 7), (7, 9), (9, 16), (16, 18), (18, 20)]
