"""``RedisLeaseStore``: the request store of a fleet, on Redis partitions with leases.

Each request goes to one of M logical partitions by the hash of its queue key
(its host); each partition belongs to one live worker (the node registry), and
a worker only pops partitions it owns, so one host is fetched by one worker at
a time: Scrapy's per-domain limits hold fleet-wide.  Pops are leases: a
request is acknowledged only once the engine is done with it, callback output
included, so a worker killed with ``kill -9`` loses nothing -- its leases
expire and another worker gets them.

All Redis I/O happens on a :class:`~scrapy_banker.redis.worker.FrontierWorker`
thread; the reactor only touches in-memory queues, so neither a slow nor a
dead Redis stalls the downloads already buffered.  Leased requests are put in
the scheduler's :class:`~scrapy_banker.scheduler.queue.LocalQueue`, so topics,
politeness and admission work exactly as in one process.

:class:`RedisLeaseStore` is the scheduler's side of it (the
:class:`~scrapy_banker.scheduler.store.RequestStore` protocol), composed of
parts by concern:

* :class:`~scrapy_banker.redis.store.outbound.Outbound` -- new requests
  encoded and queued for Redis;
* :class:`~scrapy_banker.redis.store.inbound.Inbound` -- leased requests
  into the local queue, and those this node may not fetch given back;
* :class:`~scrapy_banker.redis.store.acks.AckBook` -- dispatched requests,
  acked once the engine is done with them;
* :class:`~scrapy_banker.redis.store.node_telemetry.NodeTelemetry` -- the node's
  telemetry sample and the worker thread's counters;
* :class:`~scrapy_banker.redis.store.spill_keeper.SpillKeeper` -- Redis awaited and
  an earlier worker's spill replayed at start, what Redis never got spilled
  at stop;
* :class:`~scrapy_banker.redis.store.placement_hook.PlacementHook` -- network-aware
  placement, when ``BANKER_PLACEMENT`` is on;
* :class:`~scrapy_banker.redis.store.host_sync.HostSync` -- the hosts'
  politeness states, published with their partition and adopted with it;
* :class:`~scrapy_banker.redis.store.lease_fence.LeaseFence` -- the lease checked again
  at the last moment before a request is sent;
* :class:`~scrapy_banker.redis.store.fleet_revisits.FleetRevisits` -- the pages' revisit
  states in their partitions, when ``BANKER_RECRAWL`` is on.

The store itself builds them, runs the lifecycle and a 100 ms tick, and
tells the worker thread how many requests the scheduler could take.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from scrapy_banker.redis.connection import (
    RedisUnreachable,
    redis_cluster_from_settings,
    redis_from_settings,
)
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.control_channel import ControlChannel
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.store.acks import AckBook
from scrapy_banker.redis.store.fleet_revisits import FleetRevisits
from scrapy_banker.redis.store.host_sync import HostSync
from scrapy_banker.redis.store.inbound import Inbound, lease_of
from scrapy_banker.redis.store.lease_fence import LeaseFence
from scrapy_banker.redis.store.node_telemetry import NodeTelemetry
from scrapy_banker.redis.store.outbound import Outbound
from scrapy_banker.redis.store.placement_hook import placement_for
from scrapy_banker.redis.store.robots_cache import RobotsCache
from scrapy_banker.redis.store.spill_keeper import SpillKeeper
from scrapy_banker.redis.worker import FrontierWorker, WorkerOptions
from scrapy_banker.scheduler.control_gate import CLOSE_BUDGET, CLOSE_CRAWL_BUDGET
from scrapy_banker.scheduler.engine import close_spider, looping_call, wake_engine
from scrapy_banker.scheduler.seams import StoreFeatures
from scrapy_banker.settings import redis_config

if TYPE_CHECKING:
    from collections.abc import Mapping

    import redis
    from redis.cluster import RedisCluster
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure
    from typing_extensions import Self

    from scrapy_banker.core.directives import BudgetRules, ControlState
    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.politeness import HostState
    from scrapy_banker.core.spill import ClaimedSpill
    from scrapy_banker.redis.store.spill_keeper import Stopped
    from scrapy_banker.scheduler.classifier import Classified
    from scrapy_banker.scheduler.seams import SchedulerParts
    from scrapy_banker.settings import BankerConfig, RedisConfig

logger = logging.getLogger(__name__)

__all__ = ["RedisLeaseStore", "worker_options"]

#: Seconds between two runs of the store's tick on the reactor thread.
TICK_S = 0.1
#: Ticks between two copies of the worker thread's counters into the stats.
COUNTER_TICKS = 10


def worker_options(rconfig: RedisConfig, concurrent: int, per_host: int) -> WorkerOptions:
    """The worker thread's options, from the ``BANKER_REDIS_*`` settings and Scrapy's concurrency.

    A partition is popped up to one request past a host's concurrency, and
    the node works on as many partitions as it has hosts' worth of slots.
    """
    return WorkerOptions(
        capacity=rconfig.node_capacity,
        heartbeat_s=rconfig.heartbeat,
        reap_interval_s=rconfig.reap_interval,
        pop_per_partition=rconfig.pop_per_partition,
        held_cap=max(rconfig.pop_per_partition, per_host + 1),
        idle_backoff_max_s=rconfig.idle_backoff_max,
        slots=max(1, concurrent // per_host),
        steal=rconfig.steal,
        seen_cache=rconfig.seen_cache,
    )


def _check_budgets(config: BankerConfig, rconfig: RedisConfig, budgets: BudgetRules) -> None:
    """Budgets a fleet cannot count exactly fail at start-up."""
    if rconfig.cluster and (budgets.topics or budgets.crawl is not None):
        raise ValueError(
            "Invalid BANKER_CRAWL_BUDGET / BANKER_TOPICS budget with BANKER_REDIS_CLUSTER=True: "
            "topic and crawl budgets need a single Redis server (host budgets work on a cluster)"
        )
    if config.queue_key == "url" and (budgets.default is not None or budgets.patterns):
        raise ValueError(
            "Invalid BANKER_HOST_BUDGET(S) with BANKER_QUEUE_KEY='url': a fleet counts a host's "
            "pages in its partition; use 'host', 'surt' or 'domain'"
        )


class RedisLeaseStore:
    """Partitioned, leased, fleet-wide polite request store on Redis."""

    #: Budgets are counted in Redis, atomically with the leases (``lua/charge.lua``).
    counts_budgets: ClassVar[bool] = True

    def __init__(
        self,
        parts: SchedulerParts,
        rconfig: RedisConfig,
        client: redis.Redis | RedisCluster,
    ) -> None:
        self.parts = parts
        self.queue = parts.queue
        self.stats = parts.stats
        self.crawler = crawler = parts.crawler
        self.rconfig = rconfig
        self.client = client
        self.node = node = rconfig.node_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        )
        self.frontier = RedisFrontier(
            client,
            prefix=rconfig.prefix,
            partitions=rconfig.partitions,
            lease_ttl_ms=max(1, int(rconfig.lease_ttl * 1000)),
            max_deliveries=rconfig.max_deliveries,
            dedup=rconfig.dedup,
            dedup_capacity=rconfig.dedup_capacity,
            dedup_error=rconfig.dedup_error,
        )
        self.registry = NodeRegistry(
            client, self.frontier, node_timeout_ms=max(1, int(rconfig.node_timeout * 1000))
        )
        self.placement = placement_for(crawler, client, self.frontier, node)
        settings = crawler.settings
        self._concurrent = max(1, settings.getint("CONCURRENT_REQUESTS"))
        per_host = max(1, settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))
        #: The operator's directives and the budgets
        #: (:mod:`scrapy_banker.redis.frontier.control_channel`).
        self.control = ControlChannel(self.frontier.link)
        self.budgets = budgets = parts.config.budgets()
        _check_budgets(parts.config, rconfig, budgets)
        self.worker = worker = FrontierWorker(
            self.frontier,
            self.registry,
            node,
            worker_options(rconfig, self._concurrent, per_host),
            placement=None if self.placement is None else self.placement.agent,
            on_ready=self._on_ready,
            control=self.control,
            budgets=budgets,
        )
        fingerprinter = getattr(crawler, "request_fingerprinter", None)
        if fingerprinter is None:  # pragma: no cover - Scrapy < 2.7
            raise RuntimeError("scrapy-banker needs Scrapy's request fingerprinter (>= 2.7)")
        partitions = rconfig.partitions
        self.outbound = Outbound(
            parts, worker, fingerprinter, partitions=partitions, placement=self.placement
        )
        self.hosts = HostSync(parts, worker)
        self.inbound = Inbound(
            parts, worker, partitions=partitions, hosts=self.hosts, budgets=budgets
        )
        #: Set once the crawl budget is spent: nothing more is leased, and the
        #: spider closes when what it holds is done.
        self.crawl_spent = False
        self.acks = AckBook(crawler, worker, partitions=partitions)
        self.fence = LeaseFence(worker, self.acks, self.stats, partitions=partitions)
        #: robots.txt fetched once per host per fleet (read by
        #: :class:`~scrapy_banker.scheduler.robots.BankerRobotsTxtMiddleware`).
        self.robots_cache = RobotsCache(
            client, self.frontier.keyspace, node, self.stats,
            # Held while one worker downloads it: as long as that may take, but no
            # longer than the fleet takes to declare a silent worker dead -- the
            # lock of one killed mid-fetch would otherwise stall its host's new
            # owner for DOWNLOAD_TIMEOUT.  A slower download may be made twice.
            ttl_s=rconfig.robots_ttl,
            lock_s=min(settings.getfloat("DOWNLOAD_TIMEOUT", 180.0) + 5.0, rconfig.node_timeout),
        )  # fmt: skip
        self.telemetry = NodeTelemetry(
            parts, worker, key=self.frontier.keyspace.telemetry(node), partitions=partitions,
            acks=self.acks, inbound=self.inbound, placement=self.placement,
        )  # fmt: skip
        self.spill = SpillKeeper(crawler, rconfig, client, self.frontier, worker, self.stats, node)
        #: The pages' revisit states (``BANKER_RECRAWL``), in their partitions.
        self.revisits = (
            FleetRevisits(parts, worker, partitions=partitions) if parts.config.recrawl else None
        )
        self.features = StoreFeatures(
            fence=self.fence, robots=self.robots_cache, telemetry=self.telemetry, node=node,
            directives_s=TICK_S, revisits=self.revisits,
        )  # fmt: skip
        #: The control document's version last handed to the scheduler.
        self._directed = 0
        self.spider: Spider | None = None
        self._waiting = False
        self._starved = False
        self._ticker: Any = None
        self._ticks = 0
        self._was_idle = False
        self._started = False
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler, parts: SchedulerParts) -> Self:
        rconfig = redis_config(crawler)
        settings = crawler.settings
        client: redis.Redis | RedisCluster = (
            redis_cluster_from_settings(settings)
            if rconfig.cluster
            else redis_from_settings(settings)
        )
        return cls(parts, rconfig, client)

    # -- lifecycle ------------------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None] | None:
        self.spider = spider
        self.stats.set_value("banker/redis/node", self.node)
        self.stats.set_value("banker/redis/partitions", self.rconfig.partitions)
        logger.info(
            "Distributed frontier %r on Redis: node %s, %d partitions",
            self.rconfig.prefix, self.node, self.rconfig.partitions,
        )  # fmt: skip
        self._ticker = looping_call(self._tick)
        self._ticker.start(TICK_S, now=False)
        # Off the reactor: waiting for Redis, clearing it and reading spill
        # files are all blocking I/O.
        d: Deferred[Any] = deferToThread(self.spill.prepare)
        d.addCallbacks(self._prepared, self._unreachable)
        return d

    def _prepared(self, result: tuple[int | None, list[ClaimedSpill]]) -> None:
        self.spill.replay(result)
        self._started = True
        self.worker.start()

    def _unreachable(self, failure: Failure) -> Failure:
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if isinstance(failure.value, RedisUnreachable):
            # Said here in one line: Scrapy then logs the traceback of the failed start.
            logger.critical("%s", failure.value)
        return failure

    def close(self, reason: str) -> Deferred[None] | None:
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if self.revisits is not None:
            self.revisits.close()
        self.hosts.publish()  # before the acks and nacks, as always
        self.acks.ack_finished(everything=True)
        self.inbound.give_back_buffered()
        self.telemetry.publish_counters()
        if not self._started:  # the start failed: nothing was sent, nothing to stop
            self.spill.release()
            return None
        d: Deferred[Stopped] = deferToThread(self.spill.stop_and_spill)
        d.addCallback(self._stopped)
        return d  # type: ignore[return-value]

    def _stopped(self, result: Stopped) -> None:
        self.telemetry.publish_counters()
        self.spill.report(result)

    # -- the store protocol -----------------------------------------------------------

    def is_duplicate(self, request: Request) -> bool:
        """Known to be in the crawl's seen sets already (:meth:`Outbound.is_duplicate
        <scrapy_banker.redis.store.outbound.Outbound.is_duplicate>`)."""
        if self.fence.given_back and self.fence.swallow(request):
            return True  # given back at the last moment: dropped, its lease nacked
        return self.outbound.is_duplicate(request)

    def put(self, request: Request, c: Classified, now: float) -> str:
        return self.outbound.put(request, c, now, self.spider)

    def directives(self, now: float) -> ControlState | None:
        """The fleet's control document when the worker read a newer version.

        Requests of hosts paused by it are given back from the local queue
        before the scheduler follows it.
        """
        state = self.worker.control_state
        if state.version == self._directed:
            return None
        self._directed = state.version
        if state.paused_hosts or state.paused_topics:
            self.inbound.park_paused(self.queue.entries(), state)
        return state

    def refill(self, now: float) -> None:
        self._check_crawl_budget()
        self.inbound.hand_back_lost(self.spider)
        self.inbound.drain(now, self.spider)
        # Host states before acks: a new owner pops once the acks released
        # the leases, and must find the states the answers left.
        self.hosts.publish()
        self.acks.ack_finished()

    def keep(self, entry: Entry[Request]) -> bool:
        """A request of a partition this node lost goes back: its new owner must fetch it."""
        return self.inbound.keep(entry)

    def dispatched(self, request: Request) -> str:
        return self.acks.dispatched(request)

    def downloaded(self, request: Request) -> None:
        self.acks.downloaded(request)

    def polled(self, request: Request | None) -> None:
        if request is None:
            self._waiting = True
            self._starved = bool(len(self.queue)) and (
                self.parts.downloader.active < self._concurrent
            )
        else:
            self._waiting = self._starved = False
        self._request_more()

    def has_pending(self) -> bool:
        worker = self.worker
        if worker.inbound or self.acks.outstanding or self.inbound.charging:
            return True
        if self.crawl_spent:
            # Closed with its reason before the engine's idle check says "finished".
            self._close_for_budget()
            return False
        if not worker.connected or worker.pending_ops():
            return True  # keep the spider open: nothing is lost while Redis is away
        since = worker.drained_since
        if since is None:
            return True  # other workers still have work, which may reach our partitions
        if not (self.outbound.sent_any or self.inbound.received_any):
            # The crawl has been empty since this worker started: nothing to
            # wait for (a RedisSpider reads its start URLs when idle).
            return False
        if time.monotonic() - since < self.rconfig.idle_before_close:
            return True
        if worker.held_when_drained:
            # What is left is held over a host or topic budget: the reason one
            # process gives too (docs/guarantees.rst), not "finished".
            self._close_for_budget(CLOSE_BUDGET)
        return False

    def __len__(self) -> int:
        return len(self.worker.inbound)

    def queued_elsewhere(self) -> Mapping[str, int]:
        return self.inbound.queued_elsewhere()

    # -- politeness (issue #26) ------------------------------------------------------

    def politeness_changed(self, changed: Mapping[str, HostState]) -> None:
        """Host states the scheduler saw change: written to their partitions
        (:class:`~scrapy_banker.redis.store.host_sync.HostSync`)."""
        self.hosts.publish(changed)

    def dead_letter(self, request: Request, reason: str, entry: Entry[Request] | None) -> None:
        """A request whose host refused past the cap: into its partition's dead letters.

        With the reason, requeueable (``scrapy banker deadletters --requeue``).
        ``entry`` None: it was dispatched and ends through the engine, which
        must not ack it.  A request that never went through Redis is logged.
        """
        token = lease_of(request, self.rconfig.partitions)
        if token is None:
            logger.warning("Dead letter (%s), not kept (it is not in Redis): %s %s",
                           reason, request.method, request.url)  # fmt: skip
            return
        if entry is None:
            self.acks.pending.pop(request, None)
        self.hosts.publish()
        self.worker.dead_letter(token, reason)

    # -- budgets and control -----------------------------------------------------------

    # -- internals --------------------------------------------------------------------

    def _local(self) -> int:
        """Requests this process holds: queued locally, leased inbound, parked."""
        gate = self.parts.gate
        return len(self.queue) + len(self.worker.inbound) + (len(gate) if gate else 0)

    def _request_more(self) -> None:
        worker = self.worker
        buffered = len(self.queue) + len(worker.inbound)
        target = self.rconfig.buffer
        want = 0 if self.crawl_spent else target - buffered
        if want <= 0 and self._starved and buffered < 8 * target:
            # Everything buffered waits for busy hosts while the downloader
            # has room: fetch more, other hosts may be free.
            want = max(1, target // 2)
        worker.request(want)
        worker.local_idle = not (self._local() or self.acks.outstanding)
        # Room the buffered requests cannot use: the worker may take over
        # partitions whose work waits for a saturated node.
        worker.hungry = self._waiting and self.parts.downloader.active < self._concurrent

    def _on_ready(self) -> None:
        """Called on the worker thread when a pop landed."""
        if self._waiting:
            reactor.callFromThread(wake_engine, self.crawler)  # type: ignore[attr-defined]

    def _check_crawl_budget(self) -> None:
        """Stop leasing once the crawl budget is spent, and close when what is in hand is done."""
        state = self.worker.control_state
        # Spent once every page charged to it is done: a page charged to a
        # request a dead worker held is fetched by whoever leases it next.
        crawl = self.budgets.crawl_budget(state)
        done = self.worker.crawl_done
        spent = crawl is not None and done is not None and done >= crawl
        if spent and not self.crawl_spent:
            logger.info(
                "The crawl budget (%d pages) is spent fleet-wide: leasing nothing more; "
                "closing once the requests in hand are done", crawl,
            )  # fmt: skip
            self.stats.set_value("banker/budget/crawl_spent", 1)
        self.crawl_spent = spent
        if spent and not self._local() and not self.acks.outstanding and not self.inbound.charging:
            self._close_for_budget()

    def _close_for_budget(self, reason: str = CLOSE_CRAWL_BUDGET) -> None:
        if not self._closing:
            self._closing = True
            close_spider(self.crawler, reason)

    def _tick(self) -> None:
        self._check_crawl_budget()
        self.inbound.hand_back_lost(self.spider)
        self.hosts.publish()
        self.acks.ack_finished()
        self._request_more()
        idle = not self._local() and not self.has_pending()
        if self._waiting and (self.worker.inbound or (idle and not self._was_idle)):
            # Work arrived, or the crawl just ended: tell the engine now rather
            # than on its next 5 s heartbeat (once: an idle RedisSpider polls
            # its start-URL key on every wake-up).
            wake_engine(self.crawler)
        self._was_idle = idle
        self._ticks += 1
        if self.placement is not None:
            self.placement.tick()
        if self._ticks % COUNTER_TICKS == 0:  # a stats collector may itself be in Redis
            self.telemetry.publish_counters()
        self.telemetry.tick(time.monotonic(), self)
