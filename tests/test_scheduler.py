"""BankerScheduler keeps Scrapy's contract and adds per-topic stats."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.core.scheduler import BaseScheduler, Scheduler
from scrapy.utils.test import get_crawler

from scrapy_banker.scheduler import BankerScheduler

SETTINGS: dict[str, Any] = {
    "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
    "BANKER_TOPIC_RULES": [{"url": "/news/", "topic": "news"}],
}


def _open(cls: type[Scheduler], settings: dict[str, Any] | None = None) -> Any:
    crawler = get_crawler(Spider, {**SETTINGS, **(settings or {})})
    crawler.spider = Spider.from_crawler(crawler, "s")
    scheduler = cls.from_crawler(crawler)
    scheduler.open(crawler.spider)
    return scheduler


def _stream() -> list[Request]:
    reqs = []
    for i in range(60):
        path = "news" if i % 3 == 0 else "archive"
        reqs.append(Request(f"http://h{i % 7}.test/{path}/{i}.html", priority=i % 4))
    reqs.append(Request("http://h0.test/news/0.html"))  # duplicate: filtered
    return reqs


def _drain(scheduler: Any) -> list[str]:
    out = []
    while (req := scheduler.next_request()) is not None:
        out.append(req.url)
    return out


def test_is_a_base_scheduler() -> None:
    assert issubclass(BankerScheduler, BaseScheduler)


def test_same_order_as_scrapy_and_topic_stats() -> None:
    ours, theirs = _open(BankerScheduler), _open(Scheduler)
    for req in _stream():
        ours.enqueue_request(req.copy())
        theirs.enqueue_request(req.copy())
    assert len(ours) == len(theirs) == 60
    assert ours.has_pending_requests()
    assert _drain(ours) == _drain(theirs)
    assert not ours.has_pending_requests()
    stats = ours.stats.get_stats()
    assert stats["banker/topic/news/enqueued"] == 20
    assert stats["banker/topic/default/enqueued"] == 40
    assert stats["banker/topic/news/dequeued"] == 20
    assert stats["banker/topic/default/dequeued"] == 40
    assert stats["dupefilter/filtered"] == 1
    assert stats["scheduler/enqueued"] == 60


def test_disabled_keeps_scrapy_behaviour_without_topic_stats() -> None:
    scheduler = _open(BankerScheduler, {"BANKER_ENABLED": False})
    for req in _stream():
        scheduler.enqueue_request(req)
    assert len(_drain(scheduler)) == 60
    assert not [k for k in scheduler.stats.get_stats() if k.startswith("banker/")]


def test_invalid_setting_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="BANKER_TOPIC_RULES"):
        _open(BankerScheduler, {"BANKER_TOPIC_RULES": [{"url": "("}]})


def test_jobdir_persists_pending_requests(tmp_path: Any) -> None:
    settings = {"JOBDIR": str(tmp_path)}
    first = _open(BankerScheduler, settings)
    for req in _stream():
        first.enqueue_request(req)
    first.close("shutdown")
    second = _open(BankerScheduler, settings)
    assert len(second) == 60
    urls = _drain(second)
    assert len(set(urls)) == 60
    assert second.stats.get_value("banker/topic/news/dequeued") == 20
    second.close("finished")
