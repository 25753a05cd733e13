"""What runs inside the benchmarks' crawler processes: spiders, extensions, the engine heartbeat.

Loaded by import path -- ``_crawler:DeadlockSpider`` as a spec's spider
(``_runner.py``), ``_crawler.TopicSampler`` in ``EXTENSIONS`` -- by the
crawls of ``_runner.py`` (this folder is its script's) and by fleet workers
(``scrapy_banker.testing.fleet``, given this folder on ``PYTHONPATH`` by
``_harness.workers_import_benchmarks``).  Nothing here measures the peers:
the spiders are the workloads, the extensions record what the parent
reports (per-topic samples, per-task times, CPU marks, fetch logs).

* :class:`EngineHeartbeat` -- Scrapy polls a scheduler that did not wake the
  engine itself only on its engine heartbeat, every 5 s; a scaled-down
  benchmark (a 1.5 s watchdog, crawls of tens of seconds, an idle
  scrapy-redis worker that only that poll re-examines) would measure that
  poll, not the scheduler.  ``BENCH_ENGINE_HEARTBEAT`` (s) sets Scrapy's
  private ``ExecutionEngine._SLOT_HEARTBEAT_INTERVAL`` for the process.
* farm crawls (``crawl_skewed.py``, ``crawl_matrix.py``):
  :class:`TopicSampler`, with ``scrapy_banker.testing.fleet``'s ``FleetSpider``;
* ``deadlock.py``: :class:`DeadlockSpider` and :class:`TaskLog`;
* ``real_sites.py``: :class:`DocsSpider`, :class:`DocsRedisSpider`, :class:`CrawlSampler`;
* ``engine_overhead.py`` / ``jobdir_cost.py``: :class:`EngineSpider`,
  :class:`NullHandler`, :class:`CpuMarks`;
* fleets: :class:`FleetTuning` (``distributed.py``), :class:`FetchLog`
  (``chaos.py``), :class:`PlacementTuning` (``placement.py``).
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import scrapy
from _harness import self_cpu_s
from scrapy import signals
from scrapy.core.engine import ExecutionEngine
from scrapy.http import HtmlResponse, Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.httpobj import urlparse_cached
from scrapy_redis.spiders import RedisCrawlSpider

from scrapy_banker.scheduler.engine import looping_call

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self


class _Extension:
    """``from_crawler`` for the extensions below."""

    def __init__(self, crawler: Crawler) -> None:
        raise NotImplementedError

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)


# -- the engine heartbeat ----------------------------------------------------------------


def set_engine_heartbeat(seconds: float) -> None:
    """How often Scrapy's engine polls the scheduler when nothing woke it (stock: 5 s)."""
    if not hasattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL"):
        print("warning: this Scrapy has no engine heartbeat knob", file=sys.stderr)
    ExecutionEngine._SLOT_HEARTBEAT_INTERVAL = float(seconds)  # type: ignore[misc]


class EngineHeartbeat(_Extension):
    """Sets the engine heartbeat from ``BENCH_ENGINE_HEARTBEAT`` (s; 0 = Scrapy's)."""

    def __init__(self, crawler: Crawler) -> None:
        seconds = crawler.settings.getfloat("BENCH_ENGINE_HEARTBEAT", 0.0)
        if seconds > 0:
            set_engine_heartbeat(seconds)


# -- farm crawls: per-topic samples ------------------------------------------------------


class TopicSampler(_Extension):
    """Sample per-topic responses and pending work every ``BENCH_SAMPLE_INTERVAL`` seconds.

    Responses come from ``banker/topic/<t>/responses`` (scrapy-banker's
    downloader middleware, enabled for every scheduler by the add-on); a
    private ``response_received`` count is kept as a cross-check.  Pending
    work is tracked from engine and downloader signals, so it is the same
    definition whatever the scheduler: ``request_scheduled`` -
    ``request_dropped`` (dupefilter) - ``request_left_downloader`` (a
    transfer finished, successfully or not).  A request counts as pending
    while it waits in the scheduler *or* in a downloader slot's queue: both
    are work the topic is owed.  Topics (``BENCH_TOPICS``) are classified by
    URL path (``/<topic>/``), like the ``BANKER_TOPIC_RULES`` the runs use.
    The samples are written as JSON to ``BENCH_SAMPLES_FILE`` at the close.
    """

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.topics: list[str] = settings.getlist("BENCH_TOPICS")
        self.interval = settings.getfloat("BENCH_SAMPLE_INTERVAL", 0.5)
        self.path = settings.get("BENCH_SAMPLES_FILE")
        self._topic_re = re.compile(
            r"^[a-z]+://[^/]+/(" + "|".join(re.escape(t) for t in self.topics) + r")/"
        )
        self.pending = dict.fromkeys(self.topics, 0)
        self.received = dict.fromkeys(self.topics, 0)
        self.samples: list[dict[str, Any]] = []
        self.t0 = 0.0
        self.loop: Any = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self.scheduled, signal=signals.request_scheduled)
        crawler.signals.connect(self.left, signal=signals.request_dropped)
        crawler.signals.connect(self.left, signal=signals.request_left_downloader)
        crawler.signals.connect(self.response_received, signal=signals.response_received)

    def _topic(self, url: str) -> str | None:
        match = self._topic_re.match(url)
        return match.group(1) if match else None

    def scheduled(self, request: scrapy.Request, **kwargs: Any) -> None:
        topic = self._topic(request.url)
        if topic is not None:
            self.pending[topic] += 1

    def left(self, request: scrapy.Request, **kwargs: Any) -> None:
        topic = self._topic(request.url)
        if topic is not None:
            self.pending[topic] -= 1

    def response_received(self, response: Any, request: scrapy.Request, **kwargs: Any) -> None:
        topic = self._topic(request.url)
        if topic is not None:
            self.received[topic] += 1

    def sample(self, final: bool = False) -> None:
        self.samples.append(
            {
                "t": round(time.monotonic() - self.t0, 4),
                "all": int(self.stats.get_value("response_received_count", 0) or 0),
                "responses": [
                    int(self.stats.get_value(f"banker/topic/{t}/responses", 0) or 0)
                    for t in self.topics
                ],
                "received": [self.received[t] for t in self.topics],
                "pending": [self.pending[t] for t in self.topics],
                "final": final,
            }
        )

    def spider_opened(self, spider: scrapy.Spider) -> None:
        self.t0 = time.monotonic()
        self.loop = looping_call(self.sample)
        self.loop.start(self.interval, now=True)

    def spider_closed(self, spider: scrapy.Spider, reason: str) -> None:
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self.sample(final=True)
        if self.path:
            data = {"topics": self.topics, "interval": self.interval, "samples": self.samples}
            Path(self.path).write_text(json.dumps(data), encoding="utf-8")


# -- deadlock.py: hold-and-wait task chains ----------------------------------------------

#: Meta keys of the benchmark's own bookkeeping (not read by scrapy-banker).
META_T = "bench_task"
META_STEP = "bench_step"
STEPS = 3


def task_id(t: int) -> str:
    return f"task-{t:03d}"


class DeadlockSpider(scrapy.Spider):
    """Task ``t`` is the paper's "crawl request", three Scrapy requests::

        step 1: banker_need={"pages": 1}, banker_hold=<hold>   (acquire page 1)
        step 2: banker_need={"pages": 1}, banker_hold=<hold>   (acquire page 2)
        step 3: banker_finish=True                              (release both)

    each yielded by the previous one's callback, every one carrying
    ``banker_task`` and ``banker_max``.  All step-1 requests are start
    requests, so every task tries to start at once.
    """

    name = "deadlock"

    def __init__(
        self,
        chains: list[list[str]] | None = None,
        hold: bool = True,
        max_pages: int = 2,
        step_priority: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.chains = [list(c) for c in chains or []]
        self.hold = hold
        self.max_pages = max_pages
        self.step_priority = step_priority

    def step_request(self, t: int, step: int) -> scrapy.Request:
        meta: dict[str, Any] = {
            "banker_task": task_id(t),
            # On every step, not only the first: a step admitted after its task
            # was reclaimed starts a new process, which needs the claim again.
            "banker_max": {"pages": self.max_pages},
            META_T: t,
            META_STEP: step,
        }
        if step < STEPS:
            meta["banker_need"] = {"pages": 1}
            if self.hold:
                meta["banker_hold"] = True
        else:
            meta["banker_finish"] = True
        return scrapy.Request(
            self.chains[t][step - 1],
            callback=self.parse_step,
            meta=meta,
            priority=(step - 1) * self.step_priority,
            dont_filter=True,
        )

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for t in range(len(self.chains)):
            yield self.step_request(t, 1)

    def parse_step(self, response: Response) -> Iterator[scrapy.Request]:
        step = int(response.meta[META_STEP])
        if step < STEPS:
            yield self.step_request(int(response.meta[META_T]), step + 1)


class TaskLog(_Extension):
    """Per task and step: dispatch and response times (s since the spider opened).

    The benchmark's watchdog bookkeeping.  Dispatch is
    ``request_reached_downloader``: the scheduler handed the request to the
    engine, i.e. admission granted it; responses are ``response_received``.
    The Completed / Locked verdict is computed afterwards by ``deadlock.py``
    from these times, so the spider never has to guess what the scheduler
    did.  At the dispatch of step 2 it also reads (read-only) the task's
    allocation in the scheduler's ``BankersState``: a task that still holds
    its first page has 2 units allocated then; a task whose hold was
    reclaimed by ``BANKER_TASK_TIMEOUT`` and whose parked step-2 request was
    admitted later as a *fresh* task under the same id has only 1.  That is
    the "restarted" flag of the log -- evidence of what the scheduler
    actually did, not an input of the verdict.  ``BENCH_TASKS`` tasks;
    written as JSON to ``BENCH_TASK_LOG`` when the spider closes.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.path = crawler.settings.get("BENCH_TASK_LOG")
        n = crawler.settings.getint("BENCH_TASKS")
        self.dispatch: list[list[float | None]] = [[None] * STEPS for _ in range(n)]
        self.response: list[list[float | None]] = [[None] * STEPS for _ in range(n)]
        self.restarted = [False] * n
        self.t0 = time.monotonic()
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.reached, signal=signals.request_reached_downloader)
        crawler.signals.connect(self.received, signal=signals.response_received)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def spider_opened(self, spider: scrapy.Spider) -> None:
        self.t0 = time.monotonic()

    def reached(self, request: scrapy.Request, **kwargs: Any) -> None:
        t, step = request.meta.get(META_T), request.meta.get(META_STEP)
        if t is None or step is None or self.dispatch[t][step - 1] is not None:
            return  # not a task request, or a retry of one already dispatched
        self.dispatch[t][step - 1] = self._now()
        if step == 2 and request.meta.get("banker_hold"):
            from scrapy_banker.scheduler.engine import running_scheduler

            admission = getattr(running_scheduler(self.crawler), "admission", None)
            state = getattr(admission, "state", None)
            if state is not None and task_id(t) in state:
                self.restarted[t] = state.allocation_of(task_id(t)).get("pages", 0) < 2

    def received(self, response: Any, request: scrapy.Request, **kwargs: Any) -> None:
        t, step = request.meta.get(META_T), request.meta.get(META_STEP)
        if t is not None and step is not None and self.response[t][step - 1] is None:
            self.response[t][step - 1] = self._now()

    def spider_closed(self, spider: scrapy.Spider, reason: str) -> None:
        if self.path:
            data = {
                "dispatch": self.dispatch,
                "response": self.response,
                "restarted": self.restarted,
                "closed_at": self._now(),
            }
            Path(self.path).write_text(json.dumps(data), encoding="utf-8")


# -- real_sites.py: documentation sites --------------------------------------------------

#: Links to the farm's hosts, port included (``allow_domains`` compares host:port).
DOCS_LINK = r"^https?://[a-z0-9.-]+\.farm\.test(:\d+)?/"
DOCS_RULES = (Rule(LinkExtractor(allow=[DOCS_LINK]), callback="parse_item", follow=True),)


class _Item:
    def parse_item(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "title": response.css("title::text").get()}


class DocsSpider(_Item, CrawlSpider):
    """What a user writes for a documentation site: one rule, every page an item."""

    name = "docs"
    rules = DOCS_RULES


class DocsRedisSpider(_Item, RedisCrawlSpider):  # type: ignore[misc]
    """The same, with start URLs from Redis (``docs:start_urls``), for fleets."""

    name = "docs"
    rules = DOCS_RULES


class CrawlSampler(_Extension):
    """What the crawler is doing, every ``BENCH_SAMPLE_INTERVAL`` s, to ``BENCH_SAMPLES_FILE``.

    Requests in the downloader (of which on the wire, ``transferring``, and
    waiting in a download slot's queue, ``slot_queued``), responses waiting in or being processed by
    Scrapy's scraper, the process's CPU use, and how often the scheduler
    answered the engine with nothing and why (nothing queued at all, or
    only requests it would not send now: full slots or held back).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.interval = crawler.settings.getfloat("BENCH_SAMPLE_INTERVAL", 0.25)
        self.path = crawler.settings.get("BENCH_SAMPLES_FILE")
        self.rows: list[dict[str, Any]] = []
        self.empty = 0
        self.held = 0
        self._t0 = self._last = time.monotonic()
        self._cpu = time.process_time()
        self._call: Any = None
        crawler.signals.connect(self.start, signal=signals.spider_opened)
        crawler.signals.connect(self.stop, signal=signals.spider_closed)

    def _scheduler(self) -> Any:
        # Not scrapy_banker's running_scheduler: importing scrapy_banker.scheduler
        # would add its 0.1 s to the CPU of the peers' crawls.
        return self.crawler.engine._slot.scheduler  # type: ignore[union-attr]

    def start(self, spider: Any) -> None:
        scheduler = self._scheduler()
        original = scheduler.next_request

        def next_request() -> Any:
            request = original()
            if request is None:
                if len(scheduler):
                    self.held += 1
                else:
                    self.empty += 1
            return request

        scheduler.next_request = next_request
        self._call = looping_call(self.sample)
        self._call.start(self.interval, now=False)

    def sample(self) -> None:
        engine = self.crawler.engine
        assert engine is not None
        now, cpu = time.monotonic(), time.process_time()
        slot = engine.scraper.slot
        slots = engine.downloader.slots.values()
        self.rows.append({
            "t": round(now - self._t0, 3),
            "downloader": len(engine.downloader.active),
            "transferring": sum(len(s.transferring) for s in slots),
            "slot_queued": sum(len(s.queue) for s in slots),
            "scraper_queue": len(slot.queue) if slot is not None else 0,
            "scraper_active": len(slot.active) if slot is not None else 0,
            "scraper_bytes": slot.active_size if slot is not None else 0,
            "cpu": round((cpu - self._cpu) / max(now - self._last, 1e-6), 3),
            "scheduled": len(self._scheduler()),
            "none_empty": self.empty,
            "none_held": self.held,
        })  # fmt: skip
        self._cpu, self._last = cpu, now
        self.empty = self.held = 0

    def stop(self, spider: Any, reason: str) -> None:
        if self._call is not None and self._call.running:
            self._call.stop()
        if self.path:
            Path(self.path).write_text(json.dumps(self.rows), "utf-8")


# -- engine_overhead.py: a seed fanning out, answered at once ----------------------------

ENGINE_BODY = b"<html><body>" + b"x" * 2000 + b"</body></html>"


class NullHandler:
    """A download handler that answers every request at once (no network)."""

    lazy = False

    def __init__(self, crawler: Any = None) -> None:
        pass

    @classmethod
    def from_crawler(cls, crawler: Any) -> NullHandler:
        return cls(crawler)

    async def download_request(self, request: scrapy.Request) -> HtmlResponse:
        return HtmlResponse(request.url, body=ENGINE_BODY, request=request)

    async def close(self) -> None:
        pass


class EngineSpider(scrapy.Spider):
    """A seed whose callback yields ``requests`` requests over ``hosts`` hosts.

    ``http://h<i % H>.bench/<topic>/p<i>``; with ``links`` each page yields
    ``links - 1`` links to pages already queued and one new leaf.  Marks the
    CPU when the fan-out has been queued (``bench/cpu_fanout``,
    ``bench/responses_fanout``).
    """

    name = "bench"

    def __init__(
        self,
        requests: int = 0,
        hosts: int = 1,
        links: int = 0,
        topics: list[str] | None = None,
        meta: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.n, self.h, self.links = requests, hosts, links
        self.topics = list(topics or ["a", "b", "c"])
        self.meta = dict(meta or {})

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request("http://seed.bench/", callback=self.fan_out, dont_filter=True)

    def url(self, i: int, prefix: str = "p") -> str:
        return f"http://h{i % self.h}.bench/{self.topics[i % 3]}/{prefix}{i}"

    def fan_out(self, response: Response) -> Iterator[scrapy.Request]:
        meta = self.meta
        for i in range(self.n):
            yield scrapy.Request(self.url(i), callback=self.page, cb_kwargs={"i": i},
                                 meta=dict(meta))  # fmt: skip
        stats = self.crawler.stats
        assert stats is not None
        stats.set_value("bench/cpu_fanout", self_cpu_s())
        stats.set_value("bench/responses_fanout", stats.get_value("response_received_count", 0))

    def page(self, response: Response, i: int) -> Iterator[scrapy.Request]:
        if not self.links:
            return
        meta = self.meta
        for k in range(1, self.links):
            yield scrapy.Request(self.url((i * 7 + k) % self.n), callback=self.page,
                                 cb_kwargs={"i": 0}, meta=dict(meta))  # fmt: skip
        yield scrapy.Request(self.url(i, "x"), callback=self.leaf, meta=dict(meta))

    def leaf(self, response: Response) -> None:
        return None


class CpuMarks(_Extension):
    """The process's CPU at ``spider_opened`` and ``spider_closed``, into the stats.

    ``bench/cpu_open``, ``bench/cpu_close`` and ``bench/responses_close``:
    what the crawl cost from open to close, start-up and shutdown left out;
    ``bench/gc_s`` and ``bench/gc_collections``: how much of it Python's
    cyclic garbage collector took (its cost grows with the objects a
    scheduler keeps alive, which a profile charges to whatever code runs
    when a collection starts); ``bench/gc_objects_open``: the objects the
    collector tracks when the spider opens (modules imported included).
    """

    def __init__(self, crawler: Crawler) -> None:
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.gc_s = 0.0
        self.gc_collections = 0
        self._gc_started = 0.0
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.process_time()
        else:
            self.gc_s += time.process_time() - self._gc_started
            self.gc_collections += 1

    def opened(self, spider: Any) -> None:
        self.stats.set_value("bench/gc_objects_open", len(gc.get_objects()))
        self.stats.set_value("bench/cpu_open", self_cpu_s())
        gc.callbacks.append(self._gc)

    def closed(self, spider: Any, reason: str) -> None:
        self.stats.set_value("bench/cpu_close", self_cpu_s())
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        self.stats.set_value("bench/gc_s", round(self.gc_s, 4))
        self.stats.set_value("bench/gc_collections", self.gc_collections)
        self.stats.set_value(
            "bench/responses_close", self.stats.get_value("response_received_count", 0)
        )


# -- fleets: worker-side extensions ------------------------------------------------------


class FleetTuning(_Extension):
    """``distributed.py``: scrapy-redis 0.9 as its documentation says, for both systems.

    See that module's docstring ("Fairness"): ``REDIS_START_URLS_BATCH_SIZE``
    honoured (the spider's ``redis_batch_size``), seeds read from Redis go
    through the dupefilter (scrapy-redis makes them ``dont_filter``), and
    ``MAX_IDLE_TIME_BEFORE_CLOSE`` counted from the last response instead of
    from the module's import.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.batch = crawler.settings.getint("REDIS_START_URLS_BATCH_SIZE", 0)
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.response_received, signal=signals.response_received)

    def spider_opened(self, spider: Any) -> None:
        # The start() generator has not run yet: the first read takes the batch.
        if self.batch > 0 and hasattr(spider, "redis_batch_size"):
            spider.redis_batch_size = self.batch
        spider.spider_idle_start_time = time.time()
        make = getattr(spider, "make_request_from_data", None)
        if make is not None:

            def filtered(data: Any) -> Any:
                # scrapy-redis makes every start request dont_filter=True,
                # so a page linking back to a host's root fetched it again.
                request = make(data)
                if hasattr(request, "replace") and getattr(request, "dont_filter", False):
                    request = request.replace(dont_filter=False)
                return request

            spider.make_request_from_data = filtered

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        spider.spider_idle_start_time = time.time()


class FetchLog(_Extension):
    """``chaos.py``: one ``<time> <url>`` line per request handed to the downloader.

    To ``CHAOS_FETCH_LOG``, with ``os.write`` on an ``O_APPEND`` descriptor,
    no buffering, so a SIGKILL loses nothing already logged.
    """

    def __init__(self, crawler: Crawler) -> None:
        path = crawler.settings.get("CHAOS_FETCH_LOG")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else -1
        crawler.signals.connect(self.reached, signal=signals.request_reached_downloader)

    def reached(self, request: Any, spider: Any) -> None:
        if self.fd >= 0:
            os.write(self.fd, f"{time.time():.3f} {request.url}\n".encode())


#: Stats keys of :class:`PlacementTuning`.
SITE_STAT = "placement_bench/site/"
LATENCY_STAT = "placement_bench/download_latency_ms"


class PlacementTuning(_Extension):
    """``placement.py``: what each site cost this node.

    Counts crawl responses per site (netloc) into ``placement_bench/site/<netloc>``
    -- probes excluded -- so the parent can weight them by the true RTT of
    this (node, site) pair, and sums Scrapy's ``download_latency`` (ms) as a
    cross-check that the farm applied the RTTs.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.stats = crawler.stats
        crawler.signals.connect(self.response_received, signal=signals.response_received)

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        if request.meta.get("banker_probe"):
            return
        assert self.stats is not None
        self.stats.inc_value(SITE_STAT + urlparse_cached(request).netloc.lower())
        latency = request.meta.get("download_latency")
        if isinstance(latency, (int, float)):
            self.stats.inc_value(LATENCY_STAT, float(latency) * 1000.0)  # type: ignore[arg-type]


# -- freshness.py ------------------------------------------------------------------------


class FreshSpider(CrawlSpider):
    """``freshness.py``: Scrapy's ``CrawlSpider`` over the farm, every page a callback."""

    name = "fresh"
    rules = (Rule(LinkExtractor(allow=[r"farm\.test"]), callback="parse_page", follow=True),)

    def __init__(self, seeds: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = list(seeds or [])

    def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "status": response.status}


#: Meta keys of one delivery that a new fetch of the page must not carry.
_ONE_DELIVERY = ("download_latency", "download_slot", "download_timeout", "depth")


class FixedRevisits(_Extension):
    """``freshness.py``'s ``uniform`` and ``optimal`` peers: each page fetched again a fixed
    interval after its last copy, the interval the peer chose for it.

    ``BENCH_REVISIT_INTERVALS``: a JSON file, page key (``host/path``, as the
    farm's change model names pages) -> seconds, or ``null`` for a page never
    fetched again.  The crawl stays open (until ``CLOSESPIDER_TIMEOUT``).
    """

    def __init__(self, crawler: Crawler) -> None:
        from scrapy.exceptions import NotConfigured

        path = crawler.settings.get("BENCH_REVISIT_INTERVALS")
        if not path:
            raise NotConfigured()
        self.crawler = crawler
        self.intervals: dict[str, float | None] = json.loads(Path(path).read_text("utf-8"))
        self.pending: dict[str, Any] = {}
        crawler.signals.connect(self.response_received, signal=signals.response_received)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    def response_received(self, response: Any, request: scrapy.Request, spider: Any) -> None:
        if request.method != "GET" or response.status != 200:
            return
        parts = urlparse_cached(request)
        interval = self.intervals.get(f"{parts.hostname}{parts.path}")
        if interval is None:
            return
        from twisted.internet import reactor

        old = self.pending.pop(request.url, None)
        if old is not None and old.active():
            old.cancel()
        meta = {k: v for k, v in request.meta.items() if k not in _ONE_DELIVERY}
        again = request.replace(meta=meta, dont_filter=True)
        self.pending[request.url] = reactor.callLater(interval, self.send, again)  # type: ignore[attr-defined]

    def send(self, request: scrapy.Request) -> None:
        self.pending.pop(request.url, None)
        engine = self.crawler.engine
        if engine is not None and engine.running:
            engine.crawl(request)

    def spider_idle(self, spider: Any) -> None:
        from scrapy.exceptions import DontCloseSpider

        raise DontCloseSpider

    def spider_closed(self, spider: Any) -> None:
        for call in self.pending.values():
            if call.active():
                call.cancel()
        self.pending.clear()
