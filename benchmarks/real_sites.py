"""Real documentation sites crawled to completion: scrapy-banker vs Scrapy's default, scrapy-redis.

What is crawled
    Debian's documentation packages (``python-sqlalchemy-doc``,
    ``python-pytest-doc``, ``python-flask-doc``, ...: real Sphinx HTML with
    real, deep link graphs and 10 ms or so of parsing per page) served as they
    are by the web farm's static host kind, one virtual host per package
    (``sqlalchemy.farm.test``...), each answering after a latency taken from
    the real PlanetLab RTT matrix (60 to 150 ms).  Missing packages are
    installed with ``apt-get`` when the machine allows it; otherwise the
    benchmark says why and prints ``{"skipped": ...}``.

    A plain ``CrawlSpider`` (one ``Rule``, a ``LinkExtractor``,
    ``allowed_domains``, every page an item: ``_crawler.DocsSpider``) crawls
    every site to completion, with ``CONCURRENT_REQUESTS=16``,
    ``CONCURRENT_REQUESTS_PER_DOMAIN=4`` and Scrapy's default engine
    heartbeat.

The peers, one at a time on one farm
    * ``dapq_asyncio`` -- Scrapy's default out of the box
      (DownloaderAwarePriorityQueue, the asyncio reactor, which lets a host
      exceed ``CONCURRENT_REQUESTS_PER_DOMAIN``);
    * ``dapq_epoll`` -- the same queue under the epoll reactor, which holds
      the limit;
    * ``banker`` -- scrapy-banker's add-on (Scrapy's default reactor);
    * ``scrapy_redis_<n>w`` / ``banker_<n>w`` -- fleets of ``n`` workers
      (``RedisCrawlSpider``, start URLs pushed to Redis): scrapy-redis's
      scheduler and dupefilter vs ``BankerRedisScheduler``, both under
      Scrapy's default reactor.

What is measured (the last stdout line is one JSON object)
    ``wall_s_<sched>``: the crawl's span as the sites saw it, from the first
    request received to the last answer sent (no process start-up, no
    idle-close wait; medians over ``--repeats``); ``cpu_s_<sched>``: CPU of
    the crawler process(es); ``max_inflight_per_host_<sched>``;
    ``duplicates_<sched>``: fetches beyond the first of a URL;
    ``same_url_set``: every run fetched exactly the same URLs;
    ``distinct_pages``; ``politeness_bound_s`` (largest over hosts of pages x
    latency / per-host limit); ``cpu_bound_s`` (the least crawler CPU among
    the single-node runs, over the crawler processes that can run at once:
    one); ``bound_s`` (the larger); ``wall_over_bound_<peer>`` for every peer
    (a fleet of ``n`` against ``bound_s_<peer>``: the politeness bound or the
    CPU bound over the cores ``n`` processes can use);
    ``wall_ratio_banker_vs_<peer>``; ``inflight_longpole_<sched>``: the
    long-pole host's requests in flight, the farm's 0.25 s samples averaged
    over the first 10 s and over the last quarter of the crawl; and per run
    (``crawler_<sched>``) the crawler's own samples (``_crawler.CrawlSampler``,
    every 0.25 s) summarised: scraper backlog, CPU busy, and how often the
    scheduler answered the engine with nothing.

Usage::

    python benchmarks/real_sites.py --quick          # one run each, ~5 minutes
    python benchmarks/real_sites.py --repeats 3      # medians of 3
    # the second set, which no tuning looked at (its packages installed if missing):
    python benchmarks/real_sites.py --sites scrapy,celery,tornado,cryptography,babel \
        --only banker,dapq_asyncio,dapq_epoll --fleet "" --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import _fleet
import _harness
from _common import ASYNCIO, EPOLL, log

from scrapy_banker.testing.farm import FarmConfig, WebFarm, load_rtt_matrix
from scrapy_banker.testing.redis_server import RedisServer

#: Site name -> (Debian package, its HTML directory).
SITES: dict[str, tuple[str, str]] = {
    "django": ("python-django-doc", "/usr/share/doc/python-django-doc/html"),
    "python": ("python3.11-doc", "/usr/share/doc/python3.11/html"),
    "sqlalchemy": ("python-sqlalchemy-doc", "/usr/share/doc/python-sqlalchemy-doc/html"),
    "pytest": ("python-pytest-doc", "/usr/share/doc/python-pytest-doc/html"),
    "flask": ("python-flask-doc", "/usr/share/doc/python-flask-doc/html"),
    "lxml": ("python-lxml-doc", "/usr/share/doc/python-lxml/html"),
    "werkzeug": ("python-werkzeug-doc", "/usr/share/doc/python-werkzeug-doc/html"),
    "requests": ("python-requests-doc", "/usr/share/doc/python-requests-doc/html"),
    "jinja2": ("python-jinja2-doc", "/usr/share/doc/python-jinja2-doc/html"),
}
#: The default sites: every tuning of the scheduler looked at them.
DEFAULT_SITES = tuple(SITES)
#: A second set no tuning looked at (chosen for #33 before its runs):
#: ``--sites scrapy,celery,tornado,cryptography,babel``.
SITES.update({
    "scrapy": ("python-scrapy-doc", "/usr/share/doc/python-scrapy-doc/html"),
    "celery": ("python-celery-doc", "/usr/share/doc/python-celery-doc/html"),
    "tornado": ("python-tornado-doc", "/usr/share/doc/python-tornado-doc/html"),
    "cryptography": ("python-cryptography-doc", "/usr/share/doc/python-cryptography-doc/html"),
    "babel": ("python-babel-doc", "/usr/share/doc/python-babel-doc/html"),
})  # fmt: skip
PER_HOST = 4
CONCURRENT = 16
SINGLE = ("dapq_asyncio", "dapq_epoll", "banker")
DAPQ = _common.SCHEDULERS["dapq"]
START_URLS_KEY = "docs:start_urls"


def ensure_sites(names: Sequence[str]) -> str | None:
    """Install missing documentation packages; the reason they cannot be, or None."""
    missing = [SITES[n][0] for n in names if not Path(SITES[n][1], "index.html").exists()]
    if not missing:
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"documentation packages {missing} are missing and apt-get cannot install them here"
    log(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", *missing]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(cmd, env=env, capture_output=True)
        if done.returncode != 0:
            return f"apt-get could not install {missing}: {done.stderr.decode()[-500:]}"
    return None


def latencies(sizes: dict[str, int], seed: int) -> dict[str, float]:
    """One RTT per site from the PlanetLab matrix: one crawler row, columns in 60-150 ms.

    The largest site gets the largest of the RTTs drawn, the next largest the
    next, and so on: the biggest site is the farthest, so the crawl has one
    long pole that politeness, not CPU, decides -- the case a scheduler can
    get wrong.
    """
    matrix = load_rtt_matrix(_harness.RTT_MATRIX)
    row = seed % matrix.shape[0]
    cols = [c for c in range(matrix.shape[1]) if 60.0 <= matrix[row, c] <= 150.0]
    step = max(1, len(cols) // max(1, len(sizes)))
    drawn = sorted((round(float(matrix[row, cols[(i * step) % len(cols)]]), 1)
                    for i in range(len(sizes))), reverse=True)  # fmt: skip
    by_size = sorted(sizes, key=lambda n: -sizes[n])
    return dict(zip(by_size, drawn, strict=True))


def html_files(root: str) -> int:
    return sum(1 for _ in Path(root).rglob("*.html"))


@dataclass
class Run:
    name: str
    workers: int
    settings: dict[str, Any]
    spider: str


def single_runs(extra: dict[str, Any]) -> list[Run]:
    base = {"CONCURRENT_REQUESTS": CONCURRENT, "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST}
    return [
        Run("dapq_asyncio", 1, {**base, **DAPQ, "TWISTED_REACTOR": ASYNCIO}, "crawl"),
        Run("dapq_epoll", 1, {**base, **DAPQ, "TWISTED_REACTOR": EPOLL}, "crawl"),
        Run("banker", 1, _harness.overlaid({**base, "ADDONS": {"scrapy_banker.Addon": 500},
                                            "TWISTED_REACTOR": ASYNCIO}, extra), "crawl"),
    ]  # fmt: skip


def fleet_runs(sizes: Sequence[int], extra: dict[str, Any]) -> list[Run]:
    base = {"CONCURRENT_REQUESTS": CONCURRENT, "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
            "TWISTED_REACTOR": ASYNCIO, "MAX_IDLE_TIME_BEFORE_CLOSE": 3}  # fmt: skip
    out = []
    for n in sizes:
        out.append(Run(f"scrapy_redis_{n}w", n, {**base, **_common.SCRAPY_REDIS}, "rediscrawl"))
        banker = _harness.overlaid({**base, **_common.BANKER_REDIS}, extra)
        out.append(Run(f"banker_{n}w", n, banker, "rediscrawl"))
    return out


def crawl(run: Run, farm: WebFarm, hosts: dict[str, str], tmp: Path,
          redis_url: str | None, profile_dir: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """One crawl to completion; what the farm and the crawler(s) saw."""
    # The root, not /index.html: Scrapy makes start URLs dont_filter, and the
    # pages link back to index.html, which would be fetched twice.
    starts = [f"http://{h}:{farm.port}/" for h in hosts.values()]
    redis_crawl = run.workers > 1 or run.spider == "rediscrawl"
    _fleet.fresh(farm, redis_url if redis_crawl else None, START_URLS_KEY, starts)
    specs = {}
    for i in range(run.workers):
        name = f"{run.name}-{i}"
        settings = {
            **_harness.farm_crawl_settings(), "LOG_LEVEL": "INFO", **run.settings,
            "LOG_FILE": str(tmp / f"{name}.log"),
            "BENCH_SAMPLE_INTERVAL": 0.25, "BENCH_SAMPLES_FILE": str(tmp / f"{name}.samples.json"),
            **({"REDIS_URL": redis_url} if redis_url else {}),
            **({"BANKER_REDIS_NODE_ID": f"w{i}"} if run.workers > 1 else {}),
        }  # fmt: skip
        kwargs: dict[str, Any] = {"allowed_domains": list(hosts.values())}
        if run.spider == "rediscrawl":
            spider = "_crawler:DocsRedisSpider"
        else:
            spider, kwargs["start_urls"] = "_crawler:DocsSpider", starts
        specs[name] = _harness.crawl_spec(
            spider, settings, spider_kwargs=kwargs, extensions=["_crawler.CrawlSampler"]
        )
        if profile_dir is not None:
            specs[name] |= {"profile": True, "profile_out": str(profile_dir / f"{name}.pstats")}
    done = _harness.crawls(specs, tmp, timeout=1800)
    stats = farm.stats(urls=True)
    samples = farm.samples()
    workers = [c.stats for c in done.values()]
    crawler_samples = [json.loads((tmp / f"{name}.samples.json").read_text()) for name in specs]
    fetches: dict[str, int] = stats["fetches"]
    Path(str(tmp / run.name) + ".farm.json").write_text(
        json.dumps({"stats": stats, "samples": samples}), "utf-8"
    )
    return {
        "name": run.name,
        "wall_s": stats["span_s"],
        "process_wall_s": round(next(iter(done.values())).wall_s, 2),
        "cpu_s": round(sum(w["run/cpu_s"] for w in workers), 2),
        "urls": sorted(fetches),
        "pages": len(fetches),
        "duplicates": sum(n - 1 for n in fetches.values() if n > 1),
        "max_inflight_per_host": max(stats["max_inflight_per_host"].values(), default=0),
        "host_done_s": stats["host_done_s"],
        "farm_samples": samples,
        "crawler": [summarise(rows) for rows in crawler_samples],
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The crawler's own samples: first 10 s and the rest."""

    def avg(part: list[dict[str, Any]], key: str) -> float | None:
        return round(statistics.fmean(r[key] for r in part), 2) if part else None

    early = [r for r in rows if r["t"] <= 10.0]
    late = rows[len(rows) * 3 // 4 :]
    out: dict[str, Any] = {}
    for label, part in (("first10s", early), ("last_quarter", late)):
        for key in ("downloader", "scraper_queue", "scraper_active", "cpu"):
            out[f"{key}_{label}"] = avg(part, key)
        out[f"none_empty_{label}"] = sum(r["none_empty"] for r in part)
        out[f"none_held_{label}"] = sum(r["none_held"] for r in part)
    return out


def host_of(url: str) -> str:
    return url.split("/", 3)[2].rsplit(":", 1)[0]


def longpole(samples: list[list[Any]], host: str, span: float) -> dict[str, float | None]:
    """Average in flight on ``host`` (and overall) over the first 10 s and the last quarter."""

    def avg(part: list[list[Any]], total: bool) -> float | None:
        if not part:
            return None
        return round(statistics.fmean(s[1] if total else s[2].get(host, 0) for s in part), 2)

    early = [s for s in samples if s[0] <= 10.0]
    late = [s for s in samples if s[0] >= 0.75 * span]
    return {"longpole_first10s": avg(early, False), "longpole_last_quarter": avg(late, False),
            "all_first10s": avg(early, True), "all_last_quarter": avg(late, True)}  # fmt: skip


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="one run of each peer")
    _harness.add_repeats(parser, "runs of each peer (median; quick 1, else 3)")
    parser.add_argument(
        "--sites",
        default=",".join(DEFAULT_SITES),
        help=f"comma-separated site names (default the first {len(DEFAULT_SITES)}; "
        f"known: {', '.join(SITES)})",
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="crawl this folder of HTML (served from DIR/index.html) instead "
        "of the Debian sites (repeatable)",
    )
    parser.add_argument("--fleet", default="2,4", help="fleet sizes ('' for none)")
    parser.add_argument("--only", default="", help="comma-separated peers to run (default all)")
    parser.add_argument("--seed", type=int, default=7)
    _harness.add_settings(parser, "a setting for the banker runs (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' logs and samples")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        metavar="DIR",
        help="run every crawler process under cProfile and save DIR/<run>-<i>.pstats "
        "(slower: not for figures)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    repeats = args.repeats or _harness.pick(args, full=3, quick=1)
    names = [n for n in args.sites.split(",") if n]
    dirs = {n: SITES[n][1] for n in names if n in SITES}
    unknown = sorted(set(names) - set(SITES))
    if args.tree:
        dirs = dict(pair.partition("=")[::2] for pair in args.tree)
        names = list(dirs)
        bad = [f"{n}={d}" for n, d in dirs.items() if not n or not Path(d, "index.html").is_file()]
        if bad:
            raise SystemExit(f"--tree: {bad}: expected NAME=DIR with DIR/index.html")
    elif unknown:
        raise SystemExit(f"--sites: unknown {unknown}; known: {sorted(SITES)}")
    else:
        why = ensure_sites(names)
        if why is not None:
            print(f"skipped: {why}")
            _common.emit_json({"skipped": why})
            return 0
    extra = _harness.settings(args.set)
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    hosts = {n: f"{n}.farm.test" for n in names}
    lat = latencies({n: html_files(dirs[n]) for n in names}, args.seed)
    sizes = [int(x) for x in args.fleet.split(",") if x]
    runs = single_runs(extra) + fleet_runs(sizes, extra)
    if args.only:
        runs = [r for r in runs if r.name in args.only.split(",")]
    config = FarmConfig(
        hosts=1, total_pages=1, sample_interval_s=0.25,
        static_sites={hosts[n]: dirs[n] for n in names},
        static_latency_ms={hosts[n]: lat[n] for n in names},
    )  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="real-sites-"))
    results: dict[str, list[dict[str, Any]]] = {}
    redis_server = RedisServer() if any(r.spider == "rediscrawl" for r in runs) else None
    try:
        if redis_server is not None:
            redis_server.start()
        with WebFarm(config) as farm:
            for rep in range(repeats):
                for run in runs:
                    log(f"[{rep + 1}/{repeats}] {run.name} ...")
                    url = redis_server.url if redis_server is not None else None
                    result = crawl(run, farm, hosts, tmp, url, args.profile_dir)
                    log(
                        f"    {result['wall_s']:.1f} s, {result['pages']} pages, cpu "
                        f"{result['cpu_s']:.1f} s, max in flight/host "
                        f"{result['max_inflight_per_host']}, dups {result['duplicates']}"
                    )
                    results.setdefault(run.name, []).append(result)
    finally:
        if redis_server is not None:
            redis_server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    result = report(results, lat, hosts)
    _print(result)
    _common.emit_json(result)
    return 0


def _print(result: dict[str, Any]) -> None:
    print(f"{result['distinct_pages']} pages on {len(result['pages_per_host'])} sites; "
          f"same URL set: {result['same_url_set']}; politeness bound "
          f"{result['politeness_bound_s']} s ({result['longpole_host']}), "
          f"CPU bound {result.get('cpu_bound_s')} s")  # fmt: skip
    for key in sorted(k for k in result if k.startswith("wall_s_")):
        name = key[len("wall_s_") :]
        print(f"  {name:18s} {result[key]:7.2f} s  cpu {result[f'cpu_s_{name}']:6.2f} s  "
              f"max/host {result[f'max_inflight_per_host_{name}']:3d}  "
              f"dups {result[f'duplicates_{name}']}")  # fmt: skip
    for key in sorted(k for k in result if k.startswith(("wall_ratio", "wall_over"))):
        print(f"  {key}: {result[key]}")


def report(results: dict[str, list[dict[str, Any]]], lat: dict[str, float],
           hosts: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    url_sets = {tuple(r["urls"]) for rs in results.values() for r in rs}
    any_run = next(iter(results.values()))[0]
    per_host: dict[str, int] = {}
    for url in any_run["urls"]:
        per_host[host_of(url)] = per_host.get(host_of(url), 0) + 1
    host_lat = {hosts[n]: lat[n] for n in lat}
    bounds = {h: n * host_lat[h] / 1000.0 / PER_HOST for h, n in per_host.items()}
    pole = max(bounds, key=lambda h: bounds[h])
    out: dict[str, Any] = {
        "same_url_set": len(url_sets) == 1,
        "distinct_pages": len(any_run["urls"]),
        "pages_per_host": per_host,
        "latency_ms": host_lat,
        "politeness_bound_s": round(bounds[pole], 2),
        "longpole_host": pole,
    }
    med: dict[str, float] = {}
    for name, rs in results.items():
        med[name] = statistics.median(r["wall_s"] for r in rs)
        out[f"wall_s_{name}"] = round(med[name], 2)
        out[f"walls_{name}"] = [r["wall_s"] for r in rs]
        out[f"cpu_s_{name}"] = round(statistics.median(r["cpu_s"] for r in rs), 2)
        out[f"max_inflight_per_host_{name}"] = max(r["max_inflight_per_host"] for r in rs)
        out[f"duplicates_{name}"] = max(r["duplicates"] for r in rs)
        mid = sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2]
        out[f"inflight_longpole_{name}"] = longpole(mid["farm_samples"], pole, mid["wall_s"])
        out[f"crawler_{name}"] = mid["crawler"]
    single_cpu = [out[f"cpu_s_{n}"] for n in SINGLE if f"cpu_s_{n}" in out]
    if single_cpu:
        out["cpu_bound_s"] = round(min(single_cpu), 2)
        out["bound_s"] = max(out["politeness_bound_s"], out["cpu_bound_s"])
    if "banker" in med:
        out["wall_over_bound_banker"] = round(med["banker"] / out.get("bound_s", 1.0), 3)
        for peer in ("dapq_epoll", "dapq_asyncio"):
            if peer in med:
                ratio = _common.ratio(med["banker"], med[peer])
                out[f"wall_ratio_banker_vs_{peer}"] = round(ratio, 3)
    for n in (2, 4):
        if f"banker_{n}w" in med and f"scrapy_redis_{n}w" in med:
            out[f"wall_ratio_banker_vs_scrapy_redis_{n}w"] = round(
                _common.ratio(med[f"banker_{n}w"], med[f"scrapy_redis_{n}w"]), 3
            )
    if "banker_2w" in med and "banker_4w" in med:
        out["wall_ratio_banker_4w_vs_2w"] = round(med["banker_4w"] / med["banker_2w"], 3)
    # Every peer against the least time a crawl keeping every limit can take:
    # one process, the bound above; n workers, the politeness bound or the
    # least single-process CPU over the cores they can use at once.
    cores = os.cpu_count() or 1
    for name, wall in med.items():
        fleet = re.search(r"_(\d+)w$", name)
        workers = int(fleet.group(1)) if fleet else 1
        if workers == 1:
            bound = out.get("bound_s", out["politeness_bound_s"])
        else:
            cpu = out.get("cpu_bound_s")
            share = 0.0 if cpu is None else cpu / min(workers, cores)
            bound = max(out["politeness_bound_s"], share)
            out[f"bound_s_{name}"] = round(bound, 2)
        out[f"wall_over_bound_{name}"] = round(wall / bound, 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
