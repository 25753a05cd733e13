"""Real fleets: several ``scrapy crawl`` worker processes, one real redis-server, the farm.

Every test asserts on what the farm served (each URL's fetch count, the most
requests one host ever had in flight) and on the workers' stats, after faults
injected at a seeded random moment: a worker killed with SIGKILL, Redis
killed and restarted, Redis paused (``CLIENT PAUSE``) or blocked (``DEBUG
SLEEP``).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import farm_fixture

from scrapy_banker.core.ops import LeaseToken
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisClusterServer, RedisServer

PER_HOST = 2
PARTITIONS = 64
SCHEDULER = "scrapy_banker.redis.scheduler.BankerRedisScheduler"

pytestmark = pytest.mark.timeout(240)


# ~2,000 pages on 40 hosts, 40 ms each: a 3-worker crawl lasts a few seconds,
# long enough to hit it with a fault in the middle.
farm = farm_fixture(FarmConfig(seed=11, hosts=40, total_pages=2000, latency_ms=40.0))


def _settings(server: RedisServer | str, node: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": SCHEDULER,
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server if isinstance(server, str) else server.url,
        "REDIS_PARAMS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": PARTITIONS,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 1.5,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_REDIS_NODE_TIMEOUT": 3.0,
        "BANKER_REDIS_LEASE_TTL": 3.0,
        "BANKER_REDIS_REAP_INTERVAL": 1.0,
        "BANKER_REDIS_RETRIES": 2,
        "BANKER_REDIS_BACKOFF_CAP": 0.5,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        **extra,
    }


def _fleet(
    farm: WebFarm, server: RedisServer, tmp: Path, n: int, **extra: Any
) -> list[FleetWorker]:
    farm.reset()
    seeds = farm.start_urls()
    return [
        FleetWorker(f"w{i}", tmp, {"settings": _settings(server, f"w{i}", **extra), "seeds": seeds})
        for i in range(n)
    ]


def _wait(workers: list[FleetWorker], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    for w in workers:
        code = w.wait(max(1.0, deadline - time.monotonic()))
        assert code == 0, f"worker {w.name} exited with {code}:\n{w.log_tail()}"


def _progress(farm: WebFarm) -> int:
    return int(farm.stats()["requests"])


def _wait_for_progress(farm: WebFarm, fraction: float, workers: list[FleetWorker]) -> None:
    target = int(len(farm.expected_urls()) * fraction)
    deadline = time.monotonic() + 120
    while _progress(farm) < target:
        assert time.monotonic() < deadline, "the crawl made no progress"
        assert all(w.proc.poll() is None for w in workers), "a worker ended early"
        time.sleep(0.02)


def _outcome(farm: WebFarm) -> tuple[set[str], set[str], int, int]:
    stats = farm.stats(urls=True)
    fetches: dict[str, int] = stats["fetches"]
    expected = farm.expected_urls()
    duplicates = sum(n - 1 for n in fetches.values() if n > 1)
    return expected, set(fetches), duplicates, max(stats["max_inflight_per_host"].values())


@pytest.mark.slow
@pytest.mark.scrapy213
def test_three_workers_crawl_the_farm_once_politely(
    farm: WebFarm, redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    workers = _fleet(farm, redis_server, tmp_path, 3)
    _wait(workers)
    expected, fetched, duplicates, max_inflight = _outcome(farm)
    assert fetched == expected
    assert duplicates == 0
    # One owner per partition, so Scrapy's per-domain limit holds fleet-wide.
    assert max_inflight <= PER_HOST
    stats = [w.stats() for w in workers]
    responses = [s.get("response_received_count", 0) for s in stats]
    assert sum(responses) == len(expected)
    assert all(r > 0 for r in responses), f"some worker did nothing: {responses}"
    for s in stats:
        assert s["finish_reason"] == "finished"
        assert s["banker/redis/acked"] == s["response_received_count"]
        assert s.get("banker/redis/malformed", 0) == 0
    assert sum(s["banker/redis/enqueued"] for s in stats) == len(expected)
    # Everything acked: nothing left queued or leased in Redis.
    frontier = RedisFrontier(redis_client, prefix="banker:fleet", partitions=PARTITIONS)
    assert frontier.outstanding() == 0


@pytest.mark.slow
@pytest.mark.scrapy213
def test_a_fleet_of_plain_spiders_notices_the_end_of_the_crawl_at_once(
    farm: WebFarm, redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    # The default BANKER_REDIS_IDLE_BEFORE_CLOSE: no quiet period, the drain check is exact.
    workers = _fleet(farm, redis_server, tmp_path, 3, BANKER_REDIS_IDLE_BEFORE_CLOSE=0.0)
    # Every worker closes once the crawl is drained: the last ack, a drain
    # check, Scrapy's close and the process exit.
    _wait(workers)
    expected, fetched, duplicates, max_inflight = _outcome(farm)
    assert fetched == expected and duplicates == 0 and max_inflight <= PER_HOST
    stats = [w.stats() for w in workers]
    assert all(s["finish_reason"] == "finished" for s in stats)
    assert sum(s["banker/redis/acked"] for s in stats) == len(expected)
    assert sum(s.get("banker/redis/drain_checks", 0) for s in stats) >= 3
    frontier = RedisFrontier(redis_client, prefix="banker:fleet", partitions=PARTITIONS)
    assert frontier.census().drained


@pytest.mark.slow
@pytest.mark.scrapy213
def test_an_idle_worker_takes_over_work_waiting_for_a_saturated_one(
    redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    # Many hosts of equal size: a worker fetching 8 hosts at a time (16
    # requests, 2 per host) leaves most of its hosts' work waiting.
    config = FarmConfig(seed=5, hosts=60, total_pages=1500, zipf_s=0.0, latency_ms=40.0)
    with WebFarm(config) as farm:
        seeds = farm.start_urls()
        # The first worker gets every partition but one by its capacity; the
        # second would sit idle with its one partition if it could not steal.
        big = FleetWorker(
            "big", tmp_path, {"settings": _settings(redis_server, "big"), "seeds": seeds}
        )
        small = FleetWorker(
            "small",
            tmp_path,
            {"settings": _settings(redis_server, "small", BANKER_REDIS_NODE_CAPACITY=0.01),
             "seeds": seeds},
        )  # fmt: skip
        _wait([big, small])
        expected, fetched, duplicates, max_inflight = _outcome(farm)
    assert fetched == expected and duplicates == 0
    assert max_inflight <= PER_HOST  # taking over a partition never overlaps its host
    stats = {w.name: w.stats() for w in (big, small)}
    assert stats["small"].get("banker/redis/steals", 0) >= 1
    assert stats["small"]["banker/redis/partitions_stolen"] >= 1
    # It crawled a real share, far beyond its own partition.
    assert stats["small"]["response_received_count"] > len(expected) // 5
    assert all(s["finish_reason"] == "finished" for s in stats.values())


@pytest.mark.slow
@pytest.mark.fleetfaults
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_a_worker_loses_nothing(
    farm: WebFarm, redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis, seed: int
) -> None:
    rng = random.Random(seed)
    workers = _fleet(farm, redis_server, tmp_path, 3)
    victim = workers[rng.randrange(3)]
    _wait_for_progress(farm, rng.uniform(0.15, 0.6), workers)
    frontier = RedisFrontier(redis_client, prefix="banker:fleet", partitions=PARTITIONS)
    registry = NodeRegistry(redis_client, frontier)
    owned = registry.owned(victim.name)
    victim.kill()
    # Everything the victim held at the kill: buffered or in flight, unacked.
    held = sum(frontier.leased(p) for p in owned)
    survivors = [w for w in workers if w is not victim]
    _wait(survivors)
    expected, fetched, duplicates, _ = _outcome(farm)
    assert fetched == expected, f"lost {len(expected - fetched)} pages (seed {seed})"
    assert duplicates <= held, f"{duplicates} duplicates but the victim held {held} leases"
    stats = [w.stats() for w in survivors]
    assert sum(s.get("banker/redis/reaped", 0) for s in stats) >= 1 or held == 0
    assert all(s["finish_reason"] == "finished" for s in stats)
    assert frontier.outstanding() == 0


def _fault_test(
    farm: WebFarm,
    tmp_path: Path,
    fault: Callable[[RedisServer], None],
    *,
    server_args: list[str] | None = None,
) -> list[dict[str, Any]]:
    with RedisServer(extra_args=server_args) as server:
        # Leases outlive the outage: no request is handed to a second worker.
        workers = _fleet(farm, server, tmp_path, 2, BANKER_REDIS_LEASE_TTL=10.0)
        _wait_for_progress(farm, 0.3, workers)
        fault(server)
        _wait(workers)
        expected, fetched, duplicates, max_inflight = _outcome(farm)
        assert fetched == expected, f"lost {len(expected - fetched)} pages"
        client = redis.Redis.from_url(server.url)
        frontier = RedisFrontier(client, prefix="banker:fleet", partitions=PARTITIONS)
        assert frontier.outstanding() == 0
        client.close()
        assert duplicates == 0
        assert max_inflight <= PER_HOST
        return [w.stats() for w in workers]


@pytest.mark.slow
@pytest.mark.fleetfaults
def test_redis_killed_and_restarted_mid_crawl(farm: WebFarm, tmp_path: Path) -> None:
    def restart(server: RedisServer) -> None:
        server.kill()
        time.sleep(2.0)
        server.start()

    # Durable Redis (AOF, fsync always): a restart keeps what it acknowledged.
    stats = _fault_test(
        farm, tmp_path, restart, server_args=["--appendonly", "yes", "--appendfsync", "always"]
    )
    assert sum(s.get("banker/redis/errors", 0) for s in stats) >= 1
    assert all(s["finish_reason"] == "finished" for s in stats)


@pytest.mark.slow
@pytest.mark.fleetfaults
def test_client_pause_mid_crawl(farm: WebFarm, tmp_path: Path) -> None:
    def pause(server: RedisServer) -> None:
        client = redis.Redis.from_url(server.url)
        client.execute_command("CLIENT", "PAUSE", 3000, "ALL")
        client.close()

    stats = _fault_test(farm, tmp_path, pause)
    assert all(s["finish_reason"] == "finished" for s in stats)


@pytest.mark.slow
@pytest.mark.fleetfaults
def test_debug_sleep_mid_crawl(farm: WebFarm, tmp_path: Path) -> None:
    blocked: list[float] = []

    def sleep(server: RedisServer) -> None:
        client = redis.Redis.from_url(server.url, socket_timeout=30)
        t0 = time.monotonic()
        client.execute_command("DEBUG", "SLEEP", 4)  # the server blocks for 4 s
        blocked.append(time.monotonic() - t0)
        client.close()

    # The workers' 2 s socket timeouts fire during the stall; redis-py's Retry
    # or the worker's own backoff rides it out.
    stats = _fault_test(farm, tmp_path, sleep)
    assert blocked and blocked[0] >= 3.5
    assert all(s["finish_reason"] == "finished" for s in stats)


@pytest.mark.slow
def test_malicious_pickle_in_the_queue_is_never_executed(
    farm: WebFarm, redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    marker = tmp_path / "pwned"
    # What scrapy-redis would unpickle: os.system("touch <marker>").
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    frontier = RedisFrontier(redis_client, prefix="banker:fleet", partitions=PARTITIONS)
    for p in (0, 1, 2):
        frontier.enqueue(p, f"evil-{p}", evil.decode("latin-1"), priority=100)
    # A JSON payload naming a class outside the allow-list, and ones whose
    # callback names no method of the spider: refused as well, each with its reason.
    frontier.enqueue(
        3,
        "evil-cls",
        json.dumps({"_class": "subprocess.Popen", "url": "http://x.farm.test/", "args": ["id"]}),
        100,
    )
    callbacks = {4: ("_missing", "missing"), 5: ("__init__", "dunder"),
                 6: ("crawler.engine.close_spider", "single identifier"),
                 7: ("from_crawler", "classmethod")}  # fmt: skip
    for p, (callback, _) in callbacks.items():
        payload = {"url": farm.url(0, f"/{p}"), "callback": callback, "method": "GET"}
        frontier.enqueue(p, f"evil-cb-{p}", json.dumps(payload), 100)
    workers = _fleet(farm, redis_server, tmp_path, 1)
    # _fleet() resets the farm only: the planted payloads are still queued.
    _wait(workers)
    assert not marker.exists()
    (stats,) = [w.stats() for w in workers]
    assert stats["banker/redis/malformed"] == 8
    assert stats["banker/redis/dead_lettered"] == 8
    dead = [d for p in range(8) for d in frontier.dead_letters(p)]
    assert len(dead) == 8
    assert all(d["reason"].startswith("malformed") for d in dead)
    for p, (_, why) in callbacks.items():
        (letter,) = frontier.dead_letters(p)
        assert why in letter["reason"], letter
    expected, fetched, _, _ = _outcome(farm)
    assert fetched == expected  # the crawl itself went on


def _seed_redis_spider(client: redis.Redis, farm: WebFarm) -> None:
    # scrapy-redis 0.9's JSON start-URL format.
    client.rpush("fleet:start_urls", *[json.dumps({"url": u}) for u in farm.start_urls()])


_REDIS_SPIDER = {
    "MAX_IDLE_TIME_BEFORE_CLOSE": 2,  # scrapy-redis: close after 2 s without start URLs
    "REDIS_START_URLS_BATCH_SIZE": 1000,
    "BANKER_REDIS_IDLE_BEFORE_CLOSE": 0.5,
}


@pytest.mark.slow
@pytest.mark.scrapy213
def test_redis_spider_start_urls_feed_the_fleet(
    farm: WebFarm, redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    farm.reset()
    _seed_redis_spider(redis_client, farm)
    workers = [
        FleetWorker(
            f"w{i}",
            tmp_path,
            {"spider": "redis", "settings": _settings(redis_server, f"w{i}", **_REDIS_SPIDER)},
        )
        for i in range(2)
    ]
    _wait(workers)
    expected, fetched, _, max_inflight = _outcome(farm)
    assert fetched == expected
    # scrapy-redis makes start URLs dont_filter=True; as in Scrapy, such a
    # request is not recorded as seen, so a root page linked again is fetched
    # once more.  Nothing else is fetched twice.
    fetches = farm.stats(urls=True)["fetches"]
    twice = {u for u, n in fetches.items() if n > 1}
    assert twice <= set(farm.start_urls())
    assert all(fetches[u] == 2 for u in twice)
    assert max_inflight <= PER_HOST
    assert redis_client.llen("fleet:start_urls") == 0
    stats = [w.stats() for w in workers]
    assert sum(s.get("response_received_count", 0) for s in stats) == sum(fetches.values())


@pytest.mark.slow
@pytest.mark.scrapy213
def test_scrapy_redis_stats_collector_records_banker_stats(
    redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    # scrapy-redis's collector makes every stats call a Redis round trip on the
    # reactor thread: a small farm keeps this test short.
    with WebFarm(FarmConfig(seed=2, hosts=4, total_pages=120, latency_ms=5.0)) as small:
        _seed_redis_spider(redis_client, small)
        settings = _settings(
            redis_server,
            "solo",
            STATS_CLASS="scrapy_redis.stats.RedisStatsCollector",
            SCHEDULER_PERSIST=True,  # keep the stats hash after the crawl
            **_REDIS_SPIDER,
        )
        worker = FleetWorker("solo", tmp_path, {"spider": "redis", "settings": settings})
        _wait([worker])
        expected, fetched, _, _ = _outcome(small)
        served = sum(small.stats(urls=True)["fetches"].values())
    assert fetched == expected
    stored = {k.decode(): v.decode() for k, v in redis_client.hgetall("fleet:stats").items()}
    assert int(stored["banker/redis/acked"]) == served
    assert int(stored["response_received_count"]) == served
    assert stored["banker/redis/node"] == "solo"


@pytest.mark.slow
@pytest.mark.fleetfaults
def test_two_workers_on_a_real_redis_cluster(farm: WebFarm, tmp_path: Path) -> None:
    with RedisClusterServer() as cluster:
        farm.reset()
        seeds = farm.start_urls()
        workers = []
        for i in range(2):
            settings = _settings(cluster.url, f"w{i}", BANKER_REDIS_CLUSTER=True)
            workers.append(FleetWorker(f"w{i}", tmp_path, {"settings": settings, "seeds": seeds}))
        _wait(workers)
        expected, fetched, duplicates, max_inflight = _outcome(farm)
        assert fetched == expected
        assert duplicates == 0
        assert max_inflight <= PER_HOST
        stats = [w.stats() for w in workers]
        assert all(s.get("banker/redis/errors", 0) == 0 for s in stats)
        assert sum(s["banker/redis/acked"] for s in stats) == len(expected)


@pytest.mark.parametrize(
    "value",
    ["3|fp:1#2", "x|id#1", "99999|id#1", "3|", "no-bar", 42, None,
     LeaseToken(PARTITIONS, "id", 1), LeaseToken(-1, "id", 1)],
)  # fmt: skip
def test_a_hand_written_lease_meta_is_ignored(value: object) -> None:
    """Only a lease token this store wrote, for a partition of this crawl, is a lease."""
    from scrapy import Request
    from scrapy.utils.test import get_crawler

    from scrapy_banker.redis.scheduler import META_LEASE, BankerRedisScheduler
    from scrapy_banker.redis.store import RedisLeaseStore
    from scrapy_banker.redis.store.inbound import lease_of

    crawler = get_crawler(settings_dict={"BANKER_REDIS_PARTITIONS": PARTITIONS})
    scheduler = BankerRedisScheduler.from_crawler(crawler)
    assert isinstance(scheduler, BankerRedisScheduler)
    assert isinstance(scheduler.store, RedisLeaseStore)
    assert lease_of(Request("http://a.test/", meta={META_LEASE: value}), PARTITIONS) is None
    good = LeaseToken(3, "fp:1", 2)
    assert lease_of(Request("http://a.test/", meta={META_LEASE: good}), PARTITIONS) == good


@pytest.mark.parametrize(
    ("download_timeout", "node_timeout", "lock_ms"),
    [(180.0, 6.0, 6000), (180.0, 30.0, 30_000), (0.5, 30.0, 5500)],
)
def test_a_robots_txt_lock_is_held_no_longer_than_a_dead_worker_is_waited_for(
    download_timeout: float, node_timeout: float, lock_ms: int
) -> None:
    """A worker SIGKILLed while it fetches a robots.txt leaves the fleet's lock behind:
    the host's new owner waits for it, so it must not outlive the node timeout."""
    from scrapy.utils.test import get_crawler

    from scrapy_banker.redis.scheduler import BankerRedisScheduler

    crawler = get_crawler(settings_dict={
        "BANKER_REDIS_PARTITIONS": PARTITIONS, "DOWNLOAD_TIMEOUT": download_timeout,
        "BANKER_REDIS_NODE_TIMEOUT": node_timeout, "BANKER_REDIS_HEARTBEAT": 1.0,
    })  # fmt: skip
    scheduler = BankerRedisScheduler.from_crawler(crawler)
    assert scheduler.store.robots_cache.lock_ms == lock_ms
