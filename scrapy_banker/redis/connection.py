"""A Redis client from Scrapy settings: scrapy-redis's names, retries with jittered backoff.

Workers of a scrapy-redis fleet already carry ``REDIS_URL`` (or
``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``) and ``REDIS_PARAMS``; reusing them
means adding scrapy-banker changes no connection configuration.  What
scrapy-redis lacks is surviving a Redis hiccup: a single failed command
raises into the engine and the spider dies (scrapy-redis #108).  Here every
command is retried by redis-py's own :class:`~redis.retry.Retry` with
exponential backoff and full jitter, so a fleet does not reconnect in
lock-step after an outage.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from scrapy_banker.settings import SettingsLike, load_config

__all__ = ["redis_cluster_from_settings", "redis_from_settings"]

#: Defaults like scrapy-redis's, with bounded timeouts so a dead server is noticed.
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "health_check_interval": 30,
}

_NAMES = {
    "REDIS_URL": "url",
    "REDIS_HOST": "host",
    "REDIS_PORT": "port",
    "REDIS_DB": "db",
    "REDIS_ENCODING": "encoding",
}


def redis_cluster_from_settings(settings: SettingsLike) -> RedisCluster:
    """A Redis Cluster client from the same settings (any one node's address)."""
    params = _params(settings)
    params.pop("db", None)  # a cluster has only database 0
    params.pop("health_check_interval", None)
    url = params.pop("url", None)
    if url:
        _check_url(url)
        return RedisCluster.from_url(url, **params)
    return RedisCluster(**params)


def redis_from_settings(settings: SettingsLike) -> redis.Redis:
    params = _params(settings)
    url = params.pop("url", None)
    if url:
        _check_url(url)
        return redis.Redis.from_url(url, **params)
    return redis.Redis(**params)


def _check_url(url: Any) -> None:
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"Invalid REDIS_URL={url!r}: expected redis://, rediss:// or unix:// URL")


def _params(settings: SettingsLike) -> dict[str, Any]:
    config = load_config(settings)
    params: dict[str, Any] = dict(DEFAULT_PARAMS)
    extra = settings.get("REDIS_PARAMS", None) or {}
    if not isinstance(extra, dict):
        raise ValueError(f"Invalid REDIS_PARAMS={extra!r}: expected a dict of redis-py arguments")
    params.update(extra)
    for name, key in _NAMES.items():
        value = settings.get(name, None)
        if value:
            params[key] = value
    params.pop("redis_cls", None)  # scrapy-redis's own knob; we always build redis.Redis
    params["retry"] = Retry(
        ExponentialWithJitterBackoff(cap=config.redis_backoff_cap, base=0.05),
        config.redis_retries,
    )
    params["retry_on_error"] = [redis.ConnectionError, redis.TimeoutError]
    return params
