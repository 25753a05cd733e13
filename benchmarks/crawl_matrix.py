"""Crawls to completion of one finite farm: every scheduler fetches exactly the same pages.

Why: pages/s over a fixed budget (``crawl_skewed.py``) cannot be compared
across schedulers that fetch *different* pages -- a topic-fair scheduler
reaches other pages than a LIFO one.  Here the farm is finite, cross-host
links are off and every crawl runs until the frontier is empty, so the
same set of URLs is fetched by every scheduler (checked against the farm's
own request log) and the time to finish is the whole story.

The matrix:

* hosts ``H`` in {10, 100, 1,000, 5,000} (``--quick``: 10, 100, 1,000),
  Zipf(1)-sized sites (host 0 the largest), three equal-priority topics;
* two latency regimes: ``none`` (the farm answers at once: CPU-bound) and
  ``wan`` (each host answers after a round-trip time drawn from the real
  PlanetLab 490x490 RTT matrix: one random crawler row, one random column
  per host);
* identical settings for every scheduler: ``CONCURRENT_REQUESTS``,
  ``CONCURRENT_REQUESTS_PER_DOMAIN``, the add-on (for the per-topic counters);
* each scheduler under the reactor with which it holds the per-domain limit:
  ``banker`` under Scrapy's default (asyncio) reactor, ``dapq`` and
  ``scrapy_pq`` under epoll; ``dapq_asyncio`` (Scrapy's out-of-the-box
  configuration) is reported too, with the most requests it had in flight
  on one host -- what its speed buys and costs.

Per crawl: wall seconds (process start to exit, minus the measured process
start-up, i.e. Scrapy's ``elapsed_time_seconds``), crawler CPU seconds, the
most requests in flight on one host (the farm's own count), the topic Jain
index over the window in which every topic had work pending, and whether
exactly the expected URLs were fetched.  The physical limit of a crawl
where politeness binds is ``bound_s`` = the largest over hosts of requests x
latency / per-host limit; ``global_bound_s`` (sum over hosts / CONCURRENT_REQUESTS)
is printed next to it.

Usage::

    python benchmarks/crawl_matrix.py --quick
    python benchmarks/crawl_matrix.py --tiny       # smoke test: 10 hosts, 60 pages
    python benchmarks/crawl_matrix.py --hosts 100 --regimes wan --repeats 3

The last stdout line is JSON: ``wall_ratio_banker_vs_dapq_<regime>_<H>``,
``worst_wall_ratio_banker_vs_dapq`` / ``best_...`` (over the matrix), the same
for ``scrapy_pq``, ``bound_s_<regime>_<H>``, ``wall_over_bound_<sched>_<regime>_<H>``,
``worst_wall_over_bound_banker_wan``, ``wall_s_<sched>_<regime>_<H>``,
``cpu_s_<sched>_<regime>_<H>``, ``max_inflight_<sched>_<regime>_<H>``,
``jain_<sched>_<regime>_<H>`` and ``exact`` (every crawl fetched exactly the
expected URLs).
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _common
import _harness
import numpy as np
from _common import ASYNCIO, EPOLL
from crawl_skewed import crawl_farm, crawl_settings, fairness

from scrapy_banker.testing.farm import FarmConfig, FarmModel, WebFarm, load_rtt_matrix

#: name -> (scheduler settings name in _common.SCHEDULERS, reactor)
SCHEDULERS: dict[str, tuple[str, str]] = {
    "banker": ("banker", ASYNCIO),
    "dapq": ("dapq", EPOLL),
    "scrapy_pq": ("scrapy_pq", EPOLL),
    "dapq_asyncio": ("dapq", ASYNCIO),
    "banker_epoll": ("banker", EPOLL),
}
#: Run unless --schedulers says otherwise.
DEFAULT_SCHEDULERS = ("banker", "dapq", "scrapy_pq", "dapq_asyncio")
QUICK_SCHEDULERS = ("banker", "dapq", "scrapy_pq")
FULL_HOSTS = (10, 100, 1_000, 5_000)
QUICK_HOSTS = (10, 100, 1_000)
TINY_HOSTS = (10,)
REGIMES = ("none", "wan")


def host_latencies(hosts: int, seed: int) -> dict[int, float]:
    """Per-host RTT (ms) from the PlanetLab matrix: one crawler row, a random column per host."""
    m = load_rtt_matrix(_harness.RTT_MATRIX)
    rng = np.random.default_rng(seed)
    row = int(rng.integers(m.shape[0]))
    cols = rng.choice([c for c in range(m.shape[0]) if c != row], size=hosts, replace=True)
    return {i: round(float(max(1.0, m[row, c])), 1) for i, c in enumerate(cols)}


def farm_config(hosts: int, pages: int, regime: str, seed: int) -> FarmConfig:
    return FarmConfig(
        seed=seed,
        hosts=hosts,
        total_pages=pages,
        min_pages_per_host=1,
        zipf_s=1.0,
        topics=_common.TOPICS,
        cross_host_link_prob=0.0,
        host_latency_ms=host_latencies(hosts, seed) if regime == "wan" else {},
    )


def bounds(
    model: FarmModel, urls: set[str], per_domain: int, concurrent: int
) -> tuple[float, float]:
    """(per-host bound, global bound) in seconds: the physical limits of one crawl."""
    per_host = Counter(u.split("/")[2].split(":")[0] for u in urls)
    lat = model.config.host_latency_ms
    work = {h: n * lat.get(model.host_index(h) or 0, model.config.latency_ms) / 1000.0
            for h, n in per_host.items()}  # fmt: skip
    return max(work.values()) / per_domain, sum(work.values()) / concurrent


def run_crawl(
    name: str, config: FarmConfig, workdir: Path, concurrent: int, per_domain: int
) -> dict[str, Any]:
    sched, reactor = SCHEDULERS[name]
    settings = crawl_settings(
        sched, workdir / f"{name}-samples.json", concurrent=concurrent, per_domain=per_domain,
        sample_interval=0.25, reactor=reactor,
    )  # fmt: skip
    with WebFarm(config) as farm:
        expected = farm.expected_urls(farm.start_urls())
        crawl, sampled = crawl_farm(name, farm, settings, workdir, timeout=900)
        server = farm.stats()
        model = farm.model
        port = farm.port
    stats = crawl.stats
    fair = fairness(sampled["samples"], math.inf)
    fetched = sum(server.get("per_host", {}).values())
    per_host_bound, global_bound = bounds(model, expected, per_domain, concurrent)
    return {
        "wall_s": float(stats.get("elapsed_time_seconds") or crawl.wall_s),
        "process_s": crawl.wall_s,
        "cpu_s": crawl.cpu_s,
        "responses": int(stats.get("response_received_count", 0)),
        "expected": len(expected),
        "server_requests": fetched,
        "exact": fetched == len(expected) and stats.get("finish_reason") == "finished",
        "max_inflight": max(server.get("max_inflight_per_host", {}).values(), default=0),
        "jain": fair["jain"],
        "jain_window_s": fair["window_s"],
        "bound_s": per_host_bound,
        "global_bound_s": global_bound,
        "port": port,
    }


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, quick="10, 100, 1,000 hosts; 800 pages; 1 run", tiny="")
    parser.add_argument("--hosts", type=int, nargs="*")
    parser.add_argument("--regimes", nargs="*", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--schedulers", nargs="*", choices=list(SCHEDULERS),
                        default=None)  # fmt: skip
    parser.add_argument("--pages", type=int, help="content pages per farm (quick 800, else 1500)")
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--per-domain", type=int, default=4)
    _harness.add_repeats(parser, "crawls per configuration (median; quick 1, else 3)")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    hosts = tuple(args.hosts or _harness.pick(args, full=FULL_HOSTS, quick=QUICK_HOSTS,
                                              tiny=TINY_HOSTS))  # fmt: skip
    repeats = args.repeats or _harness.pick(args, full=3, quick=1, tiny=1)
    args.pages = args.pages or _harness.pick(args, full=1500, quick=800, tiny=60)
    if not args.schedulers:
        schedulers = _harness.pick(
            args, full=DEFAULT_SCHEDULERS, quick=QUICK_SCHEDULERS, tiny=QUICK_SCHEDULERS
        )
        args.schedulers = list(schedulers)
    started = time.monotonic()
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="crawl-matrix-") as tmp:
        for rep in range(repeats):
            for regime in args.regimes:
                for h in hosts:
                    config = farm_config(h, max(args.pages, h), regime, args.seed)
                    for name in args.schedulers:
                        workdir = Path(tmp) / f"{regime}-{h}-{name}-{rep}"
                        workdir.mkdir()
                        r = run_crawl(name, config, workdir, args.concurrent, args.per_domain)
                        runs.setdefault((name, regime, h), []).append(r)
                        print(
                            f"rep {rep + 1} {regime:<4} H={h:>5} {name:<13} "
                            f"wall {r['wall_s']:6.2f} s (bound {r['bound_s']:5.2f}, global "
                            f"{r['global_bound_s']:5.2f}) cpu {r['cpu_s']:6.2f} s  max/host "
                            f"{r['max_inflight']:>2}  jain {r['jain']:.3f}  "
                            f"{r['server_requests']}/{r['expected']} "
                            f"{'exact' if r['exact'] else 'NOT EXACT'}",
                            flush=True,
                        )
    out: dict[str, Any] = {
        "hosts": list(hosts), "regimes": args.regimes, "repeats": repeats,
        "concurrent_requests": args.concurrent, "per_domain": args.per_domain,
        "pages": args.pages,
    }  # fmt: skip

    def med(name: str, regime: str, h: int, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[(name, regime, h)]))

    exact = True
    for (name, regime, h), rs in runs.items():
        tag = f"{name}_{regime}_{h}"
        out[f"wall_s_{tag}"] = round(med(name, regime, h, "wall_s"), 3)
        out[f"cpu_s_{tag}"] = round(med(name, regime, h, "cpu_s"), 3)
        out[f"max_inflight_{tag}"] = max(r["max_inflight"] for r in rs)
        out[f"jain_{tag}"] = _common.finite_or_none(round(med(name, regime, h, "jain"), 4))
        exact = exact and all(r["exact"] for r in rs)
        bound = rs[0]["bound_s"]
        out[f"bound_s_{regime}_{h}"] = round(bound, 3)
        out[f"global_bound_s_{regime}_{h}"] = round(rs[0]["global_bound_s"], 3)
        if bound > 0:
            out[f"wall_over_bound_{tag}"] = round(out[f"wall_s_{tag}"] / bound, 3)
    out["exact"] = exact
    for peer in ("dapq", "scrapy_pq"):
        ratios = []
        for regime in args.regimes:
            for h in hosts:
                if ("banker", regime, h) in runs and (peer, regime, h) in runs:
                    ratio = out[f"wall_s_banker_{regime}_{h}"] / out[f"wall_s_{peer}_{regime}_{h}"]
                    out[f"wall_ratio_banker_vs_{peer}_{regime}_{h}"] = round(ratio, 3)
                    ratios.append(ratio)
        if ratios:
            out[f"worst_wall_ratio_banker_vs_{peer}"] = round(max(ratios), 3)
            out[f"best_wall_ratio_banker_vs_{peer}"] = round(min(ratios), 3)
    over = [v for k, v in out.items() if k.startswith("wall_over_bound_banker_wan_")]
    if over:
        out["worst_wall_over_bound_banker_wan"] = max(over)
    for key, target in (("worst_wall_ratio_banker_vs_dapq", 1.0),
                        ("worst_wall_over_bound_banker_wan", 1.3)):  # fmt: skip
        if key in out:
            verdict = "met" if out[key] <= target else "MISSED"
            print(f"{key}: {out[key]} (target <= {target}: {verdict})")
    out["total_s"] = round(time.monotonic() - started, 1)
    _common.emit_json(out)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
