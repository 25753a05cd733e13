"""The end of a crawl, decided exactly: ordered flushes, the finished version, the census.

Against a real redis-server.  The census counts each partition atomically,
but not all partitions at once: work can move from a partition not counted
yet to one already counted while it scans (a callback's children queued
elsewhere, then the parent acked).  These tests make that happen in the
middle of a scan, deterministically, and check that the drain check is not
fooled -- and that without the version bump it would be.
"""

from __future__ import annotations

import time

import pytest
import redis

from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.redis.frontier import RedisFrontier

pytestmark = pytest.mark.slow  # a real redis-server


@pytest.fixture
def frontier(redis_client: redis.Redis) -> RedisFrontier:
    f = RedisFrontier(redis_client, prefix="d", partitions=8, lease_ttl_ms=60_000)
    for p in range(8):
        f.set_owner(p, "node-a", 1)
    return f


def test_census_counts_queued_and_leased_work_per_partition(frontier: RedisFrontier) -> None:
    empty = frontier.census(each=True, chunk=3)
    assert (empty.work, empty.queued, empty.leased) == (0, [0] * 8, [0] * 8)
    assert empty.drained
    for p, n in ((1, 2), (6, 3)):
        for i in range(n):
            frontier.enqueue(p, f"fp{p}-{i}", "x")
    frontier.pop(6, "node-a", 1, count=2)
    full = frontier.census(each=True, chunk=3)
    assert full.queued == [0, 2, 0, 0, 0, 0, 1, 0]
    assert full.leased == [0, 0, 0, 0, 0, 0, 2, 0]
    assert full.work == 5 and not full.drained
    for chunk in (1, 3, 8, 100):
        quick = frontier.census(chunk=chunk)  # stops counting at the first partition with work
        assert quick.work > 0 and not quick.drained
        assert quick.queued == quick.leased == []


def test_a_flush_sends_children_then_the_bump_then_the_parents_ack(
    frontier: RedisFrontier,
) -> None:
    parent_id = frontier.enqueue(5, "parent", "p")
    (parent,) = frontier.pop(5, "node-a", 1)
    v0 = frontier.finished_version()
    done = frontier.flush(
        [EnqueueOp(1, "child", "c"), EnqueueOp(5, "parent", "dup")],
        acks={5: [parent.token.ref]},
    )
    assert done.enqueued[0] is not None and done.enqueued[1] is None  # the dup was seen
    assert (done.acked, done.nacked, done.dead_lettered) == (1, 0, 0)
    assert frontier.finished_version() == v0 + 1
    assert (frontier.queued(1), frontier.leased(5)) == (1, 0)
    assert parent_id == parent.id
    # Only enqueues, or only nacks: nothing finished, no bump.
    frontier.flush([EnqueueOp(3, "other", "o")])
    (child,) = frontier.pop(1, "node-a", 1)
    assert frontier.flush(nacks={1: [child.token.ref]}).nacked == 1
    assert frontier.finished_version() == v0 + 1
    # A dead letter finishes a request like an ack.
    (again,) = frontier.pop(1, "node-a", 1)
    assert frontier.flush(dead=[(again.token, "malformed: test")]).dead_lettered == 1
    assert frontier.finished_version() == v0 + 2


@pytest.mark.parametrize("through_flush", [True, False])
def test_work_moving_behind_the_scan_cannot_fake_a_drained_crawl(
    frontier: RedisFrontier, through_flush: bool
) -> None:
    # The last request of the crawl is in flight: leased in partition 6.
    frontier.enqueue(6, "parent", "p")
    (parent,) = frontier.pop(6, "node-a", 1)

    def callback_ends(chunk: int) -> None:
        # Right after the census counted partitions 0-3 (empty), the callback's
        # child lands in partition 1 and the parent is acked in partition 6,
        # which the census has not counted yet.
        if chunk != 0:
            return
        if through_flush:  # what a worker does
            frontier.flush([EnqueueOp(1, "child", "c")], acks={6: [parent.token.ref]})
        else:  # the same two steps without the version bump
            frontier.enqueue(1, "child", "c")
            frontier.ack(6, [parent.token.ref])

    census = frontier.census(chunk=4, between=callback_ends)
    assert census.work == 0  # every partition was empty when it was counted...
    assert frontier.queued(1) == 1  # ...yet the crawl is not over
    # The bump sent before the ack is what gives the move away.
    assert census.drained is not through_flush
    if through_flush:
        assert census.after == census.before + 1
        assert not frontier.census().drained  # the next check sees the child itself


def test_a_quiet_crawl_is_drained_and_a_reaper_round_bumps_the_version(
    redis_client: redis.Redis,
) -> None:
    frontier = RedisFrontier(redis_client, prefix="q", partitions=8, lease_ttl_ms=50)
    frontier.set_owner(2, "node-a", 1)
    frontier.enqueue(2, "fp", "x")
    (leased,) = frontier.pop(2, "node-a", 1)
    assert not frontier.census().drained
    v0 = frontier.finished_version()
    time.sleep(0.1)
    assert frontier.reap_all("node-a") == (1, 0)  # may dead-letter: bumps like an ack
    assert frontier.finished_version() == v0 + 1
    assert frontier.flush(acks={2: [leased.token.ref]}).acked == 0  # the lease expired
    (again,) = frontier.pop(2, "node-a", 1)
    frontier.flush(acks={2: [again.token.ref]})
    census = frontier.census()
    assert census.drained and census.work == 0 and census.before == census.after
