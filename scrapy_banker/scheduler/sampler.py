"""One :class:`~scrapy_banker.core.telemetry.Sample` of a running scheduler, from its parts.

The time-series record, the Prometheus metrics, the terminal progress and a
fleet node's Redis telemetry all call :func:`take_sample`, on the reactor
thread, once per sampling interval -- never per request.  A sample costs
O(topics + slots with transfers + requests in the downloader): every part
already keeps the count it needs (pending per topic, backlog per slot, the
Banker's matrices), so nothing is scanned but the downloader's active set,
which ``CONCURRENT_REQUESTS`` bounds.

What is counted where:

* pages per topic are the ``banker/topic/<topic>/responses`` stats the
  downloader middleware keeps (every network response, retried attempts
  included, like Scrapy's ``downloader/response_count``);
* ``queued`` per topic is the local queue's; the sample's total adds what
  waits for admission and what a fleet node leased but has not queued yet;
* ``inflight`` is what is in Scrapy's downloader (transferring, or waiting in
  a slot's own queue); a slot's ``inflight`` is its transfers, which its
  concurrency bounds, and its ``queued`` the rest this scheduler holds for it;
* the fleet and placement parts come from the store, when it has them
  (:class:`~scrapy_banker.redis.store.RedisLeaseStore`).
"""

from __future__ import annotations

import heapq
import socket
import time
from functools import lru_cache
from typing import TYPE_CHECKING

from scrapy_banker.core.meta import META_TOPIC
from scrapy_banker.core.telemetry import (
    BankerSample,
    FleetSample,
    PlacementSample,
    Sample,
    SlotSample,
    TopicSample,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_banker.scheduler.admission_gate import AdmissionGate
    from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts

__all__ = ["admission_sample", "take_sample"]


@lru_cache(maxsize=1)
def _hostname() -> str:
    return socket.gethostname()


def take_sample(
    parts: SchedulerParts,
    store: RequestStore,
    *,
    top_slots: int = 20,
    clock: Callable[[], float] = time.time,
) -> Sample:
    """What the scheduler made of ``parts`` and ``store`` holds now.

    A store whose features have a node name and telemetry (a fleet's) adds
    its fleet and placement parts; the memory store's sample has neither and
    is named after the host.
    """
    queue = parts.queue
    stats = parts.stats
    view = parts.downloader
    gate = parts.gate

    # Requests in the downloader, by topic: the active set is bounded by
    # CONCURRENT_REQUESTS (plus one waiting request per saturated slot).
    active = getattr(view.downloader, "active", None) or ()
    inflight_by_topic: dict[str, int] = {}
    for request in active:
        topic = request.meta.get(META_TOPIC)
        if topic is not None:
            inflight_by_topic[topic] = inflight_by_topic.get(topic, 0) + 1

    topics: dict[str, TopicSample] = {}
    pages = 0
    for state in queue.topics:
        name = state.name
        done = int(stats.get_value(f"banker/topic/{name}/responses", 0) or 0)
        pages += done
        topics[name] = TopicSample(
            done, state.pending, inflight_by_topic.get(name, 0), round(state.slice_total, 3)
        )

    slots: tuple[SlotSample, ...] = ()
    if top_slots > 0 and view.inflight:
        frontier = queue.frontier
        rows = []
        for slot, handed_out in view.inflight.items():
            transferring, limit = view.slot_load(slot)
            waiting = frontier.slot_backlog(slot) + max(0, handed_out - transferring)
            rows.append(SlotSample(slot, transferring, limit, waiting))
        busiest = heapq.nlargest(top_slots, rows, key=lambda s: (s.inflight, s.queued))
        slots = tuple(busiest)

    features = store.features
    telemetry = features.telemetry
    fleet: FleetSample | None = None if telemetry is None else telemetry.fleet()
    placement: PlacementSample | None = None if telemetry is None else telemetry.placement_sample()
    queued = len(queue) + (len(gate) if gate is not None else 0) + len(store)
    return Sample(
        t=round(float(clock()), 3),
        node=features.node or _hostname(),
        pages=pages,
        queued=queued,
        inflight=len(active),
        topics=topics,
        slots=slots,
        banker=None if gate is None else admission_sample(gate),
        fleet=fleet,
        placement=placement,
    )


def admission_sample(gate: AdmissionGate) -> BankerSample:
    """The Banker's state summed per resource: O(resources x tasks) in numpy, no loop."""
    state = gate.admission.state
    return BankerSample(
        total=state.as_dict(state.total),
        available=state.as_dict(state.available),
        allocated=state.as_dict(state.total - state.available),
        need=state.need_total(),
        tasks=len(state),
        parked=len(gate),
    )
