"""Server pushback held by the frontier on one node (issue #26).

In process (not slow): the gate (a blocked host's lanes parked, woken by one
timer at the ready time), the response side (a 429/503 blocks the host and
the request is put back, not retried), the backoff, giving up (dead letters,
JOBDIR letters the requeue command reads back), the JOBDIR snapshot's host
states, the settings.

Real crawls (slow) against a small server of this module that answers what
each test scripts per host and logs every request with its arrival time:
no request reaches a host before its Retry-After, nothing is lost, retry
counters stay untouched, with RetryMiddleware and AutoThrottle on or off;
``BANKER_PUSHBACK=False`` is Scrapy's behaviour.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import run_python, run_scrapy
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from scrapy_banker.core.politeness import HostState
from scrapy_banker.middlewares import BankerDownloaderMiddleware
from scrapy_banker.ops import jobdir_deadletters as dl
from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler.jobdir import SNAPSHOT, replay
from scrapy_banker.settings import load_config
from scrapy_banker.testing.farm import Burst, FarmConfig, RateLimit, WebFarm

T0 = 1_800_000_000.0


# -- in process: a scheduler with a fake downloader, a fake clock and fake timers ---------


class FakeSlot:
    def __init__(self, concurrency: int) -> None:
        self.active: set[Request] = set()
        self.transferring: set[Request] = set()
        self.queue: list[Any] = []
        self.concurrency = concurrency
        self.delay = 0.0


class FakeDownloader:
    def __init__(self, concurrency: int = 2) -> None:
        self.slots: dict[str, FakeSlot] = {}
        self.active: set[Request] = set()
        self.concurrency = concurrency

    def get_slot_key(self, request: Request) -> str:
        return request.meta.get("download_slot") or urlsplit(request.url).hostname or ""


class Clock:
    """Wall time the gate reads, and the timers it arms (fired by :meth:`advance`)."""

    def __init__(self) -> None:
        self.now = T0
        self.timers: list[Timer] = []

    def __call__(self) -> float:
        return self.now

    def schedule(self, delay: float, func: Callable[[], Any]) -> Timer:
        timer = Timer(self.now + delay, func)
        self.timers.append(timer)
        return timer

    @property
    def armed(self) -> list[float]:
        return sorted(t.at for t in self.timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [t for t in self.timers if not t.cancelled and t.at <= self.now]:
            for timer in due:
                self.timers.remove(timer)
                timer.func()


@dataclass
class Timer:
    at: float
    func: Callable[[], Any]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class PoliteSpider(Spider):
    name = "polite"

    def parse_page(self, response: Any) -> None:
        pass


def _open(settings: dict[str, Any] | None = None, *, job: Path | None = None) -> Any:
    """An open scheduler on a fake downloader; ``scheduler.clock_`` drives its gate."""
    settings = dict(settings or {})
    if job is not None:
        settings["JOBDIR"] = str(job)
    crawler = get_crawler(PoliteSpider, settings)
    crawler.spider = PoliteSpider.from_crawler(crawler)
    crawler.engine = SimpleNamespace(
        downloader=FakeDownloader(), _slot=SimpleNamespace(inprogress=set())
    )
    scheduler = crawler.engine.scheduler = BankerScheduler.from_crawler(crawler)
    clock = Clock()
    gate = scheduler.parts.politeness
    gate.clock, gate.schedule = clock, clock.schedule
    gate.politeness._rng = random.Random(7)
    scheduler.clock_ = clock
    woken: list[int] = []
    crawler.engine._slot.nextcall = SimpleNamespace(schedule=lambda: woken.append(1))
    scheduler.woken = woken
    scheduler.open(crawler.spider)
    return scheduler


def _next(scheduler: Any) -> list[str]:
    """Everything the scheduler hands out now, each request ended at once."""
    out = []
    while (request := scheduler.next_request()) is not None:
        out.append(request.url)
        scheduler.release(request, "response")
    return out


def _respond(scheduler: Any, request: Request, status: int, **headers: str) -> Any:
    """What BankerDownloaderMiddleware returns for a response of ``status``."""
    mw = BankerDownloaderMiddleware(scheduler.crawler)
    request.meta.setdefault("download_slot", urlsplit(request.url).hostname)
    response = Response(request.url, status=status, headers=headers, request=request)
    return mw.process_response(request, response)


def _dispatch(scheduler: Any, url: str) -> Request:
    scheduler.enqueue_request(Request(url, callback=scheduler.spider.parse_page))
    request = scheduler.next_request()
    assert request is not None and request.url == url
    return request


def test_a_blocked_host_is_held_and_woken_by_one_timer_at_its_ready_time() -> None:
    s = _open()
    clock = s.clock_
    for url in ("http://a.test/1", "http://a.test/2", "http://b.test/1"):
        s.enqueue_request(Request(url))
    s.politeness.refused("a.test", clock.now, 30.0)
    assert _next(s) == ["http://b.test/1"]
    assert clock.armed == [T0 + 30]  # one timer, armed when the lane was parked
    assert _next(s) == []  # polled again: no new timer, nothing sent
    assert clock.armed == [T0 + 30] and s.woken == []
    clock.advance(29.9)
    assert s.woken == [] and _next(s) == []
    clock.advance(0.1)
    assert s.woken == [1]  # the engine is woken at once, not at its heartbeat
    assert _next(s) == ["http://a.test/1", "http://a.test/2"]
    s.close("finished")
    assert s.stats.get_value("banker/pushback/wakeups") == 1


def test_the_earliest_ready_host_re_arms_the_timer_and_an_interval_spaces_requests() -> None:
    s = _open()
    clock = s.clock_
    for url in ("http://a.test/1", "http://b.test/1", "http://c.test/1", "http://c.test/2"):
        s.enqueue_request(Request(url))
    s.politeness.refused("a.test", clock.now, 60.0)
    s.politeness.refused("b.test", clock.now, 10.0)
    s.politeness.crawl_delay("c.test", 5.0)
    assert _next(s) == ["http://c.test/1"]  # c.test's interval starts now
    assert clock.armed == [T0 + 5]  # c at 5 (b at 10 and a at 60 wait in the heap)
    clock.advance(5)
    assert _next(s) == ["http://c.test/2"]
    clock.advance(5)
    assert _next(s) == ["http://b.test/1"]
    clock.advance(50)
    assert _next(s) == ["http://a.test/1"]
    assert s.politeness.get("c.test").last_sent == T0 + 5


def test_a_429_blocks_its_host_and_the_request_is_put_back_not_retried() -> None:
    s = _open()
    clock = s.clock_
    request = _dispatch(s, "http://a.test/page")
    request.meta["retry_times"] = 1  # whatever RetryMiddleware counted before
    back = _respond(s, request, 429, **{"Retry-After": "120"})
    assert isinstance(back, Request) and back is not request
    assert back.dont_filter and back.url == request.url
    assert back.callback == s.spider.parse_page and back.meta["retry_times"] == 1
    assert s.politeness.get("a.test").blocked_until == T0 + 120
    assert s.enqueue_request(back)  # what the engine does with it
    assert _next(s) == []
    clock.advance(120)
    assert _next(s) == ["http://a.test/page"]
    stats = s.stats.get_stats()
    assert stats["banker/pushback/refused"] == stats["banker/pushback/requeued"] == 1
    assert stats["banker/pushback/retry_after"] == 1
    assert "retry/count" not in stats


def test_headerless_refusals_back_off_exponentially_and_decay_on_success() -> None:
    s = _open({"BANKER_PUSHBACK_BACKOFF": 1.0, "BANKER_PUSHBACK_BACKOFF_MAX": 100.0})
    clock = s.clock_
    waits = []
    request = _dispatch(s, "http://a.test/x")
    for _ in range(4):
        back = _respond(s, request, 503)
        assert isinstance(back, Request) and s.enqueue_request(back)
        waits.append(s.politeness.get("a.test").blocked_until - clock.now)
        assert s.next_request() is None
        clock.advance(waits[-1])
        request = s.next_request()
        assert request is not None and request.url == "http://a.test/x"
    assert isinstance(_respond(s, request, 200), Response)
    for i, wait in enumerate(waits):
        assert 0.75 * 2**i <= wait <= 1.25 * 2**i, waits
    assert s.politeness.get("a.test").refusals == 2  # 4, halved: the backoff decays
    assert s.stats.get_value("banker/pushback/requeued") == 4


def test_answers_of_requests_in_flight_when_the_block_began_count_once() -> None:
    s = _open({"CONCURRENT_REQUESTS_PER_DOMAIN": 4})
    s.crawler.engine.downloader.concurrency = 4
    inflight = [_dispatch(s, f"http://a.test/{i}") for i in range(3)]
    for request in inflight:
        assert isinstance(_respond(s, request, 429), Request)
    assert s.politeness.get("a.test").refusals == 1
    assert s.stats.get_value("banker/pushback/refused") == 3


def test_a_response_not_to_put_back_goes_on_but_its_host_is_blocked_all_the_same() -> None:
    s = _open()
    foreign = Request("http://a.test/robots.txt")  # engine.download: never scheduled
    assert isinstance(_respond(s, foreign, 503, **{"Retry-After": "9"}), Response)
    own = _dispatch(s, "http://b.test/x")
    own.meta["dont_retry"] = True
    assert isinstance(_respond(s, own, 429), Response)
    handled = _dispatch(s, "http://c.test/x")
    handled.meta["handle_httpstatus_list"] = [429]
    assert isinstance(_respond(s, handled, 429), Response)
    assert all(s.politeness.blocked(h, T0) for h in ("a.test", "b.test", "c.test"))
    assert s.stats.get_value("banker/pushback/passed_on") == 3
    assert s.stats.get_value("banker/pushback/requeued") is None


def test_pushback_off_is_scrapys_behaviour_and_other_codes_are_not_pushback() -> None:
    off = _open({"BANKER_PUSHBACK": False})
    request = _dispatch(off, "http://a.test/x")
    assert isinstance(_respond(off, request, 429, **{"Retry-After": "60"}), Response)
    assert off.politeness.hosts == {} and off.stats.get_value("banker/pushback/refused") is None
    on = _open({"BANKER_PUSHBACK_CODES": [503]})
    assert isinstance(_respond(on, _dispatch(on, "http://a.test/x"), 429), Response)
    assert isinstance(_respond(on, _dispatch(on, "http://b.test/x"), 503), Request)
    assert list(on.politeness.hosts) == ["b.test"]


def test_autothrottles_delay_is_recorded_as_the_hosts_throttle_delay() -> None:
    s = _open({"AUTOTHROTTLE_ENABLED": True})
    request = _dispatch(s, "http://a.test/x")
    s.crawler.engine.downloader.slots["a.test"] = slot = FakeSlot(2)
    slot.delay = 3.5
    _respond(s, request, 200)
    assert s.politeness.get("a.test").throttle_delay == 3.5
    assert s.politeness.take_changed() == {"a.test": s.politeness.get("a.test")}
    off = _open()
    off.crawler.engine.downloader.slots["a.test"] = slot
    _respond(off, _dispatch(off, "http://a.test/x"), 200)
    assert off.politeness.hosts == {}


def test_a_host_refusing_past_the_cap_is_reported_once_and_drained_without_jobdir(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = _open({"BANKER_PUSHBACK_MAX_REFUSALS": 2, "BANKER_PUSHBACK_BACKOFF": 1.0})
    clock = s.clock_
    first = _dispatch(s, "http://a.test/0")
    for i in range(1, 4):
        s.enqueue_request(Request(f"http://a.test/{i}"))
    assert isinstance(_respond(s, first, 429), Request)
    s.release(first, "response")
    clock.advance(10)
    second = s.next_request()
    assert second.url == "http://a.test/1"
    s.enqueue_request(Request("http://b.test/0"))
    with caplog.at_level("INFO"):
        with pytest.raises(IgnoreRequest, match=r"pushback: a\.test refused 2 times"):
            _respond(s, second, 429)
        s.release(second, "response")
        # The queued ones are dead-lettered as the frontier reaches them: never sent.
        assert _next(s) == ["http://b.test/0"]
    assert caplog.text.count("refused 2 times in a row") == 1
    lost = [r.getMessage() for r in caplog.records if "not kept (no JOBDIR)" in r.getMessage()]
    assert len(lost) == 3 and all("http://a.test/" in m for m in lost)
    assert s.stats.get_value("banker/pushback/dead_lettered") == 3
    assert s.stats.get_value("banker/pushback/hosts_given_up") == 1
    assert len(s) == 0 and not s.has_pending_requests()


def test_dead_letters_in_jobdir_are_requeued_by_the_command_and_fetched_on_resume(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    settings = {"BANKER_PUSHBACK_MAX_REFUSALS": 1}
    s = _open(settings, job=job)
    refused = _dispatch(s, "http://a.test/0")
    s.enqueue_request(Request("http://a.test/1", priority=5, callback=s.spider.parse_page))
    s.enqueue_request(Request("http://b.test/0"))
    with pytest.raises(IgnoreRequest):
        _respond(s, refused, 429, **{"Retry-After": "1"})
    s.release(refused, "response")
    assert _next(s) == ["http://b.test/0"]
    s.store.refill(0.0)  # the engine is done with both
    s.close("finished")
    letters = dl.list_letters(str(job))
    assert [(d.when, d.url, d.requeueable) for d in letters] == [
        ("pushback", "http://a.test/0", True), ("pushback", "http://a.test/1", True)]  # fmt: skip
    assert letters[0].error == "pushback: a.test refused 1 times"
    assert letters[1].error == "pushback: a.test refused 1 times (not sent)"
    assert letters[1].priority == 5 and letters[1].callback == "parse_page"
    state, _ = replay(str(job / "banker"))
    assert state.live == {}  # nothing pending: a resume does not fetch them too
    outcome = dl.requeue(str(job), None)
    assert len(outcome.plan.requeued) == 2 and outcome.left == 0

    resumed = _open(settings, job=job)
    assert resumed.stats.get_value("banker/jobdir/restored") == 2
    resumed.clock_.now = T0 + 2  # past the Retry-After promised before the stop
    got = []
    while (request := resumed.next_request()) is not None:
        got.append((request.url, request.priority))
        resumed.release(request, "response")
    assert got == [("http://a.test/1", 5), ("http://a.test/0", 0)]
    resumed.close("finished")


def test_host_states_persist_in_the_jobdir_snapshot_and_a_block_holds_after_resume(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    s = _open(job=job)
    s.enqueue_request(Request("http://a.test/x"))
    now = time.time()
    s.politeness.refused("a.test", now, 300.0)
    s.politeness.crawl_delay("b.test", 4.0)
    s.close("shutdown")
    header = json.loads((job / "banker" / SNAPSHOT).read_text().splitlines()[0])
    assert header["politeness"]["a.test"]["blocked_until"] == pytest.approx(now + 300, abs=1e-3)
    assert header["politeness"]["b.test"] == {"crawl_delay": 4.0}

    resumed = _open(job=job)
    resumed.clock_.now = now + 1
    assert resumed.politeness.get("a.test").blocked_until == pytest.approx(now + 300, abs=1e-3)
    assert _next(resumed) == []  # the block promised before the stop holds
    resumed.clock_.advance(300)
    assert _next(resumed) == ["http://a.test/x"]
    resumed.close("finished")

    # An older snapshot without the field resumes with no state.
    lines = (job / "banker" / SNAPSHOT).read_text().splitlines(keepends=True)
    old = json.loads(lines[0])
    old.pop("politeness", None)
    lines[0] = json.dumps(old, separators=(",", ":")) + "\n"
    (job / "banker" / SNAPSHOT).write_text("".join(lines))
    again = _open(job=job)
    assert again.politeness.hosts == {}
    again.close("finished")


def test_a_malformed_politeness_field_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = tmp_path / "job"
    s = _open(job=job)
    s.politeness.refused("a.test", time.time(), 300.0)
    s.close("shutdown")
    path = job / "banker" / SNAPSHOT
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["politeness"]["a.test"]["blocked_until"] = "soon"
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    resumed = _open(job=job)
    assert resumed.politeness.hosts == {}
    assert "Ignoring the hosts' politeness states" in caplog.text
    resumed.close("finished")


def test_the_store_hears_of_changed_states_about_once_a_second_and_at_close() -> None:
    s = _open()
    heard: list[dict[str, HostState]] = []
    s.store.politeness_changed = lambda changed: heard.append(dict(changed))  # type: ignore[method-assign]
    s.politeness.refused("a.test", T0, 5.0)
    s.next_request()  # the first poll hands them over
    s.politeness.crawl_delay("b.test", 1.0)
    s.next_request()  # within the second: not yet
    assert [set(h) for h in heard] == [{"a.test"}]
    s.close("finished")
    assert [set(h) for h in heard] == [{"a.test"}, {"b.test"}]
    # adopt(): a store taking hosts over merges what it read with what it knows.
    t = _open()
    t.enqueue_request(Request("http://a.test/x"))
    t.parts.politeness.adopt({"a.test": HostState(blocked_until=T0 + 60.0, refusals=2)})
    assert t.politeness.take_changed() == {}  # not reported back where it came from
    assert _next(t) == []  # the block it read holds here
    # A state read that is older than this node's own refusal does not lift it.
    t.politeness.refused("b.test", T0, 60.0)
    t.parts.politeness.adopt({"b.test": HostState()})
    assert t.politeness.get("b.test").blocked_until == T0 + 60.0
    assert t.politeness.get("a.test").refusals == 2


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"BANKER_PUSHBACK_CODES": []}, r"BANKER_PUSHBACK_CODES=\[\]: expected at least one"),
        ({"BANKER_PUSHBACK_CODES": [42]}, r"42 is not an HTTP status code"),
        ({"BANKER_PUSHBACK_CODES": 429}, r"expected a list of HTTP status codes"),
        ({"BANKER_PUSHBACK_BACKOFF": 0}, r"BANKER_PUSHBACK_BACKOFF=0: expected a finite number"),
        ({"BANKER_PUSHBACK_BACKOFF_MAX": 1}, r"must be >= BANKER_PUSHBACK_BACKOFF \(2.0\)"),
        ({"BANKER_PUSHBACK_MAX_REFUSALS": 0}, r"expected an integer >= 1"),
        ({"BANKER_CRAWL_DELAY_MAX": -1}, r"BANKER_CRAWL_DELAY_MAX=-1"),
        ({"BANKER_PUSHBACK": "maybe"}, r"BANKER_PUSHBACK='maybe': expected a boolean"),
    ],
)
def test_bad_settings_are_refused_with_their_name(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_config(settings)


def test_settings_give_the_politeness_constants() -> None:
    config = load_config({"BANKER_PUSHBACK_CODES": "429, 500", "BANKER_PUSHBACK_BACKOFF": 1,
                          "BANKER_PUSHBACK_BACKOFF_MAX": 30, "BANKER_PUSHBACK_MAX_REFUSALS": 3,
                          "BANKER_CRAWL_DELAY_MAX": 10})  # fmt: skip
    pc = config.politeness()
    assert (pc.codes, pc.backoff_base_s, pc.backoff_max_s, pc.max_refusals,
            pc.crawl_delay_max_s) == (frozenset({429, 500}), 1.0, 30.0, 3, 10.0)  # fmt: skip
    assert load_config({"BANKER_PUSHBACK_CODES": "[503]"}).pushback_codes == frozenset({503})


# -- real crawls against the web farm's pushing-back hosts ----------------------------------

CRAWL = '''
import json, sys, time
from pathlib import Path
import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy_banker.testing.resolver import farm_settings

args = json.loads(sys.argv[1])
out = args["out"]
log = {"sends": [], "responses": []}


class Witness:
    """Sees every response first (order 990): when and what the host answered."""

    def process_response(self, request, response, spider=None):
        log["responses"].append([time.time(), request.url, response.status,
                                 response.headers.get("Retry-After", b"").decode()])
        return response


class Spider(scrapy.Spider):
    name = "pushback"
    links = LinkExtractor()

    @classmethod
    def from_crawler(cls, crawler, *a, **kw):
        spider = super().from_crawler(crawler, *a, **kw)
        crawler.signals.connect(spider.reached, signal=signals.request_reached_downloader)
        return spider

    def reached(self, request, spider):
        log["sends"].append([time.time(), request.url])

    async def start(self):
        for url in args["urls"]:
            yield scrapy.Request(url, errback=self.failed)

    def parse(self, response):
        yield {"url": response.url, "status": response.status,
               "retry_times": response.meta.get("retry_times", 0)}
        if args.get("follow"):
            for link in self.links.extract_links(response):
                yield response.follow(link.url, errback=self.failed)

    def failed(self, failure):
        yield {"url": failure.request.url, "failed": type(failure.value).__name__}


settings = {
    **farm_settings(),
    "ADDONS": {"scrapy_banker.Addon": 500},
    "DOWNLOADER_MIDDLEWARES": {"__main__.Witness": 990},
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    "BANKER_STATS_FILE": out + ".stats.json",
    "FEEDS": {out + ".items.jsonl": {"format": "jsonlines", "overwrite": True}},
    "LOG_LEVEL": "INFO",
    **args.get("settings", {}),
}
process = CrawlerProcess(settings)
process.crawl(Spider)
process.start()
Path(out + ".log.json").write_text(json.dumps(log))
'''


@dataclass
class Crawl:
    stats: dict[str, Any]
    items: list[dict[str, Any]]
    sends: list[tuple[float, str]]
    responses: list[tuple[float, str, int, str]]
    log: str
    wall_s: float

    @property
    def fetched(self) -> set[str]:
        return {i["url"] for i in self.items if i.get("status") == 200}


def _crawl(tmp_path: Path, name: str, urls: list[str], *, follow: bool = False,
           **settings: Any) -> Crawl:  # fmt: skip
    script = tmp_path / "crawl.py"
    script.write_text(CRAWL)
    out = str(tmp_path / name)
    args = {"out": out, "urls": urls, "follow": follow, "settings": settings}
    t0 = time.monotonic()
    proc = run_python(script, json.dumps(args), timeout=120)
    wall = time.monotonic() - t0
    items_file = Path(out + ".items.jsonl")
    items = [json.loads(x) for x in items_file.read_text().splitlines()] if (
        items_file.exists()) else []  # fmt: skip
    log = json.loads(Path(out + ".log.json").read_text())
    return Crawl(json.loads(Path(out + ".stats.json").read_text()), items,
                 [tuple(s) for s in log["sends"]], [tuple(r) for r in log["responses"]],
                 proc.stderr, wall)  # fmt: skip


def _farm(**fields: Any) -> WebFarm:
    defaults: dict[str, Any] = {"seed": 5, "hosts": 1, "total_pages": 5,
                                "min_pages_per_host": 5, "cross_host_link_prob": 0.0,
                                "latency_ms": 1.0}  # fmt: skip
    return WebFarm(FarmConfig(**{**defaults, **fields}))


def _kept_retry_after(crawl: Crawl) -> None:
    """After every 429 with Retry-After N received at t, nothing was sent to its host before t+N."""
    for t, url, status, retry_after in crawl.responses:
        if status != 429 or not retry_after:
            continue
        host = urlsplit(url).hostname
        early = [s for s, u in crawl.sends if urlsplit(u).hostname == host
                 and t < s < t + float(retry_after)]  # fmt: skip
        assert early == [], f"sent {early} within Retry-After {retry_after} of {t}"


@pytest.mark.slow
@pytest.mark.scrapy213
@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"RETRY_ENABLED": False},
        {
            "AUTOTHROTTLE_ENABLED": True,
            "AUTOTHROTTLE_START_DELAY": 0.2,
            "AUTOTHROTTLE_MAX_DELAY": 1.0,
            "JOBDIR": True,
        },
    ],
    ids=["retry_on", "retry_off", "autothrottle"],
)
def test_retry_after_is_honoured_nothing_is_lost_and_no_retry_is_counted(
    tmp_path: Path, variant: dict[str, Any]
) -> None:
    settings = dict(variant)
    if settings.get("JOBDIR"):
        settings["JOBDIR"] = str(tmp_path / "job")
    with _farm(rate_limits={0: RateLimit(requests=2, window_s=1.0)}) as farm:
        start = farm.url(0, "/")
        expected = farm.expected_urls([start])
        crawl = _crawl(tmp_path, "c", [start], follow=True, **settings)
        server = farm.stats()
    assert crawl.stats["finish_reason"] == "finished"
    assert crawl.fetched == expected and len(crawl.items) == len(expected)
    assert server["refused"] > 0 and server["retry_after_violations"] == 0
    _kept_retry_after(crawl)
    assert crawl.stats["banker/pushback/refused"] == server["refused"]
    assert crawl.stats["banker/pushback/requeued"] == server["refused"]
    assert "retry/count" not in crawl.stats
    assert all(i["retry_times"] == 0 for i in crawl.items)
    if settings.get("AUTOTHROTTLE_ENABLED"):
        header = json.loads((tmp_path / "job" / "banker" / SNAPSHOT).read_text().split("\n")[0])
        state = header["politeness"][urlsplit(start).hostname]
        # AutoThrottle's delay (between DOWNLOAD_DELAY=0 and its maximum), kept with the host.
        assert 0 < state["throttle_delay"] <= 1.0


@pytest.mark.slow
@pytest.mark.scrapy213
def test_pushback_off_is_scrapys_behaviour_retried_at_once(tmp_path: Path) -> None:
    with _farm(rate_limits={0: RateLimit(requests=1, window_s=1.0)}) as farm:
        start = farm.url(0, "/")
        crawl = _crawl(tmp_path, "c", [start], follow=True, BANKER_PUSHBACK=False)
        server = farm.stats()
    assert server["retry_after_violations"] > 0  # the control: Scrapy hammers it
    assert crawl.stats["retry/count"] > 0
    assert not any(k.startswith("banker/pushback/") for k in crawl.stats)


@pytest.mark.slow
@pytest.mark.scrapy213
def test_headerless_refusals_back_off_growing_and_decaying_in_a_crawl(tmp_path: Path) -> None:
    # 503 without Retry-After for requests 0-2 of every 4 the host receives.
    with _farm(bursts={0: Burst(every=4, first=3)}) as farm:
        urls = sorted(farm.expected_urls([farm.url(0, "/")]))[:2]
        crawl = _crawl(tmp_path, "c", urls, BANKER_PUSHBACK_BACKOFF=0.1)
        server = farm.stats()
    assert crawl.fetched == set(urls) and server["refused"] == 6
    holds = []
    for t, _, status, _ in crawl.responses:
        if status == 503:
            holds.append(min(s for s, _ in crawl.sends if s > t) - t)
    # 3 refusals in a row (0.1, 0.2, 0.4 s), a success halves the count (3 -> 1),
    # so the next holds are 0.2, 0.4, 0.8 s: decayed, neither reset nor still growing.
    for hold, nominal in zip(holds, (0.1, 0.2, 0.4, 0.2, 0.4, 0.8), strict=True):
        assert 0.75 * nominal <= hold <= 1.25 * nominal + 0.1, holds
    assert "retry/count" not in crawl.stats


@pytest.mark.slow
@pytest.mark.scrapy213
def test_a_host_refusing_past_the_cap_is_dead_lettered_requeued_by_the_command_and_fetched(
    tmp_path: Path,
) -> None:
    job = str(tmp_path / "job")
    # Its first 3 requests are refused (503, no header), then it serves.
    with _farm(bursts={0: Burst(every=1000, first=3)}) as farm:
        urls = sorted(farm.expected_urls([farm.url(0, "/")]))[:4]
        first = _crawl(tmp_path, "first", urls, JOBDIR=job, BANKER_PUSHBACK_BACKOFF=0.1,
                       BANKER_PUSHBACK_MAX_REFUSALS=3)  # fmt: skip
        assert first.fetched == set() and first.stats["finish_reason"] == "finished"
        assert first.stats["banker/pushback/dead_lettered"] == 4
        assert first.stats["banker/pushback/hosts_given_up"] == 1
        assert first.log.count("refused 3 times in a row") == 1
        host = urlsplit(urls[0]).hostname
        letters = dl.list_letters(job)
        assert sorted(d.url for d in letters) == sorted(urls)
        assert all(d.when == "pushback" and d.requeueable for d in letters)
        assert letters[0].error == f"pushback: {host} refused 3 times"
        assert {d.error for d in letters[1:]} == {f"pushback: {host} refused 3 times (not sent)"}
        listing = run_scrapy("banker", "deadletters", "--jobdir", job, cwd=tmp_path)
        assert listing.stdout.startswith(f"4 dead letters in {job}")
        requeued = run_scrapy("banker", "deadletters", "--jobdir", job, "--requeue", "all",
                              "--json", cwd=tmp_path)  # fmt: skip
        assert len(json.loads(requeued.stdout)["requeued"]) == 4
        second = _crawl(tmp_path, "second", [], JOBDIR=job)
        server = farm.stats()
    assert second.fetched == set(urls) and second.stats["banker/jobdir/restored"] == 4
    assert server["refused"] == 3
    assert dl.list_letters(job) == []


@pytest.mark.slow
@pytest.mark.scrapy213
def test_a_block_promised_before_a_jobdir_stop_holds_after_the_resume(tmp_path: Path) -> None:
    job = str(tmp_path / "job")
    # One request per 5 s: the second page is refused with Retry-After: 5.  Three
    # pages: the resumed crawl waits out the block, then the rate.
    three = {"total_pages": 1, "min_pages_per_host": 1}
    with _farm(rate_limits={0: RateLimit(requests=1, window_s=5.0)}, **three) as farm:
        start = farm.url(0, "/")
        expected = farm.expected_urls([start])
        first = _crawl(tmp_path, "first", [start], follow=True, JOBDIR=job,
                       CLOSESPIDER_TIMEOUT=1.5)  # fmt: skip
        assert first.stats["finish_reason"] == "closespider_timeout"
        (refusal,) = [r for r in first.responses if r[2] == 429]
        second = _crawl(tmp_path, "second", [], follow=True, JOBDIR=job)
        server = farm.stats()
    assert second.stats["finish_reason"] == "finished"
    assert first.fetched | second.fetched == expected
    assert server["retry_after_violations"] == 0  # the resumed crawl waited as told
    assert min(s for s, _ in second.sends) >= refusal[0] + float(refusal[3])
    assert "Resumed the politeness state of 1 hosts (1 still blocked" in second.log
