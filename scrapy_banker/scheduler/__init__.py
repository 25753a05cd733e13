"""``BankerScheduler``: the scheduler users put in ``SCHEDULER``.

A thin shell holding Scrapy's ``BaseScheduler`` contract over named parts:

* a :class:`~scrapy_banker.scheduler.classifier.Classifier` (request -> topic,
  download slot, queue key, BKDR hash),
* a :class:`~scrapy_banker.scheduler.downloader.DownloaderView` (slot keys and
  room, like Scrapy's ``DownloaderInterface``),
* the :class:`~scrapy_banker.scheduler.queue.LocalQueue` (topics, the
  extendible-hash directory, slot lanes),
* a :class:`~scrapy_banker.scheduler.politeness.PolitenessGate` (server
  pushback: Retry-After, backoff, Crawl-delay; the hosts' states are
  :attr:`BankerScheduler.politeness`),
* an :class:`~scrapy_banker.scheduler.gate.AdmissionGate` when
  ``BANKER_RESOURCES`` is set (Banker's algorithm),
* a request store: :class:`~scrapy_banker.scheduler.store.MemoryStore`
  (dupefilter + JOBDIR) here, a Redis lease store in
  :class:`~scrapy_banker.redis.scheduler.BankerRedisScheduler`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy import signals
from scrapy.core.scheduler import BaseScheduler, Scheduler
from scrapy.exceptions import CloseSpider
from scrapy.utils.misc import build_from_crawler
from twisted.internet.task import LoopingCall

from scrapy_banker.core.meta import META_CHARGED, META_GRANT, META_SLOT, existing_meta
from scrapy_banker.core.pacing import Pacer, PacerConfig
from scrapy_banker.scheduler.classifier import Classifier, UnparsableURL
from scrapy_banker.scheduler.control import ControlGate
from scrapy_banker.scheduler.control_file import POLL_S as CONTROL_POLL_S
from scrapy_banker.scheduler.control_file import ControlFile
from scrapy_banker.scheduler.counters import SchedulerCounters
from scrapy_banker.scheduler.downloader import DownloaderView
from scrapy_banker.scheduler.engine import scraper_backlog, wake_engine
from scrapy_banker.scheduler.gate import AdmissionGate
from scrapy_banker.scheduler.jobdir import JobDir
from scrapy_banker.scheduler.politeness import HeldBack, PolitenessGate
from scrapy_banker.scheduler.queue import LocalQueue
from scrapy_banker.scheduler.sampler import take_sample
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.scheduler.store import MemoryStore, RequestStore, SchedulerParts
from scrapy_banker.settings import core_config, ops_config

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred

    from scrapy_banker.core.control import ControlState
    from scrapy_banker.core.directory import ExtendibleDirectory
    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.politeness import Politeness
    from scrapy_banker.core.telemetry import Sample
    from scrapy_banker.scheduler.admission import Admission

logger = logging.getLogger(__name__)

__all__ = ["META_SLOT", "BankerScheduler"]

#: Seconds between two hand-overs of changed host states to the store.
POLITENESS_FLUSH_S = 1.0


class BankerScheduler(BaseScheduler):
    """Topic-aware, download-slot-aware frontier with an extendible-hash directory.

    Seams of per-host politeness (issue #26), for stores and extensions:

    * :attr:`politeness` -- the hosts' :class:`~scrapy_banker.core.politeness.Politeness`
      (keyed by download slot).  Whatever sets a state there (a Crawl-delay
      through ``politeness.crawl_delay(host, seconds)``) is enforced by the
      gate at the next pop of the host's lanes.
    * the store's ``politeness_changed(states)``, called about once a second
      (and at close) with ``politeness.take_changed()``: what a fleet store
      publishes with the host's partition;
    * ``parts.politeness.adopt(states)``: what a store calls for hosts it
      takes over (their lanes re-check at once);
    * the store's ``dead_letter(request, reason, entry)`` for requests given
      up on (see :class:`~scrapy_banker.scheduler.store.RequestStore`).
    """

    #: The request store this scheduler composes (built with ``build_from_crawler``).
    store_class: ClassVar[Any] = MemoryStore

    def __init__(self, parts: SchedulerParts, store: RequestStore) -> None:
        self.parts = parts
        self.crawler = parts.crawler
        self.config = parts.config
        self.stats = parts.stats
        self.downloader = parts.downloader
        self.classifier = parts.classifier
        self.queue = parts.queue
        self.topics = parts.queue.topics
        self.frontier = parts.queue.frontier
        self.store = store
        self.gate = parts.gate
        #: The pushback gate, and the hosts' states it holds (the fleet's seam).
        self.politeness_gate = polite = parts.politeness
        self.politeness: Politeness = polite.politeness
        polite.on_ready = self._hosts_ready
        #: The operator's directives and the budgets (None in hand-built parts).
        self.control = parts.control
        if self.control is not None:
            self.control.on_ready = self._hosts_ready
        #: A single process's control channel: ``JOBDIR/banker/control.json``.
        jobdir = getattr(store, "jobdir", None)
        self.control_file = (
            ControlFile(jobdir.root)
            if isinstance(jobdir, JobDir) and self.control is not None
            else None
        )
        #: Polls the control file even while nothing is fetched (a fully paused crawl).
        self._control_timer: LoopingCall | None = None
        store_dead_letter = getattr(store, "dead_letter", None)
        if store_dead_letter is not None:
            polite.drain = True
            polite.dead_letter = lambda request, reason: store_dead_letter(request, reason, None)
        self._politeness_changed = getattr(store, "politeness_changed", None)
        self._politeness_flush_at = 0.0
        self.counters = SchedulerCounters(parts.stats)
        self.clock = time.monotonic
        self.spider: Spider | None = None
        #: Long-pole pacing (:mod:`scrapy_banker.core.pacing`), None with BANKER_PACING off.
        self.pacer = (
            Pacer(PacerConfig(backlog=parts.config.pacing_backlog)) if parts.config.pacing else None
        )
        self.paced = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BaseScheduler:  # type: ignore[override]
        config = core_config(crawler)
        if not config.enabled:
            # Disabled means "exactly what Scrapy would do".
            logger.info("BANKER_ENABLED is False: using Scrapy's default scheduler")
            return Scheduler.from_crawler(crawler)
        assert crawler.stats is not None
        settings = crawler.settings
        downloader = DownloaderView(settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))
        politeness = PolitenessGate(
            config, crawler.stats, downloader.is_free,
            autothrottle=settings.getbool("AUTOTHROTTLE_ENABLED"),
        )  # fmt: skip
        control = ControlGate(crawler.stats, downloader, politeness.is_free, config.budgets())
        politeness.control = control
        queue = LocalQueue(config, control.is_free, downloader.idle)
        control.topics = queue.topics
        gate = AdmissionGate(config, crawler.stats, queue.requeue) if config.resources else None
        parts = SchedulerParts(
            crawler=crawler,
            config=config,
            stats=crawler.stats,
            downloader=downloader,
            classifier=Classifier(config, downloader, crawler.stats),
            queue=queue,
            politeness=politeness,
            codec=RequestCodec(config.serialize_allowed_classes),
            gate=gate,
            control=control,
        )
        return cls(parts, build_from_crawler(cls.store_class, crawler, parts))

    @property
    def directory(self) -> ExtendibleDirectory[str]:
        return self.queue.directory

    @property
    def admission(self) -> Admission | None:
        return None if self.gate is None else self.gate.admission

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
        self.downloader.attach(self.crawler)
        connect = self.crawler.signals.connect
        connect(self._request_left_downloader, signal=signals.request_left_downloader)
        if self.politeness_gate.enabled:
            connect(self._response_downloaded, signal=signals.response_downloaded)
        if self.control is not None and self.control.counting:
            connect(self._spider_idle, signal=signals.spider_idle)
        opened = self.store.open(spider)
        if self.control_file is not None:
            # Read at once (a resumed crawl's directives hold before its first
            # request leaves), then every POLL_S whether requests flow or not.
            self._control_timer = LoopingCall(self._poll_control)
            self._control_timer.start(CONTROL_POLL_S, now=True)
        return opened

    def close(self, reason: str) -> Deferred[None] | None:
        disconnect = self.crawler.signals.disconnect
        disconnect(self._request_left_downloader, signal=signals.request_left_downloader)
        if self.politeness_gate.enabled:
            disconnect(self._response_downloaded, signal=signals.response_downloaded)
        if self.control is not None and self.control.counting:
            disconnect(self._spider_idle, signal=signals.spider_idle)
        if self._control_timer is not None and self._control_timer.running:
            self._control_timer.stop()
        now = self.clock()
        if self.gate is not None:
            self.gate.close(now)  # parked requests go back to the queue, and so to the store
        self.politeness_gate.close()
        if self.control is not None:
            self.control.close()
            # Held over budget: pending like any queued request, saved with them.
            for entry in self.control.take_held():
                self.queue.requeue(entry, now)
        self._flush_politeness(now)
        self.counters.flush(now)
        self.queue.publish_stats(self.stats)
        if self.pacer is not None:
            self.stats.set_value("banker/pacing/held", self.paced)
        return self.store.close(reason)

    def has_pending_requests(self) -> bool:
        gate = self.gate
        return len(self.queue) > 0 or bool(gate and gate.parked) or self.store.has_pending()

    def __len__(self) -> int:
        return len(self.queue) + (len(self.gate) if self.gate else 0) + len(self.store)

    def enqueue_request(self, request: Request) -> bool:
        store = self.store
        # Errors of other components (a user's fingerprinter or dupefilter)
        # propagate, as through Scrapy's scheduler; only a URL nothing can
        # file is this scheduler's to report.
        if store.is_duplicate(request):
            self._dropped(request)
            return False
        try:
            c = self.classifier.classify(request)
        except UnparsableURL as exc:
            logger.error("Dropping request with unparsable URL %s: %s", request, exc)
            self.stats.inc_value("banker/queue/malformed_url")
            self._dropped(request)
            return False
        now = self.clock()
        control = self.control
        if control is not None and META_CHARGED in request.meta:
            control.refund(request)  # put back or retried: charged again when it leaves
        self.counters.count("enqueued", store.put(request, c, now), c.topic, now)
        return True

    def next_request(self) -> Request | None:
        now = self.clock()
        store = self.store
        store.refill(now)
        if now >= self._politeness_flush_at:
            self._flush_politeness(now)
        entry = self._pop(now)
        if entry is None:
            store.polled(None)
            self.counters.flush(now)  # idle moment: make the counters exact
            return None
        request = entry.item
        self.downloader.dispatched(request, entry.slot)
        self.politeness_gate.dispatched(entry.slot)
        self.counters.count("dequeued", store.dispatched(request), entry.topic, now)
        store.polled(request)
        return request

    def _pop(self, now: float) -> Entry[Request] | None:
        queue, store, gate = self.queue, self.store, self.gate
        if gate is not None:
            gate.before_pop(now)
        pop = queue.pop
        pacer = self.pacer
        if pacer is not None:
            if pacer.due(now):
                self.downloader.priority_slots = pacer.refresh(
                    now, time.process_time(), self.frontier.backlogs, len(queue),
                    self.downloader.concurrency,
                )  # fmt: skip
            if pacer.hold(scraper_backlog(self.crawler)):
                critical = pacer.critical
                self.paced += 1

                def pop(now: float) -> Entry[Request] | None:
                    return queue.pop_slots(critical, now)

        polite = self.politeness_gate
        control = self.control
        budgets = control is not None and control.counting
        while (entry := pop(now)) is not None:
            if not store.keep(entry):
                continue
            if polite.given_up and polite.draining(entry.slot):
                self._dead_letter_entry(entry)
                continue
            if budgets and control is not None and not control.charge(entry):
                continue
            if gate is None or gate.admit(entry):
                return entry
        if gate is not None:
            gate.nothing_to_dispatch(now, self.downloader.idle)
        return None

    # -- politeness -------------------------------------------------------------------

    def pushback(self, request: Request, response: Response) -> Response | Request:
        """A response arrived (``BankerDownloaderMiddleware``): the response, or the request
        to put back; ``IgnoreRequest`` for one dead-lettered.  See
        :meth:`~scrapy_banker.scheduler.politeness.PolitenessGate.response`."""
        polite = self.politeness_gate
        if not polite.enabled:
            return response
        slot = self.downloader.slot_key(request)
        delay = self.downloader.slot_delay(slot) if polite.autothrottle else None
        return polite.response(request, response, slot, delay)

    def _response_downloaded(
        self, response: Response, request: Request, spider: Spider | None = None
    ) -> None:
        """A refusal is blocked at once, and the host's requests waiting in its download
        slot's queue are taken back (the downloader would start one right after this)."""
        polite = self.politeness_gate
        if not polite.refusal(response):
            return
        downloader = self.downloader
        slot = downloader.slot_key(request)
        polite.downloaded(response, slot)
        for queued, deferred in downloader.take_queued(slot):
            deferred.errback(HeldBack(f"{slot} pushed back while {queued} waited in its slot"))

    def apply_control(self, state: ControlState) -> None:
        """Follow the operator's directives (a store read them): pause, delay, limit, budgets.

        A host paused now has its requests waiting in its download slot taken
        back out (put back, like a pushback's), so none leaves after this.
        """
        control = self.control
        if control is None or state.version == control.state.version:
            return
        old = control.state
        released = control.apply(state)
        now = self.clock()
        for entry in released:
            self.queue.requeue(entry, now)
        if released:
            self.stats.inc_value("banker/budget/released", len(released))
        for slot in control.newly_paused(old):
            for queued, deferred in self.downloader.take_queued(slot):
                deferred.errback(HeldBack(f"{slot} paused while {queued} waited in its slot"))
        wake_engine(self.crawler)

    def _spider_idle(self, spider: Spider | None = None) -> None:
        """The crawl would end: say why if budgets hold requests back (every mode alike).

        ``CloseSpider`` from a ``spider_idle`` receiver is how Scrapy lets a
        component name the reason; ``finished`` stays the reason of a crawl
        that fetched everything it found.
        """
        control = self.control
        reason = None if control is None else control.why_held()
        if reason is not None and not len(self.queue):
            raise CloseSpider(reason)

    def _poll_control(self) -> None:
        """Follow ``JOBDIR/banker/control.json`` (the timer's, once a second; see
        :mod:`~scrapy_banker.scheduler.control_file`)."""
        control_file = self.control_file
        assert control_file is not None
        state = control_file.poll()
        if control_file.malformed:
            self.stats.set_value("banker/control/malformed", control_file.malformed)
        if state is not None:
            self.stats.inc_value("banker/control/updates")
            self.apply_control(state)

    def _hosts_ready(self, slots: list[str]) -> None:
        """The wait of these slots' hosts is over: their parked lanes compete again."""
        for slot in slots:
            self.queue.slot_freed(slot)
        wake_engine(self.crawler)

    def _dead_letter_entry(self, entry: Entry[Request]) -> None:
        """A queued request of a host given up on: dead-lettered, never sent."""
        refusals = self.politeness.get(entry.slot).refusals
        reason = f"pushback: {entry.slot} refused {refusals} times (not sent)"
        self.store.dead_letter(entry.item, reason, entry)
        self.stats.inc_value("banker/pushback/dead_lettered")

    def _flush_politeness(self, now: float) -> None:
        """Hand the host states changed since the last time to the store (about once a second)."""
        self._politeness_flush_at = now + POLITENESS_FLUSH_S
        changed = self.politeness.take_changed()
        if changed and self._politeness_changed is not None:
            self._politeness_changed(changed)

    # -- requests ending ---------------------------------------------------------------

    def release(self, request: Request, outcome: str) -> bool:
        """A request ended (``outcome``: how): free its slot and admission grant; idempotent.

        Called by :class:`~scrapy_banker.middlewares.BankerDownloaderMiddleware`
        for responses and exceptions, so requests that never reach the
        downloader (IgnoreRequest, cached responses) are accounted for too.
        """
        self._ended(request)
        return self.gate is not None and self.gate.release(request, outcome)

    def _ended(self, request: Request) -> None:
        slot = self.downloader.ended(request)
        if slot is not None:
            self.queue.slot_freed(slot)

    def _request_left_downloader(self, request: Request, spider: Spider | None = None) -> None:
        # Ours: its slot has room now (the middleware releases it later, idempotent).
        # Foreign: marked as ended, so it stops counting while still in slot.active.
        self.release(request, "left_downloader")
        self.store.downloaded(request)
        # The downloader wrote the slot it used into meta: if a middleware
        # changed it, that slot has room now too.
        meta = request.meta
        slot = meta.get("download_slot")
        if slot is not None:
            self.queue.slot_freed(str(slot))
            if self.pacer is not None:
                self.pacer.response(str(slot), meta.get("download_latency"))

    def _dropped(self, request: Request) -> None:
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
