"""Where the learners' noise randomness comes from.

Pan-privacy (000, Def. C.2) lets an intruder read the internal state once. If the state held a
pseudo-random generator, the intruder could predict every noise vector still to be added and
subtract it from future outputs. So by default each noise draw uses a generator freshly seeded
from OS entropy at draw time, and no generator state is ever kept between draws or saved.

Passing an explicit ``rng`` (a seed or a ``numpy.random.Generator``) is the labelled replay/testing
mode (Scientific Python SPEC 7): reproducible, and *not* pan-private, because the generator then
lives in the learner's memory.
"""

from __future__ import annotations

import secrets

import numpy as np

RngLike = int | np.random.Generator | None


class NoiseSource:
    """Hands out generators for noise draws.

    Parameters
    ----------
    rng
        ``None`` (default): every :meth:`generator` call returns a new generator seeded with 128
        bits from the OS (``secrets``). An int or ``Generator``: one seeded generator reused for
        every draw — reproducible, for tests and replays only.
    """

    def __init__(self, rng: RngLike = None) -> None:
        self._fixed = None if rng is None else np.random.default_rng(rng)

    @property
    def is_seeded(self) -> bool:
        """True in the explicit replay/testing mode (a fixed generator is held in memory)."""
        return self._fixed is not None

    def generator(self) -> np.random.Generator:
        """A generator for the next noise draw."""
        if self._fixed is not None:
            return self._fixed
        return np.random.default_rng(secrets.randbits(128))


SEEDED_WARNING = (
    "noise generator explicitly seeded (replay/testing mode): the noise is reproducible and an "
    "intruder who reads the process memory can predict future noise, so the pan-private guarantee "
    "does not hold in this mode"
)
