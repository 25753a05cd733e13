"""Topic tagging and per-topic accounting."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_banker.middlewares import BankerDownloaderMiddleware, BankerTopicMiddleware

SETTINGS: dict[str, Any] = {
    "BANKER_TOPICS": {"news": 10, "archive": {"priority": -2}},
    "BANKER_TOPIC_RULES": [
        {"url": r"/news/", "topic": "news"},
        {"callback": "parse_archive", "topic": "archive"},
    ],
    "BANKER_DEFAULT_TOPIC": "other",
}


class TopicSpider(Spider):
    name = "topics"

    def parse_archive(self, response: Any) -> None:
        pass


def _crawler(settings: dict[str, Any] | None = None) -> Any:
    crawler = get_crawler(TopicSpider, {**SETTINGS, **(settings or {})})
    crawler.spider = TopicSpider()
    return crawler


def test_rules_meta_and_default_give_topics() -> None:
    crawler = _crawler()
    mw = BankerTopicMiddleware.from_crawler(crawler)
    spider = crawler.spider
    news = Request("http://a.test/news/1.html", priority=1)
    archive = Request("http://a.test/x", callback=spider.parse_archive)
    forced = Request("http://a.test/news/2.html", meta={"banker_topic": "archive"})
    plain = Request("http://a.test/y")
    out = [mw.get_processed_request(r, None) for r in (news, archive, forced, plain)]
    assert [r.meta["banker_topic"] for r in out] == ["news", "archive", "archive", "other"]
    # Topic priority is the scheduler's business: request.priority is untouched.
    assert [r.priority for r in out] == [1, 0, 0, 0]
    # Counted in batches: flushed every flush_every requests and at the close.
    assert crawler.stats.get_value("banker/topic/news/requests") is None
    mw.flush()
    stats = crawler.stats.get_stats()
    assert stats["banker/topic/news/requests"] == 1
    assert stats["banker/topic/archive/requests"] == 2
    assert stats["banker/topic/other/requests"] == 1


def test_items_count_towards_the_topic_of_their_response() -> None:
    crawler = _crawler()
    mw = BankerTopicMiddleware.from_crawler(crawler)
    req = Request("http://a.test/news/1.html")
    resp = HtmlResponse(req.url, body=b"<html></html>", request=req)
    assert mw.get_processed_item({"a": 1}, resp) == {"a": 1}
    assert mw.get_processed_item({"a": 2}, None) == {"a": 2}
    assert crawler.stats.get_value("banker/topic/news/items") == 1


def test_invalid_meta_topic_is_logged_counted_and_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = _crawler()
    mw = BankerTopicMiddleware.from_crawler(crawler)
    req = Request("http://a.test/news/9.html", meta={"banker_topic": {"not": "a name"}})
    with caplog.at_level(logging.WARNING):
        out = mw.get_processed_request(req, None)
    assert out.meta["banker_topic"] == "news"
    assert crawler.stats.get_value("banker/topic/invalid_meta") == 1
    assert "Ignoring invalid meta banker_topic" in caplog.text


def test_downloader_middleware_counts_responses_bytes_exceptions() -> None:
    crawler = _crawler()
    mw = BankerDownloaderMiddleware.from_crawler(crawler)
    req = Request("http://a.test/news/1.html")
    resp = HtmlResponse(req.url, body=b"x" * 123, request=req)
    assert mw.process_response(req, resp) is resp
    assert mw.process_exception(req, TimeoutError()) is None
    stats = crawler.stats.get_stats()
    assert stats["banker/topic/news/responses"] == 1
    assert stats["banker/topic/news/response_bytes"] == 123
    assert stats["banker/topic/news/exceptions"] == 1


@pytest.mark.parametrize("cls", [BankerTopicMiddleware, BankerDownloaderMiddleware])
def test_disabled_raises_not_configured(cls: Any) -> None:
    with pytest.raises(NotConfigured):
        cls.from_crawler(_crawler({"BANKER_ENABLED": False}))


@pytest.mark.parametrize("cls", [BankerTopicMiddleware, BankerDownloaderMiddleware])
def test_invalid_settings_fail_construction(cls: Any) -> None:
    with pytest.raises(ValueError, match="BANKER_DEFAULT_TOPIC"):
        cls.from_crawler(_crawler({"BANKER_DEFAULT_TOPIC": "no spaces allowed"}))
