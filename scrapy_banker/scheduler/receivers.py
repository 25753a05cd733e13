"""What the scheduler hears back from the engine: requests ending, refusals, idleness.

:class:`Receivers` holds the scheduler's receivers of Scrapy signals
(``request_left_downloader``, ``response_downloaded``, ``spider_idle``) and
the calls :class:`~scrapy_banker.middlewares.BankerDownloaderMiddleware`
makes (:meth:`Receivers.release`, :meth:`Receivers.pushback`), so that a
request's slot, admission grant and host state are settled in one place
however the request ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import signals
from scrapy.exceptions import CloseSpider

from scrapy_banker.core.meta import META_GRANT, META_SLOT, existing_meta
from scrapy_banker.scheduler.politeness_gate import HeldBack

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.http import Response

    from scrapy_banker.scheduler.dispatch import Dispatcher
    from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts

__all__ = ["Receivers"]


class Receivers:
    """The scheduler's ears (reactor thread); connected at open, disconnected at close."""

    def __init__(self, parts: SchedulerParts, store: RequestStore, dispatcher: Dispatcher) -> None:
        self.parts = parts
        self.store = store
        self.dispatcher = dispatcher

    def _signals(self) -> list[tuple[object, object]]:
        parts = self.parts
        wanted: list[tuple[object, object]] = [
            (self.request_left_downloader, signals.request_left_downloader)
        ]
        if parts.politeness.enabled:
            wanted.append((self.response_downloaded, signals.response_downloaded))
        if parts.control.counting:
            wanted.append((self.spider_idle, signals.spider_idle))
        return wanted

    def connect(self) -> None:
        for receiver, signal in self._signals():
            self.parts.crawler.signals.connect(receiver, signal=signal)

    def disconnect(self) -> None:
        for receiver, signal in self._signals():
            self.parts.crawler.signals.disconnect(receiver, signal=signal)

    # -- requests ending ---------------------------------------------------------------

    def release(self, request: Request, outcome: str) -> bool:
        """A request ended (``outcome``: how): free its slot and admission grant; idempotent.

        Called by :class:`~scrapy_banker.middlewares.BankerDownloaderMiddleware`
        for responses and exceptions, so requests that never reach the
        downloader (IgnoreRequest, cached responses) are accounted for too.
        """
        parts = self.parts
        slot = parts.downloader.ended(request)
        if slot is not None:
            parts.queue.slot_freed(slot)
        return parts.gate is not None and parts.gate.release(request, outcome)

    def request_left_downloader(self, request: Request, spider: Spider | None = None) -> None:
        # Ours: its slot has room now (the middleware releases it later, idempotent).
        # Foreign: marked as ended, so it stops counting while still in slot.active.
        self.release(request, "left_downloader")
        self.store.downloaded(request)
        # The downloader wrote the slot it used into meta: if a middleware
        # changed it, that slot has room now too.
        meta = request.meta
        slot = meta.get("download_slot")
        if slot is not None:
            self.parts.queue.slot_freed(str(slot))
            self.dispatcher.response(str(slot), meta.get("download_latency"))

    def dropped(self, request: Request) -> None:
        """``enqueue_request`` refuses ``request`` (the engine then sends ``request_dropped``).

        A copy of a request this scheduler handed out (a retry, a redirect)
        carries its slot and admission grant: free them.  Done here rather
        than on Scrapy's ``request_dropped`` signal, which the engine sends
        for every duplicate link -- a receiver costs a signal dispatch per
        link, most of them with nothing to free.
        """
        meta = existing_meta(request)
        if meta and (meta.get(META_SLOT) is not None or META_GRANT in meta):
            self.release(request, "dropped")

    # -- politeness --------------------------------------------------------------------

    def pushback(self, request: Request, response: Response) -> Response | Request:
        """A response arrived (``BankerDownloaderMiddleware``): the response, or the request
        to put back; ``IgnoreRequest`` for one dead-lettered.  See
        :meth:`~scrapy_banker.scheduler.politeness_gate.PolitenessGate.response`."""
        polite = self.parts.politeness
        if not polite.enabled:
            return response
        downloader = self.parts.downloader
        slot = downloader.slot_key(request)
        delay = downloader.slot_delay(slot) if polite.autothrottle else None
        return polite.response(request, response, slot, delay)

    def response_downloaded(
        self, response: Response, request: Request, spider: Spider | None = None
    ) -> None:
        """A refusal is blocked at once, and the host's requests waiting in its download
        slot's queue are taken back (the downloader would start one right after this)."""
        polite = self.parts.politeness
        if not polite.refusal(response):
            return
        downloader = self.parts.downloader
        slot = downloader.slot_key(request)
        polite.downloaded(response, slot)
        for queued, deferred in downloader.take_queued(slot):
            deferred.errback(HeldBack(f"{slot} pushed back while {queued} waited in its slot"))

    # -- the end -----------------------------------------------------------------------

    def spider_idle(self, spider: Spider | None = None) -> None:
        """The crawl would end: say why if budgets hold requests back (every mode alike).

        ``CloseSpider`` from a ``spider_idle`` receiver is how Scrapy lets a
        component name the reason; ``finished`` stays the reason of a crawl
        that fetched everything it found.
        """
        reason = self.parts.control.why_held()
        if reason is not None and not len(self.parts.queue):
            raise CloseSpider(reason)
