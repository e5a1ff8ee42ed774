"""Single-bit flips over a real checkpoint: each is refused or provably harmless (issue 15, failure 3).

Before the checksum, 110 of 200 flips resumed silently (learner state arrays, the ledger's source
key, ``max_records_per_user``) and 29 raised tracebacks. Now every flipped manifest either raises
:class:`CheckpointError` or loads to exactly the original checkpoint (the same canonical JSON, so
the same learner state bit for bit, the same positions and ledger): a flip that changes nothing
that is read, e.g. ``e`` ↔ ``E`` in a number's exponent.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter

import pytest

from panpriv.streamer.errors import CheckpointError
from panpriv.streamer.state.checkpoint import Checkpoint, read_manifest
from panpriv.streamer.state.integrity import seal_document
from tests.faults.figures import FIGURES

FAST_FLIPS = 300


def sealed(checkpoint: Checkpoint) -> bytes:
    """The checkpoint's canonical sealed form (the same content gives the same bytes)."""
    with seal_document(checkpoint.to_body()) as document:
        return bytes(document.view())


def flip_outcomes(finished_run, tmp_path, bits: list[int] | None, count: int = 0) -> Counter[str]:  # noqa: ANN001
    original_path = finished_run / "checkpoints" / "checkpoint.json"
    original = read_manifest(original_path)
    data = original_path.read_bytes()
    path = tmp_path / "checkpoint.json"
    shutil.copy(original_path, path)
    if bits is None:
        bits = random.Random().sample(range(len(data) * 8), count)
    outcomes: Counter[str] = Counter()
    for bit in bits:
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(flipped))
        try:
            loaded = read_manifest(path)
        except CheckpointError:
            outcomes["refused"] += 1
            continue
        assert sealed(loaded) == sealed(original), f"bit {bit} changed the resumed state silently"
        outcomes["harmless"] += 1
    return outcomes


def test_random_bit_flips_are_refused_or_harmless(finished_run, tmp_path) -> None:
    outcomes = flip_outcomes(finished_run, tmp_path, None, FAST_FLIPS)
    assert sum(outcomes.values()) == FAST_FLIPS and outcomes["refused"] > 0


@pytest.mark.soak
def test_soak_every_bit_of_the_checkpoint(finished_run, tmp_path) -> None:
    size = (finished_run / "checkpoints" / "checkpoint.json").stat().st_size
    outcomes = flip_outcomes(finished_run, tmp_path, list(range(size * 8)))
    print(f"\nbit flips over a {size:,}-byte checkpoint: {sum(outcomes.values()):,} flips, {dict(outcomes)}")
    FIGURES.flipped("service checkpoint (every bit)", outcomes)
    assert sum(outcomes.values()) == size * 8 >= 200
