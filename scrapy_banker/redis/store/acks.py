"""When a fleet worker acknowledges a lease: once the engine is done with the request.

A request is acked only when its callback's output is scheduled -- its
children are queued for Redis before the ack, and the worker thread sends
them in that order -- so a worker killed at any point loses nothing: an
unacked lease expires and another worker fetches the request again
(at-least-once).  :class:`AckBook` keeps the dispatched requests until
then, and marks each delivery whose fetch began (only those count towards
``BANKER_REDIS_MAX_DELIVERIES``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from scrapy_banker.core.meta import META_SLOT
from scrapy_banker.redis.store.inbound import lease_of
from scrapy_banker.scheduler.engine import requests_in_progress
from scrapy_banker.scheduler.feeds import FeedBarrier

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_banker.core.ops import LeaseToken
    from scrapy_banker.redis.worker import FrontierWorker

__all__ = ["ACK_SCAN_INTERVAL_S", "AckBook"]

#: Dispatched requests are checked for being finished (and acked) at most
#: this often (s): a lease held 5 ms longer costs nothing, a scan of every
#: dispatched request on each of the engine's polls costs CPU.
ACK_SCAN_INTERVAL_S = 0.005


class AckBook:
    """Dispatched leased requests, acked once the engine is completely done with them."""

    def __init__(self, crawler: Crawler, worker: FrontierWorker, *, partitions: int) -> None:
        self.crawler = crawler
        self.worker = worker
        self.partitions = partitions
        #: Dispatched requests not acknowledged yet.
        self.pending: dict[Request, LeaseToken] = {}
        self._next_scan = 0.0
        #: Finished requests whose ack waits for their items to be durable in the feeds.
        self._finished: list[LeaseToken] = []
        self.feeds = FeedBarrier(crawler)

    @property
    def outstanding(self) -> bool:
        """Requests dispatched or finished and not acked yet (the crawl is not over)."""
        return bool(self.pending or self._finished)

    def __len__(self) -> int:
        return len(self.pending) + len(self._finished)

    def dispatched(self, request: Request) -> str:
        """``request`` leaves for the engine: the kind it was dequeued from."""
        token = lease_of(request, self.partitions)
        if token is None:
            return "memory"
        self.pending[request] = token
        self.worker.started(token)
        return "redis"

    def downloaded(self, request: Request) -> None:
        """The request's download is over: its host's slot is free (its lease is still held)."""
        token = lease_of(request, self.partitions)
        if token is not None:
            self.worker.downloaded(token)

    def ack_finished(self, everything: bool = False) -> None:
        """Acknowledge dispatched requests the engine is completely done with."""
        if not self.outstanding:
            return
        now = time.monotonic()
        if not everything and now < self._next_scan:
            return  # scanned a moment ago: the engine calls refill in bursts
        self._next_scan = now + ACK_SCAN_INTERVAL_S
        in_progress = requests_in_progress(self.crawler)
        finished = self._finished
        for request in list(self.pending):
            if everything or in_progress is None or request not in in_progress:
                # Without the engine's view (another Scrapy version) a request
                # is acked when it ended, i.e. when its slot was released.
                ended = request.meta.get(META_SLOT) is None
                if not everything and in_progress is None and not ended:
                    continue
                finished.append(self.pending.pop(request))
        if finished and (everything or self.feeds.due(now)):
            # Its items durable in the local feeds first (scheduler/feeds.py); a
            # feed uploaded at the close cannot hold a fleet's leases that long.
            self.feeds.sync(now)
            for token in finished:
                self.worker.ack(token)
            finished.clear()
