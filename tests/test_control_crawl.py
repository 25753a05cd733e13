"""Budgets and run-time control in real crawls (issue #27).

Real worker processes (``scrapy_banker.testing.fleet``) against the web farm
and a real redis-server; the operator's actions go through the real
``scrapy banker`` command line.  Every assertion is on what the farm served
(distinct pages per host, when each request arrived) and on the workers' stats.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCHEDULER = "scrapy_banker.redis.scheduler.BankerRedisScheduler"
PREFIX = "banker:fleet"
HEARTBEAT_S = 0.5


def _settings(server: RedisServer, node: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": SCHEDULER,
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server.url,
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": 32,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 2.0,
        "BANKER_REDIS_HEARTBEAT": HEARTBEAT_S,
        "BANKER_REDIS_NODE_TIMEOUT": 2.0,
        "BANKER_REDIS_LEASE_TTL": 2.0,
        "BANKER_REDIS_REAP_INTERVAL": 0.5,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        **extra,
    }


_STARTED: list[FleetWorker] = []


@pytest.fixture(autouse=True)
def _no_worker_left() -> Iterator[None]:
    """A test that fails mid-crawl leaves no worker process behind."""
    yield
    while _STARTED:
        w = _STARTED.pop()
        if w.proc.poll() is None:
            w.kill()


def _worker(
    name: str, tmp: Path, server: RedisServer, seeds: list[str], **extra: Any
) -> FleetWorker:
    worker = FleetWorker(name, tmp, {"settings": _settings(server, name, **extra), "seeds": seeds})
    _STARTED.append(worker)
    return worker


def _finish(workers: list[FleetWorker], timeout: float = 150.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    for w in workers:
        code = w.wait(max(1.0, deadline - time.monotonic()))
        assert code == 0, f"worker {w.name} exited with {code}:\n{w.log_tail()}"
    return [w.stats() for w in workers]


def _wait(what: Any, workers: list[FleetWorker], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "the crawl made no progress"
        assert all(w.proc.poll() is None for w in workers), "a worker ended early"
        time.sleep(0.05)


def _pages_by_host(farm: WebFarm) -> dict[str, set[str]]:
    """Distinct pages each host served (any answer: a page fetched is a page fetched)."""
    out: dict[str, set[str]] = {}
    for url in farm.stats(urls=True)["fetches"]:
        if not url.endswith("/robots.txt"):
            out.setdefault(urlsplit(url).hostname or "", set()).add(url)
    return out


def _expected_by_host(farm: WebFarm) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for url in farm.expected_urls():
        out.setdefault(urlsplit(url).hostname or "", set()).add(url)
    return out


def _total(stats: list[dict[str, Any]], key: str) -> int:
    return sum(int(s.get(key, 0)) for s in stats)


def banker(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy banker ARGS`` against the fleet, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "banker", *args,
         "--prefix", PREFIX, "-s", f"REDIS_URL={server.url}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


FARM = FarmConfig(seed=11, hosts=8, total_pages=320, latency_ms=40.0)


def test_host_budgets_hold_exactly_through_a_kill_and_a_join(tmp_path: Path) -> None:
    with WebFarm(FARM) as farm, RedisServer() as server:
        expected = _expected_by_host(farm)
        big = sorted(expected, key=lambda h: -len(expected[h]))
        budgets = {big[0]: 7, big[1]: 12}
        extra = {"BANKER_HOST_BUDGETS": budgets}
        seeds = farm.start_urls()
        workers = [_worker(f"w{i}", tmp_path, server, seeds, **extra) for i in range(2)]
        _wait(lambda: farm.stats()["requests"] >= 60, workers)
        workers[0].kill()
        joiner = _worker("w2", tmp_path, server, seeds, **extra)
        stats = _finish([workers[1], joiner])
        served = _pages_by_host(farm)
        # What is over budget is kept and visible: status counts it, explain says so.
        partitions = ("-s", "BANKER_REDIS_PARTITIONS=32")
        status = banker(server, "status", "--json", *partitions)
        assert status.returncode == 0, status.stderr
        held = json.loads(status.stdout)["totals"]["over_budget"]
        left = sorted(expected[big[0]] - served[big[0]])
        explained = banker(server, "explain", left[0], "--json", *partitions)
        assert explained.returncode == 0, explained.stderr
        why = json.loads(explained.stdout)
    for host, pages in expected.items():
        budget = budgets.get(host)
        if budget is None:
            assert served.get(host) == pages, f"{host}: lost {len(pages - served.get(host, set()))}"
        else:
            # Exactly the budget: no page beyond it, none short of it while work remained.
            assert len(served[host]) == budget, (host, len(served[host]), budget)
    assert _total(stats, "banker/budget/held") >= 1
    assert held >= 1
    assert why["state"] == "over budget" and "over budget" in why["waiting"], why


ONE_NODE = """
import json, sys
from scrapy.crawler import CrawlerProcess
from scrapy_banker.testing.fleet import FleetSpider
from scrapy_banker.testing.resolver import farm_settings

seeds, extra = json.loads(sys.argv[1]), json.loads(sys.argv[2])
process = CrawlerProcess({**farm_settings(), "LOG_LEVEL": "INFO",
                          "ADDONS": {"scrapy_banker.Addon": 500}, **extra})
crawler = process.create_crawler(FleetSpider)
process.crawl(crawler, seeds=seeds)
process.start()
print("STATS " + json.dumps({k: v for k, v in crawler.stats.get_stats().items()
                             if isinstance(v, (int, float, str))}))
"""


@pytest.mark.scrapy213
def test_one_node_keeps_host_topic_and_crawl_budgets_across_a_stop_and_resume(
    tmp_path: Path,
) -> None:
    from conftest import run_python

    script = tmp_path / "crawl.py"
    script.write_text(ONE_NODE)
    with WebFarm(FARM) as farm:
        expected = _expected_by_host(farm)
        # The second and third largest hosts: the largest links to the others.
        big = sorted(expected, key=lambda h: -len(expected[h]))
        budgets = {big[1]: 4, big[2]: 9}
        extra: dict[str, Any] = {
            "JOBDIR": str(tmp_path / "job"),
            "BANKER_HOST_BUDGETS": budgets,
            "BANKER_CRAWL_BUDGET": 80,
        }
        seeds = json.dumps(farm.start_urls())
        # A clean stop after 30 pages (Scrapy's own CLOSESPIDER_PAGECOUNT), then the resume.
        first = run_python(
            script, seeds, json.dumps({**extra, "CLOSESPIDER_PAGECOUNT": 30}), timeout=120
        )
        second = run_python(script, seeds, json.dumps(extra), timeout=120)
        served = _pages_by_host(farm)
    stats = [
        json.loads(next(x for x in p.stdout.splitlines() if x.startswith("STATS "))[6:])
        for p in (first, second)
    ]
    assert stats[0]["finish_reason"] == "closespider_pagecount"
    for host, budget in budgets.items():
        assert len(served[host]) == budget, (host, len(served[host]), budget)
    # The crawl budget holds over both runs: no more pages than it, and all of it spent.
    assert sum(len(pages) for pages in served.values()) == 80
    assert stats[1].get("banker/budget/held", 0) >= 1
    assert stats[1]["banker/budget/held_at_close"] >= 1
    assert stats[1]["finish_reason"] == "banker_crawl_budget"  # what is left is held, counted


def test_pause_limit_delay_purge_inject_and_a_raised_budget_from_the_command_line(
    tmp_path: Path,
) -> None:
    """Every action on one running fleet of two workers, each on a host of its own."""
    slow = FarmConfig(seed=13, hosts=6, total_pages=360, latency_ms=250.0)
    with WebFarm(slow) as farm, RedisServer() as server:
        expected = _expected_by_host(farm)
        order = sorted(expected, key=lambda h: -len(expected[h]))
        purged, paused, limited, delayed, budgeted, topical = order
        extra = {
            "BANKER_HOST_BUDGETS": {budgeted: 3},
            "BANKER_TOPICS": {"slowtopic": 1, "default": 0},
            "BANKER_TOPIC_RULES": [{"url": f"//{topical}[:/]", "topic": "slowtopic"}],
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        }
        seeds = farm.start_urls()
        workers = [_worker(f"w{i}", tmp_path, server, seeds, **extra) for i in range(2)]
        _wait(lambda: farm.stats()["per_host"].get(purged, 0) >= 3, workers)
        # Bad input changes nothing: exit code 2, one line naming the argument.
        bad = banker(server, "budget", paused, "-3")
        assert bad.returncode == 2 and "N must be an integer >= 0" in bad.stderr, bad.stderr
        unknown = banker(server, "pause", "nowhere.example")
        assert unknown.returncode == 2
        assert "queued no request of 'nowhere.example'" in unknown.stderr
        # The delay and the limit first: their hosts are smaller than the paused
        # and purged ones, and must still have pages left once the directive lands.
        assert banker(server, "delay", delayed, "0.4").returncode == 0
        delayed_at = time.time()
        assert banker(server, "limit", limited, "1").returncode == 0
        limited_at = time.time()
        done = banker(server, "pause", paused)
        assert done.returncode == 0, done.stderr
        paused_at = time.time()
        gone = banker(server, "purge", purged, "--json")
        assert gone.returncode == 0, gone.stderr
        n_purged = json.loads(gone.stdout)["purged"]
        assert banker(server, "pause", "topic:slowtopic").returncode == 0
        bad_topic = banker(server, "pause", "topic:nosuch")
        assert bad_topic.returncode == 2 and "no topic 'nosuch'" in bad_topic.stderr
        acted_at = time.time()
        new = [f"{u}?injected={i}" for i, u in enumerate(sorted(expected[limited])[:3])]
        injected = banker(server, "inject", *new, "--json")
        assert injected.returncode == 0, injected.stderr
        assert json.loads(injected.stdout)["injected"] == 3
        time.sleep(2 * HEARTBEAT_S + 3.0)
        events = farm.stats(urls=True)["host_events"]
        settle = acted_at + 2 * HEARTBEAT_S
        # The limit: from then on never more than one request in flight on the host.
        inflight, worst = 0, 0
        limit_settled = limited_at + 2 * HEARTBEAT_S
        for at, step in events[limited]:
            inflight += step
            if at > limit_settled:
                worst = max(worst, inflight)
        assert worst <= 1, worst
        # It went on.
        assert [at for at, step in events[limited] if step == 1 and at > limit_settled]
        # The delay: arrivals at least 0.4 s apart (a little less for the clocks).
        delay_settled = delayed_at + 2 * HEARTBEAT_S
        arrivals = [at for at, step in events.get(delayed, []) if step == 1 and at > delay_settled]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert gaps and min(gaps) >= 0.35, gaps
        # The paused topic's host: nothing after the heartbeat, then resumed.
        late = [at for at, step in events.get(topical, []) if step == 1 and at > settle]
        assert not late
        # The paused host: nothing 2 heartbeats after the command returned, work left.
        late = [t for t, step in events[paused] if step == 1 and t > paused_at + 2 * HEARTBEAT_S]
        assert not late, f"{len(late)} requests reached the paused host after 2 heartbeats"
        assert len(_pages_by_host(farm)[paused]) < len(expected[paused])
        shown = banker(server, "control", "--json")
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["state"]["hosts"][paused] == {"paused": True}
        assert {e["verb"] for e in doc["log"]} >= {"pause", "purge", "limit", "delay", "inject"}
        assert all("scrapy banker" in e["who"] for e in doc["log"])
        assert banker(server, "resume", paused).returncode == 0
        assert banker(server, "resume", "topic:slowtopic").returncode == 0
        assert banker(server, "budget", budgeted, "6").returncode == 0
        assert banker(server, "limit", limited, "none").returncode == 0
        assert banker(server, "delay", delayed, "0").returncode == 0
        stats = _finish(workers)
        served = _pages_by_host(farm)
        fetched = farm.stats(urls=True)["fetches"]
    # The budgeted host's pages past its raised budget are still held: the reason says so.
    assert all(s["finish_reason"] == "banker_budget" for s in stats)
    assert all(fetched.get(u) for u in new)  # every injected URL was fetched
    assert len(served[budgeted]) == 6  # the raised budget released the held ones
    assert served[topical] == expected[topical]  # the paused topic's pages waited
    assert served[paused] == expected[paused]  # and so did the paused host's
    assert _total(stats, "banker/control/updates") >= 2 * len(workers)
    assert n_purged > 0
    assert len(served[purged]) < len(expected[purged])
    assert _total(stats, "banker/budget/released") + _total(stats, "banker/budget/held") >= 1


def test_a_single_process_is_paused_and_resumed_through_its_jobdir(tmp_path: Path) -> None:
    slow = FarmConfig(seed=14, hosts=3, total_pages=90, latency_ms=200.0)
    script = tmp_path / "crawl.py"
    script.write_text(ONE_NODE)
    jobdir = str(tmp_path / "job")
    extra = {"JOBDIR": jobdir, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    with WebFarm(slow) as farm:
        expected = _expected_by_host(farm)
        host = max(expected, key=lambda h: len(expected[h]))
        crawl = subprocess.Popen(
            [sys.executable, str(script), json.dumps(farm.start_urls()), json.dumps(extra)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while farm.stats()["per_host"].get(host, 0) < 8:
                assert time.monotonic() < deadline and crawl.poll() is None
                time.sleep(0.05)

            def act(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [sys.executable, "-m", "scrapy.cmdline", "banker", *args, "--jobdir", jobdir],
                    capture_output=True, text=True, timeout=60, check=False,
                )  # fmt: skip

            purge = act("purge", host)
            assert purge.returncode == 2 and "needs a crawl that runs on Redis" in purge.stderr
            unknown = act("pause", "nowhere.example")
            assert unknown.returncode == 2 and "no pending request of" in unknown.stderr
            done = act("pause", host)
            assert done.returncode == 0, done.stderr
            paused_at = time.time()
            time.sleep(3.0)
            events = farm.stats(urls=True)["host_events"][host]
            late = [t for t, step in events if step == 1 and t > paused_at + 1.5]
            assert not late, f"{len(late)} requests after the pause was read"
            assert len(_pages_by_host(farm)[host]) < len(expected[host])
            shown = act("control", "--json")
            doc = json.loads(shown.stdout)
            assert doc["state"]["hosts"][host] == {"paused": True}
            assert doc["log"][0]["verb"] == "pause"
            assert act("resume", host).returncode == 0
            out, _ = crawl.communicate(timeout=120)
        finally:
            if crawl.poll() is None:
                crawl.kill()
        served = _pages_by_host(farm)
    assert crawl.returncode == 0
    assert served == expected
    stats = json.loads(next(x for x in out.splitlines() if x.startswith("STATS "))[6:])
    assert stats["banker/control/updates"] == 2
    assert stats["finish_reason"] == "finished"
