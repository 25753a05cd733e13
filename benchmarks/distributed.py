"""A fleet of Scrapy workers on one Redis: scrapy-redis's scheduler vs BankerRedisScheduler.

What is measured
    ``--workers`` (4) real worker processes (``scrapy_banker.testing.fleet``,
    one ``CrawlerProcess`` each) crawl one local web farm
    (``scrapy_banker.testing.webfarm``, its own process) through one real
    ``redis-server``, first with one worker and then with ``--workers``, once
    with scrapy-redis's shared queue (``scrapy_redis.scheduler.Scheduler`` +
    ``RFPDupeFilter``) and once with scrapy-banker's partitioned, leased
    frontier (``scrapy_banker.redis.scheduler.BankerRedisScheduler`` + the
    add-on).  Every crawl runs to completion; the farm tells what was fetched.

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

    Every worker also loads :class:`FleetTuning`, an extension of this
    module (the workers get ``benchmarks/`` on ``PYTHONPATH``) that makes
    scrapy-redis 0.9 behave as its documentation says, for both systems:

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
    * The engine heartbeat (``--heartbeat``, 0.5 s): Scrapy polls a scheduler
      that did not wake the engine itself only every 5 s.  Nothing wakes a
      scrapy-redis worker when another worker pushes requests into the
      shared queue, and an idle spider is re-examined (and closed) only on
      that heartbeat.  Over crawls of tens of seconds a 5 s poll measures
      Scrapy's heartbeat, not the schedulers; ``--heartbeat 5`` restores
      stock Scrapy.

Network-bound, not CPU-bound
    The farm must be the bottleneck, not the 2 cores that run the workers,
    the farm and Redis.  A worker costs about 5 ms of CPU per page (parsing,
    link extraction; the banker's Redis thread adds some), so 4 workers x 16
    requests must not complete more than ~200 pages/s: hence 300 ms per
    request (4 x 16 / 0.3 s = 213 pages/s at most; 1 worker: 53).  At 100 ms
    the 4-worker runs use ~75% of both cores and measure the machine.
    ``cpu_busy`` (fraction of all cores busy during the run, from
    ``/proc/stat``) and ``workers_cpu_s`` are reported per run, and
    ``timeline`` (pages served by the end of each second) shows the ramp-up,
    the plateau and the tail.  Hosts are equal in size in ``--quick`` (mildly
    skewed, Zipf ``s = 0.2``, in the full mode) so that no single host's
    ``per_host_limit / latency`` pace (6.7 pages/s) dominates a crawl's length.

Usage::

    python benchmarks/distributed.py --quick   # 80 hosts, 1,280 pages, 300 ms (~1.7 min)
    python benchmarks/distributed.py           # 150 hosts, ~3,000 pages, 2 repeats (~7 min)
    python benchmarks/distributed.py --tiny    # smoke test: 2 workers, 190 pages (~15 s)

``--seed`` (farm layout), ``--workers`` (fleet size, >= 2), ``--repeats``,
``--hosts``, ``--pages``, ``--latency-ms``, ``--zipf``, ``--heartbeat``,
``--reactor`` and ``--banker-set KEY=JSON`` (extra settings for the banker
runs, e.g. ``--banker-set BANKER_REDIS_PARTITIONS=64``) override the mode.
Progress goes to stderr, a summary to stdout, and the last stdout line is
the JSON object: the keys above plus ``per_host_limit``, ``workers``, the
farm parameters and ``runs`` (every run's details; with ``--repeats`` > 1 the
pages/s figures are medians and lost/duplicates the worst run's).  A run
that loses pages, or a worker that exits non-zero, prints the worker log
tails to stderr; the JSON is printed all the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: Name of the start-URL list both systems' RedisSpider reads (spider "fleet").
START_URLS_KEY = "fleet:start_urls"
BANKER_SCHEDULER = "scrapy_banker.redis.scheduler.BankerRedisScheduler"
SYSTEMS: tuple[str, ...] = ("scrapy_redis", "banker")
CONCURRENT = 16
PER_HOST = 2
SAMPLE_S = 0.1
#: This module, as the workers import it (``benchmarks/`` on their PYTHONPATH).
TUNING = "distributed.FleetTuning"
#: ``--reactor`` shorthands; anything else is taken as an import path.
REACTORS = {
    "epoll": "twisted.internet.epollreactor.EPollReactor",
    "asyncio": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
}


class FleetTuning:
    """Worker-side extension (both systems): see the module docstring, "Fairness".

    Kept free of heavy imports: it is loaded in every worker process.
    """

    def __init__(self, crawler: Any) -> None:
        from scrapy import signals
        from scrapy.core.engine import ExecutionEngine

        settings = crawler.settings
        heartbeat = settings.getfloat("DISTRIBUTED_BENCH_HEARTBEAT", 0.0)
        if heartbeat > 0:
            ExecutionEngine._SLOT_HEARTBEAT_INTERVAL = heartbeat  # type: ignore[misc]
        self.batch = settings.getint("REDIS_START_URLS_BATCH_SIZE", 0)
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.response_received, signal=signals.response_received)

    @classmethod
    def from_crawler(cls, crawler: Any) -> FleetTuning:
        return cls(crawler)

    def spider_opened(self, spider: Any) -> None:
        # The start() generator has not run yet: the first read takes the batch.
        if self.batch > 0 and hasattr(spider, "redis_batch_size"):
            spider.redis_batch_size = self.batch
        spider.spider_idle_start_time = time.time()
        make = getattr(spider, "make_request_from_data", None)
        if make is not None:

            def filtered(data: Any) -> Any:
                # scrapy-redis makes every start request dont_filter=True,
                # so a page linking back to a host's root fetched it again.
                request = make(data)
                if hasattr(request, "replace") and getattr(request, "dont_filter", False):
                    request = request.replace(dont_filter=False)
                return request

            spider.make_request_from_data = filtered

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        spider.spider_idle_start_time = time.time()


@dataclass(frozen=True)
class Workload:
    """Size of one benchmark mode."""

    hosts: int
    total_pages: int
    latency_ms: float
    zipf_s: float
    workers: int
    repeats: int
    #: Per-run limit (s): a run still going after it is killed and reported.
    timeout_s: float
    #: MAX_IDLE_TIME_BEFORE_CLOSE (whole seconds: scrapy-redis truncates it)
    #: and BANKER_REDIS_IDLE_BEFORE_CLOSE; the smoke test shortens both.
    max_idle_s: int = 3
    banker_idle_s: float = 1.0

    def farm_config(self, seed: int) -> Any:
        from scrapy_banker.testing.webfarm import FarmConfig

        return FarmConfig(
            seed=seed,
            hosts=self.hosts,
            total_pages=self.total_pages,
            zipf_s=self.zipf_s,
            latency_ms=self.latency_ms,
        )


FULL = Workload(hosts=150, total_pages=2400, latency_ms=300.0, zipf_s=0.2, workers=4,
                repeats=2, timeout_s=600.0)  # fmt: skip
QUICK = Workload(hosts=80, total_pages=960, latency_ms=300.0, zipf_s=0.0, workers=4,
                 repeats=1, timeout_s=300.0)  # fmt: skip
TINY = Workload(hosts=10, total_pages=150, latency_ms=50.0, zipf_s=0.0, workers=2,
                repeats=1, timeout_s=60.0, max_idle_s=1, banker_idle_s=0.5)  # fmt: skip


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Options:
    """What every run of one benchmark invocation shares, besides the farm."""

    heartbeat: float
    reactor: str
    timeout_s: float
    max_idle_s: int
    banker_idle_s: float
    banker_extra: dict[str, Any]


def settings_for(
    system: str, redis_url: str, node: str, seeds: int, opts: Options
) -> dict[str, Any]:
    """One worker's Scrapy settings; everything but the scheduler is shared."""
    common: dict[str, Any] = {
        "TWISTED_REACTOR": opts.reactor,
        "REMOTE_CONTROL_ENABLED": False,
        "REDIS_URL": redis_url,
        "CONCURRENT_REQUESTS": CONCURRENT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "MAX_IDLE_TIME_BEFORE_CLOSE": opts.max_idle_s,
        "REDIS_START_URLS_BATCH_SIZE": max(1000, 2 * seeds),
        "DISTRIBUTED_BENCH_HEARTBEAT": opts.heartbeat,
        "EXTENSIONS": {TUNING: 0},
        "LOG_LEVEL": "INFO",
    }
    if system == "scrapy_redis":
        return {
            **common,
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            # False would make the first worker to close flush the shared
            # queue and dupefilter while the others still crawl.
            "SCHEDULER_PERSIST": True,
        }
    return {
        **common,
        "SCHEDULER": BANKER_SCHEDULER,
        "ADDONS": {"scrapy_banker.Addon": 500},
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": opts.banker_idle_s,
        **opts.banker_extra,
    }


def run_fleet(
    system: str,
    n_workers: int,
    farm: Any,
    redis_url: str,
    workdir: Path,
    opts: Options,
) -> dict[str, Any]:
    """One crawl of the farm by ``n_workers`` processes; what the farm saw, and when."""
    import redis

    from scrapy_banker.testing.fleet import FleetWorker

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    farm.reset()
    seeds = farm.start_urls()
    client.rpush(START_URLS_KEY, *(json.dumps({"url": u}) for u in seeds))
    client.close()
    workdir.mkdir(parents=True, exist_ok=True)
    cpu0, children0 = _cpu_ticks(), _children_cpu_s()
    t0 = time.monotonic()
    workers = [
        FleetWorker(
            f"w{i}",
            workdir,
            {
                "spider": "redis",
                "seeds": [],
                "settings": settings_for(system, redis_url, f"w{i}", len(seeds), opts),
            },
        )
        for i in range(n_workers)
    ]
    first_t: float | None = None
    first_n = 0
    last_t = t0
    last_n = 0
    timed_out = False
    codes: dict[str, int | None] = {}
    #: Pages served so far, once a second from the first worker's start.
    timeline: list[int] = []
    next_mark = t0
    while True:
        now = time.monotonic()
        n = int(farm.stats()["requests"])
        if n and first_t is None:
            first_t, first_n = now, n
        if n != last_n:
            last_t, last_n = now, n
        if now >= next_mark:
            timeline.append(n)
            next_mark += 1.0
        for w in workers:
            if w.name not in codes and w.proc.poll() is not None:
                codes[w.name] = w.proc.returncode
        if len(codes) == len(workers):
            break
        if now - t0 > opts.timeout_s:
            timed_out = True
            for w in workers:
                if w.proc.poll() is None:
                    w.kill()
                    codes[w.name] = w.proc.returncode
            break
        time.sleep(SAMPLE_S)
    end = time.monotonic()
    for w in workers:
        w.wait(30)  # reap, so RUSAGE_CHILDREN counts them
    cpu1, children1 = _cpu_ticks(), _children_cpu_s()
    stats = farm.stats(urls=True)
    fetches: dict[str, int] = stats["fetches"]
    expected = farm.expected_urls()
    lost = len(expected - set(fetches))
    duplicates = sum(c - 1 for c in fetches.values() if c > 1)
    pages = int(stats["requests"])
    wall = end - t0
    busy = (last_t - first_t) if first_t is not None else 0.0
    busy_pages = last_n - first_n
    worker_stats: list[dict[str, Any]] = []
    for w in workers:
        try:
            worker_stats.append(w.stats())
        except AssertionError:
            worker_stats.append({})
    cpu_busy = math.nan
    if cpu0 is not None and cpu1 is not None and cpu1[1] > cpu0[1]:
        cpu_busy = (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1])
    inflight = stats["max_inflight_per_host"]
    run: dict[str, Any] = {
        "system": system,
        "workers": n_workers,
        "pages": pages,
        "expected": len(expected),
        "lost": lost,
        "duplicates": duplicates,
        "wall_s": round(wall, 3),
        "busy_s": round(busy, 3),
        "first_response_s": round(first_t - t0, 3) if first_t is not None else None,
        "tail_s": round(end - last_t, 3),
        "pages_per_s": pages / wall if wall > 0 else math.nan,
        "pages_per_s_busy": busy_pages / busy if busy > 0 else math.nan,
        "max_concurrent_per_host": max(inflight.values(), default=0),
        "cpu_busy": cpu_busy,
        "workers_cpu_s": round(children1 - children0, 2),
        "exit_codes": [codes.get(w.name) for w in workers],
        "timed_out": timed_out,
        "responses_per_worker": [s.get("response_received_count", 0) for s in worker_stats],
        "finish_reasons": [s.get("finish_reason") for s in worker_stats],
        "timeline": timeline,
    }
    if system == "banker":
        for key in ("handover_waits", "idle_waits", "popped", "partitions_moved", "fenced",
                    "redelivered", "handed_back"):  # fmt: skip
            run[f"banker_{key}"] = sum(int(s.get(f"banker/redis/{key}", 0)) for s in worker_stats)
    if lost or timed_out or any(c != 0 for c in run["exit_codes"]):
        _log(f"!! {system} x{n_workers}: lost {lost}, exit codes {run['exit_codes']}"
             f"{', timed out' if timed_out else ''}")  # fmt: skip
        for w in workers:
            _log(f"---- log tail of {system} worker {w.name} ----\n{w.log_tail()}")
    return run


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's details with the median pages/s figures; worst lost/duplicates."""
    out = dict(runs[0])
    for key in ("pages_per_s", "pages_per_s_busy", "wall_s", "busy_s"):
        values = [r[key] for r in runs if isinstance(r[key], (int, float))]
        out[key] = statistics.median(values) if values else math.nan
    for key in ("lost", "duplicates", "max_concurrent_per_host"):
        out[key] = max(r[key] for r in runs)
    out["pages_per_s_samples"] = [r["pages_per_s"] for r in runs]
    out["pages_per_s_busy_samples"] = [r["pages_per_s_busy"] for r in runs]
    return out


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="~1.5 minutes")
    mode.add_argument("--tiny", action="store_true", help="smoke test, < 30 s")
    parser.add_argument("--seed", type=int, default=7, help="farm layout seed")
    parser.add_argument("--workers", type=int, default=None, help="fleet size (>= 2)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per configuration")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts")
    parser.add_argument("--pages", type=int, default=None, help="farm content pages")
    parser.add_argument("--latency-ms", type=float, default=None, help="farm latency")
    parser.add_argument("--zipf", type=float, default=None, help="host size skew")
    parser.add_argument("--heartbeat", type=float, default=0.5,
                        help="Scrapy engine heartbeat in s (5 = stock Scrapy)")  # fmt: skip
    parser.add_argument("--reactor", default="epoll",
                        help="TWISTED_REACTOR of the workers: epoll (default), asyncio "
                        "(Scrapy's default) or an import path")  # fmt: skip
    parser.add_argument("--banker-set", action="append", default=[], metavar="KEY=JSON",
                        help="extra setting for the banker runs")  # fmt: skip
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 2:
        parser.error("--workers must be >= 2 (the 1-worker runs are always made)")
    return args


def _banker_extra(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"--banker-set {pair!r}: expected KEY=JSON")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import _common

    from scrapy_banker.testing.redis_server import RedisServer
    from scrapy_banker.testing.webfarm import FarmModel, WebFarm

    args = _parse(argv)
    workload = TINY if args.tiny else QUICK if args.quick else FULL
    if args.workers is not None:
        workload = replace(workload, workers=args.workers)
    if args.repeats is not None:
        workload = replace(workload, repeats=max(1, args.repeats))
    for arg, field_name in (("hosts", "hosts"), ("pages", "total_pages"),
                            ("latency_ms", "latency_ms"), ("zipf", "zipf_s")):  # fmt: skip
        if getattr(args, arg) is not None:
            workload = replace(workload, **{field_name: getattr(args, arg)})
    banker_extra = _banker_extra(args.banker_set)
    reactor = REACTORS.get(args.reactor, args.reactor)
    opts = Options(
        args.heartbeat, reactor, workload.timeout_s, workload.max_idle_s,
        workload.banker_idle_s, banker_extra,
    )  # fmt: skip
    # The workers import FleetTuning from this module.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p
    )
    n = workload.workers
    config = workload.farm_config(args.seed)
    counts = FarmModel(config).page_counts()
    started = time.perf_counter()
    _log(
        f"farm: {config.hosts} hosts, {sum(counts):,} content pages (largest host "
        f"{counts[0]}, smallest {counts[-1]}), {config.latency_ms:g} ms per request; "
        f"CONCURRENT_REQUESTS={CONCURRENT}, CONCURRENT_REQUESTS_PER_DOMAIN={PER_HOST}; "
        f"1 and {n} workers, {workload.repeats} run(s) each; engine heartbeat "
        f"{args.heartbeat:g} s; reactor {reactor}; {os.cpu_count()} cores"
        + (f"; banker extra settings {banker_extra}" if banker_extra else "")
    )
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with (
        WebFarm(config) as farm,
        RedisServer() as server,
        tempfile.TemporaryDirectory(prefix="distributed-") as tmp,
    ):
        _log(f"expected pages (BFS from {len(farm.start_urls())} roots): "
             f"{len(farm.expected_urls()):,}")  # fmt: skip
        for rep in range(workload.repeats):
            for n_workers in (1, n):
                # Alternate which system goes first, so drift hits both.
                order = SYSTEMS if rep % 2 == 0 else SYSTEMS[::-1]
                for system in order:
                    run = run_fleet(
                        system, n_workers, farm, server.url,
                        Path(tmp) / f"{system}-{n_workers}w-{rep}", opts,
                    )  # fmt: skip
                    samples.setdefault((system, n_workers), []).append(run)
                    _log(
                        f"  {system:<12} x{n_workers}: {run['pages']:,} pages, "
                        f"{run['pages_per_s']:7.1f} pages/s wall ({run['wall_s']:.1f} s), "
                        f"{run['pages_per_s_busy']:7.1f} busy ({run['busy_s']:.1f} s; first "
                        f"response {run['first_response_s']} s, tail {run['tail_s']:.1f} s); "
                        f"max/host {run['max_concurrent_per_host']}; lost {run['lost']}, "
                        f"dup {run['duplicates']}; CPU {run['cpu_busy']:.0%} of all cores, "
                        f"workers {run['workers_cpu_s']:.1f} s; per worker "
                        f"{run['responses_per_worker']}"
                    )
    runs = {f"{s}_{w}w": _median_run(r) for (s, w), r in samples.items()}

    def get(system: str, workers: int, key: str) -> Any:
        return runs[f"{system}_{workers}w"][key]

    def num(value: float, digits: int = 4) -> float | None:
        return round(value, digits) if isinstance(value, (int, float)) and math.isfinite(
            value) else None  # fmt: skip

    out: dict[str, Any] = {
        "workers": n,
        "per_host_limit": PER_HOST,
        "concurrent_requests": CONCURRENT,
        "hosts": config.hosts,
        "latency_ms": config.latency_ms,
        "expected_pages": get("banker", n, "expected"),
        "seed": args.seed,
        "heartbeat_s": args.heartbeat,
        "reactor": reactor,
        "repeats": workload.repeats,
        "banker_extra_settings": banker_extra,
    }
    for system in SYSTEMS:
        for w in (1, n):
            out[f"pages_per_s_{system}_{w}w"] = num(get(system, w, "pages_per_s"), 2)
            out[f"pages_per_s_{system}_{w}w_busy"] = num(get(system, w, "pages_per_s_busy"), 2)
        for suffix, key in (("", "pages_per_s"), ("_busy", "pages_per_s_busy")):
            out[f"speedup_{system}_{n}w_vs_1w{suffix}"] = num(
                _common.ratio(get(system, n, key), get(system, 1, key))
            )
    for suffix, key in (("", "pages_per_s"), ("_busy", "pages_per_s_busy")):
        for w in (1, n):
            out[f"speedup_banker_vs_scrapy_redis_{w}w{suffix}"] = num(
                _common.ratio(get("banker", w, key), get("scrapy_redis", w, key))
            )
    out["max_concurrent_per_host_banker"] = get("banker", n, "max_concurrent_per_host")
    out["max_concurrent_per_host_scrapy_redis"] = get("scrapy_redis", n, "max_concurrent_per_host")
    out["max_concurrent_per_host_banker_1w"] = get("banker", 1, "max_concurrent_per_host")
    out["max_concurrent_per_host_scrapy_redis_1w"] = get(
        "scrapy_redis", 1, "max_concurrent_per_host"
    )
    out["lost"] = get("banker", n, "lost")
    out["duplicates"] = get("banker", n, "duplicates")
    out["lost_scrapy_redis"] = get("scrapy_redis", n, "lost")
    out["duplicates_scrapy_redis"] = get("scrapy_redis", n, "duplicates")
    out["lost_1w"] = get("banker", 1, "lost")
    out["lost_scrapy_redis_1w"] = get("scrapy_redis", 1, "lost")
    out["runs"] = {
        name: {k: (num(v) if isinstance(v, float) else v) for k, v in run.items()}
        for name, run in runs.items()
    }

    print(f"{'':<16}{'pages/s wall':>14}{'pages/s busy':>14}{'max/host':>10}{'lost':>6}{'dup':>6}")
    for name, run in runs.items():
        print(
            f"{name:<16}{run['pages_per_s']:>14.1f}{run['pages_per_s_busy']:>14.1f}"
            f"{run['max_concurrent_per_host']:>10}{run['lost']:>6}{run['duplicates']:>6}"
        )
    print(
        f"banker vs scrapy-redis, {n} workers: {out[f'speedup_banker_vs_scrapy_redis_{n}w']}x "
        f"wall, {out[f'speedup_banker_vs_scrapy_redis_{n}w_busy']}x busy; {n} vs 1 workers: "
        f"banker {out[f'speedup_banker_{n}w_vs_1w']}x, scrapy-redis "
        f"{out[f'speedup_scrapy_redis_{n}w_vs_1w']}x (wall)"
    )
    print(
        f"max requests in flight per host with {n} workers (limit {PER_HOST} per worker): "
        f"banker {out['max_concurrent_per_host_banker']}, scrapy-redis "
        f"{out['max_concurrent_per_host_scrapy_redis']}"
    )
    print(f"total time {time.perf_counter() - started:.1f} s")
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
