"""One worker of a crawl fleet against the web farm, as its own process.

``python -m scrapy_banker.testing.fleet SPEC.json`` runs one real Scrapy
crawl (``CrawlerProcess``) with the settings of the spec and writes its final
stats as JSON.  Tests and ``benchmarks/distributed.py`` start several of these
at once against one farm and one Redis -- real processes, so one can be killed
with ``SIGKILL`` mid-crawl.

Spec keys: ``settings`` (Scrapy settings), ``seeds`` (URLs the spider's
``start()`` yields, deduplicated fleet-wide), ``spider``: ``"farm"`` (a plain
spider) or ``"redis"`` (a scrapy-redis ``RedisSpider`` that reads its start
URLs from Redis), ``stats_out`` (path of the stats JSON).  Besides the
crawl's stats the JSON holds ``fleet/cpu_s`` (the process's CPU time when the
spider closed), ``fleet/cpu_main_s`` (the reactor thread's share of it) and
``fleet/closed_at`` (wall-clock time of the close), for the benchmarks.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import TextResponse
from scrapy.linkextractors import LinkExtractor
from scrapy_redis.spiders import RedisSpider

from scrapy_banker.testing.resolver import farm_settings

if TYPE_CHECKING:
    from scrapy.http import Response

__all__ = ["FleetRedisSpider", "FleetSpider", "FleetWorker", "main"]

FARM_LINK = r"^https?://[a-z0-9-]+\.farm\.test(:\d+)?/"


class _Follow:
    links = LinkExtractor(allow=[FARM_LINK])

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        if not isinstance(response, TextResponse):
            return
        for link in self.links.extract_links(response):
            yield scrapy.Request(link.url, callback=self.parse)


class FleetSpider(_Follow, scrapy.Spider):
    """Seeds from the spec (``dont_filter=False``: one copy fleet-wide), follows farm links."""

    name = "fleet"

    def __init__(self, seeds: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seeds = list(seeds or [])

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.seeds:
            yield scrapy.Request(url, callback=self.parse)


class FleetRedisSpider(_Follow, RedisSpider):  # type: ignore[misc]
    """scrapy-redis's spider: start URLs are read from ``fleet:start_urls`` in Redis."""

    name = "fleet"

    def __init__(self, seeds: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class FleetWorker:
    """A worker process started from a spec; its log and stats live in ``workdir``."""

    def __init__(self, name: str, workdir: Path, spec: dict[str, Any]) -> None:
        self.name = name
        self.stats_path = workdir / f"{name}.stats.json"
        self.log_path = workdir / f"{name}.log"
        spec = {**spec, "stats_out": str(self.stats_path)}
        spec["settings"] = {"LOG_FILE": str(self.log_path), **spec.get("settings", {})}
        spec_path = workdir / f"{name}.spec.json"
        spec_path.write_text(json.dumps(spec), "utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy_banker.testing.fleet", str(spec_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as in a crash or an OOM kill."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stats(self) -> dict[str, Any]:
        if not self.stats_path.exists():
            raise AssertionError(f"worker {self.name} wrote no stats; log:\n{self.log_tail()}")
        data: dict[str, Any] = json.loads(self.stats_path.read_text("utf-8"))
        return data

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text("utf-8", errors="replace")[-chars:]
        except OSError:
            return "(no log)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scrapy_banker.testing.fleet SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text("utf-8"))
    settings: dict[str, Any] = {
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        **farm_settings(),
        **spec.get("settings", {}),
    }
    spider_cls = FleetRedisSpider if spec.get("spider") == "redis" else FleetSpider
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(spider_cls)
    out = Path(spec["stats_out"])

    def dump(spider: scrapy.Spider, reason: str) -> None:
        assert crawler.stats is not None
        stats = {k: _jsonable(v) for k, v in crawler.stats.get_stats().items()}
        stats["finish_reason"] = reason
        usage = resource.getrusage(resource.RUSAGE_SELF)
        stats["fleet/cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
        stats["fleet/cpu_main_s"] = round(time.thread_time(), 3)  # the reactor thread
        stats["fleet/closed_at"] = time.time()
        out.write_text(json.dumps(stats, indent=1, sort_keys=True), "utf-8")

    crawler.signals.connect(dump, signal=signals.spider_closed)
    process.crawl(crawler, seeds=spec.get("seeds", []))
    process.start()
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
