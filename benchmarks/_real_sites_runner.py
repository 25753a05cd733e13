"""Child process of ``real_sites.py``: one crawler (alone, or one worker of a fleet).

``python benchmarks/_real_sites_runner.py SPEC.json`` runs a plain
``CrawlSpider`` (or scrapy-redis's ``RedisCrawlSpider`` in a fleet) over the
static documentation sites the parent serves, with the spec's settings, and
writes its final stats and a time series sampled every ``sample_interval``
seconds: requests in the downloader, responses waiting in or being
processed by Scrapy's scraper, the process's CPU use, and how often the
scheduler answered the engine with nothing and why (nothing queued at all,
or only requests it would not send now: full slots or held back).

Spec keys: ``settings``, ``spider`` (``"crawl"`` or ``"rediscrawl"``),
``start_urls``, ``allowed_domains``, ``stats_out``, ``samples_out``,
``sample_interval``.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.asyncio import create_looping_call
from scrapy_redis.spiders import RedisCrawlSpider

from scrapy_banker.testing.resolver import farm_settings

#: Links to the farm's hosts, port included (``allow_domains`` compares host:port).
FARM_LINK = r"^https?://[a-z0-9.-]+\.farm\.test(:\d+)?/"
RULES = (Rule(LinkExtractor(allow=[FARM_LINK]), callback="parse_item", follow=True),)


class _Item:
    def parse_item(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "title": response.css("title::text").get()}


class DocsSpider(_Item, CrawlSpider):
    """What a user writes for a documentation site: one rule, every page an item."""

    name = "docs"
    rules = RULES


class DocsRedisSpider(_Item, RedisCrawlSpider):  # type: ignore[misc]
    """The same, with start URLs from Redis (``docs:start_urls``), for fleets."""

    name = "docs"
    rules = RULES


class Sampler:
    """What the crawler is doing, every ``interval`` seconds (reactor thread)."""

    def __init__(self, crawler: Any, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self.rows: list[dict[str, Any]] = []
        self.empty = 0
        self.held = 0
        self._t0 = self._last = time.monotonic()
        self._cpu = time.process_time()
        self._call: Any = None

    def start(self) -> None:
        scheduler = self.crawler.engine._slot.scheduler
        original = scheduler.next_request

        def next_request() -> Any:
            request = original()
            if request is None:
                if len(scheduler):
                    self.held += 1
                else:
                    self.empty += 1
            return request

        scheduler.next_request = next_request
        self._call = create_looping_call(self.sample)
        self._call.start(self.interval, now=False)

    def sample(self) -> None:
        engine = self.crawler.engine
        now, cpu = time.monotonic(), time.process_time()
        slot = engine.scraper.slot
        self.rows.append({
            "t": round(now - self._t0, 3),
            "downloader": len(engine.downloader.active),
            "scraper_queue": len(slot.queue) if slot is not None else 0,
            "scraper_active": len(slot.active) if slot is not None else 0,
            "scraper_bytes": slot.active_size if slot is not None else 0,
            "cpu": round((cpu - self._cpu) / max(now - self._last, 1e-6), 3),
            "scheduled": len(engine._slot.scheduler),
            "none_empty": self.empty,
            "none_held": self.held,
        })  # fmt: skip
        self._cpu, self._last = cpu, now
        self.empty = self.held = 0

    def stop(self) -> None:
        if self._call is not None and self._call.running:
            self._call.stop()


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text("utf-8"))
    settings = {"LOG_LEVEL": "INFO", "TELNETCONSOLE_ENABLED": False, "ROBOTSTXT_OBEY": False,
                **farm_settings(), **spec["settings"]}  # fmt: skip
    process = CrawlerProcess(settings)
    cls = DocsRedisSpider if spec.get("spider") == "rediscrawl" else DocsSpider
    crawler = process.create_crawler(cls)
    sampler = Sampler(crawler, float(spec.get("sample_interval", 0.25)))
    started = time.time()

    def opened(spider: Any) -> None:
        sampler.start()

    def closed(spider: Any, reason: str) -> None:
        sampler.stop()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        stats = {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                 for k, v in crawler.stats.get_stats().items()}  # fmt: skip
        cpu = round(usage.ru_utime + usage.ru_stime, 3)
        stats.update({"finish_reason": reason, "run/cpu_s": cpu, "run/started_at": started,
                      "run/closed_at": time.time()})  # fmt: skip
        Path(spec["stats_out"]).write_text(json.dumps(stats, sort_keys=True), "utf-8")
        Path(spec["samples_out"]).write_text(json.dumps(sampler.rows), "utf-8")

    handlers = (opened, closed)  # signals hold weak references
    crawler.signals.connect(handlers[0], signal=signals.spider_opened)
    crawler.signals.connect(handlers[1], signal=signals.spider_closed)
    kwargs: dict[str, Any] = {"allowed_domains": spec["allowed_domains"]}
    if cls is DocsSpider:
        kwargs["start_urls"] = spec["start_urls"]
    process.crawl(crawler, **kwargs)
    process.start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
