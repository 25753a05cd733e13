"""LeaseFence: a leased request is sent only on a lease this node can still prove.

What :mod:`scrapy_banker.redis.store.lease_fence` promises, through the class's public
methods: a request whose lease lapsed while it waited between the scheduler
and the socket is not sent -- :meth:`LeaseFence.check` raises
:class:`LeaseFenced` (a ``GivenBack``, so an ``IgnoreRequest`` nothing
retries), nacks the lease with its delivery number, forgets it in the ack
book so it is never acked, counts ``banker/redis/fenced_at_send`` -- and is
dropped when the engine schedules it again (:meth:`LeaseFence.swallow`).  A
request that came with no lease (``engine.download``, robots.txt, a spider's
own meta) always passes.

In process, not slow: the worker and the ack book are fakes recording what
the fence asks of them (the real ``FrontierWorker.holds`` is tested with the
worker); the clock is injected; requests and stats are Scrapy's own.  The
last test goes through :class:`~scrapy_banker.scheduler.wire.WireGateMiddleware`,
the fence's only caller in a crawl, to pin the hand-over between the two.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.statscollectors import StatsCollector
from scrapy.utils.test import get_crawler

from scrapy_banker.core.meta import META_LEASE
from scrapy_banker.core.ops import LeaseToken
from scrapy_banker.redis.store.lease_fence import LeaseFence, LeaseFenced
from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler.parts import build
from scrapy_banker.scheduler.seams import StoreFeatures
from scrapy_banker.scheduler.store import MemoryStore
from scrapy_banker.scheduler.wire import GivenBack, WireGateMiddleware
from scrapy_banker.settings import load_config

PARTITIONS = 8
NOW = 1234.5


class FakeWorker:
    """What the fence asks of a ``FrontierWorker``: ``holds`` and ``nack``, recorded."""

    def __init__(self, *, lost: set[LeaseToken] | None = None) -> None:
        #: Tokens whose lease this "node" can no longer prove.
        self.lost = lost if lost is not None else set()
        self.asked: list[tuple[LeaseToken, float]] = []
        self.nacked: list[LeaseToken] = []

    def holds(self, token: LeaseToken, now: float) -> bool:
        self.asked.append((token, now))
        return token not in self.lost

    def nack(self, token: LeaseToken) -> None:
        self.nacked.append(token)


class FakeAcks:
    """An ``AckBook``'s ``pending``: dispatched requests not acknowledged yet."""

    def __init__(self) -> None:
        self.pending: dict[Request, LeaseToken] = {}


class Spidey(Spider):
    name = "fence"


def _stats() -> StatsCollector:
    """A crawler's own stats collector (Scrapy's ``MemoryStatsCollector``)."""
    stats = get_crawler(Spidey).stats
    assert stats is not None
    return stats


def _fence(worker: FakeWorker, acks: FakeAcks | None = None) -> tuple[LeaseFence, Any]:
    stats = _stats()
    fence = LeaseFence(
        worker,  # type: ignore[arg-type]
        acks or FakeAcks(),  # type: ignore[arg-type]
        stats,
        partitions=PARTITIONS,
        clock=lambda: NOW,
    )
    return fence, stats


def _leased(url: str, token: LeaseToken, acks: FakeAcks | None = None) -> Request:
    request = Request(url, meta={META_LEASE: token})
    if acks is not None:
        acks.pending[request] = token  # dispatched: AckBook.dispatched noted it
    return request


TOKEN = LeaseToken(partition=3, id="abc", delivery=2, leased_at=1000.0, epoch=7)


def test_a_request_with_no_lease_always_passes_and_the_worker_is_not_asked() -> None:
    worker = FakeWorker()
    fence, stats = _fence(worker)
    for request in (
        Request("http://a.test/robots.txt"),  # engine.download, robots.txt
        Request("http://a.test/1", meta={META_LEASE: "not a token"}),  # a spider's own meta
        Request("http://a.test/2", meta={META_LEASE: LeaseToken(PARTITIONS, "x", 1)}),
        Request("http://a.test/3", meta={META_LEASE: LeaseToken(-1, "x", 1)}),
    ):
        assert fence.holds(request)
        fence.check(request, "in the downloader middlewares")  # does not raise
        fence.give_back(request, "anywhere")  # a no-op: nothing to nack
    assert worker.asked == [] and worker.nacked == []
    assert fence.given_back == set()
    assert stats.get_value("banker/redis/fenced_at_send") is None


def test_a_request_whose_lease_is_held_goes_to_the_wire_untouched() -> None:
    worker, acks = FakeWorker(), FakeAcks()
    fence, stats = _fence(worker, acks)
    request = _leased("http://a.test/1", TOKEN, acks)
    assert fence.holds(request)
    fence.check(request, "in its download slot")
    assert worker.asked == [(TOKEN, NOW)] * 2  # asked at the injected clock's time
    assert worker.nacked == []
    assert acks.pending == {request: TOKEN}  # still to be acked when done
    assert not fence.swallow(request)
    assert stats.get_value("banker/redis/fenced_at_send") is None


def test_a_request_whose_lease_lapsed_is_not_sent_but_given_back_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker, acks = FakeWorker(lost={TOKEN}), FakeAcks()
    fence, stats = _fence(worker, acks)
    request = _leased("http://a.test/lapsed", TOKEN, acks)
    with (
        caplog.at_level(logging.WARNING, "scrapy_banker.redis.store.lease_fence"),
        pytest.raises(LeaseFenced) as raised,
    ):
        fence.check(request, "in its download slot")
    # An IgnoreRequest through GivenBack: RetryMiddleware does not retry it,
    # Scrapy does not log it as an error, the wire gate turns it back.
    assert isinstance(raised.value, GivenBack)
    assert isinstance(raised.value, IgnoreRequest)
    # Nacked with its delivery number (the token itself), never acked.
    assert worker.nacked == [TOKEN]
    assert worker.nacked[0].ref == "abc#2"
    assert request not in acks.pending
    assert fence.given_back == {request}
    assert stats.get_value("banker/redis/fenced_at_send") == 1
    assert "http://a.test/lapsed" in caplog.text
    assert "partition 3" in caplog.text and "in its download slot" in caplog.text


def test_a_given_back_request_is_swallowed_once_when_the_engine_schedules_it_again() -> None:
    worker, acks = FakeWorker(lost={TOKEN}), FakeAcks()
    fence, _ = _fence(worker, acks)
    request = _leased("http://a.test/1", TOKEN, acks)
    with pytest.raises(LeaseFenced):
        fence.check(request, "in the downloader middlewares")
    # A copy with the same URL is another request: the spider's, not dropped.
    assert not fence.swallow(request.replace())
    assert fence.swallow(request)  # the engine schedules it again: dropped
    assert fence.given_back == set()
    assert not fence.swallow(request)  # once: a later schedule of it is not dropped


def test_each_request_fenced_counts_once_and_only_the_lapsed_ones_are_given_back() -> None:
    lapsed = [LeaseToken(p, f"id{p}", 1) for p in (0, 5)]
    held = LeaseToken(2, "id2", 1)
    worker, acks = FakeWorker(lost=set(lapsed)), FakeAcks()
    fence, stats = _fence(worker, acks)
    requests = {t: _leased(f"http://h{t.partition}.test/", t, acks) for t in [*lapsed, held]}
    fenced = []
    for token, request in requests.items():
        try:
            fence.check(request, "in its download slot")
        except LeaseFenced:
            fenced.append(token)
    assert fenced == lapsed
    assert worker.nacked == lapsed
    assert set(acks.pending) == {requests[held]}
    assert fence.given_back == {requests[t] for t in lapsed}
    assert stats.get_value("banker/redis/fenced_at_send") == 2


def test_the_lease_is_judged_at_the_clock_of_each_check() -> None:
    times = iter([10.0, 99.0])
    seen: list[float] = []

    class ExpiringWorker(FakeWorker):
        def holds(self, token: LeaseToken, now: float) -> bool:
            seen.append(now)
            return now < 50.0  # the lease ran out between the two checks

    worker = ExpiringWorker()
    fence = LeaseFence(
        worker,  # type: ignore[arg-type]
        FakeAcks(),  # type: ignore[arg-type]
        _stats(),
        partitions=PARTITIONS,
        clock=lambda: next(times),
    )
    request = _leased("http://a.test/1", TOKEN)
    fence.check(request, "in the downloader middlewares")
    with pytest.raises(LeaseFenced):
        fence.check(request, "in its download slot")
    assert seen == [10.0, 99.0]
    assert worker.nacked == [TOKEN]


# -- through the wire gate, the fence's caller ---------------------------------------------


class FakeHandlers:
    """Scrapy >= 2.14's ``DownloadHandlers``: what reached the wire."""

    def __init__(self) -> None:
        self.sent: list[Request] = []

    async def download_request_async(self, request: Request) -> str:
        self.sent.append(request)
        return "response"


def _wire(fence: LeaseFence) -> tuple[WireGateMiddleware, FakeHandlers]:
    crawler = get_crawler(Spidey)
    handlers = FakeHandlers()
    # A running scheduler whose store has a fence (its hosts have no politeness state).
    parts, _ = build(crawler, load_config(crawler.settings), MemoryStore)
    store = SimpleNamespace(features=StoreFeatures(fence=fence))
    scheduler = BankerScheduler(parts, store)  # type: ignore[arg-type]
    crawler.engine = SimpleNamespace(  # type: ignore[assignment]
        scheduler=scheduler, downloader=SimpleNamespace(handlers=handlers)
    )
    return WireGateMiddleware.from_crawler(crawler), handlers


def test_the_wire_gate_turns_a_request_fenced_in_the_middlewares_back_to_the_engine() -> None:
    worker, acks = FakeWorker(lost={TOKEN}), FakeAcks()
    fence, stats = _fence(worker, acks)
    mw, handlers = _wire(fence)
    held = _leased("http://a.test/held", LeaseToken(1, "ok", 1), acks)
    lapsed = _leased("http://a.test/lapsed", TOKEN, acks)
    assert mw.process_request(held) is None  # goes on to the downloader
    assert mw.process_request(lapsed) is lapsed  # the engine schedules it again...
    assert fence.swallow(lapsed)  # ...and the store drops it there
    assert worker.nacked == [TOKEN]
    assert stats.get_value("banker/redis/fenced_at_send") == 1
    assert handlers.sent == []


def test_the_wire_gate_turns_a_request_fenced_in_the_download_handler_back_too() -> None:
    worker, acks = FakeWorker(), FakeAcks()
    fence, stats = _fence(worker, acks)
    mw, handlers = _wire(fence)
    request = _leased("http://a.test/1", TOKEN, acks)
    assert mw.process_request(request) is None  # held in the middlewares
    assert mw.wrapped
    worker.lost.add(TOKEN)  # ...lapsed while it waited in its slot's queue
    coro = mw.crawler.engine.downloader.handlers.download_request_async(request)  # type: ignore[union-attr]
    with pytest.raises(LeaseFenced) as raised:
        coro.send(None)  # fails before anything is awaited: no reactor needed
    assert handlers.sent == []
    assert mw.process_exception(request, raised.value) is request
    assert fence.swallow(request)
    assert stats.get_value("banker/redis/fenced_at_send") == 1
