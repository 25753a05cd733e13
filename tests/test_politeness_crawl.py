"""Politeness in real crawls: Crawl-delay on one node, and a fleet that keeps it through faults.

Real ``CrawlerProcess`` workers against the web farm's pushing-back hosts
and a real redis-server; every assertion is on what the farm counted
(requests refused, requests sent before an announced ``Retry-After`` ran
out, gaps shorter than a host's ``Crawl-delay``, robots.txt fetches per
host, the most requests one host had in flight) and on the workers' stats.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_python

from scrapy_banker.testing.farm import FarmConfig, RateLimit, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PER_HOST = 2
SCHEDULER = "scrapy_banker.redis.scheduler.BankerRedisScheduler"

#: 10 hosts (14-106 pages each): 7-9 serve 2 requests per second and answer
#: 429 with Retry-After above that (delta-seconds, then an HTTP date); 5 and 6
#: declare a Crawl-delay of 0.25 s in robots.txt; the others are plain.
PUSHING = FarmConfig(
    seed=5,
    hosts=10,
    total_pages=300,
    latency_ms=20.0,
    rate_limits={
        7: RateLimit(requests=2, window_s=1.0),
        8: RateLimit(requests=2, window_s=1.0),
        9: RateLimit(requests=2, window_s=1.0, retry_after="date"),
    },
    crawl_delays={5: 0.25, 6: 0.25},
)


def _fleet_settings(server: RedisServer, node: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": SCHEDULER,
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server.url,
        "ROBOTSTXT_OBEY": True,
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": 32,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 2.0,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_REDIS_NODE_TIMEOUT": 2.0,
        "BANKER_REDIS_LEASE_TTL": 2.0,
        "BANKER_REDIS_REAP_INTERVAL": 0.5,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        # Each request names its node, so the farm can say which node a
        # Retry-After period was announced to and which one broke it.
        "DOWNLOADER_MIDDLEWARES": {"scrapy_banker.testing.wan.NodeHeaderMiddleware": 990},
        **extra,
    }


#: How long after a 429 leaves the host its Retry-After can still be unknown to
#: the rest of the fleet: the answer is read and handled, the state published
#: before the next acks and nacks, and the worker thread writes it with its
#: next batch.  A ``kill -9`` in that window loses the period with the worker.
UNPUBLISHED_S = 0.5


def _worker(
    name: str, tmp: Path, server: RedisServer, seeds: list[str], **extra: Any
) -> FleetWorker:
    spec = {"settings": _fleet_settings(server, name, **extra), "seeds": seeds}
    return FleetWorker(name, tmp, spec)


def _wait_for(farm: WebFarm, requests: int, workers: list[FleetWorker]) -> None:
    deadline = time.monotonic() + 90
    while farm.stats()["requests"] < requests:
        assert time.monotonic() < deadline, "the crawl made no progress"
        assert all(w.proc.poll() is None for w in workers), "a worker ended early"
        time.sleep(0.05)


def _finish(workers: list[FleetWorker], timeout: float = 150.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    for w in workers:
        code = w.wait(max(1.0, deadline - time.monotonic()))
        assert code == 0, f"worker {w.name} exited with {code}:\n{w.log_tail()}"
    return [w.stats() for w in workers]


def _served(farm: WebFarm) -> tuple[set[str], dict[str, Any]]:
    """The pages served at least once with a real answer (not only refused), and the stats."""
    stats = farm.stats(urls=True)
    refused: dict[str, int] = stats["refused_urls"]
    fetches: dict[str, int] = stats["fetches"]
    served = {
        u for u, n in fetches.items() if n > refused.get(u, 0) and not u.endswith("/robots.txt")
    }
    return served, stats


def _total(stats: list[dict[str, Any]], key: str) -> int:
    return sum(int(s.get(key, 0)) for s in stats)


def test_a_fleet_keeps_retry_after_and_crawl_delay_through_a_kill_and_a_join(
    tmp_path: Path,
) -> None:
    with WebFarm(PUSHING) as farm, RedisServer() as server:
        seeds = farm.start_urls()
        expected = farm.expected_urls()
        workers = [_worker(f"w{i}", tmp_path, server, seeds) for i in range(2)]
        # Past the robots.txt of every host and into the rate limits: kill one
        # worker (its partitions, the blocked hosts among them, move to the
        # other), then a third joins (partitions move to it).
        _wait_for(farm, len(expected) // 4, workers)
        killed_at = time.time()
        workers[0].kill()
        time.sleep(1.0)
        joiner = _worker("w2", tmp_path, server, seeds)
        stats = _finish([workers[1], joiner])
        served, farm_stats = _served(farm)
    assert served == expected, f"lost {len(expected - served)} pages"
    assert farm_stats["refused"] > 0  # the rate limits were reached...
    # ...and their Retry-After always kept, as every Crawl-delay -- but for a
    # period the killed worker was told of in its last moments (a 429 still on
    # the wire or not yet published): no other worker could know it.
    assert set(farm_stats["per_node"]) == {"w0", "w1", "w2"}  # every request named its node
    events = [e for e in farm_stats["violations"] if e["kind"] == "retry_after"]
    assert len(events) == farm_stats["retry_after_violations"]  # every one is reported
    lost = [
        e for e in events
        if e["announced_to"] == "w0" and e["announced_wall"] >= killed_at - UNPUBLISHED_S
    ]  # fmt: skip
    assert [e for e in events if e not in lost] == []
    # At most one such period per rate-limited host.
    assert len({(e["host"], e["announced_wall"]) for e in lost}) <= 3, lost
    assert farm_stats["retry_after_races"] <= 5  # on the wire as the 429 was read
    assert farm_stats["crawl_delay_violations"] == 0, farm_stats["violations"]
    assert max(farm_stats["max_inflight_per_host"].values()) <= PER_HOST
    # robots.txt once per host for the whole fleet, the kill and the join included.
    robots = farm_stats["robots_fetches_per_host"]
    assert len(robots) == PUSHING.hosts and set(robots.values()) == {1}, robots
    assert stats[1]["banker/robots/cache_hits"] >= 1  # the joiner read what others fetched
    # The host states travelled: written by owners, read by the new ones.
    assert _total(stats, "banker/redis/host_states_written") >= 1
    assert _total(stats, "banker/redis/host_states_adopted") >= 1
    assert _total(stats, "banker/pushback/requeued") >= 1
    assert _total(stats, "retry/count") == 0
    assert all(s["finish_reason"] == "finished" for s in stats)


def test_the_lease_fence_gives_back_what_a_frozen_worker_had_in_its_download_slots(
    tmp_path: Path,
) -> None:
    config = FarmConfig(seed=9, hosts=8, total_pages=120, latency_ms=20.0)
    # DOWNLOAD_DELAY keeps a request of each busy host waiting in its download
    # slot's queue, past the scheduler's dispatch check.
    extra = {"DOWNLOAD_DELAY": 0.3, "RANDOMIZE_DOWNLOAD_DELAY": False, "ROBOTSTXT_OBEY": False}
    with WebFarm(config) as farm, RedisServer() as server:
        seeds = farm.start_urls()
        expected = farm.expected_urls()
        workers = [_worker(f"w{i}", tmp_path, server, seeds, **extra) for i in range(2)]
        _wait_for(farm, len(expected) // 5, workers)
        frozen = workers[0]
        frozen.proc.send_signal(signal.SIGSTOP)
        # Past its node timeout and lease TTL: the other worker takes its
        # partitions over and fetches their hosts.
        time.sleep(5.0)
        frozen.proc.send_signal(signal.SIGCONT)
        stats = _finish(workers)
        served, farm_stats = _served(farm)
    assert served == expected, f"lost {len(expected - served)} pages"
    # What waited in the frozen worker's slots was given back, not sent...
    assert stats[0]["banker/redis/fenced_at_send"] >= 1, frozen.log_tail()
    # ...so the per-host limit held when it woke up.
    assert max(farm_stats["max_inflight_per_host"].values()) <= PER_HOST
    assert all(s["finish_reason"] == "finished" for s in stats)


ONE_NODE = """
import json, sys
from scrapy.crawler import CrawlerProcess
from scrapy_banker.testing.fleet import FleetSpider
from scrapy_banker.testing.resolver import farm_settings

seeds, extra = json.loads(sys.argv[1]), json.loads(sys.argv[2])
process = CrawlerProcess({**farm_settings(), "LOG_LEVEL": "INFO", "ROBOTSTXT_OBEY": True,
                          "CONCURRENT_REQUESTS_PER_DOMAIN": 4, **extra})
crawler = process.create_crawler(FleetSpider)
process.crawl(crawler, seeds=seeds)
process.start()
print("STATS " + json.dumps({k: v for k, v in crawler.stats.get_stats().items()
                             if isinstance(v, (int, float, str))}))
"""


@pytest.mark.scrapy213
@pytest.mark.parametrize("banker", [True, False], ids=["banker", "scrapy_default"])
def test_one_node_applies_crawl_delay_where_scrapy_does_not(tmp_path: Path, banker: bool) -> None:
    import json

    config = FarmConfig(seed=4, hosts=3, total_pages=45, latency_ms=10.0, crawl_delays={0: 0.25})
    script = tmp_path / "crawl.py"
    script.write_text(ONE_NODE)
    extra = {"ADDONS": {"scrapy_banker.Addon": 500}} if banker else {}
    with WebFarm(config) as farm:
        seeds = farm.start_urls()
        proc = run_python(script, json.dumps(seeds), json.dumps(extra), timeout=120)
        served, farm_stats = _served(farm)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STATS "))
    stats = json.loads(line[len("STATS ") :])
    assert served == farm.expected_urls()
    assert set(farm_stats["robots_fetches_per_host"].values()) == {1}
    if not banker:
        # The control: Scrapy parses Crawl-delay but nothing applies it.
        assert farm_stats["crawl_delay_violations"] > 0
        return
    assert farm_stats["crawl_delay_violations"] == 0
    assert stats["banker/robots/crawl_delay_hosts"] == 1
