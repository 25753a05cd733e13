"""A fleet of Scrapy workers on one Redis: scrapy-redis's scheduler vs BankerRedisScheduler.

What is measured
    Fleets of real worker processes (``scrapy_banker.testing.fleet``, one
    ``CrawlerProcess`` each) crawl a local web farm
    (``scrapy_banker.testing.farm``, its own process) through a real
    ``redis-server``: one worker, then each fleet size of the mode (4; the
    full mode adds 8), once with scrapy-redis's shared queue
    (``scrapy_redis.scheduler.Scheduler`` + ``RFPDupeFilter``) and once with
    scrapy-banker's partitioned, leased frontier
    (``scrapy_banker.redis.scheduler.BankerRedisScheduler`` + the add-on).
    Every crawl runs to completion; the farm tells what was fetched.  ``<n>``
    below is a fleet size; ``workers`` in the JSON is the first one (4).

    * ``pages_per_s_<system>_<n>w``: pages the farm served during the run /
      wall time from the first worker's start to the last worker's exit.
      Nothing is subtracted: process start-up and the idle-close delay are
      part of what a user waits for.
    * ``pages_per_s_<system>_<n>w_busy``: the same pages over the "busy"
      span only, which both systems' start-up and idle-close delays do not
      blur: the parent polls the farm's request counter every 0.1 s and the
      span runs from the first sample that saw a request to the last sample
      that saw the counter change (pages served within it / its length).
    * ``max_concurrent_per_host_<system>``: the largest number of requests
      one host ever had in flight (the farm measures it), in the
      ``--workers`` runs.  ``CONCURRENT_REQUESTS_PER_DOMAIN`` (``per_host_limit``)
      is enforced by each worker for itself; scrapy-redis hands any request
      to any worker, so a host can see ``workers x per_host_limit``, while
      the banker gives each host's partition to one worker at a time.
    * ``lost`` / ``duplicates`` (banker, ``--workers`` run) and
      ``lost_scrapy_redis`` / ``duplicates_scrapy_redis``: expected pages (a
      BFS of the farm's links from its start URLs) never fetched, and fetches
      beyond the first of a URL.
    * ``speedup_banker_<n>w_vs_1w``, ``speedup_scrapy_redis_<n>w_vs_1w`` and
      ``speedup_banker_vs_scrapy_redis_<n>w``: ratios of the wall-clock
      pages/s (``*_busy`` variants: of the busy figures).
    * ``concurrency_bound_pages_per_s`` (``_<n>w`` for every fleet size, the
      plain key for ``workers``): the most pages/s the configuration allows,
      ``min(n x CONCURRENT_REQUESTS, hosts x per_host_limit) / latency``.
      ``busy_efficiency_<system>_<n>w`` is the busy pages/s over that bound:
      how much of the concurrency the fleet kept in use while it worked.
    * ``tail_s_<system>_<n>w``: time from 90 % to 100 % of the pages served,
      next to ``tail_work_s_<n>w``, the time those last 10 % take at the
      concurrency bound (a tail much longer than that is one worker
      finishing a backlog while the others idle).
    * ``end_detect_s_<system>_<n>w``: from the last page served to the last
      worker's exit.  Both systems' ``RedisSpider`` waits
      ``MAX_IDLE_TIME_BEFORE_CLOSE`` for new start URLs after its last
      response, so this is at least that (3 s); how fast a fleet of plain
      spiders notices the end is tested in ``tests/test_redis_scheduler.py``.
    * ``wall_ratio_<system>_<n>w_vs_1w``: wall time of the ``n``-worker crawl
      over the 1-worker crawl (more workers must never finish later).
    * ``first_response_s_<system>_<n>w``: from the first worker's start to
      the first page served.

Fairness
    Both systems get the same farm, the same seeds, the same
    ``CONCURRENT_REQUESTS`` (16) and ``CONCURRENT_REQUESTS_PER_DOMAIN`` (2),
    and the same spider: scrapy-redis's ``RedisSpider``
    (``FleetRedisSpider``), whose start URLs the parent pushes to
    ``fleet:start_urls`` as JSON before the workers start.  A plain spider
    would not do: a scrapy-redis worker closes as soon as the shared queue is
    momentarily empty, so with a plain spider the fleet would melt away
    before the crawl ends.  A RedisSpider waits ``MAX_IDLE_TIME_BEFORE_CLOSE``
    (3 s) before closing; the banker's workers additionally wait until the
    whole crawl has been empty for ``BANKER_REDIS_IDLE_BEFORE_CLOSE`` (1 s),
    which overlaps those 3 s.  Only the banker runs enable scrapy-banker's
    add-on (``ADDONS``); scrapy-redis runs with ``SCHEDULER_PERSIST = True``
    (with ``False`` the first worker to close deletes the shared queue under
    the others' feet) and Redis is flushed between runs.

    With Scrapy 2.19 ``Spider.start()`` no longer calls scrapy-redis's
    ``start_requests()``: a RedisSpider reads its start URLs only when its
    spider goes idle.  A banker worker that has never seen any work reports
    idle at once, so both systems start crawling about as early
    (``first_response_s`` in ``runs``).

    The workers run Twisted's epoll reactor (``--reactor``), not Scrapy's
    default asyncio one: with the asyncio reactor Scrapy 2.19's downloader
    does not enforce ``CONCURRENT_REQUESTS_PER_DOMAIN`` (``_process_queue``
    starts every queued request of a slot in one go, because the coroutine
    that marks a request as transferring is only scheduled, not started), so
    one plain Scrapy process puts 5-16 requests on one host with a limit of
    2.  The banker enforces the limit in its own frontier and is unaffected;
    scrapy-redis would be measured without the politeness it was configured
    with.  ``--reactor asyncio`` measures that configuration anyway.

    Every worker also loads ``_crawler.FleetTuning``, an extension that
    makes scrapy-redis 0.9 behave as its documentation says, for both
    systems, and ``_crawler.EngineHeartbeat``:

    * ``REDIS_START_URLS_BATCH_SIZE`` (set to more than the number of seeds):
      scrapy-redis 0.9 ignores it and reads ``CONCURRENT_REQUESTS`` start URLs
      per idle round, so the farm's host roots would trickle in 16 at a time,
      one batch each time a worker goes idle -- the crawl would measure that
      staging, not the schedulers.  The extension sets the spider's
      ``redis_batch_size`` from it, so the first worker to go idle takes
      every seed at once and schedules it into the shared frontier.
    * Seeds go through the dupefilter: scrapy-redis makes every request read
      from the start-URL key ``dont_filter=True``, so each page linking back
      to a host's root fetched that root again (one duplicate per host, with
      either scheduler).  The extension clears the flag.
    * The idle clock: ``RedisSpider`` counts ``MAX_IDLE_TIME_BEFORE_CLOSE``
      from a timestamp taken when its module was imported and reset only
      when ``fleet:start_urls`` is non-empty, so after the first 3 s of a
      crawl a worker closes the first time it is idle at all.  The extension
      restarts that clock at every response, so it counts idle time.
    * The engine heartbeat (``--heartbeat``, 0.5 s; ``EngineHeartbeat``): Scrapy polls a scheduler
      that did not wake the engine itself only every 5 s.  Nothing wakes a
      scrapy-redis worker when another worker pushes requests into the
      shared queue, and an idle spider is re-examined (and closed) only on
      that heartbeat.  Over crawls of tens of seconds a 5 s poll measures
      Scrapy's heartbeat, not the schedulers; ``--heartbeat 5`` restores
      stock Scrapy.

Network-bound, not CPU-bound: the trade-off
    The farm must be the bottleneck, not the 2 cores that run the workers,
    the farm and Redis.  A page costs ~5 ms of a worker's CPU (Scrapy's
    download, parsing and link extraction; the banker's Redis thread adds
    ~0.5 ms), ~0.5 ms of the farm's and ~0.2 ms of Redis's, so 2 cores do
    at most ~330 pages/s, less with anything else running.  4 workers x 16
    requests at 300 ms allow 213 pages/s (~65 % of both cores), so the
    4-worker crawls measure the schedulers, not the machine; at 100 ms they
    would ask for 640 pages/s and measure the CPU.  The price is the
    1-worker crawls: 16 requests at 300 ms are 53 pages/s, and 8,000 pages
    take 2.5 minutes.  They would dominate ``--quick``, so the two systems'
    1-worker crawls run at the same time, each on its own farm and Redis
    (together they use ~0.6 of a core: neither slows the other), and
    ``--quick`` takes ~4.5 minutes instead of ~7; ``--serial-1w`` runs them
    one after the other.  A shorter latency or more concurrency would
    shorten the 1-worker crawls only by letting the 4-worker crawls hit the
    CPU.  ``cpu_busy`` (fraction of all cores busy during the run, from
    ``/proc/stat``; the parallel 1-worker crawls share one figure),
    ``workers_cpu_s`` and ``workers_main_cpu_s`` (the reactor threads'
    share) and ``redis_cpu_s`` are reported per run, and ``timeline``
    (pages served by the end of each second) shows the ramp-up, the plateau
    and the tail.

    The farm has 400 hosts and 8,000 pages (6,400 content pages, plus each
    host's root and three index pages), so that the steady state -- not
    the start-up -- decides the figures: at 213 pages/s a 4-worker crawl
    runs ~40 s.  Hosts are equal in size in ``--quick`` (mildly skewed,
    Zipf ``s = 0.2``, in the full mode) so that no single host's
    ``per_host_limit / latency`` pace (6.7 pages/s) dominates a crawl's
    length; 400 hosts x 2 requests (800) stay well above any fleet's
    concurrency, so the concurrency bound is ``n x 16 / 0.3 s``.  The full
    mode adds 8 workers (427 pages/s: CPU-bound on 2 cores) and repeats
    every configuration 3 times (medians).

Usage::

    python benchmarks/distributed.py --quick   # 400 hosts, 8,000 pages, 1 and 4 workers (~4.5 min)
    python benchmarks/distributed.py           # Zipf 0.2, 1, 4 and 8 workers, 3 repeats (~30 min)
    python benchmarks/distributed.py --tiny    # smoke test: 2 workers, 190 pages (~20 s)

``--seed`` (farm layout), ``--workers`` (fleet sizes, each >= 2, e.g.
``4,8``), ``--repeats``, ``--hosts``, ``--pages``, ``--latency-ms``,
``--concurrent``, ``--zipf``, ``--heartbeat``, ``--reactor``,
``--serial-1w`` and ``--banker-set KEY=JSON`` (extra settings
for the banker runs, e.g. ``--banker-set BANKER_REDIS_PARTITIONS=64``)
override the mode.
Progress goes to stderr, a summary to stdout, and the last stdout line is
the JSON object: the keys above plus ``per_host_limit``, ``workers``,
``fleet_sizes``, the farm parameters and ``runs`` (every run's details; with
``--repeats`` > 1 the timings are medians and lost/duplicates and the
per-host maxima the worst run's).  ``lost``, ``duplicates`` and
``max_concurrent_per_host_banker`` cover every banker fleet run.  A run
that loses pages, or a worker that exits non-zero, prints the worker log
tails to stderr; the JSON is printed all the same.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import _fleet
import _harness
import redis
from _common import log

from scrapy_banker.testing.farm import FarmConfig, FarmModel, WebFarm
from scrapy_banker.testing.redis_server import RedisServer

#: Name of the start-URL list both systems' RedisSpider reads (spider "fleet").
START_URLS_KEY = "fleet:start_urls"
SYSTEMS: tuple[str, ...] = ("scrapy_redis", "banker")
PER_HOST = 2
SAMPLE_S = 0.1
#: Fraction of the pages after which the tail starts (``tail_s``).
TAIL_FROM = 0.9
#: Summed over a banker fleet's workers into each run's ``banker_<name>``.
BANKER_COUNTERS = (
    "handover_waits", "idle_waits", "popped", "partitions_moved", "fenced", "redelivered",
    "handed_back", "steals", "partitions_stolen", "duplicates", "duplicates_cached",
    "drain_checks",
)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """Size of one benchmark mode."""

    hosts: int
    total_pages: int
    latency_ms: float
    zipf_s: float
    #: Fleet sizes measured besides 1 worker; the first is the headline one.
    fleets: tuple[int, ...]
    repeats: int
    #: Per-run limit (s): a run still going after it is killed and reported.
    timeout_s: float
    concurrent: int = 16
    #: MAX_IDLE_TIME_BEFORE_CLOSE (whole seconds: scrapy-redis truncates it).
    max_idle_s: int = 3

    def farm_config(self, seed: int) -> FarmConfig:
        return FarmConfig(
            seed=seed,
            hosts=self.hosts,
            total_pages=self.total_pages,
            zipf_s=self.zipf_s,
            latency_ms=self.latency_ms,
        )

    def bound(self, workers: int) -> float:
        """The concurrency bound (pages/s) of a fleet of ``workers``."""
        return min(workers * self.concurrent, self.hosts * PER_HOST) / (self.latency_ms / 1000)


FULL = Workload(hosts=400, total_pages=6400, latency_ms=300.0, zipf_s=0.2, fleets=(4, 8),
                repeats=3, timeout_s=900.0)  # fmt: skip
QUICK = Workload(hosts=400, total_pages=6400, latency_ms=300.0, zipf_s=0.0, fleets=(4,),
                 repeats=1, timeout_s=600.0)  # fmt: skip
TINY = Workload(hosts=10, total_pages=150, latency_ms=50.0, zipf_s=0.0, fleets=(2,),
                repeats=1, timeout_s=60.0, max_idle_s=1)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """What every run of one benchmark invocation shares, besides the farm."""

    heartbeat: float
    reactor: str
    timeout_s: float
    max_idle_s: int
    concurrent: int
    banker_extra: dict[str, Any]


def settings_for(
    system: str, redis_url: str, node: str, seeds: int, opts: Options
) -> dict[str, Any]:
    """One worker's Scrapy settings; everything but the scheduler is shared."""
    common: dict[str, Any] = {
        "TWISTED_REACTOR": opts.reactor,
        "REMOTE_CONTROL_ENABLED": False,
        "REDIS_URL": redis_url,
        "CONCURRENT_REQUESTS": opts.concurrent,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "MAX_IDLE_TIME_BEFORE_CLOSE": opts.max_idle_s,
        "REDIS_START_URLS_BATCH_SIZE": max(1000, 2 * seeds),
        "LOG_LEVEL": "INFO",
    }
    common = _harness.with_extensions(common, ["_crawler.FleetTuning"], opts.heartbeat)
    if system == "scrapy_redis":
        return {**common, **_common.SCRAPY_REDIS}
    return _harness.overlaid(
        {**common, **_common.BANKER_REDIS, "BANKER_REDIS_NODE_ID": node}, opts.banker_extra
    )


@dataclass
class FleetRun:
    """One crawl of one farm by ``n_workers`` processes, polled by :func:`run_fleets`."""

    system: str
    n_workers: int
    farm: Any
    redis_url: str
    workdir: Path
    opts: Options
    fleet: Any = None
    watch: Any = None
    redis_cpu0: float = 0.0

    def _redis_cpu_s(self) -> float:
        client = redis.Redis.from_url(self.redis_url)
        try:
            return _harness.redis_cpu_s(client)
        finally:
            client.close()

    def start(self) -> None:
        seeds = _fleet.fresh(self.farm, self.redis_url, START_URLS_KEY)
        self.redis_cpu0 = self._redis_cpu_s()
        self.fleet = fleet = _fleet.Fleet(self.workdir, timeout_s=self.opts.timeout_s)
        self.watch = _fleet.FarmWatch(self.farm, fleet.t0)
        for i in range(self.n_workers):
            node = f"w{i}"
            settings = settings_for(self.system, self.redis_url, node, len(seeds), self.opts)
            fleet.start(node, settings, spider="redis")

    def poll(self, now: float) -> bool:
        """Sample the farm; True once every worker has exited (or was killed)."""
        self.watch.sample(now)
        done: bool = self.fleet.poll(now)
        return done

    def result(self, workload: Workload, cpu_busy: float) -> dict[str, Any]:
        fleet, watch = self.fleet, self.watch
        fleet.wait(30)
        redis_cpu = self._redis_cpu_s() - self.redis_cpu0
        expected = self.farm.expected_urls()
        served = _fleet.served(self.farm, expected)
        pages = served.requests
        wall = fleet.end - fleet.t0
        busy = watch.busy_s
        busy_rate = (watch.last_n - watch.first_n) / busy if busy > 0 else math.nan
        worker_stats = fleet.stats()
        run: dict[str, Any] = {
            "system": self.system,
            "workers": self.n_workers,
            "pages": pages,
            "expected": len(expected),
            "lost": len(served.lost),
            "duplicates": served.duplicates,
            "wall_s": round(wall, 3),
            "busy_s": round(busy, 3),
            "first_response_s": round(watch.first_response_s, 3),
            "tail_s": round(watch.last_t - watch.tail_start(TAIL_FROM), 3),
            "end_detect_s": round(fleet.end - watch.last_t, 3),
            "pages_per_s": pages / wall if wall > 0 else math.nan,
            "pages_per_s_busy": busy_rate,
            "busy_efficiency": busy_rate / workload.bound(self.n_workers),
            "max_concurrent_per_host": served.max_per_host,
            "cpu_busy": cpu_busy,
            "workers_cpu_s": round(_fleet.sum_stat(worker_stats, "fleet/cpu_s", float), 2),
            "workers_main_cpu_s": round(
                _fleet.sum_stat(worker_stats, "fleet/cpu_main_s", float), 2
            ),
            "redis_cpu_s": round(redis_cpu, 2),
            "exit_codes": fleet.exit_codes(),
            "timed_out": fleet.timed_out,
            "responses_per_worker": [s.get("response_received_count", 0) for s in worker_stats],
            "finish_reasons": [s.get("finish_reason") for s in worker_stats],
            "timeline": watch.timeline(),
        }
        if self.system == "banker":
            for key in BANKER_COUNTERS:
                run[f"banker_{key}"] = _fleet.sum_stat(worker_stats, f"banker/redis/{key}")
        fleet.report(f"{self.system} x{self.n_workers}", run["lost"])
        return run


def run_fleets(runs: Sequence[FleetRun], workload: Workload) -> list[dict[str, Any]]:
    """Start ``runs`` together and poll them until every worker has exited.

    Several runs at once are the two systems' 1-worker crawls, each on its
    own farm and Redis (see "the trade-off" in the module docstring).
    """
    cpu = _harness.CpuWindow()
    for run in runs:
        run.start()
    _fleet.watch([run.poll for run in runs], SAMPLE_S)
    cpu.stop()
    return [run.result(workload, cpu.busy) for run in runs]


#: Run details reported as the median over repeats.
MEDIANS = ("pages_per_s", "pages_per_s_busy", "busy_efficiency", "wall_s", "busy_s",
           "first_response_s", "tail_s", "end_detect_s")  # fmt: skip


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's details with the median timings; worst lost/duplicates/per-host."""
    return _fleet.merge_repeats(
        runs,
        median=MEDIANS,
        worst=("lost", "duplicates", "max_concurrent_per_host"),
        samples={"pages_per_s_samples": "pages_per_s",
                 "pages_per_s_busy_samples": "pages_per_s_busy", "wall_s_samples": "wall_s"},
    )  # fmt: skip


def _fleet_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(x) for x in text.split(",") if x.strip())
    if not sizes or any(n < 2 for n in sizes):
        raise argparse.ArgumentTypeError("fleet sizes must be integers >= 2, e.g. 4 or 4,8")
    return sizes


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="~4.5 minutes", tiny="smoke test, < 30 s")
    parser.add_argument("--seed", type=int, default=7, help="farm layout seed")
    parser.add_argument("--workers", type=_fleet_sizes, default=None,
                        help="fleet sizes besides 1 worker, e.g. 4 or 4,8")  # fmt: skip
    _harness.add_repeats(parser, "runs per configuration")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts")
    parser.add_argument("--pages", type=int, default=None, help="farm content pages")
    parser.add_argument("--latency-ms", type=float, default=None, help="farm latency")
    parser.add_argument("--concurrent", type=int, default=None, help="CONCURRENT_REQUESTS")
    parser.add_argument("--zipf", type=float, default=None, help="host size skew")
    parser.add_argument("--heartbeat", type=float, default=0.5,
                        help="Scrapy engine heartbeat in s (5 = stock Scrapy)")  # fmt: skip
    parser.add_argument("--reactor", default="epoll",
                        help="TWISTED_REACTOR of the workers: epoll (default), asyncio "
                        "(Scrapy's default) or an import path")  # fmt: skip
    parser.add_argument("--serial-1w", action="store_true",
                        help="the two systems' 1-worker crawls one after the other")  # fmt: skip
    _harness.add_settings(parser, "extra setting for the banker runs", flag="--banker-set")
    return parser.parse_args(argv)


def _describe(run: dict[str, Any]) -> str:
    return (
        f"  {run['system']:<12} x{run['workers']}: {run['pages']:,} pages, "
        f"{run['pages_per_s']:7.1f} pages/s wall ({run['wall_s']:.1f} s), "
        f"{run['pages_per_s_busy']:7.1f} busy ({run['busy_s']:.1f} s, efficiency "
        f"{run['busy_efficiency']:.2f}); first response {run['first_response_s']} s, tail "
        f"{run['tail_s']:.1f} s, end {run['end_detect_s']:.1f} s; max/host "
        f"{run['max_concurrent_per_host']}; lost {run['lost']}, dup {run['duplicates']}; CPU "
        f"{run['cpu_busy']:.0%} of all cores, workers {run['workers_cpu_s']:.1f} s (reactor "
        f"{run['workers_main_cpu_s']:.1f}), redis {run['redis_cpu_s']:.1f} s; per worker "
        f"{run['responses_per_worker']}"
        + (
            f"; moves {run['banker_partitions_moved']}, fenced {run['banker_fenced']}, "
            f"handover waits {run['banker_handover_waits']}, steals {run['banker_steals']}"
            if run["system"] == "banker"
            else ""
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    workload = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        fleets="workers", repeats="repeats", hosts="hosts", total_pages="pages",
        latency_ms="latency_ms", zipf_s="zipf", concurrent="concurrent",
    )  # fmt: skip
    banker_extra = _harness.settings(args.banker_set)
    reactor = _common.reactor(args.reactor)
    opts = Options(
        args.heartbeat, reactor, workload.timeout_s, workload.max_idle_s,
        workload.concurrent, banker_extra,
    )  # fmt: skip
    _harness.workers_import_benchmarks()  # the workers load _crawler's extensions
    fleets = workload.fleets
    n = fleets[0]
    config = workload.farm_config(args.seed)
    counts = FarmModel(config).page_counts()
    started = time.perf_counter()
    log(
        f"farm: {config.hosts} hosts, {sum(counts):,} content pages (largest host "
        f"{counts[0]}, smallest {counts[-1]}), {config.latency_ms:g} ms per request; "
        f"CONCURRENT_REQUESTS={workload.concurrent}, CONCURRENT_REQUESTS_PER_DOMAIN={PER_HOST}"
        f"; 1 and {'/'.join(map(str, fleets))} workers, {workload.repeats} run(s) each; "
        f"engine heartbeat {args.heartbeat:g} s; reactor {reactor}; {os.cpu_count()} cores"
        + (f"; banker extra settings {banker_extra}" if banker_extra else "")
    )
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        farm = stack.enter_context(WebFarm(config))
        server = stack.enter_context(RedisServer())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="distributed-")))
        # The second farm and Redis of the parallel 1-worker crawls.
        farm2, server2 = farm, server
        if not args.serial_1w:
            farm2 = stack.enter_context(WebFarm(config))
            server2 = stack.enter_context(RedisServer())
        log(f"expected pages (BFS from {len(farm.start_urls())} roots): "
             f"{len(farm.expected_urls()):,}")  # fmt: skip

        def make(system: str, workers: int, rep: int, second: bool = False) -> FleetRun:
            return FleetRun(
                system, workers, farm2 if second else farm,
                server2.url if second else server.url,
                tmp / f"{system}-{workers}w-{rep}", opts,
            )  # fmt: skip

        for rep in range(workload.repeats):
            # Alternate which system goes first (and which farm it gets), so
            # drift hits both.
            order = SYSTEMS if rep % 2 == 0 else SYSTEMS[::-1]
            batches: list[list[FleetRun]] = []
            if args.serial_1w:
                batches += [[make(system, 1, rep)] for system in order]
            else:
                batches.append([make(order[0], 1, rep), make(order[1], 1, rep, second=True)])
            batches += [[make(system, w, rep)] for w in fleets for system in order]
            for batch in batches:
                for run in run_fleets(batch, workload):
                    samples.setdefault((run["system"], run["workers"]), []).append(run)
                    log(_describe(run))
    runs = {f"{s}_{w}w": _median_run(r) for (s, w), r in samples.items()}

    def get(system: str, workers: int, key: str) -> Any:
        return runs[f"{system}_{workers}w"][key]

    num = _common.rounded
    out: dict[str, Any] = {
        "workers": n,
        "fleet_sizes": list(fleets),
        "per_host_limit": PER_HOST,
        "concurrent_requests": workload.concurrent,
        "hosts": config.hosts,
        "latency_ms": config.latency_ms,
        "zipf_s": config.zipf_s,
        "expected_pages": get("banker", n, "expected"),
        "seed": args.seed,
        "heartbeat_s": args.heartbeat,
        "reactor": reactor,
        "repeats": workload.repeats,
        "parallel_1w": not args.serial_1w,
        "banker_extra_settings": banker_extra,
        "concurrency_bound_pages_per_s": num(workload.bound(n), 2),
    }
    sizes = (1, *fleets)
    for w in sizes:
        out[f"concurrency_bound_pages_per_s_{w}w"] = num(workload.bound(w), 2)
        out[f"tail_work_s_{w}w"] = num(
            (1 - TAIL_FROM) * get("banker", w, "pages") / workload.bound(w), 3
        )
    for system in SYSTEMS:
        for w in sizes:
            out[f"pages_per_s_{system}_{w}w"] = num(get(system, w, "pages_per_s"), 2)
            out[f"pages_per_s_{system}_{w}w_busy"] = num(get(system, w, "pages_per_s_busy"), 2)
            out[f"busy_efficiency_{system}_{w}w"] = num(get(system, w, "busy_efficiency"), 3)
            out[f"first_response_s_{system}_{w}w"] = num(get(system, w, "first_response_s"), 3)
            out[f"tail_s_{system}_{w}w"] = num(get(system, w, "tail_s"), 3)
            out[f"end_detect_s_{system}_{w}w"] = num(get(system, w, "end_detect_s"), 3)
        for w in fleets:
            for suffix, key in (("", "pages_per_s"), ("_busy", "pages_per_s_busy")):
                out[f"speedup_{system}_{w}w_vs_1w{suffix}"] = num(
                    _common.ratio(get(system, w, key), get(system, 1, key))
                )
            out[f"wall_ratio_{system}_{w}w_vs_1w"] = num(
                _common.ratio(get(system, w, "wall_s"), get(system, 1, "wall_s"))
            )
    for suffix, key in (("", "pages_per_s"), ("_busy", "pages_per_s_busy")):
        for w in sizes:
            out[f"speedup_banker_vs_scrapy_redis_{w}w{suffix}"] = num(
                _common.ratio(get("banker", w, key), get("scrapy_redis", w, key))
            )
    out["max_concurrent_per_host_banker"] = max(
        get("banker", w, "max_concurrent_per_host") for w in fleets
    )
    out["max_concurrent_per_host_scrapy_redis"] = max(
        get("scrapy_redis", w, "max_concurrent_per_host") for w in fleets
    )
    out["max_concurrent_per_host_banker_1w"] = get("banker", 1, "max_concurrent_per_host")
    out["max_concurrent_per_host_scrapy_redis_1w"] = get(
        "scrapy_redis", 1, "max_concurrent_per_host"
    )
    out["lost"] = max(get("banker", w, "lost") for w in fleets)
    out["duplicates"] = max(get("banker", w, "duplicates") for w in fleets)
    out["lost_scrapy_redis"] = max(get("scrapy_redis", w, "lost") for w in fleets)
    out["duplicates_scrapy_redis"] = max(get("scrapy_redis", w, "duplicates") for w in fleets)
    out["lost_1w"] = get("banker", 1, "lost")
    out["lost_scrapy_redis_1w"] = get("scrapy_redis", 1, "lost")
    out["runs"] = {name: _common.round_floats(run) for name, run in runs.items()}

    print(
        f"{'':<16}{'pages/s wall':>14}{'pages/s busy':>14}{'efficiency':>12}{'tail s':>8}"
        f"{'end s':>7}{'max/host':>10}{'lost':>6}{'dup':>6}"
    )
    for name, run in runs.items():
        print(
            f"{name:<16}{run['pages_per_s']:>14.1f}{run['pages_per_s_busy']:>14.1f}"
            f"{run['busy_efficiency']:>12.3f}{run['tail_s']:>8.1f}{run['end_detect_s']:>7.1f}"
            f"{run['max_concurrent_per_host']:>10}{run['lost']:>6}{run['duplicates']:>6}"
        )
    print(
        f"banker vs scrapy-redis, {n} workers: {out[f'speedup_banker_vs_scrapy_redis_{n}w']}x "
        f"wall, {out[f'speedup_banker_vs_scrapy_redis_{n}w_busy']}x busy; {n} vs 1 workers: "
        f"banker {out[f'speedup_banker_{n}w_vs_1w']}x, scrapy-redis "
        f"{out[f'speedup_scrapy_redis_{n}w_vs_1w']}x (wall); concurrency bound "
        f"{out['concurrency_bound_pages_per_s']} pages/s"
    )
    for line in (
        _common.target_line(f"banker vs scrapy-redis pages/s, {n} workers",
                            out[f"speedup_banker_vs_scrapy_redis_{n}w"] or math.nan, 1.1),
        _common.target_line(f"banker busy efficiency, {n} workers",
                            out[f"busy_efficiency_banker_{n}w"] or math.nan, 0.9, ""),
        f"banker wall time {n} workers / 1 worker: {out[f'wall_ratio_banker_{n}w_vs_1w']} "
        "(target <= 1)",
        f"banker tail (90 -> 100 % of pages): {out[f'tail_s_banker_{n}w']} s; those pages "
        f"at the bound: {out[f'tail_work_s_{n}w']} s",
        f"banker end detection: {out[f'end_detect_s_banker_{n}w']} s after the last page "
        f"(RedisSpider: includes MAX_IDLE_TIME_BEFORE_CLOSE = {workload.max_idle_s} s)",
    ):  # fmt: skip
        print(line)
    print(
        f"max requests in flight per host with {'/'.join(map(str, fleets))} workers (limit "
        f"{PER_HOST} per worker): banker {out['max_concurrent_per_host_banker']}, scrapy-redis "
        f"{out['max_concurrent_per_host_scrapy_redis']}"
    )
    print(f"total time {time.perf_counter() - started:.1f} s")
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
