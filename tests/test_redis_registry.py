"""Node registry and rebalancing against a real redis-server."""

from __future__ import annotations

import time

import pytest
import redis

from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.leases import NotOwner
from scrapy_banker.redis.frontier.registry import NodeRegistry

pytestmark = pytest.mark.slow  # a real redis-server


@pytest.fixture
def registry(redis_client: redis.Redis) -> NodeRegistry:
    frontier = RedisFrontier(redis_client, prefix="r", partitions=64)
    return NodeRegistry(redis_client, frontier, node_timeout_ms=60_000)


def test_nodes_share_partitions_by_capacity(registry: NodeRegistry) -> None:
    registry.register("a", 1)
    registry.register("b", 3)
    moves = registry.rebalance("a")
    assert moves is not None and len(moves) == 64
    assert len(registry.owned("a")) == 16 and len(registry.owned("b")) == 48


def test_owner_keys_fence_the_pop(registry: NodeRegistry) -> None:
    frontier = registry.frontier
    registry.register("a")
    registry.rebalance("a")
    p, epoch = next(iter(registry.owned("a").items()))
    frontier.enqueue(p, "fp", "x")
    registry.register("b")
    registry.rebalance("b")
    owned_a = registry.owned("a")
    if p in owned_a:  # still a's: same epoch, pop works
        assert owned_a[p] == epoch
        assert frontier.pop(p, "a", epoch)
    else:  # moved to b: a's old epoch is refused, b's works
        with pytest.raises(NotOwner):
            frontier.pop(p, "a", epoch)
        assert frontier.pop(p, "b", registry.owned("b")[p])


def test_dead_node_partitions_are_reassigned_with_minimal_moves(
    registry: NodeRegistry, redis_client: redis.Redis
) -> None:
    for n in ("a", "b", "c"):
        registry.register(n)
    registry.rebalance("a")
    lost = set(registry.owned("c"))
    # Seen with a 1 s node timeout: c stops beating; a and b keep beating.
    short = NodeRegistry(redis_client, registry.frontier, node_timeout_ms=1000)
    deadline = time.monotonic() + 30
    while True:
        short.heartbeat("a")
        short.heartbeat("b")
        if set(short.live_nodes()) == {"a", "b"}:
            break
        assert time.monotonic() < deadline, "c never timed out"
        time.sleep(0.05)
    moves = short.rebalance("b")
    assert moves is not None and {m.partition for m in moves} == lost
    assert len(registry.owned("a")) + len(registry.owned("b")) == 64


def test_clean_leave_and_single_flight(registry: NodeRegistry, redis_client: redis.Redis) -> None:
    registry.register("a")
    registry.register("b")
    registry.rebalance("a")
    registry.leave("b")
    redis_client.set(registry.lock_key, "a", px=5000)
    assert registry.rebalance("b") is None  # a rebalance is already running
    redis_client.delete(registry.lock_key)
    registry.rebalance("a")
    assert len(registry.owned("a")) == 64


def test_partition_count_mismatch_is_a_clear_error(
    registry: NodeRegistry, redis_client: redis.Redis
) -> None:
    registry.register("a")
    registry.rebalance("a")
    other = NodeRegistry(redis_client, RedisFrontier(redis_client, prefix="r", partitions=32))
    with pytest.raises(ValueError, match="has 64 partitions but this worker is configured for 32"):
        other.load_table()


@pytest.mark.parametrize(
    ("node", "capacity", "match"),
    [("", 1, "non-empty"), ("a@b", 1, "without '@'"), ("a", 0, "must be > 0")],
)
def test_bad_registration(registry: NodeRegistry, node: str, capacity: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        registry.register(node, capacity)
