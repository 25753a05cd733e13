"""BankerScheduler: Scrapy's scheduler contract, slot-aware dispatch, topics, JOBDIR."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import scrapy
from conftest import run_python
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler, Scheduler
from scrapy.utils.test import get_crawler

from scrapy_banker.scheduler import BankerScheduler

SCRAPY_VERSION = tuple(int(x) for x in scrapy.__version__.split(".")[:2])


class FakeSlot:
    def __init__(self, concurrency: int) -> None:
        self.active: set[Request] = set()
        self.concurrency = concurrency


class FakeDownloader:
    """The part of scrapy.core.downloader.Downloader the scheduler reads."""

    def __init__(self, concurrency: int = 2) -> None:
        self.slots: dict[str, FakeSlot] = {}
        self.active: set[Request] = set()
        self.concurrency = concurrency

    def get_slot_key(self, request: Request) -> str:
        return request.meta.get("download_slot") or urlsplit(request.url).hostname or ""

    def start(self, request: Request) -> None:
        key = self.get_slot_key(request)
        self.slots.setdefault(key, FakeSlot(self.concurrency)).active.add(request)
        self.active.add(request)

    def finish(self, request: Request, crawler: Any) -> None:
        crawler.signals.send_catch_log(
            signals.request_left_downloader, request=request, spider=None
        )
        self.slots[self.get_slot_key(request)].active.discard(request)
        self.active.discard(request)


class TopicSpider(Spider):
    name = "s"

    def parse_page(self, response: Any) -> None:
        pass


def _open(settings: dict[str, Any] | None = None, downloader: FakeDownloader | None = None) -> Any:
    crawler = get_crawler(TopicSpider, settings or {})
    crawler.spider = TopicSpider.from_crawler(crawler)
    if downloader is not None:
        crawler.engine = SimpleNamespace(downloader=downloader)
    scheduler = BankerScheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    return scheduler


def _drain(scheduler: Any) -> list[Request]:
    out = []
    while (req := scheduler.next_request()) is not None:
        out.append(req)
    return out


def test_is_a_base_scheduler() -> None:
    assert issubclass(BankerScheduler, BaseScheduler)


def test_contract_dupefilter_and_scrapy_stats() -> None:
    scheduler = _open()
    reqs = [Request(f"http://h{i % 5}.test/{i}") for i in range(40)]
    assert all(scheduler.enqueue_request(r) for r in reqs)
    assert not scheduler.enqueue_request(Request("http://h0.test/0"))  # duplicate
    assert scheduler.enqueue_request(Request("http://h0.test/0", dont_filter=True))
    assert len(scheduler) == 41 and scheduler.has_pending_requests()
    got = _drain(scheduler)
    assert len(got) == 41 and not scheduler.has_pending_requests()
    assert {r.url for r in got} == {r.url for r in reqs}
    stats = scheduler.stats.get_stats()
    assert stats["scheduler/enqueued"] == stats["scheduler/enqueued/memory"] == 41
    assert stats["scheduler/dequeued"] == stats["scheduler/dequeued/memory"] == 41
    assert stats["dupefilter/filtered"] == 1
    scheduler.close("finished")
    assert scheduler.stats.get_value("banker/queue/buckets") >= 1


def test_request_priority_within_a_slot_then_fifo() -> None:
    scheduler = _open()
    for i, prio in enumerate([0, 5, 0, 5, -1]):
        scheduler.enqueue_request(Request(f"http://h.test/{i}", priority=prio))
    assert [r.url[-1] for r in _drain(scheduler)] == ["1", "3", "0", "2", "4"]


def test_disabled_returns_scrapys_scheduler() -> None:
    crawler = get_crawler(Spider, {"BANKER_ENABLED": False})
    assert type(BankerScheduler.from_crawler(crawler)) is Scheduler


def test_invalid_setting_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="BANKER_QUEUE_KEY='ip'"):
        _open({"BANKER_QUEUE_KEY": "ip"})


def test_never_hands_out_a_request_for_a_full_slot() -> None:
    """One giant host and many small ones: no head-of-line blocking."""
    dl = FakeDownloader(concurrency=2)
    scheduler = _open(downloader=dl)
    for i in range(100):
        scheduler.enqueue_request(Request(f"http://giant.test/{i}", priority=10))
    for h in range(20):
        scheduler.enqueue_request(Request(f"http://small{h}.test/"))
    out = []
    while (req := scheduler.next_request()) is not None:
        dl.start(req)
        out.append(req)
    hosts = Counter(urlsplit(r.url).hostname for r in out)
    assert hosts["giant.test"] == 2  # its slot's concurrency, despite priority 10
    assert len(hosts) == 21  # every small host got its request meanwhile
    assert scheduler.stats.get_value("scheduler/dequeued") == 22
    # Freeing one giant request makes exactly one more giant request eligible.
    giant = next(r for r in out if "giant" in r.url)
    dl.finish(giant, scheduler.crawler)
    nxt = scheduler.next_request()
    assert nxt is not None and urlsplit(nxt.url).hostname == "giant.test"
    dl.start(nxt)
    assert scheduler.next_request() is None
    assert scheduler.has_pending_requests()


def test_missed_wakeup_is_recovered_when_downloader_is_idle() -> None:
    dl = FakeDownloader(concurrency=1)
    scheduler = _open(downloader=dl)
    scheduler.enqueue_request(Request("http://a.test/1"))
    scheduler.enqueue_request(Request("http://a.test/2"))
    first = scheduler.next_request()
    dl.start(first)
    assert scheduler.next_request() is None  # slot full: lane parked
    # The download ends without the signal (e.g. a middleware changed the slot).
    dl.slots["a.test"].active.clear()
    dl.active.clear()
    second = scheduler.next_request()
    assert second is not None and second.url.endswith("/2")
    assert scheduler.queue.frontier.unblock_sweeps == 1


def test_topic_priority_preempts_and_equal_topics_share() -> None:
    settings = {
        "BANKER_TOPICS": {"news": 10, "a": {"priority": 0}, "b": {"priority": 0}},
        "BANKER_TOPIC_RULES": [
            {"url": "/news/", "topic": "news"},
            {"url": "/a/", "topic": "a"},
            {"url": "/b/", "topic": "b"},
        ],
        "BANKER_TOPIC_SLICE": 0.05,
        "BANKER_TOPIC_MIN_SLICE": 0.01,
    }
    scheduler = _open(settings)
    clock = [0.0]
    scheduler.clock = lambda: clock[0]
    for i in range(200):
        for topic in ("a", "b"):
            scheduler.enqueue_request(Request(f"http://h{i % 50}.test/{topic}/{i}"))
    for i in range(10):
        scheduler.enqueue_request(Request(f"http://n.test/news/{i}"))
    order = []
    while (req := scheduler.next_request()) is not None:
        order.append(req.meta["banker_topic"])
        clock[0] += 0.001
    assert order[:10] == ["news"] * 10  # preemption
    first_half = Counter(order[10:210])
    assert abs(first_half["a"] - first_half["b"]) <= 50  # round-robin slices of 50 dispatches
    stats = scheduler.stats.get_stats()
    assert stats["banker/topic/news/dequeued"] == 10
    assert stats["banker/topic/a/enqueued"] == stats["banker/topic/a/dequeued"] == 200


def test_buckets_stay_bounded_and_hot_host_is_alone() -> None:
    scheduler = _open({"BANKER_BUCKET_CAPACITY": 64})
    for i in range(2000):
        scheduler.enqueue_request(Request(f"http://hot.test/{i}"))
    for h in range(500):
        scheduler.enqueue_request(Request(f"http://tail{h}.test/"))
    d = scheduler.directory
    assert d.bucket_keys(d.bucket_of("hot.test")) == frozenset({"hot.test"})
    assert d.n_buckets < 100  # 501 hosts share far fewer buckets
    d.check_invariants()


# -- JOBDIR ----------------------------------------------------------------------------


def _jobdir_settings(tmp_path: Path) -> dict[str, Any]:
    return {
        "JOBDIR": str(tmp_path / "job"),
        "BANKER_BUCKET_CAPACITY": 8,
        "BANKER_TOPICS": {"news": {"priority": 5, "slice": 0.5, "target": 3}},
        "BANKER_TOPIC_RULES": [{"url": "/news/", "topic": "news"}],
    }


def _stream(spider: TopicSpider) -> list[Request]:
    reqs = []
    for i in range(60):
        path = "news" if i % 3 == 0 else "archive"
        reqs.append(
            Request(
                f"http://h{i % 7}.test/{path}/{i}.html",
                priority=i % 4,
                callback=spider.parse_page,
                meta={"depth": i % 5, "raw": b"\x00\x01"},
                cb_kwargs={"i": i},
            )
        )
    return reqs


def test_jobdir_resume_is_exact(tmp_path: Path) -> None:
    settings = _jobdir_settings(tmp_path)
    reference = _open(settings | {"JOBDIR": str(tmp_path / "ref")})
    first = _open(settings)
    for req in _stream(first.spider):
        first.enqueue_request(req)
        reference.enqueue_request(req.copy())
    # Serve a few, then stop cleanly.
    served = [first.next_request() for _ in range(10)]
    ref_served = [reference.next_request() for _ in range(10)]
    assert [r.url for r in served] == [r.url for r in ref_served]
    for request in served:  # their callbacks ran: done (without an engine: slot released)
        first.release(request, "response")
    first.queue.topics.adjust({"news": 10})
    buckets_before = first.directory.to_state()
    first.close("shutdown")
    assert first.stats.get_value("banker/jobdir/saved") == 50
    assert (tmp_path / "job" / "banker" / "snapshot.jsonl").exists()

    second = _open(settings)
    assert len(second) == 50
    assert second.stats.get_value("banker/jobdir/restored") == 50
    assert second.directory.to_state() == buckets_before
    assert second.queue.topics["news"].slice_total == pytest.approx(0.4)
    rest = _drain(second)
    ref_rest = _drain(reference)
    # Same pending set, same per-lane order, requests intact (callback, meta, kwargs).
    assert sorted(r.url for r in rest) == sorted(r.url for r in ref_rest)
    lanes = lambda rs: [r.url for r in rs if "h3.test/archive" in r.url]  # noqa: E731
    assert lanes(rest) == lanes(ref_rest)
    sample = next(r for r in rest if r.url.endswith("/4.html"))
    assert sample.callback == second.spider.parse_page
    assert sample.cb_kwargs == {"i": 4} and sample.meta["raw"] == b"\x00\x01"
    assert sample.meta["banker_topic"] == "default"  # no rule matches /archive/
    # Duplicates of already-seen URLs stay filtered after the resume.
    assert not second.enqueue_request(Request("http://h0.test/news/0.html"))
    for request in rest:
        second.release(request, "response")
    second.close("finished")
    third = _open(settings)
    assert len(third) == 0


def test_jobdir_malformed_entries_are_dead_lettered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _jobdir_settings(tmp_path)
    first = _open(settings)
    for req in _stream(first.spider)[:12]:
        first.enqueue_request(req)
    first.close("shutdown")
    snapshot = tmp_path / "job" / "banker" / "snapshot.jsonl"
    lines = snapshot.read_text().splitlines()
    victim = next(i for i, line in enumerate(lines) if line.startswith('{"e":'))
    evil = json.loads(lines[victim])
    evil["r"]["_class"] = "os.system"
    lines[victim] = json.dumps(evil, separators=(",", ":"))
    lines.append("{not json")
    snapshot.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.ERROR):
        second = _open(settings)
    assert second.stats.get_value("banker/jobdir/malformed") == 2
    assert len(second) == 11
    second.directory.check_invariants()
    assert sum(second.directory.load_of(k) for k in second.directory) == 11
    dead = [
        json.loads(x)
        for x in (tmp_path / "job" / "banker-deadletter.jsonl").read_text().splitlines()
    ]
    assert len(dead) == 2 and any("not allow-listed" in d["error"] for d in dead)
    assert "Skipping malformed JOBDIR entry" in caplog.text
    assert len(_drain(second)) == 11


def test_jobdir_unserializable_request_is_reported_not_lost_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _jobdir_settings(tmp_path)
    first = _open(settings)
    first.enqueue_request(Request("http://h.test/ok"))
    first.enqueue_request(Request("http://h.test/bad", meta={"s": {1, 2}}))
    with caplog.at_level(logging.ERROR):
        first.close("shutdown")
    assert first.stats.get_value("banker/jobdir/saved") == 1
    assert first.stats.get_value("banker/jobdir/unserializable") == 1
    assert "Cannot persist" in caplog.text and "Unable to serialize request" in caplog.text
    dead = (tmp_path / "job" / "banker-deadletter.jsonl").read_text()
    assert "http://h.test/bad" in dead
    second = _open(settings)
    assert [r.url for r in _drain(second)] == ["http://h.test/ok"]


def test_unparsable_url_is_logged_counted_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = _open()
    bad = Request("http://ok.test/", dont_filter=True)
    bad._url = "http://[broken-ipv6/x"  # what a buggy middleware could leave behind
    with caplog.at_level(logging.ERROR):
        assert scheduler.enqueue_request(bad) is False
    assert scheduler.stats.get_value("banker/queue/malformed_url") == 1
    assert "unparsable URL" in caplog.text
    assert scheduler.enqueue_request(Request("http://ok.test/2"))
    assert len(scheduler) == 1
    # Filtered, the same URL fails first in Scrapy's fingerprinter: its error, as
    # Scrapy's own scheduler lets it through.
    filtered = Request("http://ok.test/")
    filtered._url = "http://[broken-ipv6/x"
    with pytest.raises(ValueError):
        scheduler.enqueue_request(filtered)
    assert scheduler.stats.get_value("banker/queue/malformed_url") == 1


class FailingFingerprinter:
    """A user's fingerprinter with a bug."""

    def fingerprint(self, request: Request) -> bytes:
        raise ValueError("bug in the user's fingerprinter")


def test_errors_of_user_components_propagate_as_through_scrapys_scheduler() -> None:
    scheduler = _open({"REQUEST_FINGERPRINTER_CLASS": FailingFingerprinter})
    with pytest.raises(ValueError, match="bug in the user's fingerprinter"):
        scheduler.enqueue_request(Request("http://ok.test/"))
    assert scheduler.stats.get_value("banker/queue/malformed_url") is None


def test_unserializable_requests_are_logged_once_in_scrapys_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = _open(_jobdir_settings(tmp_path))
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            scheduler.enqueue_request(Request(f"http://h.test/{i}", meta={"hook": print}))
    assert caplog.text.count("Unable to serialize request") == 1
    assert scheduler.stats.get_value("scheduler/unserializable") == 3
    assert scheduler.stats.get_value("scheduler/enqueued/memory") == 3


# -- drop-in: what Scrapy's own scheduler accepts, and its stats keys ---------------------

DROP_IN_SPIDER = """
import json, sys
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy_banker.testing.resolver import farm_settings

port, data_file, stats_file, jobdir, scheduler = sys.argv[1:6]


class Spider(scrapy.Spider):
    name = "dropin"

    async def start(self):
        yield scrapy.Request("data:,", callback=self.got)
        yield scrapy.Request("data:,hello%20banker", callback=self.got)
        yield scrapy.Request(f"file://{data_file}", callback=self.got)
        yield scrapy.Request(f"http://h0000.farm.test:{port}/", callback=self.got)
        # A callable in meta: nothing can serialize it, JOBDIR or Redis.
        yield scrapy.Request(f"http://h0001.farm.test:{port}/", callback=self.got,
                             meta={"hook": print})

    def got(self, response):
        yield {"url": response.url, "body": response.body[:40].decode("latin-1")}


settings = {
    **farm_settings(),
    "ADDONS": {"scrapy_banker.Addon": 500},
    "SCHEDULER": scheduler,
    "BANKER_STATS_FILE": stats_file,
    "FEEDS": {stats_file + ".items.jsonl": {"format": "jsonlines"}},
    "LOG_LEVEL": "INFO",
}
if jobdir != "-":
    settings["JOBDIR"] = jobdir
if len(sys.argv) > 6:
    settings["REDIS_URL"] = sys.argv[6]
    settings["BANKER_REDIS_IDLE_BEFORE_CLOSE"] = 0.5
process = CrawlerProcess(settings)
process.crawl(Spider)
process.start()
"""


def _drop_in_crawl(
    tmp_path: Path,
    jobdir: str,
    scheduler: str = "scrapy_banker.scheduler.BankerScheduler",
    *extra: str,
) -> tuple[dict[str, Any], dict[str, str], str]:
    from scrapy_banker.testing.farm import FarmConfig, WebFarm

    script = tmp_path / "spider.py"
    script.write_text(DROP_IN_SPIDER)
    data_file = tmp_path / "local.txt"
    data_file.write_text("from a file\n")
    stats_file = tmp_path / "stats.json"
    with WebFarm(FarmConfig(seed=3, hosts=2, total_pages=4, latency_ms=1.0)) as farm:
        proc = run_python(
            script, str(farm.port), data_file, stats_file, jobdir, scheduler, *extra, timeout=120
        )
    stats = json.loads(stats_file.read_text())
    lines = Path(f"{stats_file}.items.jsonl").read_text().splitlines()
    items = [json.loads(line) for line in lines]
    return stats, {item["url"]: item["body"] for item in items}, proc.stderr


def _assert_all_fetched(fetched: dict[str, str], tmp_path: Path) -> None:
    assert fetched["data:,"] == ""
    assert fetched["data:,hello%20banker"] == "hello banker"
    assert fetched[f"file://{tmp_path / 'local.txt'}"] == "from a file\n"
    assert len(fetched) == 5  # and both farm pages


@pytest.mark.slow
@pytest.mark.scrapy213
def test_data_and_file_urls_are_fetched_with_scrapys_memory_stats(tmp_path: Path) -> None:
    stats, fetched, log = _drop_in_crawl(tmp_path, "-")
    _assert_all_fetched(fetched, tmp_path)
    assert "unparsable URL" not in log and stats.get("banker/queue/malformed_url") is None
    assert stats["scheduler/enqueued"] == stats["scheduler/enqueued/memory"] == 5
    assert stats["scheduler/dequeued"] == stats["scheduler/dequeued/memory"] == 5
    assert "scheduler/enqueued/disk" not in stats and "scheduler/unserializable" not in stats
    # A default crawl is quiet: components that are simply off say nothing.
    assert "WARNING: Disabled" not in log and "[scrapy.middleware] WARNING" not in log


@pytest.mark.slow
@pytest.mark.scrapy213
def test_jobdir_counts_disk_and_unserializable_as_scrapy_does(tmp_path: Path) -> None:
    stats, fetched, _ = _drop_in_crawl(tmp_path, str(tmp_path / "job"))
    _assert_all_fetched(fetched, tmp_path)
    assert stats["scheduler/enqueued"] == 5 and stats["scheduler/dequeued"] == 5
    assert stats["scheduler/enqueued/disk"] == stats["scheduler/dequeued/disk"] == 4
    assert stats["scheduler/enqueued/memory"] == stats["scheduler/dequeued/memory"] == 1
    assert stats["scheduler/unserializable"] == 1


@pytest.mark.slow
@pytest.mark.scrapy213
def test_data_and_file_urls_through_the_redis_store(tmp_path: Path, redis_server: Any) -> None:
    stats, fetched, _ = _drop_in_crawl(
        tmp_path, "-", "scrapy_banker.redis.scheduler.BankerRedisScheduler", redis_server.url
    )
    _assert_all_fetched(fetched, tmp_path)
    assert stats["scheduler/enqueued/redis"] == stats["scheduler/dequeued/redis"] == 4
    assert stats["scheduler/enqueued/memory"] == stats["scheduler/dequeued/memory"] == 1
    assert stats["scheduler/unserializable"] == stats["banker/redis/unserializable"] == 1


# -- politeness under both reactors -------------------------------------------------------

POLITE_SPIDER = """
import json, sys
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy_banker.testing.resolver import farm_settings

port, stats_file, reactor, scheduler = sys.argv[1:5]


class Spider(scrapy.Spider):
    name = "polite"
    links = LinkExtractor()

    async def start(self):
        yield scrapy.Request(f"http://h0000.farm.test:{port}/")

    def parse(self, response):
        for link in self.links.extract_links(response):
            yield response.follow(link.url)


process = CrawlerProcess({
    **farm_settings(),
    "ADDONS": {"scrapy_banker.Addon": 500},
    "SCHEDULER": scheduler,
    "TWISTED_REACTOR": reactor,
    "CONCURRENT_REQUESTS": 32,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    "DOWNLOAD_DELAY": 0,
    "BANKER_STATS_FILE": stats_file,
    "LOG_LEVEL": "WARNING",
})
process.crawl(Spider)
process.start()
"""


@pytest.mark.slow
@pytest.mark.scrapy213
@pytest.mark.parametrize(
    ("reactor", "scheduler", "polite"),
    [
        ("twisted.internet.asyncioreactor.AsyncioSelectorReactor",
         "scrapy_banker.scheduler.BankerScheduler", True),
        ("twisted.internet.epollreactor.EPollReactor",
         "scrapy_banker.scheduler.BankerScheduler", True),
        # The control: Scrapy's own scheduler under the asyncio reactor (its
        # default) exceeds the limit, so this test can tell the difference.
        # Scrapy 2.13 still updated the slot's counters at once.
        pytest.param(
            "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            "scrapy.core.scheduler.Scheduler", False,
            marks=pytest.mark.skipif(
                SCRAPY_VERSION < (2, 14), reason="Scrapy < 2.14 holds the limit itself"
            ),
        ),
    ],
)  # fmt: skip
def test_per_domain_limit_holds_under_both_reactors(
    tmp_path: Path, reactor: str, scheduler: str, polite: bool
) -> None:
    from scrapy_banker.testing.farm import FarmConfig, WebFarm

    script = tmp_path / "spider.py"
    script.write_text(POLITE_SPIDER)
    stats_file = tmp_path / "stats.json"
    config = FarmConfig(seed=2, hosts=1, total_pages=300, latency_ms=20.0,
                        cross_host_link_prob=0.0)  # fmt: skip
    with WebFarm(config) as farm:
        run_python(script, str(farm.port), stats_file, reactor, scheduler, timeout=120)
        server = farm.stats()
        expected = len(farm.expected_urls([farm.model.url(0, "/", farm.port)]))
    stats = json.loads(stats_file.read_text())
    assert stats["finish_reason"] == "finished"
    assert stats["response_received_count"] == expected
    most = max(server["max_inflight_per_host"].values())
    if polite:
        assert most <= 2
    else:
        assert most > 2
