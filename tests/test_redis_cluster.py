"""The frontier and the node registry on a real three-master Redis Cluster.

The frontier's design promise -- every key of a partition shares the hash tag
``{<prefix>:<partition>}``, so each Lua script touches one slot -- can only be
checked on a cluster: a single server runs cross-slot scripts happily, a
cluster node refuses them with ``CROSSSLOT``.  One cluster is started for the
module (``redis-cli --cluster create`` takes about four seconds).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterCrossSlotError, MovedError

from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.leases import NotOwner
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.testing.redis_server import RedisClusterServer

PARTITIONS = 16
#: Long enough that no lease runs out while a test works with it; a test
#: makes them run out when it needs to (:func:`_expire`).
LEASE_TTL_MS = 60_000

pytestmark = pytest.mark.slow  # a real Redis Cluster


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisClusterServer]:
    """A real 3-master Redis Cluster, shared by this module's tests."""
    with RedisClusterServer() as cluster:
        yield cluster


@pytest.fixture
def cluster_client(redis_cluster: RedisClusterServer) -> Iterator[RedisCluster]:
    """A cluster-aware client on a flushed cluster (FLUSHALL goes to every primary)."""
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in redis_cluster.startup_nodes]
    )
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def frontier(cluster_client: RedisCluster) -> RedisFrontier:
    return RedisFrontier(
        cluster_client,  # type: ignore[arg-type]  # typed for redis.Redis; duck-typed here
        prefix="c",
        partitions=PARTITIONS,
        lease_ttl_ms=LEASE_TTL_MS,
        max_deliveries=2,
    )


def _direct(client: RedisCluster, key: str) -> redis.Redis:
    """A plain, non-cluster client on the node that serves ``key``."""
    node = client.get_node_from_key(key)
    return redis.Redis(host=node.host, port=node.port)


def _expire(frontier: RedisFrontier) -> None:
    """Every lease runs out now, as if the server's clock passed its TTL."""
    client = frontier.client
    for p in range(frontier.partitions):
        leases = frontier.keys(p).leases
        ids = client.zrange(leases, 0, -1)
        if ids:
            client.zadd(leases, dict.fromkeys(ids, 0), xx=True)


# -- the cluster is a real one ------------------------------------------------------------


def test_three_masters_cover_all_slots(
    redis_cluster: RedisClusterServer, cluster_client: RedisCluster
) -> None:
    primaries = cluster_client.get_primaries()
    assert sorted(n.port for n in primaries) == sorted(p for _, p in redis_cluster.startup_nodes)
    assert cluster_client.get_replicas() == []
    slots = cluster_client.nodes_manager.slots_cache
    assert sorted(slots) == list(range(16384))
    assert {slots[s][0].port for s in slots} == {n.port for n in primaries}
    for node in redis_cluster.nodes:
        with redis.Redis.from_url(node.url) as direct:
            info = direct.cluster("INFO")
            assert info["cluster_state"] == "ok"
            assert int(info["cluster_slots_assigned"]) == 16384
            assert int(info["cluster_slots_ok"]) == 16384
            assert int(info["cluster_known_nodes"]) == 3
            assert int(info["cluster_size"]) == 3


def test_keys_are_sharded_and_nodes_refuse_foreign_slots(cluster_client: RedisCluster) -> None:
    keys = [f"key-{i}" for i in range(30)]
    for key in keys:
        cluster_client.set(key, key)
    owners = {key: cluster_client.get_node_from_key(key).port for key in keys}
    assert len(set(owners.values())) == 3
    primaries = cluster_client.get_primaries()
    for key in keys[:6]:
        for node in primaries:
            with redis.Redis(host=node.host, port=node.port) as direct:
                if node.port == owners[key]:
                    assert direct.get(key) == key.encode()
                else:  # a node that does not serve the slot redirects, it holds no copy
                    with pytest.raises(MovedError):
                        direct.get(key)


def test_a_cluster_node_rejects_a_cross_slot_script(cluster_client: RedisCluster) -> None:
    """What the frontier's hash tags protect against: one node, two slots -> CROSSSLOT."""
    node = cluster_client.get_primaries()[0]
    mine = [
        key
        for key in (f"x{i}" for i in range(200))
        if cluster_client.get_node_from_key(key).port == node.port
    ]
    a = mine[0]
    b = next(key for key in mine if cluster_client.keyslot(key) != cluster_client.keyslot(a))
    script = "redis.call('SET', KEYS[1], 1); redis.call('SET', KEYS[2], 1); return 1"
    with redis.Redis(host=node.host, port=node.port) as direct:
        with pytest.raises(ClusterCrossSlotError):
            direct.eval(script, 2, a, b)
        assert direct.exists(a) == direct.exists(b) == 0  # refused before running
    # The same keys under one hash tag share a slot and run fine.
    assert cluster_client.eval(script, 2, f"{{{a}}}:1", f"{{{a}}}:2") == 1


# -- the frontier on the cluster ------------------------------------------------------------


def test_partitions_are_spread_over_all_masters_one_slot_each(
    cluster_client: RedisCluster, frontier: RedisFrontier
) -> None:
    ports = set()
    for p in range(PARTITIONS):
        keys = frontier.keys(p)
        names = [keys.levels, keys.leases, keys.payloads, keys.meta, keys.owner, keys.dead]
        assert len({cluster_client.keyslot(name) for name in [*names, keys.seen]}) == 1
        ports.add(cluster_client.get_node_from_key(keys.levels).port)
    assert ports == {n.port for n in cluster_client.get_primaries()}


def test_frontier_lifecycle_on_every_partition(
    cluster_client: RedisCluster, frontier: RedisFrontier
) -> None:
    ids: dict[int, dict[str, str]] = {}
    for p in range(PARTITIONS):
        frontier.set_owner(p, "w", 1)
        assert frontier.owner(p) == "w@1"
        low = frontier.enqueue(p, f"low-{p}", f"L{p}", priority=0)
        high = frontier.enqueue(p, f"high-{p}", f"H{p}", priority=5)
        assert frontier.enqueue(p, f"low-{p}", "again", priority=9) is None  # seen
        forced = frontier.enqueue(p, f"low-{p}", f"F{p}", dont_filter=True)
        assert low and high and forced and len({low, high, forced}) == 3
        assert frontier.queued(p) == 3
        popped = frontier.pop(p, "w", 1, count=3)
        # Higher priority first, then FIFO among equals.
        assert [(x.id, x.payload, x.deliveries) for x in popped] == [
            (high, f"H{p}", 1),
            (low, f"L{p}", 1),
            (forced, f"F{p}", 1),
        ]
        assert all(x.partition == p for x in popped)
        assert frontier.queued(p) == 0 and frontier.leased(p) == 3
        # Their fetches begin (the worker marks what it dispatches).
        assert frontier.start_many({p: [x.token.ref for x in popped]}) == 3
        assert frontier.ack(p, [high]) == 1
        assert frontier.ack(p, [high]) == 0  # already gone
        assert frontier.renew(p, [low, forced, high]) == 2  # never resurrects the acked one
        frontier.dead_letter(p, forced, "malformed payload")
        assert frontier.leased(p) == 1
        ids[p] = {"low": low, "forced": forced}

    _expire(frontier)
    for p in range(PARTITIONS):
        assert frontier.reap(p) == (1, 0)  # first delivery expired: back to the queue
        again = frontier.pop(p, "w", 1, count=5)
        assert [(x.id, x.payload, x.deliveries) for x in again] == [(ids[p]["low"], f"L{p}", 2)]
        assert frontier.start_many({p: [again[0].token.ref]}) == 1

    _expire(frontier)
    assert frontier.reap_all("w") == (0, PARTITIONS)  # max_deliveries=2 reached everywhere
    for p in range(PARTITIONS):
        dead = frontier.dead_letters(p)
        assert [(d["id"], d["reason"], d["payload"]) for d in dead] == [
            (ids[p]["forced"], "malformed payload", f"F{p}"),
            (ids[p]["low"], "lease expired after 2 deliveries", f"L{p}"),
        ]
        assert frontier.queued(p) == frontier.leased(p) == 0
        # The dead letters really live on the master serving the partition's slot.
        with _direct(cluster_client, frontier.keys(p).dead) as direct:
            assert direct.llen(frontier.keys(p).dead) == 2


def test_enqueue_many_pipelined_on_cluster(
    cluster_client: RedisCluster, frontier: RedisFrontier
) -> None:
    items = [EnqueueOp(p, f"fp-{p}", f"P{p}") for p in range(PARTITIONS)]
    items.append(EnqueueOp(0, "fp-0", "dup"))
    # redis-py's ClusterPipeline blocks script objects (EVALSHA is in
    # PIPELINE_BLOCKED_COMMANDS): the script runner loads the script on every
    # primary and sends raw EVALSHA instead.
    ids = frontier.enqueue_many(items)
    assert ids[-1] is None
    # Ids are each partition's own sequence: a request is (partition, id).
    pairs = {(op.partition, i) for op, i in zip(items[:-1], ids[:-1], strict=True)}
    assert all(ids[:-1]) and len(pairs) == PARTITIONS
    for p in range(PARTITIONS):
        assert frontier.queued(p) == 1
    # Nodes that lost their scripts (as after a restart) answer NOSCRIPT: loaded again, re-sent.
    cluster_client.script_flush()
    sha = frontier.scripts.sha("enqueue")
    for node in cluster_client.get_primaries():
        assert cluster_client.get_redis_connection(node).script_exists(sha) == [False]
    again = frontier.enqueue_many([EnqueueOp(p, f"fp2-{p}", "x") for p in range(PARTITIONS)])
    assert all(again)
    assert sum(frontier.queued(p) for p in range(PARTITIONS)) == 2 * PARTITIONS
    for node in cluster_client.get_primaries():  # reloaded everywhere, not just where refused
        assert cluster_client.get_redis_connection(node).script_exists(sha) == [True]


def test_only_the_calls_a_node_refused_with_noscript_are_sent_again(
    cluster_client: RedisCluster, frontier: RedisFrontier
) -> None:
    """One master restarted (its scripts lost): the others' calls must not run twice."""
    assert frontier.enqueue(0, "warm-up", "x") is not None  # loaded on every primary
    lost = cluster_client.get_primaries()[0]
    cluster_client.get_redis_connection(lost).script_flush()
    # dont_filter: a call sent twice would queue its request twice.
    ops = [EnqueueOp(p, f"fp-{p}", f"P{p}", dont_filter=True) for p in range(PARTITIONS)]
    on_lost = [p for p in range(PARTITIONS) if _serves(cluster_client, frontier, p, lost)]
    assert on_lost and len(on_lost) < PARTITIONS
    assert all(frontier.enqueue_many(ops))
    assert [frontier.queued(p) for p in range(PARTITIONS)] == [
        1 + (p == 0) for p in range(PARTITIONS)
    ]


def _serves(
    client: RedisCluster, frontier: RedisFrontier, partition: int, node: ClusterNode
) -> bool:
    return client.get_node_from_key(frontier.keys(partition).levels).port == node.port


# -- the node registry on the cluster ---------------------------------------------------


def test_registry_rebalances_and_fences_on_cluster(
    cluster_client: RedisCluster, frontier: RedisFrontier
) -> None:
    registry = NodeRegistry(cluster_client, frontier)  # type: ignore[arg-type]
    registry.register("a")
    registry.register("b", capacity=1.0)
    assert registry.live_nodes() == {"a": 1.0, "b": 1.0}
    moves = registry.rebalance("a")
    assert moves is not None and len(moves) == PARTITIONS
    owned = {node: registry.owned(node) for node in ("a", "b")}
    assert set(owned["a"]).isdisjoint(owned["b"])
    assert set(owned["a"]) | set(owned["b"]) == set(range(PARTITIONS))
    assert len(owned["a"]) == len(owned["b"]) == PARTITIONS // 2

    for node, other in (("a", "b"), ("b", "a")):
        for p, epoch in owned[node].items():
            assert frontier.owner(p) == f"{node}@{epoch}"
            assert frontier.enqueue(p, f"fp-{p}", f"P{p}") is not None
            with pytest.raises(NotOwner):
                frontier.pop(p, other, epoch)
            with pytest.raises(NotOwner):
                frontier.pop(p, node, epoch + 1)  # the right node at a wrong epoch
            [leased] = frontier.pop(p, node, epoch)
            assert (leased.payload, leased.deliveries) == (f"P{p}", 1)
            assert frontier.ack(p, [leased.id]) == 1

    # b leaves: its partitions move to a under a new epoch, and b is fenced off at once.
    registry.leave("b")
    moves = registry.rebalance("a")
    assert moves is not None and {m.partition for m in moves} == set(owned["b"])
    now_a = registry.owned("a")
    assert set(now_a) == set(range(PARTITIONS))
    for p, old_epoch in owned["b"].items():
        assert now_a[p] > old_epoch
        frontier.enqueue(p, f"late-{p}", "late")
        with pytest.raises(NotOwner):
            frontier.pop(p, "b", old_epoch)
        assert [x.payload for x in frontier.pop(p, "a", now_a[p])] == ["late"]


def test_batched_pop_ack_nack_and_outstanding_on_cluster(
    cluster_client: RedisCluster, frontier: RedisFrontier
) -> None:
    """One pipeline per batch, fanned out over the three masters, errors kept in place."""
    ids: dict[int, dict[str, str]] = {}
    for p in range(PARTITIONS):
        frontier.set_owner(p, "w", 1)
        if p == 1:
            continue  # owned but empty
        high = frontier.enqueue(p, f"high-{p}", f"H{p}", priority=1)
        low = frontier.enqueue(p, f"low-{p}", f"L{p}")
        assert high and low
        ids[p] = {"high": high, "low": low}
    frontier.set_owner(0, "other", 1)  # fenced off
    [old] = frontier.pop(2, "w", 1)  # in flight when partition 2 moves to epoch 2
    frontier.set_owner(2, "w", 2)
    assert frontier.outstanding() == 2 * (PARTITIONS - 1)

    owned = {p: 1 for p in range(PARTITIONS)} | {2: 2}
    result = frontier.pop_many(owned, "w", count_per_partition=1)
    assert result.not_owned == [0]
    assert result.empty == [1]
    assert result.busy == [2]
    regular = [p for p in range(PARTITIONS) if p not in (0, 1, 2)]
    assert [(x.partition, x.id, x.deliveries) for x in result.leased] == [
        (p, ids[p]["high"], 1) for p in regular
    ]
    masters = {cluster_client.get_node_from_key(frontier.keys(p).levels).port for p in regular}
    assert masters == {n.port for n in cluster_client.get_primaries()}
    assert frontier.outstanding() == 2 * (PARTITIONS - 1)  # leased still counts

    acked, nacked = regular[::2], regular[1::2]
    assert frontier.ack_many({p: [ids[p]["high"]] for p in acked}) == len(acked)
    assert frontier.nack_many({p: [ids[p]["high"], "no-such-id"] for p in nacked}) == len(nacked)
    assert frontier.nack_many({p: [ids[p]["high"]] for p in nacked}) == 0  # idempotent
    assert frontier.outstanding() == 2 * (PARTITIONS - 1) - len(acked)

    # The previous owner's ack releases the hand-over of partition 2.
    assert frontier.ack_many({2: [old.id]}) == 1
    again = frontier.pop_many(owned, "w", count_per_partition=1)
    assert (again.not_owned, again.empty, again.busy) == ([0], [1], [])
    got = {x.partition: (x.id, x.deliveries) for x in again.leased}
    assert got == {
        2: (ids[2]["low"], 1),
        **{p: (ids[p]["low"], 1) for p in acked},
        **{p: (ids[p]["high"], 1) for p in nacked},  # back in place, the nacked pop not counted
    }
    assert frontier.ack_many({p: [got[p][0]] for p in got}) == len(got)
    # Left: both requests of the fenced partition 0, the low one of each nacked partition.
    assert frontier.outstanding() == 2 + len(nacked)
    assert all(frontier.leased(p) == 0 for p in range(PARTITIONS))


def test_concurrent_bloom_enqueuers_queue_every_url_once_on_cluster(
    redis_cluster: RedisClusterServer, cluster_client: RedisCluster
) -> None:
    """Three workers, each with its own cluster client, enqueue the same 20,000 URLs at once.

    Dedup and enqueue are one script on the partition's slot (the Bloom bit
    array shares the partition's hash tag), so exactly 20,000 are queued.
    """
    fps = [hashlib.sha1(f"race-{i}".encode()).hexdigest() for i in range(20_000)]
    added: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)
    dedup = "bloom"

    def enqueuer(seed: int) -> None:
        own = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in redis_cluster.startup_nodes]
        )
        try:
            frontier = RedisFrontier(
                own,  # type: ignore[arg-type]  # typed for redis.Redis; duck-typed here
                prefix="c", partitions=PARTITIONS, dedup=dedup, dedup_capacity=1_000_000,
            )  # fmt: skip
            order = list(fps)
            random.Random(seed).shuffle(order)
            barrier.wait()
            n = 0
            for i in range(0, len(order), 1000):
                ops = [EnqueueOp(int(fp[:4], 16) % PARTITIONS, fp, "{}")
                       for fp in order[i : i + 1000]]  # fmt: skip
                n += sum(r is not None for r in frontier.enqueue_many(ops))
            added.append(n)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=enqueuer, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(added) == 20_000
    frontier = RedisFrontier(
        cluster_client,  # type: ignore[arg-type]
        prefix="c", partitions=PARTITIONS, dedup=dedup,
    )  # fmt: skip
    assert sum(frontier.queued(p) for p in range(PARTITIONS)) == 20_000
    assert not frontier.enqueuer.native_bloom()
    blooms = [frontier.keys(p).bloom for p in range(PARTITIONS)]
    assert all(cluster_client.exists(key) for key in blooms)
    assert not any(cluster_client.exists(frontier.keys(p).seen) for p in range(PARTITIONS))
