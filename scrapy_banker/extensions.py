"""Extensions: export of the final stats, and the topic slice adjuster.

The operator's view (Prometheus metrics, the terminal progress, the
time-series record) lives in ``ops/`` with the read models it shares with
the commands; its extensions are imported here, where a Scrapy user looks
for them, and the add-on names them by these paths.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from scrapy_banker.ops.metrics import BankerMetrics
from scrapy_banker.ops.progress import BankerProgress
from scrapy_banker.ops.timeseries import BankerTimeseries
from scrapy_banker.scheduler import running_banker
from scrapy_banker.settings import core_config

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = [
    "BankerMetrics",
    "BankerProgress",
    "BankerStatsFile",
    "BankerTimeseries",
    "BankerTopicAdjuster",
]

logger = logging.getLogger(__name__)


def _disabled(cls: type, reason: str) -> NotConfigured:
    """A bare ``NotConfigured`` for an extension that is simply not asked for.

    Scrapy logs the message of a ``NotConfigured`` as a warning, on every crawl
    that leaves the extension off; the reason only matters when debugging.
    """
    logger.debug("Disabled %s: %s", cls.__name__, reason)
    return NotConfigured()


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
        config = core_config(crawler)
        if not config.enabled or not config.stats_file:
            raise _disabled(cls, "BANKER_STATS_FILE is not set")
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


def _looping_call(func: Any) -> Any:
    try:  # Scrapy >= 2.14 also works without a Twisted reactor
        from scrapy.utils.asyncio import create_looping_call
    except ImportError:  # pragma: no cover - Scrapy 2.13
        from twisted.internet.task import LoopingCall

        return LoopingCall(func)
    return create_looping_call(func)


class BankerTopicAdjuster:
    """PQ-MCSA's background daemon: shrink the slice of topics that met their yield target.

    Every ``BANKER_TOPIC_ADJUST_INTERVAL`` seconds it reads each topic's yield
    in the period (responses + items, from the ``banker/topic/<t>/...`` stats)
    and hands it to :meth:`TopicScheduler.adjust
    <scrapy_banker.core.topics.TopicScheduler.adjust>`: a topic that met its
    ``target`` gives up a slice step so equal-priority topics that lag get more
    turns; a topic that fell behind gets it back.
    """

    def __init__(self, crawler: Crawler, interval: float):
        assert crawler.stats is not None
        self.crawler = crawler
        self.stats = crawler.stats
        self.interval = interval
        self._last: dict[str, int] = {}
        self._task: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = core_config(crawler)
        if not config.enabled:
            raise _disabled(cls, "BANKER_ENABLED is False")
        if not config.topic_adjust_interval:
            raise _disabled(cls, "BANKER_TOPIC_ADJUST_INTERVAL is 0")
        if not any(spec.target is not None for spec in config.topics.values()):
            raise _disabled(cls, "no topic in BANKER_TOPICS has a 'target'")
        ext = cls(crawler, config.topic_adjust_interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider: Spider) -> None:
        self._task = _looping_call(self.adjust)
        self._task.start(self.interval, now=False)

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()

    def adjust(self) -> dict[str, float] | None:
        scheduler = running_banker(self.crawler)
        if scheduler is None:
            logger.warning("BankerTopicAdjuster needs BankerScheduler; slices are not adjusted")
            self.spider_closed(self.crawler.spider, "no banker scheduler")  # type: ignore[arg-type]
            return None
        topics = scheduler.queue.topics
        yields: dict[str, int] = {}
        for state in topics:
            name = state.name
            total = int(self.stats.get_value(f"banker/topic/{name}/responses", 0)) + int(
                self.stats.get_value(f"banker/topic/{name}/items", 0)
            )
            yields[name] = total - self._last.get(name, 0)
            self._last[name] = total
        slices: dict[str, float] = topics.adjust(yields)
        for name, value in slices.items():
            self.stats.set_value(f"banker/topic/{name}/slice_s", round(value, 3))
        self.stats.inc_value("banker/topic_adjuster/runs")
        logger.debug("Topic yields %s -> slices %s", yields, slices)
        return slices
