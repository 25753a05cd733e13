"""What the ``scrapy banker`` subcommands share: finding the crawl, connecting, printing.

A command finds the crawl exactly as its workers do: ``REDIS_URL`` (or
``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``), ``REDIS_PARAMS`` and
``BANKER_REDIS_PREFIX`` with ``%(spider)s`` the spider's name -- or a
``JOBDIR``.  Unlike a worker, which rides out a Redis outage, a command must
answer within seconds: the connection gets a short connect timeout and no
retries, and a server that does not answer is one line naming the URL
(password hidden) and exit code 2.

Stable for the other subcommands (plot, dashboard) to import:
:func:`add_target_arguments`, :func:`spider_name`, :func:`redis_settings`,
:func:`connect`, :func:`redis_errors`, :func:`safe_url`, :func:`jobdir_of`, :func:`emit_json`,
:func:`json_document`, :func:`console`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from scrapy_banker.ops.commands import CommandError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping

    import redis
    from redis.cluster import RedisCluster
    from rich.console import Console
    from scrapy.settings import BaseSettings

    from scrapy_banker.redis.keys import Keyspace
    from scrapy_banker.settings import RedisConfig

__all__ = [
    "CONNECT_TIMEOUT_S",
    "add_target_arguments",
    "connect",
    "console",
    "emit_json",
    "fleet_configured",
    "jobdir_of",
    "jobdir_or_fleet",
    "json_document",
    "redis_errors",
    "redis_settings",
    "safe_url",
    "spider_name",
]

#: How long a command waits for Redis to accept the connection.
CONNECT_TIMEOUT_S = 3.0
#: How long a command waits for one reply (a scan of 1,024 partitions is one
#: pipeline of a few thousand commands: well under a second on a live server).
READ_TIMEOUT_S = 10.0


def add_target_arguments(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """``[SPIDER]``, ``--spider`` and ``--prefix``: which crawl to look at."""
    if positional:
        parser.add_argument(
            "spider",
            nargs="?",
            metavar="SPIDER",
            help="spider name: the %%(spider)s of BANKER_REDIS_PREFIX (optional in a "
            "project with one spider)",
        )
    parser.add_argument(
        "--spider", dest="spider_option", metavar="SPIDER", help="same as the SPIDER argument"
    )
    parser.add_argument(
        "--prefix",
        metavar="PREFIX",
        help="the crawl's Redis key prefix, instead of deriving it from BANKER_REDIS_PREFIX",
    )


def _project_spiders(settings: BaseSettings) -> list[str] | None:
    """Spider names of the current project (None outside a project)."""
    if not settings.getlist("SPIDER_MODULES"):
        return None
    from scrapy.utils.misc import load_object

    try:
        # What scrapy.spiderloader.get_spider_loader (Scrapy >= 2.14) does;
        # spelled out so Scrapy 2.13 works too.
        loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(settings.frozencopy())
        return sorted(loader.list())
    except Exception as exc:  # a broken project: say so instead of a traceback
        raise CommandError(f"cannot load the project's spiders: {exc}") from None


def spider_name(settings: BaseSettings, opts: argparse.Namespace, *, required: bool) -> str | None:
    """The spider the command is about; ``CommandError`` if unknown or missing when needed.

    In a project, a name must be one of its spiders, and a project with one
    spider needs none.  Outside a project the name is taken as given.
    """
    name = getattr(opts, "spider_option", None) or getattr(opts, "spider", None)
    known = _project_spiders(settings)
    if known is not None:
        if name is not None and name not in known:
            listed = ", ".join(known) or "none"
            raise CommandError(f"unknown spider {name!r} (this project has: {listed})")
        if name is None and len(known) == 1:
            return known[0]
    if name is None and required:
        hint = f" (one of: {', '.join(known)})" if known else ""
        raise CommandError(f"name the spider{hint}, or give --prefix")
    return name


def redis_settings(settings: BaseSettings, opts: argparse.Namespace) -> RedisConfig:
    """The crawl's ``BANKER_REDIS_*`` settings, its prefix resolved (``--prefix`` wins)."""
    from scrapy_banker.settings import RedisConfig, load_redis_config

    raw_prefix = settings.get("BANKER_REDIS_PREFIX", "banker:%(spider)s")
    needs_spider = getattr(opts, "prefix", None) is None and "%(spider)" in str(raw_prefix)
    spider = spider_name(settings, opts, required=needs_spider)
    try:
        config = load_redis_config(settings, spider or "spider")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    prefix = getattr(opts, "prefix", None)
    if prefix is not None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise CommandError(f"--prefix must be non-empty and free of braces, got {prefix!r}")
        values = {f.name: getattr(config, f.name) for f in config.__dataclass_fields__.values()}
        config = RedisConfig(**{**values, "prefix": prefix})
    return config


def safe_url(settings: BaseSettings) -> str:
    """The Redis address the settings name, without a password."""
    url = settings.get("REDIS_URL")
    if url:
        parts = urlsplit(str(url))
        if parts.password is not None:
            netloc = parts.hostname or ""
            netloc = f"{parts.username}:***@{netloc}" if parts.username else f":***@{netloc}"
            if parts.port:
                netloc += f":{parts.port}"
            parts = parts._replace(netloc=netloc)
        return urlunsplit(parts)
    host = settings.get("REDIS_HOST") or "localhost"
    port = settings.get("REDIS_PORT") or 6379
    db = settings.get("REDIS_DB") or 0
    return f"redis://{host}:{port}/{db}"


def fleet_configured(settings: BaseSettings, opts: argparse.Namespace) -> bool:
    """Whether these settings describe a Redis fleet (the scheduler, a URL, or --prefix)."""
    scheduler = settings.get("SCHEDULER")
    scheduler_path = scheduler if isinstance(scheduler, str) else getattr(scheduler, "__name__", "")
    return bool(
        getattr(opts, "prefix", None)
        or settings.get("REDIS_URL")
        or settings.get("REDIS_HOST")
        or "Redis" in str(scheduler_path)
    )


def jobdir_of(settings: BaseSettings, opts: argparse.Namespace) -> str | None:
    """``--jobdir``, else the ``JOBDIR`` setting."""
    return getattr(opts, "jobdir", None) or settings.get("JOBDIR") or None


def jobdir_or_fleet(settings: BaseSettings, opts: argparse.Namespace, nothing: str) -> str | None:
    """The JOBDIR a command looks at, or None for the fleet; ``CommandError`` when neither.

    ``--jobdir`` wins; without it a configured fleet (``REDIS_URL``) is read,
    else the ``JOBDIR`` setting.  ``nothing`` opens the error's sentence.
    """
    jobdir = getattr(opts, "jobdir", None)
    if jobdir is None and not fleet_configured(settings, opts):
        jobdir = jobdir_of(settings, opts)
        if jobdir is None:
            raise CommandError(
                f"{nothing}: give --jobdir DIR for a single node, or REDIS_URL "
                "(-s REDIS_URL=redis://...) for a fleet"
            )
    return None if jobdir is None else str(jobdir)


def connect(
    settings: BaseSettings, opts: argparse.Namespace
) -> tuple[redis.Redis | RedisCluster, Keyspace]:
    """A client on the crawl's Redis and the crawl's keyspace; answers within seconds.

    ``CommandError`` (one line, the URL without password) if Redis does not
    answer, refuses the credentials, or the settings are invalid.
    """
    import redis as redis_lib

    from scrapy_banker.redis.connection import redis_cluster_from_settings, redis_from_settings
    from scrapy_banker.redis.keys import Keyspace

    config = redis_settings(settings, opts)
    quick = settings.copy()
    params = dict(settings.getdict("REDIS_PARAMS"))
    connect_timeout = params.get("socket_connect_timeout") or CONNECT_TIMEOUT_S
    params["socket_connect_timeout"] = min(float(connect_timeout), CONNECT_TIMEOUT_S)
    params["socket_timeout"] = READ_TIMEOUT_S
    quick.set("REDIS_PARAMS", params, priority="cmdline")
    quick.set("BANKER_REDIS_RETRIES", 0, priority="cmdline")
    where = safe_url(settings)
    try:
        client: redis.Redis | RedisCluster
        if config.cluster:
            client = redis_cluster_from_settings(quick)
        else:
            client = redis_from_settings(quick)
        client.ping()
    except ValueError as exc:  # a malformed REDIS_URL or REDIS_PARAMS
        raise CommandError(str(exc)) from None
    except redis_lib.AuthenticationError as exc:
        raise CommandError(f"Redis at {where} refused the credentials: {exc}") from None
    except (redis_lib.ConnectionError, redis_lib.TimeoutError, OSError) as exc:
        raise CommandError(f"Redis unreachable at {where}: {exc}") from None
    except redis_lib.RedisError as exc:
        raise CommandError(f"Redis at {where} answered with an error: {exc}") from None
    return client, Keyspace(config.prefix, config.partitions)


@contextlib.contextmanager
def redis_errors(settings: BaseSettings) -> Iterator[None]:
    """Turn a Redis failure in the middle of a command into one line and exit code 2."""
    import redis as redis_lib

    try:
        yield
    except redis_lib.RedisError as exc:
        raise CommandError(f"Redis at {safe_url(settings)} failed: {exc}") from None
    except ValueError as exc:  # e.g. a table of another partition count
        raise CommandError(str(exc)) from None


def emit_json(data: Any) -> None:
    """One JSON document on stdout (what ``--json`` prints)."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def json_document(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A ``--json`` document: ``"schema"`` and ``"kind"`` first, then ``fields``.

    What ``docs/ops/commands.rst`` promises of every command's JSON: the
    schema version (:data:`~scrapy_banker.ops.fleet_view.SCHEMA_VERSION`,
    fields only ever added within it) and what kind of document it is.
    """
    from scrapy_banker.ops.fleet_view import SCHEMA_VERSION

    return {"schema": SCHEMA_VERSION, "kind": kind, **fields}


def console() -> Console:
    """Rich on a terminal, plain text in a pipe (Rich detects which)."""
    from rich.console import Console

    out = Console(force_terminal=None, highlight=False, soft_wrap=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        # A pipe has no width: wide rows grep better than rows wrapped at 80.
        out = Console(force_terminal=None, highlight=False, soft_wrap=False, width=160)
    return out
