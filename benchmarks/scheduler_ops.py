"""Raw scheduler speed: enqueue + dequeue operations per second, three schedulers side by side.

Why: a scheduler's own CPU cost is paid once per request and grows with the
number of domains it juggles.  Scrapy's ``DownloaderAwarePriorityQueue``
(DAPQ) keeps one queue per download slot and, on *every* pop, asks the
downloader how busy each slot is and scans all of them -- O(domains) per
request, which dominates broad crawls with tens of thousands of domains.
``ScrapyPriorityQueue`` is O(1) per operation but blind to domains (see
``crawl_skewed.py`` for what that costs in a real crawl).  The issue asks the
BankerScheduler to be >= 10x DAPQ and >= 0.5x ScrapyPriorityQueue here.

What is measured, identically for every scheduler:

* one request stream: ``R`` unique URLs ``http://d<i>.example/<topic>/<k>.html``
  over ``D`` domains -- every domain gets one request, the remaining
  ``R - D`` follow a Zipf(1) law over the domains (a few big sites, a long
  tail), shuffled with a fixed seed;
* a scheduler freshly built the way Scrapy's engine builds it
  (``build_from_crawler(load_object(SCHEDULER), crawler)``) on a crawler from
  ``scrapy.utils.test.get_crawler``, with Scrapy's ``RFPDupeFilter`` for all,
  so fingerprinting costs are equal;
* a stand-in engine holding Scrapy's real ``Downloader``, with an idle slot
  (no active request) for every domain -- the standard "all slots free" situation, in which DAPQ
  scans all its slot queues on each pop;
* ``enqueue_request`` for all ``R`` requests, then ``next_request`` until it
  returns ``None``; ``ops/s = (enqueues + dequeues) / seconds``
  (``time.perf_counter``, cyclic GC paused as ``timeit`` does), best of 3.

Only the public scheduler contract is used (``from_crawler``, ``open``,
``enqueue_request``, ``next_request``, ``has_pending_requests``, ``close``,
``__len__``), so the benchmark survives rewrites of the scheduler internals.

A repeat that lasts longer than ``--long-run`` seconds is not repeated (its
timer noise is negligible, and DAPQ at 10,000 domains takes 25-40 s a run).  A
dequeue phase that exceeds ``--max-seconds`` (checked every 64 pops) is stopped
and its rate is *projected* from the pops done so far (marked ``truncated``);
for DAPQ, whose pops get cheaper as slot queues empty, the projection
under-estimates it (at 100,000 domains a full drain would take hours).

Usage::

    python benchmarks/scheduler_ops.py --quick          # 10,000 domains, ~1 minute
    python benchmarks/scheduler_ops.py                  # 100 ... 100,000 domains
    python benchmarks/scheduler_ops.py --domains 200 --requests 2000

The last stdout line is a JSON object with ``banker_ops_per_s``,
``scrapy_pq_ops_per_s``, ``dapq_ops_per_s``, ``ratio_banker_vs_dapq``,
``ratio_banker_vs_scrapy_pq``, ``domains``, ``requests`` (for the 10,000-domain
case, or the last one measured if 10,000 is not among them) and, with more
than one domain count, ``by_domains`` (keyed by the domain count as a string);
``truncated`` lists the schedulers whose figure is a projection.  It exits
non-zero if a scheduler loses or invents requests.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import itertools
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import _common
import _harness
from scrapy import Request, Spider
from scrapy.core.downloader import Downloader, Slot
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

FULL_DOMAINS = (100, 1_000, 10_000, 100_000)
QUICK_DOMAINS = (10_000,)
HEADLINE_DOMAINS = 10_000
SEED = 20240611

#: Settings every scheduler gets.  CONCURRENT_REQUESTS_PER_DOMAIN only sizes the
#: fake slots (schedulers that read ``slot.concurrency`` see a realistic value).
COMMON_SETTINGS: dict[str, Any] = {
    **_common.DUPEFILTER,
    **_common.TOPIC_SETTINGS,
    "CONCURRENT_REQUESTS": 32,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
    "LOG_LEVEL": "WARNING",
    # Nothing is downloaded: don't build download handlers (some need a
    # running reactor or event loop, which this benchmark does not start).
    "DOWNLOAD_HANDLERS": {"http": None, "https": None},
}


def make_downloader(crawler: Crawler, slot_keys: Sequence[str]) -> Downloader:
    """Scrapy's own ``Downloader``, every slot created up front and idle.

    Creating the slots here (instead of through ``_get_slot``) keeps the
    downloader from starting its slot garbage-collection loop, which would
    need a running reactor; everything the schedulers read -- ``slots``,
    ``get_slot_key``, ``active``, per-slot concurrency -- is the real thing.
    """
    downloader = Downloader(crawler)
    for key in slot_keys:
        downloader.slots[key] = Slot(downloader.domain_concurrency, 0.0, 0.0)
    return downloader


class FakeEngine:
    """``crawler.engine`` as far as schedulers and priority queues look at it."""

    def __init__(self, crawler: Crawler, downloader: Downloader) -> None:
        self.crawler = crawler
        self.downloader = downloader
        self.paused = False

    def needs_backout(self) -> bool:
        return self.downloader.needs_backout()


@dataclass
class Measurement:
    """One enqueue-all / dequeue-all run of one scheduler."""

    enqueued: int
    dequeued: int
    enqueue_s: float
    dequeue_s: float
    truncated: bool

    @property
    def ops_per_s(self) -> float:
        """(enqueues + dequeues) / seconds; projected for a truncated dequeue phase."""
        if not self.truncated:
            return (self.enqueued + self.dequeued) / (self.enqueue_s + self.dequeue_s)
        per_pop = self.dequeue_s / max(self.dequeued, 1)
        return 2 * self.enqueued / (self.enqueue_s + per_pop * self.enqueued)

    @property
    def seconds(self) -> float:
        return self.enqueue_s + self.dequeue_s


def make_urls(domains: int, requests: int, seed: int = SEED) -> list[str]:
    """The shared request stream: every domain once, the rest Zipf(1), shuffled.

    Giving every domain at least one request makes ``domains`` the real
    number of slot queues a per-domain scheduler holds; the Zipf tail makes
    a few domains big, as in real crawls.  URLs are unique (``k`` is the
    request's index), so the dupefilter passes all of them.
    """
    if requests < domains:
        raise ValueError(f"--requests ({requests}) must be >= the number of domains ({domains})")
    rng = random.Random(seed)
    cum_weights = list(itertools.accumulate(1.0 / rank for rank in range(1, domains + 1)))
    owners = list(range(domains))
    owners += rng.choices(range(domains), cum_weights=cum_weights, k=requests - domains)
    rng.shuffle(owners)
    topics = _common.TOPICS
    return [f"http://d{d}.example/{topics[k % len(topics)]}/{k}.html" for k, d in enumerate(owners)]


def _settle(result: object, what: str) -> None:
    """Wait for the result of ``open``/``close``; there is no reactor, so it must be ready now."""
    if result is None:
        return
    if isinstance(result, Deferred):
        outcome: list[object] = []
        result.addBoth(outcome.append)
        if not outcome:
            raise RuntimeError(f"{what} returned a Deferred that needs a reactor to fire")
        if isinstance(outcome[0], Failure):
            outcome[0].raiseException()
        return
    if inspect.iscoroutine(result):
        try:
            result.send(None)
        except StopIteration:
            return
        result.close()
        raise RuntimeError(f"{what} is a coroutine that waits for a reactor/event loop")


def measure(
    name: str, urls: Sequence[str], slot_keys: Sequence[str], max_seconds: float
) -> Measurement:
    """Build ``name``'s scheduler afresh, enqueue every URL, dequeue until empty."""
    crawler = get_crawler(Spider, {**COMMON_SETTINGS, **_common.SCHEDULERS[name]})
    crawler.spider = Spider.from_crawler(crawler, "scheduler_ops")
    downloader = make_downloader(crawler, slot_keys)
    crawler.engine = FakeEngine(crawler, downloader)  # type: ignore[assignment]
    scheduler = build_from_crawler(load_object(crawler.settings["SCHEDULER"]), crawler)
    _settle(scheduler.open(crawler.spider), f"{name}: open()")
    # Fresh Request objects for every run: fingerprints are cached per request.
    requests = [Request(u) for u in urls]
    enqueue = scheduler.enqueue_request
    dequeue = scheduler.next_request
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        enqueued = sum(1 for r in requests if enqueue(r))
        t1 = time.perf_counter()
        deadline = t1 + max_seconds
        dequeued = 0
        truncated = False
        while True:
            if dequeue() is None:
                break
            dequeued += 1
            if not dequeued & 63 and time.perf_counter() > deadline:
                truncated = True
                break
        t2 = time.perf_counter()
    finally:
        gc.enable()
    problems = []
    if enqueued != len(requests):
        problems.append(f"accepted {enqueued} of {len(requests)} unique requests")
    if truncated:
        if len(scheduler) != enqueued - dequeued or not scheduler.has_pending_requests():
            problems.append(f"len()={len(scheduler)} after {dequeued} of {enqueued} dequeues")
    else:
        if dequeued != enqueued:
            problems.append(f"dequeued {dequeued} requests but enqueued {enqueued}")
        if len(scheduler) != 0 or scheduler.has_pending_requests():
            problems.append(f"still reports {len(scheduler)} pending requests once drained")
    _settle(scheduler.close("finished"), f"{name}: close()")
    if problems:
        raise SystemExit(f"scheduler_ops: {name}: " + "; ".join(problems))
    return Measurement(enqueued, dequeued, t1 - t0, t2 - t1, truncated)


def bench_domains(
    domains: int, requests: int, repeats: int, long_run: float, max_seconds: float
) -> dict[str, Measurement]:
    """Best-of-``repeats`` for each scheduler, rounds interleaved to spread drift evenly."""
    urls = make_urls(domains, requests)
    slot_keys = [f"d{i}.example" for i in range(domains)]
    best: dict[str, Measurement] = {}
    done: set[str] = set()
    for round_ in range(repeats):
        for name in _common.SCHEDULERS:
            if name in done:
                continue
            m = measure(name, urls, slot_keys, max_seconds)
            print(
                f"  D={domains:>7,} R={requests:>7,} {name:<9} round {round_ + 1}: "
                f"{m.ops_per_s:>10,.0f} ops/s  (enqueue {m.enqueue_s:.2f} s, "
                f"dequeue {m.dequeue_s:.2f} s{', TRUNCATED' if m.truncated else ''})",
                flush=True,
            )
            if name not in best or m.ops_per_s > best[name].ops_per_s:
                best[name] = m
            if m.seconds > long_run or m.truncated:
                done.add(name)
    return best


def summary(domains: int, requests: int, best: dict[str, Measurement]) -> dict[str, Any]:
    """JSON-ready figures of one domain count."""
    ops = {name: m.ops_per_s for name, m in best.items()}
    return {
        "domains": domains,
        "requests": requests,
        "banker_ops_per_s": round(ops["banker"], 1),
        "scrapy_pq_ops_per_s": round(ops["scrapy_pq"], 1),
        "dapq_ops_per_s": round(ops["dapq"], 1),
        "ratio_banker_vs_dapq": round(_common.ratio(ops["banker"], ops["dapq"]), 4),
        "ratio_banker_vs_scrapy_pq": round(_common.ratio(ops["banker"], ops["scrapy_pq"]), 4),
        "truncated": sorted(n for n, m in best.items() if m.truncated),
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="10,000 domains only (~1 minute)")
    parser.add_argument(
        "--domains", type=int, nargs="+", default=None, help="domain counts to measure"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per run (default max(50000, 2*D))"
    )
    _harness.add_repeats(parser, "best of N (default 3)", default=3)
    parser.add_argument(
        "--long-run",
        type=float,
        default=5.0,
        help="do not repeat a scheduler whose run took longer than this (s)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=90.0,
        help="stop a dequeue phase after this long and project its rate (s)",
    )
    args = parser.parse_args(argv)
    if args.domains is None:
        args.domains = list(_harness.pick(args, full=FULL_DOMAINS, quick=QUICK_DOMAINS))
    if any(d < 1 for d in args.domains):
        parser.error("--domains must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    results: dict[int, dict[str, Any]] = {}
    for domains in args.domains:
        requests = args.requests if args.requests is not None else max(50_000, 2 * domains)
        print(f"D={domains:,} domains, R={requests:,} requests", flush=True)
        best = bench_domains(domains, requests, args.repeats, args.long_run, args.max_seconds)
        results[domains] = summary(domains, requests, best)

    print()
    print(
        f"{'domains':>8} {'requests':>9} {'banker':>11} {'scrapy_pq':>11} {'dapq':>11}"
        f" {'b/dapq':>8} {'b/spq':>7}   ops/s; * = projected from a truncated run"
    )
    for domains, row in results.items():
        marks = {n: "*" if n in row["truncated"] else " " for n in _common.SCHEDULERS}
        print(
            f"{domains:>8,} {row['requests']:>9,}"
            f" {row['banker_ops_per_s']:>10,.0f}{marks['banker']}"
            f" {row['scrapy_pq_ops_per_s']:>10,.0f}{marks['scrapy_pq']}"
            f" {row['dapq_ops_per_s']:>10,.0f}{marks['dapq']}"
            f" {row['ratio_banker_vs_dapq']:>8.2f} {row['ratio_banker_vs_scrapy_pq']:>7.2f}"
        )
    headline_d = HEADLINE_DOMAINS if HEADLINE_DOMAINS in results else args.domains[-1]
    head = results[headline_d]
    print()
    print(f"headline: {headline_d:,} domains, {head['requests']:,} requests")
    print(_common.target_line("banker vs dapq", head["ratio_banker_vs_dapq"], 10))
    print(_common.target_line("banker vs scrapy_pq", head["ratio_banker_vs_scrapy_pq"], 0.5))
    print(f"total time {time.perf_counter() - started:.1f} s")

    out = dict(head)
    if len(results) > 1:
        out["by_domains"] = {str(d): row for d, row in results.items()}
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
