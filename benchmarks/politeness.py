"""Politeness under server pushback: 429 + Retry-After, headerless 429/503, robots.txt Crawl-delay.

Why
    A site that says "slow down" and is not heard blocks the crawler.  This
    benchmark asks, side by side in one run on one web farm, how often each
    scheduler makes the sites refuse it, whether it comes back before the
    ``Retry-After`` it was given or sooner than the ``Crawl-delay`` of the
    site's robots.txt, and what it loses -- on one process and on a fleet
    that loses a worker (``SIGKILL``) and gains one mid-crawl.  The farm
    itself counts every figure: what the sites saw, not what the crawlers
    say they did.

The farm
    ``scrapy_banker.testing.farm`` with :meth:`FarmConfig.with_pushback`:
    ~20 % of the hosts rate-limit (at most 6 requests per sliding 3 s, then
    ``429`` with a ``Retry-After`` of 1-3 s, half of them in delta-seconds,
    half as an HTTP date), ~10 % refuse without announcing a period (every
    other one a headerless ``429`` at that rate, the others ``503`` for 2 s
    of every 10 s), ~10 % serve a robots.txt with ``Crawl-delay: 0.5``.  A
    host's push-back is decided when its request is received; a request
    received inside a ``Retry-After`` period it announced is refused again
    and counted as a violation (the farm's ``PushbackTracker`` says exactly
    when).  ``--quick``: 60 hosts of 34 pages, 16 requests in flight per
    process for 60 hosts, so the sites are pushed hard; the full run: 150
    hosts of 44 pages.

The peers (``<sched>`` in the keys)
    * ``scrapy_default`` -- Scrapy's default scheduler, one process;
    * ``scrapy_default_autothrottle`` -- the same with AutoThrottle on
      (its own defaults: 5 s start delay, target concurrency 1);
    * ``banker_1w`` -- one process with ``ADDONS = {"scrapy_banker.Addon": 500}``;
    * ``scrapy_redis`` -- 4 workers of scrapy-redis's scheduler and dupefilter
      (``scrapy_redis.scheduler.Scheduler``, ``SCHEDULER_PERSIST``);
    * ``banker`` -- 4 workers of ``BankerRedisScheduler`` with the add-on.

    Both fleets lose worker ``w1`` to ``SIGKILL`` once a quarter of the
    expected pages have been served (``--kill-at``) and gain a fifth worker,
    ``w4``, at half of them (``--join-at``; at the latest 15 s after the
    kill), so both pay the same faults at the same stage of their crawl.
    Every crawl runs with ``ROBOTSTXT_OBEY``, ``CONCURRENT_REQUESTS=16`` and
    ``CONCURRENT_REQUESTS_PER_DOMAIN=1`` (``--per-host``; what ``scrapy
    startproject`` writes), ``DOWNLOAD_DELAY=0`` (politeness is the
    scheduler's job here, not a blanket delay), Scrapy's ``RetryMiddleware``
    with its defaults (``429`` and ``503`` retried twice), Scrapy's engine
    heartbeat (5 s) and Twisted's epoll reactor (``--reactor``: under
    Scrapy 2.19's default asyncio reactor the downloader does not hold
    ``CONCURRENT_REQUESTS_PER_DOMAIN``, see ``distributed.py``).  The fleets
    use scrapy-redis's ``RedisSpider`` (start URLs pushed to Redis) tuned as
    in ``distributed.py`` (``_crawler.FleetTuning``); the banker's fault
    timers are scaled to a crawl of a minute, as in ``chaos.py`` (lease TTL
    8 s, node timeout 6 s, heartbeat and reaper 1 s; ``--banker-set``
    changes them).

What is measured (the last stdout line is one JSON object)
    * ``refused_<sched>``: 429/503 the farm answered;
    * ``retry_after_violations_<sched>``: requests a host received before
      the end of the ``Retry-After`` it had announced;
    * ``crawl_delay_violations_<sched>``: requests a Crawl-delay host
      received less than 95 % of its delay after the previous one;
    * ``pages_missing_<sched>``: expected pages (a BFS of the farm's links
      from the host roots) the farm never answered with a page (a URL only
      ever refused is missing);
    * ``wall_s_<sched>``: the crawl's span as the sites saw it, from the
      first request received to the last answer sent (no process start-up,
      no idle-close wait);
    * beside them ``process_wall_s_<sched>`` (first worker start to last
      exit), ``robots_fetches_<sched>``, ``duplicates_<sched>`` (pages
      served more than once), ``max_inflight_per_host_<sched>``,
      ``mean_inflight_<sched>`` (requests in flight at the farm on average
      over the span: the full farm is bound by ``CONCURRENT_REQUESTS``),
      ``refused_ratio_<peer>_vs_<banker>`` and
      ``wall_ratio_<banker>_vs_scrapy_redis``, and ``runs``: each peer's
      details (refusals by kind of host, the farm's counters per host for
      what went wrong, the hosts that finished last, the workers' retry and
      push-back stats, the fault events, and for the banker peers each
      violation the farm named, with the worker that sent it).

    What shapes them: with few hosts per request in flight (``--quick``)
    a crawler that does not listen pushes every host hard and collects
    refusals, and the polite crawl of the throttled hosts (a few pages per
    Retry-After period, one page per Crawl-delay) sets the wall time; with
    many hosts (``--hosts``) Scrapy's default spreads its requests thinly
    enough to be refused less, and the wall time becomes the crawl's
    throughput.  Each run says which hosts finished last and how they push
    back (``last_hosts``).

    ``politeness_bound_s`` (and its host, ``politeness_bound_host``) is the
    least time any crawl that keeps every host's limits can take
    (:func:`politeness_bound_s`); ``wall_over_bound_<sched>`` compares each
    banker peer with its ``bound_s_<sched>``: that bound, or the crawl's
    ``CONCURRENT_REQUESTS`` bound if longer (``concurrency_bound_s``: every
    page and robots.txt at the farm's latency, 16 at a time per process;
    the full farm's 6,000 pages take 38 s at best however polite), plus one
    lease TTL for a fleet whose worker was killed (its leases, the long
    pole's requests among them, wait that long to be fetched again whatever
    the fleet does).  A peer finishing below the politeness bound broke a
    limit.  ``wall_ratio_banker_1w_vs_scrapy_default`` compares one banker
    process with Scrapy's default on the same farm (the issue's target on
    the full farm: at most 1.0).

    Targets, for ``banker`` and ``banker_1w`` each (``target_<what>_<sched>``,
    all of them in ``targets_met``): no Retry-After and no Crawl-delay
    violation and no page missing (through the kill and the join), at least
    10x fewer refusals than ``scrapy_redis`` and than ``scrapy_default``, and
    a wall time no longer than ``scrapy_redis``'s.  With ``--repeats`` > 1
    every figure is the median over the repetitions, the zero targets are
    judged on the worst one (``worst_<key>_<sched>``), and ``runs`` lists
    every repetition's figures.

Usage::

    python benchmarks/politeness.py --quick       # 60 hosts, 2,040 pages, ~3 minutes
    python benchmarks/politeness.py               # 150 hosts, 6,600 pages, ~8 minutes
    python benchmarks/politeness.py --repeats 3   # medians of 3

``--seed`` (farm layout), ``--hosts``, ``--pages``, ``--latency-ms``,
``--per-host``, ``--kill-at``, ``--join-at``, ``--reactor``, ``--only PEER,...`` and
``--banker-set KEY=JSON`` (a setting for both banker peers) override the
mode; ``--keep`` keeps the workers' logs, stats and fetch logs (the path is
on stderr).  Progress goes to stderr, a summary to stdout; ``targets_met``
false is reported, never an exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import shutil
import statistics
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
from _common import log

from scrapy_banker.testing.farm import FarmConfig, FarmModel, RateLimit, WebFarm
from scrapy_banker.testing.redis_server import RedisServer

#: Peers, in the order they run; the fleets are the last two.
PEERS: tuple[str, ...] = (
    "scrapy_default", "scrapy_default_autothrottle", "banker_1w", "scrapy_redis", "banker",
)  # fmt: skip
FLEETS = ("scrapy_redis", "banker")
BANKERS = ("banker_1w", "banker")
#: The peers the banker's refusals are compared with (>= REFUSED_FACTOR x as many).
REFUSED_PEERS = ("scrapy_redis", "scrapy_default")
REFUSED_FACTOR = 10.0
#: Name of the start-URL list the fleets' RedisSpider reads (spider "fleet").
START_URLS_KEY = "fleet:start_urls"
CONCURRENT = 16
#: The fleet's worker killed and the one that joins.
VICTIM, JOINER = "w1", "w4"
#: The banker fleet's fault timers, scaled to a crawl of a minute (as chaos.py's).
BANKER_TIMERS: dict[str, Any] = {
    "BANKER_REDIS_LEASE_TTL": 8.0,
    "BANKER_REDIS_NODE_TIMEOUT": 6.0,
    "BANKER_REDIS_HEARTBEAT": 1.0,
    "BANKER_REDIS_REAP_INTERVAL": 1.0,
}
#: Farm samples (s): progress, and when to kill and join.
SAMPLE_S = 0.25
#: The join happens at the latest this long (s) after the kill.
JOIN_AFTER_KILL_S = 15.0
#: Worker stats summed per run (``downloader/...`` and the push-back and robots.txt keys).
WORKER_STATS = (
    "downloader/response_status_count/200", "downloader/response_status_count/429",
    "downloader/response_status_count/503", "retry/count", "retry/max_reached",
    "banker/pushback/refused", "banker/pushback/retry_after", "banker/pushback/requeued",
    "banker/pushback/dead_lettered", "banker/pushback/hosts_given_up",
    "banker/pushback/held_back", "banker/robots/fetched", "banker/robots/cache_hits",
    "banker/robots/crawl_delay_hosts", "banker/redis/host_states_written",
    "banker/redis/host_states_adopted", "banker/redis/host_states_fenced",
    "banker/redis/fenced_at_send", "banker/redis/redelivered",
)  # fmt: skip
#: Keys judged on the worst repetition as well (their targets are zero).
ZERO_KEYS = ("retry_after_violations", "crawl_delay_violations", "pages_missing")


@dataclass(frozen=True)
class Workload:
    """Size of one benchmark mode."""

    hosts: int
    total_pages: int
    latency_ms: float
    repeats: int
    #: Per-run limit (s): a run still going after it is killed and reported.
    timeout_s: float
    workers: int = 4
    #: CONCURRENT_REQUESTS_PER_DOMAIN of every crawl.
    per_host: int = 1
    zipf_s: float = 0.0
    #: Share of the expected pages served (200) when the victim is killed / the joiner starts.
    kill_at: float = 0.25
    join_at: float = 0.5
    crawl_delay_s: float = 0.5
    #: The rate limit: at most ``rate_requests`` per sliding ``rate_window_s``.
    rate_requests: int = 6
    rate_window_s: float = 3.0
    #: MAX_IDLE_TIME_BEFORE_CLOSE of the fleets' RedisSpider (whole seconds).
    max_idle_s: int = 3

    def farm_config(self, seed: int) -> FarmConfig:
        base = FarmConfig(seed=seed, hosts=self.hosts, total_pages=self.total_pages,
                          zipf_s=self.zipf_s, latency_ms=self.latency_ms)  # fmt: skip
        limit = RateLimit(requests=self.rate_requests, window_s=self.rate_window_s)
        return base.with_pushback(0.2, 0.1, 0.1, rate_limit=limit,
                                  crawl_delay_s=self.crawl_delay_s)  # fmt: skip


QUICK = Workload(hosts=60, total_pages=1800, latency_ms=100.0, repeats=1, timeout_s=240.0)
FULL = Workload(hosts=150, total_pages=6000, latency_ms=100.0, repeats=1, timeout_s=600.0)
TINY = Workload(hosts=20, total_pages=300, latency_ms=50.0, repeats=1, timeout_s=120.0,
                max_idle_s=1)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """What every run of one invocation shares besides the farm."""

    reactor: str
    banker_extra: dict[str, Any]
    keep: bool


def peer_settings(
    peer: str, workload: Workload, opts: Options, redis_url: str, node: str, seeds: int,
    fetch_log: Path,
) -> dict[str, Any]:  # fmt: skip
    """One worker's Scrapy settings; only the scheduler (and AutoThrottle) differ."""
    common: dict[str, Any] = {
        "TWISTED_REACTOR": opts.reactor,
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS": CONCURRENT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": workload.per_host,
        "DOWNLOAD_DELAY": 0,
        "LOG_LEVEL": "INFO",
        "CHAOS_FETCH_LOG": str(fetch_log),
    }
    extensions = ["_crawler.FetchLog"]
    if peer in FLEETS:
        extensions.append("_crawler.FleetTuning")
        common.update({
            "REDIS_URL": redis_url,
            "MAX_IDLE_TIME_BEFORE_CLOSE": workload.max_idle_s,
            "REDIS_START_URLS_BATCH_SIZE": max(1000, 2 * seeds),
        })  # fmt: skip
    # heartbeat_s=None: Scrapy's own engine heartbeat, as users run it.
    common = _harness.with_extensions(common, extensions, heartbeat_s=None)
    if peer == "scrapy_default":
        return {**common, **_common.SCHEDULERS["dapq"]}
    if peer == "scrapy_default_autothrottle":
        return {**common, **_common.SCHEDULERS["dapq"], "AUTOTHROTTLE_ENABLED": True}
    if peer == "banker_1w":
        return _harness.overlaid(
            {**common, "ADDONS": {"scrapy_banker.Addon": 500}}, opts.banker_extra
        )
    if peer == "scrapy_redis":
        return {**common, **_common.SCRAPY_REDIS}
    assert peer == "banker", peer
    return _harness.overlaid({**common, **_common.BANKER_REDIS, **BANKER_TIMERS,
                              "BANKER_REDIS_NODE_ID": node}, opts.banker_extra)  # fmt: skip


# -- one run -----------------------------------------------------------------------------


@dataclass
class Run:
    """One crawl of one peer: its fleet (one worker for a single process) and its faults."""

    peer: str
    workload: Workload
    opts: Options
    farm: Any
    redis_url: str
    workdir: Path
    expected: set[str]
    fleet: Any = None
    seeds: list[str] = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    killed_at: float | None = None
    ok: int = 0
    t0_wall: float = 0.0

    @property
    def is_fleet(self) -> bool:
        return self.peer in FLEETS

    def _start(self, node: str) -> None:
        settings = peer_settings(self.peer, self.workload, self.opts, self.redis_url, node,
                                 len(self.seeds), self.workdir / f"{node}.fetches")  # fmt: skip
        if self.is_fleet:
            self.fleet.start(node, settings, spider="redis")
        else:
            self.fleet.start(node, settings, spider="farm", seeds=self.seeds)

    def start(self) -> None:
        key = START_URLS_KEY if self.is_fleet else None
        self.seeds = _fleet.fresh(self.farm, self.redis_url if self.is_fleet else None, key)
        self.fleet = _fleet.Fleet(self.workdir, timeout_s=self.workload.timeout_s)
        self.t0_wall = time.time()
        for i in range(self.workload.workers if self.is_fleet else 1):
            self._start(f"w{i}")

    def _event(self, kind: str, node: str, now: float) -> None:
        event = {"kind": kind, "worker": node, "t": round(now - self.fleet.t0, 2),
                 "pages_served": self.ok}  # fmt: skip
        self.events.append(event)
        log(f"    t={event['t']:6.1f} {kind} {node} ({self.ok:,}/{len(self.expected):,} pages)")

    def poll(self, now: float) -> bool:
        """Read the farm, kill or add a worker when due; True once every worker has exited."""
        try:
            stats = self.farm.stats()
            self.ok = int(stats["statuses"].get("200", 0))
        except (OSError, RuntimeError, ValueError) as exc:
            log(f"    (farm not read: {exc!r})")
        if self.is_fleet and not self.fleet.all_exited():
            share = self.ok / max(1, len(self.expected))
            if self.killed_at is None and share >= self.workload.kill_at:
                if self.fleet.running(VICTIM):
                    self.fleet.kill(VICTIM)
                    self._event("kill", VICTIM, now)
                self.killed_at = now
            elif (
                self.killed_at is not None
                and JOINER not in self.fleet.workers
                and (share >= self.workload.join_at or now - self.killed_at >= JOIN_AFTER_KILL_S)
            ):
                self._start(JOINER)
                self._event("join", JOINER, now)
        done: bool = self.fleet.poll(now)
        return done

    def result(self) -> dict[str, Any]:
        fleet = self.fleet
        fleet.wait(30)
        stats = self.farm.stats(urls=True)
        fetches: dict[str, int] = stats["fetches"]
        refused_urls: dict[str, int] = stats["refused_urls"]
        # A URL was served when at least one of its fetches was not a refusal.
        answered = {u: n - refused_urls.get(u, 0) for u, n in fetches.items()}
        served = {u for u, n in answered.items() if n > 0}
        missing = sorted(self.expected - served)
        worker_stats = fleet.stats()
        names = list(fleet.workers)
        out: dict[str, Any] = {
            "peer": self.peer,
            "workers": names,
            "refused": int(stats["refused"]),
            "retry_after_violations": int(stats["retry_after_violations"]),
            "crawl_delay_violations": int(stats["crawl_delay_violations"]),
            "pages_missing": len(missing),
            "wall_s": stats["span_s"],
            "process_wall_s": round(fleet.end - fleet.t0, 2),
            "robots_fetches": int(stats["robots_fetches"]),
            "duplicates": sum(n - 1 for u, n in answered.items() if n > 1 and u in self.expected),
            "max_inflight_per_host": max(
                (int(n) for n in stats["max_inflight_per_host"].values()), default=0
            ),
            "mean_inflight": mean_inflight(stats["host_events"]),
            "requests": int(stats["requests"]),
            "expected_pages": len(self.expected),
            "statuses": stats["statuses"],
            "missing_sample": missing[:10],
            "refused_by_kind": self._by_kind(stats["refused_per_host"]),
            "refused_per_host": stats["refused_per_host"],
            "retry_after_races": int(stats.get("retry_after_races", 0)),
            "retry_after_violations_per_host": stats["retry_after_violations_per_host"],
            "crawl_delay_violations_per_host": stats["crawl_delay_violations_per_host"],
            "last_hosts": self._last_hosts(stats["host_done_s"]),
            "events": self.events,
            "exit_codes": dict(zip(names, fleet.exit_codes(), strict=True)),
            "timed_out": fleet.timed_out,
            "finish_reasons": [s.get("finish_reason") for s in worker_stats],
            "worker_stats": {
                key: total for key in WORKER_STATS if (total := _fleet.sum_stat(worker_stats, key))
            },
        }
        if self.peer in BANKERS:
            out["violations"] = self._violations(stats.get("violations", []))
        bad = {n: c for n, c in out["exit_codes"].items() if c != 0 and n != VICTIM}
        if bad or fleet.timed_out:
            fleet.log_tails(self.peer, bad or None)
        return out

    def _by_kind(self, per_host: dict[str, int]) -> dict[str, int]:
        """Counts per host summed by how the host pushes back."""
        kinds = {h: "+".join(p.kinds) for h, p in self.farm.pushback_hosts().items()}
        out: dict[str, int] = {}
        for host, n in per_host.items():
            kind = kinds.get(host, "-")
            out[kind] = out.get(kind, 0) + n
        return dict(sorted(out.items()))

    def _last_hosts(self, done: dict[str, float]) -> list[list[Any]]:
        """The hosts that finished last: [host, s after the first request, how it pushes back]."""
        kinds = {h: "+".join(p.kinds) for h, p in self.farm.pushback_hosts().items()}
        last = sorted(done.items(), key=lambda kv: -kv[1])[:5]
        return [[h, t, kinds.get(h, "-")] for h, t in last]

    def _violations(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The violations the farm named (the first 20), each with the worker that sent
        the request (from the workers' fetch logs) and when, in s since the start."""
        sends: dict[tuple[str, str], list[tuple[float, str]]] = {}
        wanted = {(e["host"], e["path"]) for e in events[:20]}
        for node in self.fleet.workers:
            path = self.workdir / f"{node}.fetches"
            if not path.exists():
                continue
            for line in path.read_text("utf-8").splitlines():
                t, _, url = line.partition(" ")
                host, _, rest = url.partition("://")[2].partition("/")
                key = (host.rsplit(":", 1)[0], "/" + rest)
                if key in wanted:
                    sends.setdefault(key, []).append((float(t), node))
        out = []
        for e in events[:20]:
            before = [s for s in sends.get((e["host"], e["path"]), []) if s[0] <= e["wall"] + 0.01]
            sent = max(before, default=None)
            out.append({
                "kind": e["kind"], "host": e["host"], "path": e["path"],
                "t_s": round(e["wall"] - self.t0_wall, 3), "early_s": e["early_s"],
                "worker": None if sent is None else sent[1],
                "sent_t_s": None if sent is None else round(sent[0] - self.t0_wall, 3),
                # The nodes the farm was told (``X-Banker-Node``), when a run sends it.
                **{k: e[k] for k in ("node", "previous_node", "announced_to") if e.get(k)},
                # When the host received the request before (a Crawl-delay violation).
                **({"previous_t_s": round(e["previous_wall"] - self.t0_wall, 3)}
                   if e.get("previous_wall") else {}),
            })  # fmt: skip
        return out


def mean_inflight(host_events: dict[str, list[list[float]]]) -> float | None:
    """Requests in flight at the farm on average, from its first request received to
    its last answer sent: how well a crawl kept ``CONCURRENT_REQUESTS`` busy (the
    full farm is bound by them)."""
    events = sorted((t, step) for per_host in host_events.values() for t, step in per_host)
    if len(events) < 2:
        return None
    area, level = 0.0, 0
    for (t, step), (t_next, _) in itertools.pairwise(events):
        level += int(step)
        area += level * (t_next - t)
    span = events[-1][0] - events[0][0]
    return round(area / span, 2) if span > 0 else None


def crawl(peer: str, workload: Workload, opts: Options, farm: Any, redis_url: str,
          workdir: Path) -> dict[str, Any]:  # fmt: skip
    """One peer's crawl to completion; its figures."""
    run = Run(peer, workload, opts, farm, redis_url, workdir, farm.expected_urls())
    run.start()
    _fleet.watch([run.poll], SAMPLE_S)
    return run.result()


# -- the report --------------------------------------------------------------------------


def politeness_bound_s(config: FarmConfig, per_host: int) -> tuple[float, str]:
    """The least time a crawl that keeps every host's limits takes, and its host.

    Per host, its pages at what the farm allows: a rate limit of ``r`` per
    ``w`` s serves ``n`` pages in no less than ``(ceil(n / r) - 1) x w``; a
    Crawl-delay ``d`` spaces them ``(n - 1) x d``; any host takes ``n x
    latency / per_host``.  503 bursts only add to it.  No polite crawl can end
    sooner than its largest host's bound; a peer that does broke a limit.
    """
    model = FarmModel(config)
    pages: dict[str, int] = {}
    for url in model.expected_urls(1):
        host = url.split("/")[2].split(":")[0]
        pages[host] = pages.get(host, 0) + 1
    specs = model.pushback_hosts()
    best, where = 0.0, ""
    for host, n in pages.items():
        bound = n * config.latency_ms / 1000.0 / per_host
        spec = specs.get(host)
        if spec is not None and spec.rate_limit is not None:
            limit = spec.rate_limit
            bound = max(bound, (-(-n // limit.requests) - 1) * limit.window_s)
        if spec is not None and spec.crawl_delay_s is not None:
            bound = max(bound, (n - 1) * spec.crawl_delay_s)
        if bound > best:
            best, where = bound, host
    return round(best, 2), where


def concurrency_bound_s(config: FarmConfig, concurrent: int) -> float:
    """The least time ``concurrent`` requests at once take for every page and robots.txt.

    Each request holds one of the process's ``CONCURRENT_REQUESTS`` for at
    least the farm's latency; refusals and retries only add to it.
    """
    model = FarmModel(config)
    pages = sum(1 for _ in model.expected_urls(1))
    return round((pages + config.hosts) * config.latency_ms / 1000.0 / concurrent, 2)


def report(
    runs: dict[str, list[dict[str, Any]]], workload: Workload, config: FarmConfig, args: Any,
    opts: Options,
) -> dict[str, Any]:  # fmt: skip
    kinds: dict[str, int] = {}
    for spec in FarmModel(config).pushback_hosts().values():
        for kind in spec.kinds:
            kinds[kind] = kinds.get(kind, 0) + 1
    first = next(iter(runs.values()))[0]
    out: dict[str, Any] = {
        "mode": _harness.mode(args),
        "seed": args.seed,
        "repeats": workload.repeats,
        "hosts": config.hosts,
        "pushback_hosts": kinds,
        "expected_pages": first["expected_pages"],
        "latency_ms": config.latency_ms,
        "rate_limit": {"requests": workload.rate_requests, "window_s": workload.rate_window_s},
        "crawl_delay_s": workload.crawl_delay_s,
        "workers": workload.workers,
        "concurrent_requests": CONCURRENT,
        "per_host_limit": workload.per_host,
        "reactor": opts.reactor,
        "banker_timers": BANKER_TIMERS,
        "banker_extra_settings": opts.banker_extra,
        "peers": list(runs),
    }
    out["politeness_bound_s"], out["politeness_bound_host"] = politeness_bound_s(
        config, workload.per_host
    )
    out["concurrency_bound_s"] = concurrency_bound_s(config, CONCURRENT)
    keys = ("refused", "retry_after_violations", "crawl_delay_violations", "pages_missing",
            "wall_s", "process_wall_s", "robots_fetches", "duplicates",
            "max_inflight_per_host", "mean_inflight")  # fmt: skip
    for peer, rs in runs.items():
        for key in keys:
            values = [r[key] for r in rs if isinstance(r[key], (int, float))]
            out[f"{key}_{peer}"] = statistics.median(values) if values else None
        for key in ZERO_KEYS:
            out[f"worst_{key}_{peer}"] = max(r[key] for r in rs)
    out["runs"] = {peer: rs if len(rs) > 1 else rs[0] for peer, rs in runs.items()}
    targets: dict[str, bool] = {}
    for b in BANKERS:
        if b not in runs:
            continue
        for key in ZERO_KEYS:
            targets[f"target_{key}_zero_{b}"] = out[f"worst_{key}_{b}"] == 0
        for peer in REFUSED_PEERS:
            if peer in runs:
                mine, theirs = out[f"refused_{b}"], out[f"refused_{peer}"]
                out[f"refused_ratio_{peer}_vs_{b}"] = _common.rounded(
                    _common.ratio(theirs, mine), 2
                )
                targets[f"target_refused_10x_fewer_than_{peer}_{b}"] = (
                    theirs >= REFUSED_FACTOR * mine
                )
        processes = workload.workers if b in FLEETS else 1
        bound = max(out["politeness_bound_s"],
                    concurrency_bound_s(config, CONCURRENT * processes))  # fmt: skip
        if any(e["kind"] == "kill" for r in runs[b] for e in r.get("events", ())):
            # A worker killed mid-crawl holds its leases until they expire:
            # its hosts' requests wait one lease TTL whatever the fleet does.
            ttl = {**BANKER_TIMERS, **opts.banker_extra}["BANKER_REDIS_LEASE_TTL"]
            bound = round(bound + float(ttl), 2)
        out[f"bound_s_{b}"] = bound
        out[f"wall_over_bound_{b}"] = _common.rounded(_common.ratio(out[f"wall_s_{b}"], bound), 3)
        if "scrapy_redis" in runs:
            mine, theirs = out[f"wall_s_{b}"], out["wall_s_scrapy_redis"]
            out[f"wall_ratio_{b}_vs_scrapy_redis"] = _common.rounded(_common.ratio(mine, theirs), 3)
            targets[f"target_wall_le_scrapy_redis_{b}"] = mine is not None and (
                theirs is None or mine <= theirs
            )
    if "banker_1w" in runs and "scrapy_default" in runs:
        mine, theirs = out["wall_s_banker_1w"], out["wall_s_scrapy_default"]
        out["wall_ratio_banker_1w_vs_scrapy_default"] = _common.rounded(
            _common.ratio(mine, theirs), 3
        )
        if out["mode"] == "full":
            targets["target_wall_le_scrapy_default_banker_1w"] = mine is not None and (
                theirs is None or mine <= theirs
            )
    out.update(targets)
    out["targets_met"] = bool(targets) and all(targets.values())
    return out


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="60 hosts, ~3 minutes", tiny="")
    _harness.add_repeats(parser, "runs of each peer (medians); default 1")
    parser.add_argument("--seed", type=int, default=7, help="farm layout seed")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts")
    parser.add_argument("--pages", type=int, default=None, help="farm content pages")
    parser.add_argument("--latency-ms", type=float, default=None, help="farm latency")
    parser.add_argument("--per-host", type=_harness.positive, default=None,
                        help="CONCURRENT_REQUESTS_PER_DOMAIN (default 1)")  # fmt: skip
    parser.add_argument(
        "--kill-at",
        type=float,
        default=None,
        help="share of the pages served when a fleet worker is killed",
    )
    parser.add_argument(
        "--join-at",
        type=float,
        default=None,
        help="share of the pages served when a fleet worker joins",
    )
    parser.add_argument(
        "--reactor",
        default="epoll",
        help="TWISTED_REACTOR: epoll (default), asyncio or an import path",
    )
    parser.add_argument("--only", default="", help="comma-separated peers to run (default all)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the workers' logs, stats and fetch logs"
    )
    _harness.add_settings(parser, "a setting for the banker peers (repeatable)",
                          flag="--banker-set")  # fmt: skip
    args = parser.parse_args(argv)
    only = [p for p in args.only.split(",") if p]
    unknown = sorted(set(only) - set(PEERS))
    if unknown:
        parser.error(f"--only: unknown peers {unknown}; choose among {', '.join(PEERS)}")
    args.peers = [p for p in PEERS if not only or p in only]
    return args


def _summary(out: dict[str, Any]) -> None:
    print(f"{out['hosts']} hosts ({out['pushback_hosts']}), {out['expected_pages']:,} pages at "
          f"{out['latency_ms']:g} ms; {out['repeats']} run(s) of each peer"
          + (" (medians)" if out["repeats"] > 1 else ""))  # fmt: skip
    print(f"{'':<30}{'refused':>9}{'RA viol.':>10}{'CD viol.':>10}{'missing':>9}{'wall s':>8}"
          f"{'robots':>8}{'dups':>6}")  # fmt: skip
    for peer in out["peers"]:
        print(f"{peer:<30}{out[f'refused_{peer}']:>9}{out[f'retry_after_violations_{peer}']:>10}"
              f"{out[f'crawl_delay_violations_{peer}']:>10}{out[f'pages_missing_{peer}']:>9}"
              f"{out[f'wall_s_{peer}'] or float('nan'):>8.1f}{out[f'robots_fetches_{peer}']:>8}"
              f"{out[f'duplicates_{peer}']:>6}")  # fmt: skip
    for key in sorted(k for k in out if k.startswith("target_")):
        print(f"  {key}: {'met' if out[key] else 'MISSED'}")
    print(f"targets met: {out['targets_met']}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    workload = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        repeats="repeats", hosts="hosts", total_pages="pages", latency_ms="latency_ms",
        kill_at="kill_at", join_at="join_at", per_host="per_host",
    )  # fmt: skip
    opts = Options(_common.reactor(args.reactor), _harness.settings(args.banker_set), args.keep)
    _harness.workers_import_benchmarks()  # the workers load _crawler's extensions
    config = workload.farm_config(args.seed)
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        farm = stack.enter_context(WebFarm(config))
        server = stack.enter_context(RedisServer())
        tmp = Path(tempfile.mkdtemp(prefix="politeness-"))
        if not args.keep:
            stack.callback(shutil.rmtree, tmp, True)
        log(f"politeness: {config.hosts} hosts, {len(farm.expected_urls()):,} pages at "
            f"{config.latency_ms:g} ms, {len(farm.pushback_hosts())} pushing back; peers "
            f"{', '.join(args.peers)}; {workload.repeats} run(s) each"
            + (f"; logs kept in {tmp}" if args.keep else ""))  # fmt: skip
        for rep in range(workload.repeats):
            for peer in args.peers:
                log(f"[{rep + 1}/{workload.repeats}] {peer} ...")
                r = crawl(peer, workload, opts, farm, server.url, tmp / f"{peer}-{rep}")
                log(f"    refused {r['refused']}, Retry-After violations "
                    f"{r['retry_after_violations']}, Crawl-delay violations "
                    f"{r['crawl_delay_violations']}, missing {r['pages_missing']}, "
                    f"{r['wall_s']} s (process {r['process_wall_s']} s), robots.txt "
                    f"{r['robots_fetches']}, dups {r['duplicates']}")  # fmt: skip
                runs.setdefault(peer, []).append(r)
    out = report(runs, workload, config, args, opts)
    out["total_s"] = round(time.perf_counter() - started, 1)
    _summary(out)
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
