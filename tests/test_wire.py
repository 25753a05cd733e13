"""WireGateMiddleware: the last checks before a request the scheduler let go is sent.

What :mod:`scrapy_banker.scheduler.wire` promises, through the middleware's
public methods and the download handler it wraps:

* a host blocked *now* (a 429 arrived after the request was let go) holds
  the request back -- :class:`~scrapy_banker.scheduler.politeness_gate.HeldBack`
  is raised, in ``process_request`` and again in the handler;
* a host with an interval (Crawl-delay, AutoThrottle) has its requests
  spaced by it at the wire, in the handler, measured from the previous one
  sent, and is checked again after the wait;
* a store's check that gives a request back (``GivenBack``) turns it back
  into a request for the engine to schedule (``process_request`` returns
  it; ``process_exception`` does for the handler);
* nothing is checked for requests the scheduler did not hand out, under a
  scheduler with nothing to check, or before the scheduler runs (looked up
  again next time);
* both handler shapes are wrapped: ``download_request_async`` (Scrapy >=
  2.14) and ``download_request`` (2.13), once.

In process, not slow: a real :class:`PolitenessGate` with an injected wall
clock (so a block and an interval are set exactly) and Scrapy's own
requests and stats; the running scheduler, its store and the downloader's
handlers are fakes.  The waits the handler makes are real reactor timers
(pytest-twisted's reactor), kept to a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.test import get_crawler
from twisted.internet import defer

from scrapy_banker.core.directives import ControlState, parse_action
from scrapy_banker.core.meta import META_SLOT
from scrapy_banker.core.politeness import HostState
from scrapy_banker.scheduler import BankerScheduler, running_banker
from scrapy_banker.scheduler.parts import build
from scrapy_banker.scheduler.politeness_gate import CONNECT_MARGIN_S, HeldBack, PolitenessGate
from scrapy_banker.scheduler.seams import StoreFeatures
from scrapy_banker.scheduler.store import MemoryStore
from scrapy_banker.scheduler.wire import GivenBack, WireGateMiddleware
from scrapy_banker.settings import load_config

T0 = 1_800_000_000.0
INTERVAL = 0.2  # seconds between two requests of a host with a Crawl-delay (real waits)


class Clock:
    """The gate's wall clock, moved by hand; after :meth:`run`, it also runs as time does.

    A test whose requests wait at the wire runs it: the wire gate waits on
    the reactor's timers, then asks the gate's clock whether the host's
    interval has passed.
    """

    def __init__(self) -> None:
        self._offset = T0
        self._running = False

    def run(self) -> None:
        self._offset, self._running = self.now - time.monotonic(), True

    @property
    def now(self) -> float:
        return time.monotonic() + self._offset if self._running else self._offset

    @now.setter
    def now(self, value: float) -> None:
        self._offset = value - time.monotonic() if self._running else value

    def __call__(self) -> float:
        return self.now


class AsyncHandlers:
    """Scrapy >= 2.14's ``DownloadHandlers``: records what reached the wire, and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []

    async def download_request_async(self, request: Request) -> str:
        self.sent.append((request.url, time.monotonic()))
        return f"response to {request.url}"


class SyncHandlers:
    """Scrapy 2.13's ``DownloadHandlers``: ``download_request(request, spider)``."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def download_request(self, request: Request, spider: Spider) -> Any:
        self.sent.append(request.url)
        return f"response to {request.url}"


class GivingBackCheck:
    """A store's ``fence`` (a ``WireCheck``) that gives back the URLs it is told to."""

    def __init__(self) -> None:
        self.refuse: set[str] = set()
        self.checked: list[tuple[str, str]] = []

    def check(self, request: Request, where: str) -> None:
        self.checked.append((request.url, where))
        if request.url in self.refuse:
            raise GivenBack("given back")


class Spidey(Spider):
    name = "wire"


def _setup(
    settings: dict[str, Any] | None = None,
    *,
    handlers: object = None,
    fence: object = None,
    running: bool = True,
) -> tuple[WireGateMiddleware, PolitenessGate, Clock]:
    """A middleware on a crawler whose fake running scheduler has a real gate."""
    crawler = get_crawler(Spidey, settings or {})
    assert crawler.stats is not None
    clock = Clock()
    gate = PolitenessGate(
        load_config(crawler.settings), crawler.stats, lambda slot: True, clock=clock
    )
    parts, _ = build(crawler, load_config(crawler.settings), MemoryStore)
    store = SimpleNamespace(features=StoreFeatures(fence=fence))  # type: ignore[arg-type]
    scheduler = BankerScheduler(dataclasses.replace(parts, politeness=gate), store)  # type: ignore[arg-type]
    engine = SimpleNamespace(
        scheduler=scheduler,
        downloader=SimpleNamespace(handlers=AsyncHandlers() if handlers is None else handlers),
    )
    if running:
        crawler.engine = engine  # type: ignore[assignment]
    mw = WireGateMiddleware.from_crawler(crawler)
    mw.engine_ = engine  # type: ignore[attr-defined]  # for a test that starts it later
    return mw, gate, clock


def _req(url: str, slot: str | None = "a.test") -> Request:
    """A request as the scheduler hands it out: its download slot in meta."""
    return Request(url, meta={} if slot is None else {META_SLOT: slot})


def _handlers(mw: WireGateMiddleware) -> Any:
    return mw.crawler.engine.downloader.handlers  # type: ignore[union-attr]


def _send(handlers: Any, request: Request) -> defer.Deferred[Any]:
    """The downloader taking ``request`` out of its slot's queue (Scrapy >= 2.14)."""
    return defer.Deferred.fromCoroutine(handlers.download_request_async(request))


# -- process_request ------------------------------------------------------------------------


def test_a_request_of_a_host_that_is_free_goes_on_to_the_downloader() -> None:
    mw, _, _ = _setup()
    assert mw.process_request(_req("http://a.test/1")) is None
    assert mw.wrapped  # and the handlers are checked from now on


def test_a_request_of_a_host_blocked_after_it_was_let_go_is_held_back() -> None:
    mw, gate, clock = _setup()
    gate.politeness.refused("a.test", clock.now, 30.0)  # a 429 with Retry-After: 30
    with pytest.raises(HeldBack) as raised:
        mw.process_request(_req("http://a.test/1"))
    # An IgnoreRequest: nothing retries it; BankerDownloaderMiddleware puts it back.
    assert isinstance(raised.value, IgnoreRequest)
    assert mw.process_exception(_req("http://a.test/1"), raised.value) is None
    assert mw.process_request(_req("http://b.test/1", "b.test")) is None  # another host
    clock.now += 30.0
    assert mw.process_request(_req("http://a.test/1")) is None  # the block is over


def test_a_request_the_scheduler_did_not_hand_out_is_not_checked() -> None:
    mw, gate, clock = _setup()
    gate.politeness.refused("a.test", clock.now, 30.0)
    # engine.download, robots.txt: no download slot of the scheduler's in meta.
    assert mw.process_request(_req("http://a.test/robots.txt", slot=None)) is None


def test_a_request_the_store_gives_back_is_returned_to_the_engine_to_schedule() -> None:
    fence = GivingBackCheck()
    mw, _, _ = _setup(fence=fence)
    fence.refuse.add("http://a.test/lost")
    kept, lost = _req("http://a.test/kept"), _req("http://a.test/lost")
    assert mw.process_request(kept) is None
    assert mw.process_request(lost) is lost
    assert fence.checked == [
        ("http://a.test/kept", "in the downloader middlewares"),
        ("http://a.test/lost", "in the downloader middlewares"),
    ]


def test_process_exception_turns_back_only_what_a_store_gave_back() -> None:
    mw, _, _ = _setup()
    request = _req("http://a.test/1")
    assert mw.process_exception(request, GivenBack("given back")) is request
    assert mw.process_exception(request, HeldBack("held")) is None
    assert mw.process_exception(request, IgnoreRequest("robots.txt")) is None
    assert mw.process_exception(request, ConnectionError("reset")) is None


def test_with_pushback_off_only_the_operators_directives_are_checked_at_the_wire() -> None:
    # BANKER_PUSHBACK off, a store without a fence: a refused host is not held...
    mw, gate, clock = _setup({"BANKER_PUSHBACK": False})
    handlers = _handlers(mw)
    original = handlers.download_request_async
    gate.politeness.refused("a.test", clock.now, 30.0)
    assert mw.process_request(_req("http://a.test/1")) is None
    # ...but an operator may pause a host at any moment: the handlers are wrapped.
    assert mw.wrapped
    assert handlers.download_request_async != original
    scheduler = running_banker(mw.crawler)
    assert scheduler is not None
    scheduler.control.apply(ControlState().apply(parse_action("pause", ["a.test"])))
    with pytest.raises(HeldBack, match="paused by an operator"):
        mw.process_request(_req("http://a.test/2"))


def test_the_operators_delay_is_a_floor_under_the_hosts_own_interval_at_the_wire() -> None:
    _, gate, clock = _setup()
    assert gate.at_wire(_req("http://a.test/1"), 3.0) == 0.0  # nothing sent before
    assert gate.at_wire(_req("http://a.test/2"), 3.0) == pytest.approx(3.0)
    gate.politeness.crawl_delay("a.test", 5.0)  # a longer Crawl-delay wins
    assert gate.at_wire(_req("http://a.test/3"), 3.0) == pytest.approx(8.0)
    assert gate.last_wire("a.test") == pytest.approx(clock.now + 8.0)
    assert gate.at_wire(_req("http://b.test/1", "b.test"), 0.0) == 0.0


def test_before_the_scheduler_runs_nothing_is_checked_and_it_is_looked_up_again() -> None:
    mw, gate, clock = _setup(running=False)
    gate.politeness.refused("a.test", clock.now, 30.0)
    assert mw.process_request(_req("http://a.test/1")) is None  # no engine yet
    assert not mw.wrapped
    mw.crawler.engine = mw.engine_  # type: ignore[attr-defined]
    with pytest.raises(HeldBack):
        mw.process_request(_req("http://a.test/1"))
    assert mw.wrapped


# -- the download handler (Scrapy >= 2.14) -------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_host_with_an_interval_has_its_requests_spaced_by_it_at_the_wire() -> None:
    mw, gate, clock = _setup()
    clock.run()
    gate.politeness.crawl_delay("a.test", INTERVAL)
    assert mw.process_request(_req("http://a.test/0")) is None  # wraps the handlers
    handlers = _handlers(mw)
    start = time.monotonic()
    # Three requests of the host leave their slot's queue at the same moment.
    results = await defer.gatherResults(
        [_send(handlers, _req(f"http://a.test/{i}")) for i in range(1, 4)]
        + [_send(handlers, _req("http://b.test/1", "b.test"))]
    )
    assert results[0] == "response to http://a.test/1"
    sent = dict(handlers.sent)
    assert [url for url, _ in handlers.sent] == [
        "http://a.test/1",  # at once: nothing sent to the host before
        "http://b.test/1",  # another host: not held behind a.test
        "http://a.test/2",
        "http://a.test/3",
    ]
    assert sent["http://a.test/1"] - start < INTERVAL
    assert sent["http://b.test/1"] - start < INTERVAL
    assert sent["http://a.test/2"] - start >= INTERVAL - 0.01
    assert sent["http://a.test/3"] - start >= 2 * INTERVAL - 0.01
    assert mw.crawler.stats.get_value("banker/pushback/spaced_at_wire") == 2  # type: ignore[union-attr]


@pytest_twisted.ensureDeferred
async def test_a_host_that_blocks_during_the_interval_wait_holds_the_request_back() -> None:
    from twisted.internet import reactor

    mw, gate, clock = _setup()
    clock.run()
    gate.politeness.crawl_delay("a.test", INTERVAL)
    assert mw.process_request(_req("http://a.test/0")) is None
    handlers = _handlers(mw)
    await handlers.download_request_async(_req("http://a.test/1"))
    waiting = _send(handlers, _req("http://a.test/2"))
    assert not waiting.called  # waits its interval
    # A 429 arrives while it waits.
    reactor.callLater(  # type: ignore[attr-defined]
        INTERVAL / 4, gate.politeness.refused, "a.test", clock.now, 30.0
    )
    with pytest.raises(HeldBack):
        await waiting
    assert [url for url, _ in handlers.sent] == ["http://a.test/1"]


@pytest_twisted.ensureDeferred
async def test_the_handler_checks_again_what_waited_in_its_slot_queue() -> None:
    fence = GivingBackCheck()
    mw, gate, clock = _setup(fence=fence)
    assert mw.process_request(_req("http://a.test/1")) is None
    assert mw.process_request(_req("http://a.test/2")) is None
    handlers = _handlers(mw)
    # While both waited in the slot's queue: the host blocked, a lease lapsed.
    fence.refuse.add("http://a.test/2")
    with pytest.raises(GivenBack):
        await handlers.download_request_async(_req("http://a.test/2"))
    gate.politeness.refused("a.test", clock.now, 30.0)
    with pytest.raises(HeldBack):
        await handlers.download_request_async(_req("http://a.test/1"))
    assert handlers.sent == []
    assert ("http://a.test/2", "in its download slot") in fence.checked


@pytest_twisted.ensureDeferred
async def test_the_handlers_are_wrapped_once_however_many_requests_pass() -> None:
    mw, gate, _ = _setup()
    gate.politeness.crawl_delay("a.test", 30.0)
    for i in range(3):
        assert mw.process_request(_req(f"http://a.test/{i}")) is None
    # Wrapped twice, the request would reserve two moments and wait 30 s.
    sending = _send(_handlers(mw), _req("http://a.test/1"))
    assert sending.called
    assert await sending == "response to http://a.test/1"
    assert mw.crawler.stats.get_value("banker/pushback/spaced_at_wire") is None  # type: ignore[union-attr]


# -- the download handler (Scrapy 2.13) ----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_scrapy_2_13_handlers_are_wrapped_too_and_space_and_hold_back_alike() -> None:
    mw, gate, clock = _setup(handlers=SyncHandlers())
    clock.run()
    gate.politeness.crawl_delay("a.test", INTERVAL)
    assert mw.process_request(_req("http://a.test/0")) is None
    assert mw.wrapped
    handlers = _handlers(mw)
    spider = Spidey()
    # Free: the original handler is called at once, its result returned as is.
    assert (
        handlers.download_request(_req("http://a.test/1"), spider) == "response to http://a.test/1"
    )
    # Spaced: a Deferred that sends when the interval is over.
    start = time.monotonic()
    later = handlers.download_request(_req("http://a.test/2"), spider)
    assert isinstance(later, defer.Deferred) and handlers.sent == ["http://a.test/1"]
    assert await later == "response to http://a.test/2"
    assert time.monotonic() - start >= INTERVAL - 0.01
    # Blocked now: held back before the handler is called.
    gate.politeness.refused("a.test", clock.now, 30.0)
    with pytest.raises(HeldBack):
        handlers.download_request(_req("http://a.test/3"), spider)
    assert handlers.sent == ["http://a.test/1", "http://a.test/2"]


def test_an_interval_runs_from_when_the_previous_request_actually_left() -> None:
    mw, gate, clock = _setup()
    gate.politeness.crawl_delay("a.test", 5.0)
    r0, r1, r2, r3 = (_req(f"http://a.test/{i}") for i in (0, 1, 2, 3))
    # The host's first request here left long ago (its margin is the next test's).
    clock.now = T0 - 60.0
    assert gate.at_wire(r0) == 0.0 and gate.on_wire(r0) == 0.0
    clock.now = T0
    assert gate.at_wire(r1) == 0.0 and gate.on_wire(r1) == 0.0  # left at T0
    # Two more leave their slot's queue at once: reserved at T0 + 5 and T0 + 10.
    assert gate.at_wire(r2) == pytest.approx(5.0)
    assert gate.at_wire(r3) == pytest.approx(10.0)
    # r2's timer fires 0.3 s late (a busy reactor): it leaves at T0 + 5.3...
    clock.now = T0 + 5.3
    assert gate.on_wire(r2) == 0.0
    # ...so r3, on time at T0 + 10, waits until T0 + 10.3: 5 s after r2 reached the server.
    clock.now = T0 + 10.0
    assert gate.on_wire(r3) == pytest.approx(0.3)
    clock.now = T0 + 10.3
    assert gate.on_wire(r3) == 0.0
    assert mw.crawler.stats.get_value("banker/pushback/respaced_at_wire") == 1  # type: ignore[union-attr]
    # The next reservation starts from the last actual departure.
    assert gate.at_wire(_req("http://a.test/4")) == pytest.approx(5.0)
    assert gate.on_wire(_req("http://b.test/1", "b.test")) == 0.0  # no interval: nothing kept
    # The host's state keeps the actual departure: what a fleet hands to the
    # host's next owner.
    assert gate.politeness.get("a.test").last_sent == pytest.approx(T0 + 10.3, abs=1e-6)
    assert set(gate.politeness.take_sent()) == {"a.test"}


def test_a_hosts_first_spaced_request_from_this_process_is_given_time_to_arrive() -> None:
    _, gate, clock = _setup()
    gate.politeness.crawl_delay("a.test", 5.0)
    gate.politeness.crawl_delay("b.test", 0.2)
    r1, r2 = _req("http://a.test/1"), _req("http://a.test/2")
    assert gate.at_wire(r1) == 0.0 and gate.on_wire(r1) == 0.0
    # It may reach the server late (it opens the connection): the next one
    # is spaced from its departure plus the margin...
    assert gate.at_wire(r2) == pytest.approx(5.0 + CONNECT_MARGIN_S)
    clock.now = T0 + 5.0
    assert gate.on_wire(r2) == pytest.approx(CONNECT_MARGIN_S)
    clock.now = T0 + 5.0 + CONNECT_MARGIN_S
    assert gate.on_wire(r2) == 0.0
    # ...once.
    assert gate.at_wire(_req("http://a.test/3")) == pytest.approx(5.0)
    # At most half a short interval.
    b1, b2 = _req("http://b.test/1", "b.test"), _req("http://b.test/2", "b.test")
    assert gate.on_wire(b1) == 0.0
    assert gate.on_wire(b2) == pytest.approx(0.3)
    # A request the scheduler did not hand out (robots.txt) is never spaced,
    # whatever the operator's floor.
    robots = _req("http://a.test/robots.txt", None)
    assert gate.at_wire(robots, floor=10.0) == 0.0 and gate.on_wire(robots, floor=10.0) == 0.0


class Turns:
    """A reactor's zero-delay timers, run turn by turn: what is set in one turn runs in the next."""

    def __init__(self) -> None:
        self.pending: list[Any] = []

    def schedule(self, delay: float, func: Any) -> Any:
        assert delay == 0.0
        self.pending.append(func)
        return SimpleNamespace(cancel=lambda: None)

    def turn(self) -> None:
        due, self.pending = self.pending, []
        for func in due:
            func()


def test_a_requests_departure_is_when_its_bytes_left_not_when_it_was_handed_over() -> None:
    crawler = get_crawler(Spidey, {})
    assert crawler.stats is not None
    clock, turns = Clock(), Turns()
    gate = PolitenessGate(
        load_config(crawler.settings), crawler.stats, lambda slot: True,
        clock=clock, schedule=turns.schedule,
    )  # fmt: skip
    gate.politeness.crawl_delay("a.test", 5.0)
    gate.politeness.crawl_delay("b.test", 5.0)
    clock.now = T0 - 60.0  # the hosts' first requests (and their margin) long ago
    assert gate.on_wire(_req("http://a.test/0")) == 0.0
    assert gate.on_wire(_req("http://b.test/0", "b.test")) == 0.0
    turns.turn(), turns.turn(), turns.turn()
    assert not turns.pending  # nothing in flight to the socket: no timer runs
    # Both are handed to the handler at T0, in a turn that then stays busy for
    # 90 ms (the socket is written at its end) -- one timer for both.
    clock.now = T0
    assert gate.on_wire(_req("http://a.test/1")) == 0.0
    assert gate.on_wire(_req("http://b.test/1", "b.test")) == 0.0
    assert len(turns.pending) == 1
    clock.now = T0 + 0.09
    turns.turn()  # the next turn: after the poll that wrote them (or before, if let go in a poll)
    clock.now = T0 + 0.1
    turns.turn()  # the turn after: they left by now
    assert not turns.pending
    for slot in ("a.test", "b.test"):
        assert gate.politeness.get(slot).last_sent == pytest.approx(T0 + 0.1, abs=1e-6)
    # The next request, due 5 s after the hand-over, waits until 5 s after they left.
    clock.now = T0 + 5.0
    assert gate.on_wire(_req("http://a.test/2")) == pytest.approx(0.1)
    assert gate.at_wire(_req("http://b.test/2", "b.test")) == pytest.approx(0.1)


def test_a_host_taken_over_is_spaced_from_the_previous_owners_last_departure() -> None:
    _, gate, clock = _setup()
    # Another node sent a request of the host 1 s ago (its Crawl-delay is 5 s),
    # and this node becomes its owner: its first request waits 4 s more, at
    # dispatch and at the wire alike.
    gate.adopt({"a.test": HostState(crawl_delay=5.0, last_sent=T0 - 1.0)})
    assert gate.politeness.ready_at("a.test") == pytest.approx(T0 + 4.0, abs=1e-6)
    r1 = _req("http://a.test/1")
    assert gate.at_wire(r1) == pytest.approx(4.0)
    clock.now = T0 + 4.0
    assert gate.on_wire(r1) == 0.0
    # Its first here: the next one keeps the margin too.
    assert gate.at_wire(_req("http://a.test/2")) == pytest.approx(5.0 + CONNECT_MARGIN_S)
    # Taken over again later (its partition went and came back): the same.
    gate.adopt({"a.test": HostState(crawl_delay=5.0, last_sent=T0 + 30.0)})
    clock.now = T0 + 35.0
    assert gate.on_wire(_req("http://a.test/3")) == 0.0
    assert gate.at_wire(_req("http://a.test/4")) == pytest.approx(5.0 + CONNECT_MARGIN_S)


def test_a_downloader_without_either_handler_method_leaves_the_middleware_last() -> None:
    mw, gate, clock = _setup(handlers=SimpleNamespace())
    assert mw.process_request(_req("http://a.test/1")) is None
    assert not mw.wrapped  # the middleware's check is then the last one
    gate.politeness.refused("a.test", clock.now, 30.0)
    with pytest.raises(HeldBack):
        mw.process_request(_req("http://a.test/2"))
