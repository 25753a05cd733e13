"""robots.txt's ``Crawl-delay`` applied, and robots.txt fetched once per host per fleet.

Scrapy's ``RobotsTxtMiddleware`` (``ROBOTSTXT_OBEY``) reads ``Disallow`` and
nothing else: ``Crawl-delay`` is parsed by Scrapy >= 2.18
(``RobotParser.crawl_delay``) but applied by nobody.  And each process
fetches each host's robots.txt itself, so a fleet of N workers fetches it
N times.  :class:`BankerRobotsTxtMiddleware` is that middleware with both
fixed; the add-on puts it in place of Scrapy's (same order, 100) when
``ROBOTSTXT_OBEY`` is on:

* **Crawl-delay.**  Once a host's robots.txt is parsed, its
  ``crawl_delay(user agent)`` (the agent ``ROBOTSTXT_USER_AGENT`` or the
  request's ``User-Agent``, as for ``Disallow``) becomes the host's minimum
  interval in the scheduler's politeness
  (:attr:`BankerScheduler.politeness <scrapy_banker.scheduler.BankerScheduler.politeness>`,
  capped by :setting:`BANKER_CRAWL_DELAY_MAX`): from then on the scheduler
  dispatches the host's requests that far apart, and on a fleet the delay
  (and the last request's time) travels with the host's partition.  The
  requests dispatched before the delay was known -- the host's first ones,
  waiting here for its robots.txt -- are let through one interval apart.
  On Scrapy < 2.18 only the default parser (Protego) gives it; with
  another parser nothing is applied.
* **Once per fleet.**  On :class:`~scrapy_banker.redis.scheduler.BankerRedisScheduler`
  the body comes through the store's ``robots_cache``
  (:class:`~scrapy_banker.redis.store.robots_cache.RobotsCache`): one worker of
  the fleet fetches it, the others read it from Redis.

Everything else is Scrapy's: ``Disallow`` rules, ``dont_obey_robotstxt``,
``ROBOTSTXT_PARSER``, the ``robotstxt/*`` stats of the fetches this worker
made.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from scrapy_banker.core.meta import META_SLOT
from scrapy_banker.core.politeness import Politeness
from scrapy_banker.scheduler import running_banker
from scrapy_banker.scheduler.engine import sleep
from scrapy_banker.scheduler.seams import RobotsTxt, SharedRobots

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.robotstxt import RobotParser

logger = logging.getLogger(__name__)

__all__ = ["BankerRobotsTxtMiddleware", "SharedRobots"]

#: A robots.txt as fetched: the HTTP status and the body, or None and the
#: reason the fetch failed (everything is then allowed, as with Scrapy).


class BankerRobotsTxtMiddleware(RobotsTxtMiddleware):
    """Scrapy's ``RobotsTxtMiddleware`` that applies ``Crawl-delay`` and shares robots.txt."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)  # NotConfigured without ROBOTSTXT_OBEY
        self.crawler = crawler
        #: netloc -> requests waiting for its robots.txt (each its own Deferred).
        self._waiting: dict[str, list[Deferred[RobotParser | None]]] = {}
        #: netloc -> its Crawl-delay for this crawl's user agent (None: none).
        self._delays: dict[str, float | None] = {}

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if request.meta.get("dont_obey_robotstxt"):
            return
        if request.url.startswith(("data:", "file:")):
            return
        # Whether the scheduler knew a Crawl-delay of the host when it let
        # this request go: read before waiting for the robots.txt.
        polite = self._politeness(request)
        knew = polite is not None and bool(polite[0].get(polite[1]).crawl_delay)
        rp = await self._parser(request)
        if rp is None:
            return
        useragent = self._useragent(request)
        if not rp.allowed(request.url, useragent):
            logger.debug("Forbidden by robots.txt: %(request)s", {"request": request},
                         extra={"spider": self.crawler.spider})  # fmt: skip
            self._counters().inc_value("robotstxt/forbidden")
            raise IgnoreRequest("Forbidden by robots.txt")
        netloc = urlparse_cached(request).netloc
        if netloc not in self._delays:
            self._delays[netloc] = _crawl_delay(rp, useragent)
        delay = self._delays[netloc]
        if delay and polite is not None:
            await self._apply(*polite, delay, knew)

    # -- Crawl-delay -----------------------------------------------------------------

    def _politeness(self, request: Request) -> tuple[Politeness, str] | None:
        """The scheduler's host states and the request's host (its download slot)."""
        slot = request.meta.get(META_SLOT)
        scheduler = running_banker(self.crawler)
        if slot is None or scheduler is None:
            return None  # not dispatched by a banker scheduler (engine.download, another one)
        return scheduler.politeness, str(slot)

    async def _apply(self, politeness: Politeness, slot: str, delay: float, knew: bool) -> None:
        """Make ``delay`` the host's interval; space out what the scheduler let go before."""
        if not politeness.get(slot).crawl_delay:
            politeness.crawl_delay(slot, delay)  # capped by BANKER_CRAWL_DELAY_MAX
            if politeness.get(slot).crawl_delay:
                self._counters().inc_value("banker/robots/crawl_delay_hosts")
        if knew or not politeness.get(slot).crawl_delay:
            return
        # Dispatched before the delay was known (the host's first requests,
        # which waited here for its robots.txt): one interval apart, in order
        # of arrival, each reserving its moment as the host's last request.
        now = time.time()
        at = max(now, politeness.ready_at(slot))
        politeness.sent(slot, at)
        if at > now:
            self._counters().inc_value("banker/robots/held")
            await sleep(at - now)

    # -- robots.txt --------------------------------------------------------------------

    async def _parser(self, request: Request) -> RobotParser | None:
        """The request's host's parser: parsed once per process, fetched once per fleet."""
        url = urlparse_cached(request)
        netloc = url.netloc
        parsers: dict[str, Any] = self._parsers
        if netloc in parsers:
            parser: RobotParser | None = parsers[netloc]
            return parser
        waiting = self._waiting.get(netloc)
        if waiting is not None:
            d: Deferred[RobotParser | None] = Deferred()
            waiting.append(d)
            return await maybe_deferred_to_future(d)
        self._waiting[netloc] = []
        rp = None
        try:
            status, body = await self._robots(f"{url.scheme}://{netloc}")
            if status is not None:
                rp = self._parserimpl.from_crawler(self.crawler, body)
                parsed = getattr(signals, "robots_parsed", None)  # Scrapy >= 2.14
                if parsed is not None:
                    self.crawler.signals.send_catch_log(
                        signal=parsed, robotparser=rp, request=request
                    )
        finally:
            parsers[netloc] = rp
            for d in self._waiting.pop(netloc, []):
                d.callback(rp)
        return rp

    async def _robots(self, origin: str) -> RobotsTxt:
        scheduler = running_banker(self.crawler)
        shared = None if scheduler is None else scheduler.store.features.robots
        if shared is None:
            return await self._download(origin)
        return await shared.fetch(origin, lambda: self._download(origin))

    async def _download(self, origin: str) -> RobotsTxt:
        """Fetch ``origin``'s robots.txt through the engine, as Scrapy does."""
        stats = self._counters()
        robotsreq = Request(
            f"{origin}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={"dont_obey_robotstxt": True},
            callback=NO_CALLBACK,
        )
        try:
            response = await self._engine_download(robotsreq)
        except Exception as exc:
            if not isinstance(exc, IgnoreRequest):
                logger.exception(  # Scrapy's words
                    "Error downloading %(request)s: %(f_exception)s",
                    {"request": robotsreq, "f_exception": exc},
                    extra={"spider": self.crawler.spider},
                )
                stats.inc_value(f"robotstxt/exception_count/{type(exc)}")
            stats.inc_value("robotstxt/request_count")
            return None, repr(exc).encode()
        stats.inc_value("robotstxt/request_count")
        stats.inc_value("robotstxt/response_count")
        stats.inc_value(f"robotstxt/response_status_count/{response.status}")
        return response.status, response.body

    async def _engine_download(self, request: Request) -> Response:
        engine: Any = self.crawler.engine
        download_async = getattr(engine, "download_async", None)  # Scrapy >= 2.14
        if download_async is not None:
            response: Response = await download_async(request)
            return response
        return await maybe_deferred_to_future(engine.download(request))

    # -- helpers -------------------------------------------------------------------------

    def _useragent(self, request: Request) -> str | bytes:
        useragent: str | bytes | None = self._robotstxt_useragent
        if not useragent:
            useragent = request.headers.get(b"User-Agent", self._default_useragent)
        return useragent or ""

    def _counters(self) -> Any:
        return self.crawler.stats


def _crawl_delay(rp: RobotParser, useragent: str | bytes) -> float | None:
    """The parser's Crawl-delay for ``useragent`` (Scrapy >= 2.18), else None.

    On older Scrapy, Scrapy's default parser (``ProtegoRobotParser``) keeps
    its Protego object in ``rp``, which has had ``crawl_delay`` all along:
    asked there, so Scrapy 2.13-2.17 with the default parser get it too.
    """
    crawl_delay = getattr(rp, "crawl_delay", None)
    if crawl_delay is None:
        protego: Any = getattr(rp, "rp", None)
        if protego is None or type(protego).__module__.split(".")[0] != "protego":
            return None
        crawl_delay = protego.crawl_delay
        if isinstance(useragent, bytes):
            useragent = useragent.decode("utf-8", "replace")
    try:
        delay = crawl_delay(useragent)
    except Exception:  # a third-party parser's bug must not stop the crawl
        logger.exception("robots.txt parser %s failed on crawl_delay()", type(rp).__name__)
        return None
    return None if delay is None else max(0.0, float(delay))
