"""Revisits in real crawls: a Scrapy ``CrawlSpider`` on a farm whose pages change.

The farm serves each page's version in its text and its ``ETag``, answers a
current ``If-None-Match`` with ``304``, and logs when each page's copies left
(:mod:`scrapy_banker.testing.farm.changes`), so every assertion is on what the
farm served and counted and on the crawl's stats -- and the freshness the
crawl kept is judged against the same pages crawled once.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import child_env, output_tail, run_python
from scrapy.settings import Settings

from scrapy_banker import Addon
from scrapy_banker.errors import BankerConfigError
from scrapy_banker.redis.keys import Keyspace
from scrapy_banker.settings import load_config
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.farm.changes import judge
from scrapy_banker.testing.redis_server import RedisServer

PER_HOST = 2

#: 3 hosts, 30 pages; rates between one change per 5 s and two per second, 40 %
#: of the pages never change.
FARM = FarmConfig(
    seed=6, hosts=3, total_pages=30, latency_ms=10.0,
    page_changes={"rate_min": 0.2, "rate_max": 2.0, "static_share": 0.4},
)  # fmt: skip

SCRIPT = """
import json, sys
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from scrapy_banker.testing.resolver import farm_settings


class Pages(CrawlSpider):
    name = "pages"
    rules = (Rule(LinkExtractor(allow=[r"farm\\.test"]), callback="parse_page", follow=True),)

    def __init__(self, seeds=(), **kwargs):
        super().__init__(**kwargs)
        self.start_urls = list(seeds)

    def parse_page(self, response):
        yield {"url": response.url, "status": response.status}


seeds, extra = json.loads(sys.argv[1]), json.loads(sys.argv[2])
process = CrawlerProcess({**farm_settings(), "LOG_LEVEL": "INFO",
                          "ADDONS": {"scrapy_banker.Addon": 500}, **extra})
crawler = process.create_crawler(Pages)
items = []


def collect(item):
    items.append(item)


crawler.signals.connect(collect, signal=signals.item_scraped)
process.crawl(crawler, seeds=seeds)
process.start()
print("ITEMS " + json.dumps(items))
print("STATS " + json.dumps({k: v for k, v in crawler.stats.get_stats().items()
                             if isinstance(v, (int, float, str))}))
"""


def _settings(**extra: Any) -> dict[str, Any]:
    return {
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "ROBOTSTXT_OBEY": False,
        "BANKER_RECRAWL": True,
        "BANKER_RECRAWL_INTERVAL": 1.0,
        "BANKER_RECRAWL_MIN_INTERVAL": 0.5,
        "BANKER_RECRAWL_MAX_INTERVAL": 4.0,
        "BANKER_RECRAWL_ERROR_INTERVAL": 1.0,
        **extra,
    }


#: The same crawl with Scrapy's ``SitemapSpider``, from each host's ``/sitemap.xml``.
SITEMAP_SCRIPT = SCRIPT.replace(
    "from scrapy.spiders import CrawlSpider, Rule",
    "from scrapy.spiders import CrawlSpider, Rule, SitemapSpider",
).replace(
    """class Pages(CrawlSpider):
    name = "pages"
    rules = (Rule(LinkExtractor(allow=[r"farm\\.test"]), callback="parse_page", follow=True),)

    def __init__(self, seeds=(), **kwargs):
        super().__init__(**kwargs)
        self.start_urls = list(seeds)
""",
    """class Pages(SitemapSpider):
    name = "pages"
    sitemap_rules = [("", "parse_page")]

    def __init__(self, seeds=(), **kwargs):
        super().__init__(**kwargs)
        self.sitemap_urls = list(seeds)
""",
)


def _crawl(
    tmp_path: Path, farm: WebFarm, *, sitemap: bool = False, **extra: Any
) -> tuple[dict[str, Any], list[Any]]:
    script = tmp_path / "crawl.py"
    script.write_text(SITEMAP_SCRIPT if sitemap else SCRIPT)
    settings = _settings(**extra)
    seeds = (
        [farm.url(i, "/sitemap.xml") for i in range(farm.model.config.hosts)]
        if sitemap
        else farm.start_urls()
    )
    proc = run_python(script, json.dumps(seeds), json.dumps(settings), timeout=120)
    assert proc.returncode == 0, output_tail(proc)
    lines = proc.stdout.splitlines()
    stats = json.loads(next(x for x in lines if x.startswith("STATS "))[6:])
    items = json.loads(next(x for x in lines if x.startswith("ITEMS "))[6:])
    return stats, items


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_crawl_that_stays_open_revisits_its_pages_conditionally_and_stays_fresh(
    tmp_path: Path,
) -> None:
    with WebFarm(FARM) as farm:
        stats, items = _crawl(tmp_path, farm, BANKER_RECRAWL_STAY_OPEN=True, CLOSESPIDER_TIMEOUT=8)
        served = farm.stats()
    changes = farm.model.changes
    assert changes is not None
    fetched: dict[str, list[float]] = served["page_fetches"]
    pages = len(farm.model.expected_urls(farm.port))
    assert stats["finish_reason"] == "closespider_timeout"
    assert len(fetched) == pages  # every page found, each fetched at least once
    # Revisits went out, as ordinary requests: the host limit held.
    assert stats["banker/recrawl/revisits"] >= pages
    # A revisit is a new page for the budgets: it never gives back the first fetch's charge.
    assert "banker/budget/refunded" not in stats
    assert max(served["max_inflight_per_host"].values()) <= PER_HOST
    assert sum(len(t) for t in fetched.values()) >= 2 * pages
    # Unchanged pages were confirmed by 304s, each one counted; none reached the callback.
    assert stats["banker/recrawl/not_modified"] == served["statuses"]["304"] >= 5
    assert stats["banker/recrawl/unchanged"] >= stats["banker/recrawl/not_modified"]
    assert {item["status"] for item in items} == {200}
    assert stats["banker/recrawl/changed"] > pages  # first fetches, and real changes

    # A page that never changes is revisited less and less often (x1.5 per 304).
    def key(url: str) -> str:
        return url.split("//", 1)[1].replace(f":{farm.port}", "", 1)

    still = [t for url, t in fetched.items() if changes.rate(key(url)) == 0 and len(t) >= 3]
    assert still, fetched
    for times in still:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[-1] > gaps[0], times
    # Fresher than the same pages fetched once, over the same span.
    end = max(t for times in fetched.values() for t in times)
    start = min(t for times in fetched.values() for t in times)
    keys = {key(u): t for u, t in fetched.items()}
    kept = judge(changes, keys, start, end)
    once = judge(changes, {k: t[:1] for k, t in keys.items()}, start, end)
    assert kept.freshness > once.freshness + 0.1, (kept, once)
    assert kept.age_s < once.age_s


def _banker(cwd: Path, *args: str) -> str:
    """``scrapy banker ARGS`` as an operator runs it; its standard output."""
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "banker", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=cwd, env=child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _saved_dues(jobdir: Path) -> dict[str, float]:
    """Each URL's due time as the JOBDIR's revisits file says (its last complete line wins)."""
    dues = {}
    for line in (jobdir / "banker" / "revisits.jsonl").read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            record = json.loads(line)
            dues[record["u"]] = record["s"]["due"]
    return dues


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("stop", ["kill", "clean"])
def test_a_jobdir_crawl_resumes_with_every_pages_due_time_and_validators(
    tmp_path: Path, stop: str
) -> None:
    """Stopped by ``kill -9`` once pages were revisited (or cleanly), then resumed: no page
    is fetched before the due time it had, and the first revisits are conditional."""
    jobdir = tmp_path / "job"
    settings = _settings(JOBDIR=str(jobdir), BANKER_RECRAWL_STAY_OPEN=True,
                         BANKER_RECRAWL_INTERVAL=2.0, BANKER_RECRAWL_MAX_INTERVAL=8.0)  # fmt: skip
    with WebFarm(FARM) as farm:
        pages = len(farm.model.expected_urls(farm.port))
        seeds = set(farm.start_urls())
        if stop == "clean":
            first, _ = _crawl(tmp_path, farm, **settings, CLOSESPIDER_TIMEOUT=4)
            assert first["finish_reason"] == "closespider_timeout"
        else:
            script = tmp_path / "crawl.py"
            script.write_text(SCRIPT)
            log = tmp_path / "killed.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(script), json.dumps(farm.start_urls()),
                     json.dumps(settings)],
                    stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                )  # fmt: skip
            deadline = time.monotonic() + 60
            while sum(map(len, farm.stats()["page_fetches"].values())) < 2 * pages:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        dues = _saved_dues(jobdir)
        before = farm.stats()
        resumed_at = time.time()
        second, items = _crawl(tmp_path, farm, **settings, CLOSESPIDER_TIMEOUT=4)
        after = farm.stats()
        clock_offset = time.time() - after["changes_clock_s"]  # wall time = clock + offset
    assert len(dues) >= pages // 2
    assert second["finish_reason"] == "closespider_timeout"
    assert second["banker/recrawl/restored"] == len(dues)
    # No page the JOBDIR knew was fetched before its due time (10 ms of clock reading
    # aside), but the start URLs: Scrapy's start requests are ``dont_filter``, so a
    # resumed spider asks for them again itself, and gets them as it asked.
    early = {}
    for url, due in dues.items():
        if url in seeds:
            continue
        times = after["page_fetches"].get(url, [])
        again = [t + clock_offset for t in times if t + clock_offset >= resumed_at]
        if again and again[0] < due - 0.01:
            early[url] = (again[0], due)
    assert not early, early
    # The first revisits carried the saved validators: unchanged pages answered 304.
    not_modified = after["statuses"].get("304", 0) - before["statuses"].get("304", 0)
    assert second["banker/recrawl/not_modified"] == not_modified > 0
    assert {item["status"] for item in items} <= {200}
    assert second["banker/recrawl/revisits"] > 0
    # What an operator reads of the stopped crawl: the pages kept, and one page in words.
    status = _banker(tmp_path, "status", "--jobdir", str(jobdir), "--json")
    revisits = json.loads(status)["revisits"]
    assert revisits["pages"] >= len(dues) and revisits["malformed"] == 0
    assert 0 < revisits["freshness"] <= 1
    assert revisits["changes"] + revisits["unchanged"] >= second["banker/recrawl/revisits"]
    page = next(u for u in dues if u not in seeds)
    explained = json.loads(_banker(tmp_path, "explain", page, "--jobdir", str(jobdir), "--json"))
    assert explained["revisit"].startswith(("due in ", "due now (")), explained
    assert ", every " in explained["revisit"]


def _fleet_states(url: str, prefix: str, partitions: int) -> dict[str, dict[str, Any]]:
    """Every page's revisit state as the fleet keeps it in Redis (an operator's read)."""
    client = redis.Redis.from_url(url)
    try:
        keys = Keyspace(prefix, partitions)
        return {
            page.decode(): json.loads(state)
            for p in range(partitions)
            for page, state in client.hgetall(keys.partition(p).revisits).items()
        }
    finally:
        client.close()


def _states_by_owner(url: str, prefix: str, partitions: int) -> dict[str, int]:
    """Node -> the pages' states its partitions hold (the owner key names ``node@epoch``)."""
    client = redis.Redis.from_url(url)
    try:
        keys = Keyspace(prefix, partitions)
        out: dict[str, int] = {}
        for p in range(partitions):
            owner = client.get(keys.partition(p).owner)
            node = owner.decode().split("@")[0] if owner else ""
            out[node] = out.get(node, 0) + client.hlen(keys.partition(p).revisits)
        return out
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("spider", ["crawl", "sitemap"])
def test_a_fleet_keeps_due_times_in_redis_and_a_killed_workers_pages_are_revisited(
    tmp_path: Path, spider: str
) -> None:
    """Two workers on one Redis (Scrapy's ``CrawlSpider``, or its ``SitemapSpider``); one
    is killed with ``kill -9`` once pages were revisited.  The survivor takes its
    partitions over and revisits their pages from the states in Redis: conditionally,
    with the host limit kept fleet-wide, and -- but where a trusted sitemap date made a
    page due earlier -- none before its due time."""
    sitemap = spider == "sitemap"
    script = tmp_path / "crawl.py"
    script.write_text(SITEMAP_SCRIPT if sitemap else SCRIPT)
    prefix, partitions = "banker:revisits", 8
    with WebFarm(FARM) as farm, RedisServer() as server:
        pages = len(farm.model.expected_urls(farm.port))
        seeds = set(
            [farm.url(i, "/sitemap.xml") for i in range(farm.model.config.hosts)]
            if sitemap
            else farm.start_urls()
        )

        def worker(node: int, timeout: float) -> subprocess.Popen[bytes]:
            settings = _settings(
                SCHEDULER="scrapy_banker.redis.scheduler.BankerRedisScheduler",
                REDIS_URL=server.url, BANKER_REDIS_PREFIX=prefix,
                BANKER_REDIS_NODE_ID=f"n{node}", BANKER_REDIS_PARTITIONS=partitions,
                BANKER_REDIS_HEARTBEAT=0.5, BANKER_REDIS_NODE_TIMEOUT=2.0,
                BANKER_REDIS_LEASE_TTL=2.0, BANKER_REDIS_REAP_INTERVAL=0.5,
                BANKER_REDIS_SPILL_DIR=str(tmp_path / f"spill-{node}"),
                BANKER_RECRAWL_STAY_OPEN=True, BANKER_RECRAWL_INTERVAL=2.0,
                BANKER_RECRAWL_MAX_INTERVAL=6.0, CLOSESPIDER_TIMEOUT=timeout,
            )  # fmt: skip
            return subprocess.Popen(
                [sys.executable, str(script), json.dumps(sorted(seeds) if node == 0 else []),
                 json.dumps(settings)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(),
            )  # fmt: skip

        workers = {"n0": worker(0, 14), "n1": worker(1, 14)}
        deadline = time.monotonic() + 60
        while sum(map(len, farm.stats()["page_fetches"].values())) < 2 * pages:
            for proc in workers.values():
                assert proc.poll() is None, proc.communicate()[0].decode()[-4000:]
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # The victim: the worker whose partitions hold the most pages' states now.
        held = _states_by_owner(server.url, prefix, partitions)
        name = max(held, key=lambda node: held[node])
        victim = workers.pop(name)
        (survivor,) = workers.values()
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        assert held[name] > 0, held
        killed_at = time.time()
        states = _fleet_states(server.url, prefix, partitions)
        before = farm.stats()
        out, _ = survivor.communicate(timeout=120)
        after = farm.stats()
        clock_offset = time.time() - after["changes_clock_s"]
    assert survivor.returncode == 0, out.decode()[-3000:]
    lines = out.decode().splitlines()
    stats = json.loads(next(x for x in lines if x.startswith("STATS "))[6:])
    assert stats["finish_reason"] == "closespider_timeout"
    # Every page found has its state in Redis, kept by whichever worker fetched it.
    assert len(states) >= pages - 2  # (a page in flight at the kill may have none yet)
    # The killed worker's hosts were revisited too: every host, after the kill.
    later = {
        url for url, times in after["page_fetches"].items()
        if any(t + clock_offset > killed_at + 0.5 for t in times)
    }  # fmt: skip
    hosts = {u.split("//", 1)[1].split(":", 1)[0] for u in later}
    assert len(hosts) == farm.model.config.hosts, hosts
    assert len(later - seeds) >= pages // 2
    if sitemap:
        # A sitemap's dates were read; trusted, they may make a page due before the due
        # time its state had at the kill, so that is not checked here.
        assert stats["banker/recrawl/lastmod_read"] > 0
    else:
        # No page was fetched again before the due time its state had at the kill.
        early = {}
        for url, state in states.items():
            if url in seeds:
                continue
            again = [t + clock_offset for t in after["page_fetches"].get(url, [])
                     if t + clock_offset >= killed_at]  # fmt: skip
            if again and again[0] < state.get("due", 0.0) - 0.01:
                early[url] = (again[0], state["due"])
        assert not early, early
    # Revisits carried the validators of the state in Redis; the host limit held.
    not_modified = after["statuses"].get("304", 0) - before["statuses"].get("304", 0)
    assert stats["banker/recrawl/not_modified"] > 0 and not_modified > 0
    assert stats["banker/redis/revisits_due"] > 0 and stats["banker/redis/revisits_saved"] > 0
    assert max(after["max_inflight_per_host"].values()) <= PER_HOST


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_sitemap_spider_revisits_and_a_trusted_lastmod_brings_pages_forward(
    tmp_path: Path,
) -> None:
    """Scrapy's ``SitemapSpider`` on hosts whose sitemaps tell the truth: the sitemap is
    revisited like a page, and once a host's dates proved right they make pages due."""
    assert SITEMAP_SCRIPT != SCRIPT
    with WebFarm(FARM) as farm:
        stats, items = _crawl(tmp_path, farm, sitemap=True, BANKER_RECRAWL_STAY_OPEN=True,
                              CLOSESPIDER_TIMEOUT=8)  # fmt: skip
        served = farm.stats(urls=True)
        model = farm.model
        pages = {model.url(i, p, farm.port) for i in range(3) for p in model.paths(i)}
    assert stats["finish_reason"] == "closespider_timeout"
    assert set(served["page_fetches"]) == pages  # every <loc>, and nothing else, as pages
    sitemaps = [u for u in served["fetches"] if u.endswith("/sitemap.xml")]
    assert len(sitemaps) == 3 and all(served["fetches"][u] >= 3 for u in sitemaps)  # revisited
    assert stats["banker/recrawl/lastmod_read"] >= 3 * len(pages)
    assert stats["banker/recrawl/lastmod_due"] > 0
    assert stats["banker/recrawl/not_modified"] == served["statuses"]["304"] > 0
    assert {item["status"] for item in items} == {200}
    assert max(served["max_inflight_per_host"].values()) <= PER_HOST


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_sitemap_whose_lastmod_is_wrong_never_moves_a_due_time(tmp_path: Path) -> None:
    """Every host stamps every page "changed now" and no page ever changes: each claim
    is proved wrong by the next fetch, so no host is trusted and no page comes early."""
    liars = FarmConfig(seed=6, hosts=3, total_pages=30, latency_ms=10.0,
                       page_changes={"rate_min": 1.0, "rate_max": 1.0, "static_share": 1.0,
                                     "lying_share": 1.0})  # fmt: skip
    with WebFarm(liars) as farm:
        stats, _ = _crawl(tmp_path, farm, sitemap=True, BANKER_RECRAWL_STAY_OPEN=True,
                          CLOSESPIDER_TIMEOUT=6)  # fmt: skip
        served = farm.stats()
    assert stats["banker/recrawl/lastmod_read"] > 0
    assert "banker/recrawl/lastmod_due" not in stats
    assert stats["banker/recrawl/not_modified"] == served["statuses"]["304"] > 0
    assert "banker/recrawl/changed" in stats and stats["banker/recrawl/unchanged"] > 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_recrawl_rules_give_pages_their_own_intervals_or_none(tmp_path: Path) -> None:
    rules = [
        {"url": r"//h0000\.", "recrawl": False},
        {"url": r"//h0001\.", "interval": 60, "min_interval": 60, "max_interval": 600},
    ]
    with WebFarm(FARM) as farm:
        stats, _ = _crawl(tmp_path, farm, BANKER_RECRAWL_RULES=rules,
                          BANKER_RECRAWL_STAY_OPEN=True, CLOSESPIDER_TIMEOUT=6)  # fmt: skip
        fetched: dict[str, list[float]] = farm.stats()["page_fetches"]
    by_host: dict[str, list[int]] = {}
    for url, times in fetched.items():
        by_host.setdefault(url.split("//")[1].split(".")[0], []).append(len(times))
    assert sorted(by_host) == ["h0000", "h0001", "h0002"]
    # Never revisited, or not due within the run: each page fetched as the spider
    # asked (a start URL is dont_filter, so its link may fetch it once more).
    assert max(by_host["h0000"]) <= 2 and max(by_host["h0001"]) <= 2
    assert min(by_host["h0002"]) >= 3  # the settings' 1 s interval
    assert stats["banker/recrawl/revisits"] >= 3 * len(by_host["h0002"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_stay_open_the_crawl_closes_and_counts_what_was_still_due(
    tmp_path: Path,
) -> None:
    with WebFarm(FARM) as farm:
        stats, _ = _crawl(tmp_path, farm, BANKER_RECRAWL_INTERVAL=60.0,
                          BANKER_RECRAWL_MAX_INTERVAL=120.0)  # fmt: skip
        served = farm.stats()
    pages = len(served["page_fetches"])
    assert stats["finish_reason"] == "finished"
    assert stats["banker/recrawl/due_at_close"] == pages > 0
    assert "banker/recrawl/revisits" not in stats
    # A page the spider itself asked for twice (a start URL, then its link) was
    # fetched as asked: no validators, no 304, its callback called both times.
    assert "304" not in served["statuses"] and "banker/recrawl/not_modified" not in stats


def test_revisits_start_in_every_mode(tmp_path: Path) -> None:
    fleet = {"SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler"}
    Addon().update_settings(Settings({"BANKER_RECRAWL": True, **fleet}))
    Addon().update_settings(Settings({"BANKER_RECRAWL": True, "JOBDIR": str(tmp_path)}))
    Addon().update_settings(Settings({"BANKER_RECRAWL": True}))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"BANKER_RECRAWL_SIGNATURE": "dom"}, r"BANKER_RECRAWL_SIGNATURE='dom': allowed: \['body'"),
        ({"BANKER_RECRAWL_NOT_MODIFIED": "x"}, "BANKER_RECRAWL_NOT_MODIFIED='x': allowed"),
        ({"BANKER_RECRAWL_INTERVAL": 10}, "BANKER_RECRAWL_INTERVAL=10.0: must lie between"),
        ({"BANKER_RECRAWL_MAX_STALE": 1}, "BANKER_RECRAWL_MAX_STALE=1.0: must be None or >="),
        ({"BANKER_RECRAWL_MIN_INTERVAL": 0}, "BANKER_RECRAWL_MIN_INTERVAL=0: expected a finite"),
        ({"BANKER_RECRAWL_STAY_OPEN": "maybe"}, "BANKER_RECRAWL_STAY_OPEN='maybe'"),
        (
            {"BANKER_RECRAWL_RULES": [{"url": "/a/", "interval": 10}]},
            r"BANKER_RECRAWL_RULES\[0\]=.*: interval=10.0 must lie in \[min_interval",
        ),
        ({"BANKER_RECRAWL_RULES": [{"interval": 10}]}, r"needs 'url' \(a regex\) and/or 'topic'"),
        ({"BANKER_RECRAWL_RULES": [{"url": "("}]}, "'url' is not a valid regular expression"),
        ({"BANKER_RECRAWL_RULES": [{"url": "/a", "every": 1}]}, r"unknown key\(s\) \['every'\]"),
        (
            {"BANKER_RECRAWL_RULES": [{"topic": "a", "recrawl": "maybe"}]},
            r"BANKER_RECRAWL_RULES\[0\]\['recrawl'\]='maybe': expected a boolean",
        ),
        ({"BANKER_RECRAWL_RULES": {"url": "/a"}}, "expected a list of dicts"),
        ({"BANKER_RECRAWL_ESTIMATOR": "mean"}, r"BANKER_RECRAWL_ESTIMATOR='mean': allowed"),
        (
            {"BANKER_RECRAWL_ESTIMATOR": "poisson"},
            "BANKER_RECRAWL_ESTIMATOR='poisson': plans revisits for a fetch rate: set",
        ),
        ({"BANKER_RECRAWL_HOST_RATE": -1}, "BANKER_RECRAWL_HOST_RATE=-1: expected a finite"),
    ],
)
def test_a_bad_revisit_setting_names_itself(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(BankerConfigError, match=message):
        load_config(settings)


def test_a_revisit_carries_the_latest_copys_validators_and_ends_at_a_304() -> None:
    """Driven by hand (no engine): each revisit is a copy of the spider's own request,
    with the validators of the newest copy -- not those of the revisit it came after."""
    from scrapy import Request, Spider
    from scrapy.exceptions import IgnoreRequest
    from scrapy.http import HtmlResponse, Response
    from scrapy.utils.test import get_crawler

    from scrapy_banker.middlewares import RecrawlMiddleware

    crawler = get_crawler(Spider, {"BANKER_RECRAWL": True, "BANKER_RECRAWL_INTERVAL": 1.0,
                                   "BANKER_RECRAWL_MIN_INTERVAL": 1.0})  # fmt: skip
    mw = RecrawlMiddleware.from_crawler(crawler)
    spider = Spider("s")
    url = "http://a.test/page"

    def parse(response: Response) -> None:
        pass

    first = Request(url, callback=parse, meta={"depth": 2, "retry_times": 1})
    mw.process_request(first, spider)
    assert b"If-None-Match" not in first.headers  # not a revisit: as the spider asked
    page = HtmlResponse(url, body=b"<p>v1</p>", headers={"ETag": '"v1"'}, request=first)
    assert mw.process_response(first, page, spider) is page
    assert mw.revisits(time.time()) == []  # due in a second, not now
    (again,) = mw.revisits(time.time() + 1.5)
    assert again.callback is parse and again.dont_filter
    assert again.meta["depth"] == 2 and "retry_times" not in again.meta
    assert again.meta["banker_revisit"] == pytest.approx(time.time() + 1.5, abs=1)  # when sent
    mw.process_request(again, spider)
    assert again.headers[b"If-None-Match"] == b'"v1"'
    changed = HtmlResponse(url, body=b"<p>v2</p>", headers={"ETag": '"v2"'}, request=again)
    mw.process_response(again, changed, spider)
    (third,) = mw.revisits(time.time() + 60)
    mw.process_request(third, spider)
    assert third.headers[b"If-None-Match"] == b'"v2"'  # the newest copy's, not v1
    # A second copy while one is downloading (a resumed queue's, beside the
    # one its due time sent again) is dropped, and so is one sent before the
    # page's last fetch.
    with pytest.raises(IgnoreRequest, match="superseded"):
        mw.process_request(third.copy(), spider)
    stale = third.replace(meta={**third.meta, "banker_revisit": time.time() - 30})
    with pytest.raises(IgnoreRequest, match="not modified"):
        mw.process_response(third, Response(url, status=304, request=third), spider)
    with pytest.raises(IgnoreRequest, match="superseded"):
        mw.process_request(stale, spider)
    stats = crawler.stats.get_stats()  # type: ignore[union-attr]
    assert (stats["banker/recrawl/changed"], stats["banker/recrawl/not_modified"]) == (2, 1)
    assert stats["banker/recrawl/superseded"] == 2
    # A banker_recrawl meta that is no bool is reported once per response, not obeyed.
    odd = Request("http://a.test/odd", meta={"banker_recrawl": "no"})
    mw.process_response(odd, HtmlResponse(odd.url, body=b"x", request=odd), spider)
    assert mw.states["http://a.test/odd"].changes == 1  # revisited like any page
    assert crawler.stats.get_value("banker/recrawl/invalid_meta") == 1  # type: ignore[union-attr]
    # A 304 to the spider's own conditional request is its answer, not a revisit's.
    own = Request(url, headers={"If-None-Match": '"v2"'})
    mine = Response(url, status=304, request=own)
    assert mw.process_response(own, mine, spider) is mine


def test_a_carried_revisit_state_gives_the_validators_and_a_bad_one_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fleet's revisit carries its page's state (``banker_revisit_state``): the worker
    that fetches it, which never fetched the page, sends its validators; a carried
    state that does not read is one warning and a count, and the page is fetched as a
    first fetch."""
    from scrapy import Request, Spider
    from scrapy.utils.test import get_crawler

    from scrapy_banker.core.recrawl import UrlState
    from scrapy_banker.middlewares import RecrawlMiddleware

    crawler = get_crawler(Spider, {"BANKER_RECRAWL": True})
    mw = RecrawlMiddleware.from_crawler(crawler)
    spider = Spider("s")
    now = time.time()
    carried = UrlState(due=now - 1, interval=60.0, fetched=now - 61, etag='"v7"').to_json()
    meta = {"banker_revisit": now, "banker_revisit_state": carried}
    revisit = Request("http://a.test/p", meta=meta)
    mw.process_request(revisit, spider)
    assert revisit.headers[b"If-None-Match"] == b'"v7"'
    odd = {"banker_revisit": now, "banker_revisit_state": {"fetched": "yesterday"}}
    bad = Request("http://a.test/q", meta=odd)
    with caplog.at_level("WARNING"):
        mw.process_request(bad, spider)
    (line,) = [r for r in caplog.records if "banker_revisit_state" in r.getMessage()]
    assert "Ignoring invalid meta banker_revisit_state" in line.getMessage()
    assert line.exc_info is None and "\n" not in line.getMessage()
    assert b"If-None-Match" not in bad.headers
    assert crawler.stats.get_value("banker/recrawl/invalid_meta") == 1  # type: ignore[union-attr]
