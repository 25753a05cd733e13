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
and how much of the crawl's budget is spent.  So are revisits
(:setting:`BANKER_RECRAWL`, :func:`read_revisits_metrics`): the pages whose
revisit state the crawl's revisit middleware keeps, summed up as ``scrapy
banker status`` sums them (:func:`~scrapy_banker.ops.revisits_view.summarise`,
one pass over the pages per sample), and the revisits' stats counters.

The metric families themselves are built in
:mod:`scrapy_banker.ops.metric_families`, which :class:`BankerMetrics`
imports (with prometheus-client) only once :setting:`BANKER_METRICS_PORT`
is set: this module is imported by every crawl with the add-on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from scrapy_banker.core.directives import CRAWL
from scrapy_banker.ops.revisits_view import summarise
from scrapy_banker.ops.timeseries import SamplingExtension
from scrapy_banker.scheduler.revisits import running_recrawl
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
    "REVISIT_OUTCOME_STATS",
    "REVISIT_SENT_STAT",
    "BankerMetrics",
    "ControlReading",
    "RevisitReading",
    "Snapshot",
    "read_control",
    "read_counters",
    "read_revisits_metrics",
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

#: ``banker_revisits_total``: revisits sent as their pages came due.
REVISIT_SENT_STAT = "banker/recrawl/revisits"
#: ``banker_revisit_outcomes_total`` outcome -> the stats counter that counts it.
REVISIT_OUTCOME_STATS: Mapping[str, str] = {
    "changed": "banker/recrawl/changed",
    "unchanged": "banker/recrawl/unchanged",
    "failed": "banker/recrawl/failed",
    "not_modified": "banker/recrawl/not_modified",
    "superseded": "banker/recrawl/superseded",
}


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
class RevisitReading:
    """The revisits a node keeps, read with a sample on the reactor thread."""

    #: Pages whose revisit state the node keeps (a fleet worker: the pages it fetched).
    pages: int
    #: Pages due now, and how late the latest of them is (s; 0: none due).
    due: int
    overdue_s: float
    #: Estimated share of the pages whose copy is current (None: no page yet).
    freshness: float | None
    #: Revisits sent as their pages came due (:data:`REVISIT_SENT_STAT`).
    revisits: int
    #: :data:`REVISIT_OUTCOME_STATS` counters, outcome -> count.
    outcomes: dict[str, int]


@dataclass(frozen=True)
class Snapshot:
    """What one scrape shows: a sample and the counters read with it, on the reactor."""

    sample: Sample
    dead_letters: dict[str, int]
    deferred: dict[str, int]
    #: None: the scheduler follows no control (a scheduler without a control gate).
    control: ControlReading | None = None
    #: None: revisits are off (no :setting:`BANKER_RECRAWL`).
    revisits: RevisitReading | None = None


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


def read_revisits_metrics(
    crawler: Crawler, stats: StatsCollector, now: float
) -> RevisitReading | None:
    """The revisits the crawl's revisit middleware keeps, as of ``now`` (wall clock), or
    None (revisits are off).

    Reactor thread only: the middleware's ``states`` change under any other.
    One pass over them (:func:`~scrapy_banker.ops.revisits_view.summarise`,
    the figures ``scrapy banker status`` gives), once per sample.
    """
    middleware = running_recrawl(crawler)
    if middleware is None:
        return None
    view = summarise(middleware.states.values(), 0, now)

    def get(key: str) -> int:
        return int(stats.get_value(key, 0) or 0)

    return RevisitReading(
        pages=0 if view is None else view.pages,
        due=0 if view is None else view.due_now,
        overdue_s=(view.most_overdue_s if view is not None else None) or 0.0,
        freshness=None if view is None else view.freshness,
        revisits=get(REVISIT_SENT_STAT),
        outcomes={outcome: get(key) for outcome, key in REVISIT_OUTCOME_STATS.items()},
    )


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
        # Imported here, once the port is set: a crawl without metrics does
        # not carry prometheus-client's objects (see ops/metric_families).
        from prometheus_client import CollectorRegistry

        from scrapy_banker.ops.metric_families import SampleCollector

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
        from prometheus_client import start_http_server

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
        revisits = read_revisits_metrics(self.crawler, self.stats, sample.t)
        self.snapshot = Snapshot(sample, dead, deferred, control, revisits)

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
