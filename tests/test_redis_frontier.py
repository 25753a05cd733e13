"""The Redis frontier's Lua scripts against a real redis-server.

Leases of the ``frontier`` fixture last a minute: a test makes them run out
by moving their expiry into the past (:func:`_expire`), as the server's
clock would after the TTL.  Those of ``fast`` last 50 ms, and a test waits
for them to run out on the server's clock (:func:`_wait_for_expiry`); no
test depends on finishing its steps within a lease.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis

from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.leases import NotOwner, PopResult
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker, WorkerOptions

pytestmark = pytest.mark.slow  # a real redis-server


@pytest.fixture
def frontier(redis_client: redis.Redis) -> RedisFrontier:
    f = RedisFrontier(redis_client, prefix="t", partitions=8, lease_ttl_ms=60_000, max_deliveries=2)
    f.set_owner(3, "node-a", 1)
    return f


def _expire(frontier: RedisFrontier, *partitions: int) -> None:
    """Every lease of ``partitions`` runs out now, as if the server's clock passed its TTL."""
    client = frontier.client
    for p in partitions:
        leases = frontier.keys(p).leases
        ids = client.zrange(leases, 0, -1)
        if ids:
            client.zadd(leases, dict.fromkeys(ids, 0), xx=True)


def _wait_for_expiry(frontier: RedisFrontier, partition: int, timeout: float = 30.0) -> None:
    """Wait until every lease of ``partition`` has expired on the server's clock."""
    client, leases = frontier.client, frontier.keys(partition).leases
    deadline = time.monotonic() + timeout
    while True:
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        if not client.zcount(leases, f"({now_ms}", "+inf"):
            return
        assert time.monotonic() < deadline, "the leases never expired"
        time.sleep(0.01)


def test_dedup_and_enqueue_are_one_step(frontier: RedisFrontier) -> None:
    first = frontier.enqueue(3, "fp1", '{"url": "http://a/"}')
    # The id is the partition's sequence number: the fingerprint is not paid twice.
    assert first == "1"
    assert frontier.enqueue(3, "fp1", '{"url": "http://a/"}') is None  # seen: not queued twice
    assert frontier.queued(3) == 1
    again = frontier.enqueue(3, "fp1", '{"url": "http://a/"}', dont_filter=True)
    assert again is not None and again != first
    assert frontier.queued(3) == 2


def test_priority_then_fifo(frontier: RedisFrontier) -> None:
    for i, prio in enumerate([0, 5, 0, 5, -3]):
        frontier.enqueue(3, f"fp{i}", f"p{i}", priority=prio)
    got = frontier.pop(3, "node-a", 1, count=10)
    assert [x.payload for x in got] == ["p1", "p3", "p0", "p2", "p4"]
    assert all(x.deliveries == 1 for x in got)
    assert frontier.queued(3) == 0 and frontier.leased(3) == 5


def test_only_the_owner_at_its_epoch_can_pop(frontier: RedisFrontier) -> None:
    frontier.enqueue(3, "fp", "p")
    with pytest.raises(NotOwner, match="not owned by node-b@1"):
        frontier.pop(3, "node-b", 1)
    frontier.set_owner(3, "node-a", 2)  # the table moved on: epoch 1 is fenced off
    with pytest.raises(NotOwner, match="node-a@1"):
        frontier.pop(3, "node-a", 1)
    assert frontier.queued(3) == 1  # nothing was popped by the fenced callers
    assert [x.payload for x in frontier.pop(3, "node-a", 2)] == ["p"]


def test_unacked_lease_is_redelivered_then_dead_lettered(frontier: RedisFrontier) -> None:
    frontier.enqueue(3, "fp", '{"url": "http://a/x"}', priority=7)
    (first,) = frontier.pop(3, "node-a", 1)
    assert frontier.start_many({3: [first.token.ref]}) == 1  # its fetch began
    assert frontier.start_many({3: [first.token.ref]}) == 0  # once per delivery
    assert frontier.reap(3) == (0, 0)  # lease still valid
    _expire(frontier, 3)
    assert frontier.reap(3) == (1, 0)  # worker died: back to the queue
    (second,) = frontier.pop(3, "node-a", 1)
    assert second.id == first.id and second.deliveries == 2
    assert frontier.start_many({3: [first.token.ref]}) == 0  # a stale delivery marks nothing
    assert frontier.start_many({3: [second.token.ref]}) == 1
    _expire(frontier, 3)
    assert frontier.reap(3) == (0, 1)  # max_deliveries reached
    (dead,) = frontier.dead_letters(3)
    assert dead["id"] == first.id and dead["deliveries"] == 2
    assert dead["payload"] == '{"url": "http://a/x"}'
    assert "2 deliveries" in dead["reason"]
    assert frontier.queued(3) == 0 and frontier.leased(3) == 0


def test_ack_is_idempotent_and_renew_keeps_the_lease(frontier: RedisFrontier) -> None:
    frontier.enqueue(3, "a", "pa")
    frontier.enqueue(3, "b", "pb")
    a, b = frontier.pop(3, "node-a", 1, count=2)
    _expire(frontier, 3)  # both run out ...
    assert frontier.renew(3, [a.id]) == 1  # ... and a is renewed before the reaper comes
    assert frontier.reap(3) == (1, 0)  # b goes back to the queue, a is kept
    assert frontier.ack(3, [a.id]) == 1
    assert frontier.ack(3, [a.id]) == 0
    assert frontier.renew(3, [a.id]) == 0  # an acked request is never resurrected
    assert [x.id for x in frontier.pop(3, "node-a", 1)] == [b.id]


def test_malformed_payload_can_be_dead_lettered_with_a_reason(frontier: RedisFrontier) -> None:
    frontier.enqueue(3, "evil", "\x80\x04pickle-bytes")
    (leased,) = frontier.pop(3, "node-a", 1)
    frontier.dead_letter(3, leased.id, "malformed payload: not JSON")
    (dead,) = frontier.dead_letters(3)
    assert dead["reason"] == "malformed payload: not JSON"
    assert frontier.leased(3) == 0


def test_pipelined_batch_enqueue(frontier: RedisFrontier) -> None:
    items = [EnqueueOp(p % 8, f"fp{p}", f"x{p}") for p in range(40)]
    ids = frontier.enqueue_many([*items, EnqueueOp(0, "fp0", "dup")])
    assert sum(i is not None for i in ids) == 40 and ids[-1] is None
    assert sum(frontier.queued(p) for p in range(8)) == 40


def test_reaper_is_single_flight(frontier: RedisFrontier, redis_client: redis.Redis) -> None:
    lock = frontier.keyspace.reaper_lock
    redis_client.set(lock, "node-b", px=5000)
    assert frontier.reap_all("node-a") is None
    redis_client.delete(lock)
    assert frontier.reap_all("node-a") == (0, 0)
    assert redis_client.get(lock) is None


def test_keys_of_a_partition_share_one_cluster_slot(frontier: RedisFrontier) -> None:
    from redis.crc import key_slot

    keys = frontier.keys(5)
    slots = {key_slot(k.encode()) for k in vars(keys).values()}
    assert len(slots) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partitions": 0}, "partitions must be an integer >= 1"),
        ({"lease_ttl_ms": 0}, "lease_ttl_ms"),
        ({"max_deliveries": True}, "max_deliveries"),
        ({"prefix": "a{b"}, "braces"),
    ],
)
def test_bad_arguments(redis_client: redis.Redis, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RedisFrontier(redis_client, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"partition must be in \[0, 8\)"):
        RedisFrontier(redis_client, partitions=8).keys(8)


def test_a_malicious_pickle_in_the_queue_is_never_executed(
    frontier: RedisFrontier, redis_client: redis.Redis, tmp_path: object
) -> None:
    """scrapy-redis unpickles what it pops (RCE); our codec refuses and dead-letters it."""
    import os
    import pickle
    from pathlib import Path

    from scrapy import Spider

    from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec

    marker = Path(str(tmp_path)) / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.system, (f"touch {marker}",))

    # Written by an attacker straight into the partition's payload hash.
    evil_id = frontier.enqueue(3, "evil", "placeholder")
    assert evil_id is not None
    redis_client.hset(frontier.keys(3).payloads, evil_id, pickle.dumps(Exploit()))
    (leased,) = frontier.pop(3, "node-a", 1)  # does not crash on non-UTF-8 bytes
    with pytest.raises(MalformedPayload):
        RequestCodec().decode(leased.payload, Spider("s"))
    frontier.dead_letter(3, leased.id, "malformed payload")
    assert not marker.exists()
    (dead,) = frontier.dead_letters(3)
    assert dead["reason"] == "malformed payload" and frontier.leased(3) == 0


# -- batched pops, hand-over fencing, nack, late acks, totals, clear ---------------------------


@pytest.fixture
def fast(redis_client: redis.Redis) -> RedisFrontier:
    """A frontier whose leases expire after 50 ms, for reaper tests that must stay fast."""
    f = RedisFrontier(redis_client, prefix="f", partitions=8, lease_ttl_ms=50, max_deliveries=3)
    f.set_owner(3, "node-a", 1)
    return f


def _meta_int(client: redis.Redis, frontier: RedisFrontier, partition: int, field: str) -> int:
    raw = client.hget(frontier.keys(partition).meta, field)
    return 0 if raw is None else int(raw)


def test_pop_many_sorts_partitions_by_outcome_in_one_round_trip(frontier: RedisFrontier) -> None:
    for p in (0, 1, 2):
        frontier.set_owner(p, "node-a", 1)
    frontier.set_owner(4, "node-b", 1)
    frontier.enqueue(0, "a0", "p0a")
    frontier.enqueue(0, "b0", "p0b", priority=1)
    frontier.enqueue(0, "c0", "p0c")
    frontier.enqueue(1, "a1", "p1")
    frontier.enqueue(3, "a3", "p3")
    frontier.enqueue(4, "a4", "p4")
    frontier.enqueue(5, "a5", "p5")
    # 2: owned but empty; 3: owned at epoch 1, asked at epoch 2; 4: another node's; 5: no owner.
    result = frontier.pop_many(
        {0: 1, 1: 1, 2: 1, 3: 2, 4: 1, 5: 1}, "node-a", count_per_partition=2
    )
    assert [(x.partition, x.payload, x.deliveries) for x in result.leased] == [
        (0, "p0b", 1),
        (0, "p0a", 1),
        (1, "p1", 1),
    ]
    assert result.not_owned == [3, 4, 5]
    assert result.busy == []
    assert result.empty == [2]
    assert (frontier.queued(0), frontier.leased(0)) == (1, 2)
    assert (frontier.queued(1), frontier.leased(1)) == (0, 1)
    for fenced in (3, 4, 5):  # nothing was popped from the partitions this node may not touch
        assert (frontier.queued(fenced), frontier.leased(fenced)) == (1, 0)
    assert frontier.pop_many({}, "node-a") == PopResult([], [], [], [])


@pytest.mark.parametrize("release", ["ack", "nack", "reap"])
def test_hand_over_waits_until_the_previous_owners_leases_are_released(
    fast: RedisFrontier, redis_client: redis.Redis, release: str
) -> None:
    ids = [fast.enqueue(3, f"fp{i}", f"p{i}") for i in range(3)]
    first, second = fast.pop(3, "node-a", 1, count=2)
    assert _meta_int(redis_client, fast, 3, "h:1") == 2
    assert _meta_int(redis_client, fast, 3, f"e:{first.id}") == 1

    fast.set_owner(3, "node-b", 2)  # hand-over while node-a still holds two leases
    with pytest.raises(NotOwner):
        fast.pop(3, "node-a", 1)
    assert fast.pop(3, "node-b", 2) == []
    busy = fast.pop_many({3: 2}, "node-b")
    assert (busy.leased, busy.not_owned, busy.busy, busy.empty) == ([], [], [3], [])
    assert (fast.queued(3), fast.leased(3)) == (1, 2)  # the BUSY pops moved nothing

    if release == "reap":
        _wait_for_expiry(fast, 3)
        assert fast.pop(3, "node-b", 2) == []  # expired but not yet reaped: still fenced
        assert fast.reap(3) == (2, 0)
    else:
        # Releasing one of two leases is not enough.
        done = fast.ack if release == "ack" else fast.nack
        assert done(3, [first.id]) == 1
        assert fast.pop_many({3: 2}, "node-b").busy == [3]
        assert done(3, [second.id]) == 1
    assert _meta_int(redis_client, fast, 3, "h:1") == 0
    assert redis_client.hget(fast.keys(3).meta, f"e:{first.id}") is None

    got = fast.pop(3, "node-b", 2, count=5)
    expected = {
        "ack": [(ids[2], "p2", 1)],
        "nack": [(ids[0], "p0", 1), (ids[1], "p1", 1), (ids[2], "p2", 1)],
        "reap": [(ids[0], "p0", 2), (ids[1], "p1", 2), (ids[2], "p2", 1)],
    }[release]
    assert [(x.id, x.payload, x.deliveries) for x in got] == expected
    # The new owner's own leases never fence it: the partition is just empty now.
    again = fast.pop_many({3: 2}, "node-b")
    assert (again.busy, again.empty) == ([], [3])
    assert _meta_int(redis_client, fast, 3, "h:2") == len(expected)
    assert fast.ack(3, [x.id for x in got]) == len(expected)
    assert fast.outstanding() == 0


def test_hand_over_of_an_idle_partition_is_not_busy(frontier: RedisFrontier) -> None:
    frontier.enqueue(3, "a", "pa")
    frontier.enqueue(3, "b", "pb")
    (a,) = frontier.pop(3, "node-a", 1)
    assert frontier.ack(3, [a.id]) == 1
    frontier.set_owner(3, "node-b", 2)
    assert [x.payload for x in frontier.pop(3, "node-b", 2)] == ["pb"]


def test_nack_puts_requests_back_in_place_and_undoes_the_delivery(
    frontier: RedisFrontier,
) -> None:
    ids = [frontier.enqueue(3, f"fp{i}", f"p{i}", priority=pr) for i, pr in enumerate([0, 5, 0])]
    a, b = frontier.pop(3, "node-a", 1, count=2)
    assert (a.id, b.id) == (ids[1], ids[0])
    assert frontier.nack(3, [a.id, b.id]) == 2
    assert frontier.nack(3, [a.id, b.id]) == 0  # idempotent: no longer leased
    assert (frontier.queued(3), frontier.leased(3)) == (3, 0)
    again = frontier.pop(3, "node-a", 1, count=3)
    assert [(x.id, x.payload, x.deliveries) for x in again] == [
        (ids[1], "p1", 1),
        (ids[0], "p0", 1),
        (ids[2], "p2", 1),
    ]
    assert frontier.nack(3, []) == 0


def test_nacks_never_push_a_request_towards_the_dead_letters(frontier: RedisFrontier) -> None:
    rid = frontier.enqueue(3, "fp", "p")
    for _ in range(2 * frontier.max_deliveries):
        (leased,) = frontier.pop(3, "node-a", 1)
        assert (leased.id, leased.deliveries) == (rid, 1)
        assert frontier.nack(3, [leased.id]) == 1
    assert frontier.dead_letters(3) == []
    assert frontier.queued(3) == 1


def test_nack_after_a_redelivery_keeps_the_earlier_deliveries(fast: RedisFrontier) -> None:
    rid = fast.enqueue(3, "fp", "p")
    assert [x.deliveries for x in fast.pop(3, "node-a", 1)] == [1]
    _wait_for_expiry(fast, 3)
    assert fast.reap(3) == (1, 0)
    (second,) = fast.pop(3, "node-a", 1)
    assert (second.id, second.deliveries) == (rid, 2)
    assert fast.nack(3, [second.id]) == 1
    (third,) = fast.pop(3, "node-a", 1)
    assert (third.id, third.payload, third.deliveries) == (rid, "p", 2)


def test_nack_of_an_acked_request_does_not_resurrect_it(frontier: RedisFrontier) -> None:
    frontier.enqueue(3, "fp", "p")
    (leased,) = frontier.pop(3, "node-a", 1)
    assert frontier.ack(3, [leased.id]) == 1
    assert frontier.nack(3, [leased.id]) == 0
    assert frontier.outstanding() == 0
    assert frontier.pop(3, "node-a", 1) == []


def test_nack_many_across_partitions(frontier: RedisFrontier) -> None:
    frontier.set_owner(0, "node-a", 1)
    for p in (0, 3):
        frontier.enqueue(p, f"x{p}", f"X{p}")
        frontier.enqueue(p, f"y{p}", f"Y{p}")
    popped = frontier.pop_many({0: 1, 3: 1}, "node-a", count_per_partition=2).leased
    by: dict[int, list[str]] = {0: [], 3: []}
    for x in popped:
        by[x.partition].append(x.id)
    assert frontier.nack_many({0: by[0][:1], 3: [*by[3], "no-such-id"], 5: []}) == 3
    assert frontier.nack_many({0: by[0], 3: by[3]}) == 1  # only 0's second one was still leased
    assert frontier.nack_many({}) == 0
    assert [(frontier.queued(p), frontier.leased(p)) for p in (0, 3)] == [(2, 0), (2, 0)]


def test_a_late_ack_after_the_reaper_requeued_the_request_keeps_its_payload(
    fast: RedisFrontier,
) -> None:
    payload = '{"url": "http://a/slow"}'
    rid = fast.enqueue(3, "fp", payload)
    (first,) = fast.pop(3, "node-a", 1)
    _wait_for_expiry(fast, 3)
    assert fast.reap(3) == (1, 0)  # the holder is too slow: back to the queue
    assert fast.ack(3, [first.id]) == 0  # its late ack changes nothing
    assert fast.renew(3, [first.id]) == 0  # nor does a late heartbeat
    assert (fast.queued(3), fast.leased(3)) == (1, 0)
    (second,) = fast.pop(3, "node-a", 1)
    assert (second.id, second.payload, second.deliveries) == (rid, payload, 2)
    assert fast.ack(3, [second.id]) == 1
    assert fast.outstanding() == 0


def test_ack_many_and_renew_many_return_totals(frontier: RedisFrontier) -> None:
    frontier.set_owner(0, "node-a", 1)
    for i in range(2):
        frontier.enqueue(0, f"a{i}", "x")
    for i in range(3):
        frontier.enqueue(3, f"b{i}", "x")
    popped = frontier.pop_many({0: 1, 3: 1}, "node-a", count_per_partition=5).leased
    by: dict[int, list[str]] = {0: [], 3: []}
    for x in popped:
        by[x.partition].append(x.id)
    assert (len(by[0]), len(by[3])) == (2, 3)
    _expire(frontier, 0, 3)  # every lease runs out ...
    assert frontier.renew_many({0: by[0], 3: [*by[3], "no-such-id"], 5: []}) == 5
    assert frontier.reap(0) == (0, 0) and frontier.reap(3) == (0, 0)  # ... all were renewed
    assert frontier.ack_many({0: by[0], 3: by[3][:1]}) == 3
    assert frontier.ack_many({0: by[0], 3: by[3]}) == 2  # only the two still leased
    assert frontier.renew_many({0: by[0], 3: by[3]}) == 0
    assert frontier.ack_many({}) == 0 and frontier.renew_many({}) == 0
    assert frontier.outstanding() == 0


def test_outstanding_counts_queued_and_leased_requests_of_every_partition(
    frontier: RedisFrontier,
) -> None:
    assert frontier.outstanding() == 0
    for p, n in ((0, 2), (3, 3), (7, 1)):
        for i in range(n):
            frontier.enqueue(p, f"fp{p}-{i}", "x")
    assert frontier.outstanding() == 6
    a, b = frontier.pop(3, "node-a", 1, count=2)
    assert frontier.outstanding() == 6  # leased requests are not done yet
    assert frontier.ack(3, [a.id]) == 1
    assert frontier.outstanding() == 5
    frontier.dead_letter(3, b.id, "malformed")
    assert frontier.outstanding() == 4  # dead letters are not outstanding


@pytest.mark.parametrize("chunk", [1, 3, 8, 100])
def test_outstanding_in_chunks_counts_everything_or_answers_yes_no(
    frontier: RedisFrontier, chunk: int
) -> None:
    assert frontier.outstanding(chunk=chunk) == 0
    assert frontier.outstanding(any_=True, chunk=chunk) == 0
    frontier.enqueue(7, "last", "x")  # only the last partition (in the last chunk) holds work
    assert frontier.outstanding(any_=True, chunk=chunk) == 1
    for p in (0, 1, 2, 5):
        frontier.enqueue(p, f"fp{p}", "x")
    assert frontier.outstanding(chunk=chunk) == 5
    assert 1 <= frontier.outstanding(any_=True, chunk=chunk) <= 5


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_backlog_counts_queued_and_leased_requests_per_asked_partition(
    frontier: RedisFrontier, chunk: int
) -> None:
    for p, n in ((0, 2), (3, 3), (7, 1)):
        frontier.set_owner(p, "node-a", 1)
        for i in range(n):
            frontier.enqueue(p, f"fp{p}-{i}", "x")
    frontier.pop(3, "node-a", 1, count=2)  # leased: still work the partition carries
    assert frontier.backlog([0, 3, 5, 7], chunk=chunk) == {0: 2, 3: 3, 5: 0, 7: 1}
    # Out-of-range and repeated partitions are ignored, not asked for.
    assert frontier.backlog([3, 3, -1, 8, 99], chunk=chunk) == {3: 3}
    assert frontier.backlog([], chunk=chunk) == {}


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_reap_all_in_chunks_reaps_every_partition(frontier: RedisFrontier, chunk: int) -> None:
    for p in range(8):
        frontier.set_owner(p, "node-a", 1)
        frontier.enqueue(p, f"fp{p}", "x")
        frontier.pop(p, "node-a", 1)
    assert frontier.reap_all("node-a", chunk=chunk) == (0, 0)  # leases still valid
    _expire(frontier, *range(8))
    assert frontier.reap_all("node-a", chunk=chunk) == (8, 0)
    for p in range(8):
        (leased,) = frontier.pop(p, "node-a", 1)
        frontier.start_many({p: [leased.token.ref]})
    _expire(frontier, *range(8))
    # The second delivery's fetch began; the first never did (nothing marked):
    # only one counted so far, below max_deliveries=2.
    assert frontier.reap_all("node-a", chunk=chunk) == (8, 0)
    for p in range(8):
        (leased,) = frontier.pop(p, "node-a", 1)
        frontier.start_many({p: [leased.token.ref]})
    _expire(frontier, *range(8))
    assert frontier.reap_all("node-a", chunk=chunk) == (0, 8)  # two fetches began: dead
    assert sum(len(frontier.dead_letters(p)) for p in range(8)) == 8
    assert frontier.outstanding() == 0


def test_clear_deletes_every_key_of_the_crawl_and_only_those(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    registry = NodeRegistry(redis_client, frontier)
    registry.register("node-a")
    registry.rebalance("node-a")
    owned = registry.owned("node-a")
    for p in (0, 3, 7):
        frontier.enqueue(p, "seen-fp", f"P{p}")
        frontier.enqueue(p, f"other-{p}", "x")
    leased = frontier.pop_many(owned, "node-a", count_per_partition=2).leased
    frontier.ack(leased[0].partition, [leased[0].id])
    frontier.nack(leased[1].partition, [leased[1].id])
    frontier.dead_letter(leased[2].partition, leased[2].id, "malformed")
    keys = frontier.keyspace
    redis_client.set(keys.reaper_lock, "node-a", px=5000)
    # Placement state of this crawl goes; its network measurements stay.
    for key in (keys.sites, keys.schemes, keys.net_placed, keys.net_backlog):
        redis_client.hset(key, "k", "1")
    redis_client.set(keys.plan_gate, "node-a", px=5000)
    measured = (keys.rtt("node-a"), keys.bw("node-a"), keys.net_bs)
    for key in measured:
        redis_client.hset(key, "k", "1")
    # Keys of another crawl and unrelated keys survive.
    neighbour = RedisFrontier(redis_client, prefix="t2", partitions=8)
    assert neighbour.enqueue(3, "seen-fp", "n") is not None
    redis_client.set("unrelated", "1")
    survivors = {b"unrelated", *(key.encode() for key in measured)}
    survivors |= {k.encode() for k in vars(neighbour.keys(3)).values() if redis_client.exists(k)}
    survivors.add(neighbour.keys(3).level(0).encode())  # its queued request's list
    before = set(redis_client.keys("*"))
    assert survivors < before

    assert frontier.clear() == len(before - survivors)
    assert set(redis_client.keys("*")) == survivors
    assert frontier.outstanding() == 0
    assert frontier.dead_letters(3) == [] and frontier.owner(3) is None
    assert frontier.enqueue(3, "seen-fp", "fresh") is not None  # the seen set is gone too
    assert neighbour.enqueue(3, "seen-fp", "n") is None


def test_dead_letter_of_a_request_no_longer_leased_does_nothing(fast: RedisFrontier) -> None:
    acked_id = fast.enqueue(3, "acked", "pa")
    (acked,) = fast.pop(3, "node-a", 1)
    assert acked.id == acked_id and fast.ack(3, [acked.id]) == 1
    fast.dead_letter(3, acked.id, "too late")

    rid = fast.enqueue(3, "requeued", "pr")
    (first,) = fast.pop(3, "node-a", 1)
    _wait_for_expiry(fast, 3)
    assert fast.reap(3) == (1, 0)
    fast.dead_letter(3, first.id, "too late")  # back in the queue: not leased any more
    fast.dead_letter(3, "no-such-id", "never existed")

    assert fast.dead_letters(3) == []
    assert (fast.queued(3), fast.leased(3)) == (1, 0)
    (again,) = fast.pop(3, "node-a", 1)
    assert (again.id, again.payload, again.deliveries) == (rid, "pr", 2)


def test_delivery_tokens_make_a_stale_holders_ack_and_nack_no_ops(fast: RedisFrontier) -> None:
    rid = fast.enqueue(3, "fp", '{"url": "http://a/x"}')
    (first,) = fast.pop(3, "node-a", 1)
    _wait_for_expiry(fast, 3)
    assert fast.reap(3) == (1, 0)
    fast.set_owner(3, "node-b", 2)
    (second,) = fast.pop(3, "node-b", 2)  # the request now belongs to node-b
    assert second.deliveries == 2
    stale = f"{first.id}#{first.deliveries}"
    assert fast.nack(3, [stale]) == 0  # node-a's late nack leaves node-b's lease alone
    assert fast.ack(3, [stale]) == 0  # and so does its late ack
    assert (fast.queued(3), fast.leased(3)) == (0, 1)
    assert fast.ack(3, [f"{rid}#{second.deliveries}"]) == 1
    assert fast.outstanding() == 0


# -- typed values between the reactor and the worker thread ------------------------------


def test_a_leased_request_carries_its_delivery_token(fast: RedisFrontier) -> None:
    rid = fast.enqueue(3, "fp", "p")
    assert rid is not None
    (first,) = fast.pop(3, "node-a", 1)
    assert first.token == LeaseToken(3, rid, 1)
    assert first.token.ref == f"{rid}#1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.token.delivery = 2  # type: ignore[misc]
    assert not hasattr(first.token, "__dict__") and not hasattr(EnqueueOp(3, "f", "p"), "__dict__")
    _wait_for_expiry(fast, 3)
    assert fast.reap(3) == (1, 0)
    (second,) = fast.pop(3, "node-a", 1)
    assert second.token == LeaseToken(3, rid, 2) != first.token
    assert fast.ack(3, [first.token.ref]) == 0  # the stale holder's token
    assert fast.ack(3, [second.token.ref]) == 1


def test_the_worker_sends_typed_ops_and_forgets_every_token_handed_back(
    fast: RedisFrontier, redis_client: redis.Redis
) -> None:
    registry = NodeRegistry(redis_client, fast)
    worker = FrontierWorker(fast, registry, "node-a", WorkerOptions(pop_per_partition=10))
    worker.membership.beat()  # joins: owns every partition
    assert set(worker.owned) == set(range(8))
    worker.enqueue(EnqueueOp(3, "a", "pa"))
    worker.enqueue(EnqueueOp(3, "a", "dup"))  # seen: dropped
    worker.enqueue(EnqueueOp(3, "a", "forced", dont_filter=True))
    worker.enqueue(EnqueueOp(5, "b", "pb", priority=2))
    worker.enqueue(EnqueueOp(5, "c", "pc"))
    assert worker.pending_ops() == 5
    assert worker.flusher.run_once() and worker.pending_ops() == 0
    assert (fast.queued(3), fast.queued(5)) == (2, 2)
    worker.request(10)
    assert worker.popper.pop() == 4
    leased = {x.payload: x for x in worker.inbound}
    assert set(leased) == {"pa", "forced", "pb", "pc"}
    assert worker.state.leases.held == {
        3: {leased["pa"].id, leased["forced"].id},
        5: {leased["pb"].id, leased["pc"].id},
    }

    worker.ack(leased["pa"].token)
    worker.ack(LeaseToken(5, leased["pb"].id, 7))  # a stale delivery: a no-op in Redis
    worker.nack(leased["forced"].token)
    worker.dead_letter(leased["pc"].token, "malformed: test")
    assert worker.pending_ops() == 4
    worker.flusher.run_once()
    assert worker.take_counters() == {
        "banker/redis/partitions_moved": 8,
        "banker/redis/enqueued": 4,
        "banker/redis/duplicates": 1,
        "banker/redis/popped": 4,
        "banker/redis/acked": 1,
        "banker/redis/nacked": 1,
        "banker/redis/dead_lettered": 1,
    }
    assert (fast.queued(3), fast.leased(3)) == (1, 0)  # the nacked one is back
    assert (fast.queued(5), fast.leased(5)) == (0, 1)  # pb is still leased
    assert [d["reason"] for d in fast.dead_letters(5)] == ["malformed: test"]
    # Every token handed back is forgotten, whatever Redis said.
    assert worker.state.leases.held == {}


def test_a_held_reaper_lock_makes_one_round_per_interval_fleet_wide(
    frontier: RedisFrontier,
) -> None:
    assert frontier.reap_all("node-a", hold_ms=60_000) == (0, 0)
    # Other nodes (and node-a itself) skip until the hold expires...
    assert frontier.reap_all("node-b", hold_ms=60_000) is None
    assert frontier.reap_all("node-a") is None
    ttl = frontier.client.pttl(frontier.keyspace.reaper_lock)
    assert 0 < ttl <= 60_000
    # ...and a plain round releases its lock at once, as before.
    frontier.client.delete(frontier.keyspace.reaper_lock)
    assert frontier.reap_all("node-b") == (0, 0)
    assert frontier.client.exists(frontier.keyspace.reaper_lock) == 0


def test_a_queued_request_is_one_list_entry_and_nothing_else(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    for i in range(50):
        frontier.enqueue(2, f"{i:040x}", f"p{i}", priority=i % 2)
    k = frontier.keys(2)
    assert redis_client.type(k.level(0)) == b"list"
    assert redis_client.llen(k.level(0)) == redis_client.llen(k.level(1)) == 25
    assert redis_client.zrange(k.levels, 0, -1, withscores=True) == [(b"1", -1.0), (b"0", 0.0)]
    assert not redis_client.exists(k.payloads)
    assert set(redis_client.hkeys(k.meta)) == {b"seq", b"n"}  # no per-request meta
    assert redis_client.lindex(k.level(1), 0) == b"2 p1"  # "<id> <payload>"


def test_a_drained_partition_keeps_only_a_few_packed_counters(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    """Hundreds of leases at once turn the meta hash into a hash table; once
    the partition drains the ack writes it afresh, packed (the crawl keeps
    it for good, so it counts in the bytes each seen URL costs)."""
    for i in range(300):
        frontier.enqueue(3, f"{i:040x}", "p")
    leased = frontier.pop(3, "node-a", 1, count=300)
    k = frontier.keys(3)
    assert redis_client.object("encoding", k.meta) == b"hashtable"
    half = [x.token.ref for x in leased[:150]]
    assert frontier.ack(3, half) == 150
    assert redis_client.object("encoding", k.meta) == b"hashtable"  # leases still out
    assert frontier.ack(3, [x.token.ref for x in leased[150:]]) == 150
    assert redis_client.object("encoding", k.meta) in (b"ziplist", b"listpack")
    assert redis_client.hgetall(k.meta) == {b"seq": b"300", b"n": b"0"}
    assert frontier.enqueue(3, "f" * 40, "next") == "301"  # the sequence goes on


def test_a_request_only_ever_buffered_is_never_dead_lettered_by_a_run_of_faults(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    """Its holders died (or froze) with it in their buffers before fetching it:
    that says nothing about the request, so no number of such deliveries below
    the backstop (three times the limit) dead-letters it (the chaos soak lost
    pages when three faults in a row did)."""
    rid = frontier.enqueue(3, "fp", "p")
    for delivery in range(1, 3 * frontier.max_deliveries):
        (leased,) = frontier.pop(3, "node-a", 1)
        assert (leased.id, leased.deliveries) == (rid, delivery)
        _expire(frontier, 3)
        assert frontier.reap(3) == (1, 0)
    # The backstop: a request whose holders keep dying before they can say
    # it started (e.g. it kills them) still reaches the dead letters.
    frontier.pop(3, "node-a", 1)
    _expire(frontier, 3)
    assert frontier.reap(3) == (0, 1)
    (dead,) = frontier.dead_letters(3)
    assert dead["deliveries"] == 3 * frontier.max_deliveries
    left = redis_client.hkeys(frontier.keys(3).meta)
    assert not any(k.startswith((b"c:", b"f:", b"d:")) for k in left), left
