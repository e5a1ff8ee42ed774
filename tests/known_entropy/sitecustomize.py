"""Started on ``PYTHONPATH`` by tests/intruder.py: in a ``panpriv run`` whose environment sets
``PANPRIV_TEST_ENTROPY_SEED``, the OS entropy every noise draw reads
(``panpriv.protocols.randomness._read_entropy``) comes from a PCG64 stream with that seed instead,
so the test knows every draw the service makes. Nothing else changes: the service runs its
pan-private code paths (keyed generators wiped after each draw, the secure sampler's OS words), and
the draws have their usual distribution. This is the test's oracle for where the noise is
(tests/intruder.py), as the known key is in tests/protocols/test_memory_residue.py.
"""

import os

_SEED = os.environ.get("PANPRIV_TEST_ENTROPY_SEED")

if _SEED is not None:
    import numpy as np

    import panpriv.protocols.randomness as _randomness

    _generator = np.random.Generator(np.random.PCG64(int(_SEED)))

    def _known_entropy(view: memoryview) -> None:
        np.frombuffer(view, dtype=np.uint8)[:] = _generator.integers(0, 256, size=len(view), dtype=np.uint8)

    _randomness._read_entropy = _known_entropy
