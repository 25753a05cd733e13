"""One line in ``ADDONS`` enables the whole suite."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, cast

from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object

from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler.jobdir import JobdirLock, check_resumable
from scrapy_banker.scheduler.store import MemoryStore
from scrapy_banker.settings import load_config, load_ops_config

if TYPE_CHECKING:
    from scrapy.settings import Settings

    from scrapy_banker.scheduler.seams import StoreFactory

logger = logging.getLogger(__name__)

SCHEDULER = "scrapy_banker.scheduler.BankerScheduler"
#: Component -> order, chosen relative to Scrapy's built-ins.  The topic tagger
#: (950) is closest to the spider, so DepthMiddleware (900) and the offsite
#: filter see requests already tagged; the downloader counter (860) sits next to
#: DownloaderStats (850), so like it it counts every network response, retried
#: attempts included.
SPIDER_MIDDLEWARES = {
    "scrapy_banker.middlewares.BankerTopicMiddleware": 950,
    # Revisits: a sitemap's <lastmod> dates, read from the sitemap the output came from.
    "scrapy_banker.middlewares.SitemapLastmodMiddleware": 960,
}
DOWNLOADER_MIDDLEWARES = {
    "scrapy_banker.middlewares.BankerDownloaderMiddleware": 860,
    "scrapy_banker.middlewares.NetworkMeasureMiddleware": 865,
    # After every other one (HttpCacheMiddleware is 900): the host's
    # politeness and a fleet worker's lease checked at the last moment.
    "scrapy_banker.middlewares.WireGateMiddleware": 990,
    # Between RedirectMiddleware (600) and RetryMiddleware (550): it sees the
    # decompressed body of the final response, before a retry is decided.
    # NotConfigured unless BANKER_RECRAWL.
    "scrapy_banker.middlewares.RecrawlMiddleware": 580,
}
#: Scrapy's robots.txt middleware and ours (Crawl-delay applied, robots.txt
#: fetched once per fleet), put in its place unless the project names either.
ROBOTSTXT_MIDDLEWARES = (
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware",
    "scrapy_banker.middlewares.BankerRobotsTxtMiddleware",
)
#: The operator's view (metrics, progress, time series) raises a bare
#: NotConfigured while its setting is off: listed here, it costs nothing then.
EXTENSIONS = {
    "scrapy_banker.extensions.BankerStatsFile": 500,
    "scrapy_banker.extensions.BankerTopicAdjuster": 500,
    "scrapy_banker.extensions.BankerTimeseries": 500,
    "scrapy_banker.extensions.BankerMetrics": 500,
    "scrapy_banker.extensions.BankerProgress": 500,
}


class Addon:
    """Scrapy add-on: ``ADDONS = {"scrapy_banker.Addon": 500}``.

    Settings are written at ``addon`` priority, so anything the project sets
    explicitly (its own ``SCHEDULER`` for instance) still wins, as Scrapy's
    add-on contract promises.
    """

    def update_settings(self, settings: Settings) -> None:
        # Fail fast on a bad BANKER_* value; the crawler (and its per-crawler
        # configs) does not exist yet, so parse the settings directly.
        config = load_config(settings)
        load_ops_config(settings)
        if not config.enabled:
            # Bare: Scrapy logs a NotConfigured message as a warning, and being
            # switched off is no reason to warn.
            logger.debug("scrapy-banker add-on disabled: BANKER_ENABLED is False")
            raise NotConfigured()
        settings.set("SCHEDULER", SCHEDULER, priority="addon")
        for name, components in (
            ("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
            ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
            ("EXTENSIONS", EXTENSIONS),
        ):
            for cls, order in components.items():
                settings.setdefault_in_component_priority_dict(name, load_object(cls), order)
        _swap_robotstxt(settings)
        _check_jobdir(settings)


def _check_jobdir(settings: Settings) -> None:
    """Refuse, before anything is built, a JOBDIR that the scheduler would refuse at open.

    A JOBDIR another process holds, or one this version cannot resume: the
    scheduler refuses both when it opens (which stays the authority: a crawl
    may take the lock between this look and that moment), but an error there
    comes after the spider was built, where Scrapy 2.13's ``crawl`` command
    exits 0; here it exits 1 on every Scrapy version.
    """
    root = settings.get("JOBDIR")
    if not root or not os.path.isdir(os.path.join(str(root), "banker")):
        return  # no JOBDIR, or a fresh one: nothing to refuse
    if _banker_store(settings) is not MemoryStore:
        return  # not our scheduler, or a fleet's: its JOBDIR holds no journal of ours
    lock = JobdirLock(str(root))
    lock.acquire()
    try:
        check_resumable(str(root))
    finally:
        lock.release()


def _banker_store(settings: Settings) -> StoreFactory | None:
    """The store class of the configured ``SCHEDULER`` if it is ours, else ``None``."""
    scheduler = load_object(settings["SCHEDULER"])
    # The MRO, not issubclass: Scrapy's BaseScheduler metaclass calls any class
    # with the scheduler methods a subclass.
    if not (isinstance(scheduler, type) and BankerScheduler in scheduler.__mro__):
        return None
    return cast("type[BankerScheduler]", scheduler).store_class


def _swap_robotstxt(settings: Settings) -> None:
    """Our robots.txt middleware at Scrapy's order, Scrapy's off (it is NotConfigured
    without ``ROBOTSTXT_OBEY``); a project that names either keeps its choice."""
    scrapy_cls, banker_cls = map(load_object, ROBOTSTXT_MIDDLEWARES)
    components = settings.getdict("DOWNLOADER_MIDDLEWARES")
    if any(load_object(c) in (scrapy_cls, banker_cls) for c in components):
        return
    order = settings.getdict("DOWNLOADER_MIDDLEWARES_BASE").get(ROBOTSTXT_MIDDLEWARES[0], 100)
    # By the paths Scrapy's base setting uses: Scrapy 2.13 matches a class
    # given as a key only to itself, not to the same class named by its path.
    components[ROBOTSTXT_MIDDLEWARES[0]] = None
    components[ROBOTSTXT_MIDDLEWARES[1]] = order
    settings.set(
        "DOWNLOADER_MIDDLEWARES", components, settings.getpriority("DOWNLOADER_MIDDLEWARES") or 0
    )
