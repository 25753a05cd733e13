"""PlacementAgent against a real redis-server: publishing, reading back, planning."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_banker.net.netstats import LinkStats
from scrapy_banker.net.partitions import Move
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.worker.placement_agent import PlacementAgent
from scrapy_banker.settings import PlacementConfig, load_placement_config

PREFIX = "pl"
PARTITIONS = 8

pytestmark = pytest.mark.slow  # a real redis-server


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _config(interval: float = 0.0, **overrides: Any) -> PlacementConfig:
    """Validated settings; ``interval`` 0 (plan on every beat) is set past the validation,
    which only accepts intervals > 0."""
    settings: dict[str, Any] = {"BANKER_PLACEMENT": "top1", "BANKER_STORAGE_PROBE_BYTES": 1000}
    settings.update({f"BANKER_{k.upper()}": v for k, v in overrides.items()})
    return dataclasses.replace(load_placement_config(settings), interval=interval)


@pytest.fixture
def registry(redis_client: redis.Redis) -> NodeRegistry:
    frontier = RedisFrontier(redis_client, prefix=PREFIX, partitions=PARTITIONS)
    return NodeRegistry(redis_client, frontier, node_timeout_ms=30_000)


def _agent(
    client: redis.Redis,
    node: str = "a",
    links: LinkStats | None = None,
    clock: FakeClock | None = None,
    **overrides: Any,
) -> PlacementAgent:
    return PlacementAgent(
        client,
        PREFIX,
        node,
        _config(**overrides),
        links if links is not None else LinkStats(),
        clock=clock if clock is not None else FakeClock(),
    )


def _wait_until_gone(client: redis.Redis, key: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while client.exists(key):
        assert time.monotonic() < deadline, f"{key} never expired"
        time.sleep(0.02)


def _decode(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def _owner_keys(client: redis.Redis, registry: NodeRegistry) -> list[bytes | None]:
    return [client.get(registry.frontier.keys(p).owner) for p in range(PARTITIONS)]


# -- publishing -----------------------------------------------------------------------------


def test_note_site_and_beat_publish_sites_and_schemes(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    agent = _agent(redis_client, placement="hash")
    agent.note_site(3, "x.test", "https")
    agent.note_site(3, "other.test", "http")  # this node already noted partition 3
    agent.note_site(5, "y.test:8080", "http")
    assert agent.beat(registry) == []
    assert _decode(redis_client.hgetall(agent.sites_key)) == {"3": "x.test", "5": "y.test:8080"}
    assert _decode(redis_client.hgetall(agent.schemes_key)) == {
        "x.test": "https",
        "y.test:8080": "http",
    }
    assert agent.known == {"x.test": "https", "y.test:8080": "http"}
    assert agent.sites_key == f"{PREFIX}:sites" and agent.schemes_key == f"{PREFIX}:schemes"


def test_first_site_per_partition_wins_fleet_wide(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    first = _agent(redis_client, "a", placement="hash")
    second = _agent(redis_client, "b", placement="hash")
    first.note_site(2, "first.test", "http")
    first.beat(registry)
    second.note_site(2, "second.test", "https")
    second.note_site(4, "first.test", "https")  # same site, another scheme: first one stays
    second.beat(registry)
    assert _decode(redis_client.hgetall(first.sites_key)) == {"2": "first.test", "4": "first.test"}
    assert _decode(redis_client.hgetall(first.schemes_key)) == {
        "first.test": "http",
        "second.test": "https",
    }
    # Both agents see the whole fleet's sites after their next beat.
    first.beat(registry)
    assert first.known == second.known == {"first.test": "http", "second.test": "https"}


def test_failed_publish_is_retried_on_the_next_beat(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    agent = _agent(redis_client, placement="hash")
    agent.note_site(1, "x.test", "http")
    agent.client = redis.Redis(  # nothing listens on port 1: refused at once, no retries
        host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    with pytest.raises(redis.ConnectionError):
        agent.beat(registry)
    agent.client = redis_client
    agent.beat(registry)
    assert _decode(redis_client.hgetall(agent.sites_key)) == {"1": "x.test"}


def test_storage_bandwidth_measured_once_and_probe_key_deleted(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    agent = _agent(redis_client, "node-1", placement="hash")
    agent.beat(registry)
    assert agent.bs_key == f"{PREFIX}:net:bs"
    bs = redis_client.hget(agent.bs_key, "node-1")
    assert bs is not None and float(bs) > 0
    assert redis_client.exists(agent.keyspace.bs_probe("node-1")) == 0
    assert redis_client.keys(agent.keyspace.bs_probe("*")) == []
    redis_client.hset(agent.bs_key, "node-1", "123.0")  # a re-measure would overwrite it
    agent.beat(registry)
    agent.beat(registry)
    assert redis_client.hget(agent.bs_key, "node-1") == b"123.0"


def test_link_stats_are_published_per_node(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    links = LinkStats()
    agent = _agent(redis_client, "n1", links=links, placement="hash")
    links.record("x.test", 0.050, 10_000, 0.5)  # 50 ms, 20 000 B/s
    links.record("y.test", 0.200, 0, 0.2)  # empty body: latency only
    agent.beat(registry)
    rtt = {k: float(v) for k, v in _decode(redis_client.hgetall(agent.rtt_key("n1"))).items()}
    bw = {k: float(v) for k, v in _decode(redis_client.hgetall(agent.bw_key("n1"))).items()}
    assert rtt == pytest.approx({"x.test": 50.0, "y.test": 200.0})
    assert bw == pytest.approx({"x.test": 20_000.0})
    assert agent.rtt_key("n1") == f"{PREFIX}:net:rtt:n1"
    # New samples are published on the next beat.
    for _ in range(5):
        links.record("x.test", 0.010, 10_000, 0.1)
    agent.beat(registry)
    new = float(redis_client.hget(agent.rtt_key("n1"), "x.test") or b"nan")
    assert new == pytest.approx(links.snapshot()["x.test"]["rtt_ms"])
    assert new < 50.0


# -- reading back ---------------------------------------------------------------------------


def test_observations_skip_malformed_entries(redis_client: redis.Redis) -> None:
    agent = _agent(redis_client)
    redis_client.hset(
        agent.sites_key,
        mapping={
            "3": "x.test",
            "7": "y.test",
            "abc": "bad.test",
            "1.5": "bad.test",
            "": "bad.test",
            "0x10": "bad.test",
            b"\xff\xfe": "bad.test",
        },
    )
    redis_client.hset(
        agent.rtt_key("a"),
        mapping={
            "x.test": "12.5",
            "y.test": "7",
            "word.test": "fast",
            "neg.test": "-3",
            "nan.test": "nan",
            "inf.test": "inf",
            "huge.test": "1e400",
            "empty.test": "",
            "bytes.test": b"\xff",
        },
    )
    redis_client.hset(agent.rtt_key("b"), mapping={"x.test": "NaN", "y.test": "-0.5"})
    redis_client.hset(agent.bw_key("a"), mapping={"x.test": "1e6", "y.test": "-inf"})
    redis_client.hset(agent.bw_key("gone"), mapping={"x.test": "5"})  # not a live node
    redis_client.hset(agent.bs_key, mapping={"a": "2.5e7", "b": "n/a", "c": "-1"})
    obs = agent.observations({"a": 1.0, "b": 2.0})
    assert dict(obs.capacities) == {"a": 1.0, "b": 2.0}
    assert dict(obs.sites) == {3: "x.test", 7: "y.test"}
    assert {n: dict(v) for n, v in obs.rtt_ms.items()} == {
        "a": {"x.test": 12.5, "y.test": 7.0},
        "b": {},
    }
    assert {n: dict(v) for n, v in obs.bw_Bps.items()} == {"a": {"x.test": 1e6}, "b": {}}
    assert dict(obs.storage_Bps) == {"a": 2.5e7}


# -- planning -------------------------------------------------------------------------------


def _two_nodes(registry: NodeRegistry) -> None:
    registry.register("a")
    registry.register("b")
    registry.rebalance("a")


def _plant_rtts(client: redis.Redis, agent: PlacementAgent) -> None:
    # a is next to x.test, b next to y.test.
    client.hset(agent.rtt_key("a"), mapping={"x.test": "5.0", "y.test": "180.0"})
    client.hset(agent.rtt_key("b"), mapping={"x.test": "170.0", "y.test": "4.0"})


def test_full_planning_round_moves_sites_to_their_nearest_node(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    before = registry.load_table()
    x_part = before.owned_by("b")[0]  # x.test starts on the far node b
    y_part = before.owned_by("a")[0]  # y.test starts on the far node a
    agent = _agent(redis_client, "a")
    _plant_rtts(redis_client, agent)
    agent.note_site(x_part, "x.test", "http")
    agent.note_site(y_part, "y.test", "https")
    moves = agent.beat(registry)
    assert sorted(moves, key=lambda m: m.partition) == sorted(
        [Move(x_part, "b", "a"), Move(y_part, "a", "b")], key=lambda m: m.partition
    )
    assert agent.runs == 1
    after = registry.load_table()
    assert after.owners[x_part] == "a" and after.owners[y_part] == "b"
    for p in range(PARTITIONS):
        if p in (x_part, y_part):
            assert after.epochs[p] == before.epochs[p] + 1
            expected = f"{after.owners[p]}@{after.epochs[p]}".encode()
            assert redis_client.get(registry.frontier.keys(p).owner) == expected
        else:
            assert after.owners[p] == before.owners[p]
            assert after.epochs[p] == before.epochs[p]
    assert redis_client.exists(registry.lock_key) == 0  # the lock was released

    # Unchanged measurements: a second round moves nothing and bumps no epoch.
    state = redis_client.get(registry.table_key)
    assert agent.beat(registry) == []
    assert agent.runs == 2
    assert redis_client.get(registry.table_key) == state


def test_hungarian_rounds_remember_placed_costs_and_then_move_only_what_must(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    table = registry.load_table()
    x_part, y_part = table.owned_by("b")[0], table.owned_by("a")[0]
    agent = _agent(redis_client, "a", placement="hungarian")
    _plant_rtts(redis_client, agent)
    agent.note_site(x_part, "x.test", "http")
    agent.note_site(y_part, "y.test", "http")
    assert redis_client.exists(agent.placed_key) == 0
    assert len(agent.beat(registry)) == 2  # both start on their far node
    placed = _decode(redis_client.hgetall(agent.placed_key))
    assert {int(p): float(c) for p, c in placed.items()} == {x_part: 5.0, y_part: 4.0}
    # Drift within the tolerance (10 %): the placed partitions stay.
    redis_client.hset(agent.rtt_key("a"), mapping={"x.test": "5.4"})
    assert agent.beat(registry) == []
    # a's link to x.test degrades far beyond its placed cost: x is re-solved, but
    # with one partition per node (hard, equal targets) a is still its only room.
    redis_client.hset(agent.rtt_key("a"), mapping={"x.test": "400.0"})
    assert agent.beat(registry) == []
    placed = _decode(redis_client.hgetall(agent.placed_key))
    assert float(placed[str(x_part)]) == 400.0  # re-placed at today's cost
    # Garbage in the placed hash is tolerated, and rewritten away by the next round.
    redis_client.hset(agent.placed_key, mapping={"zz": "1.0", str(y_part): "nan"})
    assert agent.beat(registry) == []
    placed = _decode(redis_client.hgetall(agent.placed_key))
    assert placed.keys() == {str(x_part), str(y_part)} and float(placed[str(y_part)]) == 4.0


def test_least_loaded_topk_round_weighs_partitions_by_their_backlog_in_redis(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    # Three nodes; a is the nearest to both sites, c the farthest.
    for node in ("a", "b", "c"):
        registry.register(node)
    registry.rebalance("a")
    frontier = registry.frontier
    table = registry.load_table()
    big, small = table.owned_by("c")[0], table.owned_by("b")[0]
    agent = PlacementAgent(
        redis_client,
        PREFIX,
        "a",
        _config(placement="topk", placement_topk=2),
        LinkStats(),
        clock=FakeClock(),
        backlog=frontier.backlog,
    )
    assert agent.config.topk_choice == "least_loaded"  # the default
    for node, rtts in (("a", ("10.0", "10.0")), ("b", ("12.0", "12.0")), ("c", ("90", "90"))):
        redis_client.hset(agent.rtt_key(node), mapping={"big.test": rtts[0], "small.test": rtts[1]})
    agent.note_site(big, "big.test", "http")
    agent.note_site(small, "small.test", "http")
    for i in range(30):  # big.test's partition holds 30 requests, small.test's none
        frontier.enqueue(big, f"fp{i}", "x")
    agent.beat(registry)
    after = registry.load_table()
    # The heavy partition takes the nearest node; the light one the next candidate.
    assert after.owners[big] == "a"
    assert after.owners[small] == "b"
    # The backlogs are published per site for every prober of the fleet...
    assert _decode(redis_client.hgetall(agent.backlog_key)) == {"big.test": "30", "small.test": "0"}
    # ...and read back on the next beat (by any node), as a new mapping.
    reader = _agent(redis_client, "b")
    before = reader.backlogs
    reader.beat(registry)
    assert reader.backlogs == {"big.test": 30.0, "small.test": 0.0}
    assert reader.backlogs is not before
    unchanged = reader.backlogs
    reader.beat(registry)
    assert reader.backlogs is unchanged  # the prober re-sorts only when it changed


def test_planning_respects_the_interval(redis_client: redis.Redis, registry: NodeRegistry) -> None:
    _two_nodes(registry)
    clock = FakeClock()
    agent = _agent(redis_client, "a", clock=clock, interval=1.0)
    other = _agent(redis_client, "b", clock=clock, interval=1.0)
    agent.beat(registry)
    assert agent.runs == 1
    x_part = registry.load_table().owned_by("b")[0]
    _plant_rtts(redis_client, agent)
    agent.note_site(x_part, "x.test", "http")
    clock.now = 0.5
    assert agent.beat(registry) == []  # too early: published but not planned
    assert agent.runs == 1
    assert redis_client.hget(agent.sites_key, str(x_part)) == b"x.test"
    # Another node's first beat: due by its own clock, but a just planned
    # fleet-wide, so it does not plan again.
    assert other.beat(registry) == []
    assert other.runs == 0
    assert redis_client.get(agent.plan_key) == b"a"
    _wait_until_gone(redis_client, agent.plan_key)  # the fleet-wide gate expires with the interval
    clock.now = 1.0
    assert agent.beat(registry) == [Move(x_part, "b", "a")]
    assert agent.runs == 2
    assert other.beat(registry) == []  # gated again
    assert other.runs == 0


def test_a_busy_table_lets_the_next_beat_retry_the_plan(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    clock = FakeClock()
    agent = _agent(redis_client, "a", clock=clock, interval=60.0)
    redis_client.set(registry.lock_key, "rebalancer")  # a rebalance in progress
    assert agent.beat(registry) == [] and agent.runs == 0
    assert redis_client.exists(agent.plan_key) == 0  # gate released: not an interval lost
    redis_client.delete(registry.lock_key)
    # The node that found the table busy retries on its next beat, not an interval later.
    agent.beat(registry)
    assert agent.runs == 1
    assert redis_client.get(agent.plan_key) == b"a"  # and holds the gate for the interval


def test_a_rebalance_triggers_a_plan_on_the_next_beat(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    clock = FakeClock()
    agent = _agent(redis_client, "a", clock=clock, interval=60.0)
    x_part = registry.load_table().owned_by("b")[0]
    _plant_rtts(redis_client, agent)
    agent.note_site(x_part, "x.test", "http")
    assert agent.beat(registry) == [Move(x_part, "b", "a")]
    # A third node joins; the count-based rebalance may hand x.test's partition
    # to it.  Force that, as the network-blind worst case.
    registry.register("c")
    redis_client.hset(agent.rtt_key("c"), mapping={"x.test": "150.0", "y.test": "160.0"})
    registry.rebalance("a")
    table = registry.load_table()
    registry.update("a", lambda t, live: t.assign({x_part: "c"}))
    assert registry.load_table().owners[x_part] == "c"
    assert table.owners.count("c") > 0
    other = _agent(redis_client, "b", clock=clock, interval=60.0)
    assert other.beat(registry) == []  # within the interval: gated fleet-wide
    assert agent.beat(registry) == []  # and locally
    agent.replan()  # what the worker calls after a rebalance that moved partitions
    moves = agent.beat(registry)
    assert Move(x_part, "c", "a") in moves
    assert agent.runs == 2
    assert agent.beat(registry) == []  # one forced plan, then the interval again
    assert agent.runs == 2


def test_no_plan_while_the_table_and_the_live_nodes_differ(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    """A node still in the table but late with its heartbeats gets no plan made without it.

    Planned over the live nodes alone, every site would go to them while the
    late node kept its share of the other partitions (the fleet test once saw
    one node of three with no site at all).
    """
    _two_nodes(registry)
    before = registry.load_table()
    x_part, y_part = before.owned_by("b")[0], before.owned_by("a")[0]
    agent = _agent(redis_client, "a", placement="hungarian", interval=60.0)
    _plant_rtts(redis_client, agent)
    agent.note_site(x_part, "x.test", "http")
    agent.note_site(y_part, "y.test", "http")
    redis_client.zadd(registry.keyspace.heartbeats, {"b": 0})  # b misses its beats
    assert set(registry.live_nodes()) == {"a"}
    assert agent.beat(registry) == [] and agent.runs == 0
    assert registry.load_table().owners == before.owners  # nothing moved to a
    assert redis_client.exists(agent.placed_key) == 0
    assert redis_client.exists(agent.plan_key) == 0  # the gate is not held for an interval
    # b beats again: the table and the live nodes agree, the plan runs at once.
    registry.heartbeat("b")
    moves = agent.beat(registry)
    assert agent.runs == 1
    assert sorted(m.partition for m in moves) == sorted([x_part, y_part])
    after = registry.load_table()
    assert after.owners[x_part] == "a" and after.owners[y_part] == "b"


def test_garbage_in_redis_does_not_break_planning(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    x_part = registry.load_table().owned_by("b")[0]
    agent = _agent(redis_client, "a")
    _plant_rtts(redis_client, agent)
    redis_client.hset(
        agent.sites_key,
        mapping={str(x_part): "x.test", "-1": "y.test", "999": "y.test", "zz": "y.test"},
    )
    redis_client.hset(agent.rtt_key("a"), mapping={"junk.test": "nan", "y.test": "oops"})
    assert agent.beat(registry) == [Move(x_part, "b", "a")]


def test_a_live_node_without_estimates_keeps_partitions_where_they_are(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    registry.register("a")
    registry.register("b")
    registry.register("c")  # c measured nothing and cannot be predicted with two sites
    registry.rebalance("a")
    table = registry.load_table()
    agent = _agent(redis_client, "a")
    _plant_rtts(redis_client, agent)
    agent.note_site(table.owned_by("b")[0], "x.test", "http")
    agent.note_site(table.owned_by("a")[0], "y.test", "http")
    state = redis_client.get(registry.table_key)
    assert agent.beat(registry) == []
    assert agent.runs == 1
    assert redis_client.get(registry.table_key) == state


def test_hash_mode_never_touches_the_table(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    table = registry.load_table()
    agent = _agent(redis_client, "a", placement="hash")
    _plant_rtts(redis_client, agent)
    agent.note_site(table.owned_by("b")[0], "x.test", "http")
    agent.note_site(table.owned_by("a")[0], "y.test", "http")
    state, owners = redis_client.get(registry.table_key), _owner_keys(redis_client, registry)
    for _ in range(3):
        assert agent.beat(registry) == []
    assert agent.runs == 0
    assert redis_client.get(registry.table_key) == state
    assert _owner_keys(redis_client, registry) == owners
    assert redis_client.hlen(agent.sites_key) == 2  # still published, just never planned


def test_no_planning_while_another_node_holds_the_lock(
    redis_client: redis.Redis, registry: NodeRegistry
) -> None:
    _two_nodes(registry)
    table = registry.load_table()
    agent = _agent(redis_client, "a")
    _plant_rtts(redis_client, agent)
    agent.note_site(table.owned_by("b")[0], "x.test", "http")
    agent.note_site(table.owned_by("a")[0], "y.test", "http")
    redis_client.set(registry.lock_key, "b", px=10_000)
    state, owners = redis_client.get(registry.table_key), _owner_keys(redis_client, registry)
    assert agent.beat(registry) == []
    assert agent.runs == 0
    assert redis_client.get(registry.table_key) == state
    assert _owner_keys(redis_client, registry) == owners
    assert redis_client.get(registry.lock_key) == b"b"  # b's lock is left alone
    redis_client.delete(registry.lock_key)
    assert len(agent.beat(registry)) == 2  # once free, the next beat plans
    assert json.loads(redis_client.get(registry.table_key) or b"{}")["size"] == PARTITIONS


class _RecordingPlacement:
    def __init__(self) -> None:
        self.replans = 0
        self.beats = 0

    def replan(self) -> None:
        self.replans += 1

    def beat(self, registry: NodeRegistry) -> list[Move]:
        self.beats += 1
        return []


def test_the_worker_asks_for_a_plan_after_each_rebalance_that_moved_partitions(
    registry: NodeRegistry,
) -> None:
    from scrapy_banker.redis.worker import FrontierWorker

    placement = _RecordingPlacement()
    worker = FrontierWorker(
        registry.frontier,
        registry,
        "a",
        placement=placement,  # type: ignore[arg-type]
    )
    worker.membership.beat()  # joins: every partition moves to a
    assert (placement.replans, placement.beats) == (1, 1)
    worker.membership.beat()  # nothing changed
    assert (placement.replans, placement.beats) == (1, 2)
    registry.register("b")
    worker.membership.beat()  # b joined: a hands half over
    assert (placement.replans, placement.beats) == (2, 3)
    assert len(worker.owned) == PARTITIONS // 2
