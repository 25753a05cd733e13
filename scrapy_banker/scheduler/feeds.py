"""Items as safe as requests: a page counts as done only once its items are in the feeds.

A request is journaled as done (or acked on a fleet) once the engine is
completely done with it -- its callback's items have passed the item
pipelines and Scrapy's ``FeedExporter`` has written them.  Written, not
kept: a local feed file is a buffered file, so a ``kill -9`` right after the
``D`` record loses the items still in Python's buffer, while the page counts
as done and is never scraped again.  :class:`FeedBarrier` closes that gap:
before the store records pages as done it flushes every feed and ``fsync``\\ s
the local files, and it says when a feed cannot be made durable before the
crawl ends (the store then keeps those pages pending until the close).

What is promised per feed storage (docs/guarantees.rst):

* a local file (a path, ``file://``): durable -- flushed and ``fsync``-ed --
  before any page whose items it holds counts as done;
* standard output (``stdout:``): flushed (a pipe or terminal has no ``fsync``);
* storages uploaded at the close (S3, GCS, FTP) and feeds with
  ``postprocessing`` (a compressed stream is complete only at its end):
  their items exist only at the close, so no page counts as done before it
  (after a crash every page since the start is fetched again: at-least-once).

Feeds written by a user's own item pipeline are not Scrapy's feeds and are
not seen here.  The barrier runs at most every :data:`SYNC_INTERVAL_S`
(an ``fsync`` costs milliseconds, a page far less): pages finished in
between wait in the store, costing at most that much re-fetching after a
crash.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from scrapy.extensions.feedexport import FeedExporter, FileFeedStorage, StdoutFeedStorage

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

__all__ = ["SYNC_INTERVAL_S", "FeedBarrier"]

#: The least time between two barriers (s).
SYNC_INTERVAL_S = 0.25


class FeedBarrier:
    """Flush and ``fsync`` the crawl's feeds before pages are recorded as done."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._exporter: FeedExporter | bool | None = False  # False: not looked up yet
        self._next_at = 0.0
        #: Barriers run, and feeds whose items exist only at the close.
        self.syncs = 0
        self.deferred_feeds: set[str] = set()

    def _feeds(self) -> FeedExporter | None:
        if self._exporter is False:
            extensions = getattr(self.crawler, "extensions", None)
            found = [
                ext for ext in getattr(extensions, "middlewares", ())
                if isinstance(ext, FeedExporter)
            ]  # fmt: skip
            self._exporter = found[0] if found else None
        return self._exporter if isinstance(self._exporter, FeedExporter) else None

    @property
    def active(self) -> bool:
        """Does the crawl write feeds (so pages wait for the barrier)?"""
        exporter = self._feeds()
        return exporter is not None and bool(exporter.slots)

    def due(self, now: float) -> bool:
        """Is it time for the next barrier (always, without feeds)?"""
        return now >= self._next_at or not self.active

    def sync(self, now: float) -> bool:
        """Make the items written so far durable; False if a feed holds them until the close."""
        self._next_at = now + SYNC_INTERVAL_S
        exporter = self._feeds()
        if exporter is None:
            return True
        durable = True
        for slot in exporter.slots:
            if not _sync_slot(slot):
                durable = False
                if slot.uri not in self.deferred_feeds:
                    self.deferred_feeds.add(slot.uri)
                    logger.info(
                        "Feed %s is written at the close: its pages count as done only then "
                        "(a crash before it fetches them again)", slot.uri,
                    )  # fmt: skip
        self.syncs += 1
        return durable


def _sync_slot(slot: Any) -> bool:
    """Flush one feed slot's file (and ``fsync`` a local one); False: durable only at close."""
    storage = slot.storage
    if "postprocessing" in getattr(slot, "feed_options", {}):
        return False
    local = isinstance(storage, FileFeedStorage)
    if not local and not isinstance(storage, StdoutFeedStorage):
        return False
    file = slot.file
    if file is None or getattr(file, "closed", False):
        return True  # nothing exported yet, or a batch already closed (and flushed)
    file.flush()
    if local:
        os.fsync(file.fileno())
    return True
