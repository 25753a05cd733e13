"""The one place a scheduler's parts are built and joined.

Every part gets its collaborators as constructor arguments, here, in the
order the room checks chain (the local queue asks the control gate, which
asks the politeness gate, which asks the downloader): no part is wired to
another after it was made, and whoever reads this function sees the whole
scheduler.  Callbacks that point forward (a host's wait is over: free its
lanes in the queue built below; a host is given up on: the store built last
keeps its requests) are closures over this function's names, bound when
they are first called -- never before the crawl opens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy_banker.core.topics import TopicScheduler
from scrapy_banker.scheduler.classifier import Classifier
from scrapy_banker.scheduler.control_gate import ControlGate
from scrapy_banker.scheduler.downloader import DownloaderView
from scrapy_banker.scheduler.engine import wake_engine
from scrapy_banker.scheduler.politeness_gate import PolitenessGate
from scrapy_banker.scheduler.queue import LocalQueue
from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts, StoreFactory
from scrapy_banker.scheduler.serialize import RequestCodec

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.scheduler.admission_gate import AdmissionGate
    from scrapy_banker.settings import BankerConfig

__all__ = ["build"]


def build(
    crawler: Crawler, config: BankerConfig, store_class: StoreFactory
) -> tuple[SchedulerParts, RequestStore]:
    """The scheduler's parts and its store, for ``crawler``'s settings."""
    stats = crawler.stats
    assert stats is not None
    settings = crawler.settings
    downloader = DownloaderView(settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN"))

    def hosts_ready(slots: list[str]) -> None:
        """The wait of these slots' hosts is over: their parked lanes compete again."""
        for slot in slots:
            queue.slot_freed(slot)
        wake_engine(crawler)

    def dead_letter(request: Request, reason: str) -> None:
        """A dispatched request whose host was given up on: the store keeps it."""
        store.dead_letter(request, reason, None)

    politeness = PolitenessGate(
        config, stats, downloader.is_free,
        autothrottle=settings.getbool("AUTOTHROTTLE_ENABLED"),
        on_ready=hosts_ready, dead_letter=dead_letter,
    )  # fmt: skip
    topics = TopicScheduler(
        config.topics.values(),
        default_slice_s=config.topic_slice,
        min_slice_s=config.topic_min_slice,
        slice_step_s=config.topic_slice_step,
        max_wait_s=config.topic_max_wait,
    )
    control = ControlGate(
        stats, downloader, politeness.is_free, config.budgets(),
        topics=topics, last_wire=politeness.last_wire, on_ready=hosts_ready,
        counting=not store_class.counts_budgets,
    )  # fmt: skip
    queue = LocalQueue(
        config, topics, control.is_free, downloader.idle, politeness.interval, politeness.refused
    )
    parts = SchedulerParts(
        crawler=crawler,
        config=config,
        stats=stats,
        downloader=downloader,
        classifier=Classifier(config, downloader, stats),
        queue=queue,
        politeness=politeness,
        codec=RequestCodec(config.serialize_allowed_classes),
        control=control,
        gate=_admission_gate(config, stats, queue.requeue),
    )
    store = store_class.from_crawler(crawler, parts)
    return parts, store


def _admission_gate(
    config: BankerConfig, stats: StatsCollector, requeue: Callable[[Entry[Request], float], None]
) -> AdmissionGate | None:
    """The Banker's admission where :setting:`BANKER_RESOURCES` declares resources, else None.

    Imported here and only then: the algorithm's numpy adds some 6,000
    objects that every full garbage collection of the crawl scans, a cost
    each request pays in a crawl that does not use it.
    """
    if not config.resources:
        return None
    from scrapy_banker.scheduler.admission_gate import AdmissionGate

    return AdmissionGate(config, stats, requeue)
