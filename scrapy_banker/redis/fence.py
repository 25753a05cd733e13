"""The last-moment lease fence: a leased request is sent only on a lease this node can prove.

A fleet worker fetches a host only while it holds the leases of the host's
requests; the pop script fences a node off a partition it lost, and a new
owner's pops wait until the old owner's leases are released or expired.
What a worker already took out of Redis is checked again when the scheduler
dispatches it (:meth:`Inbound.keep
<scrapy_banker.redis.store_inbound.Inbound.keep>`).  But between the
scheduler and the socket a request can wait: in the downloader middlewares
(robots.txt being fetched), in its download slot's queue (``DOWNLOAD_DELAY``,
AutoThrottle, a full slot).  A worker frozen there (SIGSTOP, a suspended VM,
a stalled machine) past its lease TTL wakes up with requests whose leases
were reaped and handed to another node -- which fetches the same host at its
full per-host limit.  The chaos soak saw one host at 3 requests in flight
(limit 2) for 0.2 s when such a worker resumed.

So the check is made again at the last moment, in two places:

* :class:`LeaseFenceMiddleware` -- a downloader middleware placed after every
  other one (``process_request`` at order 990, after HttpCacheMiddleware's
  900): the request has passed every middleware that may make it wait;
* the download handlers themselves: at the first request the middleware
  wraps the engine's ``DownloadHandlers`` (``download_request_async`` on
  Scrapy >= 2.14, ``download_request`` on 2.13), so a request that waited in
  its slot's queue is checked when the downloader takes it out, immediately
  before the handler opens or reuses a connection.  Nothing later is
  reachable from outside the handler.

A request whose lease the worker cannot prove (:meth:`FrontierWorker.holds
<scrapy_banker.redis.worker.FrontierWorker.holds>`: its partition is owned
at the epoch it was leased under, and its pop or the last renewal round is
recent enough) is given back -- nacked with its delivery number, a no-op if
another node has it now -- counted ``banker/redis/fenced_at_send``, and not
sent: the middleware hands it back to the engine as a request to schedule,
which the store drops (:meth:`LeaseFence.swallow`), so neither the spider
nor ``RetryMiddleware`` ever sees it.  The request is fetched by whoever
holds it now.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest

from scrapy_banker.redis.store_inbound import lease_of
from scrapy_banker.scheduler.engine import running_scheduler

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

    from scrapy_banker.redis.store_acks import AckBook
    from scrapy_banker.redis.worker import FrontierWorker

logger = logging.getLogger(__name__)

__all__ = ["LeaseFence", "LeaseFenceMiddleware", "LeaseFenced"]


class LeaseFenced(IgnoreRequest):
    """Raised by the wrapped download handler: the request's lease cannot be proven.

    An ``IgnoreRequest`` so that no other component treats it as a network
    error (RetryMiddleware does not retry it, Scrapy does not log it as an
    error); :class:`LeaseFenceMiddleware` turns it back into the request.
    """


class LeaseFence:
    """The fleet store's side of the fence: the check, the give-back, the drop."""

    def __init__(
        self,
        worker: FrontierWorker,
        acks: AckBook,
        stats: StatsCollector,
        *,
        partitions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.acks = acks
        self.stats = stats
        self.partitions = partitions
        self.clock = clock
        #: Requests given back and handed to the engine to be dropped.
        self.given_back: set[Request] = set()

    def holds(self, request: Request) -> bool:
        """May ``request`` go to the wire?  True for anything that came with no lease."""
        token = lease_of(request, self.partitions)
        return token is None or self.worker.holds(token, self.clock())

    def give_back(self, request: Request, where: str) -> None:
        """Nack the request's lease, never ack it, and drop it when it comes back."""
        token = lease_of(request, self.partitions)
        if token is None:
            return
        logger.warning(
            "Not sending %s: its lease (partition %d) cannot be proven any more "
            "(this node stopped or lost the partition while it waited %s); given back",
            request.url, token.partition, where,
        )  # fmt: skip
        self.acks.pending.pop(request, None)
        self.worker.nack(token)
        self.given_back.add(request)
        self.stats.inc_value("banker/redis/fenced_at_send")

    def swallow(self, request: Request) -> bool:
        """Is this a request given back that the engine is scheduling again?  (Drop it.)"""
        if self.given_back and request in self.given_back:
            self.given_back.discard(request)
            return True
        return False


class LeaseFenceMiddleware:
    """Checks a fleet worker's lease of a request at the last moment before it is sent.

    Enabled by the add-on (``DOWNLOADER_MIDDLEWARES`` order 990); it does
    nothing unless the scheduler's store is a fleet's
    (:class:`~scrapy_banker.redis.store.RedisLeaseStore`).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._fence: LeaseFence | None = None
        self._looked = False
        #: Whether the download handlers were wrapped (False: this Scrapy has
        #: neither method; the middleware's check is then the last one).
        self.wrapped = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def fence(self) -> LeaseFence | None:
        """The running fleet store's fence, looked up once the crawl runs."""
        if not self._looked:
            store = getattr(running_scheduler(self.crawler), "store", None)
            if store is None:
                return None  # not running yet: look again next time
            self._looked = True
            fence = getattr(store, "fence", None)
            if isinstance(fence, LeaseFence):
                self._fence = fence
                self._wrap_handlers(fence)
        return self._fence

    def process_request(self, request: Request, spider: Spider | None = None) -> Request | None:
        fence = self.fence()
        if fence is None or fence.holds(request):
            return None
        fence.give_back(request, "in the downloader middlewares")
        return request  # scheduled again by the engine, and dropped by the store

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        if isinstance(exception, LeaseFenced):
            return request  # given back by the handler wrapper
        return None

    def _wrap_handlers(self, fence: LeaseFence) -> None:
        """Check again in the download handlers, after the slot's queue."""
        downloader = getattr(getattr(self.crawler, "engine", None), "downloader", None)
        handlers = getattr(downloader, "handlers", None)
        if handlers is None:
            return
        if hasattr(handlers, "download_request_async"):  # Scrapy >= 2.14
            original_async = handlers.download_request_async

            async def download_request_async(request: Request) -> Any:
                _check(fence, request)
                return await original_async(request)

            handlers.download_request_async = download_request_async
            self.wrapped = True
        elif hasattr(handlers, "download_request"):  # Scrapy 2.13
            original = handlers.download_request

            def download_request(request: Request, spider: Spider) -> Any:
                _check(fence, request)
                return original(request, spider)

            handlers.download_request = download_request
            self.wrapped = True


def _check(fence: LeaseFence, request: Request) -> None:
    if not fence.holds(request):
        fence.give_back(request, "in its download slot")
        raise LeaseFenced("lease lost before the request was sent")
