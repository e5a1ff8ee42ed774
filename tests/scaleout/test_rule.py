"""The scale-out rule without a broker: the noise of a worker's published mean, the √K cost, and
the coordinator's state machine (synchronous versions, resume from its model record)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.pan_acsa_scaleout import combine, simulate, split_noise_epsilon, step_noise_std, worker_batch
from panpriv.streamer.scaleout.coordinator import Coordinator
from panpriv.streamer.scaleout.wire import GradientRecord, ModelVersion


def _learner(dim: int = 5, n: int = 6000) -> PanPrivateACSA:
    return PanPrivateACSA(dim=dim, loss={"name": "logistic", "intercept": False}, epsilon=1.0, delta=1e-6, horizon=n, radius=2.0)


def test_a_published_mean_is_the_clean_mean_plus_two_draws_of_zeta() -> None:
    """close_batch − the clean batch mean at θ^md has per-coordinate std √2·ζ(w) (Alg. 6 lines 4–9)."""
    dim, w, batches = 200, 50, 40
    learner = PanPrivateACSA(dim=dim, loss={"name": "logistic", "intercept": False}, epsilon=1.0, delta=1e-6, horizon=10_000, radius=2.0)
    clean = PanPrivateACSA(dim=dim, loss={"name": "logistic", "intercept": False}, epsilon=1.0, delta=1e-6, horizon=10_000, radius=2.0)
    rng = np.random.default_rng(1)
    residuals = []
    for _ in range(batches):
        X = rng.normal(size=(w, dim)) / math.sqrt(dim)
        y = np.where(rng.random(w) < 0.5, 1.0, -1.0)
        learner.open_batch(w)
        learner.add_to_batch(X, y, w)
        noisy = learner.close_batch(w)
        clean.discard_batch()  # the same gradient path without the draws: the accumulator from zero
        clean.add_to_batch(X, y, w)
        residuals.append(noisy - clean._grad.copy())  # the clean mean accumulated (state_dict saves boundaries)
        clean.discard_batch()
    sample = np.concatenate(residuals)
    expected = math.sqrt(2.0) * learner.batch_noise_std(w)
    # ~8,000 draws: the sample std is within 5 % of σ with overwhelming probability (chi-square).
    assert abs(sample.std() / expected - 1.0) < 0.05


def test_scale_out_costs_sqrt_k_in_noise_at_the_same_records_per_step() -> None:
    learner = _learner()
    for workers in (2, 3, 8, 64):
        b = 64 * 1024
        ratio = step_noise_std(learner, b, workers) / step_noise_std(learner, b, 1)
        assert ratio == pytest.approx(math.sqrt(workers), rel=1e-3)  # w = ⌊b/K⌋ rounds
    assert worker_batch(100, 3) == 33 and worker_batch(2, 3) == 1


def _gradient(version: int, worker: str, w: int, params: int, value: float, deployment: str = "d") -> bytes:
    return GradientRecord(deployment, version, worker, w, np.full(params, value), {"k": (0, w)}).to_json()


def test_the_coordinator_steps_on_k_means_of_the_current_version_and_drops_the_others() -> None:
    coordinator = Coordinator(_learner(), workers=3, deployment="d")
    twin = _learner()
    twin.plan_for_workers(3)
    w, p = coordinator.worker_batch, twin.param_count
    assert not coordinator.handle(_gradient(0, "a", w, p, 0.1), 0)
    assert not coordinator.handle(_gradient(1, "b", w, p, 9.0), 1)  # not the current version
    assert not coordinator.handle(_gradient(0, "c", w, p, 0.2, deployment="other"), 2)
    assert not coordinator.handle(b"{}", 3)
    assert not coordinator.handle(_gradient(0, "b", w, p, 0.2), 4)
    assert coordinator.handle(_gradient(0, "a", w, p, 0.3), 5)  # two from one worker are fine: disjoint batches
    twin.apply_noisy_gradient(combine([np.full(p, 0.1), np.full(p, 0.2), np.full(p, 0.3)]))
    assert np.array_equal(coordinator.learner.release(), twin.release())
    assert (coordinator.version, coordinator.offset, coordinator.stale, coordinator.records) == (1, 6, 1, 3 * w)
    assert dict(coordinator.rejected) == {"malformed": 1}
    assert not coordinator.handle(_gradient(0, "c", w, p, 0.2), 6)  # late for version 0
    assert coordinator.stale == 2


def test_a_restored_coordinator_recomputes_the_same_steps() -> None:
    """Resume from the model record: the step in progress is re-read and gives the same model."""
    coordinator = Coordinator(_learner(), workers=2, deployment="d")
    p = coordinator.learner.param_count
    values = [0.5, -0.2, 0.1, 0.4, -0.3, 0.2]
    offset = 0
    for value in values[:2]:
        coordinator.handle(_gradient(coordinator.version, "a", coordinator.worker_batch, p, value), offset)
        offset += 1
    record = ModelVersion.from_json(coordinator.model().to_json())
    for value in values[2:]:
        coordinator.handle(_gradient(coordinator.version, "a", coordinator.worker_batch, p, value), offset)
        offset += 1
    resumed = Coordinator.restore(record)
    assert resumed.version == 1 and resumed.offset == 2
    for i, value in enumerate(values[2:], start=2):
        resumed.handle(_gradient(resumed.version, "a", resumed.worker_batch, p, value), i)
    assert resumed.version == coordinator.version == 3
    assert np.array_equal(resumed.learner.release(), coordinator.learner.release())
    assert resumed.model().to_json() == coordinator.model().to_json()


def test_simulate_uses_every_step_s_records_once() -> None:
    learner = _learner(n=3000)
    learner.plan_for_workers(3)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(3000, 5)) / 3, np.where(rng.random(3000) < 0.5, 1.0, -1.0)
    steps = simulate(learner, 3, X, y)
    assert steps >= 1 and np.all(np.isfinite(learner.release()))


def test_split_noise_would_weaken_one_worker_to_the_stated_epsilon() -> None:
    """The figures docs/privacy.md states for split noise (each worker ζ/√K)."""
    stated = {1: 1.0, 2: 1.46, 3: 1.81, 8: 3.11, 16: 4.59, 64: 10.3}
    for workers, epsilon in stated.items():
        assert split_noise_epsilon(1.0, 1e-6, workers) == pytest.approx(epsilon, abs=0.006)


def test_secure_noise_scales_out_too() -> None:
    """noise = "secure" (int64 grid-unit accumulator): the model record round-trips, a worker
    loads it, and its published mean is a float vector."""
    from panpriv.streamer.scaleout.wire import query_state

    coordinator = Coordinator(PanPrivateACSA(dim=4, loss={"name": "logistic", "intercept": False}, epsilon=1.0, delta=1e-6, horizon=4000, noise="secure"),
                              workers=2, deployment="d")
    record = ModelVersion.from_json(coordinator.model().to_json())
    worker = PanPrivateACSA.from_config(record.config)
    worker.plan_for_workers(record.workers)
    worker.load_state_dict(query_state(record.state))
    w = record.worker_batch
    rng = np.random.default_rng(0)
    means = []
    for _ in range(2):
        worker.open_batch(w)
        worker.add_to_batch(rng.normal(size=(w, 4)) / 3, np.where(rng.random(w) < 0.5, 1.0, -1.0), w)
        means.append(worker.close_batch(w))
    for i, mean in enumerate(means):
        assert mean.dtype == np.float64
        coordinator.handle(GradientRecord("d", 0, "a", w, mean, {"k": (0, w)}).to_json(), i)
    assert coordinator.version == 1
    resumed = Coordinator.restore(ModelVersion.from_json(coordinator.model().to_json()))
    assert np.array_equal(resumed.learner.release(), coordinator.learner.release())
