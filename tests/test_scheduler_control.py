"""ControlGate (scrapy_banker.scheduler.control_gate): directives and budgets, unit-tested.

The gate is where pause, delay, limit and the one-node budgets take effect
on a running crawl.  Its other tests are crawls; these are plain pytest, fast
enough for the inner loop (issue #31).  The gate's collaborators are small
stand-ins: a downloader view (``inflight`` and a ``downloader`` whose
``slots`` hold objects with a ``concurrency``), a room check, an injected
clock and timer scheduler, so a delay's wake-up is fired by the test.
Requests and the stats collector are Scrapy's own.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Request
from scrapy.statscollectors import StatsCollector
from scrapy.utils.test import get_crawler

from scrapy_banker.core.directives import BudgetRules, ControlState, parse_action
from scrapy_banker.core.frontier import Entry
from scrapy_banker.core.meta import META_CHARGED, META_SLOT
from scrapy_banker.core.topics import TopicScheduler
from scrapy_banker.scheduler.control_gate import (
    CLOSE_BUDGET,
    CLOSE_CRAWL_BUDGET,
    Charge,
    ControlGate,
    unused,
)
from scrapy_banker.scheduler.politeness_gate import HeldBack

HOST = "a.test"
OTHER = "b.test"


class FakeTimer:
    def __init__(self, delay: float, func: Callable[[], Any]) -> None:
        self.delay = delay
        self.func = func
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        assert not self.cancelled
        self.func()


class Rig:
    """A gate and the stand-ins it was built with."""

    def __init__(self, rules: BudgetRules | None = None, *, room: bool = True) -> None:
        self.now = 1000.0
        self.timers: list[FakeTimer] = []
        self.ready: list[list[str]] = []
        self.slots: dict[str, SimpleNamespace] = {}
        self.view = SimpleNamespace(inflight={}, downloader=SimpleNamespace(slots=self.slots))
        self.stats = StatsCollector(get_crawler())
        self.room = room
        #: Slot -> when its last request went to the wire (the politeness gate's record).
        self.wire: dict[str, float] = {}
        self.gate = ControlGate(
            self.stats,
            self.view,  # type: ignore[arg-type]
            lambda slot: self.room,
            rules or BudgetRules(),
            last_wire=lambda slot: self.wire.get(slot, 0.0),
            on_ready=self.ready.append,
            clock=lambda: self.now,
            schedule=self._schedule,
        )
        self._seq = 0

    def _schedule(self, delay: float, func: Callable[[], Any]) -> FakeTimer:
        timer = FakeTimer(delay, func)
        self.timers.append(timer)
        return timer

    def entry(self, host: str = HOST, topic: str = "default") -> Entry[Request]:
        self._seq += 1
        request = Request(f"https://{host}/{self._seq}", meta={META_SLOT: host})
        return Entry(request, topic, host, f"{topic}:{host}", 0, 0, self._seq)

    def stat(self, key: str) -> Any:
        return self.stats.get_value(key)


def directives(*actions: tuple[str, ...], state: ControlState | None = None) -> ControlState:
    """The state after the operator's ``actions`` (each a verb and its words)."""
    state = state or ControlState()
    for verb, *args in actions:
        state = state.apply(parse_action(verb, args))
    return state


# -- the room check ----------------------------------------------------------------------


def test_with_no_directive_the_room_check_decides() -> None:
    rig = Rig()
    assert rig.gate.is_free(HOST)
    rig.room = False
    assert not rig.gate.is_free(HOST)


def test_a_paused_host_has_no_room_and_comes_back_when_resumed() -> None:
    rig = Rig()
    paused = directives(("pause", HOST))
    rig.gate.apply(paused)
    assert not rig.gate.is_free(HOST)
    assert rig.gate.is_free(OTHER)
    rig.gate.apply(directives(("resume", HOST), state=paused))
    assert rig.gate.is_free(HOST)
    assert rig.ready[-1] == [HOST]


def test_a_delayed_host_waits_its_delay_and_the_timer_wakes_its_slot() -> None:
    rig = Rig()
    rig.gate.apply(directives(("delay", HOST, "2")))
    assert rig.gate.is_free(HOST)  # nothing sent yet
    rig.wire[HOST] = rig.now
    rig.now += 0.5
    assert not rig.gate.is_free(HOST)
    assert not rig.gate.is_free(HOST)
    [timer] = rig.timers  # one wake-up however often it is asked
    assert timer.delay == pytest.approx(1.5)
    rig.ready.clear()
    rig.now += 1.5
    timer.fire()
    assert rig.ready == [[HOST]]
    assert rig.gate.is_free(HOST)


def test_a_delay_schedules_a_new_wake_up_after_the_last_one_fired() -> None:
    rig = Rig()
    rig.gate.apply(directives(("delay", HOST, "1")))
    rig.wire[HOST] = rig.now
    assert not rig.gate.is_free(HOST)
    rig.now += 1
    rig.timers[0].fire()
    rig.wire[HOST] = rig.now
    assert not rig.gate.is_free(HOST)
    assert len(rig.timers) == 2


def test_a_limited_host_has_no_room_at_its_limit() -> None:
    rig = Rig()
    rig.gate.apply(directives(("limit", HOST, "2")))
    rig.view.inflight[HOST] = 1
    assert rig.gate.is_free(HOST)
    rig.view.inflight[HOST] = 2
    assert not rig.gate.is_free(HOST)
    assert rig.gate.is_free(OTHER)


def test_close_cancels_a_pending_wake_up() -> None:
    rig = Rig()
    rig.gate.apply(directives(("delay", HOST, "5")))
    rig.wire[HOST] = rig.now
    assert not rig.gate.is_free(HOST)
    rig.gate.close()
    assert rig.timers[0].cancelled


# -- the wire ----------------------------------------------------------------------------


def test_a_request_of_a_paused_host_is_held_back_at_the_wire_and_counted() -> None:
    rig = Rig()
    rig.gate.apply(directives(("pause", HOST)))
    with pytest.raises(HeldBack, match=r"a\.test is paused by an operator"):
        rig.gate.check(rig.entry(HOST).item)
    rig.gate.check(rig.entry(OTHER).item)  # not paused: goes on
    assert rig.stat("banker/control/held_back") == 1


def test_the_operators_delay_is_what_the_wire_spaces_a_hosts_requests_by_at_least() -> None:
    rig = Rig()
    request = rig.entry(HOST).item
    assert rig.gate.delay(request) == 0.0
    rig.gate.apply(directives(("delay", HOST, "3")))
    assert rig.gate.delay(request) == 3.0
    assert rig.gate.delay(rig.entry(OTHER).item) == 0.0


# -- budgets on one node -----------------------------------------------------------------


def test_with_no_budget_every_page_is_counted_and_charged() -> None:
    rig = Rig()
    assert not rig.gate.budgets_active
    assert rig.gate.counting
    entries = [rig.entry() for _ in range(3)]
    assert all(rig.gate.charge(e) for e in entries)
    assert rig.gate.book is not None
    assert rig.gate.book.crawl == 3
    assert rig.gate.book.hosts == {HOST: 3}
    charged = entries[0].item.meta[META_CHARGED]
    assert isinstance(charged, Charge)
    assert (charged.host, charged.topic, charged.refunded) == (HOST, "default", False)


def test_a_request_over_its_host_budget_is_held_and_counted() -> None:
    rig = Rig(BudgetRules(default=2))
    assert rig.gate.budgets_active
    assert rig.gate.charge(rig.entry())
    assert rig.gate.charge(rig.entry())
    over = rig.entry()
    assert not rig.gate.charge(over)
    assert rig.gate.held == [over]
    assert META_CHARGED not in over.item.meta
    assert rig.stat("banker/budget/held") == 1
    assert rig.gate.charge(rig.entry(OTHER))  # another host's budget is its own


def test_a_request_over_its_topic_budget_is_held() -> None:
    rig = Rig(BudgetRules(topics={"news": 1}))
    assert rig.gate.charge(rig.entry(topic="news"))
    held = rig.entry(OTHER, topic="news")
    assert not rig.gate.charge(held)
    assert rig.gate.held == [held]
    assert rig.gate.charge(rig.entry(topic="default"))


def test_a_request_over_the_crawl_budget_is_held_whatever_its_host() -> None:
    rig = Rig(BudgetRules(crawl=2))
    assert rig.gate.charge(rig.entry(HOST))
    assert rig.gate.charge(rig.entry(OTHER))
    assert not rig.gate.charge(rig.entry("c.test"))
    assert rig.stat("banker/budget/held") == 1


def test_a_budget_set_later_counts_the_pages_charged_before_it() -> None:
    # Issue finding 2: a budget set at 172 pages on a crawl that had already
    # fetched 172 must hold at the budget, not allow 172 more.
    rig = Rig()
    for _ in range(172):
        assert rig.gate.charge(rig.entry())
    rig.gate.apply(directives(("budget", HOST, "172")))
    assert rig.gate.budgets_active
    held = rig.entry()
    assert not rig.gate.charge(held)
    assert rig.gate.held == [held]


def test_a_crawl_budget_set_below_what_was_fetched_holds_at_once() -> None:
    rig = Rig()
    for host in (HOST, OTHER, HOST):
        assert rig.gate.charge(rig.entry(host))
    rig.gate.apply(directives(("budget", "crawl", "2")))
    assert not rig.gate.charge(rig.entry("c.test"))
    assert rig.gate.why_held() == CLOSE_CRAWL_BUDGET


def test_a_refund_gives_the_page_back_once_though_two_copies_share_the_charge() -> None:
    rig = Rig(BudgetRules(default=1))
    entry = rig.entry()
    assert rig.gate.charge(entry)
    original = entry.item
    retry, putback = original.replace(), original.replace()
    assert retry.meta[META_CHARGED] is original.meta[META_CHARGED]
    assert not unused(original)
    rig.gate.refund(retry)
    rig.gate.refund(putback)
    assert rig.gate.book is not None
    assert rig.gate.book.hosts == {HOST: 0}
    assert rig.gate.book.crawl == 0
    assert rig.stat("banker/budget/refunded") == 1
    assert unused(original)  # its completion is no page
    assert META_CHARGED not in retry.meta
    assert rig.gate.charge(rig.entry())  # the page given back may be fetched


def test_a_request_never_charged_is_not_unused_and_a_charge_shows_its_refund() -> None:
    assert not unused(Request("https://a.test/"))
    charge = Charge(HOST, "news")
    assert repr(charge) == "Charge('a.test', 'news')"
    charge.refunded = True
    assert repr(charge) == "Charge('a.test', 'news', refunded)"


def test_raising_a_budget_releases_the_held_requests() -> None:
    rig = Rig()
    limited = directives(("budget", HOST, "1"))
    rig.gate.apply(limited)
    assert rig.gate.charge(rig.entry())
    held = [rig.entry(), rig.entry()]
    assert not any(rig.gate.charge(e) for e in held)
    assert rig.gate.apply(directives(("pause", OTHER), state=limited)) == []  # no budget change
    assert rig.gate.held == held
    raised = directives(("budget", HOST, "5"), state=limited)
    assert rig.gate.apply(raised) == held
    assert rig.gate.held == []
    assert all(rig.gate.charge(e) for e in held)


def test_why_held_names_the_budget_that_stopped_the_crawl() -> None:
    rig = Rig(BudgetRules(default=1))
    assert rig.gate.why_held() is None
    assert rig.gate.charge(rig.entry())
    assert rig.gate.why_held() is None  # spent, but nothing waits for it
    assert not rig.gate.charge(rig.entry())
    assert rig.gate.why_held() == CLOSE_BUDGET
    rig.gate.apply(directives(("budget", "crawl", "1")))
    assert rig.gate.why_held() == CLOSE_CRAWL_BUDGET


def test_take_held_hands_the_held_requests_back_and_empties() -> None:
    rig = Rig(BudgetRules(default=0))
    held = [rig.entry(), rig.entry()]
    assert not any(rig.gate.charge(e) for e in held)
    assert rig.gate.take_held() == held
    assert rig.gate.held == []
    assert rig.gate.why_held() is None


def test_close_records_how_many_requests_were_left_over_budget() -> None:
    rig = Rig(BudgetRules(default=0))
    for _ in range(3):
        rig.gate.charge(rig.entry())
    rig.gate.close()
    assert rig.stat("banker/budget/held_at_close") == 3


def test_close_with_nothing_held_records_nothing() -> None:
    rig = Rig()
    rig.gate.close()
    assert rig.stat("banker/budget/held_at_close") is None


def test_a_gate_without_a_book_charges_nothing() -> None:
    # A fleet counts pages in Redis: the gate lets every request go uncharged.
    rig = Rig(BudgetRules(default=0))
    rig.gate.book = None
    entry = rig.entry()
    assert rig.gate.charge(entry)
    assert META_CHARGED not in entry.item.meta
    assert not rig.gate.counting
    assert not rig.gate.budgets_active


# -- the directives ----------------------------------------------------------------------


def test_apply_pauses_the_topics_and_records_the_version() -> None:
    rig = Rig()
    rig.gate.topics = TopicScheduler()
    state = directives(("pause", "topic:news"), ("pause", HOST))
    rig.gate.apply(state)
    assert rig.gate.topics.paused == frozenset({"news"})
    assert rig.stat("banker/control/version") == 2
    assert rig.stat("banker/control/paused_hosts") == 1
    assert rig.ready == [[HOST]]


def test_resuming_a_topic_wakes_the_scheduler_though_no_host_changed() -> None:
    rig = Rig()
    rig.gate.topics = TopicScheduler()
    paused = directives(("pause", "topic:news"))
    rig.gate.apply(paused)
    rig.gate.apply(directives(("resume", "topic:news"), state=paused))
    assert rig.gate.topics.paused == frozenset()
    assert rig.ready == [[], []]


def test_a_limit_sets_the_download_slots_concurrency_and_none_restores_it() -> None:
    rig = Rig()
    rig.slots[HOST] = SimpleNamespace(concurrency=8)
    limited = directives(("limit", HOST, "2"))
    rig.gate.apply(limited)
    assert rig.slots[HOST].concurrency == 2
    changed = directives(("limit", HOST, "3"), state=limited)
    rig.gate.apply(changed)
    assert rig.slots[HOST].concurrency == 3
    rig.gate.apply(directives(("limit", HOST, "none"), state=changed))
    assert rig.slots[HOST].concurrency == 8  # the slot's own, not the first limit


def test_a_download_slot_made_after_the_limit_follows_it_at_the_room_check() -> None:
    rig = Rig()
    limited = directives(("limit", HOST, "2"))
    rig.gate.apply(limited)  # no Scrapy slot for the host yet
    rig.slots[HOST] = SimpleNamespace(concurrency=16)
    assert rig.gate.is_free(HOST)
    assert rig.slots[HOST].concurrency == 2
    rig.gate.apply(directives(("limit", HOST, "none"), state=limited))
    assert rig.slots[HOST].concurrency == 16


def test_a_limit_with_no_downloader_only_gates_the_room_check() -> None:
    rig = Rig()
    rig.view.downloader = None
    rig.gate.apply(directives(("limit", HOST, "1")))
    assert rig.gate.is_free(HOST)
    rig.view.inflight[HOST] = 1
    assert not rig.gate.is_free(HOST)


def test_newly_paused_lists_the_hosts_paused_since_a_state() -> None:
    rig = Rig()
    old = directives(("pause", OTHER))
    rig.gate.apply(old)
    rig.gate.apply(directives(("pause", "c.test"), ("pause", HOST), state=old))
    assert rig.gate.newly_paused(old) == [HOST, "c.test"]
