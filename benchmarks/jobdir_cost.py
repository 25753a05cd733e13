"""What a crash-safe JOBDIR costs: CPU per 1,000 requests inside a real engine, and resume time.

Why: with ``JOBDIR`` every request is journaled when it is queued and when
its callback's output has been scheduled (one unbuffered write each), so that
a ``kill -9`` loses nothing.  This measures that price against the memory
frontier and against what Scrapy's own JOBDIR (pickled disk queues, which do
not survive a ``kill -9``) costs, side by side in one run, through a real
Scrapy engine with a download handler that answers at once -- the machinery
of ``engine_overhead.py`` (its runner script is reused as is):

* ``banker_memory`` -- ``BankerScheduler`` without ``JOBDIR``;
* ``banker_jobdir`` -- ``BankerScheduler`` with ``JOBDIR`` (journal);
* ``scrapy_jobdir`` -- Scrapy's scheduler with ``JOBDIR`` (its default
  ``PickleLifoDiskQueue`` disk queues and ``requests.seen``).

CPU is the crawler process's user+system time from ``spider_opened`` to
``spider_closed`` divided by the responses (the seed's callback yields ``N``
requests over ``H`` hosts).  Repeats are interleaved; the median is reported.

The journal's own cost is also timed alone (``E`` + share of a ``D`` line per
request), since the engine runs differ by +-10 % between identical runs.

Resume: a JOBDIR holding ``R`` pending requests is written as the journal a
``kill -9`` leaves (and, in the full run, as the snapshot a clean stop
leaves), and a fresh process times ``BankerScheduler.open`` -- replay,
decode, queue, refill the dupefilter, and after a kill the compaction that
follows.

Usage::

    python benchmarks/jobdir_cost.py --quick    # N = 3,000, H = 100, 3 repeats; R = 10^6 (~2.5 min)
    python benchmarks/jobdir_cost.py            # N = 20,000, 3 repeats; R = 10^6 twice
    python benchmarks/jobdir_cost.py --tiny     # smoke test: N = 300, 1 repeat; R = 2,000

Last stdout line: JSON with ``cpu_per_1k_banker_memory``,
``cpu_per_1k_banker_jobdir``, ``cpu_per_1k_scrapy_jobdir`` (CPU seconds per
1,000 requests), ``jobdir_overhead_ratio`` (banker_jobdir / banker_memory),
``jobdir_vs_scrapy_jobdir_ratio``, ``journal_cpu_us_per_request``,
``resume_s_1e6`` (after a kill: replay + compaction),
``resume_s_1e6_snapshot`` (after a clean stop; full run only), the JOBDIR's
bytes per pending request, and ``total_s``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import _harness
import engine_overhead

VARIANTS: dict[str, dict[str, Any]] = {
    "banker_memory": {"SCHEDULER": "scrapy_banker.scheduler.BankerScheduler"},
    "banker_jobdir": {"SCHEDULER": "scrapy_banker.scheduler.BankerScheduler", "JOBDIR": True},
    "scrapy_jobdir": {"SCHEDULER": "scrapy.core.scheduler.Scheduler", "JOBDIR": True},
}

RESUME = r"""
import json, os, sys, time
from scrapy import Spider
from scrapy.utils.test import get_crawler
from scrapy_banker.scheduler import BankerScheduler


class Bench(Spider):
    name = "bench"

    def page(self, response, i):
        pass


jobdir = sys.argv[1]
crawler = get_crawler(Bench, {"JOBDIR": jobdir, "LOG_LEVEL": "ERROR"})
crawler.spider = Bench.from_crawler(crawler)
scheduler = BankerScheduler.from_crawler(crawler)
t0 = time.perf_counter()
scheduler.open(crawler.spider)
elapsed = time.perf_counter() - t0
assert len(scheduler) == int(sys.argv[2]), len(scheduler)
print(json.dumps({"resume_s": elapsed, "pending": len(scheduler),
                  "stats": {k: v for k, v in crawler.stats.get_stats().items()
                            if k.startswith("banker/jobdir")}}))
"""


def run_engine(name: str, hosts: int, requests: int, max_seconds: float) -> dict[str, Any]:
    """One crawl of ``engine_overhead``'s fan-out with ``name``'s settings."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = dict(VARIANTS[name])
        if settings.pop("JOBDIR", False):
            settings["JOBDIR"] = str(Path(tmp) / "job")
        marks = engine_overhead.crawl_engine(
            name, settings, Path(tmp), hosts=hosts, requests=requests, max_seconds=max_seconds
        )
    responses = marks["responses"]
    return {
        "cpu_per_1k": (marks["close"] - marks["open"]) / max(1, responses) * 1000,
        "responses": responses,
        "complete": marks["reason"] == "finished" and responses == requests + 1,
    }


def write_jobdir(path: Path, pending: int, as_journal: bool) -> int:
    """A JOBDIR with ``pending`` requests, as a clean stop or a kill leaves it; returns bytes.

    One request is encoded by the real codec; the others are that payload
    with their own URL and ``cb_kwargs`` (encoding 10^6 requests would time
    the writer, not the resume).  Fingerprints are distinct 40-hex strings.
    """
    import hashlib

    from scrapy import Request, Spider

    from scrapy_banker.core.hashing import bkdr
    from scrapy_banker.core.journal import enqueue_line, header_line
    from scrapy_banker.scheduler.serialize import RequestCodec

    class Bench(Spider):
        name = "bench"

        def page(self, response: Any, i: int) -> None:
            pass

    spider = Bench()
    template = RequestCodec().encode(
        Request("http://HOST/a/pINDEX", callback=spider.page, cb_kwargs={"i": 987654321}),
        spider,
    )
    banker = path / "banker"
    banker.mkdir(parents=True)
    hosts = 10_000
    with (banker / "snapshot.jsonl").open("w") as snap:
        snap.write(header_line(0, pending, 0 if as_journal else pending, 0, None, None))
        out = (banker / "journal-0.jsonl").open("w") if as_journal else snap
        for i in range(pending):
            host = f"h{i % hosts}.bench"
            payload = (
                template.replace("HOST", host).replace("INDEX", str(i)).replace("987654321", str(i))
            )
            fp = hashlib.sha1(payload.encode()).hexdigest()
            out.write(enqueue_line(i, fp, "default", host, host, bkdr(host), 0, payload))
        if out is not snap:
            out.close()
    return sum(p.stat().st_size for p in banker.iterdir())


def measure_journal(records: int) -> float:
    """CPU microseconds per request of the journal writes alone (enqueue + completion).

    The engine runs above are noisy (+-10 % between runs of the same
    scheduler); this isolates what a request adds with JOBDIR: its ``E``
    line and its share of a ``D`` line (completions batched by 32, as the
    engine finishes them), each an unbuffered ``os.write``.
    """
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from scrapy_banker.scheduler.classifier import Classified
    from scrapy_banker.scheduler.jobdir import JobDir
    from scrapy_banker.scheduler.serialize import RequestCodec

    payload = '{"url":"http://h1.bench/a/p1","callback":"page","cb_kwargs":{"i":1}}'
    c = Classified("default", "h1.bench", "h1.bench", 12345)
    fp = "0" * 40
    with tempfile.TemporaryDirectory() as tmp:
        stats = MemoryStatsCollector(get_crawler())
        jobdir = JobDir(tmp, RequestCodec(), stats)
        os.makedirs(jobdir.path)
        jobdir._open_journal(1)
        t0 = time.process_time()
        for i in range(records):
            jobdir.enqueued(i, fp, c, 0, payload)
            if i % 32 == 31:
                jobdir.done(list(range(i - 31, i + 1)))
        elapsed = time.process_time() - t0
        jobdir.close_journal()
    return elapsed / records * 1e6


def measure_resume(pending: int, as_journal: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job"
        t0 = time.perf_counter()
        size = write_jobdir(job, pending, as_journal)
        written = time.perf_counter() - t0
        script = Path(tmp) / "resume.py"
        script.write_text(RESUME)
        out = _harness.run_json([script, job, str(pending)], what="the resume", timeout=1800)
    out.update(bytes=size, write_s=written)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, quick="N = 3,000; the resume after a kill only", tiny="")
    parser.add_argument("--requests", type=int)
    parser.add_argument("--hosts", type=int, default=100)
    _harness.add_repeats(parser, "crawls per variant (median; default 3)")
    parser.add_argument("--resume-pending", type=int, default=None)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    requests = args.requests or _harness.pick(args, full=20_000, quick=3_000, tiny=300)
    repeats = args.repeats or _harness.pick(args, full=3, quick=3, tiny=1)
    pending = args.resume_pending or _harness.pick(
        args, full=1_000_000, quick=1_000_000, tiny=2_000
    )
    journal_records = _harness.pick(args, full=200_000, quick=200_000, tiny=5_000)
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for rep in range(repeats):
        for name in VARIANTS:
            r = run_engine(name, args.hosts, requests, args.max_seconds)
            runs[name].append(r)
            print(f"rep {rep + 1} {name:<14} {r['cpu_per_1k']:7.3f} s/1k "
                  f"({r['responses']} responses)", flush=True)  # fmt: skip
    out: dict[str, Any] = {"requests": requests, "hosts": args.hosts, "repeats": repeats}
    for name in VARIANTS:
        out[f"cpu_per_1k_{name}"] = round(statistics.median(r["cpu_per_1k"] for r in runs[name]), 4)
    out["incomplete"] = [n for n in VARIANTS if not all(r["complete"] for r in runs[n])]
    out["jobdir_overhead_ratio"] = _common.finite_or_none(
        round(_common.ratio(out["cpu_per_1k_banker_jobdir"], out["cpu_per_1k_banker_memory"]), 4)
    )
    out["jobdir_vs_scrapy_jobdir_ratio"] = _common.finite_or_none(
        round(_common.ratio(out["cpu_per_1k_banker_jobdir"], out["cpu_per_1k_scrapy_jobdir"]), 4)
    )
    out["journal_cpu_us_per_request"] = round(measure_journal(journal_records), 2)
    print(f"journal writes: {out['journal_cpu_us_per_request']} CPU us per request", flush=True)
    suffix = "1e6" if pending == 1_000_000 else str(pending)
    # After a kill (journal replayed, then compacted) -- the case JOBDIR is for;
    # after a clean stop (snapshot only) in the full run.
    cases = [(True, "")] + ([(False, "_snapshot")] if _harness.mode(args) == "full" else [])
    for as_journal, key in cases:
        r = measure_resume(pending, as_journal)
        kind = "journal" if as_journal else "snapshot"
        print(
            f"resume of {pending} pending ({kind}): {r['resume_s']:.1f} s, "
            f"{r['bytes'] / pending:.0f} bytes/request",
            flush=True,
        )  # fmt: skip
        out[f"resume_s_{suffix}{key}"] = round(r["resume_s"], 2)
        out[f"jobdir_bytes_per_request{key}"] = round(r["bytes"] / pending, 1)
    out["total_s"] = round(time.monotonic() - started, 1)
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
