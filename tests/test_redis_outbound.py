"""The fleet's dedup shortcut before a request is encoded for Redis (no Redis needed).

``Outbound.is_duplicate`` drops a request whose fingerprint Redis confirmed
seen; a repeat of a URL string found so is answered from memory, without
fingerprinting it again -- only with Scrapy's own fingerprinter, for which a
``GET``'s fingerprint is its URL's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler

from scrapy_banker.redis.store.outbound import Outbound


class _Fingerprinter(RequestFingerprinter):
    """Another fingerprinter (a subclass): its fingerprints may not follow the URL."""


def _outbound(fingerprinter_cls: type[RequestFingerprinter] = RequestFingerprinter) -> Any:
    crawler = get_crawler()
    fingerprinter = fingerprinter_cls(crawler)
    calls: list[str] = []
    real = fingerprinter.fingerprint

    def counting(request: Request) -> bytes:
        calls.append(request.url)
        return real(request)

    fingerprinter.fingerprint = counting  # type: ignore[method-assign]
    worker = SimpleNamespace(seen=set())
    parts = SimpleNamespace(stats=crawler.stats)
    out = Outbound(parts, worker, fingerprinter, partitions=8)  # type: ignore[arg-type]
    return out, worker, real, calls, crawler.stats


def test_a_confirmed_url_is_answered_from_memory_the_next_times() -> None:
    out, worker, fingerprint, calls, stats = _outbound()
    url = "http://a.test/page"
    assert out.is_duplicate(Request(url)) is False  # not confirmed yet: fingerprinted
    worker.seen.add(fingerprint(Request(url)).hex())  # Redis confirmed it
    assert out.is_duplicate(Request(url)) is True
    assert len(calls) == 2
    for _ in range(3):
        assert out.is_duplicate(Request(url)) is True
    assert len(calls) == 2  # the repeats were not fingerprinted
    assert stats.get_value("banker/redis/duplicates_cached") == 4
    # Not a duplicate by URL alone: another method, a body, dont_filter.
    assert out.is_duplicate(Request(url, method="POST")) is False
    assert out.is_duplicate(Request(url, body=b"x")) is False
    assert out.is_duplicate(Request(url, dont_filter=True)) is False
    assert len(calls) == 4


def test_another_fingerprinter_fingerprints_every_request() -> None:
    out, worker, fingerprint, calls, _ = _outbound(_Fingerprinter)
    url = "http://a.test/page"
    worker.seen.add(fingerprint(Request(url)).hex())
    for _ in range(3):
        assert out.is_duplicate(Request(url)) is True
    assert len(calls) == 3
