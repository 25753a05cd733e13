"""Spider and downloader middlewares: topic tagging, per-topic accounting, server pushback.

Every Scrapy middleware of the package can be named from here, where a
Scrapy user looks for it: the ones defined beside the scheduler parts they
serve (the wire gate, the robots.txt middleware, the network measuring one,
revisits)
are imported into this module, and the add-on names them by these paths.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_banker.core.meta import META_GRANT, META_SLOT
from scrapy_banker.scheduler import running_banker
from scrapy_banker.scheduler.netaware import NetworkMeasureMiddleware
from scrapy_banker.scheduler.politeness_gate import HeldBack
from scrapy_banker.scheduler.revisits import RecrawlMiddleware, SitemapLastmodMiddleware
from scrapy_banker.scheduler.robots import BankerRobotsTxtMiddleware
from scrapy_banker.scheduler.topic import request_topic
from scrapy_banker.scheduler.wire import WireGateMiddleware
from scrapy_banker.settings import core_config

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

    from scrapy_banker.scheduler import BankerScheduler

__all__ = [
    "BankerDownloaderMiddleware",
    "BankerRobotsTxtMiddleware",
    "BankerTopicMiddleware",
    "NetworkMeasureMiddleware",
    "RecrawlMiddleware",
    "SitemapLastmodMiddleware",
    "WireGateMiddleware",
]

logger = logging.getLogger(__name__)


def _disabled(middleware: object) -> NotConfigured:
    """A bare ``NotConfigured`` for a middleware that is switched off.

    Scrapy logs the message of a ``NotConfigured`` as a warning, on every crawl
    with ``BANKER_ENABLED = False``; being off is no reason to warn.
    """
    logger.debug("Disabled %s: BANKER_ENABLED is False", type(middleware).__name__)
    return NotConfigured()


class BankerTopicMiddleware(BaseSpiderMiddleware):
    """Tag every request the spider yields with its topic.

    Tagging at the spider output (rather than only in the scheduler) means the
    topic is visible to every later component -- downloader middlewares,
    pipelines via ``response.meta`` -- and ``BANKER_TOPIC_RULES`` can match on
    the callback that will handle the response.  Topic priorities are applied
    by :class:`~scrapy_banker.scheduler.BankerScheduler`; ``request.priority``
    is left to the spider.
    """

    #: Requests counted locally before ``banker/topic/<topic>/requests`` is updated:
    #: a spider yields many links per page, most of them duplicates, and a
    #: stats call per link is measurable on a crawl of real sites.
    flush_every = 1024

    def __init__(self, crawler: Crawler):
        super().__init__(crawler)
        self.config = core_config(crawler)
        if not self.config.enabled:
            raise _disabled(self)
        assert crawler.stats is not None
        self.stats = crawler.stats
        self._requests: dict[str, int] = {}
        self._unflushed = 0
        crawler.signals.connect(self.flush, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def get_processed_request(self, request: Request, response: Response | None) -> Request:
        topic = request_topic(request, self.config, self.stats)
        counts = self._requests
        counts[topic] = counts.get(topic, 0) + 1
        self._unflushed += 1
        if self._unflushed >= self.flush_every:
            self.flush()
        return request

    def flush(self) -> None:
        """Add the locally counted requests to ``banker/topic/<topic>/requests``."""
        for topic, n in self._requests.items():
            self.stats.inc_value(f"banker/topic/{topic}/requests", n)
        self._requests.clear()
        self._unflushed = 0

    def get_processed_item(self, item: Any, response: Response | None) -> Any:
        # Items count towards the topic's yield, which the slice adjuster reads.
        if response is not None and response.request is not None:
            topic = request_topic(response.request, self.config, self.stats)
            self.stats.inc_value(f"banker/topic/{topic}/items")
        return item


class BankerDownloaderMiddleware:
    """Count what each topic yields from the network; release admission grants; hand
    server pushback to the scheduler.

    The per-topic response and byte counters are what the demo summary and the
    slice adjuster read; counting here, after the download, measures real
    yield rather than intentions.  It also releases the Banker's-admission
    grant of a request as soon as its download ends -- with a response or any
    exception, ``IgnoreRequest`` from an earlier middleware included -- before
    RetryMiddleware or RedirectMiddleware (lower orders) copy its meta into a
    new request.

    With :setting:`BANKER_PUSHBACK` on, every response then goes to the
    scheduler's politeness gate
    (:meth:`~scrapy_banker.scheduler.BankerScheduler.pushback`): a status of
    :setting:`BANKER_PUSHBACK_CODES` blocks its host (``Retry-After`` or the
    backoff) and the request is put back into the scheduler -- returned as a
    copy the engine schedules again, before ``RetryMiddleware`` (550) could
    retry it at once -- or, once the host refused past
    :setting:`BANKER_PUSHBACK_MAX_REFUSALS`, dead-lettered
    (``IgnoreRequest``).  See :doc:`/politeness`.
    """

    def __init__(self, crawler: Crawler):
        self.config = core_config(crawler)
        if not self.config.enabled:
            raise _disabled(self)
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.crawler = crawler
        self.pushback = self.config.pushback
        #: The running banker scheduler, found at the first response (None: not yet,
        #: or the crawl runs another scheduler).
        self._banker: BankerScheduler | None = None
        #: Topic -> its two response keys, made once.  Counted at every response
        #: (extensions read them when the spider closes, before this middleware
        #: could add a batch), through the stats collector's method bound once:
        #: each attribute read on it goes through a deprecation shim.
        self._keys: dict[str, tuple[str, str]] = {}
        self._inc = self.stats.inc_value

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response | Request:
        topic = request_topic(request, self.config, self.stats)
        keys = self._keys.get(topic)
        if keys is None:
            keys = (f"banker/topic/{topic}/responses", f"banker/topic/{topic}/response_bytes")
            self._keys[topic] = keys
        self._inc(keys[0])
        self._inc(keys[1], len(response.body))
        self._release(request, "response")
        if self.pushback:
            scheduler = self._scheduler()
            if scheduler is not None:
                return scheduler.pushback(request, response)
        return response

    def _scheduler(self) -> BankerScheduler | None:
        banker = self._banker
        if banker is None:
            banker = self._banker = running_banker(self.crawler)
        return banker

    def _release(self, request: Request, outcome: str) -> None:
        meta = request.meta
        if meta.get(META_SLOT) is not None or META_GRANT in meta:
            scheduler = self._scheduler()
            if scheduler is not None:
                scheduler.release(request, outcome)

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Any:
        if isinstance(exception, HeldBack):
            # Taken out of its slot's queue when its host pushed back: not a network
            # error, nothing was sent; put back into the scheduler.
            self._release(request, "held_back")
            scheduler = self._scheduler()
            return None if scheduler is None else scheduler.parts.politeness.held_back(request)
        topic = request_topic(request, self.config, self.stats)
        self.stats.inc_value(f"banker/topic/{topic}/exceptions")
        self._release(request, "exception")
        return None
