"""The URL memo in front of Scrapy's dupefilter: same answers, fewer fingerprints."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.test import get_crawler

from scrapy_banker.scheduler.dupes import SeenURLs


class Counting:
    """Count the dupefilter's real checks (an instance attribute: its type stays Scrapy's)."""

    def __init__(self, df: RFPDupeFilter) -> None:
        self.calls = 0
        self.real = df.request_seen
        df.request_seen = self  # type: ignore[method-assign]

    def __call__(self, request: Request) -> bool:
        self.calls += 1
        return bool(self.real(request))


def _memo(settings: dict[str, Any] | None = None, size: int = 100) -> tuple[SeenURLs, Any]:
    crawler = get_crawler(Spider, settings or {})
    df = RFPDupeFilter.from_crawler(crawler)
    df.open()
    return SeenURLs(df, size=size), Spider.from_crawler(crawler, name="s")


def test_repeats_are_answered_without_fingerprinting_and_still_counted() -> None:
    memo, spider = _memo()
    counting = Counting(memo.df)  # type: ignore[arg-type]
    urls = [f"http://a.test/{i % 5}" for i in range(50)]
    answers = [memo.is_duplicate(Request(u), spider) for u in urls]
    assert answers == [False] * 5 + [True] * 45
    assert counting.calls == 5 and memo.memo.hits == 45
    assert spider.crawler.stats.get_value("dupefilter/filtered") == 45


def test_what_the_url_alone_does_not_decide_goes_to_the_dupefilter() -> None:
    memo, spider = _memo()
    counting = Counting(memo.df)  # type: ignore[arg-type]
    for _ in range(2):
        memo.is_duplicate(Request("http://a.test/p", method="POST", body=b"x"), spider)
        memo.is_duplicate(Request("http://a.test/g", body=b"x"), spider)
        memo.is_duplicate(Request("http://a.test/v", meta={"verbatim_url": True}), spider)
    assert counting.calls == 6 and memo.memo.hits == 0
    # Canonical twins are the dupefilter's answer, not the memo's.
    assert memo.is_duplicate(Request("http://a.test/q?b=2&a=1"), spider) is False
    assert memo.is_duplicate(Request("http://a.test/q?a=1&b=2"), spider) is True
    assert memo.memo.hits == 0
    assert memo.is_duplicate(Request("http://a.test/q?a=1&b=2", dont_filter=True), spider) is False


class OwnDupeFilter(RFPDupeFilter):
    def request_seen(self, request: Request) -> bool:
        return False  # a project's own rule: never a duplicate


@pytest.mark.parametrize("setting", ["DUPEFILTER_CLASS", "REQUEST_FINGERPRINTER_CLASS"])
def test_another_dupefilter_or_fingerprinter_is_asked_every_time(setting: str) -> None:
    from scrapy.utils.request import RequestFingerprinter

    class OwnFingerprinter(RequestFingerprinter):
        pass

    value = OwnDupeFilter if setting == "DUPEFILTER_CLASS" else OwnFingerprinter
    crawler = get_crawler(Spider, {setting: value})
    spider = Spider.from_crawler(crawler, name="s")
    df = crawler.settings["DUPEFILTER_CLASS"]
    df = (df if isinstance(df, type) else RFPDupeFilter).from_crawler(crawler)
    memo = SeenURLs(df)
    assert memo.memo.enabled is False
    answers = [memo.is_duplicate(Request("http://a.test/"), spider) for _ in range(3)]
    expected = [False] * 3 if value is OwnDupeFilter else [False, True, True]
    assert answers == expected and memo.memo.hits == 0


def test_the_memo_is_bounded_and_forgets_the_oldest() -> None:
    memo, spider = _memo(size=3)
    counting = Counting(memo.df)  # type: ignore[arg-type]
    for u in ("a", "b", "c", "d"):
        memo.is_duplicate(Request(f"http://a.test/{u}"), spider)
    assert len(memo.memo) == 3
    assert memo.is_duplicate(Request("http://a.test/a"), spider) is True  # from the dupefilter
    assert counting.calls == 5 and memo.memo.hits == 0
    assert memo.is_duplicate(Request("http://a.test/d"), spider) is True and memo.memo.hits == 1
