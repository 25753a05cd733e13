"""``/metrics`` scraped during real crawls and parsed with Prometheus's own parser.

One crawl of the web farm in a ``scrapy`` process of its own, scraped over
HTTP from this process while it runs and once more while the finished crawl
is held open (its spider refuses to close until the test says so), so the
last scrape can be compared with the crawl's final stats exactly.  Then a
fleet of two real workers on a real redis-server: each live node's telemetry
key holds its latest sample, and its metrics show its leases.  And a crawl
with revisits (``BANKER_RECRAWL``) on a farm whose pages change, whose
metrics show the pages it keeps and the revisits it sends.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import farm_fixture
from prometheus_client.parser import text_string_to_metric_families
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_banker.core.directives import Action, ControlState, HostControl
from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.core.telemetry import Sample, SlotSample, TopicSample, sample_from_dict
from scrapy_banker.ops.metric_families import families
from scrapy_banker.ops.metrics import (
    REVISIT_OUTCOME_STATS,
    BankerMetrics,
    ControlReading,
    RevisitReading,
    Snapshot,
    read_control,
    read_revisits_metrics,
)
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.control_channel import ControlChannel
from scrapy_banker.redis.keys import Keyspace
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer

PER_HOST = 2
TOP_SLOTS = 3
INTERVAL = 0.2
TOPICS = ("news", "archive", "products")
RULES = [{"url": f"/{t}/", "topic": t} for t in TOPICS]

pytestmark = pytest.mark.timeout(120)

#: A crawl of the farm whose spider stays open once idle until ``release`` exists
#: (it writes ``idle`` first): the test scrapes the final counts meanwhile.
HELD_CRAWL = """
import json, sys
from pathlib import Path
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.exceptions import DontCloseSpider
from scrapy_banker.scheduler.engine import looping_call, wake_engine
from scrapy_banker.testing.fleet import FleetSpider
from scrapy_banker.testing.resolver import farm_settings

settings, seeds, workdir = json.loads(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])
idle, release = workdir / "idle", workdir / "release"


class HeldSpider(FleetSpider):
    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.idle, signal=signals.spider_idle)
        spider.poke = None
        return spider

    def idle(self):
        if release.exists():
            return
        idle.touch()
        if self.poke is None:  # ask again soon, not on the engine's 5 s heartbeat
            self.poke = looping_call(lambda: wake_engine(self.crawler))
            self.poke.start(0.1)
        raise DontCloseSpider


process = CrawlerProcess({**farm_settings(), **settings})
process.crawl(HeldSpider, seeds=seeds)
process.start()
"""


# ~500 pages on 12 hosts at 40 ms, 8 at a time: a crawl of a few seconds.
farm = farm_fixture(FarmConfig(seed=7, hosts=12, total_pages=500, latency_ms=40.0))


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {labels: value}}`` of one scrape, through Prometheus's parser."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode("utf-8")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _by(metric: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for labels, value in metric.items()}


def _metrics_url(log: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text("utf-8", errors="replace") if log.exists() else ""
        found = re.search(r"Prometheus metrics on (http://\S+/metrics)", text)
        if found:
            return found.group(1)
        assert proc.poll() is None, f"the crawl ended before serving metrics:\n{text[-3000:]}"
        time.sleep(0.05)
    raise AssertionError("no metrics URL in the log")


@pytest.mark.slow
def test_metrics_scraped_during_a_crawl_match_its_final_stats(
    farm: WebFarm, tmp_path: Path
) -> None:
    farm.reset()
    log, stats_file = tmp_path / "crawl.log", tmp_path / "stats.json"
    settings = {
        "ADDONS": {"scrapy_banker.Addon": 500},
        "BANKER_TOPIC_RULES": RULES,
        "BANKER_METRICS_PORT": 0,
        "BANKER_METRICS_TOP_SLOTS": TOP_SLOTS,
        "BANKER_TIMESERIES_INTERVAL": INTERVAL,
        "BANKER_STATS_FILE": str(stats_file),
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "LOG_FILE": str(log),
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_CRAWL, json.dumps(settings),
         json.dumps(farm.start_urls()), str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        url = _metrics_url(log, proc)
        assert url.startswith("http://127.0.0.1:")  # localhost unless told otherwise
        during = []
        while not (tmp_path / "idle").exists():
            assert proc.poll() is None, log.read_text("utf-8")[-3000:]
            during.append(_scrape(url))
            time.sleep(INTERVAL)
        time.sleep(3 * INTERVAL)  # the crawl is over: let a sample see the final counts
        final = _scrape(url)
        (tmp_path / "release").touch()
        code = proc.wait(timeout=60)
        assert code == 0, proc.stderr.read().decode()[-3000:] if proc.stderr else code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stats = json.loads(stats_file.read_text("utf-8"))

    # Pages per topic grow during the crawl and never go back (a counter).
    totals = [sum(s.get("banker_pages_total", {}).values()) for s in during]
    assert len(totals) >= 3, f"too few scrapes while the crawl ran: {totals}"
    assert totals[-1] > totals[0], totals
    assert all(a <= b for a, b in itertools.pairwise(totals)), totals
    for before, after in itertools.pairwise(during):
        pages_before = _by(before.get("banker_pages_total", {}), "topic")
        pages_after = _by(after.get("banker_pages_total", {}), "topic")
        assert all(pages_after.get(t, 0) >= n for t, n in pages_before.items())

    # The held, finished crawl: its metrics are its final stats.
    pages = _by(final["banker_pages_total"], "topic")
    assert set(TOPICS) <= set(pages)
    for topic, n in pages.items():
        assert n == stats.get(f"banker/topic/{topic}/responses", 0), topic
    assert sum(pages.values()) == stats["downloader/response_count"] == len(farm.expected_urls())
    assert set(_by(final["banker_queue_depth"], "topic")) == set(pages)
    assert sum(_by(final["banker_queue_depth"], "topic").values()) == 0
    assert final["banker_inflight"][()] == 0
    assert _by(final["banker_dead_letters_total"], "reason") == {
        "malformed": 0, "max_deliveries": 0, "unserializable": 0,
    }  # fmt: skip
    deferred = _by(final["banker_admission_deferred_total"], "reason")
    assert deferred == {"unsafe": 0, "insufficient": 0}  # no BANKER_RESOURCES
    assert "banker_leases_in_flight" not in final  # one process: no fleet

    # Per-slot series: only the busiest few, never above the per-host limit.
    slot_series = [s.get("banker_slot_inflight", {}) for s in during]
    assert any(slot_series), "no scrape saw a slot with transfers"
    for series in slot_series:
        assert len(series) <= TOP_SLOTS
        assert all(0 <= v <= PER_HOST for v in series.values())
    limits = [v for s in during for v in s.get("banker_slot_limit", {}).values()]
    assert limits and set(limits) == {PER_HOST}
    assert any(s.get("banker_inflight", {}).get((), 0) > 0 for s in during)


# -- a fleet ------------------------------------------------------------------------------


def _fleet_settings(server: RedisServer, node: str, log: Path) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler",
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server.url,
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": 64,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 1.0,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_TOPIC_RULES": RULES,
        "BANKER_METRICS_PORT": 0,
        "BANKER_TIMESERIES_INTERVAL": INTERVAL,
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "LOG_FILE": str(log),
    }


@pytest.mark.slow
def test_each_fleet_node_publishes_its_sample_and_serves_its_leases(
    farm: WebFarm, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    farm.reset()
    names = ("n0", "n1")
    workers = [
        FleetWorker(
            name,
            tmp_path,
            {
                "settings": _fleet_settings(redis_server, name, tmp_path / f"{name}.log"),
                "seeds": farm.start_urls(),
            },
        )
        for name in names
    ]
    keyspace = Keyspace("banker:fleet", 64)
    try:
        urls = {w.name: _metrics_url(w.log_path, w.proc) for w in workers}
        published: dict[str, list[Sample]] = {name: [] for name in names}
        leases: dict[str, list[float]] = {name: [] for name in names}
        while all(w.proc.poll() is None for w in workers):
            for w in workers:
                raw = redis_client.get(keyspace.telemetry(w.name))
                if raw is not None:
                    published[w.name].append(sample_from_dict(json.loads(raw)))
                    ttl = redis_client.pttl(keyspace.telemetry(w.name))
                    assert 0 < ttl <= 5000, ttl  # expires by itself, at least 5 s
                try:
                    scraped = _scrape(urls[w.name])
                except OSError:
                    continue  # closing: its server just stopped
                if "banker_leases_in_flight" in scraped:
                    leases[w.name].append(scraped["banker_leases_in_flight"][()])
                    assert scraped["banker_partitions_total"][()] == 64
            time.sleep(INTERVAL)
        for w in workers:
            assert w.wait(60) == 0, w.log_tail()
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.kill()
    assert sum(w.stats()["downloader/response_count"] for w in workers) == len(farm.expected_urls())
    for name in names:
        samples = published[name]
        assert samples, f"node {name} published no telemetry"
        assert {s.node for s in samples} == {name}
        assert all(s.fleet is not None and s.fleet.partitions_total == 64 for s in samples)
        assert any(s.fleet is not None and s.fleet.partitions_owned > 0 for s in samples)
        assert all(s.fleet is not None and s.fleet.connected for s in samples)
        assert set(TOPICS) <= set(samples[-1].topics)
        assert [s.pages for s in samples] == sorted(s.pages for s in samples)
        assert leases[name], f"node {name}: no banker_leases_in_flight in its metrics"
    # Leases were held while the crawl ran, on some node at some scrape.
    assert max(max(v) for v in leases.values()) > 0


# -- the collector on its own -------------------------------------------------------------


def test_families_follow_the_sample_and_bound_slot_series() -> None:
    sample = Sample(
        t=10.0, node="solo", pages=7, queued=3, inflight=2,
        topics={"news": TopicSample(5, 1, 2, 1.0), "archive": TopicSample(2, 2, 0, 0.5)},
        slots=(SlotSample("a.test", 2, 2, 4),),
    )  # fmt: skip
    snap = Snapshot(sample, {"malformed": 1}, {"unsafe": 2})
    text = "".join(
        f"{s.name} {sorted(s.labels.items())} {s.value}\n"
        for family in families(snap)
        for s in family.samples
    )
    assert "banker_pages_total [('topic', 'news')] 5" in text
    assert "banker_queue_depth [('topic', 'archive')] 2" in text
    assert "banker_slot_inflight [('slot', 'a.test')] 2" in text
    assert "banker_dead_letters_total [('reason', 'malformed')] 1" in text
    assert "banker_admission_deferred_total [('reason', 'unsafe')] 2" in text
    assert "banker_resource_available" not in text  # no BANKER_RESOURCES: no Banker series


def test_metrics_are_off_by_default_and_with_a_foreign_scheduler() -> None:
    with pytest.raises(NotConfigured) as off:
        BankerMetrics.from_crawler(get_crawler(settings_dict={}))
    assert not off.value.args
    crawler = get_crawler(
        settings_dict={"BANKER_METRICS_PORT": 0, "SCHEDULER": "scrapy.core.scheduler.Scheduler"}
    )
    with pytest.raises(NotConfigured) as foreign:
        BankerMetrics.from_crawler(crawler)
    assert not foreign.value.args


# -- run-time control (issue #27) ---------------------------------------------------------


def _lines(snap: Snapshot) -> set[str]:
    return {
        f"{s.name} {sorted(s.labels.items())} {s.value}"
        for family in families(snap)
        for s in family.samples
    }


def test_control_families_show_paused_hosts_budgets_and_charges() -> None:
    sample = Sample(t=10.0, node="n0", pages=7, queued=3, inflight=2)
    reading = ControlReading(
        version=4, paused_hosts=2, paused_topics=1,
        budgets=(("crawl", "crawl", 100), ("host", "a.test", 5)),
        charged=(("crawl", "crawl", 42),),
        counters={"budget_held": 3, "budget_released": 1},
    )  # fmt: skip
    lines = _lines(Snapshot(sample, {}, {}, reading))
    assert {
        "banker_control_version [] 4",
        "banker_paused_hosts [] 2",
        "banker_paused_topics [] 1",
        "banker_budget_pages [('name', 'crawl'), ('scope', 'crawl')] 100",
        "banker_budget_pages [('name', 'a.test'), ('scope', 'host')] 5",
        "banker_budget_charged_pages [('name', 'crawl'), ('scope', 'crawl')] 42",
        "banker_budget_held_total [] 3",
        "banker_budget_released_total [] 1",
    } <= lines
    # A scheduler without a control gate: no control series at all.
    assert not any(
        "paused" in line or "budget" in line for line in _lines(Snapshot(sample, {}, {}))
    )


def test_read_control_follows_the_schedulers_gate_and_the_settings_budgets() -> None:
    from scrapy_banker.scheduler import BankerScheduler

    crawler = get_crawler(
        settings_dict={
            "BANKER_CRAWL_BUDGET": 100,
            "BANKER_HOST_BUDGET": 20,
            "BANKER_HOST_BUDGETS": {"*.gov": 7},
            "BANKER_TOPICS": {"news": {"priority": 0, "budget": 30}},
        }
    )
    scheduler = BankerScheduler.from_crawler(crawler)
    assert crawler.stats is not None
    reading = read_control(scheduler, crawler.stats)
    assert reading is not None
    assert (reading.version, reading.paused_hosts, reading.paused_topics) == (0, 0, 0)
    assert reading.budgets == (
        ("crawl", "crawl", 100), ("topic", "news", 30), ("host", "*", 20), ("host", "*.gov", 7),
    )  # fmt: skip
    # One node counts its own pages: nothing charged yet.
    assert reading.charged == (("crawl", "crawl", 0),)
    assert reading.counters == {"budget_held": 0, "budget_released": 0}

    # An operator pauses two hosts and a topic, gives a host a budget, lowers the crawl's.
    state = ControlState()
    for action in (
        Action("pause", "a.test"), Action("pause", "b.test"), Action("pause", "topic:news"),
        Action("budget", "c.test", 3), Action("budget", "crawl", 50),
    ):  # fmt: skip
        state = state.apply(action)
    scheduler.control.apply(state)
    crawler.stats.set_value("banker/budget/held", 4)
    reading = read_control(scheduler, crawler.stats)
    assert reading is not None
    assert (reading.version, reading.paused_hosts, reading.paused_topics) == (5, 2, 1)
    assert ("crawl", "crawl", 50) in reading.budgets
    assert ("host", "c.test", 3) in reading.budgets
    assert reading.counters == {"budget_held": 4, "budget_released": 0}
    assert state.host("c.test") == HostControl(budget=3)
    lines = _lines(
        Snapshot(Sample(t=1.0, node="n", pages=0, queued=0, inflight=0), {}, {}, reading)
    )
    assert "banker_paused_hosts [] 2" in lines
    assert "banker_budget_pages [('name', 'crawl'), ('scope', 'crawl')] 50" in lines

    # No BankerScheduler running: nothing.
    assert read_control(None) is None


@pytest.mark.slow
def test_a_crawl_budget_is_scraped_charged_to_its_limit(farm: WebFarm, tmp_path: Path) -> None:
    farm.reset()
    budget = 60
    log, stats_file = tmp_path / "crawl.log", tmp_path / "stats.json"
    settings = {
        "ADDONS": {"scrapy_banker.Addon": 500},
        "BANKER_TOPIC_RULES": RULES,
        "BANKER_CRAWL_BUDGET": budget,
        "BANKER_METRICS_PORT": 0,
        "BANKER_TIMESERIES_INTERVAL": INTERVAL,
        "BANKER_STATS_FILE": str(stats_file),
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "LOG_FILE": str(log),
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_CRAWL, json.dumps(settings),
         json.dumps(farm.start_urls()), str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        url = _metrics_url(log, proc)
        during = []
        while not (tmp_path / "idle").exists():
            assert proc.poll() is None, log.read_text("utf-8")[-3000:]
            during.append(_scrape(url))
            time.sleep(INTERVAL)
        time.sleep(3 * INTERVAL)
        final = _scrape(url)
        (tmp_path / "release").touch()
        assert proc.wait(timeout=60) == 0, (
            proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stats = json.loads(stats_file.read_text("utf-8"))
    crawl = (("name", "crawl"), ("scope", "crawl"))
    assert final["banker_budget_pages"][crawl] == budget
    # Charged up to the budget, never past it; what was left is held, not dropped.
    charged = [
        s["banker_budget_charged_pages"][crawl]
        for s in during
        if "banker_budget_charged_pages" in s
    ]
    assert charged == sorted(charged) and max(charged) <= budget
    assert final["banker_budget_charged_pages"][crawl] == budget
    assert final["banker_budget_held_total"][()] == stats["banker/budget/held"] > 0
    assert final["banker_paused_hosts"][()] == 0 and final["banker_control_version"][()] == 0
    # The responses are the pages charged, no more.
    pages = sum(_by(final["banker_pages_total"], "topic").values())
    assert pages == budget == stats["downloader/response_count"]


@pytest.mark.slow
def test_fleet_nodes_serve_the_directives_they_follow_and_the_crawl_budget(
    farm: WebFarm, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    farm.reset()
    budget = 150
    # An operator paused a host before the workers started (one the farm does
    # not serve: the crawl is not slowed, the directive is only to be seen).
    channel = ControlChannel(RedisFrontier(redis_client, prefix="banker:fleet", partitions=64).link)
    channel.act(Action("pause", "elsewhere.test"), who="test", now=time.time())
    names = ("n0", "n1")
    workers = []
    for name in names:
        settings = _fleet_settings(redis_server, name, tmp_path / f"{name}.log")
        settings["BANKER_CRAWL_BUDGET"] = budget
        workers.append(
            FleetWorker(name, tmp_path, {"settings": settings, "seeds": farm.start_urls()})
        )
    crawl = (("name", "crawl"), ("scope", "crawl"))
    scrapes: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        urls = {w.name: _metrics_url(w.log_path, w.proc) for w in workers}
        while any(w.proc.poll() is None for w in workers):
            for w in workers:
                if w.proc.poll() is not None:
                    continue
                try:
                    scrapes[w.name].append(_scrape(urls[w.name]))
                except OSError:
                    continue  # closing: its server just stopped
            time.sleep(INTERVAL)
        for w in workers:
            assert w.wait(60) == 0, w.log_tail()
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.kill()
    responses = sum(w.stats()["downloader/response_count"] for w in workers)
    print(f"\n{responses} responses; scrapes: {[len(v) for v in scrapes.values()]}")
    assert 0 < responses <= budget
    for name in names:
        seen = [s for s in scrapes[name] if s.get("banker_control_version", {}).get((), 0) >= 1]
        assert seen, f"node {name} never showed the control document"
        assert all(s["banker_paused_hosts"][()] == 1 for s in seen)
        assert all(s["banker_budget_pages"][crawl] == budget for s in seen)
        # Charged fleet-wide, as the node last read it: never past the budget.
        charged = [s["banker_budget_charged_pages"][crawl] for s in seen
                   if crawl in s.get("banker_budget_charged_pages", {})]  # fmt: skip
        assert charged and max(charged) <= budget, charged
    assert max(
        s["banker_budget_charged_pages"][crawl]
        for name in names for s in scrapes[name]
        if crawl in s.get("banker_budget_charged_pages", {})
    ) > 0  # fmt: skip


# -- revisits (BANKER_RECRAWL) ------------------------------------------------------------

#: A crawl of a farm whose pages change (3 hosts, 30 pages; as tests/test_revisits.py's),
#: with revisits every second or so, open until CLOSESPIDER_TIMEOUT.
REVISIT_CRAWL = """
import json, sys
from scrapy.crawler import CrawlerProcess
from scrapy_banker.testing.fleet import FleetSpider
from scrapy_banker.testing.resolver import farm_settings

settings, seeds = json.loads(sys.argv[1]), json.loads(sys.argv[2])
process = CrawlerProcess({**farm_settings(), **settings})
process.crawl(FleetSpider, seeds=seeds)
process.start()
"""
REVISIT_FARM = FarmConfig(
    seed=6, hosts=3, total_pages=30, latency_ms=10.0,
    page_changes={"rate_min": 0.2, "rate_max": 2.0, "static_share": 0.4},
)  # fmt: skip
REVISIT_FAMILIES = (
    "banker_revisit_pages", "banker_revisit_due", "banker_revisit_overdue_seconds",
    "banker_revisit_freshness", "banker_revisits_total", "banker_revisit_outcomes_total",
)  # fmt: skip


def test_revisit_families_follow_the_reading_and_are_absent_without_revisits() -> None:
    sample = Sample(t=10.0, node="solo", pages=7, queued=3, inflight=2)
    reading = RevisitReading(
        pages=30, due=4, overdue_s=2.5, freshness=0.75, revisits=12,
        outcomes={"changed": 35, "unchanged": 6, "failed": 1, "not_modified": 5, "superseded": 0},
    )  # fmt: skip
    lines = _lines(Snapshot(sample, {}, {}, None, reading))
    assert {
        "banker_revisit_pages [] 30",
        "banker_revisit_due [] 4",
        "banker_revisit_overdue_seconds [] 2.5",
        "banker_revisit_freshness [] 0.75",
        "banker_revisits_total [] 12",
        "banker_revisit_outcomes_total [('outcome', 'changed')] 35",
        "banker_revisit_outcomes_total [('outcome', 'not_modified')] 5",
        "banker_revisit_outcomes_total [('outcome', 'superseded')] 0",
    } <= lines
    # No page kept yet: no freshness series, nothing overdue.
    empty = RevisitReading(0, 0, 0.0, None, 0, dict.fromkeys(REVISIT_OUTCOME_STATS, 0))
    lines = _lines(Snapshot(sample, {}, {}, None, empty))
    assert "banker_revisit_pages [] 0" in lines
    assert "banker_revisit_overdue_seconds [] 0.0" in lines
    assert not any(line.startswith("banker_revisit_freshness") for line in lines)
    # Revisits off: no revisit family at all, not even an empty one.
    names = {family.name for family in families(Snapshot(sample, {}, {}))}
    assert not any("revisit" in name for name in names), names


def test_read_revisits_metrics_sums_up_the_middlewares_pages_and_stats() -> None:
    from scrapy import Spider

    from scrapy_banker.middlewares import RecrawlMiddleware

    # Revisits off: no reading.
    off = get_crawler(settings_dict={})
    assert off.stats is not None
    assert read_revisits_metrics(off, off.stats, 100.0) is None

    crawler = get_crawler(Spider, {"BANKER_RECRAWL": True})
    assert crawler.stats is not None
    mw = RecrawlMiddleware.from_crawler(crawler)
    reading = read_revisits_metrics(crawler, crawler.stats, 100.0)
    assert reading == RevisitReading(0, 0, 0.0, None, 0, dict.fromkeys(REVISIT_OUTCOME_STATS, 0))

    mw.states["https://a.test/1"] = UrlState(due=90.0, interval=10.0, changes=1)
    mw.states["https://a.test/2"] = UrlState(due=97.0, interval=10.0, changes=1, unchanged=2)
    mw.states["https://a.test/3"] = UrlState(due=130.0, interval=30.0, changes=1)
    crawler.stats.set_value("banker/recrawl/revisits", 9)
    crawler.stats.set_value("banker/recrawl/not_modified", 2)
    reading = read_revisits_metrics(crawler, crawler.stats, 100.0)
    assert reading is not None
    assert (reading.pages, reading.due, reading.overdue_s) == (3, 2, 10.0)
    assert reading.freshness == 1.0  # no page has shown a change since its first fetch
    assert reading.revisits == 9
    assert reading.outcomes == {**dict.fromkeys(REVISIT_OUTCOME_STATS, 0), "not_modified": 2}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_crawl_with_revisits_serves_its_pages_and_revisits(tmp_path: Path) -> None:
    log, stats_file = tmp_path / "crawl.log", tmp_path / "stats.json"
    with WebFarm(REVISIT_FARM) as farm:
        settings = {
            "ADDONS": {"scrapy_banker.Addon": 500},
            "BANKER_METRICS_PORT": 0,
            "BANKER_TIMESERIES_INTERVAL": INTERVAL,
            "BANKER_STATS_FILE": str(stats_file),
            "BANKER_RECRAWL": True,
            "BANKER_RECRAWL_INTERVAL": 1.0,
            "BANKER_RECRAWL_MIN_INTERVAL": 0.5,
            "BANKER_RECRAWL_MAX_INTERVAL": 4.0,
            "BANKER_RECRAWL_STAY_OPEN": True,
            "CLOSESPIDER_TIMEOUT": 5,
            "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
            "ROBOTSTXT_OBEY": False,
            "LOG_FILE": str(log),
            "LOG_LEVEL": "INFO",
            "TELNETCONSOLE_ENABLED": False,
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", REVISIT_CRAWL, json.dumps(settings),
             json.dumps(farm.start_urls())],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            url = _metrics_url(log, proc)
            scrapes = []
            while proc.poll() is None:
                try:
                    scrapes.append(_scrape(url))
                except OSError:
                    break  # closing: its server just stopped
                time.sleep(INTERVAL)
            code = proc.wait(timeout=60)
            assert code == 0, proc.stderr.read().decode()[-3000:] if proc.stderr else code
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        expected = len(farm.model.expected_urls(farm.port))
    stats = json.loads(stats_file.read_text("utf-8"))
    assert stats["finish_reason"] == "closespider_timeout"
    seen = [s for s in scrapes if "banker_revisit_pages" in s]
    assert len(seen) >= 5, f"too few scrapes with revisits: {len(seen)} of {len(scrapes)}"
    for scrape in seen:
        assert set(REVISIT_FAMILIES) - {"banker_revisit_freshness"} <= set(scrape)
        assert set(_by(scrape["banker_revisit_outcomes_total"], "outcome")) == set(
            REVISIT_OUTCOME_STATS
        )
        pages = scrape["banker_revisit_pages"][()]
        assert 0 <= scrape["banker_revisit_due"][()] <= pages <= expected
        assert scrape["banker_revisit_overdue_seconds"][()] >= 0
        if pages:
            assert 0.0 <= scrape["banker_revisit_freshness"][()] <= 1.0
    last = seen[-1]
    assert last["banker_revisit_pages"][()] == expected  # every page fetched is kept
    # Revisits went out and came back, counted as the stats count them (never past them).
    sent = [s["banker_revisits_total"][()] for s in seen]
    assert sent == sorted(sent) and 0 < sent[-1] <= stats["banker/recrawl/revisits"]
    outcomes = _by(last["banker_revisit_outcomes_total"], "outcome")
    assert outcomes["changed"] >= expected  # every first fetch counts as a change
    assert outcomes["not_modified"] > 0  # unchanged pages answered 304
    for outcome, key in REVISIT_OUTCOME_STATS.items():
        assert outcomes[outcome] <= stats.get(key, 0), outcome
    # A static page is fresh; a changing one is not always: somewhere in between.
    assert 0.0 < last["banker_revisit_freshness"][()] <= 1.0
