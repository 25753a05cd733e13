"""``BankerRedisScheduler``: the distributed frontier for a fleet of workers.

Put it in ``SCHEDULER`` on every worker of a crawl (with scrapy-redis's
``REDIS_URL``) and run ``scrapy crawl`` as many times as you like.  Each
request goes to one of M logical partitions by the hash of its queue key (its
host), each partition belongs to one live worker (the node registry), and a
worker only pops partitions it owns, so one host is fetched by one worker at
a time: Scrapy's per-domain limits hold fleet-wide.  Pops are leases: a
request is acknowledged only once the engine is done with it, callback output
included, so a worker killed with ``kill -9`` loses nothing -- its leases
expire and another worker gets them.

Locally the popped requests go through the same topic-, slot- and
admission-aware frontier as :class:`~scrapy_banker.scheduler.BankerScheduler`,
which this class extends.  All Redis I/O happens on a
:class:`~scrapy_banker.redis.worker.FrontierWorker` thread; the reactor only
touches in-memory queues, so neither a slow nor a dead Redis stalls the
downloads already buffered.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

from scrapy.core.scheduler import Scheduler
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from scrapy_banker._engine import requests_in_progress, wake_engine
from scrapy_banker.netaware import Prober, link_stats, site_of
from scrapy_banker.redis.connection import redis_cluster_from_settings, redis_from_settings
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.placement import PlacementAgent
from scrapy_banker.redis.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker
from scrapy_banker.scheduler import META_SLOT, BankerScheduler
from scrapy_banker.serialize import MalformedPayload, UnserializableRequest
from scrapy_banker.settings import (
    BankerConfig,
    RedisConfig,
    load_config,
    load_placement_config,
    load_redis_config,
)

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster
    from scrapy import Request, Spider
    from scrapy.core.scheduler import BaseScheduler
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from scrapy_banker.frontier import Entry

logger = logging.getLogger(__name__)

__all__ = ["META_LEASE", "BankerRedisScheduler"]

#: ``"<partition>|<lease id>#<delivery>"`` of a request popped from Redis; never
#: serialized.  The delivery number makes the ack of a slow holder whose lease
#: expired (and went to another node) a no-op instead of cancelling that node's.
META_LEASE = "banker_lease"
#: Meta keys that describe one delivery and must not travel with a new request
#: (a retry or redirect copies ``meta``).
_TRANSIENT_META = (META_LEASE, META_SLOT)


class BankerRedisScheduler(BankerScheduler):
    """Partitioned, leased, fleet-wide polite frontier on Redis."""

    queue_kind = "redis"

    def __init__(
        self,
        crawler: Crawler,
        config: BankerConfig,
        rconfig: RedisConfig,
        client: redis.Redis | RedisCluster,
    ) -> None:
        super().__init__(crawler, config, BaseDupeFilter(), jobdir=None)
        self.rconfig = rconfig
        self.client = client
        self.node = rconfig.node_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        )
        self.redis_frontier = RedisFrontier(
            client,
            prefix=rconfig.prefix,
            partitions=rconfig.partitions,
            lease_ttl_ms=max(1, int(rconfig.lease_ttl * 1000)),
            max_deliveries=rconfig.max_deliveries,
        )
        self.registry = NodeRegistry(
            client, self.redis_frontier, node_timeout_ms=max(1, int(rconfig.node_timeout * 1000))
        )
        self.pconfig = load_placement_config(crawler.settings)
        self.placement: PlacementAgent | None = None
        self.prober: Prober | None = None
        if self.pconfig.mode != "hash":
            self.placement = PlacementAgent(
                client,
                rconfig.prefix,
                self.node,
                self.pconfig,
                link_stats(crawler),
                backlog=self.redis_frontier.backlog,
            )
            assert crawler.stats is not None
            self.prober = Prober(
                self.pconfig,
                self._send_probe,
                crawler.stats,
                measured=link_stats(crawler).samples,
                node=self.node,
            )
        self.worker = FrontierWorker(
            self.redis_frontier,
            self.registry,
            self.node,
            capacity=rconfig.node_capacity,
            heartbeat_s=rconfig.heartbeat,
            reap_interval_s=rconfig.reap_interval,
            pop_per_partition=rconfig.pop_per_partition,
            idle_backoff_max_s=rconfig.idle_backoff_max,
            on_ready=self._on_ready,
            placement=self.placement,
        )
        fingerprinter = getattr(crawler, "request_fingerprinter", None)
        if fingerprinter is None:  # pragma: no cover - Scrapy < 2.7
            raise RuntimeError("scrapy-banker needs Scrapy's request fingerprinter (>= 2.7)")
        self._fingerprinter = fingerprinter
        # Dispatched requests not acknowledged yet: request -> (partition, lease id).
        self._dispatched: dict[Request, tuple[int, str]] = {}
        self._waiting = False
        self._starved = False
        self._ticker: Any = None
        self._ticks = 0
        self._was_idle = False
        self._seen_work = False
        self._concurrent = max(1, crawler.settings.getint("CONCURRENT_REQUESTS"))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BaseScheduler:  # type: ignore[override]
        settings = crawler.settings
        config = load_config(settings)
        if not config.enabled:
            logger.info("BANKER_ENABLED is False: using Scrapy's default scheduler")
            return Scheduler.from_crawler(crawler)
        spider_name = getattr(crawler.spidercls, "name", None) or "spider"
        rconfig = load_redis_config(settings, spider_name)
        client: redis.Redis | RedisCluster = (
            redis_cluster_from_settings(settings)
            if rconfig.cluster
            else redis_from_settings(settings)
        )
        return cls(crawler, config, rconfig, client)

    # -- lifecycle ------------------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        super().open(spider)
        self.stats.set_value("banker/redis/node", self.node)
        self.stats.set_value("banker/redis/partitions", self.rconfig.partitions)
        logger.info(
            "Distributed frontier %r on Redis: node %s, %d partitions",
            self.rconfig.prefix, self.node, self.rconfig.partitions,
        )  # fmt: skip
        self._ticker = create_looping_call(self._tick)
        self._ticker.start(0.1, now=False)
        if self.rconfig.flush_on_start:
            d: Deferred[Any] = deferToThread(self.redis_frontier.clear)
            d.addCallback(self._flushed)
            return d
        self.worker.start()
        return None

    def _flushed(self, deleted: int) -> None:
        logger.info("BANKER_REDIS_FLUSH_ON_START: deleted %d keys of %r", deleted,
                    self.rconfig.prefix)  # fmt: skip
        self.worker.start()

    def close(self, reason: str) -> Deferred[None] | None:
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        self._ack_finished(everything=True)
        super().close(reason)  # puts admission-parked requests back into the frontier
        handed_back = 0
        for entry in self.frontier.entries():
            lease = self._lease_of(entry.item)
            if lease is not None:
                self.worker.nack(*lease)
                handed_back += 1
        if handed_back:
            logger.info("Gave %d buffered requests back to the queue", handed_back)
        local_only = len(self.frontier) - handed_back
        if local_only:
            logger.error(
                "%d requests that could not be serialized to Redis were never queued "
                "there and are dropped at close (see banker/redis/unserializable)",
                local_only,
            )
        self._publish_counters()
        d: Deferred[int] = deferToThread(self.worker.stop)
        d.addCallback(self._stopped)
        return d  # type: ignore[return-value]

    def _stopped(self, unsent: int) -> None:
        self._publish_counters()
        if unsent:
            logger.error(
                "Redis stayed unreachable: %d queue operations were not sent; the "
                "requests they concern stay leased in Redis and are delivered again "
                "after BANKER_REDIS_LEASE_TTL",
                unsent,
            )
            self.stats.set_value("banker/redis/unsent_at_close", unsent)

    # -- BaseScheduler contract ---------------------------------------------------

    def has_pending_requests(self) -> bool:
        if super().has_pending_requests() or self.worker.inbound or self._dispatched:
            return True
        worker = self.worker
        if not worker.connected or worker.pending_ops():
            return True  # keep the spider open: nothing is lost while Redis is away
        since = worker.drained_since
        if since is None:
            return True  # other workers still have work, which may reach our partitions
        if not self._seen_work:
            # The crawl has been empty since this worker started: nothing to
            # wait for (a RedisSpider reads its start URLs when idle).
            return False
        return self.clock() - since < self.rconfig.idle_before_close

    def __len__(self) -> int:
        return super().__len__() + len(self.worker.inbound)

    def enqueue_request(self, request: Request) -> bool:
        for key in _TRANSIENT_META:
            request.meta.pop(key, None)
        try:
            classified = self._classify(request)
        except ValueError as exc:
            self._malformed_url(request, exc)
            return False
        topic, _, _, key_hash = classified
        now = self.clock()
        try:
            payload = self.codec.encode(request, self.spider)
        except UnserializableRequest as exc:
            # Still crawled, by this worker only, and said loudly: it cannot
            # survive a crash of this worker.
            logger.error("Cannot queue %s in Redis, keeping it in memory: %s", request, exc)
            self.stats.inc_value("banker/redis/unserializable")
            self._push(request, classified, now)
            self._count("enqueued", topic, now)
            return True
        self._seen_work = True
        partition = key_hash % self.rconfig.partitions
        fingerprint = self._fingerprinter.fingerprint(request).hex()
        self.worker.enqueue(
            (partition, fingerprint, payload, int(request.priority), bool(request.dont_filter))
        )
        if self.placement is not None:
            self.placement.note_site(partition, site_of(request), urlparse_cached(request).scheme)
        self._count("enqueued", topic, now)
        return True

    def next_request(self) -> Request | None:
        self._drain_inbound()
        self._ack_finished()
        request = super().next_request()
        if request is None:
            self._waiting = True
            downloader = self._downloader
            active = len(getattr(downloader, "active", ()) or ())
            self._starved = bool(len(self.frontier)) and active < self._concurrent
        else:
            self._waiting = False
            self._starved = False
            lease = self._lease_of(request)
            if lease is not None:
                self._dispatched[request] = lease
        self._request_more()
        return request

    # -- internals ------------------------------------------------------------------

    def _pop(self, now: float) -> Entry[Request] | None:
        """Like the base pop, but a request of a partition this node lost goes back."""
        while True:
            entry = super()._pop(now)
            if entry is None:
                return None
            lease = self._lease_of(entry.item)
            if lease is None or lease[0] in self.worker.owned:
                return entry
            # Another node owns the partition now: it must fetch this host.
            self.worker.nack(*lease)
            self.stats.inc_value("banker/redis/handed_back")

    def _lease_of(self, request: Request) -> tuple[int, str] | None:
        """The lease a request came with; None for anything this scheduler did not write.

        ``meta`` is the spider's too: a value set by hand must neither crash
        the crawl nor reach Redis as an op that can never succeed.
        """
        raw = request.meta.get(META_LEASE)
        if not isinstance(raw, str) or "|" not in raw:
            return None
        partition, lease_id = raw.split("|", 1)
        if not partition.isdigit() or int(partition) >= self.rconfig.partitions or not lease_id:
            return None
        return int(partition), lease_id

    def _drain_inbound(self) -> None:
        inbound = self.worker.inbound
        if not inbound:
            return
        now = self.clock()
        self._seen_work = True
        while inbound:
            leased = inbound.popleft()
            try:
                request = self.codec.decode(leased.payload, self.spider)
                classified = self._classify(request)
            except (MalformedPayload, ValueError) as exc:
                # Garbage, a planted pickle, a request class not allowed, a
                # callback that is not a public spider method: never run,
                # kept in the partition's dead-letter list with the reason.
                logger.error(
                    "Dead-lettering malformed request %s of partition %d: %s",
                    leased.id, leased.partition, exc,
                )  # fmt: skip
                self.stats.inc_value("banker/redis/malformed")
                self.worker.dead_letter(leased.partition, leased.id, f"malformed: {exc}")
                continue
            if leased.deliveries > 1:
                self.stats.inc_value("banker/redis/redelivered")
            request.meta[META_LEASE] = f"{leased.partition}|{leased.id}#{leased.deliveries}"
            self._push(request, classified, now)

    def _ack_finished(self, everything: bool = False) -> None:
        """Acknowledge dispatched requests the engine is completely done with."""
        if not self._dispatched:
            return
        in_progress = requests_in_progress(self.crawler)
        for request in list(self._dispatched):
            if everything or in_progress is None or request not in in_progress:
                # Without the engine's view (another Scrapy version) a request
                # is acked when it ended, i.e. when its slot was released.
                if not everything and in_progress is None and META_SLOT in request.meta:
                    continue
                self.worker.ack(*self._dispatched.pop(request))

    def _request_more(self) -> None:
        worker = self.worker
        buffered = len(self.frontier) + len(worker.inbound)
        target = self.rconfig.buffer
        want = target - buffered
        if want <= 0 and self._starved and buffered < 8 * target:
            # Everything buffered waits for busy hosts while the downloader
            # has room: fetch more, other hosts may be free.
            want = max(1, target // 2)
        worker.request(want)
        worker.local_idle = not (buffered or self._parked or self._dispatched)

    def _on_ready(self) -> None:
        """Called on the worker thread when a pop landed."""
        if self._waiting:
            reactor.callFromThread(wake_engine, self.crawler)  # type: ignore[attr-defined]

    def _tick(self) -> None:
        self._ack_finished()
        self._request_more()
        idle = not self.has_pending_requests()
        if self._waiting and (self.worker.inbound or (idle and not self._was_idle)):
            # Work arrived, or the crawl just ended: tell the engine now rather
            # than on its next 5 s heartbeat (once: an idle RedisSpider polls
            # its start-URL key on every wake-up).
            wake_engine(self.crawler)
        self._was_idle = idle
        self._ticks += 1
        if self.prober is not None and self.placement is not None:
            placement = self.placement
            if (
                len(self.prober.known) != len(placement.known)
                or self.prober.weights is not placement.backlogs
            ):
                self.prober.update(placement.known.items(), placement.backlogs)
            self.prober.tick()
        if self._ticks % 10 == 0:  # a stats collector may itself be in Redis
            self._publish_counters()

    def _send_probe(self, request: Request) -> Deferred[Any]:
        """Straight to the downloader: a probe is not crawl work and must not be queued."""
        engine = self.crawler.engine
        assert engine is not None
        if hasattr(engine, "download_async"):
            return deferred_from_coro(engine.download_async(request))
        return engine.download(request)  # pragma: no cover - Scrapy < 2.14

    def _publish_counters(self) -> None:
        for name, n in self.worker.take_counters().items():
            self.stats.inc_value(name, n)
        self.stats.set_value("banker/redis/owned_partitions", len(self.worker.owned))
