"""Leased requests coming in from Redis, and those this worker must give back.

The worker thread leases requests of the partitions this node owns into its
inbound deque; :meth:`Inbound.drain` decodes them on the reactor thread into
the scheduler's local queue, with their lease in ``meta`` (:func:`lease_of`
reads it back).  A payload that cannot be a request of this spider is
dead-lettered with the reason, never run.

A lease is this node's only while it owns the partition and the lease is
known to run: a request buffered here is given back (nacked, its delivery
not counted) when its partition moves to another node
(:meth:`Inbound.hand_back_lost`, at once for the whole buffer), when it
reaches the head of its lane with a lease that may have lapsed
(:meth:`Inbound.keep`), and at close (:meth:`Inbound.give_back_buffered`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from scrapy_banker.core.meta import META_LEASE
from scrapy_banker.core.ops import LeaseToken
from scrapy_banker.redis.worker.control_box import CHARGED, HELD, Charge
from scrapy_banker.scheduler.classifier import UnparsableURL
from scrapy_banker.scheduler.serialize import MalformedPayload

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request, Spider

    from scrapy_banker.core.directives import BudgetRules, ControlState
    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.redis.store.host_sync import HostSync
    from scrapy_banker.redis.worker import FrontierWorker
    from scrapy_banker.scheduler.classifier import Classified
    from scrapy_banker.scheduler.seams import SchedulerParts

logger = logging.getLogger(__name__)

__all__ = ["Inbound", "lease_of"]


def lease_of(request: Request, partitions: int) -> LeaseToken | None:
    """The lease a request came with; None for anything this store did not write.

    ``meta`` is the spider's too: a value set by hand must neither crash the
    crawl nor reach Redis as an op that can never succeed.
    """
    token = request.meta.get(META_LEASE)
    if isinstance(token, LeaseToken) and 0 <= token.partition < partitions:
        return token
    return None


class Inbound:
    """Leased requests into the local queue; those this node may not fetch, given back."""

    def __init__(
        self,
        parts: SchedulerParts,
        worker: FrontierWorker,
        *,
        partitions: int,
        hosts: HostSync | None = None,
        budgets: BudgetRules | None = None,
    ) -> None:
        self.parts = parts
        self.worker = worker
        self.partitions = partitions
        #: Where the politeness states of the partitions taken over go first,
        #: and where each leased request's host and partition are noted.
        self.hosts = hosts
        #: Buffered leases given back because their partition moved away; the
        #: entries stay in the local queue until popped, then are dropped.
        self.handed_back: set[LeaseToken] = set()
        #: Whether any leased request reached this worker.
        self.received_any = False
        #: The worker's ``owned`` last looked at (replaced whole on a change).
        self._owned: dict[int, int] = {}
        #: Budgets this crawl counts (the settings'; the operator's arrive in the worker's
        #: control box); None: never charge.
        self.budgets = budgets
        #: Leased requests waiting for their budget charge: token -> (request, class).
        self.charging: dict[LeaseToken, tuple[Request, Classified]] = {}
        #: Partition -> the host last leased from it (a partition rarely holds
        #: two of a crawl's hosts): whose backlog its queued count is.
        self.slot_of: dict[int, str] = {}

    def drain(self, now: float, spider: Spider | None) -> None:
        """Move what the worker leased into the local queue; dead-letter what is malformed."""
        inbound = self.worker.inbound
        hosts = self.hosts
        # The leases there are now, then the states of the partitions taken
        # over: the worker thread appends a partition's states before its
        # first leases, so these leases' states are all there.
        n = len(inbound)
        if hosts is not None and self.worker.adopted:
            hosts.adopt()
        if self.charging:
            self._charged(now)
        if not n:
            return
        self.received_any = True
        parts = self.parts
        codec, classify, stats = parts.codec, parts.classifier.classify, parts.stats
        rules, control = self.budgets, self.worker.control_state
        charge = rules  # every page is counted, so a budget set later counts it
        for _ in range(n):
            leased = inbound.popleft()
            try:
                request = codec.decode(leased.payload, spider)
                c = classify(request)
            except (MalformedPayload, UnparsableURL) as exc:
                # Garbage, a planted pickle, a request class not allowed, a
                # callback that is no method of the spider: never run,
                # kept in the partition's dead-letter list with the reason.
                logger.error(
                    "Dead-lettering malformed request %s of partition %d: %s",
                    leased.id, leased.partition, exc,
                )  # fmt: skip
                stats.inc_value("banker/redis/malformed")
                self.worker.dead_letter(leased.token, f"malformed: {exc}")
                continue
            if leased.deliveries > 1:
                stats.inc_value("banker/redis/redelivered")
            token = leased.token
            request.meta[META_LEASE] = token
            self.slot_of[leased.partition] = c.slot
            if hosts is not None:
                hosts.leased(c.slot, token)
            if charge is not None and self._charge(token, request, c, charge):
                continue
            parts.queue.push(request, c, now)
            if control.hosts or control.topics:
                self._park_if_paused(token, c, control)

    def queued_elsewhere(self) -> dict[str, int]:
        """Host -> its requests still queued in Redis in partitions this node owns."""
        out: dict[str, int] = {}
        slot_of = self.slot_of
        for p, n in self.worker.queued.items():
            slot = slot_of.get(p)
            if slot is not None:
                out[slot] = out.get(slot, 0) + n
        return out

    def park_paused(self, entries: Iterable[Entry[Request]], state: ControlState) -> None:
        """Buffered leases of paused hosts or topics no longer count against their
        partition's lease cap: the partition's other hosts keep being leased.

        The leases stay held and renewed; the requests wait here until resumed.
        """
        hosts, topics = state.paused_hosts, state.paused_topics
        for entry in entries:
            if entry.slot in hosts or entry.topic in topics:
                token = lease_of(entry.item, self.partitions)
                if token is not None:
                    self.worker.downloaded(token)

    def _park_if_paused(self, token: LeaseToken, c: Classified, state: ControlState) -> None:
        if c.slot in state.paused_hosts or c.topic in state.paused_topics:
            self.worker.downloaded(token)

    def _charge(
        self, token: LeaseToken, request: Request, c: Classified, rules: BudgetRules
    ) -> bool:
        """Ask Redis to count ``request`` and charge it to its budgets before it is queued.

        Always True: the request waits in :attr:`charging` for the answer.
        """
        state = self.worker.control_state
        host = rules.host(c.slot, state)
        topic = rules.topic(c.topic, state)
        crawl = rules.crawl_budget(state)
        self.charging[token] = (request, c)
        self.worker.charge(Charge(
            token, c.slot, c.topic, -1 if host is None else host,
            -1 if topic is None else topic, -1 if crawl is None else crawl,
        ))  # fmt: skip
        return True

    def _charged(self, now: float) -> None:
        """Requests Redis charged go to the local queue; held or lost ones are dropped here."""
        results, charging, queue = self.worker.charge_results, self.charging, self.parts.queue
        stats = self.parts.stats
        while results:
            token, outcome = results.popleft()
            waiting = charging.pop(token, None)
            if waiting is None:
                continue
            if outcome == CHARGED:
                queue.push(waiting[0], waiting[1], now)
                self._park_if_paused(token, waiting[1], self.worker.control_state)
            elif outcome == HELD:
                stats.inc_value("banker/budget/held")
            else:
                stats.inc_value("banker/budget/lease_lost")

    def keep(self, entry: Entry[Request]) -> bool:
        """A request of a partition this node lost goes back: its new owner must fetch it."""
        token = lease_of(entry.item, self.partitions)
        if token is None:
            return True
        worker, stats = self.worker, self.parts.stats
        if self.handed_back and token in self.handed_back:
            self.handed_back.discard(token)  # given back when the partition moved
            return False
        if token.partition not in worker.owned:
            worker.nack(token)
            stats.inc_value("banker/redis/handed_back")
            return False
        if not worker.holds(token, time.monotonic()):
            # This node was stopped past the lease (SIGSTOP, a suspended VM):
            # it may be another node's now.  Given back with its delivery
            # number, the nack changes nothing if it is; the request waits in
            # Redis if not.  Never fetched here on a lease it cannot prove.
            logger.warning(
                "Not fetching %s: its lease (partition %d) may have expired while "
                "this node was not running; given back",
                entry.item.url, token.partition,
            )  # fmt: skip
            worker.nack(token)
            stats.inc_value("banker/redis/lease_lapsed")
            return False
        return True

    def hand_back_lost(self, spider: Spider | None) -> None:
        """Give back at once what is buffered of partitions this node no longer owns.

        Their new owner's pops wait (``BUSY``) until every lease of the old
        epoch is released; buffered requests would otherwise be released
        only when they reach the head of their lane here.  Requests in
        flight finish and are acked as usual.
        """
        owned = self.worker.owned
        if owned is self._owned:
            return
        lost = self._owned.keys() - owned.keys()
        self._owned = owned
        if not lost:
            return
        self.drain(time.monotonic(), spider)
        n = 0
        for entry in self.parts.queue.entries():
            token = lease_of(entry.item, self.partitions)
            if token is not None and token.partition in lost and token not in self.handed_back:
                self.handed_back.add(token)
                self.worker.nack(token)
                n += 1
        if n:
            self.parts.stats.inc_value("banker/redis/handed_back", n)

    def give_back_buffered(self) -> None:
        """At close: every buffered lease back to Redis; requests never sent there are dropped."""
        handed_back = local_only = 0
        for waiting in self.charging:
            self.worker.nack(waiting)
            handed_back += 1
        self.charging.clear()
        for entry in self.parts.queue.entries():
            token = lease_of(entry.item, self.partitions)
            if token is None:
                local_only += 1
            elif token not in self.handed_back:
                self.worker.nack(token)
                handed_back += 1
        if handed_back:
            logger.info("Gave %d buffered requests back to the queue", handed_back)
        if local_only:
            logger.error(
                "%d requests that could not be serialized to Redis were never queued "
                "there and are dropped at close (see banker/redis/unserializable)",
                local_only,
            )
