"""Request stores: where a scheduler's pending requests live and how duplicates are found.

:class:`~scrapy_banker.scheduler.BankerScheduler` is the same in one process
and on a fleet; what differs is the store it composes, the way Scrapy's
scheduler composes its queues (and scrapy-redis swaps
``SCHEDULER_QUEUE_CLASS``):

* :class:`MemoryStore` -- Scrapy's dupefilter, the local queue, and with
  ``JOBDIR`` the JSON job directory;
* :class:`~scrapy_banker.redis.store.RedisLeaseStore` -- dedup and queues in
  Redis partitions, leases acked once the engine is done with a request.

Both dispatch through the same :class:`~scrapy_banker.scheduler.queue.LocalQueue`,
so topics, politeness and admission behave identically.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_banker.scheduler.jobdir import JobDir
from scrapy_banker.serialize import UnserializableRequest

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_banker.frontier import Entry
    from scrapy_banker.scheduler.classifier import Classified, Classifier
    from scrapy_banker.scheduler.downloader import DownloaderView
    from scrapy_banker.scheduler.gate import AdmissionGate
    from scrapy_banker.scheduler.queue import LocalQueue
    from scrapy_banker.serialize import RequestCodec
    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

__all__ = ["MemoryStore", "RequestStore", "SchedulerParts"]


@dataclass(frozen=True)
class SchedulerParts:
    """The named parts a scheduler is composed of, handed to its store."""

    crawler: Crawler
    config: BankerConfig
    stats: StatsCollector
    downloader: DownloaderView
    classifier: Classifier
    queue: LocalQueue
    codec: RequestCodec
    #: None unless ``BANKER_RESOURCES`` is set.
    gate: AdmissionGate | None = None


class RequestStore(Protocol):
    """What :class:`~scrapy_banker.scheduler.BankerScheduler` asks of a store.

    Kinds returned by :meth:`put` and :meth:`dispatched` complete Scrapy's
    ``scheduler/enqueued/<kind>`` and ``scheduler/dequeued/<kind>`` stats.
    """

    def open(self, spider: Spider) -> Deferred[None] | None: ...

    def close(self, reason: str) -> Deferred[None] | None: ...

    def is_duplicate(self, request: Request) -> bool:
        """Filter a request before it is classified (dedup that is not the store's own)."""

    def put(self, request: Request, c: Classified, now: float) -> str:
        """Keep a new request; returns where it went (``memory``, ``disk``, ``redis``)."""

    def refill(self, now: float) -> None:
        """Before a pop: bring into the local queue what the store has for this process."""

    def keep(self, entry: Entry[Request]) -> bool:
        """May this popped entry be dispatched here? (False: the store took it back.)"""

    def dispatched(self, request: Request) -> str:
        """The request leaves for the engine; returns the kind it was dequeued from."""

    def polled(self, request: Request | None) -> None:
        """``next_request`` is about to return ``request``."""

    def has_pending(self) -> bool:
        """Work the store holds beyond the local queue (or reasons to stay open)."""

    def __len__(self) -> int:
        """Requests the store holds outside the local queue."""


class MemoryStore:
    """Scrapy's dupefilter and the local queue; JSON persistence with ``JOBDIR``."""

    def __init__(
        self, parts: SchedulerParts, dupefilter: BaseDupeFilter, jobdir: str | None = None
    ) -> None:
        self.parts = parts
        self.queue = parts.queue
        self.df = dupefilter
        self.jobdir = None if not jobdir else JobDir(jobdir, parts.codec, parts.stats)
        self.spider: Spider | None = None
        # Requests that cannot be written to JOBDIR: dequeued from "memory".
        self._memory_only: set[Request] = set()
        self._unserializable_logged = False

    @classmethod
    def from_crawler(cls, crawler: Crawler, parts: SchedulerParts) -> Self:
        dupefilter = build_from_crawler(load_object(crawler.settings["DUPEFILTER_CLASS"]), crawler)
        return cls(parts, dupefilter, job_dir(crawler.settings))

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        if self.jobdir is not None:
            now = time.monotonic()
            self.jobdir.restore(self.queue, spider, self.parts.downloader.slot_key, now)
        return self.df.open()

    def close(self, reason: str) -> Deferred[None] | None:
        if self.jobdir is not None:
            self.jobdir.save(self.queue, self.spider)
        return self.df.close(reason)

    def is_duplicate(self, request: Request) -> bool:
        if not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)  # type: ignore[arg-type]
            return True
        return False

    def put(self, request: Request, c: Classified, now: float) -> str:
        kind = "memory"
        if self.jobdir is not None:
            # Like Scrapy's disk queues: whatever JOBDIR cannot hold is kept in
            # memory, counted, and will not survive a restart.
            try:
                self.parts.codec.encode(request, self.spider)
                kind = "disk"
            except UnserializableRequest as exc:
                self._unserializable(request, exc)
        self.queue.push(request, c, now)
        return kind

    def _unserializable(self, request: Request, exc: Exception) -> None:
        self._memory_only.add(request)
        self.parts.stats.inc_value("scheduler/unserializable")
        if not self._unserializable_logged:
            self._unserializable_logged = True
            logger.warning(
                "Cannot persist %s to JOBDIR: %s; it stays in memory and will not "
                "resume (further ones are only counted in scheduler/unserializable)",
                request, exc,
            )  # fmt: skip

    def refill(self, now: float) -> None:
        pass

    def keep(self, entry: Entry[Request]) -> bool:
        return True

    def dispatched(self, request: Request) -> str:
        if self.jobdir is None:
            return "memory"
        if self._memory_only and request in self._memory_only:
            self._memory_only.discard(request)
            return "memory"
        return "disk"

    def polled(self, request: Request | None) -> None:
        pass

    def has_pending(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0
