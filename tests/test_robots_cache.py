"""RobotsCache: robots.txt fetched once per host per fleet, the others read it from Redis.

What :mod:`scrapy_banker.redis.store.robots_cache` promises, through
:meth:`RobotsCache.fetch`, with one :class:`RobotsCache` per simulated
worker (its own node name, client and stats) on one real redis-server:

* a robots.txt one worker downloaded is served to another from Redis, its
  key holding ``"<status>\\n<body>"`` with the ``BANKER_ROBOTS_TTL`` expiry,
  and is downloaded again once that expired;
* a failed fetch (``(None, reason)``) is shared too, for at most
  :data:`ERROR_TTL_S`;
* a cache entry that is not in that format is a miss: downloaded again and
  overwritten;
* the fetch is single-flight: the worker holding the origin's lock (its
  node name, ``SET NX PX`` for ``lock_s``) downloads, a worker that finds
  it held polls until the body is there, or -- its holder died and the lock
  expired -- takes it and downloads itself; a lock is released by its holder
  only, and also when the download raised;
* a worker that cannot reach Redis downloads robots.txt itself, logging it
  once and counting ``banker/robots/cache_errors``.

A real redis-server, not a fake: ``SET NX PX``, key expiry and the
lock's hand-over are what is being tested, so those tests are ``slow``
(they start the session's server).  Redis calls go through Twisted's thread
pool, so the tests run on pytest-twisted's reactor.  Only the
unreachable-Redis test needs no server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy import Request, Spider
from scrapy.http import TextResponse
from scrapy.statscollectors import StatsCollector
from scrapy.utils.test import get_crawler
from twisted.internet import defer, task

from scrapy_banker.redis.keys import Keyspace
from scrapy_banker.redis.store.robots_cache import ERROR_TTL_S, POLL_S, RobotsCache, RobotsTxt
from scrapy_banker.testing.redis_server import RedisServer, free_port

ORIGIN = "http://a.test"
BODY = b"User-agent: *\nDisallow: /private\nCrawl-delay: 2\n"
KEYSPACE = Keyspace("rc", partitions=4)
KEY, LOCK = KEYSPACE.robots(ORIGIN), KEYSPACE.robots_lock(ORIGIN)

slow = pytest.mark.slow  # starts the session's redis-server


class Spidey(Spider):
    name = "robots"


def _stats() -> StatsCollector:
    stats = get_crawler(Spidey).stats
    assert stats is not None
    return stats


class Downloads:
    """A worker's ``download``: Scrapy's response to robots.txt, counted, maybe slow."""

    def __init__(self, status: int = 200, body: bytes = BODY, *, delay: float = 0.0) -> None:
        self.status, self.body, self.delay = status, body, delay
        self.calls = 0
        #: Called (in the reactor thread) while the download runs, before it returns.
        self.during: Callable[[], None] | None = None

    def __call__(self) -> Awaitable[RobotsTxt]:
        return self._download()

    async def _download(self) -> RobotsTxt:
        self.calls += 1
        if self.during is not None:
            self.during()
        if self.delay:
            await _sleep(self.delay)
        request = Request(f"{ORIGIN}/robots.txt")
        response = TextResponse(request.url, status=self.status, body=self.body, request=request)
        return response.status, response.body


def _failed(reason: bytes) -> Callable[[], Awaitable[RobotsTxt]]:
    async def download() -> RobotsTxt:
        return None, reason

    return download


async def _sleep(seconds: float) -> None:
    from twisted.internet import reactor

    await task.deferLater(reactor, seconds, lambda: None)  # type: ignore[arg-type]


def _fetch(cache: RobotsCache, download: Callable[[], Awaitable[RobotsTxt]]) -> defer.Deferred[Any]:
    return defer.Deferred.fromCoroutine(cache.fetch(ORIGIN, download))


Workers = Callable[..., RobotsCache]


@pytest.fixture
def workers(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Workers]:
    """``workers(node, ttl_s=..., lock_s=...)``: a worker's cache, on a flushed database."""
    clients: list[redis.Redis] = []

    def make(node: str, *, ttl_s: float = 3600.0, lock_s: float = 30.0) -> RobotsCache:
        client = redis.Redis.from_url(redis_server.url)
        clients.append(client)
        return RobotsCache(client, KEYSPACE, node, _stats(), ttl_s=ttl_s, lock_s=lock_s)

    yield make
    for client in clients:
        client.close()


# -- shared ----------------------------------------------------------------------------------


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_robots_txt_fetched_by_one_worker_is_served_to_another_from_redis(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a, b = workers("node-a", ttl_s=3600.0), workers("node-b")
    download_a, download_b = Downloads(), Downloads()
    assert await _fetch(a, download_a) == (200, BODY)
    assert download_a.calls == 1
    assert redis_client.get(KEY) == b"200\n" + BODY
    assert 3_590_000 < redis_client.pttl(KEY) <= 3_600_000  # BANKER_ROBOTS_TTL
    assert redis_client.get(LOCK) is None  # released
    assert await _fetch(b, download_b) == (200, BODY)
    assert download_b.calls == 0
    assert a.stats.get_value("banker/robots/fetched") == 1
    assert a.stats.get_value("banker/robots/cache_hits") is None
    assert b.stats.get_value("banker/robots/cache_hits") == 1
    assert b.stats.get_value("banker/robots/fetched") is None
    assert b.stats.get_value("banker/robots/waited") is None


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_cached_robots_txt_expires_after_its_ttl_and_is_downloaded_again(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a, b = workers("node-a", ttl_s=0.3), workers("node-b", ttl_s=0.3)
    download_b = Downloads(body=b"User-agent: *\nDisallow: /new\n")
    assert await _fetch(a, Downloads()) == (200, BODY)
    assert 0 < redis_client.pttl(KEY) <= 300
    await _sleep(0.5)
    assert redis_client.get(KEY) is None
    assert await _fetch(b, download_b) == (200, b"User-agent: *\nDisallow: /new\n")
    assert download_b.calls == 1


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_failed_fetch_is_shared_for_at_most_the_error_ttl(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a, b = workers("node-a", ttl_s=86_400.0), workers("node-b")
    download_b = Downloads()
    assert await _fetch(a, _failed(b"TimeoutError()")) == (None, b"TimeoutError()")
    assert redis_client.get(KEY) == b"error\nTimeoutError()"
    assert (ERROR_TTL_S - 10) * 1000 < redis_client.pttl(KEY) <= ERROR_TTL_S * 1000
    # The fleet does not retry the broken host at once from every worker.
    assert await _fetch(b, download_b) == (None, b"TimeoutError()")
    assert download_b.calls == 0
    # A robots TTL shorter than ERROR_TTL_S bounds the error's too.
    redis_client.delete(KEY)
    short = workers("node-c", ttl_s=1.0)
    await _fetch(short, _failed(b"DNSLookupError()"))
    assert 0 < redis_client.pttl(KEY) <= 1000


@slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "entry",
    [b"", b"no newline at all", b"OK\nUser-agent: *", b"-1\nUser-agent: *", b"2 00\nbody"],
)
@pytest_twisted.ensureDeferred
async def test_a_malformed_cache_entry_is_a_miss_downloaded_again_and_overwritten(
    workers: Workers, redis_client: redis.Redis, entry: bytes
) -> None:
    redis_client.set(KEY, entry, px=60_000)
    a = workers("node-a")
    download = Downloads()
    assert await _fetch(a, download) == (200, BODY)
    assert download.calls == 1
    assert redis_client.get(KEY) == b"200\n" + BODY
    assert a.stats.get_value("banker/robots/cache_hits") is None


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_an_entry_with_an_empty_body_is_a_robots_txt_not_a_miss(
    workers: Workers, redis_client: redis.Redis
) -> None:
    redis_client.set(KEY, b"404\n", px=60_000)
    download = Downloads()
    assert await _fetch(workers("node-a"), download) == (404, b"")
    assert download.calls == 0


# -- single-flight ---------------------------------------------------------------------------


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_two_workers_missing_at_once_download_it_once_and_the_other_waits(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a, b = workers("node-a"), workers("node-b")
    download_a, download_b = Downloads(delay=3 * POLL_S), Downloads(delay=3 * POLL_S)
    results = await defer.gatherResults([_fetch(a, download_a), _fetch(b, download_b)])
    assert results == [(200, BODY), (200, BODY)]
    assert download_a.calls + download_b.calls == 1
    fetcher, waiter = (a, b) if download_a.calls else (b, a)
    assert fetcher.stats.get_value("banker/robots/fetched") == 1
    assert waiter.stats.get_value("banker/robots/waited") == 1
    assert waiter.stats.get_value("banker/robots/cache_hits") == 1
    assert redis_client.get(LOCK) is None


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_the_lock_holds_the_node_name_for_lock_s_while_it_downloads(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a = workers("node-a", lock_s=20.0)
    seen: list[tuple[bytes | None, int]] = []
    download = Downloads()
    download.during = lambda: seen.append((redis_client.get(LOCK), redis_client.pttl(LOCK)))
    await _fetch(a, download)
    ((holder, pttl),) = seen
    assert holder == b"node-a"
    assert 19_000 < pttl <= 20_000
    assert redis_client.get(LOCK) is None


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_worker_whose_lock_was_taken_over_leaves_the_new_holder_s_lock(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a = workers("node-a", lock_s=20.0)
    download = Downloads()
    # Its lock expired mid-download and node-b took it.
    download.during = lambda: redis_client.set(LOCK, "node-b", px=20_000)
    assert await _fetch(a, download) == (200, BODY)
    assert redis_client.get(LOCK) == b"node-b"


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_worker_that_finds_the_lock_held_waits_for_the_body_without_downloading(
    workers: Workers, redis_client: redis.Redis
) -> None:
    from twisted.internet import reactor

    redis_client.set(LOCK, "node-a", px=30_000)  # node-a is downloading it
    b = workers("node-b")
    download = Downloads()
    reactor.callLater(  # type: ignore[attr-defined]
        3 * POLL_S, redis_client.set, KEY, b"200\n" + BODY, px=60_000
    )
    assert await _fetch(b, download) == (200, BODY)
    assert download.calls == 0
    assert b.stats.get_value("banker/robots/waited") == 1
    assert redis_client.get(LOCK) == b"node-a"  # not node-b's to release


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_lock_whose_holder_died_expires_and_the_waiter_downloads_itself(
    workers: Workers, redis_client: redis.Redis
) -> None:
    redis_client.set(LOCK, "dead-node", px=int(3 * POLL_S * 1000))  # killed mid-fetch
    b = workers("node-b")
    download = Downloads()
    assert await _fetch(b, download) == (200, BODY)
    assert download.calls == 1
    assert b.stats.get_value("banker/robots/fetched") == 1
    assert b.stats.get_value("banker/robots/cache_hits") is None
    assert redis_client.get(KEY) == b"200\n" + BODY
    assert redis_client.get(LOCK) is None


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_download_that_raises_caches_nothing_and_releases_the_lock(
    workers: Workers, redis_client: redis.Redis
) -> None:
    a = workers("node-a")

    async def broken() -> RobotsTxt:
        raise RuntimeError("the engine stopped")

    with pytest.raises(RuntimeError, match="the engine stopped"):
        await _fetch(a, broken)
    assert redis_client.get(KEY) is None
    assert redis_client.get(LOCK) is None  # the next worker need not wait for it to expire
    download = Downloads()
    assert await _fetch(workers("node-b"), download) == (200, BODY)
    assert download.calls == 1


# -- Redis unreachable -----------------------------------------------------------------------


class FailingSet:
    """A real client whose ``SET`` of the robots key fails, as if Redis went away then."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def set(self, key: str, value: Any, **kwargs: Any) -> Any:
        if key == KEY:
            raise redis.ConnectionError("Connection reset by peer")
        return self.client.set(key, value, **kwargs)


@slow
@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_robots_txt_downloaded_is_returned_even_if_it_cannot_be_kept(
    redis_client: redis.Redis,
) -> None:
    cache = RobotsCache(
        FailingSet(redis_client),  # type: ignore[arg-type]
        KEYSPACE,
        "node-a",
        _stats(),
        ttl_s=60.0,
        lock_s=30.0,
    )
    assert await _fetch(cache, Downloads()) == (200, BODY)
    assert cache.stats.get_value("banker/robots/cache_errors") == 1
    assert redis_client.get(LOCK) is None


@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_a_worker_that_cannot_reach_redis_downloads_robots_txt_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing listens on the port; no retries, so it fails at once.
    client = redis.Redis(port=free_port(), socket_connect_timeout=2, retry=Retry(NoBackoff(), 0))
    cache = RobotsCache(client, KEYSPACE, "node-a", _stats(), ttl_s=60.0, lock_s=30.0)
    download = Downloads()
    with caplog.at_level(logging.WARNING, "scrapy_banker.redis.store.robots_cache"):
        assert await _fetch(cache, download) == (200, BODY)
        assert await _fetch(cache, download) == (200, BODY)
    client.close()
    assert download.calls == 2
    assert cache.stats.get_value("banker/robots/cache_errors") == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "fetches robots.txt itself" in warnings[0].getMessage()
