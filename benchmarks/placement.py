"""A crawler fleet under WAN emulation: does network-aware placement speed up a crawl?

What is measured
    ``--workers`` (6) real worker processes (``_fleet.Fleet``, node ids
    ``n0`` .. ``n5``) crawl one local web farm to completion through one
    ``redis-server`` with ``BankerRedisScheduler``, once per placement
    strategy and repetition, each time from scratch (Redis flushed, farm
    counters reset, same farm, same seeds).  The farm emulates a wide-area
    network: every request carries ``X-Banker-Node: <node id>``
    (``scrapy_banker.testing.wan.NodeHeaderMiddleware``) and the farm delays
    its answer by the round-trip time between that node and the site from
    the PlanetLab matrix ``data/rtt/planetlab-490-t1.tsv.gz`` (490 x 490 ms):
    node ``n<i>`` is one row, farm host ``h`` one column
    (``FarmConfig.node_rows`` / ``host_columns``), times ``latency_scale``.

    Strategies (the settings every worker of a run gets):

    * ``random``: ``BANKER_PLACEMENT = "hash"``, network-blind;
    * ``top1``: each site's partition on the node nearest to it;
    * ``top3``: among the 3 nearest, the least loaded, heaviest partitions
      first (``BANKER_PLACEMENT_TOPK_CHOICE = "least_loaded"``: partitions
      weighed by their backlog in Redis);
    * ``top3_random``: uniformly among the 3 nearest (the GNP paper's Top3,
      ``BANKER_PLACEMENT_TOPK_CHOICE = "random"``);
    * ``hungarian``: batched Hungarian with equal per-node targets on the
      patent's ``(tasks + 1) / (BC + BS)`` cost over measured bandwidth.  A
      node's BS (a 100 KB ``SET`` to a local Redis) dwarfs its BC to a site
      (kB/s for small pages), so this cost barely depends on the site;
    * ``hungarian_rtt``: the same on measured latency
      (``BANKER_PLACEMENT_COST = "latency"``);
    * ``oracle``: ``hungarian_rtt`` fed the TRUE RTTs: before the workers
      start, every node x site RTT the farm will apply is written to
      ``{prefix}:net:rtt:{node}`` and every site's partition to
      ``{prefix}:sites``, as if measured; the workers neither probe
      (``BANKER_PROBE_RATE = 0``) nor measure (``BANKER_NET_MEASURE = False``);
    * ``oracle_top1``: ``top1`` fed the true RTTs.  ``oracle`` balances
      partition *counts*, not pages, so with Zipf-sized sites it may put the
      largest host on a far node; per-host limits, not node capacity, bound
      this crawl, so ``oracle_top1`` is its better bound.

    The measured strategies start network-blind and learn: landmark nodes
    (``BANKER_GNP_LANDMARK`` on n0, n2, n4) probe every site, the others a
    few reference sites, ``--probe-rate`` (20) probes/s per node, GNP
    (``BANKER_GNP_DIMS`` 3) predicts the pairs nobody measured, and the
    planner runs every ``--interval`` (2) s.  Probes (``/robots.txt``, a 404
    on the farm, delayed like any page) are excluded from every page count.

    Join order: workers start one at a time, each once the previous one owns
    partitions in the table in Redis (its join's rebalance done), in an
    order drawn per repetition from ``--seed`` and shared by every strategy
    of that repetition.  Each join rebalances the hash placement, so the
    order decides which node gets the largest site under ``random``, whose
    speed is bimodal over orders; hence the paired ratios below, which
    compare each strategy with ``random`` under the same order.

Workload and layout
    48 Zipf-sized hosts (``s = 1``: 900 content pages, 1,092 URLs, the
    largest host 206 of them), ``CONCURRENT_REQUESTS`` 16,
    ``CONCURRENT_REQUESTS_PER_DOMAIN`` 2.  A host's pages take about
    ``urls / 2 x RTT``, so once the many small hosts are done the crawl is a
    network-bound tail on the few large ones, whose RTT from their owner --
    what placement changes -- decides how long it lasts.  The matrix is
    symmetrised and rows with an RTT above 1 s to anyone are left out;
    nodes are spread with ``--nodes kmedoids`` (k-medoids from a k-means++
    start: one node per region, as an operator would deploy) or
    ``farthest`` (farthest-point selection: the most remote nodes, far from
    nearly every site); hosts are random other columns with finite RTTs to
    every node.  Workers run Twisted's epoll reactor, a 0.5 s engine
    heartbeat (``_crawler.EngineHeartbeat``; see ``distributed.py`` for
    why) and ``BANKER_REDIS_HEARTBEAT`` 0.5 s, on which the placement agent
    publishes measurements and plans; ``_crawler.PlacementTuning`` counts
    each node's responses per site.

    On 2 cores, six Scrapy processes, redis-server and the farm saturate the
    CPU while the workers join and during the crawl's first seconds, and a
    strategy that costs the workers CPU is slowed by it more than on a
    fleet with a machine per node: ``cpu_busy``, ``workers_cpu_s`` and
    ``mean_download_latency_ms`` (next to the emulated ``mean_rtt_ms``) say
    how much.  Fewer ``--pages`` or a larger ``--latency-scale`` make the
    runs more network-bound.

The JSON (last stdout line), per strategy ``<s>`` (``null`` when not run)
    * ``pages_per_s_<s>``: pages fetched / wall time from the first
      worker's start to the last one's exit; ``pages_per_s_busy_<s>``: over
      the busy span (the farm's request counter sampled every 0.2 s, from
      the first sample that saw a request to the last that saw it change);
    * ``mean_rtt_ms_<s>``: mean emulated RTT paid per page (each node's
      responses per site weighted by that pair's RTT);
    * ``lost_<s>`` / ``dup_<s>``: expected pages (a BFS of the farm's links)
      never fetched, fetches beyond the first;
    * ``partitions_moved_<s>``: ``banker/placement/moves`` summed (0 for
      ``random``).

    Ratios of the strategies' median wall pages/s: ``top1_vs_random``,
    ``top3_vs_random``, ``hungarian_vs_random``, ``hungarian_rtt_vs_random``,
    ``oracle_vs_random``, ``hungarian_vs_oracle``, ``hungarian_rtt_vs_oracle``,
    ``top3_vs_oracle``, ``oracle_top1_vs_random``, ``top3_vs_oracle_top1``,
    ``top1_vs_oracle_top1``, ``top3_random_vs_random``, ``top3_vs_top3_random``.
    Paired: ``paired_vs_random`` (per strategy, one ratio per repetition
    against that repetition's ``random`` run), ``top3_vs_random_paired`` and
    ``top3_vs_random_paired_median``; ``join_orders``.  ``targets_met``
    (reported, never asserted): the paired top3 median >= 1.5 and hungarian
    >= 0.9 x oracle (``null`` when one was not run).  Also the layout and
    settings (``workers``, ``hosts``, ``total_pages``, ``expected_pages``,
    ``zipf_s``, ``latency_scale``, ``seed``, ``repeats``, ``strategies``,
    ``node_selection``, ``node_rows``, ``host_columns``,
    ``hosts_nearest_per_node``, ``concurrent_requests``, ``per_host_limit``,
    ``probe_rate``, ``placement_interval_s``, ``reactor``,
    ``extra_settings``), ``mean_rtt_ms_all_pairs``, ``mean_rtt_ms_uniform``
    (what a network-blind placement pays, weighted by the sites' sizes) and
    ``mean_rtt_ms_nearest`` (every site on its nearest node: the floor), and
    ``runs``: each strategy's details (busy span, first response, tail,
    CPU, pages per node, probes, exit codes, join order and times, a
    per-second timeline of the farm's counter).

Usage::

    python benchmarks/placement.py --quick   # random and top3, 5 repetitions (~4 min)
    python benchmarks/placement.py           # every strategy, 3 repetitions (~15 min)
    python benchmarks/placement.py --tiny    # harness smoke test: 3 workers, 8 hosts

``--strategies a,b``, ``--seed``, ``--workers``, ``--repeats``,
``--hosts``, ``--pages``, ``--zipf``, ``--latency-scale``, ``--nodes`` and
``--set KEY=JSON`` (a worker setting for every strategy) override the mode.
Progress goes to stderr, a summary to stdout.  A run that loses pages,
times out or has a worker exit non-zero prints the workers' log tails to
stderr; the JSON is printed all the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import _common
import _fleet
import _harness
import numpy as np
import redis
from _common import log
from _crawler import LATENCY_STAT, SITE_STAT
from scrapy import Request
from scrapy.utils.test import get_crawler

from scrapy_banker.net.gnp import read_rtt_matrix
from scrapy_banker.redis.keys import Keyspace
from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler.netaware import site_of
from scrapy_banker.settings import redis_config
from scrapy_banker.testing.farm import FarmConfig, FarmModel, WebFarm
from scrapy_banker.testing.fleet import FleetSpider
from scrapy_banker.testing.redis_server import RedisServer

STRATEGIES: tuple[str, ...] = (
    "random", "top1", "top3", "top3_random", "hungarian", "hungarian_rtt", "oracle",
    "oracle_top1",
)  # fmt: skip
ORACLES = ("oracle", "oracle_top1")
NODE_HEADER_MW = "scrapy_banker.testing.wan.NodeHeaderMiddleware"
MEASURE_MW = "scrapy_banker.scheduler.netaware.NetworkMeasureMiddleware"
CONCURRENT = 16
PER_HOST = 2
SAMPLE_S = 0.2
#: A started worker that owns no partition after this long: start the next one anyway.
JOIN_TIMEOUT_S = 30.0
#: How often (s) the table is read while a started worker has not joined yet.
JOIN_POLL_S = 0.05
#: Matrix rows with an RTT above this to anyone are left out (broken links).
MAX_RTT_MS = 1000.0
#: Probe URLs (``BANKER_PROBE_PATH``): not pages, excluded from every count.
PROBE_SUFFIX = "/robots.txt"


@dataclass(frozen=True)
class Workload:
    """Size of one benchmark mode."""

    workers: int
    hosts: int
    total_pages: int
    zipf_s: float
    latency_scale: float
    repeats: int
    #: Per-run limit (s): a run still going after it is killed and reported.
    timeout_s: float
    idle_s: float = 1.0
    gnp_dims: int = 3


QUICK = Workload(workers=6, hosts=48, total_pages=900, zipf_s=1.0, latency_scale=1.0,
                 repeats=5, timeout_s=240.0)  # fmt: skip
#: What ``--quick`` runs unless ``--strategies`` says otherwise: the pair the
#: issue's target compares, so that five repetitions (pairs) take ~4 minutes.
QUICK_STRATEGIES: tuple[str, ...] = ("random", "top3")
#: The default mode: the same workload, every strategy, three repetitions.
FULL = replace(QUICK, repeats=3)
TINY = Workload(workers=3, hosts=8, total_pages=60, zipf_s=0.5, latency_scale=0.5,
                repeats=1, timeout_s=60.0, idle_s=0.5, gnp_dims=2)  # fmt: skip


# ---------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """Which matrix row stands for each node and which column for each farm host."""

    node_rows: dict[str, int]
    host_columns: dict[int, int]
    method: str


def _symmetric(m: Any) -> Any:
    both = np.isfinite(m) & np.isfinite(m.T)
    return np.where(both, (m + m.T) / 2.0, np.where(np.isfinite(m), m, m.T))


def _eligible_rows(d: Any) -> Any:
    """Rows measured to every other row, with no RTT above :data:`MAX_RTT_MS`."""
    n = d.shape[0]
    off = np.where(np.eye(n, dtype=bool), 0.0, d)
    ok = np.isfinite(off).all(axis=1) & (np.nan_to_num(off, nan=np.inf) <= MAX_RTT_MS).all(axis=1)
    return np.flatnonzero(ok)


def _farthest(d: Any, rows: Any, k: int, rng: Any) -> list[int]:
    """Farthest-point selection: a random start, then the row farthest from the chosen."""
    chosen = [int(rng.choice(rows))]
    while len(chosen) < k:
        gap = d[np.ix_(rows, chosen)].min(axis=1)
        gap[np.isin(rows, chosen)] = -1.0
        chosen.append(int(rows[int(np.argmax(gap))]))
    return chosen


def _kmedoids(d: Any, rows: Any, k: int, rng: Any, iters: int = 100) -> list[int]:
    """k-medoids (Voronoi iteration) from a k-means++ start over the eligible rows."""
    sub = d[np.ix_(rows, rows)]
    centres = [int(rng.integers(len(rows)))]
    while len(centres) < k:
        weight = sub[:, centres].min(axis=1) ** 2
        weight[centres] = 0.0
        centres.append(int(rng.choice(len(rows), p=weight / weight.sum())))
    for _ in range(iters):
        label = np.argmin(sub[:, centres], axis=1)
        new = []
        for j in range(k):
            members = np.flatnonzero(label == j)
            if members.size == 0:
                new.append(centres[j])
                continue
            new.append(int(members[np.argmin(sub[np.ix_(members, members)].sum(axis=1))]))
        if new == centres:
            break
        centres = new
    return [int(rows[c]) for c in centres]


def choose_layout(m: Any, workers: int, hosts: int, seed: int, method: str) -> Layout:
    """Seeded node rows (spread out) and host columns (finite RTT to every node)."""
    d = _symmetric(m)
    rows = _eligible_rows(d)
    if len(rows) < workers + hosts:
        raise SystemExit(f"the RTT matrix has only {len(rows)} usable rows")
    rng = np.random.default_rng([seed, 0x9E7])
    pick = _kmedoids if method == "kmedoids" else _farthest
    chosen = pick(d, rows, workers, rng)
    taken = set(chosen)
    block = m[np.ix_(chosen, rows)]
    finite = (np.isfinite(block) & (block > 0) & (block <= MAX_RTT_MS)).all(axis=0)
    columns = [int(c) for c, ok in zip(rows, finite, strict=True) if ok and int(c) not in taken]
    if len(columns) < hosts:
        raise SystemExit(f"only {len(columns)} matrix columns can stand for farm hosts")
    picked = rng.choice(columns, size=hosts, replace=False)
    return Layout(
        {f"n{i}": row for i, row in enumerate(chosen)},
        {h: int(c) for h, c in enumerate(picked)},
        method,
    )


# --------------------------------------------------------------------- workers
@dataclass(frozen=True)
class Options:
    """What every run of one invocation shares, besides the farm."""

    workload: Workload
    heartbeat: float
    reactor: str
    probe_rate: float
    interval: float
    extra: dict[str, Any]


def strategy_settings(strategy: str) -> dict[str, Any]:
    """The placement settings that select a strategy."""
    if strategy == "random":
        return {"BANKER_PLACEMENT": "hash"}
    if strategy == "top1":
        return {"BANKER_PLACEMENT": "top1"}
    if strategy in ("top3", "top3_random"):
        return {
            "BANKER_PLACEMENT": "topk",
            "BANKER_PLACEMENT_TOPK": 3,
            "BANKER_PLACEMENT_TOPK_CHOICE": "random"
            if strategy == "top3_random"
            else "least_loaded",
        }
    if strategy == "hungarian":
        return {"BANKER_PLACEMENT": "hungarian", "BANKER_PLACEMENT_COST": "bandwidth"}
    if strategy == "hungarian_rtt":
        return {"BANKER_PLACEMENT": "hungarian", "BANKER_PLACEMENT_COST": "latency"}
    if strategy == "oracle_top1":
        return {
            "BANKER_PLACEMENT": "top1",
            "BANKER_PROBE_RATE": 0,
            "BANKER_NET_MEASURE": False,
        }
    if strategy == "oracle":
        return {
            "BANKER_PLACEMENT": "hungarian",
            "BANKER_PLACEMENT_COST": "latency",
            "BANKER_PROBE_RATE": 0,
            "BANKER_NET_MEASURE": False,
        }
    raise ValueError(f"unknown strategy {strategy!r}")


def worker_settings(strategy: str, redis_url: str, index: int, opts: Options) -> dict[str, Any]:
    """One worker's Scrapy settings; only the placement settings differ between strategies."""
    node = f"n{index}"
    settings = {
        "TWISTED_REACTOR": opts.reactor,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **_common.BANKER_REDIS,
        "REDIS_URL": redis_url,
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": opts.workload.idle_s,
        "CONCURRENT_REQUESTS": CONCURRENT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "DOWNLOADER_MIDDLEWARES": {NODE_HEADER_MW: 50, MEASURE_MW: 60},
        "BANKER_GNP_LANDMARK": index % 2 == 0,
        "BANKER_GNP_DIMS": opts.workload.gnp_dims,
        "BANKER_PROBE_RATE": opts.probe_rate,
        "BANKER_PLACEMENT_INTERVAL": opts.interval,
        **strategy_settings(strategy),
        **opts.extra,
    }
    return _harness.with_extensions(settings, ["_crawler.PlacementTuning"], opts.heartbeat)


def site_partitions(
    seeds: Sequence[str], settings: Mapping[str, Any]
) -> tuple[str, dict[str, int]]:
    """Redis prefix, and each seed's site (netloc) -> partition, as the workers compute them.

    Asks the scheduler itself: its ``classifier`` gives a request's
    queue key hash, the distributed scheduler puts it in partition
    ``hash % BANKER_REDIS_PARTITIONS``, and ``site_of`` names its site.
    """
    banker = {k: v for k, v in settings.items() if k.startswith("BANKER_")}
    crawler = get_crawler(FleetSpider, settings_dict=banker)
    rconfig = redis_config(crawler)
    scheduler = BankerScheduler.from_crawler(crawler)
    assert isinstance(scheduler, BankerScheduler)
    out: dict[str, int] = {}
    for url in seeds:
        request = Request(url)
        key_hash = scheduler.parts.classifier.classify(request).key_hash
        out[site_of(request)] = key_hash % rconfig.partitions
    return rconfig.prefix, out


def seed_oracle(
    client: Any,
    prefix: str,
    partitions: Mapping[str, int],
    true_ms: Mapping[str, Mapping[str, float]],
) -> None:
    """Write the true RTTs and site partitions into Redis as if the fleet had measured them."""
    keys = Keyspace(prefix)
    pipe = client.pipeline(transaction=False)
    for site, partition in partitions.items():
        pipe.hsetnx(keys.sites, str(partition), site)  # first one wins, as published
        pipe.hsetnx(keys.schemes, site, "http")
    for node, row in true_ms.items():
        pipe.hset(keys.rtt(node), mapping={s: repr(ms) for s, ms in row.items()})
    pipe.execute()


def redis_keys(settings: Mapping[str, Any]) -> Any:
    """The :class:`~scrapy_banker.redis.keys.Keyspace` the workers with ``settings`` use."""
    banker = {k: v for k, v in settings.items() if k.startswith("BANKER_")}
    rconfig = redis_config(get_crawler(FleetSpider, settings_dict=banker))
    return Keyspace(rconfig.prefix, rconfig.partitions)


def join_order(seed: int, rep: int, workers: int) -> list[int]:
    """Repetition ``rep``'s order of worker indices, shared by every strategy of it.

    Each join rebalances the hash placement, so the order in which workers
    join decides which node gets which partition -- for ``random``, which
    node gets the largest site.  Seeded per repetition: runs of different
    strategies in one repetition join in the same order and can be compared
    pairwise, and the repetitions sample different orders.
    """
    rng = np.random.default_rng([seed, 0x701, rep])
    return [int(i) for i in rng.permutation(workers)]


def _owns_partitions(client: Any, table_key: str, node: str) -> bool:
    """Whether the stored partition table gives ``node`` at least one partition."""
    raw = client.get(table_key)
    if not raw:
        return False
    try:
        owners = json.loads(raw).get("owners", [])
    except (ValueError, AttributeError):
        return False
    return node in owners


def run_fleet(
    strategy: str,
    farm: Any,
    redis_url: str,
    workdir: Path,
    opts: Options,
    true_ms: Mapping[str, Mapping[str, float]],
    order: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One crawl of the farm by the fleet with one strategy; what the farm and workers saw.

    Workers start one at a time in ``order`` (worker indices; default
    ``0, 1, ...``): each is started once the previous one owns partitions
    in the table in Redis, i.e. once its join's rebalance is done (or after
    :data:`JOIN_TIMEOUT_S`), so the sequence of rebalances -- and with it
    the hash placement -- depends on ``order`` instead of on which process
    happened to start first.
    """
    n_workers = opts.workload.workers
    order = list(range(n_workers)) if order is None else list(order)
    if sorted(order) != list(range(n_workers)):
        raise ValueError(f"join order {order} is not a permutation of 0..{n_workers - 1}")
    settings = [worker_settings(strategy, redis_url, i, opts) for i in range(n_workers)]
    table_key = redis_keys(settings[0]).table
    seeds = _fleet.fresh(farm, redis_url)
    client = redis.Redis.from_url(redis_url)
    if strategy in ORACLES:
        prefix, partitions = site_partitions(seeds, settings[0])
        seed_oracle(client, prefix, partitions, true_ms)
    cpu = _harness.CpuWindow()
    fleet = _fleet.Fleet(workdir, timeout_s=opts.workload.timeout_s)
    watch = _fleet.FarmWatch(farm, fleet.t0, interval=SAMPLE_S)
    pending = list(order)
    joining: list[tuple[str, float]] = []  # (worker started, not joined yet; when)
    joined_s: dict[str, float | None] = {}

    def poll(now: float) -> bool:
        if joining:
            name, since = joining[0]
            if _owns_partitions(client, table_key, name):
                joined_s[name] = round(now - fleet.t0, 3)
                joining.clear()
            elif not fleet.running(name) or now - since > JOIN_TIMEOUT_S:
                joined_s[name] = None
                log(f"!! {strategy}: worker {name} did not join within "
                    f"{now - since:.1f} s; starting the next one anyway")  # fmt: skip
                joining.clear()
        if not joining and pending:
            index = pending.pop(0)
            fleet.start(f"n{index}", settings[index], seeds=seeds)
            joining.append((f"n{index}", time.monotonic()))
        watch.sample(now)
        return bool(fleet.poll(now) and (not pending or fleet.timed_out))

    _fleet.watch([poll], lambda: JOIN_POLL_S if joining else SAMPLE_S)
    client.close()
    names = [f"n{i}" for i in range(n_workers) if f"n{i}" in fleet.workers]
    fleet.wait(30)  # reap, so RUSAGE_CHILDREN counts them
    cpu.stop()
    expected = farm.expected_urls()
    served = _fleet.served(farm, expected, leave_out=lambda url: url.endswith(PROBE_SUFFIX))
    lost = len(served.lost)
    n_pages = served.pages
    wall = fleet.end - fleet.t0
    busy = watch.busy_s
    # The counter includes probes; the busy figure counts pages only.
    busy_pages = n_pages * (watch.last_n - watch.first_n) / watch.last_n if watch.last_n else 0
    worker_stats = fleet.stats(names)
    paid = 0.0
    counted = 0
    latency_sum = 0.0
    per_node_pages: list[int] = []
    for name, s in zip(names, worker_stats, strict=True):
        row = true_ms.get(name, {})
        mine = 0
        for key, value in s.items():
            if key.startswith(SITE_STAT):
                site = key[len(SITE_STAT) :]
                if site in row:
                    paid += row[site] * int(value)
                    counted += int(value)
                mine += int(value)
        per_node_pages.append(mine)
        latency_sum += float(s.get(LATENCY_STAT, 0.0))
    moves_seen = any("banker/placement/moves" in s for s in worker_stats)
    run: dict[str, Any] = {
        "strategy": strategy,
        "pages": n_pages,
        "expected": len(expected),
        "lost": lost,
        "dup": served.duplicates,
        "probes": served.left_out,
        "wall_s": round(wall, 3),
        "busy_s": round(busy, 3),
        "first_response_s": _common.rounded(watch.first_response_s, 3),
        "tail_s": round(fleet.end - watch.last_t, 3),
        "pages_per_s": n_pages / wall if wall > 0 else math.nan,
        "pages_per_s_busy": busy_pages / busy if busy > 0 else math.nan,
        "mean_rtt_ms": paid / counted if counted else math.nan,
        "mean_download_latency_ms": latency_sum / sum(per_node_pages)
        if sum(per_node_pages)
        else math.nan,
        "pages_per_node": per_node_pages,
        "partitions_moved": _fleet.sum_stat(worker_stats, "banker/placement/moves")
        if moves_seen or strategy == "random"
        else None,
        "placement_errors": _fleet.sum_stat(worker_stats, "banker/placement/errors"),
        "rebalance_moves": _fleet.sum_stat(worker_stats, "banker/redis/partitions_moved"),
        "probes_sent": _fleet.sum_stat(worker_stats, "banker/net/probes"),
        "cpu_busy": cpu.busy,
        "workers_cpu_s": round(cpu.children_s, 2),
        "max_concurrent_per_host": served.max_per_host,
        "exit_codes": fleet.exit_codes(names),
        "timed_out": fleet.timed_out,
        "join_order": [f"n{i}" for i in order],
        "joined_s": [joined_s.get(f"n{i}") for i in order],
        "finish_reasons": [s.get("finish_reason") for s in worker_stats],
        "timeline": watch.timeline(),
    }
    fleet.report(strategy, lost)
    return run


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's details with median figures; the worst lost/dup."""
    return _fleet.merge_repeats(
        runs,
        median=("pages_per_s", "pages_per_s_busy", "wall_s", "busy_s", "mean_rtt_ms"),
        worst=("lost", "dup"),
        samples={"pages_per_s_samples": "pages_per_s", "join_orders": "join_order"},
    )


# ------------------------------------------------------------------------- CLI
def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(
        __doc__,
        quick="random and top3 only, 5 paired runs (~4 min)",
        tiny="harness smoke test (3 workers)",
    )
    parser.add_argument("--strategies", default=None,
                        help=f"comma-separated subset of {','.join(STRATEGIES)} (default: "
                        f"all; with --quick: {','.join(QUICK_STRATEGIES)})")  # fmt: skip
    parser.add_argument("--seed", type=int, default=7, help="farm and layout seed")
    parser.add_argument("--workers", type=int, default=None, help="fleet size (>= 2)")
    _harness.add_repeats(parser, "runs per strategy")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts")
    parser.add_argument("--pages", type=int, default=None, help="farm content pages")
    parser.add_argument("--zipf", type=float, default=None, help="host size skew")
    parser.add_argument("--latency-scale", type=float, default=None,
                        help="factor on the matrix RTTs")  # fmt: skip
    parser.add_argument("--nodes", choices=("kmedoids", "farthest"), default="kmedoids",
                        help="how node rows are spread over the matrix")  # fmt: skip
    parser.add_argument("--probe-rate", type=float, default=20.0, help="BANKER_PROBE_RATE")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="BANKER_PLACEMENT_INTERVAL in s")  # fmt: skip
    parser.add_argument("--heartbeat", type=float, default=0.5,
                        help="Scrapy engine heartbeat in s (5 = stock Scrapy)")  # fmt: skip
    parser.add_argument("--reactor", default="epoll",
                        help="TWISTED_REACTOR: epoll, asyncio or an import path")  # fmt: skip
    parser.add_argument("--workdir", default=None,
                        help="keep worker specs, logs and stats here (default: a temporary "
                        "directory, deleted at the end)")  # fmt: skip
    _harness.add_settings(parser, "extra worker setting for every strategy")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 2:
        parser.error("--workers must be >= 2")
    if args.strategies is None:
        args.strategies = ",".join(QUICK_STRATEGIES if args.quick else STRATEGIES)
    args.strategy_list = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategy_list if s not in STRATEGIES]
    if unknown or not args.strategy_list:
        parser.error(f"--strategies: unknown {unknown}; use a subset of {','.join(STRATEGIES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    workload = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        workers="workers", repeats="repeats", hosts="hosts", total_pages="pages",
        zipf_s="zipf", latency_scale="latency_scale",
    )  # fmt: skip
    extra = _harness.settings(args.set)
    reactor = _common.reactor(args.reactor)
    opts = Options(workload, args.heartbeat, reactor, args.probe_rate, args.interval, extra)
    strategies = args.strategy_list
    _harness.workers_import_benchmarks()  # the workers load _crawler's extensions
    m = read_rtt_matrix(_harness.RTT_MATRIX)
    layout = choose_layout(m, workload.workers, workload.hosts, args.seed, args.nodes)
    config = FarmConfig(
        seed=args.seed,
        hosts=workload.hosts,
        total_pages=workload.total_pages,
        zipf_s=workload.zipf_s,
        rtt_matrix=str(_harness.RTT_MATRIX),
        node_rows=layout.node_rows,
        host_columns=layout.host_columns,
        latency_scale=workload.latency_scale,
    )
    model = FarmModel(config)
    counts = model.page_counts()
    nodes = list(layout.node_rows)
    # What the farm will apply: (nodes, hosts) ms, from the farm's own model.
    true = np.array([[model.latency_ms(h, n) for h in range(workload.hosts)] for n in nodes])
    nearest = np.bincount(true.argmin(axis=0), minlength=len(nodes))
    weights = np.array([model.n_urls(h) for h in range(workload.hosts)], dtype=np.float64)
    started = time.perf_counter()
    log(
        f"farm: {config.hosts} hosts, {sum(counts):,} content pages (largest host "
        f"{counts[0]}, smallest {counts[-1]}), RTTs from {_harness.RTT_MATRIX.name} x "
        f"{config.latency_scale:g}; {workload.workers} workers ({args.nodes} rows "
        f"{list(layout.node_rows.values())}), nearest node per host {nearest.tolist()}; "
        f"mean RTT over pairs {true.mean():.1f} ms, to the nearest node "
        f"{true.min(axis=0).mean():.1f} ms; CONCURRENT_REQUESTS={CONCURRENT}, "
        f"CONCURRENT_REQUESTS_PER_DOMAIN={PER_HOST}; strategies {strategies}, "
        f"{workload.repeats} run(s) each; reactor {reactor}; {os.cpu_count()} cores"
        + (f"; extra settings {extra}" if extra else "")
    )
    samples: dict[str, list[dict[str, Any]]] = {}
    join_orders: list[list[str]] = []
    with (
        WebFarm(config) as farm,
        RedisServer() as server,
        tempfile.TemporaryDirectory(prefix="placement-") as scratch,
    ):
        # Site (netloc, as the scheduler names it) of each host, by host index.
        sites = [urlsplit(u).netloc.lower() for u in farm.start_urls()]
        true_ms = {
            n: {site: float(true[i, h]) for h, site in enumerate(sites)}
            for i, n in enumerate(nodes)
        }
        log(f"expected pages (BFS from {len(farm.start_urls())} roots): "
             f"{len(farm.expected_urls()):,}")  # fmt: skip
        tmp = Path(args.workdir) if args.workdir else Path(scratch)
        for rep in range(workload.repeats):
            joins = join_order(args.seed, rep, workload.workers)
            join_orders.append([f"n{i}" for i in joins])
            log(f"repetition {rep + 1}/{workload.repeats}: workers join in the order "
                 f"{', '.join(join_orders[-1])}")  # fmt: skip
            order = strategies if rep % 2 == 0 else strategies[::-1]
            for strategy in order:
                run = run_fleet(strategy, farm, server.url, tmp / f"{strategy}-{rep}",
                                opts, true_ms, joins)  # fmt: skip
                samples.setdefault(strategy, []).append(run)
                log(
                    f"  {strategy:<13} {run['pages']:,} pages, {run['pages_per_s']:6.1f} "
                    f"pages/s wall ({run['wall_s']:.1f} s), {run['pages_per_s_busy']:6.1f} "
                    f"busy ({run['busy_s']:.1f} s; first response {run['first_response_s']} s, "
                    f"tail {run['tail_s']:.1f} s); mean RTT {run['mean_rtt_ms']:.1f} ms "
                    f"(download latency {run['mean_download_latency_ms']:.1f}); lost "
                    f"{run['lost']}, dup {run['dup']}; moved {run['partitions_moved']}, "
                    f"probes {run['probes']}; CPU {run['cpu_busy']:.0%} of all cores, workers "
                    f"{run['workers_cpu_s']:.1f} s; pages per node {run['pages_per_node']}"
                )
    runs = {s: _median_run(r) for s, r in samples.items()}

    def rate(strategy: str) -> float:
        run = runs.get(strategy)
        return float(run["pages_per_s"]) if run is not None else math.nan

    num = _common.rounded
    out: dict[str, Any] = {
        "workers": workload.workers,
        "hosts": workload.hosts,
        "total_pages": workload.total_pages,
        "expected_pages": next(iter(runs.values()))["expected"],
        "zipf_s": workload.zipf_s,
        "latency_scale": workload.latency_scale,
        "seed": args.seed,
        "repeats": workload.repeats,
        "strategies": strategies,
        "node_selection": layout.method,
        "node_rows": layout.node_rows,
        "host_columns": {str(h): c for h, c in layout.host_columns.items()},
        "hosts_nearest_per_node": nearest.tolist(),
        "mean_rtt_ms_all_pairs": num(true.mean(), 2),
        "mean_rtt_ms_nearest": num(float((true.min(axis=0) * weights).sum() / weights.sum()), 2),
        "mean_rtt_ms_uniform": num(float((true.mean(axis=0) * weights).sum() / weights.sum()), 2),
        "concurrent_requests": CONCURRENT,
        "per_host_limit": PER_HOST,
        "probe_rate": args.probe_rate,
        "placement_interval_s": args.interval,
        "reactor": reactor,
        "extra_settings": extra,
    }
    for s in STRATEGIES:
        got = runs.get(s)
        out[f"pages_per_s_{s}"] = num(got["pages_per_s"], 2) if got else None
        out[f"pages_per_s_busy_{s}"] = num(got["pages_per_s_busy"], 2) if got else None
        out[f"mean_rtt_ms_{s}"] = num(got["mean_rtt_ms"], 2) if got else None
        out[f"lost_{s}"] = got["lost"] if got else None
        out[f"dup_{s}"] = got["dup"] if got else None
        out[f"partitions_moved_{s}"] = got["partitions_moved"] if got else None
    for a, b in (("top1", "random"), ("top3", "random"), ("hungarian", "random"),
                 ("hungarian_rtt", "random"), ("oracle", "random"), ("hungarian", "oracle"),
                 ("hungarian_rtt", "oracle"), ("top3", "oracle"),
                 ("oracle_top1", "random"), ("top3", "oracle_top1"),
                 ("top1", "oracle_top1"), ("top3_random", "random"),
                 ("top3", "top3_random")):  # fmt: skip
        out[f"{a}_vs_{b}"] = num(_common.ratio(rate(a), rate(b)))
    # Paired: each run against the random run of its own repetition (same join order).
    paired: dict[str, list[float | None]] = {}
    for s in strategies:
        if s != "random" and "random" in samples:
            paired[s] = [
                num(_common.ratio(a["pages_per_s"], b["pages_per_s"]))
                for a, b in zip(samples[s], samples["random"], strict=True)
            ]
    out["join_orders"] = join_orders
    out["paired_vs_random"] = paired
    top3_pairs = paired.get("top3")
    out["top3_vs_random_paired"] = top3_pairs
    finite_pairs = [r for r in top3_pairs or [] if r is not None]
    out["top3_vs_random_paired_median"] = (
        num(statistics.median(finite_pairs)) if finite_pairs else None
    )
    top3 = out["top3_vs_random_paired_median"]
    hung = out["hungarian_vs_oracle"]
    out["targets_met"] = None if top3 is None or hung is None else bool(top3 >= 1.5 and hung >= 0.9)
    out["runs"] = {name: _common.round_floats(run) for name, run in runs.items()}

    print(f"{'':<14}{'pages/s':>9}{'busy':>8}{'wall s':>8}{'RTT ms':>8}{'lost':>6}{'dup':>5}"
          f"{'moved':>7}{'probes':>8}")  # fmt: skip
    for name, run in runs.items():
        moved = run["partitions_moved"]
        print(
            f"{name:<14}{run['pages_per_s']:>9.1f}{run['pages_per_s_busy']:>8.1f}"
            f"{run['wall_s']:>8.1f}{run['mean_rtt_ms']:>8.1f}{run['lost']:>6}{run['dup']:>5}"
            f"{'-' if moved is None else moved:>7}{run['probes']:>8}"
        )
    print(
        f"mean RTT per page: uniform over nodes {out['mean_rtt_ms_uniform']} ms, nearest node "
        f"{out['mean_rtt_ms_nearest']} ms; hosts nearest to each node {nearest.tolist()}"
    )
    if out["top3_vs_random_paired"] is not None:
        print(f"top3 vs random per repetition (same join order): "
              f"{out['top3_vs_random_paired']}")  # fmt: skip
    for label, key, target in (("top3 vs random (median of pairs)",
                                "top3_vs_random_paired_median", 1.5),
                               ("hungarian vs oracle", "hungarian_vs_oracle", 0.9)):  # fmt: skip
        value = out[key]
        if value is None:
            print(f"{label}: not measured (strategy not run or no pages)")
        else:
            print(_common.target_line(label, value, target))
    for key in ("top1_vs_random", "hungarian_vs_random", "hungarian_rtt_vs_random",
                "oracle_vs_random", "hungarian_rtt_vs_oracle", "top3_vs_oracle",
                "oracle_top1_vs_random", "top3_vs_oracle_top1", "top1_vs_oracle_top1",
                "top3_random_vs_random", "top3_vs_top3_random"):  # fmt: skip
        if out[key] is not None:
            print(f"{key}: {out[key]:.3g}x")
    print(f"total time {time.perf_counter() - started:.1f} s")
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
