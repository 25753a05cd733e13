"""``BankerScheduler``: the scheduler users put in ``SCHEDULER``.

A thin adapter: Scrapy requests in, the pure cores decide.  A request gets a
topic (:mod:`scrapy_banker._topic`), a download slot (the downloader's own
key, so politeness is Scrapy's), a queue key and its hash
(:mod:`scrapy_banker.hashing`); the :class:`~scrapy_banker.frontier.Frontier`
queues it, the :class:`~scrapy_banker.topics.TopicScheduler` picks the topic
to serve and the :class:`~scrapy_banker.directory.ExtendibleDirectory` files
its key into a bucket.  With ``JOBDIR`` the pending requests are written as
JSON (never pickle), one file per directory bucket, on a clean stop.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING, Any, TextIO

from scrapy import signals
from scrapy.core.downloader import Downloader
from scrapy.core.scheduler import BaseScheduler, Scheduler
from scrapy.utils.job import job_dir
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_banker._topic import request_topic
from scrapy_banker.admission import Admission, InvalidClaim
from scrapy_banker.directory import ExtendibleDirectory
from scrapy_banker.frontier import Entry, Frontier
from scrapy_banker.hashing import bkdr, host_of, key_policy, murmur
from scrapy_banker.serialize import MalformedPayload, RequestCodec, UnserializableRequest
from scrapy_banker.settings import BankerConfig, load_config
from scrapy_banker.topics import TopicScheduler

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

STATE_VERSION = 1
#: Slot a dispatched request was counted against; popped when it ends.
META_SLOT = "banker_slot"


class BankerScheduler(BaseScheduler):
    """Topic-aware, download-slot-aware frontier with an extendible-hash directory."""

    #: Where Scrapy's ``scheduler/enqueued/<kind>`` counters say requests are queued.
    queue_kind = "memory"

    def __init__(
        self,
        crawler: Crawler,
        config: BankerConfig,
        dupefilter: BaseDupeFilter,
        jobdir: str | None = None,
    ) -> None:
        assert crawler.stats is not None
        self.crawler = crawler
        self.config = config
        self.df = dupefilter
        self.stats: StatsCollector = crawler.stats
        self.jobdir = jobdir
        self.codec = RequestCodec(config.serialize_allowed_classes)
        self.clock = time.monotonic
        self.topics = TopicScheduler(
            config.topics.values(),
            default_slice_s=config.topic_slice,
            min_slice_s=config.topic_min_slice,
            slice_step_s=config.topic_slice_step,
            max_wait_s=config.topic_max_wait,
        )
        self.directory = self._new_directory()
        self.frontier: Frontier[Request] = Frontier(self.topics, self.directory)
        self._key_of = key_policy(config.queue_key)
        self._hash_fn = bkdr if config.queue_hash == "bkdr" else murmur
        # Keys repeat (hosts): hash each distinct key once.  Bounded: cleared
        # when full, which only costs re-hashing.
        self._hash_cache: dict[str, int] = {}
        self._host_key = config.queue_key == "host"
        self.spider: Spider | None = None
        self._downloader: Any = None
        # True when the slot key is Scrapy's rule (meta download_slot, else the
        # host name), which we can compute without urlparse_cached.
        self._scrapy_slots = False
        # Requests handed to the engine and not ended yet, per slot.  Scrapy's
        # slot.active is filled asynchronously (after the downloader
        # middlewares), so under the asyncio reactor it lags behind a burst of
        # next_request calls; counting our own dispatches keeps every slot
        # within its concurrency whatever the reactor.
        self._inflight: dict[str, int] = {}
        self._default_concurrency = max(
            1, crawler.settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
        )
        self.admission: Admission | None = None
        if config.resources:
            self.admission = Admission(
                config.resources,
                stats=self.stats,
                topic_claims=config.task_claims,
                task_timeout=config.task_timeout,
                policy=config.admission_policy,
            )
        # Requests parked by admission (unsafe / insufficient), re-queued on release.
        self._parked: list[Entry[Request]] = []
        self._reclaimed_at = 0.0
        self._stall_warned_at = -1e9
        self._stalled_since: float | None = None
        # Per-topic counters are batched into the stats at most once a second:
        # the stats collector is the dominant cost of an enqueue otherwise.
        self._topic_counts: dict[str, int] = {}
        self._flushed_at = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BaseScheduler:  # type: ignore[override]
        config = load_config(crawler.settings)
        if not config.enabled:
            # Disabled means "exactly what Scrapy would do".
            logger.info("BANKER_ENABLED is False: using Scrapy's default scheduler")
            return Scheduler.from_crawler(crawler)
        settings = crawler.settings
        dupefilter_cls = load_object(settings["DUPEFILTER_CLASS"])
        dupefilter = build_from_crawler(dupefilter_cls, crawler)
        return cls(crawler, config, dupefilter, jobdir=job_dir(settings))

    # -- BaseScheduler contract ---------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        try:
            engine = self.crawler.engine
        except RuntimeError:  # Scrapy >= 2.14 raises when there is no engine yet
            engine = None
        self._downloader = getattr(engine, "downloader", None)
        self._scrapy_slots = self._downloader is not None and (
            getattr(type(self._downloader), "get_slot_key", None) is Downloader.get_slot_key
            and not getattr(self._downloader, "ip_concurrency", 0)
        )
        self.crawler.signals.connect(
            self._request_left_downloader, signal=signals.request_left_downloader
        )
        self.crawler.signals.connect(self._request_dropped, signal=signals.request_dropped)
        if self.jobdir:
            self._restore()
        return self.df.open()

    def close(self, reason: str) -> Deferred[None] | None:
        self.crawler.signals.disconnect(
            self._request_left_downloader, signal=signals.request_left_downloader
        )
        self.crawler.signals.disconnect(self._request_dropped, signal=signals.request_dropped)
        if self.admission is not None:
            self._requeue_parked(self.clock(), everything=True)  # JOBDIR saves them
            self.admission.close()
        if self.jobdir:
            self._save()
        self._flush_topic_stats(self.clock())
        self._publish_stats()
        return self.df.close(reason)

    def has_pending_requests(self) -> bool:
        return len(self.frontier) > 0 or bool(self._parked)

    def __len__(self) -> int:
        return len(self.frontier) + len(self._parked)

    def enqueue_request(self, request: Request) -> bool:
        try:
            if not request.dont_filter and self.df.request_seen(request):
                self.df.log(request, self.spider)  # type: ignore[arg-type]
                return False
            classified = self._classify(request)
        except ValueError as exc:
            self._malformed_url(request, exc)
            return False
        now = self.clock()
        self._push(request, classified, now)
        self._count("enqueued", classified[0], now)
        return True

    def _push(self, request: Request, classified: tuple[str, str, str, int], now: float) -> None:
        """Queue a request locally with what :meth:`_classify` found."""
        topic, slot, key, key_hash = classified
        self.frontier.push(request, topic=topic, slot=slot, key=key, key_hash=key_hash,
                           priority=request.priority, now=now)  # fmt: skip

    def _classify(self, request: Request) -> tuple[str, str, str, int]:
        """Topic, download slot, queue key and its hash; ValueError for a broken URL."""
        topic = request_topic(request, self.config, self.stats)
        slot = self._slot_key(request)
        # With host keys the slot is the host name: parsed once.
        host_slot = self._host_key and self._slot_is_host(request)
        key = slot if host_slot else self._key_of(request.url)
        key_hash = self._hash_cache.get(key)
        if key_hash is None:
            if len(self._hash_cache) >= 1 << 17:
                self._hash_cache.clear()
            key_hash = self._hash_cache[key] = self._hash_fn(key)
        return topic, slot, key, key_hash

    def _malformed_url(self, request: Request, exc: Exception) -> None:
        # The URL cannot be parsed (e.g. a broken IPv6 literal left by a
        # middleware): neither the fingerprinter nor the downloader could
        # use it.  Say so instead of crashing the crawl.
        logger.error("Dropping request with unparsable URL %s: %s", request, exc)
        self.stats.inc_value("banker/queue/malformed_url")

    def next_request(self) -> Request | None:
        now = self.clock()
        admission = self.admission
        if admission is not None:
            if now - self._reclaimed_at >= 1.0:
                self._reclaimed_at = now
                admission.reclaim_expired()  # first, so what it frees is retried now
            if admission.released_since_wait:
                self._requeue_parked(now)
        while True:
            entry = self._pop(now)
            if entry is None:
                self._flush_topic_stats(now)  # idle moment: make the counters exact
                if self._parked and self._downloader_idle():
                    self._warn_stalled(now)
                else:
                    self._stalled_since = None
                return None
            request = entry.item
            if admission is not None and admission.needs_admission(request):
                try:
                    verdict = admission.try_admit(request, entry.topic)
                except InvalidClaim as exc:
                    logger.error("Dropping %s: invalid resource claim: %s", request, exc)
                    self.stats.inc_value("banker/admission/invalid")
                    continue
                if verdict != "granted":
                    admission.defer(request, verdict)
                    self._parked.append(entry)
                    continue
            break
        self._stalled_since = None
        request.meta[META_SLOT] = entry.slot
        self._inflight[entry.slot] = self._inflight.get(entry.slot, 0) + 1
        self._count("dequeued", entry.topic, now)
        return request

    def _count(self, kind: str, topic: str, now: float) -> None:
        """``scheduler/<kind>`` as Scrapy counts it; the per-topic twin batched."""
        self.stats.inc_value(f"scheduler/{kind}/{self.queue_kind}")
        self.stats.inc_value(f"scheduler/{kind}")
        name = f"banker/topic/{topic}/{kind}"
        self._topic_counts[name] = self._topic_counts.get(name, 0) + 1
        if now - self._flushed_at >= 1.0:
            self._flush_topic_stats(now)

    def _warn_stalled(self, now: float) -> None:
        """Everything left waits for resources that only a task finishing can free.

        Said only once the stall has lasted a few seconds: right after a
        response, its callback may still be about to yield the task's next step.
        """
        if self._stalled_since is None:
            self._stalled_since = now
        if now - self._stalled_since < 5.0 or now - self._stall_warned_at < 30.0:
            return
        self._stall_warned_at = now
        assert self.admission is not None
        logger.warning(
            "%d requests wait for resources held by tasks with no request in flight; "
            "they run when those tasks finish (banker_finish / finish_task) or are "
            "reclaimed after BANKER_TASK_TIMEOUT=%gs. State:\n%s",
            len(self._parked),
            self.config.task_timeout,
            self.admission.describe(),
        )

    def _pop(self, now: float) -> Entry[Request] | None:
        entry = self.frontier.pop(self._is_free, now)
        # Nothing in flight can free a slot, so a wake-up was missed (e.g. a
        # middleware changed download_slot): re-check every parked lane.
        if (
            entry is None
            and len(self.frontier)
            and self._downloader_idle()
            and self.frontier.unblock_all()
        ):
            entry = self.frontier.pop(self._is_free, now)
        return entry

    def _requeue_parked(self, now: float, everything: bool = False) -> None:
        """Something was released: parked requests that could fit compete again, in order."""
        assert self.admission is not None
        self.admission.released_since_wait = False
        parked, self._parked = self._parked, []
        fits = (
            [True] * len(parked)
            if everything
            else self.admission.fitting([entry.item for entry in parked])
        )
        for entry, fit in zip(parked, fits, strict=True):
            if not fit:
                self._parked.append(entry)  # free units are spoken for: stay parked
                continue
            self.frontier.push(
                entry.item,
                topic=entry.topic,
                slot=entry.slot,
                key=entry.key,
                key_hash=entry.key_hash,
                priority=entry.priority,
                now=now,
                seq=entry.seq,
            )

    def _flush_topic_stats(self, now: float) -> None:
        self._flushed_at = now
        if self._topic_counts:
            counts, self._topic_counts = self._topic_counts, {}
            for name, n in counts.items():
                self.stats.inc_value(name, n)

    # -- downloader view ---------------------------------------------------------------

    def _slot_key(self, request: Request) -> str:
        if self._scrapy_slots or self._downloader is None:
            slot = request.meta.get("download_slot")
            return host_of(request.url) if slot is None else str(slot)
        return str(self._downloader.get_slot_key(request))

    def _slot_is_host(self, request: Request) -> bool:
        return "download_slot" not in request.meta and (
            self._scrapy_slots or self._downloader is None
        )

    def _is_free(self, slot_key: str) -> bool:
        if self._downloader is None:  # no engine (tests, tools): nothing to protect
            return True
        ours = self._inflight.get(slot_key, 0)
        slot = self._downloader.slots.get(slot_key)
        if slot is None:
            return ours < self._slot_concurrency(slot_key)
        return max(ours, len(slot.active)) < int(slot.concurrency)

    def _slot_concurrency(self, slot_key: str) -> int:
        """Concurrency the downloader will give a slot it has not created yet."""
        dl = self._downloader
        per_slot = getattr(dl, "per_slot_settings", {}).get(slot_key, {})
        default = getattr(dl, "ip_concurrency", 0) or getattr(
            dl, "domain_concurrency", self._default_concurrency
        )
        return max(1, int(per_slot.get("concurrency", default)))

    def _ended(self, request: Request) -> None:
        """A dispatched request ended (any path): its slot has room again; idempotent."""
        slot = request.meta.pop(META_SLOT, None)
        if slot is None:
            return
        left = self._inflight.get(slot, 0) - 1
        if left > 0:
            self._inflight[slot] = left
        else:
            self._inflight.pop(slot, None)
        self.frontier.slot_freed(slot)

    def _downloader_idle(self) -> bool:
        if self._downloader is None:
            return True
        active = getattr(self._downloader, "active", None)
        if active is None or active:
            return False
        # Nothing is in the downloader: whatever we still count as in flight
        # ended on a path we did not see (e.g. the engine dropped it).
        self._inflight.clear()
        return True

    def _request_left_downloader(self, request: Request, spider: Spider | None = None) -> None:
        self._ended(request)
        # The downloader wrote the slot it used into meta: if a middleware
        # changed it, that slot has room now too.
        slot = request.meta.get("download_slot")
        if slot is not None:
            self.frontier.slot_freed(str(slot))
        if self.admission is not None:  # usually released already by the middleware
            self.admission.release_request(request, "left_downloader")

    def _request_dropped(self, request: Request, spider: Spider | None = None) -> None:
        self._ended(request)
        if self.admission is not None:
            self.admission.release_request(request, "dropped")

    def release(self, request: Request, outcome: str) -> bool:
        """A request ended (``outcome``: how): free its slot and admission grant; idempotent.

        Called by :class:`~scrapy_banker.middlewares.BankerDownloaderMiddleware`
        for responses and exceptions, so requests that never reach the
        downloader (IgnoreRequest, cached responses) are accounted for too.
        """
        self._ended(request)
        if self.admission is None:
            return False
        return self.admission.release_request(request, outcome)

    # -- stats -----------------------------------------------------------------------------

    def _publish_stats(self) -> None:
        d = self.directory
        self.stats.set_value("banker/queue/buckets", d.n_buckets)
        self.stats.set_value("banker/queue/global_depth", d.global_depth)
        self.stats.set_value("banker/queue/splits", d.splits)
        self.stats.set_value("banker/queue/merges", d.merges)
        self.stats.set_value("banker/queue/blocked_skips", self.frontier.blocked_skips)
        self.stats.set_value("banker/queue/unblock_sweeps", self.frontier.unblock_sweeps)
        for state in self.topics:
            prefix = f"banker/topic/{state.name}"
            self.stats.set_value(f"{prefix}/max_wait_s", round(state.max_wait_s, 3))
            self.stats.set_value(f"{prefix}/slice_s", round(state.slice_total, 3))
            self.stats.set_value(f"{prefix}/preempted", state.preempted)
            self.stats.set_value(f"{prefix}/starvation_rescues", state.starvation_rescues)

    # -- JOBDIR ----------------------------------------------------------------------------

    def _dir(self) -> str:
        assert self.jobdir is not None
        return os.path.join(self.jobdir, "banker")

    def _deadletter_path(self) -> str:
        # Outside the banker/ directory, which every clean stop replaces.
        assert self.jobdir is not None
        return os.path.join(self.jobdir, "banker-deadletter.jsonl")

    def _save(self) -> None:
        """Write pending requests and state; atomic, so a crash keeps the last good copy."""
        final = self._dir()
        tmp = final + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "queues"))
        files: dict[int, TextIO] = {}
        saved = unserializable = 0
        try:
            for entry in self.frontier.entries():
                try:
                    payload = self.codec.encode(entry.item, self.spider)
                except UnserializableRequest as exc:
                    unserializable += 1
                    logger.error(
                        "Cannot persist %s to JOBDIR, it will not resume: %s", entry.item, exc
                    )
                    with open(self._deadletter_path(), "a", encoding="utf-8") as dl:
                        dl.write(json.dumps({"url": entry.item.url, "method": entry.item.method,
                                            "error": str(exc), "when": "save"}) + "\n")  # fmt: skip
                    continue
                bucket = self.directory.bucket_of(entry.key)
                out = files.get(bucket)
                if out is None:
                    path = os.path.join(tmp, "queues", f"{bucket}.jsonl")
                    out = files[bucket] = open(path, "w", encoding="utf-8")  # noqa: SIM115
                line = {
                    "request": json.loads(payload),
                    "topic": entry.topic,
                    "slot": entry.slot,
                    "key": entry.key,
                    "hash": entry.key_hash,
                    "priority": entry.priority,
                    "seq": entry.seq,
                }
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                saved += 1
        finally:
            for out in files.values():
                out.close()
        state = {
            "version": STATE_VERSION,
            "pending": saved,
            "topics": self.topics.to_state(),
            "directory": self.directory.to_state() if not unserializable else None,
        }
        with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as f:
            json.dump(state, f)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self.stats.set_value("banker/jobdir/saved", saved)
        if unserializable:
            self.stats.set_value("banker/jobdir/unserializable", unserializable)
        logger.info("Saved %d pending requests to %s", saved, final)

    def _restore(self) -> None:
        base = self._dir()
        state_path = os.path.join(base, "state.json")
        if not os.path.exists(state_path):
            return
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"{state_path}: unsupported state version {state.get('version')!r} "
                f"(this scrapy-banker writes version {STATE_VERSION})"
            )
        self.topics.restore(state["topics"])
        count_load = True
        if state.get("directory") is not None:
            self.directory = ExtendibleDirectory.from_state(state["directory"])
            self.frontier.directory = self.directory
            count_load = False
        restored = malformed = 0
        queues = os.path.join(base, "queues")
        deadletter = self._deadletter_path()
        now = self.clock()
        for name in sorted(os.listdir(queues)) if os.path.isdir(queues) else []:
            with open(os.path.join(queues, name), encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    try:
                        rec = json.loads(line)
                        request = self.codec.decode(json.dumps(rec["request"]), self.spider)
                        self.frontier.push(
                            request,
                            topic=str(rec["topic"]),
                            slot=self._slot_key(request),
                            key=str(rec["key"]),
                            key_hash=int(rec["hash"]),
                            priority=int(rec["priority"]),
                            now=now,
                            seq=int(rec["seq"]),
                            count_load=count_load,
                        )
                        restored += 1
                    except (ValueError, KeyError, TypeError, MalformedPayload) as exc:
                        malformed += 1
                        logger.error(
                            "Skipping malformed JOBDIR entry %s:%d (%s); kept in %s",
                            name, lineno, exc, deadletter,
                        )  # fmt: skip
                        with open(deadletter, "a", encoding="utf-8") as dl:
                            dl.write(json.dumps({"file": name, "line": lineno, "error": str(exc),
                                                 "payload": line.rstrip("\n"),
                                                 "when": "restore"}) + "\n")  # fmt: skip
        if malformed and not count_load:
            # The saved directory counted the skipped entries: rebuild loads from what is queued.
            self._rebuild_directory()
        self.stats.set_value("banker/jobdir/restored", restored)
        if malformed:
            self.stats.set_value("banker/jobdir/malformed", malformed)
        logger.info("Resumed %d pending requests from %s", restored, base)

    def _new_directory(self) -> ExtendibleDirectory[str]:
        return ExtendibleDirectory(
            capacity=self.config.bucket_capacity,
            max_depth=self.config.directory_max_depth,
            cache_capacity=self.config.cache_bucket_size,
        )

    def _rebuild_directory(self) -> None:
        fresh = self._new_directory()
        for entry in self.frontier.entries():
            fresh.add(entry.key, entry.key_hash, 1)
        self.directory = fresh
        self.frontier.directory = fresh
