"""Reach the running scheduler from other components, across Scrapy versions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from scrapy import Request
    from scrapy.crawler import Crawler


def running_scheduler(crawler: Crawler) -> Any:
    """The scheduler instance of the running crawl, or None before/after it."""
    try:
        engine = crawler.engine
    except RuntimeError:  # Scrapy >= 2.14: no engine yet
        return None
    scheduler = getattr(engine, "scheduler", None)  # Scrapy >= 2.14
    if scheduler is None:
        slot = getattr(engine, "slot", None) or getattr(engine, "_slot", None)
        scheduler = getattr(slot, "scheduler", None)
    return scheduler


def requests_in_progress(crawler: Crawler) -> Collection[Request] | None:
    """Requests the engine is still downloading or scraping (callback output included).

    A request leaves this set only after its response went through the
    spider and every request the callback yielded was scheduled, which is
    the moment a distributed frontier may acknowledge it.  None when the
    engine does not expose it (another Scrapy version).
    """
    try:
        engine = crawler.engine
    except RuntimeError:
        return None
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    inprogress = getattr(slot, "inprogress", None)
    return inprogress if isinstance(inprogress, (set, frozenset)) else None


def scraper_backlog(crawler: Crawler) -> int:
    """Responses in Scrapy's scraper now (parsed, or their output being scheduled); 0 if unknown."""
    try:
        engine = crawler.engine
    except RuntimeError:
        return 0
    slot = getattr(getattr(engine, "scraper", None), "slot", None)
    active = getattr(slot, "active", None)
    return len(active) if active is not None else 0


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to call ``next_request`` now rather than on its 5 s heartbeat."""
    try:
        engine = crawler.engine
    except RuntimeError:
        return
    slot = getattr(engine, "_slot", None) or getattr(engine, "slot", None)
    nextcall = getattr(slot, "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def looping_call(func: Callable[[], Any]) -> Any:
    """A ``LoopingCall``-like timer that also runs without a Twisted reactor (Scrapy >= 2.14)."""
    try:
        from scrapy.utils.asyncio import create_looping_call
    except ImportError:  # Scrapy 2.13
        from twisted.internet.task import LoopingCall

        return LoopingCall(func)
    return create_looping_call(func)


def later(seconds: float) -> Any:
    """A Deferred fired after ``seconds`` on the reactor (imported here: importing it at
    module level would install the default reactor before Scrapy installs its own)."""
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    return deferLater(reactor, seconds, lambda: None)


async def sleep(seconds: float) -> None:
    """Wait ``seconds`` on the reactor, from a coroutine."""
    from scrapy.utils.defer import maybe_deferred_to_future

    await maybe_deferred_to_future(later(seconds))


class Timer(Protocol):
    """A one-shot timer that can be cancelled (before or after it fired)."""

    def cancel(self) -> None: ...


class _TwistedTimer:
    """``reactor.callLater``'s ``DelayedCall`` with a ``cancel`` that never raises."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def cancel(self) -> None:
        if self._call.active():
            self._call.cancel()


def call_later(delay: float, func: Callable[[], Any]) -> Timer:
    """Call ``func`` once after ``delay`` seconds, on the loop the engine runs on.

    Scrapy >= 2.14's ``call_later`` (an asyncio timer under the asyncio
    reactor or without a reactor, a Twisted ``DelayedCall`` otherwise);
    ``reactor.callLater`` on Scrapy 2.13.
    """
    try:
        from scrapy.utils.asyncio import call_later as scrapy_call_later
    except ImportError:  # Scrapy 2.13
        from twisted.internet import reactor

        installed: Any = reactor
        return _TwistedTimer(installed.callLater(max(0.0, delay), func))
    return scrapy_call_later(max(0.0, delay), func)


def close_spider(crawler: Crawler, reason: str) -> None:
    """Close the running spider with ``reason``, as Scrapy's CloseSpider extension does."""
    engine = getattr(crawler, "engine", None)
    if engine is None:
        return
    close_async = getattr(engine, "close_spider_async", None)
    if close_async is not None:  # Scrapy >= 2.14
        from scrapy.utils.defer import deferred_from_coro

        deferred_from_coro(close_async(reason=reason))
    else:
        engine.close_spider(crawler.spider, reason)
