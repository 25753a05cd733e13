"""The frontier's cost inside a real Scrapy engine, without a network: CPU per 1,000 requests.

Why: ``scheduler_ops.py`` times the scheduler alone; a user pays for it inside
Scrapy's engine, next to the middlewares, the dupefilter and the callbacks.
Scrapy's own ``tests/benchmarks`` measure the engine the same way: a download
handler that answers at once, so everything left is CPU spent by Scrapy and
the scheduler.  Each run is a fresh ``scrapy`` process (``CrawlerProcess``)
with the real default middlewares:

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

Last stdout line: JSON with ``cpu_per_1k_<sched>_<H>`` (CPU seconds per 1,000
requests, median of the repeats), ``cpu_ratio_<banker variant>_vs_dapq_<H>``,
``worst_cpu_ratio_banker_vs_dapq`` (max over H; the issue's target is <= 1.05),
``worst_cpu_ratio_banker_addon_vs_dapq`` and ``..._banker_topics_...``
and ``truncated`` (the runs that hit the time cap).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

SCHEDULERS = ("banker", "banker_addon", "banker_topics", "dapq", "scrapy_pq")
QUICK_HOSTS = (10, 1_000, 10_000)
FULL_HOSTS = (10, 1_000, 10_000, 100_000)
TOPICS = ("a", "b", "c")

RUNNER = r'''
import json, resource, sys, time
import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import HtmlResponse

cfg = json.loads(sys.argv[1])
N, H, LINKS, TOPICS = cfg["requests"], cfg["hosts"], cfg["links"], cfg["topics"]
BODY = b"<html><body>" + b"x" * 2000 + b"</body></html>"


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class NullHandler:
    lazy = False

    def __init__(self, crawler=None):
        pass

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    async def download_request(self, request):
        return HtmlResponse(request.url, body=BODY, request=request)

    async def close(self):
        pass


class Bench(scrapy.Spider):
    name = "bench"
    marks = {}
    meta = cfg["meta"]

    async def start(self):
        yield scrapy.Request("http://seed.bench/", callback=self.fan_out, dont_filter=True)

    def url(self, i, prefix="p"):
        return f"http://h{i % H}.bench/{TOPICS[i % 3]}/{prefix}{i}"

    def fan_out(self, response):
        meta = self.meta
        for i in range(N):
            yield scrapy.Request(self.url(i), callback=self.page, cb_kwargs={"i": i},
                                 meta=dict(meta))
        self.marks["fanout"] = (cpu(), self.crawler.stats.get_value("response_received_count", 0))

    def page(self, response, i):
        if not LINKS:
            return
        meta = self.meta
        for k in range(1, LINKS):
            yield scrapy.Request(self.url((i * 7 + k) % N), callback=self.page,
                                 cb_kwargs={"i": 0}, meta=dict(meta))
        yield scrapy.Request(self.url(i, "x"), callback=self.leaf, meta=dict(meta))

    def leaf(self, response):
        return None


def opened(spider):
    spider.marks["open"] = (cpu(), 0)


def closed(spider, reason):
    spider.marks["close"] = (cpu(), spider.crawler.stats.get_value("response_received_count", 0))
    spider.marks["reason"] = reason


settings = {
    "DOWNLOAD_HANDLERS": {"http": "__main__.NullHandler", "https": "__main__.NullHandler"},
    "ROBOTSTXT_OBEY": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "ERROR",
    "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    "CLOSESPIDER_TIMEOUT": cfg["max_seconds"],
    **cfg["settings"],
}
process = CrawlerProcess(settings)
crawler = process.create_crawler(Bench)
crawler.signals.connect(opened, signal=signals.spider_opened)
crawler.signals.connect(closed, signal=signals.spider_closed)
if cfg.get("profile"):
    import cProfile, pstats
    prof = cProfile.Profile()
    process.crawl(crawler)
    prof.enable()
    process.start()
    prof.disable()
    st = pstats.Stats(prof, stream=sys.stderr)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats("scrapy_banker|scheduler|pqueues|dupefilter", 40)
else:
    process.crawl(crawler)
    process.start()
print(json.dumps({"marks": Bench.marks, "stats": {
    k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, (int, float))}}))
'''


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


def run_once(
    name: str, hosts: int, requests: int, links: int, max_seconds: float, profile: bool = False
) -> dict[str, Any]:
    settings, meta = scheduler_settings(name)
    cfg = {
        "requests": requests,
        "hosts": hosts,
        "links": links,
        "topics": list(TOPICS),
        "max_seconds": max_seconds,
        "settings": settings,
        "meta": meta,
        "profile": profile,
    }
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bench_engine.py"
        script.write_text(RUNNER)
        proc = subprocess.run(
            [sys.executable, str(script), json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=max_seconds * 3 + 120,
            cwd=tmp,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} H={hosts} failed:\n{proc.stderr[-3000:]}")
    if profile:
        print(proc.stderr, file=sys.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    marks = out["marks"]
    opened_cpu = marks["open"][0]
    close_cpu, responses = marks["close"]
    expected = 1 + requests * (2 if links else 1)
    truncated = marks["reason"] != "finished" or responses < expected
    if "fanout" in marks and truncated:
        fan_cpu, fan_responses = marks["fanout"]
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
        "max_inflight": out["stats"].get("banker/queue/blocked_skips"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hosts", type=int, nargs="*")
    parser.add_argument("--requests", type=int,
                        help="fan-out size (quick 4,000, else 10,000; at least H)")
    parser.add_argument("--links", type=int, default=0)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--max-seconds", type=float, default=90.0)
    parser.add_argument("--schedulers", nargs="*", default=list(SCHEDULERS))
    parser.add_argument("--profile", choices=SCHEDULERS)
    args = parser.parse_args(argv)
    hosts = tuple(args.hosts or (QUICK_HOSTS if args.quick else FULL_HOSTS))
    args.requests = args.requests or (4_000 if args.quick else 10_000)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.profile:
        for h in hosts:
            r = run_once(args.profile, h, max(args.requests, h), args.links, args.max_seconds, True)
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
                    f"({r['responses']} responses{', truncated' if r['truncated'] else ''})",
                    flush=True,
                )
    out: dict[str, Any] = {"links": args.links, "repeats": repeats, "hosts": list(hosts)}
    truncated = []
    for name in args.schedulers:
        for h in hosts:
            runs = results[name][h]
            median = statistics.median(r["cpu_per_1k"] for r in runs)
            out[f"cpu_per_1k_{name}_{h}"] = round(median, 4)
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
