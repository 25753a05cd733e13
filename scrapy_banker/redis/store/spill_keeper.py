"""A fleet worker's start and stop around Redis: wait for it, replay a spill, spill at close.

At start, off the reactor thread, :meth:`SpillKeeper.prepare` waits for Redis
(``BANKER_REDIS_CONNECT_TIMEOUT``; a crawl Redis never answers fails with the
address it tried), deletes the crawl's keys when
``BANKER_REDIS_FLUSH_ON_START`` asks, and claims the spill files an earlier
worker left in this crawl's spill directory (:func:`spill_dir`); the worker
thread replays them before anything else and they are removed only once
Redis confirmed every operation.  At stop, :meth:`SpillKeeper.stop_and_spill`
flushes what is queued and writes what Redis never received to a new spill
file (:mod:`scrapy_banker.core.spill`), which the next worker with the same
spill directory replays.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.utils.job import job_dir
from scrapy.utils.project import data_path

from scrapy_banker.core.spill import ClaimedSpill, SpillDir, SpillHeader, SpillOps, merge
from scrapy_banker.redis.connection import redacted_url, wait_for_redis
from scrapy_banker.settings import redis_config

if TYPE_CHECKING:
    from pathlib import Path

    import redis
    from redis.cluster import RedisCluster
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.redis.worker import FrontierWorker
    from scrapy_banker.settings import RedisConfig

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_SPILL", "JOBDIR_SPILL", "SpillKeeper", "Stopped", "spill_dir"]

#: Where spill files go inside ``JOBDIR`` ...
JOBDIR_SPILL = "banker-redis-spill"
#: ... and, without ``JOBDIR`` or ``BANKER_REDIS_SPILL_DIR``, in the project's
#: data directory (``.scrapy/``, like Scrapy's ``HTTPCACHE_DIR``), per spider.
DEFAULT_SPILL = "banker-spill/%(spider)s"


def spill_dir(crawler: Crawler, spider_name: str) -> str:
    """The spill directory of this crawl: ``BANKER_REDIS_SPILL_DIR``, else JOBDIR's, else default.

    A relative path is resolved like ``HTTPCACHE_DIR``: inside a Scrapy
    project, under its ``.scrapy`` directory; elsewhere under ``./.scrapy``.
    The same directory on the next start is what makes the replay happen.
    """
    configured = redis_config(crawler).spill_dir
    if configured:
        return data_path(configured)
    jobdir = job_dir(crawler.settings)
    if jobdir:
        return os.path.join(jobdir, JOBDIR_SPILL)
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in spider_name) or "spider"
    return data_path(DEFAULT_SPILL % {"spider": safe})


@dataclass(frozen=True)
class Stopped:
    """What stopping the worker left: unsent operations and where they were spilled."""

    unsent: int
    ops: SpillOps | None = None
    path: Path | None = None
    error: OSError | None = None


class SpillKeeper:
    """Gets Redis ready and replays an earlier worker's spill; spills what is unsent at stop."""

    def __init__(
        self,
        crawler: Crawler,
        rconfig: RedisConfig,
        client: redis.Redis | RedisCluster,
        frontier: RedisFrontier,
        worker: FrontierWorker,
        stats: StatsCollector,
        node: str,
    ) -> None:
        self.rconfig = rconfig
        self.client = client
        self.frontier = frontier
        self.worker = worker
        self.stats = stats
        self.node = node
        #: Where to replay from at start and spill to at stop.
        spider_name = getattr(getattr(crawler, "spidercls", None), "name", None) or "spider"
        self.dir = SpillDir(spill_dir(crawler, spider_name))
        #: Spill files being replayed; removed once Redis confirmed all of them.
        self._claimed: list[ClaimedSpill] = []
        #: The address tried, password masked, for the start-up error.
        self._url = redacted_url(crawler.settings)

    # -- start ------------------------------------------------------------------------

    def prepare(self) -> tuple[int | None, list[ClaimedSpill]]:
        """Wait for Redis, flush it if asked, claim the spill files of an earlier worker.

        Blocking I/O: called off the reactor thread.  Returns how many keys
        the flush deleted (None: no flush) and the files claimed.
        """
        timeout = self.rconfig.connect_timeout
        if timeout > 0:  # 0: start anyway, the worker thread rides out the outage
            wait_for_redis(self.client, timeout, self._url)
        deleted = self.frontier.clear() if self.rconfig.flush_on_start else None
        try:
            claimed, foreign = self.dir.claim(self.rconfig.prefix, self.rconfig.partitions)
        except OSError as exc:
            logger.error("Cannot read the spill directory %s (%s): nothing replayed",
                         self.dir.path, exc)  # fmt: skip
            return deleted, []
        for path in foreign:
            logger.error(
                "Spill file %s belongs to another crawl (another BANKER_REDIS_PREFIX or "
                "BANKER_REDIS_PARTITIONS): not replayed, left in place", path,
            )  # fmt: skip
            self.stats.inc_value("banker/redis/spill/skipped")
        if deleted is not None and claimed:
            # They belong to the crawl that was just flushed: set aside, not replayed.
            for c in claimed:
                aside = c.path.with_name(c.path.name + ".flushed")
                os.replace(c.path, aside)
                c.release(remove=False)
                logger.warning(
                    "BANKER_REDIS_FLUSH_ON_START: spill file of the flushed crawl set aside "
                    "as %s, not replayed", aside,
                )  # fmt: skip
            claimed = []
        return deleted, claimed

    def replay(self, result: tuple[int | None, list[ClaimedSpill]]) -> None:
        """On the reactor thread, after :meth:`prepare`: hand the claimed files to the worker."""
        deleted, claimed = result
        if deleted is not None:
            logger.info("BANKER_REDIS_FLUSH_ON_START: deleted %d keys of %r", deleted,
                        self.rconfig.prefix)  # fmt: skip
        if not claimed:
            return
        ops = merge(c.parsed.ops for c in claimed)
        bad = sum(len(c.parsed.bad) for c in claimed)
        for c in claimed:
            if c.parsed.bad:
                first = c.parsed.bad[0]
                logger.error(
                    "Spill file %s: %d malformed lines skipped, kept in %s (line %d: %s)",
                    c.path, len(c.parsed.bad), c.bad_path, first.number, first.reason,
                )  # fmt: skip
        if bad:
            self.stats.inc_value("banker/redis/spill/malformed", bad)
        logger.info(
            "Replaying %d queue operations (%s) that a worker could not send to Redis, "
            "from %s", len(ops), ops.describe(), ", ".join(str(c.path) for c in claimed),
        )  # fmt: skip
        self._claimed = claimed
        self.worker.replay(ops, self._replayed)

    def _replayed(self) -> None:
        """On the worker thread: Redis confirmed every spilled operation; the files can go."""
        claimed, self._claimed = self._claimed, []
        for c in claimed:
            c.release(remove=True)
        if claimed:
            logger.info("Spilled queue operations replayed into Redis; removed %s",
                        ", ".join(str(c.path) for c in claimed))  # fmt: skip

    def release(self) -> None:
        """The start failed: the claimed files stay, for the next worker to replay."""
        for c in self._claimed:
            c.release(remove=False)

    # -- stop ---------------------------------------------------------------------------

    def stop_and_spill(self) -> Stopped:
        """Off the reactor: flush, leave the fleet, write what Redis never got to a spill file."""
        unsent = self.worker.stop()
        if not unsent:
            return Stopped(0)
        ops = self.worker.take_unsent()
        header = SpillHeader(
            self.rconfig.prefix, self.rconfig.partitions, self.node,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )  # fmt: skip
        try:
            path = self.dir.write(header, ops)
        except OSError as exc:
            return Stopped(unsent, ops, None, exc)
        # What was left of the spill files being replayed is in the new one now.
        claimed, self._claimed = self._claimed, []
        for c in claimed:
            c.release(remove=True)
        return Stopped(unsent, ops, path, None)

    def report(self, result: Stopped) -> None:
        """On the reactor thread: what :meth:`stop_and_spill` could not send, and where it is."""
        if not result.unsent:
            return
        self.stats.set_value("banker/redis/unsent_at_close", result.unsent)
        ops = result.ops
        assert ops is not None
        if result.path is not None:
            logger.error(
                "Redis stayed unreachable: %d queue operations were not sent (%s); they are "
                "saved in %s and replayed into Redis by the next worker started with this "
                "spill directory (JOBDIR or BANKER_REDIS_SPILL_DIR)",
                len(ops), ops.describe(), result.path,
            )  # fmt: skip
            self.stats.set_value("banker/redis/spill/written", len(ops))
        else:
            logger.error(
                "Redis stayed unreachable: %d queue operations were not sent (%s) and could "
                "not be saved in %s (%s): the requests of the enqueues are lost; leased "
                "requests are delivered again after BANKER_REDIS_LEASE_TTL",
                len(ops), ops.describe(), self.dir.path, result.error,
            )  # fmt: skip
