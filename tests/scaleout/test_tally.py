"""The places of a version (streamer/scaleout/tally.py) and what the coordinator says it waits for
(issue 35): the rule every worker and the coordinator read off the gradients topic, without a broker."""

from __future__ import annotations

import numpy as np
import pytest

from panpriv.streamer.scaleout.coordinator import Coordinator
from panpriv.streamer.scaleout.tally import LEASE_RENEWALS, VersionTally
from panpriv.streamer.scaleout.wire import BatchOpen, GradientRecord, WireError, gradients_topic_record
from tests.scaleout import parts

K, W, PARAMS = 3, 100, 21


def mean(worker: str, version: int = 0, records: int = W, params: int = PARAMS, deployment: str = "d") -> bytes:
    return GradientRecord(deployment, version, worker, records, np.zeros(params), {"k": (0, records)}).to_json()


def lease(worker: str, filled: int, version: int = 0, renew_s: float = 0.5, deployment: str = "d") -> bytes:
    return BatchOpen(deployment, version, worker, filled, W, renew_s).to_json()


def test_a_growing_lease_keeps_its_place_and_a_mean_ends_it() -> None:
    tally = VersionTally("d")
    tally.take(mean("a"), 0.0)
    tally.take(mean("b"), 0.0)
    assert tally.places(0, K, W, PARAMS, 0.0) == 1  # the K-th place is free
    tally.take(lease("c", 10), 0.0)
    # c's batch grows slower than any --sync-wait, but grows: its place stays taken.
    for second in range(1, 20):
        tally.take(lease("c", 10 + second), float(second))
        assert tally.places(0, K, W, PARAMS, second + 0.1) == 0
        assert tally.places(0, K, W, PARAMS, second + 0.1, exclude="c") == 1  # c itself does not count its own lease
    tally.take(mean("c"), 20.0)
    assert tally.open_at(0, 20.0) == {} and tally.counted(0, W, PARAMS) == 3
    assert tally.places(0, K, W, PARAMS, 20.0) == 0


def test_a_lease_that_stops_growing_lapses() -> None:
    """A dead or hung worker, or one whose partitions hold no more records, renews nothing new: its
    place is free after LEASE_RENEWALS renewal intervals."""
    tally = VersionTally("d")
    for second in range(0, 5):
        tally.take(lease("c", 40), float(second) * 0.5)  # renewed, but without another record
    lapse = LEASE_RENEWALS * 0.5
    assert tally.places(0, K, W, PARAMS, lapse - 0.01) == K - 1
    assert tally.places(0, K, W, PARAMS, lapse + 0.01) == K


def test_only_means_the_coordinator_counts_fill_places() -> None:
    tally = VersionTally("d")
    tally.take(mean("a", records=W - 1), 0.0)  # another step's w
    tally.take(mean("b", params=PARAMS + 1), 0.0)  # another model's shape
    tally.take(mean("c", version=1), 0.0)  # another version
    assert tally.take(mean("e", deployment="other"), 0.0) is None  # another deployment
    assert tally.places(0, K, W, PARAMS, 0.0) == K
    with pytest.raises(WireError):
        tally.take(b"{not json", 0.0)
    with pytest.raises(WireError):
        gradients_topic_record(b'{"format": "panpriv-scaleout-open/1", "deployment": "d", "version": 0, "worker": "w", '
                               b'"filled": 1, "size": 2, "renew_s": NaN}')
    assert tally.counted(1, W, PARAMS) == 1 and tally.counted(1, W + 1, PARAMS) == 0  # w is the step's, checked when counted
    tally.forget_before(1)
    assert tally.counted(0, W - 1, PARAMS) == 0 and tally.counted(1, W, PARAMS) == 1


def test_the_coordinator_notes_leases_and_says_whom_it_waits_for() -> None:
    learner = parts.learner(6000)
    coordinator = Coordinator(learner, K, "d")
    w, params = coordinator.worker_batch, learner.param_count
    assert coordinator.waiting(0.0).endswith("no worker heard from yet")
    assert not coordinator.handle(mean("a", records=w, params=params), 0, now=1.0)
    assert not coordinator.handle(lease("b", 10, renew_s=5.0), 1, now=2.0)
    assert coordinator.progress_at == 2.0 and coordinator.received == 1 and not coordinator.rejected
    assert not coordinator.handle(lease("b", 10, renew_s=5.0), 2, now=3.0)  # renewed, not grown: no progress
    assert coordinator.progress_at == 2.0
    text = coordinator.waiting(3.0)
    assert text.startswith("waiting for the means of version 0: 1 of K = 3 in (from a)")
    assert "batches open there: b (10 of 100 records)" in text
    assert not coordinator.handle(mean("c", version=5, records=w, params=params), 3, now=4.0)  # stale: no progress
    assert coordinator.progress_at == 2.0 and coordinator.stale == 1
    assert "heard from before but not there: c" in coordinator.waiting(4.0)
    assert not coordinator.handle(mean("b", records=w, params=params), 4, now=5.0)
    assert coordinator.handle(mean("c", records=w, params=params), 5, now=6.0)
    assert coordinator.version == 1 and coordinator.offset == 6 and coordinator.progress_at == 6.0
    assert coordinator.waiting(6.0).startswith("waiting for the means of version 1: 0 of K = 3 in; no batch open there")


def claim(worker: str, version: int = 0, renew_s: float = 0.5) -> bytes:
    return BatchOpen("d", version, worker, 0, W, renew_s, claim=True).to_json()


def test_claims_are_ordered_by_their_offsets_and_the_first_free_places_win() -> None:
    """Two survivors claim the place a dead worker left (issue 35): whatever either read before,
    the claim first in the topic holds it and the second does not — on every reader's tally."""
    tally = VersionTally("d")
    tally.take(mean("a"), 0.0, 0)
    tally.take(lease("dead", 40), 0.0, 1)
    tally.take(claim("c"), 1.5, 2)
    assert tally.places(0, K, W, PARAMS, 1.5, exclude="b") == 0  # before the dead worker's lease lapses
    later = LEASE_RENEWALS * 0.5 + 0.5
    assert tally.places(0, K, W, PARAMS, later, exclude="b") == 1  # b sees the dead worker's place, and c's claim
    tally.take(claim("b"), later, 3)
    tally.take(claim("e"), later, 4)
    assert tally.holds("c", 0, K, W, PARAMS, later) and tally.holds("b", 0, K, W, PARAMS, later)
    assert not tally.holds("e", 0, K, W, PARAMS, later)
    assert tally.holders(0, K, W, PARAMS, later) == ["c", "b"] and tally.places(0, K, W, PARAMS, later) == 0
    # e withdraws; b's mean ends its lease and takes its place; a fresh claim still finds none.
    tally.take(BatchOpen("d", 0, "e", 0, W, 0.5, withdrawn=True).to_json(), later, 5)
    tally.take(mean("b"), later, 6)
    tally.take(claim("f"), later, 7)
    assert tally.open_at(0, later) == {"c": gradients_topic_record(claim("c"))} | {"f": gradients_topic_record(claim("f"))}
    assert not tally.holds("f", 0, K, W, PARAMS, later) and tally.read_to == 8


def test_a_claim_renewed_keeps_its_order_and_a_new_claim_goes_to_the_end() -> None:
    tally = VersionTally("d")
    tally.take(claim("x"), 0.0, 10)
    tally.take(claim("y"), 0.0, 11)
    tally.take(lease("x", 5), 0.2, 12)  # a renewal keeps x's claim at offset 10
    assert tally.holders(0, 1, W, PARAMS, 0.3) == ["x"]
    tally.take(claim("x"), 0.4, 13)  # x claims again (its lease may have lapsed): behind y
    assert tally.holders(0, 1, W, PARAMS, 0.5) == ["y"]


def test_the_owner_counts_its_lease_held_one_renewal_interval_before_readers_let_it_lapse() -> None:
    from panpriv.streamer.scaleout.tally import OWNER_RENEWALS, owner_holds

    assert OWNER_RENEWALS == LEASE_RENEWALS - 1
    assert owner_holds(10.0, 10.0 + OWNER_RENEWALS * 0.5 - 0.01, 0.5)
    assert not owner_holds(10.0, 10.0 + OWNER_RENEWALS * 0.5, 0.5)
