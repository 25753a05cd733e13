from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from scrapy_banker.testing.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free port, shared by the session's tests."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client on a freshly flushed database of the session's server."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()  # a previous test may have killed it on purpose
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()
