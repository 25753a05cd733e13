"""Extensions: export of the crawl's final stats."""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_banker.settings import load_config

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class BankerStatsFile:
    """Write the final stats as JSON to ``BANKER_STATS_FILE`` when the spider closes.

    Benchmarks, the demo and CI dashboards need the numbers in machine-readable
    form; scraping them from the log's pretty-printed dict is fragile.  The file
    is written to a temporary name and renamed, so a reader never sees half a file.
    """

    def __init__(self, crawler: Crawler, path: str):
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = load_config(crawler.settings)
        if not config.enabled or not config.stats_file:
            raise NotConfigured("BANKER_STATS_FILE is not set")
        ext = cls(crawler, config.stats_file)
        # Receivers run in connection order and extensions are built in EXTENSIONS
        # order, so CoreStats (order 0) has already set finish_time/finish_reason.
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_closed(self, spider: Spider, reason: str) -> None:
        stats: dict[str, Any] = {}
        for key, value in self.stats.get_stats().items():
            stats[key] = value.isoformat() if isinstance(value, datetime) else value
        stats.setdefault("finish_reason", reason)
        tmp = f"{self.path}.tmp"
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=1, sort_keys=True, default=str)
        os.replace(tmp, self.path)
        logger.info("Wrote final stats to %s", self.path)
