"""``BankerScheduler``: the scheduler users put in ``SCHEDULER``.

A thin shell holding Scrapy's ``BaseScheduler`` contract over named parts,
all built by :func:`scrapy_banker.scheduler.parts.build` (see
:class:`~scrapy_banker.scheduler.seams.SchedulerParts`): the classifier, the
downloader view, the local queue, the politeness and control gates, the
admission gate, and a request store --
:class:`~scrapy_banker.scheduler.store.MemoryStore` (dupefilter + JOBDIR)
here, a Redis lease store in
:class:`~scrapy_banker.redis.scheduler.BankerRedisScheduler`.  The pop loop
is :class:`~scrapy_banker.scheduler.dispatch.Dispatcher`, the engine's
signals and the middleware's calls go to
:class:`~scrapy_banker.scheduler.receivers.Receivers`.

Other components reach the running scheduler through :func:`running_banker`,
typed, and its store's optional features through ``store.features``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, ClassVar

from scrapy.core.scheduler import BaseScheduler, Scheduler
from twisted.internet.task import LoopingCall

from scrapy_banker.core.meta import META_CHARGED, META_SLOT
from scrapy_banker.scheduler.classifier import UnparsableURL
from scrapy_banker.scheduler.counters import SchedulerCounters
from scrapy_banker.scheduler.dispatch import Dispatcher
from scrapy_banker.scheduler.engine import running_scheduler
from scrapy_banker.scheduler.parts import build
from scrapy_banker.scheduler.receivers import Receivers
from scrapy_banker.scheduler.sampler import take_sample
from scrapy_banker.scheduler.store import MemoryStore
from scrapy_banker.settings import core_config, ops_config

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred

    from scrapy_banker.core.directory import ExtendibleDirectory
    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.politeness import Politeness
    from scrapy_banker.core.telemetry import Sample
    from scrapy_banker.scheduler.admission import Admission
    from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts, StoreFactory

logger = logging.getLogger(__name__)

__all__ = ["META_SLOT", "BankerScheduler", "running_banker"]

#: Seconds between two hand-overs of changed host states to the store.
POLITENESS_FLUSH_S = 1.0


class BankerScheduler(BaseScheduler):
    """Topic-aware, download-slot-aware frontier with an extendible-hash directory."""

    #: The request store this scheduler composes (built by the parts' factory).
    store_class: ClassVar[StoreFactory] = MemoryStore

    def __init__(self, parts: SchedulerParts, store: RequestStore) -> None:
        self.parts = parts
        self.crawler = parts.crawler
        self.stats = parts.stats
        self.queue = parts.queue
        self.store = store
        #: The operator's directives and the budgets.
        self.control = parts.control
        self.dispatcher = Dispatcher(parts, store)
        self.receivers = Receivers(parts, store, self.dispatcher)
        self.counters = SchedulerCounters(parts.stats)
        self.clock = time.monotonic
        self.spider: Spider | None = None
        #: Asks the store for the operator's directives once a second, even while
        #: nothing is fetched (a fully paused crawl); None where none come.
        self._control_timer: LoopingCall | None = None
        self._politeness_flush_at = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BaseScheduler:  # type: ignore[override]
        config = core_config(crawler)
        if not config.enabled:
            # Disabled means "exactly what Scrapy would do".
            logger.info("BANKER_ENABLED is False: using Scrapy's default scheduler")
            return Scheduler.from_crawler(crawler)
        return cls(*build(crawler, config, cls.store_class))

    @property
    def politeness(self) -> Politeness:
        """The hosts' states (keyed by download slot): what robots.txt's Crawl-delay sets."""
        return self.parts.politeness.politeness

    @property
    def directory(self) -> ExtendibleDirectory[str]:
        return self.queue.directory

    @property
    def admission(self) -> Admission | None:
        return None if self.parts.gate is None else self.parts.gate.admission

    def sample(self, top_slots: int | None = None) -> Sample:
        """What this scheduler is doing now, for the operator's view (reactor thread only).

        Once per sampling interval, never per request: see
        :mod:`scrapy_banker.scheduler.sampler`.  ``top_slots`` defaults to
        :setting:`BANKER_METRICS_TOP_SLOTS`.
        """
        if top_slots is None:
            top_slots = ops_config(self.crawler).metrics_top_slots
        return take_sample(self.parts, self.store, top_slots=top_slots)

    # -- BaseScheduler contract ---------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        self.parts.downloader.attach(self.crawler)
        self.receivers.connect()
        opened = self.store.open(spider)
        every = self.store.features.directives_s
        if every is not None:
            # Asked at once (a resumed crawl's directives hold before its first
            # request leaves), then whether requests flow or not.
            self._control_timer = LoopingCall(self._follow_control)
            self._control_timer.start(every, now=True)
        return opened

    def close(self, reason: str) -> Deferred[None] | None:
        self.receivers.disconnect()
        if self._control_timer is not None and self._control_timer.running:
            self._control_timer.stop()
        now = self.clock()
        if self.parts.gate is not None:
            self.parts.gate.close(now)  # parked requests go back to the queue, and so to the store
        self.parts.politeness.close()
        self.control.close()
        # Held over budget: pending like any queued request, saved with them.
        for entry in self.control.take_held():
            self.queue.requeue(entry, now)
        self._flush_politeness(now)
        self.counters.flush(now)
        self.queue.publish_stats(self.stats)
        self.dispatcher.close()
        return self.store.close(reason)

    def has_pending_requests(self) -> bool:
        gate = self.parts.gate
        return len(self.queue) > 0 or bool(gate and gate.parked) or self.store.has_pending()

    def __len__(self) -> int:
        gate = self.parts.gate
        return len(self.queue) + (len(gate) if gate else 0) + len(self.store)

    def enqueue_request(self, request: Request) -> bool:
        store = self.store
        # Errors of other components (a user's fingerprinter or dupefilter)
        # propagate, as through Scrapy's scheduler; only a URL nothing can
        # file is this scheduler's to report.
        if store.is_duplicate(request):
            self.receivers.dropped(request)
            return False
        try:
            c = self.parts.classifier.classify(request)
        except UnparsableURL as exc:
            logger.error("Dropping request with unparsable URL %s: %s", request, exc)
            self.stats.inc_value("banker/queue/malformed_url")
            self.receivers.dropped(request)
            return False
        now = self.clock()
        if META_CHARGED in request.meta:
            self.control.refund(request)  # put back or retried: charged again when it leaves
        self.counters.count("enqueued", store.put(request, c, now), c.topic, now)
        return True

    def next_request(self) -> Request | None:
        now = self.clock()
        store = self.store
        # The latest directives before any leased request is queued or let go:
        # a worker that just joined must not send a host past its operator's limit.
        self._follow_control()
        store.refill(now)
        if now >= self._politeness_flush_at:
            self._flush_politeness(now)
        entry = self.dispatcher.pop(now)
        if entry is None:
            store.polled(None)
            self.counters.flush(now)  # idle moment: make the counters exact
            return None
        request = entry.item
        self.parts.downloader.dispatched(request, entry.slot)
        self.parts.politeness.dispatched(entry.slot)
        self.counters.count("dequeued", store.dispatched(request), entry.topic, now)
        store.polled(request)
        return request

    # -- what other components call ---------------------------------------------------

    def pushback(self, request: Request, response: Response) -> Response | Request:
        """See :meth:`Receivers.pushback <scrapy_banker.scheduler.receivers.Receivers.pushback>`."""
        return self.receivers.pushback(request, response)

    def release(self, request: Request, outcome: str) -> bool:
        """See :meth:`Receivers.release <scrapy_banker.scheduler.receivers.Receivers.release>`."""
        return self.receivers.release(request, outcome)

    # -- internals ----------------------------------------------------------------------

    def _follow_control(self) -> None:
        """Apply the operator's directives if the store has newer ones."""
        state = self.store.directives(self.clock())
        if state is not None:
            self.control.follow(state, self._requeue)

    def _requeue(self, entry: Entry[Request]) -> None:
        self.queue.requeue(entry, self.clock())

    def _flush_politeness(self, now: float) -> None:
        """Hand the host states changed since the last time to the store (about once a second)."""
        self._politeness_flush_at = now + POLITENESS_FLUSH_S
        changed = self.politeness.take_changed()
        if changed:
            self.store.politeness_changed(changed)


def running_banker(crawler: Crawler) -> BankerScheduler | None:
    """The running crawl's banker scheduler; None before or after it, or under another one.

    Asked of the class's MRO, not with ``isinstance``: Scrapy's
    ``BaseScheduler`` metaclass makes every scheduler an instance of every
    scheduler class (it checks for the contract's methods).
    """
    scheduler = running_scheduler(crawler)
    return scheduler if BankerScheduler in type(scheduler).__mro__ else None
