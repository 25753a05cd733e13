"""BankerStatsFile and BankerTopicAdjuster."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_banker.extensions import BankerStatsFile, BankerTopicAdjuster
from scrapy_banker.scheduler import BankerScheduler

TOPICS = {
    "BANKER_TOPICS": {
        "news": {"priority": 0, "slice": 1.0, "target": 10},
        "archive": {"priority": 0, "slice": 1.0},
    },
    "BANKER_TOPIC_SLICE_STEP": 0.25,
    "BANKER_TOPIC_MIN_SLICE": 0.5,
}


def _crawler(settings: dict[str, Any]) -> Any:
    crawler = get_crawler(Spider, settings)
    crawler.spider = Spider.from_crawler(crawler, "s")
    return crawler


def test_adjuster_reads_yield_deltas_and_moves_slices() -> None:
    crawler = _crawler(TOPICS)
    scheduler = BankerScheduler.from_crawler(crawler)
    crawler.engine = SimpleNamespace(scheduler=scheduler)
    ext = BankerTopicAdjuster.from_crawler(crawler)
    stats = crawler.stats
    stats.set_value("banker/topic/news/responses", 8)
    stats.set_value("banker/topic/news/items", 4)  # yield 12 >= target 10
    assert ext.adjust() == {"news": 0.75, "archive": 1.0}
    stats.set_value("banker/topic/news/responses", 12)  # +4 only this period
    assert ext.adjust() == {"news": 1.0, "archive": 1.0}
    assert stats.get_value("banker/topic/news/slice_s") == 1.0
    assert stats.get_value("banker/topic_adjuster/runs") == 2


def test_adjuster_runs_on_a_timer_with_the_reactor() -> None:
    crawler = _crawler(TOPICS | {"BANKER_TOPIC_ADJUST_INTERVAL": 0.01})
    ext = BankerTopicAdjuster.from_crawler(crawler)
    ext.spider_opened(crawler.spider)
    assert ext._task.running
    ext.spider_closed(crawler.spider, "finished")
    assert not ext._task.running


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (TOPICS | {"BANKER_ENABLED": False}, "BANKER_ENABLED"),
        (TOPICS | {"BANKER_TOPIC_ADJUST_INTERVAL": 0}, "INTERVAL is 0"),
        ({"BANKER_TOPICS": {"news": 1}}, "has a 'target'"),
    ],
)
def test_adjuster_not_configured(
    settings: dict[str, Any], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = _crawler(settings)
    with caplog.at_level(logging.DEBUG, "scrapy_banker"), pytest.raises(NotConfigured) as info:
        BankerTopicAdjuster.from_crawler(crawler)
    assert not info.value.args  # Scrapy logs a NotConfigured message as a warning
    assert why in caplog.text


def test_stats_file_written_atomically(tmp_path: Path) -> None:
    path = tmp_path / "out" / "stats.json"
    crawler = _crawler({"BANKER_STATS_FILE": str(path)})
    ext = BankerStatsFile.from_crawler(crawler)
    crawler.stats.set_value("banker/topic/news/responses", 3)
    ext.spider_closed(crawler.spider, "finished")
    data = json.loads(path.read_text())
    assert data["banker/topic/news/responses"] == 3
    assert data["finish_reason"] == "finished"
    assert not Path(f"{path}.tmp").exists()


def test_stats_file_not_configured_without_path(caplog: pytest.LogCaptureFixture) -> None:
    crawler = _crawler({})
    with caplog.at_level(logging.DEBUG, "scrapy_banker"), pytest.raises(NotConfigured) as info:
        BankerStatsFile.from_crawler(crawler)
    assert not info.value.args
    assert "BANKER_STATS_FILE" in caplog.text
