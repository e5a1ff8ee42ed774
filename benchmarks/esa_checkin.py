"""Benchmark of ``checkin`` in Encode–Shuffle–Analyze (random check-ins; streamer/esa), in process,
at d ∈ {20, 100}, for single and averaged updates (ℓ2 randomizer, logistic loss, ε = 4, δ = 1e-5,
sliding windows of 100 slots, 64 clients per wake slot):

    PYTHONPATH=. .venv/bin/python -m benchmarks.esa_checkin [--quick]

* **client encode** (``CheckinEncoder.encode``: the check-in draws, the gradient, the randomizer for
  every client — the zero vector for those who do not check in — and two sealed boxes, to the
  analyzer inside one to the shuffler): µs per record for a block of 4,096 records and for one
  record per call;
* **shuffler** (``SlotShuffler.offer``: one outer box opened per message, the per-slot release with
  a dummy derived and sealed for every single-update slot, the signed batch): messages/s and slots/s;
* **analyzer** (``CheckinAnalyzer.handle``: the batch's signature checked, the released updates
  opened, one step): slots/s.

Check-ins had an outer layer before onion sealing was extended to every learner; the message is
the same size (160 + 8p bytes), the release now a signed batch.

End to end on the real broker a slot costs one model round trip (``tests/esa/test_checkin_kafka.py``
prints the rate). Times are the best of a few repeats.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
from nacl.public import PrivateKey

from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.streamer.esa.batches import BatchSigner, BatchVerifier
from panpriv.streamer.esa.checkin_analyzer import CheckinAnalyzer
from panpriv.streamer.esa.checkin_client import CheckinEncoder, local_randomizer
from panpriv.streamer.esa.keys import ShufflerKeys
from panpriv.streamer.esa.slot_shuffler import SlotRules, SlotShuffler, dummy_sealer

SLOT_LENGTH, SLOTS = 64, 100
DEPLOYMENT = "esa:bench/messages"


def measure(dim: int, update: str, wakes: int, repeats: int) -> dict[str, float]:
    analyzer_key, shuffler = PrivateKey.generate(), ShufflerKeys.from_private(PrivateKey.generate())
    shuffler_key = shuffler.box
    learner = RandomCheckinSGD(dim=dim, loss="logistic", epsilon=4.0, delta=1e-5, slots=SLOTS, slot_length=SLOT_LENGTH,
                               update=update, radius=math.sqrt(dim))
    analyzer = CheckinAnalyzer(learner, [analyzer_key], "bench")
    model = analyzer.model()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4096, dim)) / math.sqrt(dim)
    y = np.where(rng.random(4096) < 0.5, 1.0, -1.0)
    encoder = CheckinEncoder(analyzer_key.public_key, shuffler_key.public_key, model)
    block = min(time_once(lambda: encoder.encode(X, y)) for _ in range(repeats)) / len(y)
    single = min(time_once(lambda: [encoder.encode(X[i:i + 1], y[i:i + 1]) for i in range(200)])
                 for _ in range(repeats)) / 200
    messages = [CheckinEncoder(analyzer_key.public_key, shuffler_key.public_key, dataclasses.replace(model, round=w))
                .encode(X[(w % 64) * SLOT_LENGTH:(w % 64 + 1) * SLOT_LENGTH], y[(w % 64) * SLOT_LENGTH:(w % 64 + 1) * SLOT_LENGTH])
                for w in range(wakes)]
    rules = SlotRules.from_calibration(dict(model.calibration))
    dummy = dummy_sealer(local_randomizer(model.calibration), rules.params, bytes(shuffler_key), DEPLOYMENT)
    signer = BatchSigner(shuffler, DEPLOYMENT)
    releases: list[bytes] = []

    def shuffle() -> None:
        releases.clear()
        state = SlotShuffler(shuffler_key, rules, dummy, lambda slot: analyzer_key.public_key)
        offset = 0
        for wake in messages:
            for item in wake:
                for slot, released in state.offer(offset, item):
                    releases.append(signer.record(slot, released))
                    state.mark_released(slot)
                offset += 1

    shuffled = min(time_once(shuffle) for _ in range(repeats))

    def analyze() -> None:
        fresh = CheckinAnalyzer(RandomCheckinSGD.from_config(learner.config()), [analyzer_key], "bench")
        fresh.bind(BatchVerifier([shuffler.verify_key], DEPLOYMENT))
        for record in releases:
            fresh.handle(record)

    analyzed = min(time_once(analyze) for _ in range(repeats))
    return {"message": float(len(messages[0][0])), "block_us": block * 1e6, "one_us": single * 1e6,
            "shuffler_msgs": wakes * SLOT_LENGTH / shuffled, "shuffler_slots": len(releases) / shuffled,
            "analyzer_slots": len(releases) / analyzed}


def time_once(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer wake slots and repeats")
    args = parser.parse_args(argv)
    wakes, repeats = (20, 1) if args.quick else (100, 3)
    print("| d | update | message | client encode, block of 4,096 | one record per call | shuffler | analyzer |")
    print("|---|---|---|---|---|---|---|")
    for dim in (20, 100):
        for update in ("single", "averaged"):
            m = measure(dim, update, wakes, repeats)
            print(f"| {dim} | {update} | {m['message']:.0f} B | {m['block_us']:.0f} µs/record | {m['one_us']:.0f} µs/record | "
                  f"{m['shuffler_msgs']:,.0f} messages/s ({m['shuffler_slots']:,.0f} slots/s) | {m['analyzer_slots']:,.0f} slots/s |")


if __name__ == "__main__":
    main()
