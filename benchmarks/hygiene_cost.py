"""What memory hygiene costs: learn_many throughput and the price of one noise draw.

Run it once with the code to measure first on ``sys.path`` (e.g. a checkout of the previous
commit via ``PYTHONPATH=/path/to/old``) and once with this tree, and compare the printed rates:

    python benchmarks/hygiene_cost.py                 # this tree
    PYTHONPATH=/tmp/old python benchmarks/hygiene_cost.py

Learners run in the pan-private mode (``rng=None``: OS-entropy noise), records in micro-batches of
``--micro-batch`` rows, features of norm 0.9. The noise part times one draw of p Gaussian
coordinates the way the learners draw them: ``NoiseSource.add_gaussian`` into an accumulator if
it exists (this tree), else a fresh ``default_rng(secrets.randbits(128)).normal`` (the old path).
"""

from __future__ import annotations

import argparse
import secrets
import time

import numpy as np

from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.randomness import NoiseSource
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.protocols.shuffle_sgd import ShuffleSGD

LOSS = {"name": "logistic", "intercept": True}


def _throughput(make, dim: int, records: int, micro_batch: int) -> float:
    """Records per second of learn_many over ``records`` records."""
    rng = np.random.default_rng(dim)
    X = rng.standard_normal((micro_batch, dim))
    X *= (0.9 / np.sqrt(np.einsum("ij,ij->i", X, X)))[:, None]
    y = (rng.random(micro_batch) < 0.5).astype(np.float64)
    learner = make(dim, records)
    start = time.perf_counter()
    for _ in range(records // micro_batch):
        learner.learn_many(X, y)
    return (records // micro_batch) * micro_batch / (time.perf_counter() - start)


def _noise_cost(shape: tuple[int, ...], repeats: int) -> float:
    """Microseconds per Gaussian draw of ``shape``."""
    source = NoiseSource()
    out = np.zeros(shape)
    start = time.perf_counter()
    if hasattr(source, "add_gaussian"):
        for _ in range(repeats):
            source.add_gaussian(out, 1.0)
    else:
        for _ in range(repeats):
            out = out + np.random.default_rng(secrets.randbits(128)).normal(0.0, 1.0, size=shape)
    return 1e6 * (time.perf_counter() - start) / repeats


LEARNERS = {
    "pan-acsa": lambda d, n: PanPrivateACSA(d, LOSS, 1.0, 1e-6, horizon=n),
    "shuffle-sgd": lambda d, n: ShuffleSGD(d, LOSS, 1.0, 1e-6, horizon=n),
    "shuffle-gaussian": lambda d, n: ShuffleGaussianSGD(d, LOSS, 1.0, 1e-6, horizon=n),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--micro-batch", type=int, default=4096)
    args = parser.parse_args()
    for p in (21, 101, 1001):
        print(f"noise draw p={p:<5d} {_noise_cost((p,), 2000):8.2f} us")
    print(f"noise draw 4096x101 {_noise_cost((4096, 101), 20):8.0f} us")
    for name, dims in (("pan-acsa", (20, 100)), ("shuffle-sgd", (20,)), ("shuffle-gaussian", (20,))):
        for dim in dims:
            records = args.records if name == "pan-acsa" else args.records // 4
            rate = _throughput(LEARNERS[name], dim, records, args.micro_batch)
            print(f"{name:17s} d={dim:<4d} {rate:12,.0f} records/s over {records:,}")


if __name__ == "__main__":
    main()
