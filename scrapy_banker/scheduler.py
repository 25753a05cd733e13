"""``BankerScheduler``: the scheduler users put in ``SCHEDULER``.

This first version keeps Scrapy's own frontier (priority queues, JOBDIR disk
queues, dupefilter) untouched and adds per-topic accounting on top of it, so
that enabling scrapy-banker never changes *what* a crawl fetches.  The hashed
multi-queue frontier with topic time slices replaces the queue internals
behind the same class and settings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.core.scheduler import Scheduler

from scrapy_banker._topic import request_topic
from scrapy_banker.settings import BankerConfig, load_config

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class BankerScheduler(Scheduler):
    """Scrapy's scheduler plus ``banker/topic/<name>/enqueued|dequeued`` stats."""

    config: BankerConfig

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        # Validate BANKER_* before anything else so a typo fails the start-up,
        # not the first request that needs the setting.
        config = load_config(crawler.settings)
        scheduler = super().from_crawler(crawler)
        scheduler.config = config
        return scheduler

    def enqueue_request(self, request: Request) -> bool:
        queued = super().enqueue_request(request)
        if queued and self.config.enabled and self.stats is not None:
            topic = request_topic(request, self.config, self.stats)
            self.stats.inc_value(f"banker/topic/{topic}/enqueued")
        return queued

    def next_request(self) -> Request | None:
        request = super().next_request()
        if request is not None and self.config.enabled and self.stats is not None:
            topic = request_topic(request, self.config, self.stats)
            self.stats.inc_value(f"banker/topic/{topic}/dequeued")
        return request
