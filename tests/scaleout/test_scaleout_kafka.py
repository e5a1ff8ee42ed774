"""Three workers and a coordinator train one pan-private AC-SA model on the real broker (issue 20)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols.pan_acsa_scaleout import simulate
from tests.realparts import KafkaBroker
from tests.scaleout import parts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N, K, RUNS = 30000, 3, 20


def planned_records(steps: int) -> int:
    """The records ``steps`` steps of the plan use: K·w_t each, w_t = ⌊b_t/K⌋ (at most N: the
    remainders of the divisions by K are left unread)."""
    from panpriv.protocols.pan_acsa_scaleout import worker_batch

    planned = parts.learner(N)
    planned.plan_for_workers(K)
    total = 0
    for _ in range(steps):
        total += K * worker_batch(planned.step_batch_size(), K)
        planned.apply_noisy_gradient(np.zeros(planned.param_count))
    assert total <= N
    return total


def test_three_workers_and_a_coordinator_learn_one_model(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                                          tmp_path: Path) -> None:
    names = parts.topics(kafka_broker, unique_name)
    X, y = parts.synthetic(N, parts.DIM, seed=1)
    Xt, yt = parts.synthetic(5000, parts.DIM, seed=99)
    parts.produce(kafka_broker.bootstrap, names["data"], X, y)
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, K)
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i) for i in range(K)]
    started = time.monotonic()
    try:
        parts.wait_all(coordinator, workers, 300)
    finally:
        for process in (*workers, coordinator):
            process.stop()
    elapsed = time.monotonic() - started
    model = parts.last_model(kafka_broker.bootstrap, names["model"])
    assert model.done
    kafka_accuracy = parts.accuracy(model.theta_ag, Xt, yt)
    print(f"version {model.version}, {model.records} records, {model.stale} stale, {elapsed:.1f} s, accuracy {kafka_accuracy:.4f}")
    _published_means_are_noisy(kafka_broker, names, X, y)
    # The same protocol in process (panpriv.protocols.pan_acsa_scaleout.simulate: K workers, synchronous
    # versions) — the single-process learner with the sqrt(K) noise penalty — and the
    # single-process learner itself (one accumulator, batches of K·w).
    simulated, single, steps = [], [], 0
    for _ in range(RUNS):
        reference = parts.learner(N)
        reference.plan_for_workers(K)
        steps = simulate(reference, K, X, y)
        simulated.append(parts.accuracy(reference.release(), Xt, yt))
        alone = parts.learner(N)
        alone.learn_many(X, y)
        single.append(parts.accuracy(alone.release(), Xt, yt))
    mean, std = float(np.mean(simulated)), float(np.std(simulated, ddof=1))
    print(f"kafka {kafka_accuracy:.4f}; in-process K = {K}: {mean:.4f} ± {std:.4f}; single process: "
          f"{np.mean(single):.4f} ± {np.std(single, ddof=1):.4f}")
    assert model.version == steps and model.records == planned_records(steps) and model.stale == 0
    # Within 4 standard deviations of the in-process K-worker runs (normal approximation), and no
    # worse than the single-process learner by more than the sqrt(K) noise penalty costs in process.
    assert abs(kafka_accuracy - mean) <= 4 * max(std, 0.002), (kafka_accuracy, mean, std)
    assert kafka_accuracy >= float(np.mean(single)) - (float(np.mean(single)) - mean) - 4 * max(std, 0.002)


def _published_means_are_noisy(broker: KafkaBroker, names: dict[str, str], X: np.ndarray, y: np.ndarray) -> None:
    """Only noisy means left the workers: each published gradient minus the clean mean of the
    records it names (recomputed here at θ^md of its version, by the same gradient path) has
    per-coordinate standard deviation √2·ζ(w) — the two draws of Alg. 6 — over all of them."""
    from panpriv.streamer.scaleout.wire import ModelVersion, query_state

    models = {m.version: m for m in (ModelVersion.from_json(v) for v in parts.read_all(broker.bootstrap, names["model"]) if v)}
    residuals, expected = [], None
    for record in parts.gradients(broker.bootstrap, names["gradients"]):
        model = models.get(record.version)
        if model is None:
            continue
        clean = parts.learner(N)
        clean.plan_for_workers(model.workers)
        clean.load_state_dict(query_state(model.state))
        rows = [o * 3 + int(key.rsplit("/", 1)[1]) for key, (a, b) in record.ranges.items() for o in range(a, b)]
        clean.add_to_batch(X[rows], y[rows], record.records)
        residuals.append(record.gradient - clean._grad.copy())  # the clean mean accumulated (state_dict saves boundaries)
        expected = np.sqrt(2.0) * clean.batch_noise_std(record.records)
    sample = np.concatenate(residuals)
    assert len(residuals) >= 40 and expected is not None
    # ~1,000 draws: the sample std is within 15 % of σ far beyond 4 standard errors (≈ 2.2 % each).
    print(f"published means minus clean means: std {sample.std():.5g} over {sample.size} coordinates; sqrt(2)·zeta(w) = {expected:.5g}")
    assert abs(sample.std() / expected - 1.0) < 0.15, (sample.std(), expected)
