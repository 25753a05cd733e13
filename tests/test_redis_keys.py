"""The crawl's Redis key names: pinned here, since renaming one strands a live crawl's data."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from scrapy_banker.net.netstats import LinkStats
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.keys import Keyspace, PartitionKeys, decode
from scrapy_banker.redis.registry import NodeRegistry
from scrapy_banker.settings import load_placement_config

PREFIX = "banker:shop"


def test_every_key_name_is_the_one_a_running_fleet_uses() -> None:
    keys = Keyspace(PREFIX, 16)
    assert keys.partition(3) == PartitionKeys(
        levels="{banker:shop:3}:lv",
        leases="{banker:shop:3}:leases",
        payloads="{banker:shop:3}:payloads",
        meta="{banker:shop:3}:meta",
        owner="{banker:shop:3}:owner",
        dead="{banker:shop:3}:dead",
        seen="{banker:shop:3}:seen",
        bloom="{banker:shop:3}:bloom",
        hosts="{banker:shop:3}:hosts",
        over="{banker:shop:3}:over",
    )
    assert keys.partition(3).level(-2) == "{banker:shop:3}:lv:-2"
    assert (keys.nodes, keys.heartbeats, keys.table) == (
        "banker:shop:nodes",
        "banker:shop:heartbeats",
        "banker:shop:table",
    )
    assert (keys.rebalance_lock, keys.reaper_lock) == (
        "banker:shop:rebalance-lock",
        "banker:shop:reaper-lock",
    )
    assert (keys.sites, keys.schemes) == ("banker:shop:sites", "banker:shop:schemes")
    assert (keys.net_bs, keys.net_placed, keys.net_backlog, keys.plan_gate) == (
        "banker:shop:net:bs",
        "banker:shop:net:placed",
        "banker:shop:net:backlog",
        "banker:shop:net:plan-gate",
    )
    assert keys.rtt("n1") == "banker:shop:net:rtt:n1"
    assert keys.bw("n1") == "banker:shop:net:bw:n1"
    assert keys.bs_probe("n1") == "banker:shop:net:bs-probe:n1"
    # Expiring, per origin: a flush leaves them (robots.txt is no crawl state).
    assert keys.robots("https://a.test:8443") == "banker:shop:robots:https://a.test:8443"
    assert keys.robots_lock("http://a.test") == "banker:shop:robots-lock:http://a.test"
    assert (keys.control, keys.control_log, keys.known_hosts, keys.budget) == (
        "banker:shop:control",
        "banker:shop:control:log",
        "banker:shop:known-hosts",
        "banker:shop:budget",
    )
    assert keys.known_topics == "banker:shop:known-topics"


def test_a_partitions_keys_share_one_slot_and_partitions_spread() -> None:
    keys = Keyspace(PREFIX, 64)
    slots = []
    for p in range(64):
        names = keys.partition(p).names()
        assert len(names) == 10
        # The level lists too: the scripts name them from the levels key.
        names += (keys.partition(p).level(0), keys.partition(p).level(-7))
        assert len({key_slot(n.encode()) for n in names}) == 1
        slots.append(key_slot(names[0].encode()))
    assert len(set(slots)) > 32  # different tags, different slots


def test_cleared_is_the_whole_crawl_but_the_network_measurements() -> None:
    keys = Keyspace(PREFIX, 4)
    cleared = list(keys.cleared())
    assert len(cleared) == len(set(cleared)) == 4 * 10 + 15
    for p in range(4):
        assert set(keys.partition(p).names()) <= set(cleared)
    assert {
        keys.nodes,
        keys.heartbeats,
        keys.table,
        keys.rebalance_lock,
        keys.reaper_lock,
        keys.sites,
        keys.schemes,
        keys.net_placed,
        keys.net_backlog,
        keys.plan_gate,
        keys.control,
        keys.known_hosts,
        keys.known_topics,
        keys.budget,
    } <= set(cleared)
    # Links do not change between crawls: a re-crawl places its sites at once.
    # The operators' log is the record of who did what.
    assert not {keys.net_bs, keys.rtt("n1"), keys.bw("n1"), keys.control_log} & set(cleared)
    assert not any(":net:rtt:" in k or ":net:bw:" in k for k in cleared)


@pytest.mark.parametrize(
    ("prefix", "partitions", "match"),
    [
        ("", 8, "non-empty"),
        ("a{b", 8, "braces"),
        ("a}b", 8, "braces"),
        ("a", 0, "partitions must be an integer >= 1"),
        ("a", True, "partitions must be an integer >= 1"),
        ("a", 2.0, "partitions must be an integer >= 1"),
    ],
)
def test_bad_keyspaces(prefix: str, partitions: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Keyspace(prefix, partitions)


@pytest.mark.parametrize("partition", [-1, 8, 99])
def test_partitions_out_of_range_have_no_keys(partition: int) -> None:
    with pytest.raises(ValueError, match=r"partition must be in \[0, 8\)"):
        Keyspace("a", 8).partition(partition)


def test_decode_is_strict_unless_asked_to_be_lossy() -> None:
    assert decode(b"caf\xc3\xa9") == "café"
    assert decode("already text") == "already text"
    assert decode(42) == "42"
    with pytest.raises(UnicodeDecodeError):
        decode(b"\x80pickle")
    assert decode(b"\x80pickle", lossy=True) == "\ufffdpickle"


@pytest.mark.slow  # a real redis-server
def test_frontier_registry_and_placement_share_one_keyspace(redis_client: redis.Redis) -> None:
    from scrapy_banker.redis.placement import PlacementAgent

    frontier = RedisFrontier(redis_client, prefix=PREFIX, partitions=16)
    registry = NodeRegistry(redis_client, frontier)
    config = load_placement_config({"BANKER_PLACEMENT": "top1"})
    agent = PlacementAgent(redis_client, frontier.keyspace, "n1", config, LinkStats())
    assert registry.keyspace is frontier.keyspace is agent.keyspace
    assert frontier.keys(3) == frontier.keyspace.partition(3)
    assert (registry.table_key, registry.lock_key) == (
        frontier.keyspace.table,
        frontier.keyspace.rebalance_lock,
    )
    # A bare prefix names the same keys.
    by_prefix = PlacementAgent(redis_client, PREFIX, "n1", config, LinkStats())
    assert by_prefix.prefix == agent.prefix == PREFIX
    for name in ("sites_key", "schemes_key", "bs_key", "placed_key", "plan_key", "backlog_key"):
        assert getattr(by_prefix, name) == getattr(agent, name)
    assert by_prefix.rtt_key("b") == agent.rtt_key("b") == frontier.keyspace.rtt("b")
    assert by_prefix.bw_key("b") == agent.bw_key("b") == frontier.keyspace.bw("b")
