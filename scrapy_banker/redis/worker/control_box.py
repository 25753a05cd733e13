"""A worker's side of run-time control: reading the directives, charging budgets.

Two threads meet in :class:`ControlBox`: the scheduler (reactor thread)
asks for leased requests to be charged to their budgets before it lets them
go, and reads the latest directives; :class:`ControlJob` (the worker
thread, one job of :class:`~scrapy_banker.redis.worker.FrontierWorker`'s
loop) sends the charges in one round trip per step and re-reads the control
document every half heartbeat -- so an operator's action is in force on
every worker within a heartbeat, wherever the host's partition moves.

When a budget changes, the requests held over budgets in the partitions this
node owns go back to their queues (``lua/release.lua``) and are charged
again as they are leased: those still over a budget are held again, the
rest are fetched.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_banker.core.directives import BudgetRules, ControlError, ControlState
from scrapy_banker.redis.scripts import ScriptCall

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy_banker.core.ops import LeaseToken
    from scrapy_banker.redis.frontier.control_channel import ControlChannel
    from scrapy_banker.redis.worker.state import FleetLink, WorkerState

logger = logging.getLogger(__name__)

__all__ = ["CHARGED", "GONE", "HELD", "Charge", "ControlBox", "ControlJob"]

#: What ``lua/charge.lua`` answers per request.
CHARGED, HELD, GONE = 1, 0, -1


@dataclass(frozen=True, slots=True)
class Charge:
    """One leased request to charge; a budget of -1 is none."""

    token: LeaseToken
    host: str
    topic: str
    host_budget: int
    topic_budget: int
    crawl_budget: int

    def arg(self) -> str:
        return (
            f"{self.token.ref}\t{self.host}\t{self.topic}\t{self.host_budget}\t"
            f"{self.topic_budget}\t{self.crawl_budget}"
        )


class ControlBox:
    """What the scheduler and the worker thread share about control and budgets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._charges: list[Charge] = []
        self._hosts: set[str] = set()
        self._topics: set[str] = set()
        #: (token, CHARGED | HELD | GONE), appended by the worker thread.
        self.results: deque[tuple[LeaseToken, int]] = deque()
        #: The latest directives read (replaced whole: a read is atomic).
        self.state = ControlState()
        #: Pages charged to the whole crawl at the last read (None: no crawl budget).
        self.crawl_charged: int | None = None
        #: Of those, the pages fetched and done (acked) at the last read.
        self.crawl_done: int | None = None

    # -- the reactor thread -------------------------------------------------------------

    def charge(self, charge: Charge) -> None:
        with self._lock:
            self._charges.append(charge)

    def note_host(self, host: str) -> None:
        with self._lock:
            self._hosts.add(host)

    def note_topic(self, topic: str) -> None:
        with self._lock:
            self._topics.add(topic)

    # -- the worker thread --------------------------------------------------------------

    def take_charges(self) -> list[Charge]:
        with self._lock:
            charges, self._charges = self._charges, []
        return charges

    def put_back(self, charges: list[Charge]) -> None:
        with self._lock:
            self._charges[:0] = charges

    def take_hosts(self) -> set[str]:
        with self._lock:
            hosts, self._hosts = self._hosts, set()
        return hosts

    def take_topics(self) -> set[str]:
        with self._lock:
            topics, self._topics = self._topics, set()
        return topics


class ControlJob:
    """The worker thread's control job: charges each step, the document every ``interval_s``."""

    def __init__(
        self,
        link: FleetLink,
        state: WorkerState,
        channel: ControlChannel,
        *,
        interval_s: float,
        rules: BudgetRules | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.link = link
        self.state = state
        self.channel = channel
        self.box = state.control
        self.interval_s = interval_s
        self.rules = BudgetRules() if rules is None else rules
        self.on_ready = on_ready
        self.next_at = 0.0
        self._first = True
        self._bad_logged = False

    def run_once(self, now: float) -> bool:
        sent = self.charge()
        if now >= self.next_at:
            self.next_at = now + self.interval_s
            self.refresh()
        return sent

    def charge(self) -> bool:
        """Send the pending charges; their answers go to :attr:`ControlBox.results`."""
        box = self.box
        charges = box.take_charges()
        if not charges:
            return False
        by_partition: dict[int, list[Charge]] = {}
        for c in charges:
            by_partition.setdefault(c.token.partition, []).append(c)
        frontier = self.link.frontier
        extra = frontier.link.budget_keys
        calls = []
        for p, group in by_partition.items():
            k = frontier.keys(p)
            calls.append(
                ScriptCall([k.leases, k.meta, k.payloads, k.over, *extra], [c.arg() for c in group])
            )
        try:
            answers = frontier.scripts.values("charge", calls)
        except BaseException:
            box.put_back(charges)
            raise
        leases = self.state.leases
        for group, answer in zip(by_partition.values(), answers, strict=True):
            for c, result in zip(group, answer, strict=True):
                outcome = int(result)
                if outcome != CHARGED:  # held in Redis, or not this node's: no lease here
                    leases.forget(c.token)
                box.results.append((c.token, outcome))
        if self.on_ready is not None:
            self.on_ready()
        return True

    def refresh(self) -> None:
        """Re-read the document; on a budget change, put held requests back."""
        box, channel = self.box, self.channel
        channel.note_hosts(box.take_hosts())
        channel.note_topics(box.take_topics())
        try:
            state = channel.load()
        except ControlError as exc:
            if not self._bad_logged:
                self._bad_logged = True
                logger.error("Ignoring the control document in Redis: %s", exc)
            self.state.counters.add("banker/control/malformed")
            return
        self._bad_logged = False
        old = box.state
        crawl = self.rules.crawl_budget(state)
        if crawl is None:
            box.crawl_charged = box.crawl_done = None
        else:
            counts = channel.counts([])
            box.crawl_charged, box.crawl_done = counts.crawl, counts.crawl_done
        first, self._first = self._first, False
        if first:
            # The settings' budgets may have been raised, or removed, since the
            # last run: what is held is charged again (and held again if need be).
            self._release(channel.held_partitions())
        if state.version == old.version:
            return
        box.state = state
        self.state.counters.add("banker/control/updates")
        if state.budgets_differ(old):
            self._release(self.state.ownership.owned)
        if self.on_ready is not None:
            self.on_ready()

    def _release(self, partitions: Iterable[int]) -> None:
        released = self.channel.release(partitions)
        if released:
            self.state.counters.add("banker/budget/released", released)
            self.state.hints.scan_soon()
