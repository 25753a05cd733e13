"""``scrapy banker pause|resume|limit|delay|budget|purge|inject|control``: steer a running fleet.

Each action changes the fleet's control document in Redis
(:mod:`scrapy_banker.redis.control`); every worker reads it twice a
heartbeat, so it is in force fleet-wide within a heartbeat and survives
rebalances.  Bad input -- an unknown host (``--force`` to set it anyway), a
malformed URL, a negative budget, a topic the crawl does not have -- is one
line on stderr, exit code 2, nothing changed.  ``control`` shows the
directives in force, the budget counts and the log of actions.

A single process with ``JOBDIR`` (``--jobdir DIR``, or the ``JOBDIR``
setting when no fleet is configured) gets the same directives through a
file in it (:mod:`scrapy_banker.scheduler.control_file`); ``purge`` and
``inject`` need a crawl on Redis.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.control import VERBS, ControlError
from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands._common import (
    add_target_arguments,
    connect,
    console,
    emit_json,
    jobdir_or_fleet,
    redis_errors,
    redis_settings,
    safe_url,
)

if TYPE_CHECKING:
    import argparse

    from rich.console import Console
    from scrapy.settings import BaseSettings

    from scrapy_banker.core.control import ControlState
    from scrapy_banker.ops.control import Controller, JobdirController

#: Subcommand -> one line of help.
HELPS = {
    "pause": "Pause a host or topic:NAME fleet-wide (its requests stay queued)",
    "resume": "Resume a paused host or topic:NAME",
    "limit": "Set how many requests a host may have in flight (N, or none)",
    "delay": "Set the least seconds between two requests to a host (0 removes it)",
    "budget": "Set the pages a HOST, topic:NAME or the crawl may be fetched (N, or none)",
    "purge": "Move a host's queued requests to the dead letters (reason 'purged')",
    "inject": "Queue seed URLs in the running fleet (deduplicated), optionally with --topic",
    "control": "Show the directives in force, the budget counts and the log of actions",
}


def add_arguments_for(verb: str, parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, positional=False)
    parser.add_argument(
        "--jobdir", metavar="DIR", help="a single process's JOBDIR (default: a fleet if "
        "REDIS_URL is set, else the JOBDIR setting)",
    )  # fmt: skip
    if verb == "control":
        # Not --log: Scrapy's own parser would take it for --logfile / --loglevel.
        parser.add_argument(
            "--last", type=int, default=20, metavar="N", help="show the last N actions"
        )
    elif verb == "inject":
        parser.add_argument("urls", nargs="+", metavar="URL")
        parser.add_argument("--topic", metavar="NAME", help="topic of the injected requests")
    else:
        parser.add_argument("target", metavar="TARGET", help=VERBS[verb])
        if verb not in ("pause", "resume", "purge"):
            parser.add_argument("value", metavar="VALUE")
        parser.add_argument(
            "--force", action="store_true",
            help="act on a host the crawl has not queued a request of (yet)",
        )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()} (scrapy banker)"


def _controller(opts: argparse.Namespace, settings: BaseSettings) -> Controller | JobdirController:
    from scrapy_banker.ops.control import Controller, JobdirController
    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.settings import load_config

    try:
        config = load_config(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    jobdir = jobdir_or_fleet(settings, opts, "no crawl to control")
    if jobdir is not None:
        if not os.path.isdir(os.path.join(jobdir, "banker")):
            raise CommandError(f"{jobdir} holds no scrapy-banker crawl (no banker/ folder)")
        return JobdirController(jobdir, config)
    rconfig = redis_settings(settings, opts)
    client, keyspace = connect(settings, opts)
    with redis_errors(settings):
        if not client.exists(keyspace.table) and not client.exists(keyspace.finished):
            raise CommandError(
                f"no crawl under prefix {keyspace.prefix!r} at {safe_url(settings)} "
                "(wrong spider or --prefix, or the crawl has not started)"
            )
        partitions = _table_size(client, keyspace.table) or keyspace.partitions
    frontier = RedisFrontier(
        client, prefix=keyspace.prefix, partitions=partitions,
        dedup=rconfig.dedup, dedup_capacity=rconfig.dedup_capacity,
        dedup_error=rconfig.dedup_error,
    )  # fmt: skip
    return Controller.from_settings(frontier, config, settings)


def _table_size(client: Any, key: str) -> int | None:
    """The partition count of the fleet's stored table: where the workers put requests.

    The command's own BANKER_REDIS_PARTITIONS may differ from the workers'
    (run outside the project); a URL must go to the partition they pop.
    """
    from scrapy_banker.net.partitions import PartitionTable

    raw = client.get(key)
    if raw is None:
        return None
    try:
        return int(PartitionTable.from_state(json.loads(raw)).size)
    except (ValueError, TypeError, KeyError):
        return None


def run_verb(verb: str, opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.ops.control import Controller

    if verb == "control":
        return _show(opts, settings)
    controller = _controller(opts, settings)
    with redis_errors(settings):
        try:
            if verb == "inject":
                action = controller.parse(verb, opts.urls, topic=opts.topic)
            else:
                args = [opts.target] + (
                    [] if getattr(opts, "value", None) is None else [opts.value]
                )
                action = controller.parse(verb, args, force=opts.force)
            outcome = controller.execute(action, who=_who(), now=time.time())
        except (ControlError, OSError) as exc:
            raise CommandError(str(exc)) from None
    if opts.json:
        emit_json(outcome.to_json())
        return 0
    where = (
        "fleet-wide within a heartbeat" if isinstance(controller, Controller)
        else "in the crawl on this JOBDIR within a second"
    )  # fmt: skip
    line = (
        f"{outcome.action.describe()}: in force {where} (control version {outcome.state.version})"
    )
    if verb == "purge":
        line += f"; {outcome.purged} queued requests dead-lettered (reason 'purged')"
    if verb == "inject":
        line += f"; {outcome.injected} queued, {outcome.duplicates} already seen"
    console().print(line)
    return 0


def _show(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.ops.control import Controller

    if opts.last < 0:
        raise CommandError(f"--last takes a number >= 0, got {opts.last}")
    controller = _controller(opts, settings)
    if not isinstance(controller, Controller):
        return _show_jobdir(opts, controller)
    channel = controller.channel
    with redis_errors(settings):
        try:
            state = channel.load()
        except ControlError as exc:
            raise CommandError(str(exc)) from None
        counts = channel.counts()
        log = channel.log(opts.last) if opts.last else []
    rules = controller.config.budgets()
    if opts.json:
        emit_json({
            "kind": "control", "prefix": channel.keyspace.prefix, "state": state.to_json(),
            "counts": counts.to_json(), "log": log,
        })  # fmt: skip
        return 0
    out = console()
    _print_directives(out, f"{channel.keyspace.prefix!r}", state)
    crawl = rules.crawl_budget(state)
    if crawl is not None:
        out.print(f"  crawl budget {crawl}: {counts.crawl} pages charged")
    for host in sorted(set(counts.hosts) | set(counts.held)):
        budget = rules.host(host, state)
        out.print(
            f"  {host}: {counts.hosts.get(host, 0)} pages charged"
            + ("" if budget is None else f" of {budget}")
            + (f", {counts.held[host]} held over budget" if counts.held.get(host) else "")
        )
    for entry in log:
        out.print(f"  log: {entry}")
    return 0


def _show_jobdir(opts: argparse.Namespace, controller: JobdirController) -> int:
    try:
        state = controller.file.load()
    except ControlError as exc:
        raise CommandError(str(exc)) from None
    log = controller.file.log(opts.last)
    if opts.json:
        emit_json({
            "kind": "control", "jobdir": controller.jobdir, "state": state.to_json(), "log": log,
        })  # fmt: skip
        return 0
    out = console()
    _print_directives(out, f"JOBDIR {controller.jobdir}", state)
    if state.crawl_budget is not None:
        out.print(f"  crawl budget {state.crawl_budget}")
    for entry in log:
        out.print(f"  log: {entry}")
    return 0


def _print_directives(out: Console, what: str, state: ControlState) -> None:
    out.print(f"Control of {what}, version {state.version}")
    for host, hc in sorted(state.hosts.items()):
        out.print(f"  host {host}: " + ", ".join(f"{k}={v}" for k, v in vars(hc).items()))
    for topic, tc in sorted(state.topics.items()):
        out.print(f"  topic {topic}: " + ", ".join(f"{k}={v}" for k, v in vars(tc).items()))
