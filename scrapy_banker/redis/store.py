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

At start the store waits for Redis (``BANKER_REDIS_CONNECT_TIMEOUT``) and
fails the crawl with the address it tried if Redis never answers; at stop,
queue operations Redis never received are written to a spill file
(:mod:`scrapy_banker.core.spill`) that the next worker with the same spill
directory replays before anything else.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.job import job_dir
from scrapy.utils.project import data_path
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from scrapy_banker.core.meta import META_LEASE, META_SLOT
from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.core.spill import ClaimedSpill, SpillDir, SpillHeader, SpillOps, merge
from scrapy_banker.core.telemetry import FleetSample, sample_json
from scrapy_banker.redis.connection import (
    RedisUnreachable,
    redacted_url,
    redis_cluster_from_settings,
    redis_from_settings,
    wait_for_redis,
)
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker, WorkerOptions
from scrapy_banker.scheduler.classifier import UnparsableURL
from scrapy_banker.scheduler.engine import looping_call, requests_in_progress, wake_engine
from scrapy_banker.scheduler.netaware import Prober, link_stats, site_of
from scrapy_banker.scheduler.sampler import take_sample
from scrapy_banker.scheduler.serialize import MalformedPayload, UnserializableRequest
from scrapy_banker.settings import ops_config, placement_config, redis_config

if TYPE_CHECKING:
    from pathlib import Path

    import redis
    from redis.cluster import RedisCluster
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure
    from typing_extensions import Self

    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.telemetry import PlacementSample
    from scrapy_banker.redis.placement import PlacementAgent
    from scrapy_banker.scheduler.classifier import Classified
    from scrapy_banker.scheduler.store import SchedulerParts
    from scrapy_banker.settings import RedisConfig

logger = logging.getLogger(__name__)

__all__ = ["PlacementHook", "RedisLeaseStore", "lease_of", "placement_for", "spill_dir"]

#: Meta keys that describe one delivery and must not travel with a new request
#: (a retry or redirect copies ``meta``).
TRANSIENT_META = (META_LEASE, META_SLOT)
#: Dispatched requests are checked for being finished (and acked) at most
#: this often (s): a lease held 5 ms longer costs nothing, a scan of every
#: dispatched request on each of the engine's polls costs CPU.
ACK_SCAN_INTERVAL_S = 0.005
#: A node's telemetry key outlives this many sampling intervals (and at least
#: TELEMETRY_MIN_TTL_S): a node that stops writing disappears from the
#: operator's view soon after, without any clean-up.
TELEMETRY_TTL_INTERVALS = 3
TELEMETRY_MIN_TTL_S = 5.0
#: Where spill files go inside ``JOBDIR`` ...
JOBDIR_SPILL = "banker-redis-spill"
#: ... and, without ``JOBDIR`` or ``BANKER_REDIS_SPILL_DIR``, in the project's
#: data directory (``.scrapy/``, like Scrapy's ``HTTPCACHE_DIR``), per spider.
DEFAULT_SPILL = "banker-spill/%(spider)s"


def spill_dir(crawler: Crawler, spider_name: str) -> str:
    """The spill directory of this crawl: ``BANKER_REDIS_SPILL_DIR``, else JOBDIR's, else default.

    A relative path is resolved like ``HTTPCACHE_DIR``: inside a Scrapy
    project, under its ``.scrapy`` directory; elsewhere under ``./.scrapy``.
    The same directory on the next start is what makes the replay happen.
    """
    configured = redis_config(crawler).spill_dir
    if configured:
        return data_path(configured)
    jobdir = job_dir(crawler.settings)
    if jobdir:
        return os.path.join(jobdir, JOBDIR_SPILL)
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in spider_name) or "spider"
    return data_path(DEFAULT_SPILL % {"spider": safe})


def lease_of(request: Request, partitions: int) -> LeaseToken | None:
    """The lease a request came with; None for anything this store did not write.

    ``meta`` is the spider's too: a value set by hand must neither crash the
    crawl nor reach Redis as an op that can never succeed.
    """
    token = request.meta.get(META_LEASE)
    if isinstance(token, LeaseToken) and 0 <= token.partition < partitions:
        return token
    return None


class PlacementHook:
    """Network-aware placement, plugged into a lease store when ``BANKER_PLACEMENT`` is on."""

    def __init__(self, agent: PlacementAgent, prober: Prober) -> None:
        self.agent = agent
        self.prober = prober

    def note(self, request: Request, partition: int) -> None:
        site = site_of(request)
        if site:  # data:, file: ... have no site to place
            self.agent.note_site(partition, site, urlparse_cached(request).scheme)

    def tick(self) -> None:
        prober, agent = self.prober, self.agent
        if len(prober.known) != len(agent.known) or prober.weights is not agent.backlogs:
            prober.update(agent.known.items(), agent.backlogs)
        prober.tick()


def placement_for(
    crawler: Crawler, client: redis.Redis | RedisCluster, frontier: RedisFrontier, node: str
) -> PlacementHook | None:
    """The one factory of placement parts; None when placement is off (``hash``)."""
    pconfig = placement_config(crawler)
    if pconfig.mode == "hash":
        return None
    assert crawler.stats is not None
    # Imported here: the planners pull in scipy, which costs a worker start-up
    # ~0.5 s (more with a fleet starting on few cores) that hash placement
    # never needs.
    from scrapy_banker.redis.placement import PlacementAgent

    links = link_stats(crawler)
    agent = PlacementAgent(
        client, frontier.keyspace, node, pconfig, links, backlog=frontier.backlog
    )

    def send_probe(request: Request) -> Deferred[Any]:
        """Straight to the downloader: a probe is not crawl work and must not be queued."""
        engine = crawler.engine
        assert engine is not None
        if hasattr(engine, "download_async"):
            return deferred_from_coro(engine.download_async(request))
        return engine.download(request)  # pragma: no cover - Scrapy < 2.14

    prober = Prober(pconfig, send_probe, crawler.stats, measured=links.samples, node=node)
    return PlacementHook(agent, prober)


class _Stopped:
    """What stopping the worker left: unsent operations and where they were spilled."""

    __slots__ = ("error", "ops", "path", "unsent")

    def __init__(
        self, unsent: int, ops: SpillOps | None, path: Path | None, error: OSError | None
    ) -> None:
        self.unsent = unsent
        self.ops = ops
        self.path = path
        self.error = error


class RedisLeaseStore:
    """Partitioned, leased, fleet-wide polite request store on Redis."""

    def __init__(
        self,
        parts: SchedulerParts,
        rconfig: RedisConfig,
        client: redis.Redis | RedisCluster,
    ) -> None:
        self.parts = parts
        self.queue = parts.queue
        self.stats = parts.stats
        self.crawler = parts.crawler
        self.rconfig = rconfig
        self.client = client
        self.node = rconfig.node_id or (
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
        self.placement = placement_for(self.crawler, client, self.frontier, self.node)
        settings = self.crawler.settings
        self._concurrent = max(1, settings.getint("CONCURRENT_REQUESTS"))
        per_host = max(1, settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))
        options = WorkerOptions(
            capacity=rconfig.node_capacity,
            heartbeat_s=rconfig.heartbeat,
            reap_interval_s=rconfig.reap_interval,
            pop_per_partition=rconfig.pop_per_partition,
            held_cap=max(rconfig.pop_per_partition, per_host + 1),
            idle_backoff_max_s=rconfig.idle_backoff_max,
            slots=max(1, self._concurrent // per_host),
            steal=rconfig.steal,
            seen_cache=rconfig.seen_cache,
        )
        self.worker = FrontierWorker(
            self.frontier,
            self.registry,
            self.node,
            options,
            placement=None if self.placement is None else self.placement.agent,
            on_ready=self._on_ready,
        )
        fingerprinter = getattr(self.crawler, "request_fingerprinter", None)
        if fingerprinter is None:  # pragma: no cover - Scrapy < 2.7
            raise RuntimeError("scrapy-banker needs Scrapy's request fingerprinter (>= 2.7)")
        self._fingerprinter = fingerprinter
        self.spider: Spider | None = None
        #: Dispatched requests not acknowledged yet.
        self._dispatched: dict[Request, LeaseToken] = {}
        #: Buffered leases given back because their partition moved away; the
        #: entries stay in the local queue until popped, then are dropped.
        self._handed_back: set[LeaseToken] = set()
        #: The worker's ``owned`` this store last looked at (replaced whole on a change).
        self._owned: dict[int, int] = {}
        self._waiting = False
        self._starved = False
        self._ticker: Any = None
        self._ticks = 0
        self._was_idle = False
        self._seen_work = False
        self._unserializable_logged = False
        self._next_ack_scan = 0.0
        ops = ops_config(self.crawler)
        self._telemetry_every = ops.timeseries_interval
        self._telemetry_top = ops.metrics_top_slots
        self._telemetry_px = int(
            1000 * max(TELEMETRY_MIN_TTL_S, TELEMETRY_TTL_INTERVALS * ops.timeseries_interval)
        )
        self._telemetry_key = self.frontier.keyspace.telemetry(self.node)
        self._next_telemetry = 0.0
        self._telemetry_failed = False
        #: Where to replay from at start and spill to at stop.
        spider_name = getattr(getattr(self.crawler, "spidercls", None), "name", None) or "spider"
        self.spill = SpillDir(spill_dir(self.crawler, spider_name))
        #: Spill files being replayed; removed once Redis confirmed all of them.
        self._claimed: list[ClaimedSpill] = []
        self._started = False
        #: The address tried, password masked, for the start-up error.
        self._url = redacted_url(settings)

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
        self._ticker.start(0.1, now=False)
        # Off the reactor: waiting for Redis, clearing it and reading spill
        # files are all blocking I/O.
        d: Deferred[Any] = deferToThread(self._prepare)
        d.addCallbacks(self._prepared, self._unreachable)
        return d

    def _prepare(self) -> tuple[int | None, list[ClaimedSpill]]:
        """Wait for Redis, flush it if asked, claim the spill files of an earlier worker."""
        timeout = self.rconfig.connect_timeout
        if timeout > 0:  # 0: start anyway, the worker thread rides out the outage
            wait_for_redis(self.client, timeout, self._url)
        deleted = self.frontier.clear() if self.rconfig.flush_on_start else None
        try:
            claimed, foreign = self.spill.claim(self.rconfig.prefix, self.rconfig.partitions)
        except OSError as exc:
            logger.error("Cannot read the spill directory %s (%s): nothing replayed",
                         self.spill.path, exc)  # fmt: skip
            return deleted, []
        for path in foreign:
            logger.error(
                "Spill file %s belongs to another crawl (another BANKER_REDIS_PREFIX or "
                "BANKER_REDIS_PARTITIONS): not replayed, left in place", path,
            )  # fmt: skip
            self.stats.inc_value("banker/redis/spill/skipped")
        if deleted is not None and claimed:
            # They belong to the crawl that was just flushed: set aside, not replayed.
            for c in claimed:
                aside = c.path.with_name(c.path.name + ".flushed")
                os.replace(c.path, aside)
                c.release(remove=False)
                logger.warning(
                    "BANKER_REDIS_FLUSH_ON_START: spill file of the flushed crawl set aside "
                    "as %s, not replayed", aside,
                )  # fmt: skip
            claimed = []
        return deleted, claimed

    def _prepared(self, result: tuple[int | None, list[ClaimedSpill]]) -> None:
        deleted, claimed = result
        if deleted is not None:
            logger.info("BANKER_REDIS_FLUSH_ON_START: deleted %d keys of %r", deleted,
                        self.rconfig.prefix)  # fmt: skip
        if claimed:
            ops = merge(c.parsed.ops for c in claimed)
            bad = sum(len(c.parsed.bad) for c in claimed)
            for c in claimed:
                if c.parsed.bad:
                    first = c.parsed.bad[0]
                    logger.error(
                        "Spill file %s: %d malformed lines skipped, kept in %s (line %d: %s)",
                        c.path, len(c.parsed.bad), c.bad_path, first.number, first.reason,
                    )  # fmt: skip
            if bad:
                self.stats.inc_value("banker/redis/spill/malformed", bad)
            logger.info(
                "Replaying %d queue operations (%s) that a worker could not send to Redis, "
                "from %s", len(ops), ops.describe(), ", ".join(str(c.path) for c in claimed),
            )  # fmt: skip
            self._claimed = claimed
            self.worker.replay(ops, self._replayed)
        self._started = True
        self.worker.start()

    def _unreachable(self, failure: Failure) -> Failure:
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if isinstance(failure.value, RedisUnreachable):
            # Said here in one line: Scrapy then logs the traceback of the failed start.
            logger.critical("%s", failure.value)
        return failure

    def _replayed(self) -> None:
        """On the worker thread: Redis confirmed every spilled operation; the files can go."""
        claimed, self._claimed = self._claimed, []
        for c in claimed:
            c.release(remove=True)
        if claimed:
            logger.info("Spilled queue operations replayed into Redis; removed %s",
                        ", ".join(str(c.path) for c in claimed))  # fmt: skip

    def close(self, reason: str) -> Deferred[None] | None:
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        self._ack_finished(everything=True)
        handed_back = local_only = 0
        for entry in self.queue.entries():
            token = lease_of(entry.item, self.rconfig.partitions)
            if token is None:
                local_only += 1
            elif token not in self._handed_back:
                self.worker.nack(token)
                handed_back += 1
        if handed_back:
            logger.info("Gave %d buffered requests back to the queue", handed_back)
        if local_only:
            logger.error(
                "%d requests that could not be serialized to Redis were never queued "
                "there and are dropped at close (see banker/redis/unserializable)",
                local_only,
            )
        self._publish_counters()
        if not self._started:  # the start failed: nothing was sent, nothing to stop
            for c in self._claimed:
                c.release(remove=False)
            return None
        d: Deferred[_Stopped] = deferToThread(self._stop_and_spill)
        d.addCallback(self._stopped)
        return d  # type: ignore[return-value]

    def _stop_and_spill(self) -> _Stopped:
        """Off the reactor: flush, leave the fleet, write what Redis never got to a spill file."""
        unsent = self.worker.stop()
        if not unsent:
            return _Stopped(0, None, None, None)
        ops = self.worker.take_unsent()
        header = SpillHeader(
            self.rconfig.prefix, self.rconfig.partitions, self.node,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )  # fmt: skip
        try:
            path = self.spill.write(header, ops)
        except OSError as exc:
            return _Stopped(unsent, ops, None, exc)
        # What was left of the spill files being replayed is in the new one now.
        claimed, self._claimed = self._claimed, []
        for c in claimed:
            c.release(remove=True)
        return _Stopped(unsent, ops, path, None)

    def _stopped(self, result: _Stopped) -> None:
        self._publish_counters()
        if not result.unsent:
            return
        self.stats.set_value("banker/redis/unsent_at_close", result.unsent)
        ops = result.ops
        assert ops is not None
        if result.path is not None:
            logger.error(
                "Redis stayed unreachable: %d queue operations were not sent (%s); they are "
                "saved in %s and replayed into Redis by the next worker started with this "
                "spill directory (JOBDIR or BANKER_REDIS_SPILL_DIR)",
                len(ops), ops.describe(), result.path,
            )  # fmt: skip
            self.stats.set_value("banker/redis/spill/written", len(ops))
        else:
            logger.error(
                "Redis stayed unreachable: %d queue operations were not sent (%s) and could "
                "not be saved in %s (%s): the requests of the enqueues are lost; leased "
                "requests are delivered again after BANKER_REDIS_LEASE_TTL",
                len(ops), ops.describe(), self.spill.path, result.error,
            )  # fmt: skip

    # -- the store protocol -----------------------------------------------------------

    def is_duplicate(self, request: Request) -> bool:
        """Known to be in the crawl's seen sets already: dropped without a round trip.

        Deduplication is the enqueue script's, fleet-wide; the worker thread
        remembers the fingerprints Redis confirmed (:setting:`BANKER_REDIS_SEEN_CACHE`),
        so the links a crawl finds again and again -- most of what a
        callback yields -- cost neither encoding nor a Lua call.
        """
        if request.dont_filter:
            return False
        if self._fingerprinter.fingerprint(request).hex() in self.worker.seen:
            self.stats.inc_value("banker/redis/duplicates_cached")
            return True
        return False

    def put(self, request: Request, c: Classified, now: float) -> str:
        for key in TRANSIENT_META:
            request.meta.pop(key, None)
        try:
            payload = self.parts.codec.encode_compact(request, self.spider)
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
            self.stats.inc_value("banker/redis/unserializable")
            self.stats.inc_value("scheduler/unserializable")
            self.queue.push(request, c, now)
            return "memory"
        self._seen_work = True
        partition = c.key_hash % self.rconfig.partitions
        fingerprint = self._fingerprinter.fingerprint(request).hex()
        self.worker.enqueue(
            EnqueueOp(partition, fingerprint, payload, int(request.priority),
                      bool(request.dont_filter))
        )  # fmt: skip
        if self.placement is not None:
            self.placement.note(request, partition)
        return "redis"

    def refill(self, now: float) -> None:
        self._hand_back_lost()
        self._drain_inbound(now)
        self._ack_finished()

    def keep(self, entry: Entry[Request]) -> bool:
        """A request of a partition this node lost goes back: its new owner must fetch it."""
        token = lease_of(entry.item, self.rconfig.partitions)
        if token is None:
            return True
        if self._handed_back and token in self._handed_back:
            self._handed_back.discard(token)  # given back when the partition moved
            return False
        if token.partition not in self.worker.owned:
            self.worker.nack(token)
            self.stats.inc_value("banker/redis/handed_back")
            return False
        if not self.worker.holds(token, time.monotonic()):
            # This node was stopped past the lease (SIGSTOP, a suspended VM):
            # it may be another node's now.  Given back with its delivery
            # number, the nack changes nothing if it is; the request waits in
            # Redis if not.  Never fetched here on a lease it cannot prove.
            logger.warning(
                "Not fetching %s: its lease (partition %d) may have expired while "
                "this node was not running; given back",
                entry.item.url, token.partition,
            )  # fmt: skip
            self.worker.nack(token)
            self.stats.inc_value("banker/redis/lease_lapsed")
            return False
        return True

    def dispatched(self, request: Request) -> str:
        token = lease_of(request, self.rconfig.partitions)
        if token is None:
            return "memory"
        self._dispatched[request] = token
        self.worker.started(token)
        return "redis"

    def downloaded(self, request: Request) -> None:
        token = lease_of(request, self.rconfig.partitions)
        if token is not None:
            self.worker.downloaded(token)

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
        if worker.inbound or self._dispatched:
            return True
        if not worker.connected or worker.pending_ops():
            return True  # keep the spider open: nothing is lost while Redis is away
        since = worker.drained_since
        if since is None:
            return True  # other workers still have work, which may reach our partitions
        if not self._seen_work:
            # The crawl has been empty since this worker started: nothing to
            # wait for (a RedisSpider reads its start URLs when idle).
            return False
        return time.monotonic() - since < self.rconfig.idle_before_close

    def __len__(self) -> int:
        return len(self.worker.inbound)

    # -- internals --------------------------------------------------------------------

    def _local(self) -> int:
        """Requests this process holds: queued locally, leased inbound, parked."""
        gate = self.parts.gate
        return len(self.queue) + len(self.worker.inbound) + (len(gate) if gate else 0)

    def _drain_inbound(self, now: float) -> None:
        inbound = self.worker.inbound
        if not inbound:
            return
        self._seen_work = True
        codec, classify, spider = self.parts.codec, self.parts.classifier.classify, self.spider
        while inbound:
            leased = inbound.popleft()
            try:
                request = codec.decode(leased.payload, spider)
                c = classify(request)
            except (MalformedPayload, UnparsableURL) as exc:
                # Garbage, a planted pickle, a request class not allowed, a
                # callback that is no method of the spider: never run,
                # kept in the partition's dead-letter list with the reason.
                logger.error(
                    "Dead-lettering malformed request %s of partition %d: %s",
                    leased.id, leased.partition, exc,
                )  # fmt: skip
                self.stats.inc_value("banker/redis/malformed")
                self.worker.dead_letter(leased.token, f"malformed: {exc}")
                continue
            if leased.deliveries > 1:
                self.stats.inc_value("banker/redis/redelivered")
            request.meta[META_LEASE] = leased.token
            self.queue.push(request, c, now)

    def _ack_finished(self, everything: bool = False) -> None:
        """Acknowledge dispatched requests the engine is completely done with."""
        if not self._dispatched:
            return
        now = time.monotonic()
        if not everything and now < self._next_ack_scan:
            return  # scanned a moment ago: the engine calls refill in bursts
        self._next_ack_scan = now + ACK_SCAN_INTERVAL_S
        in_progress = requests_in_progress(self.crawler)
        for request in list(self._dispatched):
            if everything or in_progress is None or request not in in_progress:
                # Without the engine's view (another Scrapy version) a request
                # is acked when it ended, i.e. when its slot was released.
                ended = request.meta.get(META_SLOT) is None
                if not everything and in_progress is None and not ended:
                    continue
                self.worker.ack(self._dispatched.pop(request))

    def _request_more(self) -> None:
        worker = self.worker
        buffered = len(self.queue) + len(worker.inbound)
        target = self.rconfig.buffer
        want = target - buffered
        if want <= 0 and self._starved and buffered < 8 * target:
            # Everything buffered waits for busy hosts while the downloader
            # has room: fetch more, other hosts may be free.
            want = max(1, target // 2)
        worker.request(want)
        worker.local_idle = not (self._local() or self._dispatched)
        # Room the buffered requests cannot use: the worker may take over
        # partitions whose work waits for a saturated node.
        worker.hungry = self._waiting and self.parts.downloader.active < self._concurrent

    def _on_ready(self) -> None:
        """Called on the worker thread when a pop landed."""
        if self._waiting:
            reactor.callFromThread(wake_engine, self.crawler)  # type: ignore[attr-defined]

    def _hand_back_lost(self) -> None:
        """Give back at once what is buffered of partitions this node no longer owns.

        Their new owner's pops wait (``BUSY``) until every lease of the old
        epoch is released; buffered requests would otherwise be released
        only when they reach the head of their lane here.  Requests in
        flight finish and are acked as usual.
        """
        owned = self.worker.owned
        if owned is self._owned:
            return
        lost = self._owned.keys() - owned.keys()
        self._owned = owned
        if not lost:
            return
        self._drain_inbound(time.monotonic())
        n = 0
        for entry in self.queue.entries():
            token = lease_of(entry.item, self.rconfig.partitions)
            if token is not None and token.partition in lost and token not in self._handed_back:
                self._handed_back.add(token)
                self.worker.nack(token)
                n += 1
        if n:
            self.stats.inc_value("banker/redis/handed_back", n)

    def _tick(self) -> None:
        self._hand_back_lost()
        self._ack_finished()
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
        if self._ticks % 10 == 0:  # a stats collector may itself be in Redis
            self._publish_counters()
        now = time.monotonic()
        if now >= self._next_telemetry:
            self._next_telemetry = now + self._telemetry_every
            self._publish_telemetry()

    # -- telemetry ----------------------------------------------------------------------

    def telemetry_fleet(self) -> FleetSample:
        """This node's share of the fleet, from what the reactor thread may read.

        Leases held: dispatched and not acked, leased and not queued yet,
        queued locally or parked (minus those already given back); the
        worker's own lease book is its thread's alone.
        """
        worker = self.worker
        gate = self.parts.gate
        local = len(self.queue) + (len(gate) if gate else 0) - len(self._handed_back)
        return FleetSample(
            partitions_owned=len(worker.owned),
            partitions_total=self.rconfig.partitions,
            leased=len(self._dispatched) + len(worker.inbound) + max(0, local),
            pending_ops=worker.pending_ops(),
            connected=worker.connected,
        )

    def telemetry_placement(self) -> PlacementSample | None:
        return None if self.placement is None else self.placement.agent.latest

    def _publish_telemetry(self) -> None:
        """Hand this node's latest sample to the worker thread, which SETs it with an expiry.

        Never allowed to stop the tick that acks leases: a failure is logged
        once and the crawl goes on without telemetry.
        """
        try:
            sample = take_sample(self.parts, self, top_slots=self._telemetry_top)
            value = sample_json(sample)
        except Exception:
            if not self._telemetry_failed:
                self._telemetry_failed = True
                logger.exception("Could not sample this node's telemetry; the crawl goes on")
            return
        self.worker.publish_telemetry(self._telemetry_key, value, self._telemetry_px)

    def _publish_counters(self) -> None:
        for name, n in self.worker.take_counters().items():
            self.stats.inc_value(name, n)
        self.stats.set_value("banker/redis/owned_partitions", len(self.worker.owned))
