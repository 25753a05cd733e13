"""robots.txt fetched once per host per fleet: one worker fetches, the others read Redis.

Scrapy's ``RobotsTxtMiddleware`` fetches a host's robots.txt once per
process; a fleet of N workers fetches it N times, and again on every worker
a partition moves to.  :class:`RobotsCache` keeps the body in Redis
(:meth:`Keyspace.robots <scrapy_banker.redis.keys.Keyspace.robots>`, with
the expiry :setting:`BANKER_ROBOTS_TTL`) and makes its fetch single-flight
across the fleet: a worker that needs it reads the key; on a miss it takes
the origin's lock (``SET NX PX``, :meth:`Keyspace.robots_lock
<scrapy_banker.redis.keys.Keyspace.robots_lock>`) and fetches, or -- another
worker holds the lock -- polls the key every :data:`POLL_S` seconds until
the body is there or the lock is gone (its holder died or gave up: then it
takes the lock itself).  The lock expires after ``DOWNLOAD_TIMEOUT`` (+ 5 s)
or :setting:`BANKER_REDIS_NODE_TIMEOUT`, whichever is shorter, so a worker
killed mid-fetch holds its host up no longer than the fleet takes to
declare it dead.  A fetch that failed is kept too, for at most
:data:`ERROR_TTL_S`, so the fleet does not retry a broken host at once from
every worker.  If Redis cannot be reached the worker fetches robots.txt
itself, as Scrapy would.

Only the owner of a host's partition downloads that host's requests, so in
practice the fetcher is that owner and the others read the cache after a
rebalance; the lock covers the hand-over.  Used by
:class:`~scrapy_banker.scheduler.robots.BankerRobotsTxtMiddleware` through
the fleet store's ``robots_cache``; Redis calls run in Twisted's thread pool,
never on the reactor.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.threads import deferToThread

from scrapy_banker.redis.connection import REDIS_ERRORS
from scrapy_banker.redis.keys import decode
from scrapy_banker.scheduler.engine import sleep

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import redis
    from redis.cluster import RedisCluster
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.redis.keys import Keyspace

logger = logging.getLogger(__name__)

__all__ = ["ERROR_TTL_S", "POLL_S", "RobotsCache", "RobotsTxt"]

#: How often (s) a worker waiting for another's fetch reads the key again.
POLL_S = 0.2
#: A failed fetch is remembered this long at most (s).
ERROR_TTL_S = 600.0

#: A robots.txt as fetched: the HTTP status and the body, or None and the
#: reason the fetch failed.
RobotsTxt = tuple[int | None, bytes]


def encode(robots: RobotsTxt) -> bytes:
    """``b"<status>\\n<body>"``, or ``b"error\\n<reason>"``."""
    status, body = robots
    return (b"error" if status is None else str(status).encode()) + b"\n" + body


def parse(value: bytes) -> RobotsTxt | None:
    """Inverse of :func:`encode`; None for anything else (treated as a miss)."""
    head, sep, body = value.partition(b"\n")
    if not sep:
        return None
    if head == b"error":
        return None, body
    if not head.isdigit():
        return None
    return int(head), body


class RobotsCache:
    """Single-flight robots.txt for a fleet: a Redis key per origin, with an expiry."""

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        keyspace: Keyspace,
        node: str,
        stats: StatsCollector,
        *,
        ttl_s: float,
        lock_s: float,
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.node = node
        self.stats = stats
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.lock_ms = max(1, int(lock_s * 1000))
        self._down_logged = False

    async def fetch(self, origin: str, download: Callable[[], Awaitable[RobotsTxt]]) -> RobotsTxt:
        """``origin``'s robots.txt: from Redis, or from ``download`` by one worker of the fleet."""
        key, lock = self.keyspace.robots(origin), self.keyspace.robots_lock(origin)
        waited = False
        try:
            while True:
                cached = await _in_thread(self._get, key)
                if cached is not None:
                    self.stats.inc_value("banker/robots/cache_hits")
                    if waited:
                        self.stats.inc_value("banker/robots/waited")
                    return cached
                if await _in_thread(self._lock, lock):
                    break
                waited = True
                await sleep(POLL_S)
        except REDIS_ERRORS as exc:
            self._down(exc)
            return await download()
        try:
            robots = await download()
            self.stats.inc_value("banker/robots/fetched")
            try:
                await _in_thread(self._put, key, robots)
            except REDIS_ERRORS as exc:
                self._down(exc)
            return robots
        finally:
            try:
                await _in_thread(self._unlock, lock)
            except REDIS_ERRORS as exc:  # it expires
                self._down(exc)

    # -- in the thread pool ---------------------------------------------------------

    def _get(self, key: str) -> RobotsTxt | None:
        value = self.client.get(key)
        return None if value is None else parse(value if isinstance(value, bytes) else b"")

    def _lock(self, lock: str) -> bool:
        return bool(self.client.set(lock, self.node, nx=True, px=self.lock_ms))

    def _put(self, key: str, robots: RobotsTxt) -> None:
        ttl = self.ttl_ms if robots[0] is not None else min(self.ttl_ms, int(ERROR_TTL_S * 1000))
        self.client.set(key, encode(robots), px=ttl)

    def _unlock(self, lock: str) -> None:
        # Another worker may have taken it after ours expired: leave that one.
        if decode(self.client.get(lock) or b"", lossy=True) == self.node:
            self.client.delete(lock)

    def _down(self, exc: BaseException) -> None:
        if not self._down_logged:
            self._down_logged = True
            logger.warning(
                "robots.txt cache unavailable (%s): this worker fetches robots.txt itself", exc
            )
        self.stats.inc_value("banker/robots/cache_errors")


_T = TypeVar("_T")


async def _in_thread(func: Callable[..., _T], *args: object) -> _T:
    """``func(*args)`` in Twisted's thread pool: Redis never blocks the reactor."""
    return await maybe_deferred_to_future(deferToThread(func, *args))
