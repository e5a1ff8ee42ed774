"""Benchmark of Encode–Shuffle–Analyze (streamer/esa; Bittau et al. 2017): client encode cost per
record and shuffler throughput, at d ∈ {20, 100}.

    PYTHONPATH=. .venv/bin/python benchmarks/esa.py           # starts the test suite's Tansu broker
    PYTHONPATH=. .venv/bin/python benchmarks/esa.py --quick

* **client encode** (``Encoder.encode``, shuffle-gaussian, logistic loss, ε = 1, δ = 1e-6, b = 1024):
  µs per record for a block of 4,096 records (a simulator of many users) and for one record per
  call (one real user: the per-call overhead included), split into the gradient + Gaussian noise
  (``local_messages``) and the sealing (PyNaCl ``SealedBox``: an ephemeral X25519 key, one DH,
  XSalsa20-Poly1305);
* **shuffler, in process**: the state machine (``Shuffler.offer``: framing check, grouping, the
  OS-entropy permutation) plus batch encoding, messages/s — its CPU ceiling;
* **shuffler, through the broker**: ``panpriv.streamer.esa.shuffler.run`` against the real broker, from
  start to the last batch acknowledged (acks=all) for ``rounds`` × b messages already on the
  messages topic: messages/s including Kafka fetch, produce and offset commits.

* **shuffle-acsa over secure summation** (``SharesEncoder.encode``: the gradient, PVEC's randomizer,
  the split into m shares and one sealing per share; ε = 1, δ = 1e-6, b = 1024): µs per record,
  the message size, and the shuffler's state machine on share messages (``Shuffler.offer`` with
  ``shares``: framing, grouping, cutting into units, the permutation of all b·m units, batch
  encoding), units/s; and through the (Tansu) broker with rounds of 64 users, units/s from start
  to the last release acknowledged. A release of b·m units is 7.5 MB at b = 1024, d = 20 and about
  100 MB at d = 100; with 64 users (m = 68 and 331) it is 0.7 MB and 10 MB (an Apache Kafka topic
  needs ``max.message.bytes`` above that: deploy/docker-compose.yml).

Times are the best of a few repeats (in-process parts) or one run (broker).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from nacl.public import PrivateKey, SealedBox

from panpriv.protocols import scratch
from panpriv.protocols.randomness import NoiseSource
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD, local_messages
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyzer import Analyzer
from panpriv.streamer.esa.client import Encoder
from panpriv.streamer.esa.shuffler import ShuffleOptions, Shuffler, run
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer
from panpriv.streamer.esa.sum_client import SharesEncoder

B = 1024
SUM_BROKER_USERS = 64


def best(run_once: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - start)
    return min(times)


def encode_costs(dim: int, n: int, repeats: int) -> dict[str, float]:
    key = PrivateKey.generate()
    learner = ShuffleGaussianSGD(dim=dim, loss="logistic", epsilon=1.0, delta=1e-6, batch_size=B, radius=np.sqrt(dim))
    encoder = Encoder(key.public_key, Analyzer(learner, [key], "bench").model())
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    block = best(lambda: encoder.encode(X, y), repeats) / n
    one_user = Encoder(key.public_key, Analyzer(learner, [key], "bench").model())  # scratch sized for one record
    single = best(lambda: [one_user.encode(X[i : i + 1], y[i : i + 1]) for i in range(min(n, 1000))], repeats) / min(n, 1000)
    work, noise = scratch.Scratch(), NoiseSource()

    def randomize() -> None:
        Z = scratch.features(learner.loss, X, 1.0, work)
        local_messages(learner.loss, learner.theta, Z, scratch.labels(learner.loss, y, work), encoder.clip,
                       encoder.noise_multiplier * encoder.clip, noise, work)
        work.wipe()

    gradient = best(randomize, repeats) / n
    box = SealedBox(key.public_key)
    text = wire.plaintext(0, np.zeros(learner.calibration()["params"]))
    seal = best(lambda: [box.encrypt(text) for _ in range(1000)], repeats) / 1000
    return {"block": block * 1e6, "single": single * 1e6, "gradient_noise": gradient * 1e6, "seal": seal * 1e6,
            "message_bytes": float(encoder.size)}


def shuffler_in_process(dim: int, rounds: int, repeats: int) -> float:
    size = wire.message_size(dim)
    messages = [wire.message(t, b"\0" * 8, bytes(size - 20)) for t in range(rounds) for _ in range(B)]

    def once() -> None:
        state = Shuffler(B, size)
        for offset, item in enumerate(messages):
            for round_, batch in state.offer(offset, item):
                wire.encode_batch(round_, batch)
                state.mark_released(round_)

    return len(messages) / best(once, repeats)


def shuffler_broker(dim: int, rounds: int, users: int = B, shares: int | None = None) -> float:
    """Messages/s (units/s with ``shares``) of ``panpriv.streamer.esa.shuffler.run`` over ``rounds`` × ``users``
    messages already on the topic: fetch, grouping, permutation, produce (acks=all), commits."""
    from kafka import KafkaProducer

    from tests.realparts import KafkaBroker

    if shares is None:
        size = wire.message_size(dim)
        def message(round_: int, user: int) -> bytes:
            return wire.message(round_, b"\0" * 8, user.to_bytes(8, "big") * ((size - 20) // 8))
    else:
        size = wire.shares_message_size(dim, shares)
        box = bytes(wire.sealed_share_size(dim))
        def message(round_: int, user: int) -> bytes:
            return wire.shares_message(round_, b"\0" * 8, [box] * shares)
    with tempfile.TemporaryDirectory() as workdir:
        broker = KafkaBroker(Path(workdir))
        try:
            tag = uuid.uuid4().hex[:8]
            messages_topic = broker.create_topic(f"bench-messages-{tag}")
            shuffled_topic = broker.create_topic(f"bench-shuffled-{tag}")
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=20, max_request_size=16 << 20)
            for t in range(rounds):
                for i in range(users):
                    producer.send(messages_topic, message(t, i))
            producer.flush()
            producer.close()
            options = ShuffleOptions([broker.bootstrap], messages_topic, shuffled_topic, users, dim, f"bench-{tag}",
                                     max_rounds=rounds, shares=shares)
            start = time.perf_counter()
            state = run(options)
            elapsed = time.perf_counter() - start
            assert state.released == rounds
            return rounds * users * (shares or 1) / elapsed
        finally:
            broker.stop()


def acsa_encode_costs(dim: int, n: int, repeats: int) -> dict[str, float]:
    key = PrivateKey.generate()
    learner = ShuffleACSA(dim=dim, loss="logistic", epsilon=1.0, delta=1e-6, horizon=16 * B, batch_size=B, radius=np.sqrt(dim))
    analyzer = SumAnalyzer(learner, [key], "bench")
    encoder = SharesEncoder(key.public_key, analyzer.model())
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    block = best(lambda: encoder.encode(X, y), repeats) / n
    return {"block": block * 1e6, "shares": float(analyzer.shares), "bits": float(analyzer.bits),
            "message_bytes": float(encoder.size), "tau": analyzer.tau}


def sum_shares(dim: int, users: int) -> int:
    """The secure sum's m for rounds of ``users`` users of shuffle-acsa at the benchmark's plan."""
    learner = ShuffleACSA(dim=dim, loss="logistic", epsilon=1.0, delta=1e-6, horizon=16 * users, batch_size=users,
                          radius=np.sqrt(dim))
    return SumAnalyzer(learner, [PrivateKey.generate()], "bench").shares


def shuffler_units_in_process(dim: int, shares: int, rounds: int, repeats: int) -> float:
    size = wire.shares_message_size(dim, shares)
    box = bytes(wire.sealed_share_size(dim))
    messages = [wire.shares_message(t, b"\0" * 8, [box] * shares) for t in range(rounds) for _ in range(B)]

    def once() -> None:
        state = Shuffler(B, size, shares=shares)
        for offset, item in enumerate(messages):
            for round_, batch in state.offer(offset, item):
                wire.encode_batch(round_, batch)
                state.mark_released(round_)

    return len(messages) * shares / best(once, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-broker", action="store_true", help="skip the shuffler-through-the-broker measurement")
    args = parser.parse_args()
    n, repeats, rounds = (1024, 2, 4) if args.quick else (4096, 5, 16)
    print(f"| d | message bytes | encode µs/record (block of {n}) | encode µs/record (one per call) | gradient+noise µs | seal µs "
          f"| shuffler msg/s (in process) | shuffler msg/s (broker, {rounds}×{B}) |")
    print("|---|---|---|---|---|---|---|---|")
    for dim in (20, 100):
        cost = encode_costs(dim, n, repeats)
        local = shuffler_in_process(dim, rounds, repeats)
        through = float("nan") if args.no_broker else shuffler_broker(dim, rounds)
        print(f"| {dim} | {cost['message_bytes']:.0f} | {cost['block']:.1f} | {cost['single']:.1f} | "
              f"{cost['gradient_noise']:.2f} | {cost['seal']:.1f} | {local:,.0f} | {through:,.0f} |", flush=True)
    records = 64 if args.quick else 256
    print(f"\nshuffle-acsa over secure summation (b = {B}, epsilon = 1, delta = 1e-6, sigma = 64; through the broker: "
          f"{rounds} rounds of b = {SUM_BROKER_USERS} users, m of b = {SUM_BROKER_USERS}):\n")
    print(f"| d | shares m | q | tau | message bytes | encode µs/record (block of {records}) | shuffler units/s (in process) "
          "| shares m (b = 64) | release bytes (b = 64) | shuffler units/s (broker) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dim in (20, 100):
        acsa = acsa_encode_costs(dim, records, repeats)
        units = shuffler_units_in_process(dim, int(acsa["shares"]), 2, repeats)
        small = sum_shares(dim, SUM_BROKER_USERS)
        release = SUM_BROKER_USERS * small * wire.unit_size(dim)
        through = float("nan") if args.no_broker else shuffler_broker(dim, rounds, SUM_BROKER_USERS, small)
        print(f"| {dim} | {acsa['shares']:.0f} | 2^{acsa['bits']:.0f} | {acsa['tau']:.2g} | {acsa['message_bytes']:,.0f} | "
              f"{acsa['block']:,.0f} | {units:,.0f} | {small} | {release:,} | {through:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
