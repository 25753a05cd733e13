"""Prometheus metric families built from a :class:`~scrapy_banker.ops.metrics.Snapshot`.

What ``/metrics`` shows: :func:`families` turns one snapshot into
prometheus-client's metric families (names and labels are a documented
contract, listed in ``docs/ops/metrics.rst``), and :class:`SampleCollector`
hands them to the registry of
:class:`~scrapy_banker.ops.metrics.BankerMetrics` at each scrape.

A module of its own so that prometheus-client is imported only when metrics
are served: :class:`~scrapy_banker.ops.metrics.BankerMetrics` imports it once
:setting:`BANKER_METRICS_PORT` is set.  The add-on lists the extension in
every crawl, and a crawl without metrics would otherwise carry
prometheus-client's objects, which every full collection of Python's cyclic
garbage collector scans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scrapy_banker.ops.metrics import CONTROL_STATS

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy_banker.ops.metrics import ControlReading, RevisitReading, Snapshot

__all__ = ["NAMESPACE", "SampleCollector", "families"]

#: Every metric is ``<NAMESPACE>_<name>`` (prometheus-client's namespace convention).
NAMESPACE = "banker"


def _name(name: str) -> str:
    return f"{NAMESPACE}_{name}"


class SampleCollector(Collector):
    """Turns the latest :class:`~scrapy_banker.ops.metrics.Snapshot` into metric families.

    Called by prometheus-client on its HTTP thread, at each scrape.
    """

    def __init__(self, latest: Any) -> None:
        #: A zero-argument callable returning the latest snapshot (or None).
        self.latest = latest

    def describe(self) -> list[Metric]:
        return []  # registering must not collect: there may be no sample yet

    def collect(self) -> Iterator[Metric]:
        snap: Snapshot | None = self.latest()
        if snap is None:
            return
        yield from families(snap)


def families(snap: Snapshot) -> Iterator[Metric]:
    """Every metric of one snapshot; names and labels are a documented contract."""
    s = snap.sample
    ts = GaugeMetricFamily(
        _name("sample_timestamp_seconds"), "Wall-clock time the metrics were sampled at."
    )
    ts.add_metric([], s.t)
    yield ts

    pages = CounterMetricFamily(
        _name("pages"),
        "Responses received per topic (retried attempts included).",
        labels=["topic"],
    )
    depth = GaugeMetricFamily(
        _name("queue_depth"), "Requests queued in this scheduler per topic.", labels=["topic"]
    )
    topic_inflight = GaugeMetricFamily(
        _name("topic_inflight"), "Requests of the topic in the downloader.", labels=["topic"]
    )
    slice_s = GaugeMetricFamily(
        _name("topic_slice_seconds"),
        "The topic's current round-robin time slice.",
        labels=["topic"],
    )
    for name, t in sorted(s.topics.items()):
        pages.add_metric([name], t.pages)
        depth.add_metric([name], t.queued)
        topic_inflight.add_metric([name], t.inflight)
        slice_s.add_metric([name], t.slice_s)
    yield from (pages, depth, topic_inflight, slice_s)

    yield from _gauges((
        (
            _name("queued"),
            "Requests waiting in the scheduler (all topics, parked, leased).",
            s.queued,
        ),
        (_name("inflight"), "Requests in the downloader.", s.inflight),
    ))

    slot_inflight = GaugeMetricFamily(
        _name("slot_inflight"),
        "Transfers under way per download slot, busiest slots only (BANKER_METRICS_TOP_SLOTS).",
        labels=["slot"],
    )
    slot_limit = GaugeMetricFamily(
        _name("slot_limit"), "Concurrency of the slot (busiest slots only).", labels=["slot"]
    )
    slot_queued = GaugeMetricFamily(
        _name("slot_queued"),
        "Requests this scheduler holds for the slot (busiest slots only).",
        labels=["slot"],
    )
    for slot in s.slots:
        slot_inflight.add_metric([slot.slot], slot.inflight)
        slot_limit.add_metric([slot.slot], slot.limit)
        slot_queued.add_metric([slot.slot], slot.queued)
    yield from (slot_inflight, slot_limit, slot_queued)

    dead = CounterMetricFamily(
        _name("dead_letters"), "Requests dead-lettered by this node, by reason.", labels=["reason"]
    )
    for reason, n in sorted(snap.dead_letters.items()):
        dead.add_metric([reason], n)
    yield dead
    deferred = CounterMetricFamily(
        _name("admission_deferred"),
        "Times a request was parked by the Banker's admission, by reason.",
        labels=["reason"],
    )
    for reason, n in sorted(snap.deferred.items()):
        deferred.add_metric([reason], n)
    yield deferred

    if s.banker is not None:
        b = s.banker
        for name, doc, values in (
            (_name("resource_total"), "Units of the resource (BANKER_RESOURCES).", b.total),
            (_name("resource_available"), "Units free now.", b.available),
            (_name("resource_allocated"), "Units granted to tasks now.", b.allocated),
            (_name("resource_need"), "Units running tasks may still ask (claim - allocation).",
             b.need),
        ):  # fmt: skip
            g = GaugeMetricFamily(name, doc, labels=["resource"])
            for resource, n in sorted(values.items()):
                g.add_metric([resource], n)
            yield g
        yield from _gauges((
            (_name("tasks"), "Tasks holding a grant or a claim.", b.tasks),
            (_name("admission_parked"), "Requests parked until a release.", b.parked),
        ))

    if snap.control is not None:
        yield from _control_families(snap.control)

    if snap.revisits is not None:
        yield from _revisit_families(snap.revisits)

    if s.fleet is not None:
        f = s.fleet
        yield from _gauges((
            (_name("leases_in_flight"), "Requests this node holds leases on.", f.leased),
            (_name("partitions_owned"), "Partitions this node owns.", f.partitions_owned),
            (_name("partitions_total"), "Partitions of the crawl.", f.partitions_total),
            (_name("redis_pending_ops"), "Queue operations not sent to Redis yet.", f.pending_ops),
            (_name("redis_connected"), "1 while Redis answers, 0 during an outage.",
             int(f.connected)),
        ))  # fmt: skip


def _gauges(rows: Iterable[tuple[str, str, float]]) -> Iterator[Metric]:
    """One unlabelled gauge per ``(name, help, value)``."""
    for name, doc, value in rows:
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], value)
        yield g


def _control_families(c: ControlReading) -> Iterator[Metric]:
    """Run-time control: what the node follows, the budgets in force and what is charged."""
    yield from _gauges((
        (_name("control_version"),
         "Version of the operator's control document this node follows (0: none).", c.version),
        (_name("paused_hosts"), "Hosts paused by an operator (scrapy banker pause HOST).",
         c.paused_hosts),
        (_name("paused_topics"), "Topics paused by an operator (scrapy banker pause topic:NAME).",
         c.paused_topics),
    ))  # fmt: skip
    budget = GaugeMetricFamily(
        _name("budget_pages"),
        "Pages the crawl, a topic or a host may be fetched (budgets in force).",
        labels=["scope", "name"],
    )
    for scope, label, n in c.budgets:
        budget.add_metric([scope, label], n)
    yield budget
    charged = GaugeMetricFamily(
        _name("budget_charged_pages"),
        "Pages charged to a budget: the crawl's (fleet-wide on a fleet), a topic's (one node).",
        labels=["scope", "name"],
    )
    for scope, label, n in c.charged:
        charged.add_metric([scope, label], n)
    yield charged
    for key, n in sorted((c.counters or {}).items()):
        counter = CounterMetricFamily(_name(key), CONTROL_STATS[key][1])
        counter.add_metric([], n)
        yield counter


def _revisit_families(r: RevisitReading) -> Iterator[Metric]:
    """Revisits (BANKER_RECRAWL): the pages this node keeps, what is due, the fetches' outcomes."""
    yield from _gauges((
        (_name("revisit_pages"),
         "Pages whose revisits this node keeps (a fleet worker: the pages it fetched).", r.pages),
        (_name("revisit_due"), "Kept pages due for a revisit now.", r.due),
        (_name("revisit_overdue_seconds"), "How late the latest due page is (0: none due).",
         r.overdue_s),
    ))  # fmt: skip
    fresh = GaugeMetricFamily(
        _name("revisit_freshness"),
        "Estimated share of the kept pages whose copy is current (no series: no page yet).",
    )
    if r.freshness is not None:
        fresh.add_metric([], r.freshness)
    yield fresh
    sent = CounterMetricFamily(
        _name("revisits"), "Revisits sent to the scheduler as their pages came due."
    )
    sent.add_metric([], r.revisits)
    yield sent
    outcomes = CounterMetricFamily(
        _name("revisit_outcomes"),
        "Fetches of kept pages by what they found (a first fetch counts as changed; "
        "not_modified: the 304s among unchanged; superseded: revisits dropped unfetched).",
        labels=["outcome"],
    )
    for outcome, n in r.outcomes.items():
        outcomes.add_metric([outcome], n)
    yield outcomes
