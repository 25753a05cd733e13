"""A fleet worker's new requests on their way to Redis: dedup shortcut, encoding, partition.

A request the spider yields is encoded to a compact JSON payload and handed
to the worker thread (:meth:`FrontierWorker.enqueue
<scrapy_banker.redis.worker.FrontierWorker.enqueue>`) with its partition --
its queue key's hash modulo the partition count, so one host's requests
share a partition and one worker -- and its fingerprint, which the enqueue
script checks against the crawl's seen set (:mod:`scrapy_banker.redis.frontier.enqueue`).
Nothing here waits for Redis.

Links the crawl finds again and again cost neither encoding nor a Lua call:
the worker remembers the fingerprints Redis confirmed
(:setting:`BANKER_REDIS_SEEN_CACHE`), and :meth:`Outbound.is_duplicate`
drops those at once -- a repeat of a URL string already found so without
fingerprinting it again (:class:`~scrapy_banker.scheduler.dupes.URLMemo`).
A request that cannot be serialized stays in this worker's memory, crawled
here only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_banker.core.meta import META_LEASE, META_SLOT
from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.scheduler.dupes import URLMemo, fingerprints_by_url
from scrapy_banker.scheduler.serialize import UnserializableRequest

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.utils.request import RequestFingerprinterProtocol

    from scrapy_banker.redis.store.placement_hook import PlacementHook
    from scrapy_banker.redis.worker import FrontierWorker
    from scrapy_banker.scheduler.classifier import Classified
    from scrapy_banker.scheduler.seams import SchedulerParts

logger = logging.getLogger(__name__)

__all__ = ["TRANSIENT_META", "Outbound"]

#: Meta keys that describe one delivery and must not travel with a new request
#: (a retry or redirect copies ``meta``).
TRANSIENT_META = (META_LEASE, META_SLOT)


class Outbound:
    """Encodes new requests and queues them for the worker thread to send to Redis."""

    def __init__(
        self,
        parts: SchedulerParts,
        worker: FrontierWorker,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        partitions: int,
        placement: PlacementHook | None = None,
    ) -> None:
        self.parts = parts
        self.worker = worker
        self.partitions = partitions
        self.placement = placement
        self._fingerprinter = fingerprinter
        #: URL strings whose fingerprints Redis confirmed seen: a repeat of one
        #: is not fingerprinted again (a CrawlSpider yields the same navigation
        #: links on every page).  Off for a fingerprinter other than Scrapy's own.
        self._memo = URLMemo(fingerprints_by_url(fingerprinter))
        #: Whether this worker queued anything for Redis.
        self.sent_any = False
        self._unserializable_logged = False
        #: Hosts already handed to the worker to note as known (for the operator's commands).
        self._noted: set[str] = set()
        self._topics: set[str] = set()

    def is_duplicate(self, request: Request) -> bool:
        """Known to be in the crawl's seen sets already: dropped without a round trip.

        Deduplication is the enqueue script's, fleet-wide; the worker thread
        remembers the fingerprints Redis confirmed (:setting:`BANKER_REDIS_SEEN_CACHE`),
        so the links a crawl finds again and again -- most of what a
        callback yields -- cost neither encoding nor a Lua call.
        """
        if request.dont_filter:
            return False
        memo = self._memo
        key = memo.key(request)
        if key is not None and memo.known(key):
            self._count_cached()
            return True
        if self._fingerprinter.fingerprint(request).hex() in self.worker.seen:
            if key is not None:
                memo.add(key)
            self._count_cached()
            return True
        return False

    def _count_cached(self) -> None:
        self.parts.stats.inc_value("banker/redis/duplicates_cached")

    def put(self, request: Request, c: Classified, now: float, spider: Spider | None) -> str:
        """Queue ``request`` for Redis (``redis``), or keep it here if it cannot be (``memory``).

        A copy of a leased request (put back after a ``429`` or a pause,
        retried, redirected) gives the original's budget page back when the
        original is acked: the page is charged once, when its last copy leaves.
        """
        token = request.meta.get(META_LEASE)
        if isinstance(token, LeaseToken):
            self.worker.refund(token)
        for key in TRANSIENT_META:
            request.meta.pop(key, None)
        if c.slot not in self._noted:
            self._noted.add(c.slot)
            self.worker.note_host(c.slot)
        if c.topic not in self._topics:
            self._topics.add(c.topic)
            self.worker.note_topic(c.topic)
        stats = self.parts.stats
        try:
            payload = self.parts.codec.encode_compact(request, spider)
        except UnserializableRequest as exc:
            # Still crawled, by this worker only: it cannot survive a crash
            # of this worker.  Scrapy's words, logged once, then counted.
            if not self._unserializable_logged:
                self._unserializable_logged = True
                logger.error(
                    "Unable to serialize request: %(request)s - reason: %(reason)s - kept in "
                    "this worker's memory, not in Redis; no more unserializable requests "
                    "will be logged (stats being collected)",
                    {"request": request, "reason": exc},
                )
            stats.inc_value("banker/redis/unserializable")
            stats.inc_value("scheduler/unserializable")
            self.parts.queue.push(request, c, now)
            return "memory"
        self.sent_any = True
        partition = c.key_hash % self.partitions
        fingerprint = self._fingerprinter.fingerprint(request).hex()
        self.worker.enqueue(
            EnqueueOp(partition, fingerprint, payload, int(request.priority),
                      bool(request.dont_filter))
        )  # fmt: skip
        if self.placement is not None:
            self.placement.note(request, partition)
        return "redis"
