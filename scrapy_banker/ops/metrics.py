"""``BankerMetrics``: ``/metrics`` in the Prometheus text format, from the scheduler's samples.

With :setting:`BANKER_METRICS_PORT` set, each worker serves its own
``/metrics`` with prometheus-client, on a registry of its own (nothing of
the process-wide default registry leaks in, and two crawlers in one process
do not collide).  Metric names are listed in ``docs/ops/metrics.rst``.

Threads: prometheus-client answers scrapes on its own HTTP thread, while the
scheduler's structures belong to the reactor thread and change under it.  So
the reactor takes a sample every :setting:`BANKER_TIMESERIES_INTERVAL`
seconds and stores it, with the few stats counters the metrics need, as one
immutable :class:`Snapshot`; a scrape only reads the latest snapshot (one
attribute read, atomic) and never touches the crawl.  A scrape therefore
shows the crawl as it was at most one interval ago;
``banker_sample_timestamp_seconds`` says when.

The HTTP server binds to :setting:`BANKER_METRICS_BIND` (localhost by
default) and stops when the spider closes.

Run-time control (issue #27) is read with the sample, on the reactor thread:
the directives the scheduler follows and the budgets in force
(:func:`read_control`), so a scrape says which hosts this node holds paused
and how much of the crawl's budget is spent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from scrapy.exceptions import NotConfigured

from scrapy_banker.core.directives import CRAWL
from scrapy_banker.ops.timeseries import SamplingExtension
from scrapy_banker.settings import ops_config

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

    from scrapy_banker.core.telemetry import Sample
    from scrapy_banker.scheduler import BankerScheduler
    from scrapy_banker.settings import OpsConfig

logger = logging.getLogger(__name__)

__all__ = [
    "CONTROL_STATS",
    "DEAD_LETTER_STATS",
    "DEFERRED_REASONS",
    "NAMESPACE",
    "BankerMetrics",
    "ControlReading",
    "SampleCollector",
    "Snapshot",
    "families",
    "read_control",
    "read_counters",
]

#: ``banker_dead_letters_total`` reason -> the stats counters that count it.
DEAD_LETTER_STATS: Mapping[str, tuple[str, ...]] = {
    # Payloads no allowed request could be decoded from (Redis) or JOBDIR
    # entries refused on resume.
    "malformed": ("banker/redis/malformed", "banker/jobdir/malformed"),
    # Leases that expired BANKER_REDIS_MAX_DELIVERIES times (this node's reaper).
    "max_deliveries": ("banker/redis/reaped_dead",),
    # Pending requests JOBDIR could not store (listed in banker-deadletter.jsonl).
    "unserializable": ("banker/jobdir/unserializable",),
}
#: ``banker_admission_deferred_total`` reasons (``banker/admission/deferred/<reason>``).
DEFERRED_REASONS = ("unsafe", "insufficient")
#: Run-time control counters: metric name (without the namespace) -> (stats counter, help).
CONTROL_STATS: Mapping[str, tuple[str, str]] = {
    "budget_held": (
        "banker/budget/held",
        "Requests held aside because a budget was spent (this node's pops or leases).",
    ),
    "budget_released": (
        "banker/budget/released",
        "Held requests put back in their queues after a budget changed.",
    ),
}
#: Every metric is ``<NAMESPACE>_<name>`` (prometheus-client's namespace convention).
NAMESPACE = "banker"


def _name(name: str) -> str:
    return f"{NAMESPACE}_{name}"


@dataclass(frozen=True)
class ControlReading:
    """The run-time control a node follows, read with a sample on the reactor thread."""

    #: Version of the control document the scheduler follows (0: none yet).
    version: int
    paused_hosts: int
    paused_topics: int
    #: ``(scope, name, pages)`` of every budget in force: ``crawl``; ``topic``
    #: per topic; ``host`` per host an operator gave one, per
    #: ``BANKER_HOST_BUDGETS`` pattern, ``*`` for ``BANKER_HOST_BUDGET``.
    budgets: tuple[tuple[str, str, int], ...] = ()
    #: ``(scope, name, pages)`` charged: the crawl's (fleet-wide on a fleet, as
    #: the worker last read it), each topic's on a single node.
    charged: tuple[tuple[str, str, int], ...] = ()
    #: :data:`CONTROL_STATS` counters.
    counters: dict[str, int] | None = None


@dataclass(frozen=True)
class Snapshot:
    """What one scrape shows: a sample and the counters read with it, on the reactor."""

    sample: Sample
    dead_letters: dict[str, int]
    deferred: dict[str, int]
    #: None: the scheduler follows no control (a scheduler without a control gate).
    control: ControlReading | None = None


def read_counters(stats: StatsCollector) -> tuple[dict[str, int], dict[str, int]]:
    """Dead letters and deferred admissions by reason, from the crawl's stats."""

    def get(key: str) -> int:
        return int(stats.get_value(key, 0) or 0)

    dead = {reason: sum(get(k) for k in keys) for reason, keys in DEAD_LETTER_STATS.items()}
    deferred = {reason: get(f"banker/admission/deferred/{reason}") for reason in DEFERRED_REASONS}
    return dead, deferred


def read_control(
    scheduler: BankerScheduler | None, stats: StatsCollector | None = None
) -> ControlReading | None:
    """What the scheduler follows of the operator's control, or None (it follows none).

    Reactor thread only: the scheduler's ``control`` gate
    (:class:`~scrapy_banker.scheduler.control_gate.ControlGate`) holds the state
    it applies and the settings' budget rules; a single node counts pages in
    the gate's budget book, a fleet in Redis, whose crawl count the worker
    thread last read (the store's ``features.telemetry.crawl_charged()``).
    """
    if scheduler is None:
        return None
    control = scheduler.control
    state, rules = control.state, control.rules
    budgets: list[tuple[str, str, int]] = []
    crawl = rules.crawl_budget(state)
    if crawl is not None:
        budgets.append(("crawl", CRAWL, crawl))
    for topic in sorted(set(rules.topics) | set(state.topics)):
        budget = rules.topic(topic, state)
        if budget is not None:
            budgets.append(("topic", topic, budget))
    hosts = {h: c.budget for h, c in state.hosts.items() if c.budget is not None}
    for pattern, budget in rules.patterns:
        hosts.setdefault(pattern, budget)
    if rules.default is not None:
        hosts.setdefault("*", rules.default)
    budgets += [("host", h, b) for h, b in sorted(hosts.items())]
    charged: list[tuple[str, str, int]] = []
    if rules.any(state):
        book = control.book
        telemetry = scheduler.store.features.telemetry
        if book is not None:  # one node: its own counts
            charged.append(("crawl", CRAWL, int(book.crawl)))
            charged += [("topic", t, int(n)) for t, n in sorted(book.topics.items())]
        elif telemetry is not None:  # a fleet: Redis counts, the crawl's as last read
            crawl_charged = telemetry.crawl_charged()
            if crawl_charged is not None:
                charged.append(("crawl", CRAWL, crawl_charged))
    counters = None
    if stats is not None:
        counters = {
            name: int(stats.get_value(key, 0) or 0) for name, (key, _) in CONTROL_STATS.items()
        }
    return ControlReading(
        version=state.version,
        paused_hosts=len(state.paused_hosts),
        paused_topics=len(state.paused_topics),
        budgets=tuple(budgets),
        charged=tuple(charged),
        counters=counters,
    )


class SampleCollector(Collector):
    """Turns the latest :class:`Snapshot` into metric families (on the HTTP thread)."""

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

    for name, doc, value in (
        (
            _name("queued"),
            "Requests waiting in the scheduler (all topics, parked, leased).",
            s.queued,
        ),
        (_name("inflight"), "Requests in the downloader.", s.inflight),
    ):
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], value)
        yield g

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
        for name, doc, value in (
            (_name("tasks"), "Tasks holding a grant or a claim.", b.tasks),
            (_name("admission_parked"), "Requests parked until a release.", b.parked),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g

    if snap.control is not None:
        yield from _control_families(snap.control)

    if s.fleet is not None:
        f = s.fleet
        for name, doc, value in (
            (_name("leases_in_flight"), "Requests this node holds leases on.", f.leased),
            (_name("partitions_owned"), "Partitions this node owns.", f.partitions_owned),
            (_name("partitions_total"), "Partitions of the crawl.", f.partitions_total),
            (_name("redis_pending_ops"), "Queue operations not sent to Redis yet.", f.pending_ops),
            (_name("redis_connected"), "1 while Redis answers, 0 during an outage.",
             int(f.connected)),
        ):  # fmt: skip
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g


def _control_families(c: ControlReading) -> Iterator[Metric]:
    """Run-time control: what the node follows, the budgets in force and what is charged."""
    for name, doc, value in (
        (_name("control_version"),
         "Version of the operator's control document this node follows (0: none).", c.version),
        (_name("paused_hosts"), "Hosts paused by an operator (scrapy banker pause HOST).",
         c.paused_hosts),
        (_name("paused_topics"), "Topics paused by an operator (scrapy banker pause topic:NAME).",
         c.paused_topics),
    ):  # fmt: skip
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], value)
        yield g
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


class BankerMetrics(SamplingExtension):
    """Serves ``/metrics`` from the latest sample; off unless ``BANKER_METRICS_PORT`` is set."""

    label = "BankerMetrics"

    def __init__(self, crawler: Crawler, config: OpsConfig, port: int) -> None:
        super().__init__(crawler, config)
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.port = port
        self.bind = config.metrics_bind
        #: Replaced whole on the reactor thread, read by the HTTP thread.
        self.snapshot: Snapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SampleCollector(lambda: self.snapshot))
        self.server: Any = None
        self.url: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = ops_config(crawler)
        if config.metrics_port is None:
            raise NotConfigured()  # bare: being off is no reason to warn
        cls._check_scheduler(crawler, cls)
        return cls(crawler, config, config.metrics_port)

    def start(self) -> bool:
        try:
            server, _thread = start_http_server(self.port, addr=self.bind, registry=self.registry)
        except OSError as exc:  # port taken, address not on this host...
            logger.error(
                "Cannot serve metrics on %s:%d (%s); the crawl goes on without them",
                self.bind, self.port, exc,
            )  # fmt: skip
            return False
        self.server = server
        host = self.bind if ":" not in self.bind else f"[{self.bind}]"
        self.url = f"http://{host}:{server.server_port}/metrics"
        logger.info("Prometheus metrics on %s", self.url)
        return True

    def on_sample(self, sample: Sample) -> None:
        dead, deferred = read_counters(self.stats)
        control = read_control(self.scheduler, self.stats)
        self.snapshot = Snapshot(sample, dead, deferred, control)

    def on_close(self, sample: Sample | None) -> None:
        if sample is not None:
            self.on_sample(sample)
        server, self.server = self.server, None
        if server is None:
            return

        def stop() -> None:
            # shutdown() waits for serve_forever's next poll (up to 0.5 s):
            # off the reactor thread, so closing the spider does not wait.
            server.shutdown()
            server.server_close()

        threading.Thread(target=stop, name="banker-metrics-stop", daemon=True).start()
