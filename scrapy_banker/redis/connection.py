"""A Redis client from Scrapy settings: scrapy-redis's names, retries with jittered backoff.

Workers of a scrapy-redis fleet already carry ``REDIS_URL`` (or
``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``) and ``REDIS_PARAMS``; reusing them
means adding scrapy-banker changes no connection configuration.  What
scrapy-redis lacks is surviving a Redis hiccup: a single failed command
raises into the engine and the spider dies (scrapy-redis #108).  Here every
command is retried by redis-py's own :class:`~redis.retry.Retry` with
exponential backoff and full jitter, so a fleet does not reconnect in
lock-step after an outage.

At start-up a worker checks that Redis answers (:func:`wait_for_redis`,
``BANKER_REDIS_CONNECT_TIMEOUT``), so a wrong address fails the crawl with
the address it tried -- its password masked (:func:`redacted_url`) --
instead of a worker that waits silently forever.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from scrapy_banker.settings import SettingsLike, load_config

__all__ = [
    "REDIS_ERRORS",
    "RedisUnreachable",
    "redacted_url",
    "redis_cluster_from_settings",
    "redis_from_settings",
    "wait_for_redis",
]

#: What a failed Redis call raises once redis-py's own retries are spent.
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    OSError,
)

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


class RedisUnreachable(RuntimeError):
    """Redis did not answer within ``BANKER_REDIS_CONNECT_TIMEOUT`` at start-up."""


_SECRET_PARAMS = frozenset({"password", "pass", "pwd", "auth", "token"})


def redacted_url(settings: SettingsLike) -> str:
    """The Redis address a worker uses, as a URL safe to log: the password is ``***``.

    ``REDIS_URL`` when set (a password in its user info or its query string
    masked), else ``redis://HOST:PORT/DB`` from ``REDIS_HOST``/``REDIS_PORT``/
    ``REDIS_DB`` and ``REDIS_PARAMS`` (redis-py's defaults otherwise).
    """
    url = settings.get("REDIS_URL", None)
    if isinstance(url, str) and url:
        return _mask(url)
    extra = settings.get("REDIS_PARAMS", None) or {}
    extra = extra if isinstance(extra, dict) else {}

    def pick(name: str, key: str, default: Any) -> Any:
        return settings.get(name, None) or extra.get(key) or default

    host = pick("REDIS_HOST", "host", "localhost")
    port = pick("REDIS_PORT", "port", 6379)
    db = pick("REDIS_DB", "db", 0)
    auth = ":***@" if extra.get("password") else ""
    return f"redis://{auth}{host}:{port}/{db}"


def _mask(url: str) -> str:
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, sep, _password = userinfo.partition(":")
            netloc = f"{user}:***@{hostport}" if sep or user else f"***@{hostport}"
            if not sep and user:  # redis://secret@host: redis-py reads it as the password
                netloc = f":***@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
            )
        # Built by hand: urlunsplit would turn unix:///path into unix:/path.
        return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    except ValueError:
        # Unparseable: show the scheme only, never the rest (it may hold the password).
        return url.split(":", 1)[0] + "://***"


def wait_for_redis(
    client: redis.Redis | RedisCluster, timeout: float, url: str, *, poll_s: float = 0.5
) -> None:
    """Return once Redis answers a PING; :class:`RedisUnreachable` after ``timeout`` s.

    Why not just start: a worker whose Redis is wrong would otherwise wait
    and retry forever behind one warning, looking alive.  Each attempt on a
    single server uses its own connection with no retries and a connect
    timeout of at most the time left, so the deadline holds even for an
    address that swallows packets.  ``url`` is what the error names (see
    :func:`redacted_url`).
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            _ping_once(client, max(0.1, left))
            return
        except (redis.RedisError, OSError) as exc:
            last = exc
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(poll_s, left))
    raise RedisUnreachable(
        f"Redis at {url} did not answer within {timeout:g} s "
        f"(BANKER_REDIS_CONNECT_TIMEOUT; 0 waits forever): {last}"
    )


def _ping_once(client: redis.Redis | RedisCluster, connect_timeout: float) -> None:
    if isinstance(client, RedisCluster):
        client.ping()
        return
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    given = kwargs.get("socket_connect_timeout") or connect_timeout
    kwargs["socket_connect_timeout"] = min(float(given), connect_timeout)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs.pop("retry_on_error", None)
    probe = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **kwargs
    ))  # fmt: skip
    try:
        probe.ping()
    finally:
        probe.close()
        probe.connection_pool.disconnect()
