"""The fleet store's side of per-host politeness: states published with the host, adopted with it.

The scheduler keeps each host's :class:`~scrapy_banker.core.politeness.HostState`
(a Retry-After block, the backoff, Crawl-delay and the last request sent,
the throttle delay) in its :class:`~scrapy_banker.core.politeness.Politeness`,
keyed by download slot.  On a fleet a host is fetched by the owner of its
partition, and that owner changes; :class:`HostSync` makes the state follow:

* **Published** -- every state that changed (``Politeness.take_changed``),
  and the last request sent to a host with an interval
  (``Politeness.take_sent``: the moment it reached the wire, what the
  server measures from), is handed to the
  worker thread with the host's partition and the epoch its requests were
  leased under (:meth:`FrontierWorker.host_state
  <scrapy_banker.redis.worker.FrontierWorker.host_state>`), and written with
  the next batch (:mod:`scrapy_banker.redis.frontier.hosts`).  The store
  publishes right before it queues acks and nacks, so a state the answer to
  a request left is in Redis before the lease that lets a new owner pop the
  partition is released.  A state with nothing left to enforce -- no
  interval, no refusal, its block over -- is deleted there.
* **Adopted** -- when this node pops a partition for the first time under
  an epoch, the worker thread reads the partition's states in the same
  pipeline and hands them over before the partition's leases
  (:attr:`FrontierWorker.adopted <scrapy_banker.redis.worker.FrontierWorker.adopted>`);
  :meth:`HostSync.adopt` merges them into the scheduler's politeness (the
  stricter of what Redis kept and what this node knows, field by field) before
  :meth:`Inbound.drain <scrapy_banker.redis.store.inbound.Inbound.drain>`
  queues those leases.  So a Retry-After, a backoff, a Crawl-delay's last
  request and an AutoThrottle delay survive a rebalance, a steal and a
  ``kill -9`` of the owner (less what it had not flushed: milliseconds).

A host's partition is learned from the leased requests of that host this
node received: a state of a host it never leased a request of (nothing to
fetch here) is kept in memory only.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from scrapy_banker.core.politeness import HostState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scrapy_banker.core.ops import LeaseToken
    from scrapy_banker.redis.worker import FrontierWorker
    from scrapy_banker.scheduler.seams import SchedulerParts

logger = logging.getLogger(__name__)

__all__ = ["HostSync", "stored"]


def stored(state: HostState, now: float) -> str:
    """What a host's partition keeps of ``state``: its JSON, or ``""`` (nothing to enforce)."""
    if not state.refusals and not state.interval and state.blocked_until <= now:
        return ""
    return json.dumps(state.to_json(), separators=(",", ":"), sort_keys=True)


class HostSync:
    """Publishes changed host states with their partition; adopts those of partitions taken over."""

    def __init__(
        self,
        parts: SchedulerParts,
        worker: FrontierWorker,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gate = parts.politeness
        self.politeness = parts.politeness.politeness
        self.worker = worker
        self.stats = parts.stats
        self.clock = clock
        #: Host (download slot) -> (partition, epoch) of the last request of it leased here.
        self.where: dict[str, tuple[int, int]] = {}
        #: Partition -> the hosts of it this node leased requests of.
        self.hosts_of: dict[int, set[str]] = {}
        self._bad_logged = False

    # -- the reactor thread's notes ----------------------------------------------------

    def leased(self, host: str, token: LeaseToken) -> None:
        """A leased request of ``host`` arrived: the host's states go to its partition."""
        where = (token.partition, token.epoch)
        old = self.where.get(host)
        if old != where:
            if old is not None and old[0] != token.partition:
                self.hosts_of.get(old[0], set()).discard(host)
            self.where[host] = where
            self.hosts_of.setdefault(token.partition, set()).add(host)

    # -- publishing ------------------------------------------------------------------------

    def publish(self, changed: Mapping[str, HostState] | None = None) -> int:
        """Hand the changed states (and ``changed``, from the scheduler) to the worker thread."""
        politeness = self.politeness
        states = politeness.take_sent()
        states.update(politeness.take_changed())
        if changed:
            states.update(changed)
        if not states:
            return 0
        now = self.clock()
        where, worker = self.where, self.worker
        n = 0
        for host, state in states.items():
            place = where.get(host)
            if place is None:
                continue  # never leased here: nothing of it to fetch here either
            worker.host_state(host, place[0], place[1], stored(state, now))
            n += 1
        return n

    # -- adopting --------------------------------------------------------------------------

    def adopt(self) -> None:
        """Take over the states of the partitions the worker thread just gained.

        Called before the leases that came after them are queued locally.
        """
        adopted = self.worker.adopted
        while adopted:
            partition, epoch, raw = adopted.popleft()
            states: dict[str, HostState] = {}
            for host, text in raw.items():
                try:
                    states[host] = HostState.from_json(json.loads(text))
                except ValueError as exc:  # json.JSONDecodeError included
                    if not self._bad_logged:
                        self._bad_logged = True
                        logger.warning(
                            "Ignoring the unreadable politeness state of %s in partition %d "
                            "(%s); no more will be logged", host, partition, exc,
                        )  # fmt: skip
                    continue
                self.where[host] = (partition, epoch)
                self.hosts_of.setdefault(partition, set()).add(host)
            if states:
                self.gate.adopt(states)
