"""The declared seams between the scheduler, its parts and its request store.

A scheduler is composed of named parts (:class:`SchedulerParts`, built once
by :func:`scrapy_banker.scheduler.parts.build`) and one request store.  What
the scheduler asks of every store is :class:`RequestStore`; what only some
stores offer -- a JOBDIR, a lease fence, a shared robots.txt cache, a
fleet's telemetry -- is one typed :class:`StoreFeatures` object the store
returns, so a component asks ``store.features.fence`` instead of probing
attributes by name, and mypy sees every use.

The protocols sit here, not beside their implementations, so that a store,
the wire gate and the robots.txt middleware all depend on this small module
rather than on each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred

    from scrapy_banker.core.directives import ControlState
    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.core.politeness import HostState
    from scrapy_banker.core.recrawl import UrlState
    from scrapy_banker.core.telemetry import FleetSample, PlacementSample
    from scrapy_banker.scheduler.admission_gate import AdmissionGate
    from scrapy_banker.scheduler.classifier import Classified, Classifier
    from scrapy_banker.scheduler.control_gate import ControlGate
    from scrapy_banker.scheduler.downloader import DownloaderView
    from scrapy_banker.scheduler.jobdir import JobDir
    from scrapy_banker.scheduler.politeness_gate import PolitenessGate
    from scrapy_banker.scheduler.queue import LocalQueue
    from scrapy_banker.scheduler.serialize import RequestCodec
    from scrapy_banker.settings import BankerConfig

__all__ = [
    "FleetTelemetry",
    "RequestStore",
    "RobotsTxt",
    "SchedulerParts",
    "SharedRevisits",
    "SharedRobots",
    "StoreFactory",
    "StoreFeatures",
    "WireCheck",
]

#: A robots.txt answer: its HTTP status (None: not fetched) and its body.
RobotsTxt = tuple[int | None, bytes]


@dataclass(frozen=True)
class SchedulerParts:
    """The named parts a scheduler is composed of, handed to its store.

    Built together by :func:`scrapy_banker.scheduler.parts.build`, each
    with its collaborators as constructor arguments: no part is wired to
    another after it was made.
    """

    crawler: Crawler
    config: BankerConfig
    stats: StatsCollector
    downloader: DownloaderView
    classifier: Classifier
    queue: LocalQueue
    #: Per-host pushback, Crawl-delay and throttle state, and the gate holding it.
    #: A store that takes hosts over adopts their states with
    #: ``politeness.adopt(states)``; :class:`~scrapy_banker.scheduler.store.MemoryStore`
    #: saves ``politeness.politeness`` in the JOBDIR snapshot.
    politeness: PolitenessGate
    codec: RequestCodec
    #: The operator's directives, and the budgets where the store does not count them.
    control: ControlGate
    #: None unless ``BANKER_RESOURCES`` is set.
    gate: AdmissionGate | None = None


class WireCheck(Protocol):
    """A store's last-moment check.

    A fleet's is :class:`~scrapy_banker.redis.store.lease_fence.LeaseFence`.
    """

    def check(self, request: Request, where: str) -> None:
        """Return if ``request`` may be sent; else give it back and raise ``GivenBack``."""


class SharedRobots(Protocol):
    """How a store shares robots.txt (a fleet's: :mod:`scrapy_banker.redis.store.robots_cache`)."""

    def fetch(
        self, origin: str, download: Callable[[], Awaitable[RobotsTxt]]
    ) -> Awaitable[RobotsTxt]:
        """``origin``'s robots.txt, downloaded by ``download`` only if nobody shared it yet."""


class SharedRevisits(Protocol):
    """Where a store keeps the pages' revisit states for every worker (a fleet's:
    :mod:`scrapy_banker.redis.store.fleet_revisits`); read by
    :class:`~scrapy_banker.middlewares.RecrawlMiddleware`."""

    def start(self) -> None:
        """The crawl revisits pages: begin taking the due ones."""

    def save(
        self, url: str, state: UrlState, request: Request | None, spider: Spider | None
    ) -> None:
        """Keep ``url``'s new state; ``request``: the spider's request its revisits copy
        (None: keep the one kept before)."""

    def take_due(self, spider: Spider) -> list[tuple[str, UrlState, Request]]:
        """The pages taken as due since the last call: (URL, state, the request to copy)."""

    def next_due(self) -> float | None:
        """The earliest due time left of the pages this process may take (None: none)."""

    def redelivered(self, request: Request) -> bool:
        """Whether ``request`` is a revisit delivered again because the worker holding it
        died or stalled: its page's due time, kept by the store, sends it again, and
        the dead worker may have fetched it already."""


class FleetTelemetry(Protocol):
    """A fleet node's share of the operator's view (read by the sampler and the metrics)."""

    def fleet(self) -> FleetSample:
        """This node's share of the fleet."""

    def placement_sample(self) -> PlacementSample | None:
        """The latest placement plan this node made, if any."""

    def crawl_charged(self) -> int | None:
        """Pages charged to the crawl budget fleet-wide at the last read (None: unknown)."""


@dataclass(frozen=True)
class StoreFeatures:
    """What a store offers beyond :class:`RequestStore`; None where it does not."""

    #: The job directory (one process with ``JOBDIR``).
    jobdir: JobDir | None = None
    #: The last-moment check before a request is sent (a fleet's lease fence).
    fence: WireCheck | None = None
    #: robots.txt fetched once per fleet.
    robots: SharedRobots | None = None
    #: The node's telemetry (a fleet).
    telemetry: FleetTelemetry | None = None
    #: The pages' revisit states, shared by every worker (a fleet; one process keeps
    #: them itself, in memory and its JOBDIR).
    revisits: SharedRevisits | None = None
    #: The node's name in the operator's view (None: the host name).
    node: str | None = None
    #: Seconds between two times the scheduler asks :meth:`RequestStore.directives`
    #: besides each pop, busy or not (a fully paused crawl pops nothing); None:
    #: no directives come through this store.
    directives_s: float | None = None


class RequestStore(Protocol):
    """What :class:`~scrapy_banker.scheduler.BankerScheduler` asks of a store.

    Kinds returned by :meth:`put` and :meth:`dispatched` complete Scrapy's
    ``scheduler/enqueued/<kind>`` and ``scheduler/dequeued/<kind>`` stats.
    """

    #: What this store offers beyond the protocol.
    features: StoreFeatures

    def open(self, spider: Spider) -> Deferred[None] | None: ...

    def close(self, reason: str) -> Deferred[None] | None: ...

    def is_duplicate(self, request: Request) -> bool:
        """Filter a request before it is classified (dedup that is not the store's own)."""

    def put(self, request: Request, c: Classified, now: float) -> str:
        """Keep a new request; returns where it went (``memory``, ``disk``, ``redis``)."""

    def refill(self, now: float) -> None:
        """Before a pop: bring into the local queue what the store has for this process."""

    def directives(self, now: float) -> ControlState | None:
        """The operator's directives when they changed since the last call, else None.

        The store owns the channel they come through (``JOBDIR/banker/control.json``
        on one process, the fleet's control document on Redis); the scheduler
        asks before each pop and once a second, and applies what it gets.
        """

    def keep(self, entry: Entry[Request]) -> bool:
        """May this popped entry be dispatched here? (False: the store took it back.)"""

    def dispatched(self, request: Request) -> str:
        """The request leaves for the engine; returns the kind it was dequeued from."""

    def downloaded(self, request: Request) -> None:
        """``request`` left the downloader (its callback may still be running)."""

    def polled(self, request: Request | None) -> None:
        """``next_request`` is about to return ``request``."""

    def has_pending(self) -> bool:
        """Work the store holds beyond the local queue (or reasons to stay open)."""

    def __len__(self) -> int:
        """Requests the store holds outside the local queue."""

    def queued_elsewhere(self) -> Mapping[str, int]:
        """Host -> its requests this process will fetch that wait outside the local
        queue (a fleet's partitions in Redis): the long-pole pacing counts them
        beside the local backlog, or a worker would see every host as the few
        requests it leased."""

    def politeness_changed(self, changed: Mapping[str, HostState]) -> None:
        """Host states that changed since the last call (``Politeness.take_changed()``).

        Called by the scheduler about once a second while it is polled, and
        at close -- never per request -- so a fleet store can publish them
        with the host (its partition) in one round trip.  A store that takes
        hosts over adopts their states the other way, through
        ``parts.politeness.adopt(states)``.
        """

    def dead_letter(self, request: Request, reason: str, entry: Entry[Request] | None) -> None:
        """Keep a request the crawl gives up on (its host refused past the cap) for requeueing.

        ``entry``: the request was popped from the local queue and is never
        dispatched (after :meth:`keep`); None: it was dispatched and its
        response is the last refusal (it ends through the engine as usual).
        """


class StoreFactory(Protocol):
    """A store class: how the scheduler's factory builds it (Scrapy's ``build_from_crawler``)."""

    #: Whether the store counts budget pages itself (a fleet's, in Redis with
    #: its leases); else the scheduler's control gate counts them.
    counts_budgets: bool

    def from_crawler(self, crawler: Crawler, parts: SchedulerParts) -> RequestStore: ...
