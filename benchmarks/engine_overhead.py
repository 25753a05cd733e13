"""The frontier's cost inside a real Scrapy engine, without a network: CPU per 1,000 requests.

Why: ``scheduler_ops.py`` times the scheduler alone; a user pays for it inside
Scrapy's engine, next to the middlewares, the dupefilter and the callbacks.
Scrapy's own ``tests/benchmarks`` measure the engine the same way: a download
handler that answers at once, so everything left is CPU spent by Scrapy and
the scheduler.  Each run is a fresh crawler process (``_runner.py``:
``_crawler.EngineSpider``, ``NullHandler`` and ``CpuMarks``) with the real
default middlewares:

* a seed page whose callback yields ``N`` requests over ``H`` hosts
  (``http://h<i % H>.bench/<topic>/p<i>``, topics a/b/c), each page answered
  by the null handler at once;
* by default each request is enqueued once; with ``--links 20`` each page's
  callback yields 20 links, 19 of pages already queued (the dupefilter
  drops them) and one new page whose callback yields nothing -- a crawl
  where most links are seen.

Schedulers, side by side in one run (interleaved, repeats in rotation):

* ``banker`` -- ``SCHEDULER = "scrapy_banker.scheduler.BankerScheduler"``
  alone: the frontier's own overhead, what DAPQ is compared with;
* ``banker_addon`` -- ``ADDONS = {"scrapy_banker.Addon": 500}``, nothing else:
  what a user gets from the README's one line (scheduler, topic-tagging and
  counting middlewares, extensions);
* ``banker_topics`` -- the add-on with three topics, URL rules and Banker's
  admission (every request needs one unit of a 16-unit resource);
* ``dapq`` -- Scrapy's scheduler with ``DownloaderAwarePriorityQueue``;
* ``scrapy_pq`` -- Scrapy's scheduler with ``ScrapyPriorityQueue``.

CPU is the crawler process's user+system time from ``spider_opened`` to
``spider_closed``.  A run that hits ``--max-seconds`` (DAPQ scans every slot
on each pop: at 100,000 hosts a full run would take an hour) is *truncated*:
its cost is the fan-out's share (CPU until the seed callback has queued all
``N`` requests, divided by ``N``) plus the steady cost per response after it,
which is exactly total / requests for a complete run.

Usage::

    python benchmarks/engine_overhead.py --quick     # H = 10, 1,000, 10,000; N = 4,000; 1 repeat
    python benchmarks/engine_overhead.py             # H to 100,000; N = max(10,000, H); 3 runs
    python benchmarks/engine_overhead.py --profile banker --hosts 1000   # cProfile one run
    python benchmarks/engine_overhead.py --tiny      # smoke test: H = 10, 100; N = 300

Last stdout line: JSON with ``cpu_per_1k_<sched>_<H>`` (CPU seconds per 1,000
requests, median of the repeats), ``cpu_ratio_<banker variant>_vs_dapq_<H>``,
``gc_per_1k_<sched>_<H>`` (the part of it the garbage collector took),
``worst_cpu_ratio_banker_vs_dapq`` (max over H; the issue's target is <= 1.05),
``worst_cpu_ratio_banker_addon_vs_dapq`` and ``..._banker_topics_...``
and ``truncated`` (the runs that hit the time cap).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import _harness

SCHEDULERS = ("banker", "banker_addon", "banker_topics", "dapq", "scrapy_pq")
TINY_HOSTS = (10, 100)
QUICK_HOSTS = (10, 1_000, 10_000)
FULL_HOSTS = (10, 1_000, 10_000, 100_000)
TOPICS = ("a", "b", "c")


def scheduler_settings(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings, request meta) of one scheduler under test."""
    if name == "banker":
        return dict(_common.SCHEDULERS["banker"]), {}
    if name == "banker_addon":
        return {"ADDONS": {"scrapy_banker.Addon": 500}}, {}
    if name == "banker_topics":
        return {
            "ADDONS": {"scrapy_banker.Addon": 500},
            "BANKER_TOPICS": dict.fromkeys(TOPICS, 0),
            "BANKER_TOPIC_RULES": [{"url": f"/{t}/", "topic": t} for t in TOPICS],
            "BANKER_RESOURCES": {"conn": 16},
        }, {"banker_need": {"conn": 1}}
    return dict(_common.SCHEDULERS[name]), {}


def crawl_engine(
    label: str,
    settings: dict[str, Any],
    workdir: Path,
    *,
    hosts: int,
    requests: int,
    links: int = 0,
    meta: dict[str, Any] | None = None,
    max_seconds: float,
    profile: bool | str = False,
) -> dict[str, Any]:
    """One crawl of the fan-out with a null download handler, in its own process.

    Returns the crawler's CPU seconds at ``open``, after the ``fanout`` (when
    it was reached) and at ``close``, the responses at the fan-out and at the
    close, the finish ``reason`` and the final ``stats``.
    """
    spec = _harness.crawl_spec(
        "_crawler:EngineSpider",
        {
            "DOWNLOAD_HANDLERS": {"http": "_crawler.NullHandler", "https": "_crawler.NullHandler"},
            "ROBOTSTXT_OBEY": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "ERROR",
            **_common.DUPEFILTER,
            "CLOSESPIDER_TIMEOUT": max_seconds,
            **settings,
        },
        spider_kwargs={"requests": requests, "hosts": hosts, "links": links,
                       "topics": list(TOPICS), "meta": meta or {}},
        extensions=["_crawler.CpuMarks"],
    )  # fmt: skip
    spec["profile"] = bool(profile)
    if isinstance(profile, str):
        spec["profile_out"] = str(Path(profile).resolve())
    run = _harness.crawl(spec, workdir, label, timeout=max_seconds * 3 + 120, cwd=workdir,
                         env={"PYTHONHASHSEED": "0"})  # fmt: skip
    if profile:
        print(run.stderr, file=sys.stderr)
    stats = run.stats
    return {
        "open": stats["bench/cpu_open"],
        "fanout": stats.get("bench/cpu_fanout"),
        "fanout_responses": stats.get("bench/responses_fanout", 0),
        "close": stats["bench/cpu_close"],
        "responses": stats["bench/responses_close"],
        "reason": stats["finish_reason"],
        "stats": stats,
    }


def run_once(
    name: str,
    hosts: int,
    requests: int,
    links: int,
    max_seconds: float,
    profile: bool | str = False,
) -> dict[str, Any]:
    settings, meta = scheduler_settings(name)
    with tempfile.TemporaryDirectory() as tmp:
        marks = crawl_engine(
            f"{name}-{hosts}", settings, Path(tmp), hosts=hosts, requests=requests, links=links,
            meta=meta, max_seconds=max_seconds, profile=profile,
        )  # fmt: skip
    opened_cpu, close_cpu, responses = marks["open"], marks["close"], marks["responses"]
    expected = 1 + requests * (2 if links else 1)
    truncated = marks["reason"] != "finished" or responses < expected
    if marks["fanout"] is not None and truncated:
        fan_cpu, fan_responses = marks["fanout"], marks["fanout_responses"]
        after = max(1, responses - fan_responses)
        per_request = (fan_cpu - opened_cpu) / requests + (close_cpu - fan_cpu) / after
    else:
        per_request = (close_cpu - opened_cpu) / max(1, responses)
    return {
        "cpu_per_1k": per_request * 1000,
        "cpu_s": close_cpu - opened_cpu,
        "responses": responses,
        "expected": expected,
        "truncated": truncated,
        "finish_reason": marks["reason"],
        "max_inflight": marks["stats"].get("banker/queue/blocked_skips"),
        "gc_per_1k": marks["stats"].get("bench/gc_s", 0.0) * 1000 / max(1, responses),
    }


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, quick="H = 10, 1,000, 10,000; N = 4,000; 1 repeat", tiny="")
    parser.add_argument("--hosts", type=int, nargs="*")
    parser.add_argument(
        "--requests", type=int, help="fan-out size (quick 4,000, else 10,000; at least H)"
    )
    parser.add_argument("--links", type=int, default=0)
    _harness.add_repeats(parser, "runs per scheduler and H (median; quick 1, else 3)")
    parser.add_argument("--max-seconds", type=float, default=90.0)
    parser.add_argument("--schedulers", nargs="*", default=list(SCHEDULERS))
    parser.add_argument("--profile", choices=SCHEDULERS)
    parser.add_argument("--profile-out", help="with --profile: save the pstats here (H appended)")
    args = parser.parse_args(argv)
    hosts = tuple(args.hosts or _harness.pick(args, full=FULL_HOSTS, quick=QUICK_HOSTS,
                                              tiny=TINY_HOSTS))  # fmt: skip
    args.requests = args.requests or _harness.pick(args, full=10_000, quick=4_000, tiny=300)
    repeats = args.repeats or _harness.pick(args, full=3, quick=1, tiny=1)
    if args.profile:
        for h in hosts:
            out = f"{args.profile_out}.{h}" if args.profile_out else True
            r = run_once(args.profile, h, max(args.requests, h), args.links, args.max_seconds, out)
            print(json.dumps(r))
        return 0
    started = time.monotonic()
    results: dict[str, dict[int, list[dict[str, Any]]]] = {s: {h: [] for h in hosts}
                                                            for s in args.schedulers}  # fmt: skip
    for rep in range(repeats):
        for h in hosts:
            n = max(args.requests, h)
            for name in args.schedulers:
                r = run_once(name, h, n, args.links, args.max_seconds)
                results[name][h].append(r)
                print(
                    f"rep {rep + 1} H={h:>6} N={n:>6} {name:<14} {r['cpu_per_1k']:7.3f} s/1k "
                    f"(GC {r['gc_per_1k']:.3f}; {r['responses']} responses"
                    f"{', truncated' if r['truncated'] else ''})",
                    flush=True,
                )
    out: dict[str, Any] = {"links": args.links, "repeats": repeats, "hosts": list(hosts)}
    truncated = []
    for name in args.schedulers:
        for h in hosts:
            runs = results[name][h]
            median = statistics.median(r["cpu_per_1k"] for r in runs)
            out[f"cpu_per_1k_{name}_{h}"] = round(median, 4)
            out[f"gc_per_1k_{name}_{h}"] = round(statistics.median(r["gc_per_1k"] for r in runs), 4)
            if any(r["truncated"] for r in runs):
                truncated.append(f"{name}_{h}")
    for name in ("banker", "banker_addon", "banker_topics"):
        if name not in args.schedulers or "dapq" not in args.schedulers:
            continue
        worst = 0.0
        for h in hosts:
            ratio = _common.ratio(out[f"cpu_per_1k_{name}_{h}"], out[f"cpu_per_1k_dapq_{h}"])
            out[f"cpu_ratio_{name}_vs_dapq_{h}"] = round(ratio, 4)
            worst = max(worst, ratio)
        out[f"worst_cpu_ratio_{name}_vs_dapq"] = round(worst, 4)
        print(f"worst CPU ratio {name} vs DAPQ: {worst:.3f}"
              + (f" (target <= 1.05: {'met' if worst <= 1.05 else 'MISSED'})"
                 if name == "banker" else ""))  # fmt: skip
    out["truncated"] = truncated
    out["total_s"] = round(time.monotonic() - started, 1)
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
