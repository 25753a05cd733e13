"""The last-moment lease fence: a leased request is sent only on a lease this node can prove.

A fleet worker fetches a host only while it holds the leases of the host's
requests; the pop script fences a node off a partition it lost, and a new
owner's pops wait until the old owner's leases are released or expired.
What a worker already took out of Redis is checked again when the scheduler
dispatches it (:meth:`Inbound.keep
<scrapy_banker.redis.store.inbound.Inbound.keep>`).  But between the
scheduler and the socket a request can wait: in the downloader middlewares
(robots.txt being fetched), in its download slot's queue (``DOWNLOAD_DELAY``,
AutoThrottle, a full slot).  A worker frozen there (SIGSTOP, a suspended VM,
a stalled machine) past its lease TTL wakes up with requests whose leases
were reaped and handed to another node -- which fetches the same host at its
full per-host limit.  The chaos soak saw one host at 3 requests in flight
(limit 2) for 0.2 s when such a worker resumed.

So the check is made again at the last moment, by the wire gate
(:mod:`scrapy_banker.scheduler.wire`): after every downloader middleware,
and in the download handler, immediately before a connection is opened or
reused.  This module is the fleet store's side of it.

A request whose lease the worker cannot prove (:meth:`FrontierWorker.holds
<scrapy_banker.redis.worker.FrontierWorker.holds>`: its partition is owned
at the epoch it was leased under, and its pop or the last renewal round is
recent enough) is given back -- nacked with its delivery number, a no-op if
another node has it now -- counted ``banker/redis/fenced_at_send``, and not
sent: the wire gate hands it back to the engine as a request to schedule,
which the store drops (:meth:`LeaseFence.swallow`), so neither the spider
nor ``RetryMiddleware`` ever sees it.  The request is fetched by whoever
holds it now.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from scrapy_banker.redis.store.inbound import lease_of
from scrapy_banker.scheduler.wire import GivenBack

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.redis.store.acks import AckBook
    from scrapy_banker.redis.worker import FrontierWorker

logger = logging.getLogger(__name__)

__all__ = ["LeaseFence", "LeaseFenced"]


class LeaseFenced(GivenBack):
    """Raised by the wrapped download handler: the request's lease cannot be proven.

    A :class:`~scrapy_banker.scheduler.wire.GivenBack`: the wire gate turns
    it back into the request, which the store drops.
    """


class LeaseFence:
    """The fleet store's side of the fence: the check, the give-back, the drop."""

    def __init__(
        self,
        worker: FrontierWorker,
        acks: AckBook,
        stats: StatsCollector,
        *,
        partitions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.acks = acks
        self.stats = stats
        self.partitions = partitions
        self.clock = clock
        #: Requests given back and handed to the engine to be dropped.
        self.given_back: set[Request] = set()

    def holds(self, request: Request) -> bool:
        """May ``request`` go to the wire?  True for anything that came with no lease."""
        token = lease_of(request, self.partitions)
        return token is None or self.worker.holds(token, self.clock())

    def give_back(self, request: Request, where: str) -> None:
        """Nack the request's lease, never ack it, and drop it when it comes back."""
        token = lease_of(request, self.partitions)
        if token is None:
            return
        logger.warning(
            "Not sending %s: its lease (partition %d) cannot be proven any more "
            "(this node stopped or lost the partition while it waited %s); given back",
            request.url, token.partition, where,
        )  # fmt: skip
        self.acks.pending.pop(request, None)
        self.worker.nack(token)
        self.given_back.add(request)
        self.stats.inc_value("banker/redis/fenced_at_send")

    def check(self, request: Request, where: str) -> None:
        """At the wire (:mod:`scrapy_banker.scheduler.wire`): give back and raise
        :class:`LeaseFenced` if the request's lease cannot be proven."""
        if not self.holds(request):
            self.give_back(request, where)
            raise LeaseFenced("lease lost before the request was sent")

    def swallow(self, request: Request) -> bool:
        """Is this a request given back that the engine is scheduling again?  (Drop it.)"""
        if self.given_back and request in self.given_back:
            self.given_back.discard(request)
            return True
        return False
