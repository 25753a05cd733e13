"""How many workers one Redis carries: a model of the fleet's Redis load.

A fleet of ``scrapy crawl`` workers shares one frontier through Redis
(:mod:`scrapy_banker.redis`).  Redis runs commands on one thread, so the
question an operator asks before scaling out -- "how many workers, at how
many pages per second, before Redis is the bottleneck, and how many Cluster
masters then?" -- is a question about the CPU time of that one thread.

This module answers it from first principles plus measured costs:

1. :func:`worker_flows` turns a worker's configuration (:class:`WorkerConfig`:
   pages/s, links per page, dedup rates, batch sizes, heartbeat, intervals,
   partitions) into the Redis operations it issues per second, by kind --
   the enqueue script per link that reaches Redis, a pop and an ack per page,
   a lease renewal per held partition every heartbeat, the registry's
   heartbeat reads, ten table polls a second, telemetry, census checks when
   idle, placement reads -- each as calls, items per call and round trips.
   :func:`fleet_flows` adds what depends on the whole fleet: the reaper
   (single-flight, so at most one round at a time: an Erlang loss system)
   and the rebalances a churning fleet triggers.
2. A :class:`CostTable` gives each kind's server-side cost (microseconds per
   call plus per item, as ``INFO commandstats`` reports it) and the
   per-command and per-round-trip overhead that commandstats leaves out
   (reading, parsing, replying); ``benchmarks/fleet_model.py`` measures them
   against a real ``redis-server`` (:data:`DEFAULT_COSTS` holds the numbers
   measured for the docs).
3. :func:`predict` multiplies and sums: Redis CPU as a fraction of one core,
   commands/s and round trips/s, per category.  :func:`saturation_workers`
   finds where one server reaches a utilisation; :func:`cluster_plan` how
   many Redis Cluster masters a fleet needs, given that partition keys
   spread over masters by hash slot while a few fleet-wide keys (the table,
   the heartbeats, the ``finished`` counter) each stay on one master, and
   that M partitions balance over masters only when M is much larger.

Pure: no Scrapy, Twisted or Redis import, so the docs' tables, the benchmark
and the tests compute the same numbers.  The constants are copies of the
worker's (:mod:`scrapy_banker.redis.worker.jobs`, :mod:`scrapy_banker.redis.worker`,
:mod:`scrapy_banker.redis.frontier`), kept literal here because importing
those modules would import redis-py; ``tests/test_fleetmodel.py`` checks
that each copy equals the worker's value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "CATEGORIES",
    "DEFAULT_COSTS",
    "KINDS",
    "ClusterPlan",
    "CostTable",
    "FleetLoad",
    "Flow",
    "OpCost",
    "WorkerConfig",
    "cluster_plan",
    "fleet_flows",
    "hot_key",
    "imbalance",
    "load_of",
    "max_masters",
    "predict",
    "reap_rounds_per_s",
    "saturation_workers",
    "worker_flows",
]

#: Seconds between two table-version polls of a busy worker
#: (``redis.worker.jobs.SYNC_INTERVAL_S``).
SYNC_INTERVAL_S = 0.1
#: Seconds between two full scans of every owned partition
#: (``redis.worker.jobs.FULL_SCAN_INTERVAL_S``).
FULL_SCAN_INTERVAL_S = 2.0
#: Partitions per pop pipeline (``redis.worker.jobs.POP_CHUNK``).
POP_CHUNK = 128
#: Partitions per reap pipeline (``redis.frontier.reaper.REAP_CHUNK``).
REAP_CHUNK = 128
#: Partitions counted by one census script on one server (``redis.frontier.census.CENSUS_CHUNK``).
CENSUS_CHUNK = 256
#: Seconds between census checks of a worker with room it cannot fill
#: (``redis.worker.jobs.CENSUS_INTERVAL_S``).
CENSUS_INTERVAL_S = 0.1
#: ... once the crawl was found drained (``redis.worker.jobs.DRAINED_CENSUS_INTERVAL_S``).
DRAINED_CENSUS_INTERVAL_S = 0.5
#: Share of the reap interval a finished reaper round keeps the lock
#: (``redis.worker.jobs.REAP_HOLD_FRACTION``).
REAP_HOLD_FRACTION = 0.8
#: Idle sleep (s) of a worker while the crawl is not drained, and for a while
#: after it drained (``redis.worker.ACTIVE_IDLE_SLEEP_S``).
ACTIVE_IDLE_SLEEP_S = 0.1
#: Bytes of the stored partition table per partition (owner name + epoch in JSON).
TABLE_BYTES_PER_PARTITION = 30

#: Every operation kind a cost is measured for.  Scripts are ``EVALSHA`` calls;
#: the rest are plain commands.  "items" is what a call's cost grows with.
KINDS: tuple[str, ...] = (
    "enqueue_new",  # enqueue script, fingerprint not seen: queued
    "enqueue_dup",  # enqueue script, fingerprint seen: refused
    "bump",  # INCR of <prefix>:finished, before every batch of acks
    "ack",  # ack script; items: ids acked
    "pop",  # pop script that leases; items: requests leased
    "pop_empty",  # pop script on an empty partition
    "renew",  # renew script; items: ids renewed
    "reap",  # reap script on a partition with no expired lease
    "count",  # census script; items: partitions counted
    "time",  # TIME
    "zadd",  # ZADD (heartbeat)
    "zrangebyscore",  # live nodes; items: live nodes
    "hgetall",  # items: fields
    "getrange",  # the table's version (first 40 bytes)
    "spop",  # the ready set, usually empty
    "sadd",  # wake another node (ready set); items: partitions
    "expire",
    "set",  # telemetry SET PX; items: KB
    "set_nx",  # SET NX PX (reaper / rebalance lock)
    "get",  # small GET (lock owner, finished counter)
    "get_table",  # GET of the partition table; items: partitions
    "del",
)

#: Categories the load is reported by, in report order.
CATEGORIES: tuple[str, ...] = (
    "enqueue",
    "pop",
    "ack",
    "renew",
    "registry",
    "table_poll",
    "notify",
    "telemetry",
    "reaper",
    "census",
    "rebalance",
    "placement",
)


@dataclass(frozen=True)
class OpCost:
    """Server CPU of one call: ``base_us + per_item_us * items`` (commandstats' usec_per_call)."""

    base_us: float
    per_item_us: float = 0.0

    def us(self, items: float) -> float:
        return self.base_us + self.per_item_us * items


@dataclass(frozen=True)
class CostTable:
    """Measured server-side costs; the same numbers for every worker of the fleet.

    ``per_command_us`` and ``per_round_trip_us`` are the CPU commandstats does
    not see: a round trip costs an ``epoll`` wake-up, a ``read`` and a
    ``write`` whatever it carries; each command in it costs parsing, lookup
    and a reply.  Without them a model of many small commands (ten table
    polls a second per worker) would undercount by half.  ``idle_us_per_s``
    is the server's own housekeeping (``serverCron``), paid once.
    """

    ops: Mapping[str, OpCost]
    per_command_us: float
    per_round_trip_us: float
    idle_us_per_s: float = 0.0
    #: Live CPU over the CPU the isolated costs add up to.  Each kind is
    #: measured alone; a fleet's mix of clients, connections and commands
    #: costs Redis more (cache misses, more wake-ups, client bookkeeping):
    #: ``benchmarks/fleet_model.py`` measures the ratio against real worker
    #: threads and :data:`DEFAULT_COSTS` carries the largest one it found.
    live_factor: float = 1.0
    #: Where the numbers come from (machine, Redis version, command).
    source: str = ""

    def cost(self, kind: str) -> OpCost:
        try:
            return self.ops[kind]
        except KeyError:
            raise KeyError(f"no measured cost for operation kind {kind!r}") from None


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker does, in the terms of its settings and its crawl.

    The crawl's shape (links per page, how many were seen already, how many
    of those the worker's seen cache drops) decides the enqueue traffic; the
    ``BANKER_REDIS_*`` settings the rest.  ``leases_per_pop``,
    ``empty_pops_per_pop`` and ``pages_per_flush`` describe how the worker
    thread batches: measured with the real
    :class:`~scrapy_banker.redis.worker.FrontierWorker` by
    ``benchmarks/fleet_model.py`` (defaults: its figures at 5-50 pages/s).
    """

    #: Pages fetched (and acked) per second by this worker.
    pages_per_s: float = 20.0
    #: ``CONCURRENT_REQUESTS``.
    concurrent_requests: int = 16
    #: ``BANKER_REDIS_BUFFER``; None: twice ``concurrent_requests``.
    buffer: int | None = None
    #: ``BANKER_REDIS_POP_PER_PARTITION``.
    pop_per_partition: int = 4
    #: Requests a callback yields per page.
    links_per_page: float = 20.0
    #: Share of those the crawl already knows (the enqueue script refuses them).
    duplicate_fraction: float = 0.9
    #: Share of the known ones this worker's seen cache drops before Redis
    #: (``BANKER_REDIS_SEEN_CACHE``; 0 when it is 0).
    seen_cache_hit: float = 0.5
    #: Share of the new links on the page's own host: they land in a partition
    #: this worker owns, so no other node is woken for them.
    same_host_fraction: float = 0.8
    #: Share of a worker's partitions holding queued work (1: a deep frontier).
    work_fraction: float = 1.0
    #: Requests leased per targeted pop call that leases (at most ``pop_per_partition``).
    leases_per_pop: float = 1.0
    #: Pop calls that find their partition empty, per pop call that leases.
    empty_pops_per_pop: float = 1.0
    #: Finished pages whose acks (and children) share one flush round trip.
    pages_per_flush: float = 1.0
    #: ``BANKER_REDIS_HEARTBEAT`` (s).
    heartbeat_s: float = 2.0
    #: ``BANKER_REDIS_REAP_INTERVAL`` (s).
    reap_interval_s: float = 5.0
    #: Share of the reap interval a finished round keeps the reaper lock
    #: (``FrontierWorker`` holds it for 0.8 of the interval; 0: released at
    #: once, so every worker's round runs -- the unheld lock, for comparison).
    reap_hold_fraction: float = REAP_HOLD_FRACTION
    #: ``BANKER_REDIS_PARTITIONS``.
    partitions: int = 1024
    #: ``BANKER_TIMESERIES_INTERVAL`` (s): each node SETs its telemetry; None: off.
    telemetry_interval_s: float | None = 1.0
    #: Bytes of one telemetry sample.
    telemetry_bytes: int = 2000
    #: ``BANKER_PLACEMENT_INTERVAL`` (s) when ``BANKER_PLACEMENT`` is not ``hash``; None: hash.
    placement_interval_s: float | None = None
    #: Sites (partitions with a known site) the placement hashes hold.
    placement_sites: int = 1024
    #: Share of the time the worker has room it cannot fill while the crawl
    #: has work (a census check every 0.1 s that stops at the first work found).
    idle_fraction: float = 0.0
    #: Share of the time it is hungry and may steal (a full census per steal attempt).
    hungry_fraction: float = 0.0
    #: Seconds between steal attempts (0.25 s, backing off to 2 s).
    steal_interval_s: float = 1.0
    #: The crawl is over (or a RedisSpider waits for start URLs): no pages,
    #: a full census and a poll every ``idle_sleep_s``.
    drained: bool = False
    #: Idle sleep of a drained worker: 0.1 s for 10 s, then up to
    #: ``BANKER_REDIS_IDLE_BACKOFF_MAX``.
    idle_sleep_s: float = ACTIVE_IDLE_SLEEP_S
    #: Workers joining or leaving the fleet per hour (each one rebalances).
    churn_per_hour: float = 0.0
    #: Client <-> Redis round-trip time (ms): how long one reaper round holds its lock.
    rtt_ms: float = 0.5
    #: ``BANKER_REDIS_CLUSTER``: census scripts count one partition each.
    cluster: bool = False

    def __post_init__(self) -> None:
        for name in ("pages_per_s", "links_per_page", "churn_per_hour", "rtt_ms",
                     "empty_pops_per_pop"):  # fmt: skip
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in (
            "duplicate_fraction",
            "seen_cache_hit",
            "same_host_fraction",
            "work_fraction",
            "idle_fraction",
            "hungry_fraction",
            "reap_hold_fraction",
        ):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        for name in ("heartbeat_s", "reap_interval_s", "steal_interval_s", "idle_sleep_s",
                     "leases_per_pop", "pages_per_flush"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.leases_per_pop > self.pop_per_partition:
            raise ValueError(
                f"leases_per_pop ({self.leases_per_pop}) cannot exceed "
                f"pop_per_partition ({self.pop_per_partition})"
            )
        for name in ("concurrent_requests", "pop_per_partition", "partitions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    @property
    def buffered(self) -> int:
        return 2 * self.concurrent_requests if self.buffer is None else self.buffer

    @property
    def held(self) -> int:
        """Leases a busy worker holds: its buffer plus what is in flight."""
        return self.buffered + self.concurrent_requests

    @property
    def enqueues_new_per_page(self) -> float:
        return self.links_per_page * (1 - self.duplicate_fraction)

    @property
    def enqueues_dup_per_page(self) -> float:
        """Known links that still cost a script call: the seen cache missed them."""
        return self.links_per_page * self.duplicate_fraction * (1 - self.seen_cache_hit)


@dataclass(frozen=True)
class Flow:
    """One kind of operation at one rate: ``calls`` per second of ``kind``.

    ``round_trips`` per second are the pipelines these calls travel in (a
    flush carries enqueues, the bump and acks in one; their round trip is
    counted once, on the first flow).
    """

    category: str
    kind: str
    calls: float
    items: float = 0.0
    round_trips: float = 0.0

    def scaled(self, factor: float) -> Flow:
        return replace(self, calls=self.calls * factor, round_trips=self.round_trips * factor)

    def cpu_us(self, costs: CostTable) -> float:
        """Server CPU (µs per second) of this flow."""
        per_call = costs.cost(self.kind).us(self.items) + costs.per_command_us
        return self.calls * per_call + self.round_trips * costs.per_round_trip_us


def _distinct(n: float, k: float) -> float:
    """Expected distinct bins hit by ``k`` balls thrown uniformly into ``n`` bins."""
    if n <= 0 or k <= 0:
        return 0.0
    return n * (1 - (1 - 1 / n) ** k) if n > 1 else 1.0


def worker_flows(cfg: WorkerConfig, workers: int) -> list[Flow]:
    """The Redis operations of one worker of a fleet of ``workers``, per second.

    Each line follows the code path of :class:`~scrapy_banker.redis.worker.FrontierWorker`:

    * flush (one round trip per ``pages_per_flush`` pages): an enqueue script
      per new link and per known link the seen cache missed, a ``bump`` and
      an ack per finished page;
    * a wake-up (``SADD`` + ``EXPIRE``) per other node owning a partition a
      new link landed in (one round trip);
    * pops: one pop round trip per flush (the step after it), ``pages_per_s /
      leases_per_pop`` pop calls that lease, ``empty_pops_per_pop`` as many
      on partitions that turned out empty, and every 2 s a full scan of the
      owned partitions (at most one 128-partition chunk when the first finds
      enough);
    * every heartbeat: ``TIME`` + ``ZADD`` (beat), ``TIME`` +
      ``ZRANGEBYSCORE`` + ``HGETALL`` over the live nodes, ``GETRANGE`` of
      the table's version -- six round trips -- and a renew script per
      partition holding leases (one round trip);
    * ten polls a second (``GETRANGE`` + ``SPOP``, one round trip);
    * a telemetry ``SET`` per interval;
    * census checks when idle or hungry, and the placement reads per heartbeat.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    n = workers
    m = cfg.partitions
    owned = m / n
    flows: list[Flow] = []
    hb = 1 / cfg.heartbeat_s
    polls = 1 / cfg.idle_sleep_s if cfg.drained else 1 / SYNC_INTERVAL_S
    flows.append(Flow("table_poll", "getrange", polls, 0, polls))
    flows.append(Flow("table_poll", "spop", polls))

    # Registry: beat and live nodes, the table's version.
    flows.append(Flow("registry", "time", 2 * hb, 0, 2 * hb))
    flows.append(Flow("registry", "zadd", hb, 0, hb))
    flows.append(Flow("registry", "zrangebyscore", hb, n, hb))
    flows.append(Flow("registry", "hgetall", hb, n, hb))
    flows.append(Flow("registry", "getrange", hb, 0, hb))

    if cfg.telemetry_interval_s is not None:
        rate = 1 / cfg.telemetry_interval_s
        flows.append(Flow("telemetry", "set", rate, cfg.telemetry_bytes / 1024, rate))

    census_calls = m if cfg.cluster else math.ceil(m / CENSUS_CHUNK)
    census_items = 1 if cfg.cluster else min(m, CENSUS_CHUNK)
    census_rts = m if cfg.cluster else 1  # a cluster pipeline: one per partition's master
    if cfg.drained:
        rate = 1 / max(DRAINED_CENSUS_INTERVAL_S, cfg.idle_sleep_s)
        flows += _census(rate, census_calls, census_items, census_rts)
        if cfg.placement_interval_s is not None:
            flows += _placement(cfg, n)
        return flows

    p = cfg.pages_per_s
    flushes = p / cfg.pages_per_flush
    new = cfg.enqueues_new_per_page
    flows.append(Flow("enqueue", "enqueue_new", p * new, 0, flushes))
    flows.append(Flow("enqueue", "enqueue_dup", p * cfg.enqueues_dup_per_page))
    flows.append(Flow("ack", "bump", flushes, 0, flushes if cfg.cluster else 0.0))
    ack_calls = _distinct(m, cfg.pages_per_flush)  # per flush: one per partition
    flows.append(Flow("ack", "ack", flushes * ack_calls, cfg.pages_per_flush / ack_calls,
                      flushes if cfg.cluster else 0.0))  # fmt: skip

    # Wake-ups: new links landing in partitions other nodes own.
    k = new * (1 - cfg.same_host_fraction) * cfg.pages_per_flush
    others = _distinct(n, k) - (1 - (1 - 1 / n) ** k) if n > 1 else 0.0
    if others > 0:
        flows.append(Flow("notify", "sadd", flushes * others, k / max(others, 1.0),
                          flushes * (1 - (1 / n) ** k)))  # fmt: skip
        flows.append(Flow("notify", "expire", flushes * others))

    # Pops.  A full scan (every 2 s, when the buffer wants anything) pops
    # the first 128-partition chunk of the owned partitions, those with work
    # first, up to pop_per_partition each, whatever the buffer asked for: with
    # many owned partitions one scan leases more than two seconds of pages,
    # and the worker lives on scans alone (one every scan_leases / P s).
    # With few owned partitions scans lease little, and targeted pops of the
    # partitions known to hold work (one round trip per flush) do the rest.
    chunk = min(owned, POP_CHUNK)
    chunk_work = min(owned * cfg.work_fraction, POP_CHUNK)
    scan_leases = chunk_work * cfg.pop_per_partition
    if p > 0 and scan_leases >= p * FULL_SCAN_INTERVAL_S:
        scans = p / scan_leases
        targeted = 0.0
        held_requests = scan_leases / 2 + cfg.concurrent_requests
        held_partitions = min(
            owned, chunk_work / 2 + cfg.concurrent_requests / cfg.pop_per_partition
        )
    else:
        scans = 1 / FULL_SCAN_INTERVAL_S
        targeted = max(0.0, p - scans * scan_leases)
        held_requests = float(cfg.held)
        held_partitions = min(owned, held_requests)
    leasing = targeted / cfg.leases_per_pop
    pop_calls = scans * chunk_work + leasing
    flows.append(
        Flow(
            "pop",
            "pop",
            pop_calls,
            p / pop_calls if pop_calls else 0.0,
            scans + (flushes if targeted > 0 else 0.0),
        )
    )
    flows.append(
        Flow("pop", "pop_empty", scans * (chunk - chunk_work) + leasing * cfg.empty_pops_per_pop)
    )

    # Lease renewals: one script per partition holding leases, each heartbeat.
    held_partitions = max(1.0, held_partitions)
    flows.append(Flow("renew", "renew", hb * held_partitions, held_requests / held_partitions, hb))

    # Census: idle (sum mode stops at the first partition with work: one
    # partition per script) and hungry (every partition, each).
    if cfg.idle_fraction > 0:
        flows += _census(cfg.idle_fraction / CENSUS_INTERVAL_S, census_calls, 1, census_rts)
    if cfg.hungry_fraction > 0:
        flows += _census(
            cfg.hungry_fraction / cfg.steal_interval_s, census_calls, census_items, census_rts
        )
    if cfg.placement_interval_s is not None:
        flows += _placement(cfg, n)
    return flows


def _census(rate: float, calls: int, items: float, round_trips: int) -> list[Flow]:
    """A census ``rate`` times a second: two ``GET`` of ``finished`` around the counts."""
    return [
        Flow("census", "get", 2 * rate, 0, 2 * rate),
        Flow("census", "count", rate * calls, items, rate * round_trips),
    ]


def _placement(cfg: WorkerConfig, workers: int) -> list[Flow]:
    """Network-aware placement: every heartbeat each worker reads the sites'
    schemes and backlogs (two ``HGETALL``); every interval one planner reads
    every live node's RTT and bandwidth hashes and the placed costs."""
    assert cfg.placement_interval_s is not None
    hb = 1 / cfg.heartbeat_s
    plan = 1 / cfg.placement_interval_s / workers  # one planner per interval, fleet-wide
    sites = cfg.placement_sites
    return [
        Flow("placement", "hgetall", 2 * hb, sites, 2 * hb),
        Flow("placement", "hgetall", plan * (2 * workers + 2), sites, plan * (2 * workers + 2)),
    ]


def reap_rounds_per_s(cfg: WorkerConfig, workers: int, costs: CostTable) -> tuple[float, float]:
    """Reaper rounds per second fleet-wide, and lock attempts that found it taken.

    Every worker tries the single-flight lock every reap interval ``R``.  A
    round holds it for about ``ceil(M / 128)`` round trips plus the scripts'
    time ``D``, then keeps it for ``h = reap_hold_fraction * R``; attempts
    that find it held give up.  The next round starts at the first attempt
    after the hold: the round's own worker comes back ``(1 - h/R) R`` later,
    the others, ``workers - 1`` phases spread over the interval, on average
    ``R / workers`` later -- so a round every ``D + h + min((1 - h/R) R,
    R / workers)``.  Without the hold (``h = 0``) it is an Erlang loss system
    with one server: of ``λ = workers / R`` attempts a second, ``λ / (1 +
    λ D)`` reap -- every worker's round: a third of Redis's CPU at 100
    workers in the fleet-size benchmark, which is what the hold saves.
    """
    m = cfg.partitions
    rtt = cfg.rtt_ms / 1000
    chunks = math.ceil(m / REAP_CHUNK)
    duration = chunks * rtt + m * costs.cost("reap").us(0) * 1e-6 + 5 * rtt
    interval = cfg.reap_interval_s
    attempts = workers / interval
    hold = cfg.reap_hold_fraction * interval
    if hold <= 0:
        rounds = attempts / (1 + attempts * duration)
    else:
        wait = min(interval - hold, interval / max(1, workers))
        rounds = min(attempts, 1 / (duration + hold + wait))
    return rounds, attempts - rounds


def fleet_flows(cfg: WorkerConfig, workers: int, costs: CostTable) -> list[Flow]:
    """Every operation of the fleet per second: ``workers`` times one worker's,
    plus the reaper and the rebalances, which depend on the fleet as a whole."""
    flows = [f.scaled(workers) for f in worker_flows(cfg, workers)]
    m = cfg.partitions
    rounds, refused = reap_rounds_per_s(cfg, workers, costs)
    chunks = math.ceil(m / REAP_CHUNK)
    flows += [
        Flow("reaper", "set_nx", rounds + refused, 0, rounds + refused),
        Flow("reaper", "bump", rounds, 0, rounds),
        Flow("reaper", "reap", rounds * m, 0, rounds * chunks),
        Flow("reaper", "get", rounds, 0, rounds),
        Flow("reaper", "del", rounds, 0, rounds),
    ]
    if cfg.churn_per_hour > 0:
        # Each join or leave: every worker sees the live set change on its next
        # heartbeat, counts every partition (census, each) and tries the lock;
        # one rewrites the table (owner keys of the moved partitions); all reload it.
        events = cfg.churn_per_hour / 3600
        census_calls = m if cfg.cluster else math.ceil(m / CENSUS_CHUNK)
        census_items = 1 if cfg.cluster else min(m, CENSUS_CHUNK)
        per_event = [
            Flow("rebalance", "get", 2 * workers, 0, 2 * workers),
            Flow(
                "rebalance",
                "count",
                workers * census_calls,
                census_items,
                workers * (m if cfg.cluster else 1),
            ),
            Flow("rebalance", "set_nx", workers, 0, workers),
            Flow("rebalance", "get_table", 2 * workers + 1, m, 2 * workers + 1),
            Flow("rebalance", "set_nx", m / max(workers, 1) + 1, 0, 1),
        ]
        flows += [f.scaled(events) for f in per_event]
    return flows


@dataclass(frozen=True)
class FleetLoad:
    """The predicted Redis load of a fleet on one server (or summed over a cluster)."""

    workers: int
    pages_per_s: float
    #: Redis CPU as a fraction of one core (1.0: the command thread is saturated).
    cpu: float
    #: Commands/s clients send (an ``EVALSHA`` is one, whatever its script does).
    commands_per_s: float
    #: Script calls (``EVALSHA``) per second, included in ``commands_per_s``.
    script_calls_per_s: float
    round_trips_per_s: float
    #: Category -> CPU (fraction of a core).
    cpu_by_category: dict[str, float] = field(default_factory=dict)
    #: Category -> commands/s.
    commands_by_category: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_per_page_us(self) -> float:
        """Redis CPU per page crawled by the fleet (µs)."""
        total = self.workers * self.pages_per_s
        return self.cpu * 1e6 / total if total else math.inf


_SCRIPTS = frozenset({"enqueue_new", "enqueue_dup", "bump", "ack", "pop", "pop_empty",
                      "renew", "reap", "count"})  # fmt: skip


def load_of(flows: Iterable[Flow], costs: CostTable, workers: int, pages_per_s: float) -> FleetLoad:
    """Sum flows into a :class:`FleetLoad` (``idle_us_per_s`` added once)."""
    cpu: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    cmds: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    scripts = rts = 0.0
    for f in flows:
        cpu[f.category] += f.cpu_us(costs) / 1e6
        cmds[f.category] += f.calls
        rts += f.round_trips
        if f.kind in _SCRIPTS:
            scripts += f.calls
    cpu = {k: v * costs.live_factor for k, v in cpu.items()}
    total_cpu = sum(cpu.values()) + costs.idle_us_per_s / 1e6
    return FleetLoad(
        workers=workers,
        pages_per_s=pages_per_s,
        cpu=total_cpu,
        commands_per_s=sum(cmds.values()),
        script_calls_per_s=scripts,
        round_trips_per_s=rts,
        cpu_by_category=cpu,
        commands_by_category=cmds,
    )


def predict(cfg: WorkerConfig, workers: int, costs: CostTable) -> FleetLoad:
    """Redis CPU and operations of ``workers`` workers configured as ``cfg``, on one server."""
    pages = 0.0 if cfg.drained else cfg.pages_per_s
    return load_of(fleet_flows(cfg, workers, costs), costs, workers, pages)


def saturation_workers(
    cfg: WorkerConfig, costs: CostTable, utilisation: float = 1.0, limit: int = 10_000_000
) -> int | None:
    """The largest fleet whose Redis CPU stays at or below ``utilisation`` of one core.

    None if even one worker exceeds it; ``limit`` if the fleet never gets
    there below it.  CPU grows monotonically with the fleet (every term is
    per worker or grows with it), so a bisection finds the edge.
    """
    if not utilisation > 0:
        raise ValueError(f"utilisation must be > 0, got {utilisation}")
    if predict(cfg, 1, costs).cpu > utilisation:
        return None
    if predict(cfg, limit, costs).cpu <= utilisation:
        return limit
    low, high = 1, limit
    while high - low > 1:
        mid = (low + high) // 2
        if predict(cfg, mid, costs).cpu <= utilisation:
            low = mid
        else:
            high = mid
    return low


def imbalance(masters: int, partitions: int) -> float:
    """Expected busiest master's share of partitions over the mean's.

    Partition ``p``'s keys hash (CRC16 of ``{prefix:p}``) to one of 16,384
    slots, spread evenly over the masters, so a master's partition count is
    about binomial(M, 1/masters); the largest of ``masters`` such counts is
    about ``mean + sqrt(2 ln masters) * sd``.  Equal work per partition is
    assumed: Zipf-sized sites make it worse, not better.
    """
    if masters < 1 or partitions < 1:
        raise ValueError("masters and partitions must be >= 1")
    if masters == 1:
        return 1.0
    if masters >= partitions:
        return float(masters)  # some master holds nothing; the busiest holds >= 1 of M/masters<1
    mean = partitions / masters
    sd = math.sqrt(partitions * (1 / masters) * (1 - 1 / masters))
    return 1 + math.sqrt(2 * math.log(masters)) * sd / mean


def max_masters(partitions: int, max_imbalance: float = 1.25) -> int:
    """The most masters ``partitions`` spread over with the busiest within ``max_imbalance``."""
    best = 1
    for masters in range(2, partitions + 1):
        if imbalance(masters, partitions) > max_imbalance:
            break
        best = masters
    return best


def hot_key(flow: Flow) -> str | None:
    """The fleet-wide key a flow's commands hit, or None if they spread over a cluster.

    Partition keys (``{prefix:p}:*``) and per-node keys (ready sets,
    telemetry) spread over masters by hash slot; ``TIME`` has no key.  The
    others each live on the one master of their key's slot, whatever the
    number of masters.
    """
    kind, category = flow.kind, flow.category
    if kind == "getrange" or kind == "get_table":
        return "table"
    if kind in ("zadd", "zrangebyscore"):
        return "heartbeats"
    if kind == "hgetall" and category == "registry":
        return "nodes"
    if kind == "bump" or (kind == "get" and category in ("census", "rebalance")):
        return "finished"
    if category == "reaper" and kind in ("set_nx", "get", "del"):
        return "reaper-lock"
    if category == "rebalance" and kind == "set_nx":
        return "rebalance-lock"
    if category == "placement":
        return "placement"
    return None


@dataclass(frozen=True)
class ClusterPlan:
    """How many Redis Cluster masters a fleet needs, and why."""

    workers: int
    masters: int | None
    #: Total CPU (cores) of the fleet's Redis work.
    cpu: float
    #: CPU of commands on fleet-wide keys (table, heartbeats, ``finished``,
    #: locks): it stays on a few masters whatever their number.
    hot_cpu: float
    #: Busiest master's CPU with ``masters`` masters (None if infeasible).
    busiest_cpu: float | None
    #: Partition imbalance factor at ``masters``.
    imbalance: float | None
    reason: str


def cluster_plan(
    cfg: WorkerConfig,
    workers: int,
    costs: CostTable,
    *,
    target_utilisation: float = 0.5,
    max_masters_tried: int = 1024,
) -> ClusterPlan:
    """The fewest masters whose busiest stays under ``target_utilisation`` of a core.

    Partition keys spread over masters by hash slot (with the
    :func:`imbalance` of M partitions over them); the commands on fleet-wide
    keys do not: the busiest such key (the ``finished`` counter every flush
    bumps, the table every worker polls ten times a second, the heartbeats)
    stays on one master, conservatively assumed to be the busiest one too.
    In cluster mode the census counts one partition per script, which this
    prediction includes.
    """
    ccfg = replace(cfg, cluster=True)
    flows = fleet_flows(ccfg, workers, costs)
    load = load_of(flows, costs, workers, cfg.pages_per_s)
    hot_by_key: dict[str, float] = {}
    spread = 0.0
    for f in flows:
        us = f.cpu_us(costs) / 1e6 * costs.live_factor
        key = hot_key(f)
        if key is None:
            spread += us
        else:
            hot_by_key[key] = hot_by_key.get(key, 0.0) + us
    hot = max(hot_by_key.values(), default=0.0)
    idle = costs.idle_us_per_s / 1e6
    if hot + idle > target_utilisation:
        return ClusterPlan(
            workers, None, load.cpu, hot, None, None,
            f"the busiest fleet-wide key alone needs {hot:.2f} cores: more masters do not help",
        )  # fmt: skip
    for masters in range(1, min(max_masters_tried, cfg.partitions) + 1):
        factor = imbalance(masters, cfg.partitions)
        busiest = spread / masters * factor + hot + idle
        if busiest <= target_utilisation:
            return ClusterPlan(
                workers, masters, load.cpu, hot, busiest, factor,
                f"{masters} master(s): busiest at {busiest:.0%} of a core "
                f"(imbalance x{factor:.2f} of {cfg.partitions} partitions)",
            )  # fmt: skip
    return ClusterPlan(
        workers,
        None,
        load.cpu,
        hot,
        None,
        None,
        f"{cfg.partitions} partitions cannot spread the load evenly enough: raise "
        "BANKER_REDIS_PARTITIONS",
    )


#: Measured on the machine the docs' tables come from (2 CPUs, redis 6.2.14,
#: ``python benchmarks/fleet_model.py --quick``; see docs/reference/fleet_size.rst).
#: ``live_factor``: the largest measured/predicted CPU ratio of that run's check.
DEFAULT_COSTS = CostTable(
    ops={
        "ack": OpCost(6.216, 3.5252),
        "bump": OpCost(6.571, 0.0),
        "count": OpCost(3.582, 2.7652),
        "del": OpCost(0.515, 0.0),
        "enqueue_dup": OpCost(4.65, 0.0),
        "enqueue_new": OpCost(13.257, 0.0),
        "expire": OpCost(0.265, 0.0),
        "get": OpCost(0.296, 0.0),
        "get_table": OpCost(0.0, 0.0019),
        "getrange": OpCost(0.618, 0.0),
        "hgetall": OpCost(0.0, 0.3346),
        "pop": OpCost(7.406, 7.4403),
        "pop_empty": OpCost(5.37, 0.0),
        "reap": OpCost(6.506, 0.0),
        "renew": OpCost(2.307, 4.0182),
        "sadd": OpCost(0.396, 0.0),
        "set": OpCost(0.947, 0.0103),
        "set_nx": OpCost(1.056, 0.0),
        "spop": OpCost(0.127, 0.0),
        "time": OpCost(0.278, 0.0),
        "zadd": OpCost(1.985, 0.0),
        "zrangebyscore": OpCost(0.413, 0.2831),
    },
    per_command_us=3.114,
    per_round_trip_us=16.395,
    idle_us_per_s=1198.3,
    live_factor=1.92,
    source="redis 6.2.14 on 2 CPUs (x86_64); python benchmarks/fleet_model.py --quick",
)
