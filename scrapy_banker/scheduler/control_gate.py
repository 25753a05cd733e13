"""The operator's directives and the budgets, applied where requests leave.

:class:`ControlGate` is a part of :class:`~scrapy_banker.scheduler.BankerScheduler`
that enforces a :class:`~scrapy_banker.core.directives.ControlState` (read by a
fleet worker from Redis, :mod:`scrapy_banker.redis.worker.control_box`):

* **pause** -- a paused host has no room: its lanes park like a full slot's,
  at no cost per pop, and come back when it is resumed.  A request already
  let go is stopped at the wire (:meth:`ControlGate.check`, raising
  :class:`~scrapy_banker.scheduler.politeness_gate.HeldBack`, which puts it back)
  and the host's requests waiting in its download slot are taken out, so
  nothing is sent to a paused host once the directive is read.  A paused
  topic is skipped by the topic scheduler (its requests stay queued).
* **delay** -- the least time between two requests to the host, on top of
  its own politeness (Crawl-delay, Retry-After), spaced at the wire.
* **limit** -- the host's concurrency: the download slot's own
  ``concurrency``, so Scrapy's downloader and this scheduler's room check
  both follow it; the slot's own value comes back when the limit is removed.
* **budgets** on one node (:class:`~scrapy_banker.core.directives.BudgetBook`):
  a request is charged when it leaves for the downloader; one whose host,
  topic or crawl is spent is held aside (counted in ``banker/budget/held``,
  never dropped silently) and let go when a budget is raised.  A fleet
  charges in Redis instead (``lua/charge.lua``), atomically with the lease.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.directives import BudgetBook, BudgetRules, ControlState
from scrapy_banker.core.meta import META_CHARGED, META_SLOT
from scrapy_banker.scheduler.engine import Timer, call_later
from scrapy_banker.scheduler.politeness_gate import HeldBack

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.topics import TopicScheduler
    from scrapy_banker.scheduler.downloader import DownloaderView

logger = logging.getLogger(__name__)

__all__ = ["CLOSE_BUDGET", "CLOSE_CRAWL_BUDGET", "Charge", "ControlGate", "unused"]

#: The close reason once the crawl budget is spent (every mode).
CLOSE_CRAWL_BUDGET = "banker_crawl_budget"
#: The close reason of a crawl that ends with requests held over a host or topic budget.
CLOSE_BUDGET = "banker_budget"


class Charge:
    """What a request was charged to (``meta["banker_charged"]``), shared by its copies.

    A copy made by ``Request.replace`` (a retry, a redirect, a put-back)
    shares this object with its original; when the copy is queued the charge
    is refunded once and marked, so the original's completion is journaled
    as no page (:meth:`~scrapy_banker.scheduler.store.MemoryStore.refill`).
    """

    __slots__ = ("host", "refunded", "topic")

    def __init__(self, host: str, topic: str) -> None:
        self.host = host
        self.topic = topic
        self.refunded = False

    def __repr__(self) -> str:
        return f"Charge({self.host!r}, {self.topic!r}{', refunded' if self.refunded else ''})"


def unused(request: Request) -> bool:
    """Was ``request``'s charge given back (so its completion is no page of a budget)?"""
    charged = request.meta.get(META_CHARGED)
    return isinstance(charged, Charge) and charged.refunded


def _nothing(slots: list[str]) -> None:
    pass


def _never(slot: str) -> float:
    return 0.0


class ControlGate:
    """Pause, delay, limit and (on one node) budgets, from the latest :class:`ControlState`."""

    def __init__(
        self,
        stats: StatsCollector,
        downloader: DownloaderView,
        room: Callable[[str], bool],
        rules: BudgetRules,
        *,
        topics: TopicScheduler | None = None,
        last_wire: Callable[[str], float] = _never,
        on_ready: Callable[[list[str]], None] = _nothing,
        counting: bool = True,
        clock: Callable[[], float] = time.time,
        schedule: Callable[[float, Callable[[], Any]], Timer] = call_later,
    ) -> None:
        self.stats = stats
        self.downloader = downloader
        self.room = room
        self.rules = rules
        self.clock = clock
        self.schedule = schedule
        self.state = ControlState()
        #: Called with slots that may have room again (resumed, delay over).
        self.on_ready = on_ready
        #: The topic scheduler whose ``paused`` set follows the directives.
        self.topics = topics
        #: When a host's last request went to the wire (the politeness gate's
        #: record, :meth:`PolitenessGate.last_wire
        #: <scrapy_banker.scheduler.politeness_gate.PolitenessGate.last_wire>`).
        self.last_wire = last_wire
        #: Counts pages on one node; None where the store counts them (a
        #: fleet's, in Redis with its leases: ``counting=False``).
        self.book: BudgetBook | None = BudgetBook(rules) if counting else None
        #: Requests held over a budget on one node, in the order they were popped.
        self.held: list[Entry[Request]] = []
        self._hosts = self.state.hosts
        self._timers: dict[str, Timer] = {}
        self._limits: dict[str, int] = {}
        self._budgets = rules.any(self.state)

    # -- the room check (the local queue's) ------------------------------------------

    def is_free(self, slot: str) -> bool:
        hosts = self._hosts
        if hosts:
            hc = hosts.get(slot)
            if hc is not None:
                if hc.paused:
                    return False
                if hc.delay:
                    at = self.last_wire(slot) + hc.delay
                    if at > self.clock():
                        self._wake(slot, at)
                        return False
                if hc.limit is not None:
                    if self.downloader.inflight.get(slot, 0) >= hc.limit:
                        return False
                    if slot not in self._limits:  # its download slot is new: follow the limit
                        self._limit(slot, hc.limit)
        return self.room(slot)

    def _wake(self, slot: str, at: float) -> None:
        if slot in self._timers:
            return

        def fire() -> None:
            self._timers.pop(slot, None)
            self.on_ready([slot])

        self._timers[slot] = self.schedule(max(0.0, at - self.clock()), fire)

    # -- the wire ------------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Raise :class:`HeldBack` if ``request``'s host is paused now."""
        hosts = self._hosts
        if hosts:
            slot = request.meta.get(META_SLOT)
            hc = hosts.get(slot) if slot is not None else None
            if hc is not None and hc.paused:
                self.stats.inc_value("banker/control/held_back")
                raise HeldBack(f"{slot} is paused by an operator")

    def delay(self, request: Request) -> float:
        """The operator's least interval between two requests to ``request``'s host (0: none)."""
        hosts = self._hosts
        if not hosts:
            return 0.0
        slot = request.meta.get(META_SLOT)
        hc = hosts.get(str(slot)) if slot is not None else None
        return 0.0 if hc is None else hc.delay

    # -- budgets on one node --------------------------------------------------------------

    def charge(self, entry: Entry[Request]) -> bool:
        """Charge a request leaving for the downloader; False: held over a budget.

        Every page is counted on one node, budget or not, so a budget set
        later (``scrapy banker budget``) counts what the crawl already
        fetched, exactly as one given at start does.
        """
        book = self.book
        if book is None:
            return True
        if not self._budgets:
            book.add(entry.slot, entry.topic)
            entry.item.meta[META_CHARGED] = Charge(entry.slot, entry.topic)
            return True
        reason = book.charge(entry.slot, entry.topic)
        if reason is None:
            entry.item.meta[META_CHARGED] = Charge(entry.slot, entry.topic)
            return True
        if not self.held:
            logger.info("Holding requests over budget (%s) until a budget is raised", reason)
        self.held.append(entry)
        self.stats.inc_value("banker/budget/held")
        return False

    def refund(self, request: Request) -> None:
        """``request`` is scheduled again (put back, retried): its page was not the last."""
        charged = request.meta.pop(META_CHARGED, None)
        if self.book is not None and isinstance(charged, Charge) and not charged.refunded:
            charged.refunded = True  # the original's too: its completion is no page
            self.book.refund(charged.host, charged.topic)
            self.stats.inc_value("banker/budget/refunded")

    @property
    def budgets_active(self) -> bool:
        """Is any budget in force (what :meth:`charge` checks beyond counting)?"""
        return self.book is not None and self._budgets

    @property
    def counting(self) -> bool:
        """Does this gate count pages (one node) rather than the store (a fleet)?"""
        return self.book is not None

    def why_held(self) -> str | None:
        """The close reason of a crawl whose every pending request is held (None: none held).

        ``banker_crawl_budget`` once the crawl budget is spent, else
        ``banker_budget`` (held over a host or topic budget): the reasons a
        fleet gives (see docs/guarantees.rst).
        """
        book = self.book
        if book is not None and book.crawl_spent:
            return CLOSE_CRAWL_BUDGET
        return CLOSE_BUDGET if self.held else None

    def take_held(self) -> list[Entry[Request]]:
        """The requests held over budget, handed back (to be queued and saved at close)."""
        held, self.held = self.held, []
        return held

    # -- the directives -------------------------------------------------------------------

    def apply(self, state: ControlState) -> list[Entry[Request]]:
        """Follow ``state``; the held requests to queue again (a budget changed)."""
        old, self.state = self.state, state
        self._hosts = state.hosts
        if self.book is not None:
            self.book.state = state
        self._budgets = self.rules.any(state)
        if self.topics is not None:
            self.topics.paused = state.paused_topics
        changed = [h for h in set(old.hosts) | set(state.hosts) if old.host(h) != state.host(h)]
        for host in changed:
            self._limit(host, state.host(host).limit)
        released: list[Entry[Request]] = []
        if self.held and state.budgets_differ(old):
            released, self.held = self.held, []
        self.stats.set_value("banker/control/version", state.version)
        self.stats.set_value("banker/control/paused_hosts", len(state.paused_hosts))
        if changed or old.paused_topics != state.paused_topics:
            self.on_ready(changed)
        return released

    def follow(self, state: ControlState, requeue: Callable[[Entry[Request]], None]) -> bool:
        """Follow ``state`` if it is newer; False when it is the one in force.

        Requests held over a budget that changed go back through
        ``requeue``; a host paused now has its requests waiting in its
        download slot taken back out (put back, like a pushback's), so none
        leaves after this.  The engine is woken either way.
        """
        if state.version == self.state.version:
            return False
        old = self.state
        released = self.apply(state)
        for entry in released:
            requeue(entry)
        if released:
            self.stats.inc_value("banker/budget/released", len(released))
        for slot in self.newly_paused(old):
            for queued, deferred in self.downloader.take_queued(slot):
                deferred.errback(HeldBack(f"{slot} paused while {queued} waited in its slot"))
        self.on_ready([])
        return True

    def newly_paused(self, old: ControlState) -> list[str]:
        return sorted(self.state.paused_hosts - old.paused_hosts)

    def _limit(self, slot: str, limit: int | None) -> None:
        """The download slot's concurrency follows the operator's limit (its own when None)."""
        dl = self.downloader.downloader
        slots = getattr(dl, "slots", None)
        if slots is None:
            return
        scrapy_slot = slots.get(slot)
        if limit is None:
            own = self._limits.pop(slot, None)
            if own is not None and scrapy_slot is not None:
                scrapy_slot.concurrency = own
            return
        if scrapy_slot is not None:
            self._limits.setdefault(slot, int(scrapy_slot.concurrency))
            scrapy_slot.concurrency = limit

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self.held:
            self.stats.set_value("banker/budget/held_at_close", len(self.held))
            logger.info(
                "%d requests were left over budget (BANKER_HOST_BUDGET(S), "
                "BANKER_CRAWL_BUDGET, topic budgets)",
                len(self.held),
            )
