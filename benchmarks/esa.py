"""Benchmark of Encode–Shuffle–Analyze (streamer/esa; Bittau et al. 2017): client encode cost per
record, message sizes and shuffler throughput at d ∈ {20, 100}, with the cost of the onion layer
(every message sealed to the analyzer, then to the shuffler, which removes its layer and signs each
batch) side by side with the same work without it.

    PYTHONPATH=. .venv/bin/python -m benchmarks.esa           # starts the test suite's Tansu broker
    PYTHONPATH=. .venv/bin/python -m benchmarks.esa --quick --no-broker

* **sizes**: a message (the unit inside the shuffler's layer, 20 + 48 + 8 bytes of outer header,
  box and sealed round) and the unit the shuffler releases (12 + 48 + 8 + 8p bytes). Before onion
  sealing a message was the unit alone with an 8-byte clear round: 76 + 8p bytes;
* **client encode** (``Encoder.encode``, shuffle-gaussian, logistic loss, ε = 1, δ = 1e-6, b = 1024):
  µs per record for a block of 4,096 records (a simulator of many users) and for one record per
  call (one real user: the per-call overhead included); its floor is the same gradient, noise and
  inner seal without the outer one (the client's work before onion sealing); ``seal``: one
  PyNaCl ``SealedBox`` (an ephemeral X25519 key, one DH, XSalsa20-Poly1305);
* **shuffler, in process**: the state machine (``Shuffler.offer``: framing check, opening its
  layer, grouping, the OS-entropy permutation) plus the signed batch record, messages/s — its CPU
  ceiling; its floor is the same machine with nothing to open (the units taken as they are, the
  shuffler's work before onion sealing); ``sign``/``verify``: one batch's Ed25519 signature and the
  analyzer's check (signature and digest);
* **shuffler, through the broker**: ``panpriv.streamer.esa.shuffler.run`` against the real broker, from
  start to the last batch acknowledged (acks=all) for ``rounds`` × b messages already on the
  messages topic: messages/s including Kafka fetch, produce and offset commits.

* **shuffle-acsa over secure summation** (``SharesEncoder.encode``: the gradient, PVEC's randomizer,
  the split into m shares, one sealing per share and one outer sealing of the m; ε = 1, δ = 1e-6,
  b = 1024): µs per record and its floor without the outer seal, the message size, and the
  shuffler's state machine on share messages (opening one layer per user, the permutation of all
  b·m units, the signed batch), units/s and its floor; and through the (Tansu) broker with rounds of
  64 users, units/s from start to the last release acknowledged. A release of b·m units is about
  7.5 MB at b = 1024, d = 20 and 100 MB at d = 100; with 64 users 0.7 MB and 10 MB (an Apache Kafka
  topic needs ``max.message.bytes`` above that: deploy/docker-compose.yml).

Times are the best of a few repeats (in-process parts) or one run (broker); ratios are after/floor
in the same run.
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
from panpriv.streamer.esa.batches import BatchSigner, BatchVerifier
from panpriv.streamer.esa.client import Encoder
from panpriv.streamer.esa.keys import ShufflerKeys, generate, key_id, load_shuffler
from panpriv.streamer.esa.shuffler import ShuffleOptions, Shuffler, run
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer
from panpriv.streamer.esa.sum_client import SharesEncoder

B = 1024
SUM_BROKER_USERS = 64
DEPLOYMENT = "esa:bench/messages"
SHUFFLER = ShufflerKeys.from_private(PrivateKey.generate())


class Unopened(Shuffler):
    """The floor: the same state machine with no layer to open (its units taken as they are)."""

    def _units(self, value: bytes) -> list[bytes] | str:
        body = value[20:]
        size = (len(body)) // (self.shares or 1)
        return [body[i * size:(i + 1) * size] for i in range(self.shares or 1)]


def best(run_once: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - start)
    return min(times)


def paired(after: Callable[[], object], floor: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best times of ``after`` and of its ``floor``, measured alternately (a loaded machine's drift
    then falls on both alike)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run_once, into in ((after, times[0]), (floor, times[1])):
            start = time.perf_counter()
            run_once()
            into.append(time.perf_counter() - start)
    return min(times[0]), min(times[1])


def encode_costs(dim: int, n: int, repeats: int) -> dict[str, float]:
    key = PrivateKey.generate()
    learner = ShuffleGaussianSGD(dim=dim, loss="logistic", epsilon=1.0, delta=1e-6, batch_size=B, radius=np.sqrt(dim))
    model = Analyzer(learner, [key], "bench").model()
    encoder = Encoder(key.public_key, SHUFFLER.box.public_key, model)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    one_user = Encoder(key.public_key, SHUFFLER.box.public_key, model)  # scratch sized for one record
    single = best(lambda: [one_user.encode(X[i : i + 1], y[i : i + 1]) for i in range(min(n, 1000))], repeats) / min(n, 1000)
    work, noise = scratch.Scratch(), NoiseSource()
    box, ident = SealedBox(key.public_key), key_id(key.public_key)

    def inner_only() -> None:
        """The client's work before onion sealing: gradient, noise and the analyzer's seal."""
        Z = scratch.features(learner.loss, X, 1.0, work)
        rows = local_messages(learner.loss, learner.theta, Z, scratch.labels(learner.loss, y, work), encoder.clip,
                              encoder.noise_multiplier * encoder.clip, noise, work)
        [wire.seal_unit(box, ident, wire.plaintext(0, row)) for row in rows]
        work.wipe()

    block, floor = (t / n for t in paired(lambda: encoder.encode(X, y), inner_only, repeats))
    text = wire.plaintext(0, np.zeros(learner.calibration()["params"]))
    seal = best(lambda: [box.encrypt(text) for _ in range(1000)], repeats) / 1000
    params = learner.calibration()["params"]
    return {"block": block * 1e6, "floor": floor * 1e6, "single": single * 1e6, "seal": seal * 1e6,
            "message_bytes": float(encoder.size), "unit_bytes": float(wire.vector_unit_size(params))}


def envelopes(round_messages: Callable[[int, int], bytes], rounds: int, users: int) -> list[bytes]:
    return [round_messages(t, i) for t in range(rounds) for i in range(users)]


def vector_messages(dim: int) -> Callable[[int, int], bytes]:
    box, unit = SealedBox(SHUFFLER.box.public_key), bytes(wire.vector_unit_size(dim))
    return lambda round_, user: wire.seal_message(box, SHUFFLER.key_id, round_, wire.UNIT_MAGIC + unit[4:])


def share_messages(dim: int, shares: int) -> Callable[[int, int], bytes]:
    box, unit = SealedBox(SHUFFLER.box.public_key), wire.UNIT_MAGIC + bytes(wire.share_unit_size(dim) - 4)
    return lambda round_, user: wire.seal_message(box, SHUFFLER.key_id, round_, unit * shares)


def shuffle_in_process(messages: list[bytes], users: int, dim: int, shares: int | None,
                       repeats: int) -> tuple[float, float]:
    """Units/s of the shuffler's state machine over ``messages`` (rounds of ``users``), signing each
    release, and of its floor (:class:`Unopened`), measured alternately."""
    signer = BatchSigner(SHUFFLER, DEPLOYMENT)

    def once(machine: type[Shuffler]) -> Callable[[], None]:
        def run_once() -> None:
            state = machine(SHUFFLER.box, users, dim, shares=shares)
            for offset, item in enumerate(messages):
                for round_, units in state.offer(offset, item):
                    signer.record(round_, units)
                    state.mark_released(round_)
        return run_once

    after, floor = paired(once(Shuffler), once(Unopened), repeats)
    count = len(messages) * (shares or 1)
    return count / after, count / floor


def sign_and_verify(units: int, size: int, repeats: int) -> tuple[float, float]:
    """µs to sign one batch of ``units`` units of ``size`` bytes, and to verify it (signature and digest)."""
    batch = [np.random.default_rng(i).bytes(size) for i in range(units)]
    signer, verifier = BatchSigner(SHUFFLER, DEPLOYMENT), BatchVerifier([SHUFFLER.verify_key], DEPLOYMENT)
    record = signer.record(0, batch)
    return best(lambda: signer.record(0, batch), repeats) * 1e6, best(lambda: verifier.admit(record), repeats) * 1e6


def shuffler_broker(dim: int, rounds: int, users: int = B, shares: int | None = None) -> float:
    """Messages/s (units/s with ``shares``) of ``panpriv.streamer.esa.shuffler.run`` over ``rounds`` × ``users``
    messages already on the topic: fetch, opening, grouping, permutation, signing, produce (acks=all), commits."""
    from kafka import KafkaProducer

    from tests.realparts import KafkaBroker

    with tempfile.TemporaryDirectory() as workdir:
        files = generate(Path(workdir) / "keys", "shuffler")
        keys = load_shuffler(files.private)
        box = SealedBox(keys.box.public_key)
        unit = wire.UNIT_MAGIC + bytes((wire.vector_unit_size(dim) if shares is None else wire.share_unit_size(dim)) - 4)
        broker = KafkaBroker(Path(workdir))
        try:
            tag = uuid.uuid4().hex[:8]
            messages_topic = broker.create_topic(f"bench-messages-{tag}")
            shuffled_topic = broker.create_topic(f"bench-shuffled-{tag}")
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=20, max_request_size=16 << 20)
            for t in range(rounds):
                for _ in range(users):
                    producer.send(messages_topic, wire.seal_message(box, keys.key_id, t, unit * (shares or 1)))
            producer.flush()
            producer.close()
            options = ShuffleOptions([broker.bootstrap], messages_topic, shuffled_topic, users, dim, f"bench-{tag}",
                                     files.private, max_rounds=rounds, shares=shares)
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
    encoder = SharesEncoder(key.public_key, SHUFFLER.box.public_key, analyzer.model())
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    block = best(lambda: encoder.encode(X, y), repeats) / n
    outer = SealedBox(SHUFFLER.box.public_key)
    body = bytes(analyzer.shares * wire.share_unit_size(dim) + 8)
    seal_outer = best(lambda: [outer.encrypt(body) for _ in range(200)], repeats) / 200
    return {"block": block * 1e6, "floor": (block - seal_outer) * 1e6, "shares": float(analyzer.shares),
            "bits": float(analyzer.bits), "message_bytes": float(encoder.size), "tau": analyzer.tau}


def sum_shares(dim: int, users: int) -> int:
    """The secure sum's m for rounds of ``users`` users of shuffle-acsa at the benchmark's plan."""
    learner = ShuffleACSA(dim=dim, loss="logistic", epsilon=1.0, delta=1e-6, horizon=16 * users, batch_size=users,
                          radius=np.sqrt(dim))
    return SumAnalyzer(learner, [PrivateKey.generate()], "bench").shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-broker", action="store_true", help="skip the shuffler-through-the-broker measurement")
    args = parser.parse_args()
    n, repeats, rounds = (1024, 2, 4) if args.quick else (4096, 5, 16)
    print(f"| d | message bytes (unit) | encode µs/record, block of {n} (floor: no outer seal) | encode µs/record, one per "
          f"call | seal µs | shuffler msg/s in process (floor: nothing to open) | sign / verify µs per batch of {B} | "
          f"shuffler msg/s (broker, {rounds}×{B}) |")
    print("|---|---|---|---|---|---|---|---|")
    for dim in (20, 100):
        cost = encode_costs(dim, n, repeats)
        messages = envelopes(vector_messages(dim), rounds, B)
        opened, floor = shuffle_in_process(messages, B, dim, None, repeats)
        sign, verify = sign_and_verify(B, int(cost["unit_bytes"]), repeats)
        through = float("nan") if args.no_broker else shuffler_broker(dim, rounds)
        print(f"| {dim} | {cost['message_bytes']:.0f} ({cost['unit_bytes']:.0f}) | {cost['block']:.1f} "
              f"({cost['floor']:.1f}: ×{cost['block'] / cost['floor']:.2f}) | {cost['single']:.1f} | {cost['seal']:.1f} | "
              f"{opened:,.0f} ({floor:,.0f}: ×{opened / floor:.3f}) | {sign:,.0f} / {verify:,.0f} | {through:,.0f} |",
              flush=True)
    records = 64 if args.quick else 256
    print(f"\nshuffle-acsa over secure summation (b = {B}, epsilon = 1, delta = 1e-6, sigma = 64; through the broker: "
          f"{rounds} rounds of b = {SUM_BROKER_USERS} users, m of b = {SUM_BROKER_USERS}):\n")
    print(f"| d | shares m | q | tau | message bytes | encode µs/record, block of {records} (floor: no outer seal) | "
          "shuffler units/s in process (floor: nothing to open) | shares m (b = 64) | release bytes (b = 64) | "
          "shuffler units/s (broker) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dim in (20, 100):
        acsa = acsa_encode_costs(dim, records, repeats)
        shares = int(acsa["shares"])
        messages = envelopes(share_messages(dim, shares), 2, B)
        units, floor = shuffle_in_process(messages, B, dim, shares, repeats)
        small = sum_shares(dim, SUM_BROKER_USERS)
        release = SUM_BROKER_USERS * small * wire.share_unit_size(dim)
        through = float("nan") if args.no_broker else shuffler_broker(dim, rounds, SUM_BROKER_USERS, small)
        print(f"| {dim} | {shares} | 2^{acsa['bits']:.0f} | {acsa['tau']:.2g} | {acsa['message_bytes']:,.0f} | "
              f"{acsa['block']:,.0f} ({acsa['floor']:,.0f}: ×{acsa['block'] / acsa['floor']:.3f}) | {units:,.0f} "
              f"({floor:,.0f}: ×{units / floor:.3f}) | {small} | {release:,} | {through:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
