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

import itertools
import logging
import os
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_banker.core.meta import META_CHARGED, META_SLOT
from scrapy_banker.scheduler.classifier import Classified
from scrapy_banker.scheduler.control_file import POLL_S as CONTROL_POLL_S
from scrapy_banker.scheduler.control_file import ControlFile
from scrapy_banker.scheduler.control_gate import unused
from scrapy_banker.scheduler.dupes import SeenURLs
from scrapy_banker.scheduler.engine import requests_in_progress
from scrapy_banker.scheduler.feeds import FeedBarrier
from scrapy_banker.scheduler.jobdir import JobDir
from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts, StoreFeatures
from scrapy_banker.scheduler.serialize import UnserializableRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred
    from typing_extensions import Self

    from scrapy_banker.core.directives import ControlState
    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.politeness import HostState

logger = logging.getLogger(__name__)

__all__ = ["MemoryStore", "RequestStore", "SchedulerParts"]


#: Nothing is queued outside the local queue of one process.
_NOWHERE: Mapping[str, int] = MappingProxyType({})


class MemoryStore:
    """Scrapy's dupefilter and the local queue; a crash-safe JSON journal with ``JOBDIR``.

    With ``JOBDIR`` the journal (:mod:`scrapy_banker.scheduler.jobdir`) is the
    authority on what was seen: every journaled request is seen, and nothing
    else.  Scrapy's ``RFPDupeFilter`` is therefore kept in memory only (its
    ``requests.seen`` is not written: it is buffered independently of the
    journal, and after a ``kill -9`` it would hold URLs whose requests were
    never persisted) and is refilled from the journal at resume; so are its
    subclasses.  Any other ``DUPEFILTER_CLASS`` is built as configured and
    keeps its own files; it is refilled from the journal only if it keeps
    its fingerprints in a ``set`` as Scrapy's does, and pending requests
    resume whatever it says (they do not pass through it again).
    """

    #: Budgets are counted by the scheduler's control gate, and saved with the JOBDIR.
    counts_budgets: ClassVar[bool] = False

    def __init__(
        self,
        parts: SchedulerParts,
        dupefilter: BaseDupeFilter,
        jobdir: str | None = None,
        fingerprint: Callable[[Request], str] | None = None,
    ) -> None:
        self.parts = parts
        self.queue = parts.queue
        self.df = dupefilter
        self.seen = SeenURLs(dupefilter)
        self._fingerprint = fingerprint or _default_fingerprint(parts)
        # The hosts' states and the budget counts are saved in the snapshot
        # header at every compaction, and restored at resume.
        self.jobdir: JobDir | None = None
        if jobdir:
            self.jobdir = JobDir(
                jobdir, parts.codec, parts.stats, self._fingerprint,
                politeness=parts.politeness.politeness, budgets=parts.control.book,
            )  # fmt: skip
        #: A single process's control channel: ``JOBDIR/banker/control.json``.
        self.control_file = None if self.jobdir is None else ControlFile(self.jobdir.root)
        self._control_due = 0.0
        self.features = StoreFeatures(
            jobdir=self.jobdir, directives_s=None if self.jobdir is None else CONTROL_POLL_S
        )
        self.spider: Spider | None = None
        # Requests that cannot be written to JOBDIR: dequeued from "memory".
        self._memory_only: set[Request] = set()
        self._unserializable_logged = False
        self._seq = itertools.count()
        #: Popped entries' journal numbers, until dispatched (or parked and popped again).
        self._popped: dict[Request, int] = {}
        #: Dispatched requests whose completion is not journaled yet.
        self._inflight: dict[Request, int] = {}
        #: The most requests dispatched and not complete at once: what a kill repeats, at most.
        self._max_inflight = 0
        #: Pages finished whose D record waits for their items to be durable in the feeds.
        self.feeds = FeedBarrier(parts.crawler)
        self._finished: list[int] = []
        self._finished_free: list[int] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler, parts: SchedulerParts) -> Self:
        dupefilter = build_from_crawler(load_object(crawler.settings["DUPEFILTER_CLASS"]), crawler)
        jobdir = job_dir(crawler.settings)
        if jobdir and isinstance(dupefilter, RFPDupeFilter) and dupefilter.file is not None:
            # The journal is the seen set's authority: no second, unsynchronised copy.
            dupefilter.file.close()
            dupefilter.file = None
        fingerprinter = getattr(crawler, "request_fingerprinter", None)
        fingerprint = None if fingerprinter is None else _hex_fingerprint(fingerprinter)
        store = cls(parts, dupefilter, jobdir, fingerprint)
        if store.jobdir is not None:
            # Before the spider opens: a crawl refused here has not yet loaded
            # (nor will it rewrite) the running crawl's spider.state.
            os.makedirs(store.jobdir.path, exist_ok=True)
            store.jobdir.lock.acquire()
            try:
                store.jobdir.check()
            except BaseException:
                store.jobdir.lock.release()
                raise
        return store

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        if self.jobdir is not None:
            now = time.monotonic()
            _, seen = self.jobdir.restore(self.queue, spider, self.parts.downloader.slot_key, now)
            self._seq = itertools.count(self.jobdir.next_seq)
            self._refill_dupefilter(seen)
        return self.df.open()

    def _refill_dupefilter(self, seen: set[str]) -> None:
        """Make the dupefilter's memory exactly the journal's seen set."""
        raw = getattr(self.df, "_fingerprints", None)  # Scrapy >= 2.14: bytes
        if isinstance(raw, set):
            fresh = {bytes.fromhex(fp) for fp in seen}
            self._ignored_seen(len(raw - fresh))
            raw.clear()
            raw.update(fresh)
            return
        hexes = vars(self.df).get("fingerprints")  # Scrapy <= 2.13: hex strings
        if isinstance(hexes, set):
            if isinstance(self.df, RFPDupeFilter):
                self._ignored_seen(len(hexes - seen))
                hexes.clear()
            hexes.update(seen)

    def _ignored_seen(self, stale: int) -> None:
        if stale:
            logger.warning(
                "Ignoring %d fingerprints of JOBDIR/requests.seen that no scrapy-banker "
                "journal records (another scheduler's, or left by a crash): their URLs "
                "are not treated as seen", stale,
            )  # fmt: skip

    def close(self, reason: str) -> Deferred[None] | None:
        jobdir = self.jobdir
        if jobdir is not None and jobdir.failed:
            jobdir.close_journal()  # it was refused at open: nothing here is this crawl's
            jobdir = None
        if jobdir is not None:
            self._finish()
            self._record_done(time.monotonic(), closing=True)
            unsaved = 0
            for entry in self.queue.entries():
                if entry.item in self._memory_only:
                    unsaved += 1
                    jobdir.dead_letter_unsaved(entry.item, "not serializable to JSON")
            exact = not self._inflight and not unsaved
            state = jobdir.compact(
                self.queue.topics.to_state(), self.queue.directory.to_state() if exact else None
            )
            jobdir.close_journal()
            self.parts.stats.set_value("banker/jobdir/saved", len(state.live))
            self.parts.stats.set_value("banker/jobdir/max_inflight", self._max_inflight)
            if unsaved:
                self.parts.stats.set_value("banker/jobdir/unserializable", unsaved)
            logger.info("Saved %d pending requests to %s", len(state.live), jobdir.path)
        self.parts.stats.set_value("banker/dupes/memo_hits", self.seen.memo.hits)
        if self.feeds.syncs:
            self.parts.stats.set_value("banker/jobdir/feed_syncs", self.feeds.syncs)
        return self.df.close(reason)

    def is_duplicate(self, request: Request) -> bool:
        return self.seen.is_duplicate(request, self.spider)

    def put(self, request: Request, c: Classified, now: float) -> str:
        jobdir = self.jobdir
        if jobdir is None:
            self.queue.push(request, c, now)
            return "memory"
        # Like Scrapy's disk queues: whatever JOBDIR cannot hold is kept in
        # memory, counted, and will not survive a restart.
        seq = next(self._seq)
        meta = request.meta
        meta.pop(META_SLOT, None)  # a retry's copy of its original's dispatch
        meta.pop(META_CHARGED, None)  # and of its charge (refunded when it was scheduled)
        try:
            payload = self.parts.codec.encode(request, self.spider)
        except UnserializableRequest as exc:
            self._unserializable(request, exc)
            self.queue.push(request, c, now, seq=seq)
            return "memory"
        fp = "" if request.dont_filter else self._fingerprint(request)
        jobdir.enqueued(seq, fp, c, request.priority, payload)
        self.queue.push(request, c, now, seq=seq)
        if jobdir.should_compact():
            self._compact()
        return "disk"

    def _compact(self) -> None:
        assert self.jobdir is not None
        self.jobdir.next_seq = max(self.jobdir.next_seq, next(self._seq))
        self._seq = itertools.count(self.jobdir.next_seq)
        self.jobdir.compact(self.queue.topics.to_state())

    def _unserializable(self, request: Request, exc: Exception) -> None:
        self._memory_only.add(request)
        self.parts.stats.inc_value("scheduler/unserializable")
        if not self._unserializable_logged:
            # Scrapy's words (log monitors grep for them), logged once; unlike
            # Scrapy, also without SCHEDULER_DEBUG: a request that will not
            # survive a restart is worth one line.
            self._unserializable_logged = True
            logger.warning(
                "Unable to serialize request: %(request)s - reason: %(reason)s - no more "
                "unserializable requests will be logged (stats being collected)",
                {"request": request, "reason": exc},
                extra={"spider": self.spider},
            )

    def directives(self, now: float) -> ControlState | None:
        """The control file's directives when they changed (read at most once a second)."""
        control_file = self.control_file
        if control_file is None or now < self._control_due:
            return None
        self._control_due = now + CONTROL_POLL_S * 0.9  # the scheduler's timer asks every POLL_S
        state = control_file.poll()
        stats = self.parts.stats
        if control_file.malformed:
            stats.set_value("banker/control/malformed", control_file.malformed)
        if state is not None:
            stats.inc_value("banker/control/updates")
        return state

    def refill(self, now: float) -> None:
        if self._inflight:
            self._finish()
        elif self._finished:
            self._record_done(time.monotonic())

    def _finish(self) -> None:
        """Journal the completion of dispatched requests the engine is done with.

        The rule of :meth:`~scrapy_banker.redis.store.acks.AckBook.ack_finished`:
        done once the request left the engine's ``requests_in_progress`` (its
        callback's output is scheduled, so its children are journaled before
        this record); without the engine's view, once its slot was released.
        """
        in_progress = requests_in_progress(self.parts.crawler)
        for request in list(self._inflight):
            if in_progress is None:
                if request.meta.get(META_SLOT) is not None:
                    continue
            elif request in in_progress:
                continue
            seq = self._inflight.pop(request)
            self._finished.append(seq)
            if unused(request):
                self._finished_free.append(seq)
        if self._finished:
            self._record_done(time.monotonic())

    def _record_done(self, now: float, *, closing: bool = False) -> None:
        """Journal the finished pages once their items are durable in the feeds.

        See :mod:`~scrapy_banker.scheduler.feeds`: at most every
        ``SYNC_INTERVAL_S`` with feeds; a feed written only at the close
        keeps its pages pending until then.
        """
        jobdir = self.jobdir
        if jobdir is None or not self._finished:
            return
        feeds = self.feeds
        if not closing and not feeds.due(now):
            return
        if not feeds.sync(now) and not closing:
            return
        jobdir.done(self._finished, self._finished_free)
        self._finished, self._finished_free = [], []
        if not closing and jobdir.should_compact():
            self._compact()

    def keep(self, entry: Entry[Request]) -> bool:
        if self.jobdir is not None and entry.item not in self._memory_only:
            self._popped[entry.item] = entry.seq
        return True

    def dispatched(self, request: Request) -> str:
        if self.jobdir is None:
            return "memory"
        if self._memory_only and request in self._memory_only:
            self._memory_only.discard(request)
            return "memory"
        seq = self._popped.pop(request, None)
        if seq is not None:
            inflight = self._inflight
            inflight[request] = seq
            if len(inflight) > self._max_inflight:
                self._max_inflight = len(inflight)
        return "disk"

    def downloaded(self, request: Request) -> None:
        pass

    def polled(self, request: Request | None) -> None:
        pass

    def has_pending(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def queued_elsewhere(self) -> Mapping[str, int]:
        return _NOWHERE

    def politeness_changed(self, changed: Mapping[str, HostState]) -> None:
        pass  # the JOBDIR snapshot reads the states themselves when it is written

    def dead_letter(self, request: Request, reason: str, entry: Entry[Request] | None) -> None:
        """JOBDIR: a ``pushback`` letter (:meth:`JobDir.dead_letter_refused`); else the log.

        A popped entry's journal record is marked done after its letter is
        written, so the next resume does not queue it too.
        """
        jobdir = self.jobdir
        seq = None
        if entry is not None:
            seq = self._popped.pop(request, None)
        elif jobdir is not None:
            seq = self._inflight.get(request)
        if jobdir is None:
            logger.warning("Dead letter (%s), not kept (no JOBDIR): %s %s",
                           reason, request.method, request.url)  # fmt: skip
            return
        if entry is not None:
            c = Classified(entry.topic, entry.slot, entry.key, entry.key_hash)
            priority = entry.priority
        else:
            c = self.parts.classifier.classify(request)
            priority = request.priority
        copy = request.replace()
        for key in (META_SLOT, META_CHARGED):  # its dispatch and charge here, as put() drops them
            copy.meta.pop(key, None)
        try:
            payload: str | None = self.parts.codec.encode(copy, self.spider)
        except UnserializableRequest as exc:
            payload = None
            reason = f"{reason}; not serializable to JSON ({exc}): it cannot be requeued"
            self._memory_only.discard(request)
        fp = "" if request.dont_filter else self._fingerprint(request)
        jobdir.dead_letter_refused(request, reason, c, priority, fp, payload,
                                   -1 if seq is None else seq)  # fmt: skip
        if entry is not None and seq is not None:
            jobdir.done([seq], [seq])  # never sent: no page of a budget


def _hex_fingerprint(fingerprinter: Any) -> Callable[[Request], str]:
    def fingerprint(request: Request) -> str:
        return str(fingerprinter.fingerprint(request).hex())

    return fingerprint


def _default_fingerprint(parts: SchedulerParts) -> Callable[[Request], str]:
    fingerprinter = getattr(parts.crawler, "request_fingerprinter", None)
    if fingerprinter is None:  # pragma: no cover - Scrapy < 2.7
        from scrapy.utils.request import RequestFingerprinter

        fingerprinter = RequestFingerprinter()
    return _hex_fingerprint(fingerprinter)
