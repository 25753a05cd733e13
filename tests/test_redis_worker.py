"""The worker thread's fleet logic, step by step against a real redis-server (no thread).

Each test drives the worker's jobs by their public steps, the way its loop
does -- ``membership.beat``, ``flusher.run_once``, ``sync.sync``,
``popper.pop``, ``drain.check`` -- for two or three workers sharing one
Redis, and asserts on what Redis and the workers hold afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker, WorkerOptions

PARTITIONS = 16

pytestmark = pytest.mark.slow  # a real redis-server


def _worker(
    client: redis.Redis, node: str, clock: Callable[[], float] = time.monotonic, **options: Any
) -> FrontierWorker:
    frontier = RedisFrontier(client, prefix="w", partitions=PARTITIONS, lease_ttl_ms=60_000)
    registry = NodeRegistry(client, frontier)
    worker = FrontierWorker(frontier, registry, node, WorkerOptions(**options), clock=clock)
    worker.membership.beat()
    return worker


def _pop_all(worker: FrontierWorker, want: int = 100) -> list[str]:
    worker.request(want)
    worker.popper.pop()
    payloads = [leased.payload for leased in worker.inbound]
    worker.inbound.clear()
    return payloads


def test_a_worker_wakes_the_owner_of_the_partition_it_queued_work_in(
    redis_client: redis.Redis,
) -> None:
    a = _worker(redis_client, "a")
    b = _worker(redis_client, "b")  # b joins: half the partitions move to it
    a.sync.sync()
    assert a.owned and b.owned and not a.owned.keys() & b.owned.keys()
    p = min(b.owned)
    # b has popped everything it knew of; its next full scan is far away.
    _pop_all(b)
    b.state.hints.next_full_scan = float("inf")
    assert _pop_all(b) == []
    a.enqueue(EnqueueOp(p, "fp", "for-b"))
    a.flusher.run_once()
    assert b.popper.pop() == 0  # not known yet: b does not scan
    b.sync.sync()  # reads its ready set
    assert _pop_all(b) == ["for-b"]
    assert redis_client.scard(b.link.frontier.keyspace.ready("b")) == 0  # emptied as read


def test_a_table_change_reaches_every_worker_at_its_next_sync(redis_client: redis.Redis) -> None:
    a = _worker(redis_client, "a")
    assert len(a.owned) == PARTITIONS
    version = a.link.registry.table_version()
    assert version == a.state.ownership.version >= 1
    b = _worker(redis_client, "b")
    assert a.link.registry.table_version() == version + 1
    owned_before = a.owned
    a.sync.sync()
    assert a.owned is not owned_before  # replaced whole: the scheduler notices a loss
    assert len(a.owned) == len(b.owned) == PARTITIONS // 2
    a.sync.sync()  # nothing changed: nothing reloaded
    assert a.state.ownership.version == version + 1


def test_a_partition_held_up_to_the_cap_is_not_popped(redis_client: redis.Redis) -> None:
    worker = _worker(redis_client, "a", pop_per_partition=3)
    assert worker.popper.held_cap == 3
    for i in range(10):
        worker.enqueue(EnqueueOp(5, f"fp{i}", f"p{i}"))
    worker.flusher.run_once()
    assert len(_pop_all(worker)) == 3
    assert _pop_all(worker) == []  # 3 held (buffered or in flight): the cap
    assert worker.link.frontier.queued(5) == 7  # left queued, where an idle node may take them
    worker.ack(LeaseToken(5, min(worker.state.leases.held[5]), 1))
    worker.flusher.run_once()
    assert len(_pop_all(worker)) == 1  # room for one more


def test_the_longest_backlog_is_leased_first_by_the_census_of_the_last_pops(
    redis_client: redis.Redis,
) -> None:
    worker = _worker(redis_client, "a", pop_per_partition=2)
    for p, n in ((3, 2), (7, 10), (9, 6)):
        for i in range(n):
            worker.enqueue(EnqueueOp(p, f"fp{p}-{i}", f"p{p}-{i}"))
    worker.flusher.run_once()
    worker.request(100)
    assert worker.popper.pop() == 6  # two of each: the census is unknown yet
    assert dict(worker.queued) == {7: 8, 9: 4}  # what Redis still queues, nonzero only
    for leased in list(worker.inbound):
        worker.ack(leased.token)
    worker.inbound.clear()
    worker.flusher.run_once()
    worker.state.hints.next_full_scan = float("inf")
    assert sorted(_pop_all(worker, want=2)) == ["p7-2", "p7-3"]  # the long pole's
    assert dict(worker.queued) == {7: 6, 9: 4}


def test_confirmed_fingerprints_are_remembered_up_to_the_cache_size(
    redis_client: redis.Redis,
) -> None:
    worker = _worker(redis_client, "a", seen_cache=3)
    worker.enqueue(EnqueueOp(1, "fp1", "x"))
    worker.enqueue(EnqueueOp(2, "fp2", "x", dont_filter=True))  # never recorded as seen
    worker.flusher.run_once()
    assert worker.seen == {"fp1"}
    worker.enqueue(EnqueueOp(1, "fp1", "again"))  # a duplicate Redis refuses: known too
    worker.enqueue(EnqueueOp(3, "fp3", "x"))
    worker.flusher.run_once()
    assert worker.seen == {"fp1", "fp3"}
    worker.enqueue(EnqueueOp(4, "fp4", "x"))
    worker.enqueue(EnqueueOp(4, "fp5", "x"))
    worker.flusher.run_once()
    assert worker.seen == {"fp4", "fp5"}  # full: started over
    off = _worker(redis_client, "b", seen_cache=0)
    off.enqueue(EnqueueOp(1, "fp9", "x"))
    off.flusher.run_once()
    assert off.seen == set()


def test_an_idle_worker_knows_when_the_whole_crawl_is_drained(redis_client: redis.Redis) -> None:
    a = _worker(redis_client, "a")
    b = _worker(redis_client, "b")
    a.sync.sync()
    a.local_idle = b.local_idle = True
    a.drain.check(0.0)
    assert a.drained_since == 0.0  # nothing queued, nothing leased
    p = min(b.owned)
    b.enqueue(EnqueueOp(p, "fp", "x"))
    assert b.drained_since is None
    b.flusher.run_once()
    a.drain.check(1.0)
    assert a.drained_since is None  # b's partition holds work
    b.sync.sync()
    (leased,) = b.link.frontier.pop_many(b.owned, "b").leased
    a.drain.check(2.0)
    assert a.drained_since is None  # leased: not done until acked
    b.ack(leased.token)
    b.flusher.run_once()
    a.drain.check(3.0)
    assert a.drained_since == 3.0
    a.enqueue(EnqueueOp(p, "fp2", "y"))  # this worker's own unsent op
    a.drain.check(4.0)
    assert a.drained_since is None


@pytest.mark.parametrize("saturated", [True, False])
def test_a_hungry_worker_steals_waiting_partitions_from_a_saturated_one(
    redis_client: redis.Redis, saturated: bool
) -> None:
    slots = 2
    a = _worker(redis_client, "a", slots=slots, pop_per_partition=1)
    b = _worker(redis_client, "b", slots=slots)
    a.sync.sync()
    mine = sorted(a.owned)
    # a works on two hosts (a lease each) or on one; four more partitions wait.
    working = mine[:slots] if saturated else mine[:1]
    waiting = mine[slots : slots + 4]
    for p in working:
        a.enqueue(EnqueueOp(p, f"w{p}", "busy", priority=1))
        a.enqueue(EnqueueOp(p, f"w{p}-2", "busy"))
    for i, p in enumerate(waiting):
        for j in range(i + 1):
            a.enqueue(EnqueueOp(p, f"q{p}-{j}", "waiting"))
    a.flusher.run_once()
    a.state.hints.next_full_scan = float("inf")
    a.state.hints.nonempty = set(working)
    assert len(_pop_all(a, want=len(working))) == len(working)
    b.hungry = True
    b.drain.check(0.0)
    stats = b.take_counters()
    if not saturated:
        # a can start its waiting hosts itself: nothing to take.
        assert stats.get("banker/redis/steals", 0) == 0
        return
    assert stats["banker/redis/steals"] == 1
    assert stats["banker/redis/partitions_stolen"] == 2  # half of a's four, rounded up
    stolen = set(b.owned) - {p for p in b.owned if p not in waiting}
    assert stolen == set(waiting[2:])  # the most queued first
    # No lease was out: b pops them at once, no BUSY wait.
    assert sorted(_pop_all(b)) == ["waiting"] * (3 + 4)
    assert b.take_counters().get("banker/redis/handover_waits", 0) == 0
    # a learns at its next sync, and its pops of the stolen partitions stop.
    a.sync.sync()
    assert not set(waiting[2:]) & set(a.owned)
    b.drain.check(0.1)  # backing off: no second attempt at once
    assert "banker/redis/steals" not in b.take_counters()


def test_a_worker_holding_leases_counts_no_partition_unless_it_may_steal(
    redis_client: redis.Redis,
) -> None:
    worker = _worker(redis_client, "a", steal=False)
    worker.enqueue(EnqueueOp(3, "fp", "p"))
    worker.flusher.run_once()
    assert _pop_all(worker) == ["p"]
    worker.hungry = True
    worker.drain.check(0.0)  # its own lease is work in Redis: not drained, no census
    assert "banker/redis/drain_checks" not in worker.take_counters()
    assert worker.drained_since is None
    (token,) = (LeaseToken(3, i, 1) for i in worker.state.leases.held[3])
    worker.ack(token)
    worker.flusher.run_once()
    worker.drain.check(1.0)
    assert worker.take_counters()["banker/redis/drain_checks"] == 1
    assert worker.drained_since == 1.0
    # A node that may steal counts, leases or not: it needs each partition's work.
    thief = _worker(redis_client, "b")
    thief.enqueue(EnqueueOp(min(thief.owned), "fp5", "p5"))
    thief.flusher.run_once()
    assert _pop_all(thief)
    thief.hungry = True
    thief.drain.check(2.0)
    assert thief.take_counters()["banker/redis/drain_checks"] == 1


def test_a_lease_is_held_only_while_its_pop_or_last_renewal_is_recent(
    redis_client: redis.Redis,
) -> None:
    """A "zombie": a worker stopped (SIGSTOP) past its lease TTL still owns its
    partitions in its own table when it wakes, but the reaper may have given
    its leases to another node.  It must not fetch them: its store asks
    :meth:`FrontierWorker.holds` before dispatching."""
    now = [1000.0]
    worker = _worker(redis_client, "a", clock=lambda: now[0])  # lease TTL 60 s
    for i in range(3):
        worker.enqueue(EnqueueOp(2, f"fp{i}", f"p{i}"))
    worker.flusher.run_once()
    worker.request(10)
    worker.popper.pop()
    tokens = [leased.token for leased in worker.inbound]
    assert len(tokens) == 3 and all(t.leased_at == 1000.0 for t in tokens)
    assert all(worker.holds(t, 1000.0 + 47) for t in tokens)  # within 0.8 of the TTL
    assert not any(worker.holds(t, 1000.0 + 48.5) for t in tokens)
    # A heartbeat renews every held lease: they are good again from then on.
    now[0] = 1040.0
    worker.membership.beat()
    assert worker.state.leases.renewed_at == 1040.0
    assert all(worker.holds(t, 1040.0 + 47) for t in tokens)
    # Stopped for 70 s (longer than the TTL): nothing is held any more, and
    # what the reaper does meanwhile is why.
    assert not any(worker.holds(t, 1040.0 + 70) for t in tokens)
    # Owned again under a newer epoch (declared dead, joined again): the old
    # epoch's leases were reaped and may be another node's; renewals do not
    # say whose, so they vouch for nothing.
    assert all(t.epoch == worker.owned[2] for t in tokens)
    ownership = worker.state.ownership
    ownership.owned = {**ownership.owned, 2: ownership.owned[2] + 1}
    assert not any(worker.holds(t, 1040.0 + 1) for t in tokens)
    ownership.drop([2])
    assert not any(worker.holds(t, 1040.0 + 1) for t in tokens)  # lost
    # The token's time is not part of its identity (acks, nacks, dict keys).
    assert tokens[0] == LeaseToken(tokens[0].partition, tokens[0].id, tokens[0].delivery)


def test_a_worker_retries_redis_at_least_once_a_heartbeat(redis_client: redis.Redis) -> None:
    # Backing off longer than a heartbeat after an outage got live workers
    # declared dead by the others (chaos soak): the cap follows the heartbeat.
    assert _worker(redis_client, "a", heartbeat_s=1.5).error_backoff_max_s == 1.5
    assert _worker(redis_client, "b", heartbeat_s=30.0).error_backoff_max_s == 10.0


def test_one_step_runs_each_job_when_it_is_due(redis_client: redis.Redis) -> None:
    """The loop's round: join, send, lease; then, with nothing to do, the drain check."""
    now = [100.0]
    worker = _worker(redis_client, "a", clock=lambda: now[0], heartbeat_s=2.0, reap_interval_s=5.0)
    worker.membership.next_at = 0.0  # the first step beats again
    worker.enqueue(EnqueueOp(3, "fp", "p"))
    worker.request(10)
    assert worker.step()  # beat, flush, reap, sync, pop
    (leased,) = worker.inbound
    assert leased.payload == "p" and len(worker.owned) == PARTITIONS
    counters = worker.take_counters()
    assert counters["banker/redis/enqueued"] == counters["banker/redis/popped"] == 1
    assert (worker.membership.next_at, worker.reaper.next_at) == (102.0, 105.0)
    assert worker.sync.next_at == pytest.approx(100.1)
    worker.inbound.clear()
    worker.ack(leased.token)
    worker.local_idle = True
    assert worker.step()  # the ack is sent; the crawl is not known to be over yet
    assert worker.drained_since is None
    assert not worker.step()  # nothing sent or leased: the census finds the crawl drained
    assert worker.drained_since == 100.0
    assert worker.take_counters()["banker/redis/drain_checks"] == 1
