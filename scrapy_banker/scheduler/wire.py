"""The wire gate: the last checks before a request the scheduler let go is sent.

The scheduler lets a request go when its host has room, is not blocked and
its interval has passed.  Between that moment and the socket the request can
wait -- in downloader middlewares (robots.txt being fetched), in its
download slot's queue (``DOWNLOAD_DELAY``, AutoThrottle, a busy slot), or in
a frozen process -- and meanwhile the world changes: the host answers a
``429``, a fleet worker loses the request's lease.  So the checks are made
again at the last moment, by :class:`WireGateMiddleware`, in two places:

* its ``process_request``, placed after every other downloader middleware
  (order 990, after HttpCacheMiddleware's 900);
* the download handler itself: at the first request the middleware wraps
  the engine's ``DownloadHandlers`` (``download_request_async`` on Scrapy
  >= 2.14, ``download_request`` on 2.13), so a request that waited in its
  slot's queue is checked when the downloader takes it out, immediately
  before the handler opens or reuses a connection.  Nothing later is
  reachable from outside the handler.

What is checked:

* **the host's politeness** (:meth:`PolitenessGate.at_wire
  <scrapy_banker.scheduler.politeness_gate.PolitenessGate.at_wire>`): a host
  blocked now puts the request back (:class:`~scrapy_banker.scheduler.politeness_gate.HeldBack`),
  and a host with an interval (Crawl-delay, AutoThrottle) has its requests
  spaced by it at the wire, where a server measures it -- from the moment
  the previous one actually left, not the moment reserved for it, which a
  busy reactor's timer may overrun;
* **the store's own check**, if it has one (``store.features.fence``, a
  :class:`~scrapy_banker.scheduler.seams.WireCheck`): a fleet worker's lease
  (:class:`~scrapy_banker.redis.store.lease_fence.LeaseFence`), given back when it
  cannot be proven, the request then rescheduled and dropped by the store.

It does nothing for requests the scheduler did not hand out
(``engine.download``, robots.txt) nor under another scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import maybe_deferred_to_future

from scrapy_banker.scheduler import running_banker
from scrapy_banker.scheduler.engine import later, running_scheduler
from scrapy_banker.scheduler.seams import WireCheck

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_banker.scheduler.control_gate import ControlGate
    from scrapy_banker.scheduler.politeness_gate import PolitenessGate

logger = logging.getLogger(__name__)

__all__ = ["GivenBack", "WireCheck", "WireGateMiddleware"]


class GivenBack(IgnoreRequest):
    """Raised at the wire by a store's check: the store gave the request back.

    An ``IgnoreRequest`` so that nothing treats it as a network error
    (RetryMiddleware does not retry it, Scrapy does not log it as an error);
    :class:`WireGateMiddleware` turns it back into a request to schedule,
    which the store drops.
    """


class WireGateMiddleware:
    """Checks a request the scheduler let go at the last moment before it is sent.

    Enabled by the add-on (``DOWNLOADER_MIDDLEWARES`` order 990).
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._gate: PolitenessGate | None = None
        self._control: ControlGate | None = None
        self._check: WireCheck | None = None
        self._looked = False
        #: Whether the download handlers were wrapped (False: this Scrapy has
        #: neither method; the middleware's check is then the last one).
        self.wrapped = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _lookup(self) -> bool:
        """Find the running scheduler's gate and store check, once; wrap the handlers."""
        if self._looked:
            return self._gate is not None or self._check is not None
        if running_scheduler(self.crawler) is None:
            return False  # not running yet: look again next time
        self._looked = True
        scheduler = running_banker(self.crawler)
        if scheduler is None:
            return False  # another scheduler: nothing of ours to check
        self._gate = scheduler.parts.politeness
        self._control = scheduler.parts.control
        self._check = scheduler.store.features.fence
        self._wrap_handlers()
        return True

    def process_request(self, request: Request, spider: Spider | None = None) -> Request | None:
        if not self._lookup():
            return None
        try:
            self._now(request, "in the downloader middlewares")
        except GivenBack:
            return request  # scheduled again by the engine, and dropped by the store
        return None

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        if isinstance(exception, GivenBack):
            return request  # given back by the handler wrapper
        return None

    def _now(self, request: Request, where: str) -> None:
        """The checks that do not wait: the store's, a paused or a blocked host (HeldBack)."""
        if self._check is not None:
            self._check.check(request, where)
        if self._control is not None:
            self._control.check(request)
        if self._gate is not None:
            self._gate.check_blocked(request)

    def _floor(self, request: Request) -> float:
        """The operator's delay for ``request``'s host: the least interval whatever its own."""
        control = self._control
        return 0.0 if control is None else control.delay(request)

    def _wait(self, request: Request) -> float:
        gate = self._gate
        return 0.0 if gate is None else gate.at_wire(request, self._floor(request))

    def _settle(self, request: Request) -> float:
        """0 and recorded as sent, or more to wait: an earlier request of its host left late."""
        gate = self._gate
        return 0.0 if gate is None else gate.on_wire(request, self._floor(request))

    def _when_due(self, wait: float, request: Request, where: str, send: Callable[[], Any]) -> Any:
        """``send()`` once ``wait`` is over and :meth:`_settle` finds the host's interval passed."""
        if wait <= 0:
            wait = self._settle(request)
            if wait <= 0:
                return send()

        def again(_: object) -> Any:
            self._now(request, where)
            return self._when_due(0.0, request, where, send)

        return later(wait).addCallback(again)

    def _wrap_handlers(self) -> None:
        """Check again in the download handlers, after the slot's queue."""
        downloader = getattr(getattr(self.crawler, "engine", None), "downloader", None)
        handlers = getattr(downloader, "handlers", None)
        if handlers is None:
            return
        where = "in its download slot"
        if hasattr(handlers, "download_request_async"):  # Scrapy >= 2.14
            original_async = handlers.download_request_async

            async def download_request_async(request: Request) -> Any:
                self._now(request, where)
                wait = self._wait(request)
                while True:
                    if wait > 0:
                        await maybe_deferred_to_future(later(wait))
                        self._now(request, where)
                    wait = self._settle(request)
                    if wait <= 0:
                        return await original_async(request)

            handlers.download_request_async = download_request_async
            self.wrapped = True
        elif hasattr(handlers, "download_request"):  # Scrapy 2.13
            original = handlers.download_request

            def download_request(request: Request, spider: Spider) -> Any:
                self._now(request, where)
                return self._when_due(
                    self._wait(request), request, where, lambda: original(request, spider)
                )

            handlers.download_request = download_request
            self.wrapped = True
