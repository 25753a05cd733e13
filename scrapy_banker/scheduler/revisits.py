"""Revisits: fetch a page again when it is due, conditionally, and learn how often it changes.

:class:`RecrawlMiddleware` is the adapter of :mod:`scrapy_banker.core.recrawl`
(``BANKER_RECRAWL``).  It is a downloader middleware because everything it
needs passes there: the response that tells whether the page changed, the
request to send its validators with, and the request to send again.  It
keeps, per URL, the :class:`~scrapy_banker.core.recrawl.UrlState` and the
request that fetched it, and a :class:`~scrapy_banker.core.recrawl.DueIndex`;
a timer hands every due URL back to the engine as an ordinary request
(``dont_filter``: the URL was seen, on purpose), so a revisit waits in the
same host queue, obeys the same per-host limit, push-back and budgets as any
other request.

A revisit (marked ``banker_revisit``) carries ``If-None-Match`` /
``If-Modified-Since`` from the last copy; a page the spider requests again by
itself is fetched as it asked.  A ``304`` counts as unchanged; so does a ``200`` whose content
signature (``BANKER_RECRAWL_SIGNATURE``: the body, or its visible text) did
not move.  By default a ``304`` ends there (``IgnoreRequest``: the callback
is not called, the stats count it); ``BANKER_RECRAWL_NOT_MODIFIED="callback"``
lets ``304`` through to the callback instead.

State lives in this process's memory; with ``JOBDIR`` it is also written,
URL by URL as fetches end, to the JOBDIR
(:class:`~scrapy_banker.scheduler.revisit_log.RevisitLog`), so a crawl
stopped -- cleanly or by ``kill -9`` -- resumes with every page's due time,
interval, validators and change-rate estimate.  A revisit carries the time
it was handed to the engine (its ``banker_revisit`` meta): one that reaches
the downloader after its page was fetched since (the copy a resumed queue
still held, beside the one the due times sent again) is superseded and
dropped.  On a fleet the states and due times live in the pages' partitions
in Redis instead (the store's ``features.revisits``,
:class:`~scrapy_banker.redis.store.fleet_revisits.FleetRevisits`): each fetch's
state is written there, the partition's owner takes its due pages, and a
revisit carries the state it was sent with (``banker_revisit_state``), so
whichever worker fetches it judges the response without a Redis read; this
process keeps only the states of the pages it fetched, as a cache.
``BANKER_RECRAWL_STAY_OPEN`` keeps an idle crawl open until the next due
time (a fleet's workers until they are stopped: a page may come due in any
partition a worker owns or takes over); without it, the crawl closes when
nothing is due now and counts what was still to come.

Which :class:`~scrapy_banker.core.recrawl.RecrawlPolicy` a page follows is
the first ``BANKER_RECRAWL_RULES`` entry its URL and topic match, else the
settings'.  With ``BANKER_RECRAWL_ESTIMATOR = "poisson"`` the due loop
re-solves, every :data:`PLAN_EVERY_S`, each host's budget multiplier from its
pages' estimated rates (:func:`~scrapy_banker.core.recrawl.plan_mu`), which
the next fetch of each page turns into its interval.

:class:`SitemapLastmodMiddleware` is the spider-side half: it reads the
``<lastmod>`` of the URLs a sitemap's callback requests and reports each to
:meth:`RecrawlMiddleware.lastmod`, which keeps it for the page's next fetch
to check and, once the host's dates proved right
(:class:`~scrapy_banker.core.recrawl.LastmodTrust`), makes a page dated after
its copy due at once.  It finds the crawl's :class:`RecrawlMiddleware` with
:func:`running_recrawl`.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider, IgnoreRequest, NotConfigured
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware
from scrapy.utils.gz import gunzip, gzip_magic_number
from scrapy.utils.job import job_dir
from scrapy.utils.log import failure_to_exc_info
from scrapy.utils.sitemap import Sitemap
from twisted.internet.task import LoopingCall

from scrapy_banker.core.meta import (
    META_RECRAWL,
    META_REVISIT,
    META_REVISIT_STATE,
    META_TOPIC,
    TRANSIENT_KEYS,
)
from scrapy_banker.core.recrawl import (
    DueIndex,
    LastmodTrust,
    Outcome,
    RecrawlPolicy,
    UrlState,
    apply_lastmod,
    outcome_of,
    parse_lastmod,
    plan_mu,
    policy_for,
)
from scrapy_banker.core.recrawl import signature as content_signature
from scrapy_banker.scheduler import running_banker
from scrapy_banker.scheduler.revisit_log import RevisitLog
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.scheduler.topic import callback_name
from scrapy_banker.settings import core_config

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.python.failure import Failure
    from typing_extensions import Self

    from scrapy_banker.scheduler.seams import SharedRevisits
    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

__all__ = ["RecrawlMiddleware", "SitemapLastmodMiddleware", "running_recrawl"]

#: The revisit middleware of each running crawl (what the sitemap middleware reports to).
_RUNNING: weakref.WeakKeyDictionary[Crawler, RecrawlMiddleware] = weakref.WeakKeyDictionary()


def running_recrawl(crawler: Crawler) -> RecrawlMiddleware | None:
    """The crawl's :class:`RecrawlMiddleware`, or None when revisits are off."""
    return _RUNNING.get(crawler)


#: Meta keys of one delivery that a revisit must not inherit (it is a new fetch):
#: Scrapy's, and scrapy-banker's process-local ones (a revisit carrying the
#: first fetch's budget charge would give that page back when it is queued).
_PER_FETCH = frozenset({
    "download_latency", "download_slot", "download_timeout", "redirect_times", "redirect_ttl",
    "redirect_urls", "redirect_reasons", "retry_times", META_REVISIT, META_REVISIT_STATE,
    *TRANSIENT_KEYS,
})  # fmt: skip

#: How often (s) the ``poisson`` estimator's plan is re-solved, and the share of a
#: host's fetch rate it plans revisits for.
PLAN_EVERY_S = 5.0
PLAN_SHARE = 0.9

#: Statuses that say nothing about the page's content: retried, redirected or refused.
_NOT_A_COPY = frozenset({301, 302, 303, 307, 308, 429, 503})


#: The stats key each outcome counts in (docs/stats.rst).
_OUTCOME_STAT = {
    Outcome.CHANGED: "banker/recrawl/changed",
    Outcome.UNCHANGED: "banker/recrawl/unchanged",
    Outcome.FAILED: "banker/recrawl/failed",
}


class RecrawlMiddleware:
    """Downloader middleware: conditional revisits of every page fetched, when due."""

    def __init__(self, crawler: Crawler, config: BankerConfig) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        #: The settings' policy, and the rules that give some pages their own.
        self.policy = config.recrawl_policy()
        self.rules = config.recrawl_rules
        self.signature = config.recrawl_signature
        self.callback_on_304 = config.recrawl_not_modified == "callback"
        self.stay_open = config.recrawl_stay_open
        self.states: dict[str, UrlState] = {}
        #: The spider's own request that fetched each URL: what a revisit copies.
        self.requests: dict[str, Request] = {}
        self.due = DueIndex()
        #: How often due URLs are handed to the engine: a fraction of the least interval.
        policies = [self.policy, *(r.policy for r in self.rules if r.policy is not None)]
        least = min(p.min_s for p in policies)
        #: The ``poisson`` estimator's plan: per host, the budget's multiplier, re-solved
        #: every :data:`PLAN_EVERY_S` from every page's estimate (``BANKER_RECRAWL_HOST_RATE``).
        self.host_rate = config.recrawl_host_rate
        self.plans = any(p.estimator == "poisson" for p in policies) and self.host_rate is not None
        self.mu: dict[str, float | None] = {}
        self._planned_at = 0.0
        self.tick_s = min(1.0, least / 4)
        self._loop: LoopingCall | None = None
        jobdir = job_dir(crawler.settings)
        #: The JOBDIR's copy of the state (None: memory only).
        self.log = (
            None
            if jobdir is None
            else RevisitLog(jobdir, RequestCodec(config.serialize_allowed_classes), self.stats)
        )
        #: Where a fleet keeps the states (None: this process keeps them), found at open.
        self.shared: SharedRevisits | None = None
        self.spider: Spider | None = None
        #: URLs whose revisit is being downloaded: a second copy waits for nothing.
        self.downloading: set[str] = set()
        #: Which hosts' sitemap ``lastmod`` proved right (:class:`SitemapLastmodMiddleware`).
        self.trust = LastmodTrust()
        _RUNNING[crawler] = self
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = core_config(crawler)
        if not config.recrawl:
            raise NotConfigured()  # bare: being off is no reason to warn
        return cls(crawler, config)

    # -- the due loop ------------------------------------------------------------------

    def spider_opened(self, spider: Spider) -> None:
        self.spider = spider
        banker = running_banker(self.crawler)
        self.shared = None if banker is None else banker.store.features.revisits
        if self.shared is not None:
            self.log = None  # a fleet's states live in Redis, not in a JOBDIR
            self.shared.start()
        elif self.log is not None:
            self._restore(self.log, spider)
        self._loop = LoopingCall(self.send_due)
        self._loop.start(self.tick_s, now=False).addErrback(self._loop_failed)

    def _loop_failed(self, failure: Failure) -> None:
        """One line a person reads; the traceback at DEBUG."""
        logger.error("Revisits stopped: %s", failure.getErrorMessage())
        logger.debug("Traceback of the error above", exc_info=failure_to_exc_info(failure))

    def spider_closed(self, spider: Spider) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self.shared is None:
            self._inc("banker/recrawl/due_at_close", len(self.due))
        if self.log is not None:
            self.log.compact(self.states)
            self.log.close()

    def _restore(self, log: RevisitLog, spider: Spider) -> None:
        """Adopt what the JOBDIR kept: every page's state, request and due time."""
        restored = log.restore(spider)
        now = time.time()
        for url, seen in restored.items():
            self.states[url] = seen.state
            self.requests[url] = seen.request
            self.due.schedule(url, seen.state.due)
        if restored:
            overdue = sum(1 for seen in restored.values() if seen.state.due <= now)
            logger.info("Resumed the revisits of %d pages from %s (%d due now)",
                        len(restored), log.path, overdue)  # fmt: skip
            self._inc("banker/recrawl/restored", len(restored))

    def spider_idle(self, spider: Spider) -> None:
        self.send_due()
        if self.stay_open and self._anything_to_come():
            raise DontCloseSpider

    def _anything_to_come(self) -> bool:
        """Whether a page will come due: one this process keeps; on a fleet always, as
        any page of the crawl may come due in a partition this worker owns or takes
        over (a worker stays a member of the fleet until it is stopped)."""
        return self.shared is not None or len(self.due) > 0

    def send_due(self) -> int:
        """Hand every URL due now to the engine; how many."""
        now = time.time()
        if self.plans and now - self._planned_at >= PLAN_EVERY_S:
            self.plan(now)
        requests = self.revisits(now)
        if requests:
            engine = self.crawler.engine
            for request in requests:
                engine.crawl(request)
            self._inc("banker/recrawl/revisits", len(requests))
        return len(requests)

    def plan(self, now: float) -> None:
        """Re-solve each host's multiplier for the ``poisson`` estimator (a share of the
        host's fetch rate is left for first fetches and the spider's own requests)."""
        assert self.host_rate is not None  # typing: only called when self.plans
        by_host: dict[str, list[UrlState]] = {}
        for url, state in self.states.items():
            by_host.setdefault(_host(url), []).append(state)
        budget = self.host_rate * PLAN_SHARE
        self.mu = {host: plan_mu(states, budget) for host, states in by_host.items()}
        self._planned_at = now

    def revisits(self, now: float) -> list[Request]:
        """The revisits of every URL due by ``now``, taken off the due index.

        A copy of the spider's request that fetched the page (its callback,
        its meta but what one delivery wrote: :meth:`_record` kept it so),
        ``dont_filter``: the URL was seen.
        """
        out = []
        if self.shared is not None:
            assert self.spider is not None  # typing: shared is found when the spider opens
            for url, state, kept in self.shared.take_due(self.spider):
                state = self._newest(url, state)
                self.states[url] = state
                meta = {**kept.meta, META_REVISIT: now, META_REVISIT_STATE: state.to_json()}
                out.append(kept.replace(url=url, meta=meta, dont_filter=True))
            return out
        for url in self.due.pop_due(now):
            first = self.requests.get(url)
            if first is None:
                continue
            meta = {**first.meta, META_REVISIT: now}
            out.append(first.replace(url=url, meta=meta, dont_filter=True))
        return out

    def _newest(self, url: str, state: UrlState) -> UrlState:
        """``state``, or the one this process holds for ``url`` if it was fetched later."""
        local = self.states.get(url)
        return local if local is not None and local.fetched > state.fetched else state

    def _state(self, url: str, request: Request) -> UrlState | None:
        """What is known of ``url``: this process's state, or the one a fleet's revisit
        carries (:data:`~scrapy_banker.core.meta.META_REVISIT_STATE`), the newer."""
        carried = request.meta.get(META_REVISIT_STATE) if url == request.url else None
        if isinstance(carried, dict):
            try:
                return self._newest(url, UrlState.from_json(carried))
            except ValueError as exc:
                logger.warning("Ignoring invalid meta %s on %s: %s", META_REVISIT_STATE,
                               request, exc)  # fmt: skip
                self._inc("banker/recrawl/invalid_meta")
        return self.states.get(url)

    # -- the middleware ----------------------------------------------------------------

    def process_request(self, request: Request, spider: Spider) -> None:
        if not request.meta.get(META_REVISIT) or not self._tracked(request):
            return
        state = self._state(request.url, request)
        if state is None:
            return
        issued = request.meta[META_REVISIT]
        if (
            request.url in self.downloading
            or (type(issued) is float and state.fetched > issued)
            or (self.shared is not None and self.shared.redelivered(request))
        ):
            # Fetched since this revisit was sent, or being fetched: a copy that
            # a resumed queue still held beside the one its due time sent again
            # (on a fleet: one a dead worker held, which Redis's due time sends again).
            self._inc("banker/recrawl/superseded")
            raise _Superseded(f"revisit superseded by another fetch: {request.url}")
        self.downloading.add(request.url)
        # A revisit is this middleware's own request: the validators of the
        # latest copy replace whatever the request it was copied from carried.
        for name, value in ((b"If-None-Match", state.etag),
                            (b"If-Modified-Since", state.last_modified)):  # fmt: skip
            if value:
                request.headers[name] = value
            else:
                request.headers.pop(name, None)
        if self.callback_on_304 and (state.etag or state.last_modified):
            allowed = request.meta.get(
                "handle_httpstatus_list", getattr(spider, "handle_httpstatus_list", [])
            )
            if 304 not in allowed:
                request.meta["handle_httpstatus_list"] = [*allowed, 304]

    def process_response(
        self, request: Request, response: Response, spider: Spider
    ) -> Request | Response:
        if request.meta.get(META_REVISIT):
            self.downloading.discard(request.url)
        policy = self._policy(request)
        if policy is None or response.status in _NOT_A_COPY:
            return response
        if response.status == 304 and not request.meta.get(META_REVISIT):
            return response  # the spider's own conditional request: its answer
        url = response.url
        now = time.time()
        not_modified = response.status == 304
        if not_modified or 200 <= response.status < 300:
            state = self._state(url, request) or policy.first(now)
            new_signature = None if not_modified else content_signature(response.body,
                                                                        self.signature)  # fmt: skip
            outcome = outcome_of(state.signature, new_signature, not_modified=not_modified)
            host = _host(url)
            self.trust.check_fetch(host, state, outcome)
            state = policy.observe(
                state, now, outcome, signature=new_signature, mu=self.mu.get(host),
                etag=_header(response, b"ETag"), last_modified=_header(response, b"Last-Modified"),
            )  # fmt: skip
            self._record(url, request, state, outcome)
        else:
            self._failed(url, request, now, policy)
        if not_modified:
            self._inc("banker/recrawl/not_modified")
            if not self.callback_on_304:
                raise IgnoreRequest(f"not modified since the last fetch: {url}")
        return response

    def process_exception(self, request: Request, exception: Exception, spider: Spider) -> None:
        if request.meta.get(META_REVISIT) and not _superseded(exception):
            self.downloading.discard(request.url)
        policy = self._policy(request)
        if policy is not None and not isinstance(exception, IgnoreRequest):
            self._failed(request.url, request, time.time(), policy)

    # -- helpers -----------------------------------------------------------------------

    def _failed(self, url: str, request: Request, now: float, policy: RecrawlPolicy) -> None:
        """A fetch of ``url`` that got no copy: tried again after the error interval."""
        state = self._state(url, request) or policy.first(now)
        state = policy.observe(state, now, Outcome.FAILED)
        self._record(url, request, state, Outcome.FAILED)

    def _record(self, url: str, request: Request, state: UrlState, outcome: Outcome) -> None:
        """Keep ``url``'s new state, schedule its next visit, count the outcome.

        The request a revisit copies is the spider's own, not a revisit."""
        self.states[url] = state
        self._inc(_OUTCOME_STAT[outcome])
        revisit = bool(request.meta.get(META_REVISIT))
        if self.shared is not None:
            # On a fleet the request is kept in Redis, with the state and due time.
            self.shared.save(url, state, None if revisit else _kept(request), self.spider)
            return
        new_request = url not in self.requests or not revisit
        if new_request:
            request = self.requests[url] = _kept(request)
        self.due.schedule(url, state.due)
        log = self.log
        if log is not None:
            log.write(url, state, request if new_request else None, self.spider)
            if log.should_compact():
                log.compact(self.states)

    def lastmod(self, url: str, at: float) -> None:
        """A sitemap says ``url`` last changed at ``at``: checked by its next fetch, and,
        once its host's claims proved right, a change since the last copy makes it due now."""
        state = self.states.get(url)
        if state is None:  # not fetched yet: its first fetch is to come anyway
            return
        now = time.time()
        new = apply_lastmod(state, at, now, self.trust.trusted(_host(url)))
        if new == state:  # the date a sitemap read before: nothing to keep or write again
            return
        self.states[url] = new
        moved = new.due != state.due
        if moved:
            self._inc("banker/recrawl/lastmod_due")
        if self.shared is not None:
            self.shared.save(url, new, None, self.spider)
            return
        if moved:
            self.due.schedule(url, new.due)
        if self.log is not None:
            self.log.write(url, new, None, self.spider)

    @staticmethod
    def _tracked(request: Request) -> bool:
        """Revisited: a GET of a page, unless its meta opts out (robots.txt never)."""
        return (
            request.method == "GET"
            and request.meta.get(META_RECRAWL, True) is not False
            and not request.url.endswith("/robots.txt")
        )

    def _policy(self, request: Request) -> RecrawlPolicy | None:
        """How ``request``'s page is revisited: the first ``BANKER_RECRAWL_RULES`` entry its
        URL and topic match, else the settings'; None when it is not revisited."""
        if not self._tracked(request):
            return None
        opted = request.meta.get(META_RECRAWL, True)
        if not isinstance(opted, bool):
            logger.warning("Ignoring invalid meta %s=%r on %s: expected True or False (the page "
                           "is revisited)", META_RECRAWL, opted, request)  # fmt: skip
            self._inc("banker/recrawl/invalid_meta")
        if not self.rules:
            return self.policy
        topic = request.meta.get(META_TOPIC)
        if not isinstance(topic, str):
            topic = self.config.topic_for(request.url, callback_name(request))
        return policy_for(self.rules, self.policy, request.url, topic)

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(key, count)


class SitemapLastmodMiddleware(BaseSpiderMiddleware):
    """Spider middleware: hand each sitemap ``<lastmod>`` to the revisits.

    Scrapy's ``SitemapSpider`` reads a sitemap's ``<loc>`` entries and drops
    their ``<lastmod>``.  This middleware reads the ``lastmod`` of the URLs a
    response's callback requested from the response's own sitemap (a
    ``urlset``, gzipped or not), whatever spider parsed it, and reports each
    to :meth:`RecrawlMiddleware.lastmod`: the requests themselves go on
    unchanged (a page already fetched is dropped by the dupefilter, as
    before).  A sitemap is itself a page, so it is revisited like one, and
    each new read of it passes its dates on.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.stats = crawler.stats
        self._dates: tuple[Response | None, dict[str, float]] = (None, {})

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not core_config(crawler).recrawl:
            raise NotConfigured()  # bare: being off is no reason to warn
        return cls(crawler)

    def get_processed_request(self, request: Request, response: Response | None) -> Request:
        if response is None:
            return request
        seen, dates = self._dates
        if seen is not response:
            dates = sitemap_dates(response)
            self._dates = (response, dates)
            if dates and self.stats is not None:
                self.stats.inc_value("banker/recrawl/lastmod_read", len(dates))
        at = dates.get(request.url)
        recrawl = running_recrawl(self.crawler)
        if at is not None and recrawl is not None:
            recrawl.lastmod(request.url, at)
        return request


def sitemap_dates(response: Response) -> dict[str, float]:
    """``<loc>`` -> ``<lastmod>`` (POSIX time) of a sitemap ``urlset``; empty for anything else."""
    body = response.body
    if gzip_magic_number(response):
        try:
            body = gunzip(body, max_size=50 * 1024 * 1024)
        except OSError:
            return {}
    if b"<urlset" not in body[:4096]:
        return {}
    try:
        sitemap = Sitemap(body)
    except Exception:
        return {}
    if sitemap.type != "urlset":
        return {}
    out = {}
    for entry in sitemap:
        loc, text = entry.get("loc"), entry.get("lastmod")
        if loc and text:
            at = parse_lastmod(text)
            if at is not None:
                out[loc] = at
    return out


def _kept(request: Request) -> Request:
    """The copy of the spider's ``request`` its page's revisits copy: without what one
    delivery wrote in its meta (:data:`_PER_FETCH`)."""
    return request.replace(meta={k: v for k, v in request.meta.items() if k not in _PER_FETCH})


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


class _Superseded(IgnoreRequest):
    """A revisit dropped because its page was fetched, or is being fetched, by another."""


def _superseded(exception: Exception) -> bool:
    return isinstance(exception, _Superseded)


def _header(response: Response, name: bytes) -> str | None:
    value = response.headers.get(name)
    return None if value is None else value.decode("latin-1")
