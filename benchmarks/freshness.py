"""How fresh a crawl keeps pages that change: banker's revisits against a fixed interval,
a full re-crawl and the optimal allocation, at the same fetch rate per host.

Why
    A crawl that comes back to its pages is judged by how current its copies
    are and by what that costs.  The pages of this farm change as Poisson
    processes whose times are known exactly (``FarmConfig(page_changes=...)``:
    rates drawn uniformly in their logarithm over three orders of magnitude,
    a share of pages that never change), so every copy each peer fetched is
    judged against the truth (:func:`scrapy_banker.testing.farm.changes.judge`):
    *freshness*, the time-averaged share of pages whose copy is current, and
    the mean *age* of stale copies.  Time is compressed: a "day" is seconds.

The fetch budget
    Every peer crawls Scrapy's ``CrawlSpider`` over the same farm with the
    same per-host limit: ``DOWNLOAD_DELAY`` (``--delay``, no randomisation)
    and one request in flight per host, i.e. ``1 / delay`` fetches per second
    per host.  How each peer spends it:

    * ``uniform`` -- every page fetched again one fixed interval after its
      last copy (Frontera's revisit policy): ``pages on the host x delay``,
      the shortest interval the budget sustains;
    * ``optimal`` -- the limit: each page fetched again at the frequency
      Cho & Garcia-Molina's freshness-optimal allocation gives its *true*
      change rate, for the host's budget
      (:func:`~scrapy_banker.core.change_rate.optimal_frequencies`; a page
      that changes too fast to be worth it, or never, is not fetched again);
    * ``full_recrawl`` -- what users do today: Scrapy re-run from scratch,
      one process after the other, each a whole crawl of the site;
    * ``banker`` -- ``BankerScheduler`` through the add-on with
      ``BANKER_RECRAWL`` (adaptive intervals, conditional requests, the
      crawl staying open), knowing nothing of the rates;
    * ``banker_poisson`` -- the same with ``BANKER_RECRAWL_ESTIMATOR =
      "poisson"`` (intervals from each page's estimated change rate and the
      optimal allocation of the host's rate, ``1 / DOWNLOAD_DELAY``): which
      estimator keeps the site fresher, side by side;
    * ``banker_jobdir`` -- the adaptive peer with ``JOBDIR``, stopped cleanly half-way
      (``CLOSESPIDER_TIMEOUT``) and resumed for the rest of the run: what a
      stop costs, process start-up included;
    * ``banker_fleet`` -- the adaptive peer on a fleet: two worker processes
      crawling at once through ``BankerRedisScheduler``, on a ``redis-server``
      of the peer's own (flushed, on a free port; none found is a one-line
      error), the seeds given to the first worker.

    ``uniform``, ``optimal`` and ``full_recrawl`` run Scrapy's default
    scheduler; ``uniform`` and ``optimal`` re-queue pages with
    ``_crawler.FixedRevisits``.  Every crawl runs for ``--duration`` seconds
    on the farm's changes clock (reset before each peer, so every peer sees
    the same change times); copies are judged over ``[--warm, --duration]``.

What is measured (the last stdout line is one JSON object)
    Per peer ``<p>``: ``freshness_<p>``, ``age_s_<p>``, ``fetches_<p>`` (page
    copies served or confirmed), ``bytes_<p>`` (every byte the farm's sites
    sent, headers included), ``not_modified_<p>`` (``304`` answers),
    ``politeness_violations_<p>`` (requests to a host less than 95 % of the
    delay after the previous one, plus requests beyond one in flight) and
    ``pages_missing_<p>`` (pages never fetched).  ``freshness_bound`` is the
    freshness the optimal allocation reaches in theory on these rates
    (``expected_freshness_uniform`` the same for ``uniform``);
    ``freshness_over_bound_<p>`` each peer's share of it.  The issue's
    ratios: ``freshness_ratio_banker_vs_optimal`` (target >= 0.9),
    ``freshness_ratio_banker_vs_uniform`` (target >= 1.3; the most any
    policy can reach is ``freshness_ratio_optimal_vs_uniform``) and
    ``bytes_ratio_banker_vs_full_recrawl`` (target <= 0.3).  With
    ``--repeats``, medians; ``politeness_violations_*``, the most of any
    run.  The same ratios for ``banker_jobdir``, ``banker_poisson`` and
    ``banker_fleet``, and ``freshness_ratio_banker_poisson_vs_banker``.

Usage::

    python benchmarks/freshness.py --quick --repeats 3
    python benchmarks/freshness.py --only banker uniform
    python benchmarks/freshness.py --quick --banker-set BANKER_RECRAWL_MIN_INTERVAL=2
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common
import _fleet
import _harness
from _common import EPOLL

from scrapy_banker.core.change_rate import mean_freshness, optimal_frequencies
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.farm.changes import ChangeModel, judge
from scrapy_banker.testing.redis_server import RedisServer, RedisServerError

PEERS = (
    "uniform", "optimal", "full_recrawl", "banker", "banker_poisson", "banker_jobdir",
    "banker_fleet",
)  # fmt: skip

#: The workers of the ``banker_fleet`` peer, crawling at once.
FLEET_WORKERS = 2

#: How many crawler processes each peer runs one after the other (a full re-crawl:
#: as many as fit; the JOBDIR peer: stopped half-way and resumed), or, for the
#: fleet, at once.
MAX_PROCESSES = {"uniform": 1, "optimal": 1, "full_recrawl": 10_000, "banker": 1,
                 "banker_poisson": 1, "banker_jobdir": 2,
                 "banker_fleet": FLEET_WORKERS}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Workload:
    hosts: int
    pages_per_host: int
    #: DOWNLOAD_DELAY: one fetch per ``delay_s`` per host is every peer's budget.
    delay_s: float
    #: How long each peer crawls, and from when its copies are judged.
    duration_s: float
    warm_s: float
    rate_min: float = 0.002
    rate_max: float = 2.0
    static_share: float = 0.2
    seed: int = 11


FULL = Workload(hosts=6, pages_per_host=40, delay_s=0.2, duration_s=180.0, warm_s=30.0)
QUICK = Workload(hosts=4, pages_per_host=30, delay_s=0.25, duration_s=75.0, warm_s=15.0)
TINY = Workload(hosts=2, pages_per_host=8, delay_s=0.25, duration_s=9.0, warm_s=3.0)


def farm_config(w: Workload) -> FarmConfig:
    return FarmConfig(
        seed=w.seed,
        hosts=w.hosts,
        total_pages=w.hosts * w.pages_per_host,
        min_pages_per_host=1,
        zipf_s=0.0,
        cross_host_link_prob=0.0,
        latency_ms=5.0,
        page_changes={
            "rate_min": w.rate_min, "rate_max": w.rate_max, "static_share": w.static_share,
        },
    )  # fmt: skip


def page_key(url: str) -> str:
    """The change model's name of a farm URL: ``host/path`` without the port."""
    netloc, _, path = url.split("//", 1)[1].partition("/")
    return f"{netloc.split(':', 1)[0]}/{path}"


def by_host(keys: set[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for key in sorted(keys):
        out[key.split("/", 1)[0]].append(key)
    return out


def revisit_intervals(
    peer: str, keys: set[str], changes: ChangeModel, budget: float
) -> dict[str, float | None]:
    """Seconds between a page's fetches for ``uniform`` / ``optimal`` (None: never again)."""
    out: dict[str, float | None] = {}
    for pages in by_host(keys).values():
        if peer == "uniform":
            out.update(dict.fromkeys(pages, len(pages) / budget))
            continue
        rates = [changes.rate(k) for k in pages]
        for key, f in zip(pages, optimal_frequencies(rates, budget), strict=True):
            out[key] = 1.0 / f if f > 0 else None
    return out


def expected_freshness(keys: set[str], changes: ChangeModel, budget: float) -> dict[str, float]:
    """Steady-state mean freshness of ``uniform`` and ``optimal`` in theory (fixed intervals)."""
    uniform, optimal = [], []
    for pages in by_host(keys).values():
        rates = [changes.rate(k) for k in pages]
        uniform.append(mean_freshness(rates, [budget / len(pages)] * len(pages)) * len(pages))
        optimal.append(mean_freshness(rates, optimal_frequencies(rates, budget)) * len(pages))
    return {"uniform": sum(uniform) / len(keys), "optimal": sum(optimal) / len(keys)}


def base_settings(w: Workload) -> dict[str, Any]:
    return {
        **_harness.farm_crawl_settings(),
        "TWISTED_REACTOR": EPOLL,
        "DOWNLOAD_DELAY": w.delay_s,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "LOG_LEVEL": "WARNING",
    }


def banker_settings(w: Workload, extra: dict[str, Any]) -> dict[str, Any]:
    """The banker peer: the add-on, revisits on; a first interval of one uniform cycle,
    bounds of 4 fetch slots and half the run."""
    cycle = w.pages_per_host * w.delay_s
    return _harness.overlaid(
        {
            "ADDONS": {"scrapy_banker.Addon": 500},
            "BANKER_RECRAWL": True,
            "BANKER_RECRAWL_STAY_OPEN": True,
            "BANKER_RECRAWL_INTERVAL": cycle,
            "BANKER_RECRAWL_MIN_INTERVAL": min(cycle, 4 * w.delay_s),
            "BANKER_RECRAWL_MAX_INTERVAL": max(cycle, w.duration_s / 2),
            "BANKER_RECRAWL_ERROR_INTERVAL": cycle,
        },
        extra,
    )


def run_peer(
    peer: str,
    farm: WebFarm,
    w: Workload,
    keys: set[str],
    workdir: Path,
    banker_extra: dict[str, Any],
) -> dict[str, Any]:
    """Crawl with ``peer`` for the workload's duration on a reset farm; what the farm saw."""
    changes = farm.model.changes
    assert changes is not None
    settings = base_settings(w)
    spider_kwargs = {"seeds": farm.start_urls()}
    if peer in ("uniform", "optimal"):
        path = workdir / f"{peer}-intervals.json"
        path.write_text(json.dumps(revisit_intervals(peer, keys, changes, 1 / w.delay_s)))
        settings = _harness.with_extensions(
            {**settings, "BENCH_REVISIT_INTERVALS": str(path)}, ["_crawler.FixedRevisits"]
        )
    elif peer.startswith("banker"):
        if peer == "banker_fleet":
            settings = {**settings, **_common.BANKER_REDIS}  # --banker-set still wins
        settings = _harness.overlaid(settings, banker_settings(w, banker_extra))
    if peer == "banker_poisson":
        settings["BANKER_RECRAWL_ESTIMATOR"] = "poisson"  # planned for 1 / DOWNLOAD_DELAY
    if peer == "banker_jobdir":
        settings["JOBDIR"] = str(workdir / "job")
    if peer == "banker_fleet":
        runs = crawl_fleet(farm, w, settings, spider_kwargs, workdir)
    else:
        farm.reset()
        started = time.monotonic()
        runs = 0
        while True:
            left = w.duration_s - (time.monotonic() - started)
            if left < 1.0 or runs >= MAX_PROCESSES[peer]:
                break
            if peer == "banker_jobdir" and runs == 0:
                left = w.duration_s / 2  # a clean stop half-way, then a resume for the rest
            spec = _harness.crawl_spec(
                "_crawler:FreshSpider", {**settings, "CLOSESPIDER_TIMEOUT": left},
                spider_kwargs=spider_kwargs,
            )  # fmt: skip
            _harness.crawl(spec, workdir, f"{peer}-{runs}", timeout=left + 120)
            runs += 1
    served = farm.stats(urls=True)
    fetches = {page_key(u): t for u, t in served.get("page_fetches", {}).items()}
    judged = judge(changes, {k: fetches.get(k, []) for k in keys}, w.warm_s, w.duration_s)
    return {
        "freshness": judged.freshness,
        "age_s": judged.age_s,
        "fetches": sum(len(t) for t in fetches.values()),
        "bytes": served["bytes_sent"],
        "not_modified": served["statuses"].get("304", 0),
        "politeness_violations": violations(served, w.delay_s),
        "pages_missing": judged.never_fetched,
        "processes": runs,
    }


def redis_server() -> RedisServer:
    """A ``redis-server`` of its own, started on a free port; none is a one-line error."""
    try:
        return RedisServer().start()
    except RedisServerError as exc:
        raise SystemExit(f"freshness: the banker_fleet peer needs Redis: {exc}") from None


def crawl_fleet(
    farm: WebFarm, w: Workload, settings: dict[str, Any], spider_kwargs: dict[str, Any],
    workdir: Path,
) -> int:  # fmt: skip
    """The fleet peer's crawl: :data:`FLEET_WORKERS` processes at once for the workload's
    duration, on one Redis; how many processes ran.

    Redis is flushed and the farm reset (``_fleet.fresh``) just before they
    start; spill files stay in ``workdir``.  Only the first worker gets the
    seeds: ``FreshSpider``'s start URLs are ``dont_filter``, so seeds given
    to both would be fetched twice.
    """
    with redis_server() as server:
        _fleet.fresh(farm, server.url)
        specs = {}
        for i in range(FLEET_WORKERS):
            node = f"w{i}"
            worker = {
                **settings,
                "REDIS_URL": server.url,
                "BANKER_REDIS_PREFIX": f"freshness:{workdir.name}",
                "BANKER_REDIS_NODE_ID": node,
                # Not the project's .scrapy/: a later run must not replay this one's ops.
                "BANKER_REDIS_SPILL_DIR": str(workdir / "spill"),
                "CLOSESPIDER_TIMEOUT": w.duration_s,
            }
            specs[f"banker_fleet-{node}"] = _harness.crawl_spec(
                "_crawler:FreshSpider", worker, spider_kwargs=spider_kwargs if i == 0 else {}
            )
        _harness.crawls(specs, workdir, timeout=w.duration_s + 120)
    return len(specs)


def violations(served: dict[str, Any], delay_s: float) -> int:
    """Requests a host received less than 95 % of the delay after the one before,
    plus each host's requests in flight beyond one at its peak."""
    count = sum(max(0, n - 1) for n in served["max_inflight_per_host"].values())
    for events in served["host_events"].values():
        arrivals = [t for t, kind in events if kind > 0]
        count += sum(1 for a, b in itertools.pairwise(arrivals) if b - a < 0.95 * delay_s)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(
        __doc__, quick="4 hosts of 30 pages, 75 s per peer (about 9 min a repeat)", tiny=""
    )
    parser.add_argument("--only", nargs="*", choices=PEERS, default=list(PEERS))
    parser.add_argument("--duration", type=float, help="seconds each peer crawls")
    parser.add_argument("--warm", type=float, help="copies are judged from this second on")
    parser.add_argument("--delay", type=float, help="DOWNLOAD_DELAY: every peer's per-host budget")
    _harness.add_repeats(parser, "runs of every peer (medians)", default=1)
    _harness.add_settings(parser, "a setting for the banker peer (repeatable)", "--banker-set")
    args = parser.parse_args(argv)
    w = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        duration_s="duration", warm_s="warm", delay_s="delay",
    )  # fmt: skip
    banker_extra = _harness.settings(args.banker_set)
    config = farm_config(w)
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="freshness-") as tmp, WebFarm(config) as farm:
        changes = farm.model.changes
        assert changes is not None
        keys = {page_key(u) for u in farm.expected_urls(farm.start_urls())}
        expected = expected_freshness(keys, changes, 1 / w.delay_s)
        _common.log(
            f"{len(keys)} pages on {w.hosts} hosts, {1 / w.delay_s:g} fetches/s per host, "
            f"{w.duration_s:g} s per peer; in theory uniform {expected['uniform']:.3f}, "
            f"optimal {expected['optimal']:.3f}"
        )
        for rep in range(args.repeats):
            for peer in args.only:
                workdir = Path(tmp) / f"{peer}-{rep}"
                workdir.mkdir()
                r = run_peer(peer, farm, w, keys, workdir, banker_extra)
                runs[peer].append(r)
                _common.log(
                    f"rep {rep + 1} {peer:<12} freshness {r['freshness']:.3f} age "
                    f"{r['age_s']:5.2f} s  fetches {r['fetches']:>5} ({r['not_modified']} x 304) "
                    f"bytes {r['bytes']:>8}  violations {r['politeness_violations']} "
                    f"missing {r['pages_missing']}  processes {r['processes']}"
                )
    out: dict[str, Any] = {
        "workload": dataclasses.asdict(w),
        "pages": len(keys),
        "repeats": args.repeats,
        "banker_settings": banker_settings(w, banker_extra),
        "freshness_bound": expected["optimal"],
        "expected_freshness_uniform": expected["uniform"],
    }
    for peer, rs in runs.items():
        for key in ("freshness", "age_s", "fetches", "bytes", "not_modified", "pages_missing"):
            out[f"{key}_{peer}"] = statistics.median(r[key] for r in rs)
        out[f"politeness_violations_{peer}"] = max(r["politeness_violations"] for r in rs)
        out[f"freshness_over_bound_{peer}"] = _common.ratio(
            out[f"freshness_{peer}"], expected["optimal"]
        )

    def ratio(key: str, a: str, b: str) -> None:
        if a in runs and b in runs:
            out[f"{key}_ratio_{a}_vs_{b}"] = _common.ratio(out[f"{key}_{a}"], out[f"{key}_{b}"])

    ratio("freshness", "banker", "optimal")
    ratio("freshness", "banker_poisson", "optimal")
    ratio("freshness", "banker_poisson", "banker")
    ratio("bytes", "banker_poisson", "full_recrawl")
    ratio("freshness", "banker_jobdir", "optimal")
    ratio("freshness", "banker_jobdir", "uniform")
    ratio("bytes", "banker_jobdir", "full_recrawl")
    ratio("freshness", "banker_fleet", "optimal")
    ratio("freshness", "banker_fleet", "uniform")
    ratio("bytes", "banker_fleet", "full_recrawl")
    ratio("freshness", "banker", "uniform")
    ratio("freshness", "banker_poisson", "uniform")
    ratio("freshness", "optimal", "uniform")
    ratio("bytes", "banker", "full_recrawl")
    for peer in ("banker", "banker_poisson", "banker_jobdir", "banker_fleet"):
        for key, target in ((f"freshness_ratio_{peer}_vs_optimal", 0.9),
                            (f"freshness_ratio_{peer}_vs_uniform", 1.3)):  # fmt: skip
            if key in out:
                print(_common.target_line(key, out[key], target))
        key = f"bytes_ratio_{peer}_vs_full_recrawl"
        if key in out:
            verdict = "met" if out[key] <= 0.3 else "MISSED"
            print(f"{key}: {out[key]:.3g}x (target <= 0.3x: {verdict})")
    out["total_s"] = time.monotonic() - started
    _common.emit_json(_common.round_floats(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
