"""What a fleet worker tells the operator: its telemetry sample and its crawl stats.

Every ``BANKER_TIMESERIES_INTERVAL`` the node's
:class:`~scrapy_banker.core.telemetry.Sample` goes to Redis under
:meth:`Keyspace.telemetry <scrapy_banker.redis.keys.Keyspace.telemetry>`
with an expiry, through the worker thread (``scrapy banker status`` and the
dashboard read it; a node that stops writing disappears by itself).  The
worker thread's counters are added to the crawl stats on the reactor thread
(a stats collector may itself be in Redis).  Neither may stop the tick that
acks leases: a failed sample is logged once and the crawl goes on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_banker.core.telemetry import FleetSample, sample_json
from scrapy_banker.scheduler.sampler import take_sample
from scrapy_banker.settings import ops_config

if TYPE_CHECKING:
    from scrapy_banker.core.telemetry import PlacementSample
    from scrapy_banker.redis.store.acks import AckBook
    from scrapy_banker.redis.store.inbound import Inbound
    from scrapy_banker.redis.store.placement_hook import PlacementHook
    from scrapy_banker.redis.worker import FrontierWorker
    from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts

logger = logging.getLogger(__name__)

__all__ = ["TELEMETRY_MIN_TTL_S", "TELEMETRY_TTL_INTERVALS", "NodeTelemetry"]

#: A node's telemetry key outlives this many sampling intervals (and at least
#: TELEMETRY_MIN_TTL_S): a node that stops writing disappears from the
#: operator's view soon after, without any clean-up.
TELEMETRY_TTL_INTERVALS = 3
TELEMETRY_MIN_TTL_S = 5.0


class NodeTelemetry:
    """This node's telemetry sample and the worker thread's counters, published in turn."""

    def __init__(
        self,
        parts: SchedulerParts,
        worker: FrontierWorker,
        *,
        key: str,
        partitions: int,
        acks: AckBook,
        inbound: Inbound,
        placement: PlacementHook | None = None,
    ) -> None:
        self.parts = parts
        self.worker = worker
        self.key = key
        self.partitions = partitions
        self.acks = acks
        self.inbound = inbound
        self.placement = placement
        ops = ops_config(parts.crawler)
        self.every = ops.timeseries_interval
        self.top_slots = ops.metrics_top_slots
        self.px_ms = int(
            1000 * max(TELEMETRY_MIN_TTL_S, TELEMETRY_TTL_INTERVALS * ops.timeseries_interval)
        )
        self._next = 0.0
        self._failed = False

    def fleet(self) -> FleetSample:
        """This node's share of the fleet, from what the reactor thread may read.

        Leases held: dispatched and not acked, leased and not queued yet,
        queued locally or parked (minus those already given back); the
        worker's own lease book is its thread's alone.
        """
        worker = self.worker
        gate = self.parts.gate
        local = len(self.parts.queue) + (len(gate) if gate else 0) - len(self.inbound.handed_back)
        return FleetSample(
            partitions_owned=len(worker.owned),
            partitions_total=self.partitions,
            leased=len(self.acks) + len(worker.inbound) + max(0, local),
            pending_ops=worker.pending_ops(),
            connected=worker.connected,
        )

    def placement_sample(self) -> PlacementSample | None:
        return None if self.placement is None else self.placement.agent.latest

    def crawl_charged(self) -> int | None:
        """Pages charged to the crawl fleet-wide at the last read (None: no crawl budget)."""
        return self.worker.crawl_charged

    def tick(self, now: float, store: RequestStore) -> None:
        """Publish ``store``'s sample if one is due (see :meth:`publish`)."""
        if now >= self._next:
            self._next = now + self.every
            self.publish(store)

    def publish(self, store: RequestStore) -> None:
        """Hand ``store``'s latest sample to the worker thread, which SETs it with an expiry.

        ``store`` is what :func:`~scrapy_banker.scheduler.sampler.take_sample`
        samples (the lease store).  Never allowed to stop the tick that acks
        leases: a failure is logged once and the crawl goes on without telemetry.
        """
        try:
            sample = take_sample(self.parts, store, top_slots=self.top_slots)
            value = sample_json(sample)
        except Exception:
            if not self._failed:
                self._failed = True
                logger.exception("Could not sample this node's telemetry; the crawl goes on")
            return
        self.worker.publish_telemetry(self.key, value, self.px_ms)

    def publish_counters(self) -> None:
        """Add the worker thread's counters to the crawl stats."""
        stats = self.parts.stats
        for name, n in self.worker.take_counters().items():
            stats.inc_value(name, n)
        stats.set_value("banker/redis/owned_partitions", len(self.worker.owned))
