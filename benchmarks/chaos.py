"""A chaos soak: a fleet of real workers crawls the farm while a seeded schedule injects faults.

Why
    Each fault the distributed frontier claims to survive has its own test in
    ``tests/test_redis_scheduler.py``, one fault per crawl.  Production sees
    them mixed, again and again, one landing while the last is still being
    cleaned up: a worker killed while another's partitions are being handed
    over, Redis restarted while leases of a dead worker wait for the reaper.
    This benchmark runs that: a fleet of 3 (``--quick``) or 4 worker
    processes crawls one farm to completion through one ``redis-server``
    while faults are injected every few seconds, then checks that every page
    was fetched, that duplicates stay within what the faults can explain,
    and that politeness held throughout.

What runs
    * The web farm (``scrapy_banker.testing.farm``, its own process),
      ``--hosts`` hosts, ``--latency-ms`` per request.
    * One ``redis-server`` (``scrapy_banker.testing.redis_server``) with
      ``appendonly yes`` and ``appendfsync always``.  ``always`` because the
      soak asks whether the *frontier* loses work, and that question is only
      meaningful against a server for which "acknowledged" means "on disk":
      with ``everysec`` a SIGKILL of the server normally loses nothing either
      (the written AOF stays in the page cache), but Redis may postpone the
      write itself by up to 2 s while an fsync lags (the delayed-fsync rule),
      and a reply sent before its write can then vanish -- a loss Redis
      documents, not one of the frontier.  (Pick ``--appendfsync everysec``
      to measure that configuration.)
    * ``--workers`` real crawler processes (``scrapy_banker.testing.fleet``
      through ``_fleet.Fleet``, as in ``benchmarks/distributed.py``: one
      ``CrawlerProcess`` each, ``BankerRedisScheduler`` through the add-on, Twisted's epoll
      reactor, the plain farm spider seeded with every host root, seeds
      deduplicated fleet-wide).  Short timers, so that faults resolve in
      seconds: ``BANKER_REDIS_LEASE_TTL`` 8 s, ``BANKER_REDIS_NODE_TIMEOUT``
      6 s, heartbeat and reaper 1 s.  The lease TTL outlives every Redis
      outage of the schedule (at most ~4 s), so a Redis fault alone must
      cause no duplicate.  Every worker also loads ``_crawler.FetchLog``,
      which appends each request
      it hands to its downloader, with the time, to a file -- used only to
      *attribute* what the farm measured, never to measure it.
    * A seeded schedule (``--seed``): after a warm-up, rounds of the six
      fault kinds in a shuffled order, a random gap (6-12 s) apart:

      - ``worker_kill``: SIGKILL of a random running worker, restarted
        2-6 s later as a new node (``w<slot>.<generation>``, as a
        replacement pod would be);
      - ``redis_kill``: SIGKILL of ``redis-server``, restarted on the same
        port and directory (AOF replayed) 1-3 s later;
      - ``client_pause``: ``CLIENT PAUSE <1.5-3 s> ALL``;
      - ``debug_sleep``: ``DEBUG SLEEP <1.5-3 s>`` (the server blocks);
      - ``zombie``: SIGSTOP of a running worker for longer than both the
        lease TTL and the node timeout (its leases expire, its partitions
        move to the others), then SIGCONT: it wakes up holding requests
        and connections of partitions a new owner now has, and must neither
        ack nor fetch them;
      - ``malformed_payload``: a garbage payload planted into the frontier
        through the public API (``RedisFrontier.enqueue`` on a random
        partition; no dependency on the key layout).  It must end in the
        dead-letter list with its reason, never crash a worker.

      Faults stop after ``--duration`` s (or when the crawl is over); the
      fleet then finishes the crawl on its own (stopped workers resumed,
      killed ones restarted).

How it is measured
    From the farm's own bookkeeping -- what the server actually served:

    * ``lost``: pages of the site (a BFS of its links from the host roots,
      :meth:`FarmModel.expected_urls`) the farm never served.
    * ``duplicates``: fetches beyond the first of a URL.
    * ``max_concurrent_per_host``: the most requests one host ever had in
      flight (the farm counts a request from its receipt until its response
      is written), next to ``per_host_limit``, the configured
      ``CONCURRENT_REQUESTS_PER_DOMAIN``, which the banker promises
      fleet-wide (one owner per host's partition).  The parent samples the
      farm every 0.2 s, so ``politeness_violations`` gives each host that
      went over the limit with the time window it happened in and the
      workers (from their fetch logs) that fetched it then.
    * ``duplicates_bound``: the sum, over the ``worker_kill`` and ``zombie``
      events, of the requests the victim held un-acked at that moment: the
      leases in the partitions the table gives it, read with the operator's
      read model (:func:`scrapy_banker.ops.fleet_view.read_fleet`, node
      ``leased``) right after the SIGKILL / SIGSTOP, when nothing can have
      changed them yet.  Those are exactly the requests that are delivered
      again (each at most once per event): the ones in flight at the farm,
      the ones whose response arrived but whose ack was not flushed yet, and
      buffered ones (which cause no duplicate), so it bounds the duplicates
      the events may cause.  If Redis cannot be read at that moment (a fault
      overlapping), the bound falls back to what a worker can hold at most
      (``CONCURRENT_REQUESTS`` + ``BANKER_REDIS_BUFFER``) and the event says
      ``bound_estimated``.
    * ``duplicates_by_cause``: each duplicate fetch attributed with the
      workers' fetch logs (:func:`attribute_duplicates`): ``worker_kill`` /
      ``zombie_redelivery`` (an earlier fetch of the URL by the victim shortly
      before the kill / stop: a lease it held), ``zombie_fetched_after_resume``
      (a zombie fetched, within 5 s of its SIGCONT, a URL another worker
      fetched too: the bug the zombie fault hunts), ``redis_outage`` (first
      fetched around a Redis fault: un-acked while Redis was away, and the
      worker declared dead before it reconnected -- not counted in
      ``duplicates_bound``, which covers kills and zombies only), else
      ``unexplained``
      (listed with times and workers in ``unexplained_duplicates``).  Each
      kill / zombie event says how many duplicates it caused
      (``duplicates_caused``, next to its ``held``), and
      ``zombie_stale_fetch_delay_s`` how soon after SIGCONT the zombies'
      foreign fetches happened.
    * ``dead_lettered``: the crawl's dead letters read through the read model
      (:func:`scrapy_banker.ops.fleet_deadletters.list_dead_letters`): ``count``,
      ``reasons`` (count per reason), ``planted`` / ``planted_found`` (the
      ids :meth:`RedisFrontier.enqueue` returned for the garbage payloads,
      and how many of them are dead letters) and ``letters`` (the first few,
      with partition, reason and URL); ``lost_dead_lettered`` says how many
      lost pages are dead letters (e.g. after ``BANKER_REDIS_MAX_DELIVERIES``
      expired leases).
    * ``faults_injected``: count per kind; ``events``: every injected fault
      with its time (s from the fleet's start), target and bound.

    Targets (reported, and summed up in ``targets_met``; ``checks`` has each
    one): ``lost == 0``, ``duplicates <= duplicates_bound``,
    ``max_concurrent_per_host <= per_host_limit``, every planted payload
    dead-lettered with a ``malformed`` reason, no
    ``zombie_fetched_after_resume`` duplicate, no worker exiting non-zero
    unless it was killed, and the crawl finishing within ``--timeout``.

Usage::

    python benchmarks/chaos.py --quick        # 3 workers, ~3 minutes
    python benchmarks/chaos.py                # 4 workers, ~15 minutes
    python benchmarks/chaos.py --tiny         # smoke test, < 1 minute

``--seed`` (fault schedule and farm layout), ``--workers``, ``--duration``
(seconds of faults), ``--hosts``, ``--pages``, ``--latency-ms``,
``--concurrent``, ``--appendfsync``, ``--timeout`` override the mode;
``--kinds`` injects only the listed fault kinds (at their places in the
seeded schedule), e.g. ``--tiny --seed 3 --kinds zombie`` for one zombie;
``--keep`` keeps the workers' logs, stats and fetch logs; ``--set KEY=JSON``
adds a worker setting (repeatable).  Progress goes to
stderr; the last stdout line is the JSON object (``targets_met`` false is
reported, never an exit status).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
import _fleet
import _harness
import redis
from _common import log

from scrapy_banker.ops.fleet_deadletters import list_dead_letters
from scrapy_banker.ops.fleet_view import read_fleet
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.redis_server import RedisServer

#: The workers' BANKER_REDIS_PREFIX (the plain farm spider is called "fleet").
PREFIX = "chaos:fleet"
PER_HOST = 2
LEASE_TTL_S = 8.0
NODE_TIMEOUT_S = 6.0
HEARTBEAT_S = 1.0
REAP_INTERVAL_S = 1.0
KINDS: tuple[str, ...] = (
    "worker_kill", "redis_kill", "client_pause", "debug_sleep", "zombie", "malformed_payload",
)  # fmt: skip
#: Farm samples (s): politeness windows and progress.
SAMPLE_S = 0.2
#: How long after SIGCONT a zombie's fetch of a URL someone else fetched is
#: blamed on the zombie (it must have reloaded its table by then).
ZOMBIE_WINDOW_S = 5.0
#: A fetch up to this long (s) after a Redis fault ended may be redelivered
#: because of it: workers reconnect with a jittered, doubling backoff.
OUTAGE_AFTER_S = 10.0
#: A request a victim fetched this long (s) before its kill / SIGSTOP may
#: still have been un-acked then (acks are flushed within a second; more
#: while Redis is away).
HELD_WINDOW_S = 10.0


@dataclass(frozen=True)
class Mode:
    """Size of one benchmark mode."""

    workers: int
    hosts: int
    total_pages: int
    latency_ms: float
    duration_s: float
    timeout_s: float
    concurrent: int = 8
    warmup_s: float = 8.0
    gap_s: tuple[float, float] = (6.0, 12.0)
    zipf_s: float = 0.3


QUICK = Mode(workers=3, hosts=240, total_pages=15000, latency_ms=200.0, duration_s=150.0,
             timeout_s=420.0)  # fmt: skip
FULL = Mode(workers=4, hosts=600, total_pages=90000, latency_ms=200.0, duration_s=780.0,
            timeout_s=1500.0)  # fmt: skip
TINY = Mode(workers=3, hosts=40, total_pages=3000, latency_ms=150.0, duration_s=25.0,
            timeout_s=120.0, warmup_s=4.0, gap_s=(3.0, 5.0))  # fmt: skip


def worker_settings(
    redis_url: str, node: str, fetch_log: Path, concurrent: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """One worker's Scrapy settings (a fresh node name per incarnation)."""
    settings = {
        "TWISTED_REACTOR": _common.EPOLL,
        **_common.BANKER_REDIS,
        "CHAOS_FETCH_LOG": str(fetch_log),
        "REDIS_URL": redis_url,
        "REDIS_PARAMS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        "BANKER_REDIS_PREFIX": PREFIX,
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_LEASE_TTL": LEASE_TTL_S,
        "BANKER_REDIS_NODE_TIMEOUT": NODE_TIMEOUT_S,
        "BANKER_REDIS_HEARTBEAT": HEARTBEAT_S,
        "BANKER_REDIS_REAP_INTERVAL": REAP_INTERVAL_S,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 2.0,
        "BANKER_REDIS_RETRIES": 2,
        "BANKER_REDIS_BACKOFF_CAP": 0.5,
        "CONCURRENT_REQUESTS": concurrent,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "LOG_LEVEL": "INFO",
        **extra,
    }
    return _harness.with_extensions(settings, ["_crawler.FetchLog"])


@dataclass
class Incarnation:
    """One worker process: slot ``slot``'s ``gen``-th start."""

    slot: int
    gen: int
    worker: Any  # scrapy_banker.testing.fleet.FleetWorker
    fetch_log: Path
    started: float
    killed_at: float | None = None
    stopped_at: float | None = None
    #: (SIGSTOP, SIGCONT) times of every zombie episode.
    stops: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"w{self.slot}.{self.gen}"

    @property
    def running(self) -> bool:
        return self.worker.proc.poll() is None and self.stopped_at is None


@dataclass
class Event:
    """One injected fault."""

    kind: str
    t: float
    target: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    bound: int = 0
    bound_estimated: bool = False
    #: Wall-clock time of the fault (with the victim, keys :attr:`Blame.per_event`).
    wall: float = 0.0
    #: Seconds Redis is away (Redis faults only).
    outage_s: float = 0.0


class Chaos:
    """The fleet, the servers and the fault schedule of one soak."""

    def __init__(
        self,
        mode: Mode,
        rng: random.Random,
        farm: Any,
        server: Any,
        workdir: Path,
        partitions: int = 1024,
    ) -> None:
        self.mode = mode
        self.rng = rng
        self.farm = farm
        self.server = server
        self.workdir = workdir
        self.fleet = _fleet.Fleet(workdir, clock=time.time)
        self.partitions = partitions
        self.client = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=2)
        self.frontier = RedisFrontier(self.client, prefix=PREFIX, partitions=partitions)
        self.t0 = time.time()
        self.slots: list[Incarnation] = []
        self.retired: list[Incarnation] = []
        self.events: list[Event] = []
        #: (partition, id) of every planted payload (ids are per partition).
        self.planted: set[tuple[int, str]] = set()
        self.seeds = farm.start_urls()
        self._queue: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.restarts_pending = 0
        self.stops_pending = 0
        #: Worst case a worker holds un-acked: in flight plus its local buffer.
        self.max_held = mode.concurrent + 2 * mode.concurrent
        self.settings_extra: dict[str, Any] = {}

    # -- time and events -------------------------------------------------------------------

    def now(self) -> float:
        return time.time() - self.t0

    def at(self, delay: float, what: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (time.time() + delay, next(self._seq), what, action))

    def run_due(self) -> None:
        while self._queue and self._queue[0][0] <= time.time():
            _, _, what, action = heapq.heappop(self._queue)
            try:
                action()
            except Exception as exc:  # a fault action must never end the soak
                log(f"!! {what} failed at t={self.now():.1f}: {exc!r}")

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    # -- workers ---------------------------------------------------------------------------

    def spawn(self, slot: int, gen: int) -> Incarnation:
        name = f"w{slot}.{gen}"
        fetch_log = self.workdir / f"{name}.fetches"
        settings = worker_settings(
            self.server.url, name, fetch_log, self.mode.concurrent, self.settings_extra
        )
        worker = self.fleet.start(name, settings, seeds=self.seeds)
        return Incarnation(slot, gen, worker, fetch_log, time.time())

    def start_fleet(self) -> None:
        self.t0 = time.time()
        self.slots = [self.spawn(i, 0) for i in range(self.mode.workers)]

    def all_exited(self) -> bool:
        return bool(self.fleet.all_exited())

    def _running(self) -> list[Incarnation]:
        return [inc for inc in self.slots if inc.running]

    def _held(self, node: str) -> tuple[int, bool]:
        """Leases in the partitions ``node`` owns (the read model), or the worst case."""
        try:
            view = read_fleet(self.client, self.frontier.keyspace, node_timeout_s=NODE_TIMEOUT_S)
        except Exception as exc:
            log(f"   (could not read the fleet for {node}: {exc!r}; bound estimated)")
            return self.max_held, True
        for n in view.nodes:
            if n.name == node:
                return int(n.leased), False
        return 0, False

    # -- faults ----------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        getattr(self, f"_fault_{kind}")()

    def _record(self, event: Event) -> None:
        self.events.append(event)
        extra = f" {event.detail}" if event.detail else ""
        bound = f", held {event.bound}" if event.kind in ("worker_kill", "zombie") else ""
        log(f"t={event.t:6.1f} fault {event.kind} {event.target or ''}{bound}{extra}")

    def _victim(self, kind: str, running_at_least: int) -> Incarnation | None:
        """A random running worker, if at least that many run."""
        running = self._running()
        if len(running) < running_at_least:
            log(f"t={self.now():6.1f} {kind} skipped: fewer than {running_at_least} running")
            return None
        victim: Incarnation = self.rng.choice(running)
        return victim

    def _fault_worker_kill(self) -> None:
        victim = self._victim("worker_kill", 1)
        if victim is None:
            return
        self.fleet.kill(victim.name)
        victim.killed_at = time.time()
        held, estimated = self._held(victim.name)
        pause = round(self.rng.uniform(2.0, 6.0), 2)
        event = Event("worker_kill", self.now(), victim.name, {"restart_after_s": pause},
                      held, estimated, victim.killed_at)  # fmt: skip
        self._record(event)
        self.restarts_pending += 1

        def restart() -> None:
            self.restarts_pending -= 1
            self.retired.append(victim)
            new = self.spawn(victim.slot, victim.gen + 1)
            self.slots[victim.slot] = new
            log(f"t={self.now():6.1f} restarted slot {victim.slot} as {new.name}")

        self.at(pause, f"restart of slot {victim.slot}", restart)

    def _fault_zombie(self) -> None:
        victim = self._victim("zombie", 2)
        if victim is None:
            return
        self.fleet.freeze(victim.name)
        victim.stopped_at = time.time()
        held, estimated = self._held(victim.name)
        stop_s = round(max(LEASE_TTL_S, NODE_TIMEOUT_S) + self.rng.uniform(2.0, 4.0), 2)
        event = Event(
            "zombie", self.now(), victim.name, {"stopped_s": stop_s}, held, estimated,
            victim.stopped_at,
        )  # fmt: skip
        self._record(event)
        self.stops_pending += 1

        def resume() -> None:
            self.stops_pending -= 1
            stopped = victim.stopped_at
            victim.stopped_at = None
            victim.stops.append((stopped or time.time(), time.time()))
            self.fleet.thaw(victim.name)
            log(f"t={self.now():6.1f} resumed zombie {victim.name}")

        self.at(stop_s, f"SIGCONT of {victim.name}", resume)

    def _fault_redis_kill(self) -> None:
        down = round(self.rng.uniform(1.0, 3.0), 2)
        self.server.kill()
        self._record(Event("redis_kill", self.now(), "redis-server", {"down_s": down},
                           wall=time.time(), outage_s=down))  # fmt: skip

        def start() -> None:
            t = time.time()
            self.server.start()
            log(f"t={self.now():6.1f} redis-server back (AOF replayed in "
                 f"{time.time() - t:.2f} s)")  # fmt: skip

        self.at(down, "redis-server restart", start)

    def _fault_client_pause(self) -> None:
        ms = int(self.rng.uniform(1500, 3000))
        self.client.execute_command("CLIENT", "PAUSE", ms, "ALL")  # type: ignore[no-untyped-call]
        self._record(Event("client_pause", self.now(), "redis-server", {"pause_ms": ms},
                           wall=time.time(), outage_s=ms / 1000))  # fmt: skip

    def _fault_debug_sleep(self) -> None:
        seconds = round(self.rng.uniform(1.5, 3.0), 2)
        url = self.server.url

        def sleep() -> None:
            client = redis.Redis.from_url(url, socket_timeout=30)
            try:
                client.execute_command("DEBUG", "SLEEP", seconds)  # type: ignore[no-untyped-call]
            finally:
                client.close()

        threading.Thread(target=sleep, name="debug-sleep", daemon=True).start()
        self._record(Event("debug_sleep", self.now(), "redis-server", {"sleep_s": seconds},
                           wall=time.time(), outage_s=seconds))  # fmt: skip

    def _fault_malformed_payload(self) -> None:
        n = len(self.planted)
        partition = self.rng.randrange(self.partitions)
        payload = f"\x80\x04garbage-{n} {{not json, not a request"
        request_id = self.frontier.enqueue(partition, f"chaos-malformed-{n}", payload, priority=5)
        if request_id is None:
            raise RuntimeError("the planted payload was refused as a duplicate")
        self.planted.add((partition, request_id))
        self._record(Event("malformed_payload", self.now(), f"partition {partition}",
                           {"id": request_id}))  # fmt: skip

    def finish_faults(self) -> None:
        """Run every pending restart and SIGCONT now (the end of the soak, or a timeout)."""
        while self._queue:
            _, _, what, action = heapq.heappop(self._queue)
            try:
                action()
            except Exception as exc:
                log(f"!! {what} failed: {exc!r}")


def schedule(rng: random.Random, mode: Mode) -> list[tuple[float, str]]:
    """(seconds after the fleet's start, kind): shuffled rounds of every kind."""
    out: list[tuple[float, str]] = []
    t = mode.warmup_s
    while True:
        kinds = list(KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if t > mode.duration_s:
                return out
            out.append((round(t, 2), kind))
            t += rng.uniform(*mode.gap_s)


def _read_fetch_logs(incarnations: Sequence[Incarnation]) -> dict[str, list[tuple[float, str]]]:
    """url -> [(time, worker)] from every worker's ``_crawler.FetchLog``, in time order."""
    out: dict[str, list[tuple[float, str]]] = {}
    for inc in incarnations:
        try:
            text = inc.fetch_log.read_text("utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            t, _, url = line.partition(" ")
            try:
                out.setdefault(url, []).append((float(t), inc.name))
            except ValueError:
                continue  # a line cut by the SIGKILL
    for fetches in out.values():
        fetches.sort()
    return out


@dataclass
class Blame:
    """What :func:`attribute_duplicates` found."""

    #: Duplicate fetches per cause (module docstring).
    causes: Counter[str] = field(default_factory=Counter)
    #: Duplicates per event: (victim, wall time of its SIGKILL / SIGSTOP).
    per_event: Counter[tuple[str, float]] = field(default_factory=Counter)
    #: Seconds from SIGCONT to each fetch blamed on a resumed zombie.
    zombie_delays: list[float] = field(default_factory=list)
    unexplained: list[dict[str, Any]] = field(default_factory=list)
    #: URLs whose logged fetches differ in number from the farm's count.
    mismatches: int = 0


def _resumed(inc: Incarnation | None, t: float) -> tuple[float, float] | None:
    """The (SIGSTOP, SIGCONT) episode of ``inc`` whose resume window holds ``t``."""
    if inc is None:
        return None
    for stop, cont in inc.stops:
        if cont is not None and cont <= t <= cont + ZOMBIE_WINDOW_S:
            return stop, cont
    return None


def attribute_duplicates(
    fetches: dict[str, int],
    logs: dict[str, list[tuple[float, str]]],
    incarnations: Sequence[Incarnation],
    outages: Sequence[tuple[str, float, float]] = (),
) -> Blame:
    """Blame each duplicate fetch on the fault that explains it (see the module docstring).

    ``fetches`` is the farm's count per URL (the truth), ``logs`` the
    workers' fetch logs (who fetched when).  For the ``i``-th fetch of a URL
    (``i >= 1``), the first that applies: an earlier fetch was by a worker
    killed / stopped at most :data:`HELD_WINDOW_S` later (``worker_kill`` /
    ``zombie_redelivery``, the latter also when the zombie itself fetches it
    again after its SIGCONT); the fetcher is a zombie within
    :data:`ZOMBIE_WINDOW_S` of its SIGCONT and another worker fetched the
    URL before (``zombie_fetched_after_resume``); an earlier fetch was a
    resumed zombie's (``zombie_fetched_after_resume`` too: it fetched first,
    the new owner again); an earlier fetch happened from 2 s before a Redis
    fault in ``outages`` ((kind, wall start, seconds away)) to
    :data:`OUTAGE_AFTER_S` after its end, the fetch itself after its start
    (``redis_outage``); else ``unexplained``.
    """
    by_name = {inc.name: inc for inc in incarnations}
    blame = Blame()
    for url, count in fetches.items():
        if count < 2:
            continue
        logged = logs.get(url, [])
        if len(logged) != count:
            blame.mismatches += 1
        extra = count - 1
        if len(logged) < 2:
            blame.causes["unattributed"] += extra
            continue
        for i in range(1, min(len(logged), extra + 1)):
            t, who = logged[i]
            earlier = logged[:i]
            cause: str | None = None
            event: tuple[str, float] | None = None
            for te, we in earlier:
                inc = by_name.get(we)
                if cause is not None or inc is None:
                    continue
                killed = inc.killed_at
                if we != who and killed is not None and killed - HELD_WINDOW_S <= te <= killed:
                    cause, event = "worker_kill", (we, killed)
                for stop, cont in inc.stops:
                    # A zombie may get its own expired lease back once it rejoined.
                    again = we != who or (cont is not None and t >= cont)
                    if cause is None and again and stop - HELD_WINDOW_S <= te <= stop:
                        cause, event = "zombie_redelivery", (we, stop)
            episode = _resumed(by_name.get(who), t)
            if cause is None and episode is not None and any(we != who for _, we in earlier):
                cause, event = "zombie_fetched_after_resume", (who, episode[0])
                blame.zombie_delays.append(t - episode[1])
            for te, we in earlier:
                episode = _resumed(by_name.get(we), te)
                if cause is None and episode is not None:
                    cause, event = "zombie_fetched_after_resume", (we, episode[0])
                    blame.zombie_delays.append(te - episode[1])
            for te, _ in earlier:
                for kind, start, away in outages:
                    late = start + away + OUTAGE_AFTER_S
                    if cause is None and start - 2.0 <= te <= late and t > start:
                        cause, event = "redis_outage", (kind, start)
            if cause is None:
                cause = "unexplained"
                if len(blame.unexplained) < 20:
                    blame.unexplained.append(
                        {"url": url, "fetches": [[round(x, 3), w] for x, w in logged]}
                    )
            blame.causes[cause] += 1
            if event is not None:
                blame.per_event[event] += 1
    return blame


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="3 workers, ~3 minutes", tiny="smoke test, < 1 minute")
    parser.add_argument("--seed", type=int, default=1, help="fault schedule and farm seed")
    parser.add_argument("--workers", type=int, default=None, help="fleet size (>= 2)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of faults")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts")
    parser.add_argument("--pages", type=int, default=None, help="farm content pages")
    parser.add_argument("--latency-ms", type=float, default=None, help="farm latency")
    parser.add_argument("--concurrent", type=int, default=None, help="CONCURRENT_REQUESTS")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before the crawl is declared stuck")  # fmt: skip
    parser.add_argument("--appendfsync", choices=("always", "everysec"), default="always",
                        help="redis-server's AOF fsync policy")  # fmt: skip
    _harness.add_settings(parser, "extra setting for every worker, e.g. BANKER_REDIS_BUFFER=8")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the workers' logs, stats and fetch logs (path on stderr)",
    )
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated fault kinds to inject (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 2:
        parser.error("--workers must be >= 2")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--kinds: choose among {', '.join(KINDS)}")
    args.kinds = tuple(kinds)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One soak; returns the JSON object."""
    mode = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        workers="workers", duration_s="duration", hosts="hosts", total_pages="pages",
        latency_ms="latency_ms", concurrent="concurrent", timeout_s="timeout",
    )  # fmt: skip
    _harness.workers_import_benchmarks()  # the workers load _crawler.FetchLog
    rng = random.Random(args.seed)
    plan = [(t, k) for t, k in schedule(rng, mode) if k in args.kinds]
    config = FarmConfig(seed=args.seed, hosts=mode.hosts, total_pages=mode.total_pages,
                        zipf_s=mode.zipf_s, latency_ms=mode.latency_ms)  # fmt: skip
    started = time.time()
    with ExitStack() as stack:
        farm = stack.enter_context(WebFarm(config))
        server = stack.enter_context(RedisServer(extra_args=[
            "--appendonly", "yes", "--appendfsync", args.appendfsync,
        ]))  # fmt: skip
        if args.keep:
            workdir = Path(tempfile.mkdtemp(prefix="chaos-"))
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        expected = farm.expected_urls()
        log(
            f"chaos soak, seed {args.seed}: {mode.workers} workers x {mode.concurrent} "
            f"concurrent ({PER_HOST} per host), farm {config.hosts} hosts / {len(expected):,} "
            f"pages at {config.latency_ms:g} ms; {len(plan)} faults over {mode.duration_s:g} s "
            f"({dict(Counter(k for _, k in plan))}); lease TTL {LEASE_TTL_S:g} s, node timeout "
            f"{NODE_TIMEOUT_S:g} s; redis AOF appendfsync {args.appendfsync}; logs in {workdir}"
        )
        farm.reset()
        chaos = Chaos(mode, rng, farm, server, workdir)
        chaos.settings_extra = _harness.settings(args.set)
        sampler = _fleet.FarmWatch(farm, time.time(), interval=SAMPLE_S, limit=PER_HOST)
        chaos.start_fleet()
        sampler.start_thread()
        timed_out = False
        next_report = 10.0
        plan_iter = iter(plan)
        upcoming = next(plan_iter, None)
        faults_over_at: float | None = None
        while True:
            now = chaos.now()
            chaos.run_due()
            crawl_over = chaos.all_exited() and not chaos.pending
            if upcoming is not None and crawl_over:
                log(f"t={now:6.1f} the crawl is over: no more faults")
                upcoming = None
            if upcoming is not None and now >= upcoming[0]:
                try:
                    chaos.inject(upcoming[1])
                except Exception as exc:
                    log(f"!! fault {upcoming[1]} failed at t={now:.1f}: {exc!r}")
                upcoming = next(plan_iter, None)
            if upcoming is None and faults_over_at is None:
                # Pending restarts and SIGCONTs still run on time: a zombie
                # resumed early would not have outlived its leases.
                faults_over_at = now
                log(f"t={now:6.1f} faults over; the fleet finishes the crawl")
            if faults_over_at is not None and chaos.all_exited() and not chaos.pending:
                break
            if now > mode.timeout_s:
                timed_out = True
                log(f"!! t={now:.1f}: the crawl did not finish within {mode.timeout_s:g} s")
                break
            if now >= next_report:
                next_report += 10.0
                running = sum(1 for inc in chaos.slots if inc.running)
                log(f"t={now:6.1f} {sampler.requests:,}/{len(expected):,} pages, "
                     f"{running}/{mode.workers} workers running, {len(chaos.events)} faults, "
                     f"max/host {sampler.max_inflight}")  # fmt: skip
            time.sleep(0.05)
        wall = chaos.now()
        sampler.stop_thread()
        chaos.finish_faults()
        chaos.fleet.stop_all()
        incarnations = [*chaos.retired, *chaos.slots]
        served = _fleet.served(farm, expected)
        fetches = served.fetches
        lost_urls = served.lost
        duplicates = served.duplicates
        max_per_host = served.max_per_host
        logs = _read_fetch_logs(incarnations)
        outages = [(e.kind, e.wall, e.outage_s) for e in chaos.events if e.outage_s]
        blame = attribute_duplicates(fetches, logs, incarnations, outages)
        try:
            letters = list_dead_letters(chaos.client, chaos.frontier.keyspace)
        except Exception as exc:
            log(f"!! could not read the dead letters: {exc!r}")
            letters = []
        reasons = Counter(d.reason for d in letters)
        dead_urls = {d.payload.url for d in letters if d.payload.url}
        planted_found = [d for d in letters if (d.partition, d.id) in chaos.planted]
        planted_ok = len(planted_found) == len(chaos.planted) and all(
            d.reason.startswith("malformed") for d in planted_found
        )
        violations = []
        for host, (seen, before, n) in sorted(sampler.over.items(), key=lambda kv: kv[1][0]):
            window = (before - 1.0, seen + 0.5)
            who = sorted({w for url, fs in logs.items() if f"//{host}:" in url
                          for t, w in fs if window[0] <= t <= window[1]})  # fmt: skip
            violations.append(
                {
                    "host": host,
                    "max": n,
                    "window_s": [round(before - chaos.t0, 2), round(seen - chaos.t0, 2)],
                    "workers": who,
                }
            )
        exits: dict[str, int | None] = {}
        bad_exits: dict[str, int | None] = {}
        for inc in incarnations:
            code = inc.worker.proc.returncode
            exits[inc.name] = code
            if code != 0 and inc.killed_at is None:
                bad_exits[inc.name] = code
        chaos.fleet.log_tails("chaos", bad_exits)
        worker_stats = dict(zip(exits, chaos.fleet.stats(exits), strict=True))
        bound = sum(e.bound for e in chaos.events if e.kind in ("worker_kill", "zombie"))
        faults = Counter(e.kind for e in chaos.events)
        out: dict[str, Any] = {
            "seed": args.seed,
            "mode": _harness.mode(args),
            "workers": mode.workers,
            "concurrent_requests": mode.concurrent,
            "hosts": config.hosts,
            "latency_ms": config.latency_ms,
            "expected_pages": len(expected),
            "pages_served": served.requests,
            "fault_duration_s": mode.duration_s,
            "wall_s": round(wall, 2),
            "total_s": round(time.time() - started, 2),
            "timed_out": timed_out,
            "lease_ttl_s": LEASE_TTL_S,
            "node_timeout_s": NODE_TIMEOUT_S,
            "redis_appendfsync": args.appendfsync,
            "extra_settings": chaos.settings_extra,
            "faults_injected": {k: faults.get(k, 0) for k in KINDS},
            "lost": len(lost_urls),
            "lost_sample": lost_urls[:20],
            "lost_dead_lettered": sum(1 for u in lost_urls if u in dead_urls),
            "duplicates": duplicates,
            "duplicates_bound": bound,
            "duplicates_by_cause": dict(sorted(blame.causes.items())),
            "zombie_stale_fetch_delay_s": [
                round(min(blame.zombie_delays), 3),
                round(max(blame.zombie_delays), 3),
            ]
            if blame.zombie_delays
            else None,
            "unexplained_duplicates": blame.unexplained,
            "fetch_log_mismatches": blame.mismatches,
            "max_concurrent_per_host": max_per_host,
            "per_host_limit": PER_HOST,
            "politeness_violations": violations,
            "dead_lettered": {
                "count": len(letters),
                "reasons": dict(sorted(reasons.items())),
                "planted": len(chaos.planted),
                "planted_found": len(planted_found),
                "letters": [d.to_json() for d in letters[:10]],
            },
            "events": [
                {
                    "t": round(e.t, 2),
                    "kind": e.kind,
                    "target": e.target,
                    **e.detail,
                    **(
                        {
                            "held": e.bound,
                            "bound_estimated": e.bound_estimated,
                            "duplicates_caused": blame.per_event.get((e.target or "", e.wall), 0),
                        }
                        if e.kind in ("worker_kill", "zombie")
                        else {}
                    ),
                    **(
                        {"duplicates_caused": blame.per_event.get((e.kind, e.wall), 0)}
                        if e.outage_s
                        else {}
                    ),
                }
                for e in chaos.events
            ],
            "worker_exit_codes": exits,
            "worker_errors": bad_exits,
            "redelivered": sum(
                int(s.get("banker/redis/redelivered", 0)) for s in worker_stats.values()
            ),
            "malformed_seen_by_workers": sum(
                int(s.get("banker/redis/malformed", 0)) for s in worker_stats.values()
            ),
        }
        checks = {
            "lost": out["lost"] == 0,
            "duplicates": duplicates <= bound,
            "politeness": max_per_host <= PER_HOST,
            "planted_dead_lettered": planted_ok,
            "zombies_fetched_nothing_foreign": not blame.causes["zombie_fetched_after_resume"],
            "workers_exited_cleanly": not bad_exits,
            "finished": not timed_out,
        }
        out["checks"] = checks
        out["targets_met"] = all(checks.values())
        chaos.client.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    out = run(args)
    print(
        f"faults {out['faults_injected']}; lost {out['lost']} of {out['expected_pages']:,}; "
        f"duplicates {out['duplicates']} (bound {out['duplicates_bound']}, by cause "
        f"{out['duplicates_by_cause']}); max per host {out['max_concurrent_per_host']} "
        f"(limit {out['per_host_limit']}); dead letters {out['dead_lettered']['reasons']} "
        f"(planted {out['dead_lettered']['planted_found']}/{out['dead_lettered']['planted']} "
        f"found); {out['wall_s']:.0f} s"
    )
    failed = [name for name, ok in out["checks"].items() if not ok]
    print(f"targets met: {out['targets_met']}" + (f" (missed: {', '.join(failed)})"
                                                  if failed else ""))  # fmt: skip
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
