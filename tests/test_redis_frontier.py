"""The Redis frontier's Lua scripts against a real redis-server."""

from __future__ import annotations

import time

import pytest
import redis

from scrapy_banker.redis.frontier import NotOwner, RedisFrontier


@pytest.fixture
def frontier(redis_client: redis.Redis) -> RedisFrontier:
    f = RedisFrontier(redis_client, prefix="t", partitions=8, lease_ttl_ms=300, max_deliveries=2)
    f.set_owner(3, "node-a", 1)
    return f


def test_dedup_and_enqueue_are_one_step(frontier: RedisFrontier) -> None:
    first = frontier.enqueue(3, "fp1", '{"url": "http://a/"}')
    assert first is not None and first.startswith("fp1:")
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
    assert frontier.reap(3) == (0, 0)  # lease still valid
    time.sleep(0.4)
    assert frontier.reap(3) == (1, 0)  # worker died: back to the queue
    (second,) = frontier.pop(3, "node-a", 1)
    assert second.id == first.id and second.deliveries == 2
    time.sleep(0.4)
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
    time.sleep(0.2)
    assert frontier.renew(3, [a.id]) == 1
    time.sleep(0.2)  # b's lease expired, a's was renewed
    assert frontier.reap(3) == (1, 0)
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
    items = [(p % 8, f"fp{p}", f"x{p}", 0, False) for p in range(40)]
    ids = frontier.enqueue_many([*items, (0, "fp0", "dup", 0, False)])
    assert sum(i is not None for i in ids) == 40 and ids[-1] is None
    assert sum(frontier.queued(p) for p in range(8)) == 40


def test_reaper_is_single_flight(frontier: RedisFrontier, redis_client: redis.Redis) -> None:
    redis_client.set("t:reaper-lock", "node-b", px=5000)
    assert frontier.reap_all("node-a") is None
    redis_client.delete("t:reaper-lock")
    assert frontier.reap_all("node-a") == (0, 0)
    assert redis_client.get("t:reaper-lock") is None


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

    from scrapy_banker.serialize import MalformedPayload, RequestCodec

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
