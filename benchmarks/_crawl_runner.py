"""Child process of ``crawl_skewed.py``: one real crawl of the web farm.

Every crawl runs in its own process (``python benchmarks/_crawl_runner.py
SPEC.json``) because a Twisted reactor cannot be restarted and because
schedulers must not share an interpreter (warm caches, leftover state).  The
spec file holds the Scrapy settings, the start URLs and the output paths;
this module only adds the spider and the :class:`TopicSampler` extension.

The spider's ``start()`` yields plain ``Request`` objects for every host root
(``start_urls`` would bypass the dupefilter) and follows every in-farm link.
It matches farm URLs with ``allow=`` because ``allow_domains`` compares
against ``host:port`` and would match nothing.
"""

from __future__ import annotations

import json
import re
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
from scrapy.utils.asyncio import create_looping_call

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

FARM_LINK = r"^https?://[a-z0-9-]+\.farm\.test(:\d+)?/"


class FarmSpider(scrapy.Spider):
    """Start from every host root, follow every farm link; yields no items (less noise)."""

    name = "crawl_skewed"

    def __init__(self, seeds: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seeds = list(seeds or [])
        self.links = LinkExtractor(allow=[FARM_LINK])

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.seeds:
            yield scrapy.Request(url)

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        if not isinstance(response, TextResponse):
            return
        for link in self.links.extract_links(response):
            yield scrapy.Request(link.url, callback=self.parse)


class TopicSampler:
    """Sample per-topic responses and pending work every ``BENCH_SAMPLE_INTERVAL`` seconds.

    Responses come from ``banker/topic/<t>/responses`` (scrapy-banker's
    downloader middleware, enabled for every scheduler by the add-on); a
    private ``response_received`` count is kept as a cross-check.  Pending
    work is tracked from engine and downloader signals, so it is the same
    definition whatever the scheduler: ``request_scheduled`` -
    ``request_dropped`` (dupefilter) - ``request_left_downloader`` (a
    transfer finished, successfully or not).  A request counts as pending
    while it waits in the scheduler *or* in a downloader slot's queue: both
    are work the topic is owed.  Topics are classified by URL path
    (``/<topic>/``), like the ``BANKER_TOPIC_RULES`` the runs use.
    """

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.topics: list[str] = settings.getlist("BENCH_TOPICS")
        self.interval = settings.getfloat("BENCH_SAMPLE_INTERVAL", 0.5)
        self.path = settings.get("BENCH_SAMPLES_FILE")
        self._topic_re = re.compile(
            r"^[a-z]+://[^/]+/(" + "|".join(re.escape(t) for t in self.topics) + r")/"
        )
        self.pending = dict.fromkeys(self.topics, 0)
        self.received = dict.fromkeys(self.topics, 0)
        self.samples: list[dict[str, Any]] = []
        self.t0 = 0.0
        self.loop: Any = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self.scheduled, signal=signals.request_scheduled)
        crawler.signals.connect(self.left, signal=signals.request_dropped)
        crawler.signals.connect(self.left, signal=signals.request_left_downloader)
        crawler.signals.connect(self.response_received, signal=signals.response_received)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _topic(self, url: str) -> str | None:
        match = self._topic_re.match(url)
        return match.group(1) if match else None

    def scheduled(self, request: scrapy.Request, **kwargs: Any) -> None:
        topic = self._topic(request.url)
        if topic is not None:
            self.pending[topic] += 1

    def left(self, request: scrapy.Request, **kwargs: Any) -> None:
        topic = self._topic(request.url)
        if topic is not None:
            self.pending[topic] -= 1

    def response_received(self, response: Any, request: scrapy.Request, **kwargs: Any) -> None:
        topic = self._topic(request.url)
        if topic is not None:
            self.received[topic] += 1

    def sample(self, final: bool = False) -> None:
        self.samples.append(
            {
                "t": round(time.monotonic() - self.t0, 4),
                "all": int(self.stats.get_value("response_received_count", 0) or 0),
                "responses": [
                    int(self.stats.get_value(f"banker/topic/{t}/responses", 0) or 0)
                    for t in self.topics
                ],
                "received": [self.received[t] for t in self.topics],
                "pending": [self.pending[t] for t in self.topics],
                "final": final,
            }
        )

    def spider_opened(self, spider: scrapy.Spider) -> None:
        self.t0 = time.monotonic()
        self.loop = create_looping_call(self.sample)
        self.loop.start(self.interval, now=True)

    def spider_closed(self, spider: scrapy.Spider, reason: str) -> None:
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self.sample(final=True)
        if self.path:
            data = {"topics": self.topics, "interval": self.interval, "samples": self.samples}
            Path(self.path).write_text(json.dumps(data), encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: _crawl_runner.py SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    settings: dict[str, Any] = dict(spec["settings"])
    extensions = dict(settings.get("EXTENSIONS") or {})
    extensions[TopicSampler] = 100
    settings["EXTENSIONS"] = extensions
    process = CrawlerProcess(settings)
    process.crawl(FarmSpider, seeds=spec["seeds"])
    process.start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
