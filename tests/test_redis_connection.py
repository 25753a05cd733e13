"""Connection from scrapy-redis's settings; retries ride out a Redis restart."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from scrapy_banker.redis.connection import redis_from_settings
from scrapy_banker.testing.redis_server import RedisServer


@pytest.mark.slow
def test_scrapy_redis_settings_are_honoured(redis_server: RedisServer) -> None:
    by_url = redis_from_settings({"REDIS_URL": redis_server.url})
    assert by_url.ping()
    by_parts = redis_from_settings(
        {"REDIS_HOST": "127.0.0.1", "REDIS_PORT": redis_server.port, "REDIS_DB": 3,
         "REDIS_PARAMS": {"socket_timeout": 3}}
    )  # fmt: skip
    by_parts.set("k", "v")
    assert redis.Redis(port=redis_server.port, db=3).get("k") == b"v"
    kwargs = by_parts.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 3 and kwargs["db"] == 3


@pytest.mark.slow
def test_retries_survive_a_restart() -> None:
    with RedisServer() as server:
        client = redis_from_settings(
            {"REDIS_URL": server.url, "BANKER_REDIS_RETRIES": 8, "BANKER_REDIS_BACKOFF_CAP": 0.3}
        )
        client.set("before", "1")
        server.kill()
        restarter = threading.Timer(0.5, server.start)
        restarter.start()
        started = time.monotonic()
        assert client.ping()  # retried with backoff until the server is back
        assert time.monotonic() - started >= 0.4
        restarter.join()
        no_retry = redis_from_settings({"REDIS_URL": server.url, "BANKER_REDIS_RETRIES": 0})
        server.kill()
        with pytest.raises(redis.ConnectionError):
            no_retry.ping()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"REDIS_URL": "http://x"}, "Invalid REDIS_URL='http://x'"),
        ({"REDIS_PARAMS": ["x"]}, "Invalid REDIS_PARAMS"),
        ({"BANKER_REDIS_RETRIES": -1}, "BANKER_REDIS_RETRIES=-1"),
        ({"BANKER_REDIS_BACKOFF_CAP": 0}, "BANKER_REDIS_BACKOFF_CAP=0"),
    ],
)
def test_bad_settings(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        redis_from_settings(settings)
