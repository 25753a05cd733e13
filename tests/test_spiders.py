"""Every spider class, every mode: real crawls of a small site, cell by cell.

Spider classes (``tests/spider_matrix.py``): ``Spider`` (sync and ``async
def`` callbacks, an async generator, errbacks, ``cb_kwargs``, ``follow_all``,
``FormRequest``/``JsonRequest``, ``dont_filter``, priorities, nested meta,
private, name-mangled and mixin callbacks), ``CrawlSpider`` (rules with
``follow``, ``process_links``, ``process_request``, ``errback``,
``cb_kwargs``), ``SitemapSpider`` (robots.txt -> sitemap index -> sitemaps ->
pages), ``XMLFeedSpider``, ``CSVFeedSpider``, scrapy-redis's ``RedisSpider``
and ``RedisCrawlSpider``.

Modes: ``memory``; ``jobdir-stop`` (JOBDIR, a clean stop by
``CLOSESPIDER_PAGECOUNT``, a resume); ``jobdir-kill`` (JOBDIR, ``kill -9``
mid-crawl, a resume); ``fleet`` (``BankerRedisScheduler``, two worker
processes, one real redis-server).  Each mode runs all spiders at once in
one process per run (two for a resume or a fleet), so the matrix costs a
few process starts, not one per cell; each cell is then its own test.

A cell passes when the farm served exactly the spider's URLs, every page
reached a callback with what its request carried intact, every callback the
spider uses was called, nothing was dead-lettered or left unserializable,
and pages were fetched twice only where the mode allows it (requests in
flight at a stop or a kill).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import TESTS, farm_fixture, run_python
from spider_matrix import (
    REDIS_SPIDERS,
    SPIDERS,
    expected_callbacks,
    expected_urls,
    host_of,
    write_site,
)

from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.redis_server import RedisServer
from scrapy_banker.testing.resolver import farm_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODES = ("memory", "jobdir-stop", "jobdir-kill", "fleet")
PER_HOST = 2
CONCURRENT = 16
#: Responses per crawler before the first run of a resume mode stops or is killed.
STOP_AFTER = 5
RUNNER = TESTS / "spider_matrix.py"


def _sites_config(tmp_path_factory: pytest.TempPathFactory) -> FarmConfig:
    root = tmp_path_factory.mktemp("sites")
    sites = {host_of(name): str(root / name) for name in SPIDERS}
    for path in sites.values():
        Path(path).mkdir()
    return FarmConfig(hosts=1, total_pages=1, latency_ms=30.0, static_sites=sites)


sites_farm = farm_fixture(_sites_config)


@pytest.fixture(scope="module")
def site(sites_farm: WebFarm) -> WebFarm:
    """The farm serving every spider's site (written once the farm's port is known)."""
    for name in SPIDERS:
        host = host_of(name)
        write_site(Path(sites_farm.config.static_sites[host]), host, sites_farm.port)
    return sites_farm


@dataclass
class Run:
    """One crawler process of a mode: what each spider recorded and its final stats."""

    stats: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ModeResult:
    mode: str
    port: int
    runs: list[Run]
    fetches: dict[str, int]
    records: dict[str, list[dict[str, Any]]]
    jobdirs: dict[str, Path]
    logs: list[Path]

    def fetched(self, spider: str) -> Counter[str]:
        prefix = f"http://{host_of(spider)}:{self.port}/"
        return Counter({u: n for u, n in self.fetches.items() if u.startswith(prefix)})

    def log_tail(self) -> str:
        return "\n".join(p.read_text("utf-8", errors="replace")[-3000:] for p in self.logs
                         if p.exists())  # fmt: skip


def _settings(redis_url: str, log: Path, **extra: Any) -> dict[str, Any]:
    return {
        **farm_settings(),
        "ADDONS": {"scrapy_banker.Addon": 500},
        "CONCURRENT_REQUESTS": CONCURRENT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "LOG_FILE": str(log),
        "REDIS_URL": redis_url,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 1,  # scrapy-redis spiders close 1-2 s after idling
        **extra,
    }


def _start(spec: dict[str, Any], path: Path) -> subprocess.Popen[bytes]:
    path.write_text(json.dumps(spec), "utf-8")
    return subprocess.Popen([sys.executable, str(RUNNER), str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode("utf-8", "replace")[-3000:]


def _run(tmp: Path, tag: str, spec: dict[str, Any], killed: bool = False) -> Run:
    out = tmp / tag
    out.mkdir()
    path = tmp / f"{tag}.json"
    path.write_text(json.dumps({**spec, "out": str(out)}), "utf-8")
    run_python(RUNNER, path, expect=-9 if killed else 0)
    return _collect(out)


def _collect(out: Path) -> Run:
    run = Run()
    for name in SPIDERS:
        path = out / f"{name}.stats.json"
        if path.exists():
            run.stats[name] = json.loads(path.read_text("utf-8"))
    return run


FLEET = {
    "SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler",
    "BANKER_REDIS_PARTITIONS": 16,
    "BANKER_REDIS_IDLE_BEFORE_CLOSE": 0.5,
    "BANKER_REDIS_HEARTBEAT": 0.5,
    "BANKER_REDIS_NODE_TIMEOUT": 3.0,
    "BANKER_REDIS_LEASE_TTL": 3.0,
    "BANKER_REDIS_REAP_INTERVAL": 1.0,
}


@pytest.fixture(scope="module", params=MODES)
def mode(
    request: pytest.FixtureRequest,
    site: WebFarm,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> ModeResult:
    name: str = request.param
    tmp = tmp_path_factory.mktemp(name)
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    for spider in REDIS_SPIDERS:
        client.rpush(f"{spider}:start_urls",
                     json.dumps({"url": f"http://{host_of(spider)}:{site.port}/"}))  # fmt: skip
    client.close()
    site.reset()
    jobdirs = {s: tmp / f"job-{s}" for s in SPIDERS} if name.startswith("jobdir") else {}
    per_spider = {s: {"JOBDIR": str(path)} for s, path in jobdirs.items()}
    logs = [tmp / "run1.log", tmp / "run2.log"]
    base = {"spiders": list(SPIDERS), "port": site.port, "per_spider": per_spider}
    runs: list[Run] = []
    if name == "memory":
        runs.append(_run(tmp, "run1", {**base, "settings": _settings(redis_server.url, logs[0])}))
    elif name == "jobdir-stop":
        first = _settings(redis_server.url, logs[0], CLOSESPIDER_PAGECOUNT=STOP_AFTER)
        runs.append(_run(tmp, "run1", {**base, "settings": first}))
        runs.append(_run(tmp, "run2", {**base, "settings": _settings(redis_server.url, logs[1])}))
    elif name == "jobdir-kill":
        first_spec = {**base, "settings": _settings(redis_server.url, logs[0]),
                      "kill_after": STOP_AFTER}  # fmt: skip
        runs.append(_run(tmp, "run1", first_spec, killed=True))
        runs.append(_run(tmp, "run2", {**base, "settings": _settings(redis_server.url, logs[1])}))
    else:
        procs = []
        for i in range(2):
            settings = _settings(redis_server.url, logs[i], BANKER_REDIS_NODE_ID=f"w{i}", **FLEET)
            out = tmp / f"w{i}"
            out.mkdir()
            spec = {**base, "settings": settings, "out": str(out)}
            procs.append((_start(spec, tmp / f"w{i}.json"), out))
        for proc, out in procs:
            _finish(proc)
            runs.append(_collect(out))
    records: dict[str, list[dict[str, Any]]] = {}
    for spider in SPIDERS:
        lines: list[str] = []
        for path in sorted(tmp.glob(f"*/{spider}.records.jsonl")):
            lines += path.read_text("utf-8").splitlines()
        records[spider] = [json.loads(line) for line in lines if line.endswith("}")]
    fetches = site.stats(urls=True)["fetches"]
    return ModeResult(name, site.port, runs, fetches, records, jobdirs, logs)


def _allowed_twice(spider: str, mode: str, port: int) -> set[str]:
    """URLs a complete crawl fetches twice by design: ``dont_filter`` requests.

    The plain spider fetches its root again with ``dont_filter``.  In a fleet
    of two, every worker yields its spider's start requests: Scrapy makes
    ``start_urls`` ``dont_filter=True``, so each worker fetches those once
    (what scrapy-redis does too; ``RedisSpider`` or a ``start()`` without
    ``dont_filter`` fetches them once fleet-wide).  A resumed JOBDIR crawl
    yields them again too, as with Scrapy's own scheduler.
    """
    base = f"http://{host_of(spider)}:{port}"
    if spider == "plain":
        return {f"{base}/"}
    if mode != "memory":
        return {"rules": {f"{base}/"}, "xmlfeed": {f"{base}/feed.xml"},
                "csvfeed": {f"{base}/feed.csv"}}.get(spider, set())  # fmt: skip
    return set()


@pytest.mark.parametrize("spider", list(SPIDERS))
def test_cell(mode: ModeResult, spider: str) -> None:
    port = mode.port
    fetched = mode.fetched(spider)
    context = f"{spider} in {mode.mode}: "
    assert set(fetched) == expected_urls(spider, port), context + mode.log_tail()
    records = mode.records[spider]
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    assert {r["callback"] for r in records} >= expected_callbacks(spider), context
    pages = {u for u in expected_urls(spider, port) if "/page/" in u}
    assert pages <= {r["url"] for r in records}, context
    # Nothing refused, nothing left unpersisted.
    for run in mode.runs:
        stats = run.stats.get(spider, {})
        for key in ("banker/jobdir/malformed", "banker/redis/malformed",
                    "scheduler/unserializable", "banker/queue/malformed_url"):  # fmt: skip
            assert key not in stats, (context, key, stats[key])
    if mode.jobdirs:
        assert not (mode.jobdirs[spider] / "banker-deadletter.jsonl").exists(), context
    # Fetched twice only by design, or because it was in flight at a stop or a kill.
    twice = _allowed_twice(spider, mode.mode, port)
    extra = sum(n - 1 for u, n in fetched.items() if n > 1 and u not in twice)
    extra += sum(n - 2 for u, n in fetched.items() if n > 2 and u in twice)
    again = {u: n for u, n in fetched.items() if n > 1}
    if mode.mode in ("memory", "fleet"):
        assert extra == 0, (context, again)
        assert all(fetched[u] == 2 for u in twice), context
    elif mode.mode == "jobdir-stop":
        # At most what was dispatched and not complete at the stop.
        assert extra <= mode.runs[0].stats[spider]["banker/jobdir/max_inflight"], (context, again)
    else:
        assert extra <= CONCURRENT, (context, again)
    # The resume modes really resumed: the first run stopped mid-crawl.
    if mode.mode == "jobdir-stop":
        first = mode.runs[0].stats[spider]
        assert first["finish_reason"] == "closespider_pagecount", (context, first)
        assert first["banker/jobdir/saved"] > 0, context
    if mode.mode == "jobdir-kill":
        assert spider not in mode.runs[0].stats, context + "finished before the kill"
    if mode.mode == "fleet":
        fetched_by = [run.stats[spider].get("response_received_count", 0) for run in mode.runs]
        assert sum(fetched_by) == sum(fetched.values()), context
