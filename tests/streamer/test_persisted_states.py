"""Every checkpoint a run writes, read by an attacker of the disk: no two differ by a clean sum.

A reader of the disk sees each manifest while it is current and, after ``os.replace``, the blocks
the replaced one leaves. This test plays both while the real ``panpriv run`` streams a canary
file with pan-acsa (several checkpoints inside each batch): a watcher opens every manifest as it
appears — keeping it open, so that the inode's blocks can still be read after it is replaced —
and reads it. Then:

- every manifest was read (their sequence numbers run without a gap);
- no two manifests of one batch differ (pan-acsa saves the state at the batch's start, never the
  accumulator), and where a pair of states of one batch carries accumulators, their difference is
  compared with the clean sum of the records between their positions (on main at 4ed1851 it was
  equal, to 1e-12 relative: the records' exact clipped gradients);
- each replaced manifest's inode, read through the descriptor kept open, holds only zeros (the
  service overwrote it once the new one was durable).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.runtime.learners import restore_learner
from panpriv.streamer.state.checkpoint import read_manifest
from tests.intruder import Service, canary_stream, gradient_rows

pytestmark = pytest.mark.slow


class Watcher(threading.Thread):
    """Opens and reads the manifest at ``path`` each time it is a new file (a new inode)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.read: list[tuple[int, int, bytes]] = []  # (inode, descriptor, content when current)
        self.done = threading.Event()

    def run(self) -> None:
        seen = None
        while not self.done.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                time.sleep(0.001)
                continue
            inode = os.fstat(fd).st_ino
            if inode == seen:
                os.close(fd)
                time.sleep(0.001)
                continue
            content = os.pread(fd, os.fstat(fd).st_size, 0)
            self.read.append((inode, fd, content))
            seen = inode
        # the descriptors stay open for the test to read the replaced files' blocks


def states(watcher: Watcher, tmp_path: Path) -> list:
    parsed = []
    for k, (_, _, content) in enumerate(watcher.read):
        copy = tmp_path / f"manifest-{k}.json"
        copy.write_bytes(content)
        parsed.append(read_manifest(copy))
    return parsed


def test_every_checkpoint_written_is_a_batch_boundary_and_replaced_ones_are_erased(tmp_path) -> None:
    stream = canary_stream(6_000, "json", seed=4)
    path = stream.write_lines(tmp_path / "stream.jsonl")
    service = Service(tmp_path / "svc", stream, f"file:{path}", {"name": "pan-acsa"},
                      source={"rate": 1500.0}, checkpoint_every=150)
    watcher = Watcher(service.process.out / "checkpoints" / "checkpoint.json")
    watcher.start()
    try:
        code = service.process._process.process.wait(timeout=120)
    finally:
        watcher.done.set()
        watcher.join(10)
        service.stop()
    assert code == 0, service.process.log()[-2000:]
    manifests = states(watcher, tmp_path)
    sequences = [m.sequence for m in manifests]
    assert len(manifests) >= 20 and sequences == list(range(sequences[0], sequences[0] + len(sequences))), sequences
    by_batch: dict[tuple[int, int, int], list] = {}
    for manifest in manifests:
        state = manifest.learner_state
        by_batch.setdefault((state["epoch"], state["phase"], state["batch"]), []).append(manifest)
    assert any(len(group) > 1 for group in by_batch.values()), "no batch had two checkpoints: the test tests nothing"
    pairs = [(a, b) for group in by_batch.values() for a, b in zip(group, group[1:], strict=False)]
    clean_sums = [found for a, b in pairs for found in clean_sum_between(a, b, stream)]
    left = {inode: len(os.pread(fd, os.fstat(fd).st_size, 0).strip(b"\0")) for inode, fd, _ in watcher.read[:-1]}
    for _, fd, _ in watcher.read:
        os.close(fd)
    print(f"\n{len(manifests)} manifests, {len(pairs)} pairs of one batch; differing by a clean sum: {len(clean_sums)}; "
          f"replaced files not erased: {sum(1 for n in left.values() if n)} of {len(left)}")
    assert not clean_sums, f"pairs of saved states of one batch differ by the clean sum of the records between: {clean_sums}"
    for a, b in pairs:
        assert a.learner_state["records"] == b.learner_state["records"]
        for key in ("theta", "theta_ag", "theta_md"):
            np.testing.assert_array_equal(a.learner_state[key], b.learner_state[key])
    assert not any(left.values()), f"replaced manifests still hold bytes: {left}"


def clean_sum_between(a, b, stream) -> list[tuple[int, int]]:  # noqa: ANN001
    """If two saved states of one batch hold accumulators, whether their difference is the clean
    sum of the records between their positions (the attack that worked before issue 32)."""
    key = "grad" if "grad" in a.learner_state else "grad_units" if "grad_units" in a.learner_state else None
    if key is None or key not in b.learner_state:
        return []
    learner = restore_learner(a.learner, a.learner_config, a.learner_state, None)
    start, stop = a.records, b.records
    rows = gradient_rows(learner, learner._iterate.theta_md, stream.X[start:stop], stream.y[start:stop]).sum(axis=0)
    difference = b.learner_state[key] - a.learner_state[key]
    if key == "grad":
        rows = rows / learner.current_plan().batch_size(learner._iterate.batch)
        match = np.allclose(difference, rows, rtol=1e-9, atol=1e-12)
    else:
        match = np.array_equal(difference, rows)
    return [(start, stop)] if match else []
