"""``scrapy banker VERB ...`` and ``scrapy banker control``: steer a running crawl.

There is one subcommand per operator verb of
:data:`~scrapy_banker.core.directives.VERBS` (``pause``, ``limit``, ``inject``, ...):
its arguments, its help and where it can be carried out all come from that
table.  Each action changes the fleet's control document in Redis
(:mod:`scrapy_banker.redis.frontier.control_channel`); every worker reads it twice a
heartbeat, so it is in force fleet-wide within a heartbeat and survives
rebalances.  Bad input -- an unknown host (``--force`` to set it anyway), a
malformed URL, a negative budget, a topic the crawl does not have -- is one
line on stderr, exit code 2, nothing changed; a URL or ``HOST:PORT`` is
taken as its host (the crawl keys hosts by download slot: the host name,
without port), which the output says.  ``control`` shows the directives in
force, the budget counts and the log of actions (local time, who, what).
``--json`` prints one document with ``"schema"`` and ``"kind"``, as every
``scrapy banker`` command does.

A single process with ``JOBDIR`` (``--jobdir DIR``, or the ``JOBDIR``
setting when no fleet is configured) gets the same directives through a
file in it (:mod:`scrapy_banker.scheduler.control_file`); the verbs a JOBDIR
cannot carry out (``purge``, ``inject``: they need a crawl on Redis) are
refused with exit code 2.  Its ``control`` shows the same budget
counts, read from the JOBDIR's files (:func:`~scrapy_banker.ops.jobdir_view.jobdir_budgets`):
the pages fetched and the pending requests a resume holds over budget.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.directives import FLEET, VERBS, Action, ControlError, Verb
from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands._common import (
    add_target_arguments,
    connect,
    console,
    emit_json,
    jobdir_or_fleet,
    json_document,
    redis_errors,
    redis_settings,
    safe_url,
)

if TYPE_CHECKING:
    import argparse

    from rich.console import Console
    from scrapy.settings import BaseSettings

    from scrapy_banker.core.directives import BudgetRules, ControlState
    from scrapy_banker.ops.controller import Controller, JobdirController
    from scrapy_banker.redis.frontier.control_channel import BudgetCounts

#: The subcommand that shows the control state (the others are the verbs of VERBS).
SHOW = "control"
#: Subcommand -> one line of help.
HELPS = {
    SHOW: "Show the directives in force, the budget counts and the log of actions",
    **{verb.name: verb.help for verb in VERBS.values()},
}
#: The hosts ``control`` lists budget counts of (most held, then most charged, first).
HOSTS_SHOWN = 20


def _where(verb: Verb) -> str:
    """A verb's help epilogue: where it can be carried out."""
    from scrapy_banker.core.directives import FLEET, JOBDIR

    if verb.available(FLEET) and verb.available(JOBDIR):
        return "On a fleet (Redis), or on a single process with --jobdir DIR."
    if verb.available(FLEET):
        return "On a fleet (Redis) only: a single process (--jobdir) refuses it."
    return "On a single process (--jobdir DIR) only."


def add_arguments_for(verb: str, parser: argparse.ArgumentParser) -> None:
    """The arguments of subcommand ``verb``: ``control``, or a verb of VERBS (from its entry)."""
    add_target_arguments(parser, positional=False)
    parser.add_argument(
        "--jobdir", metavar="DIR", help="a single process's JOBDIR (default: a fleet if "
        "REDIS_URL is set, else the JOBDIR setting)",
    )  # fmt: skip
    if verb == SHOW:
        # Not --log: Scrapy's own parser would take it for --logfile / --loglevel.
        parser.add_argument(
            "--last", type=int, default=20, metavar="N", help="show the last N actions"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON document")
        return
    spec = VERBS[verb]
    parser.usage = f"scrapy banker {verb} {spec.synopsis} [options]"
    takes = f"{verb} takes {spec.usage}"
    parser.epilog = f"{takes}{'' if takes.endswith('.') else '.'}  {_where(spec)}"
    if spec.takes_urls:
        parser.add_argument("urls", nargs="+", metavar="URL")
        parser.add_argument("--topic", metavar="NAME", help="topic of the injected requests")
    else:
        parser.add_argument("target", metavar="TARGET", help=spec.target_usage)
        if spec.value is not None:
            parser.add_argument("value", metavar="VALUE", help=spec.value.usage)
    if spec.takes_host:
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


def _controller(
    opts: argparse.Namespace, settings: BaseSettings, verb: str | None = None
) -> Controller | JobdirController:
    """The crawl's controller; a ``verb`` its mode cannot carry out is refused first."""
    from scrapy_banker.core.directives import JOBDIR, get_verb
    from scrapy_banker.ops.controller import Controller, JobdirController
    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.settings import load_config

    try:
        config = load_config(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    jobdir = jobdir_or_fleet(settings, opts, "no crawl to control")
    if jobdir is not None:
        if verb is not None:
            try:
                get_verb(verb, JOBDIR)
            except ControlError as exc:
                raise CommandError(str(exc)) from None
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
    if verb == SHOW:
        return _show(opts, settings)
    controller = _controller(opts, settings, verb)
    spec = VERBS.get(verb)
    with redis_errors(settings):
        try:
            if spec is not None and spec.takes_urls:
                action = controller.parse(verb, opts.urls, topic=opts.topic)
            else:
                args = [opts.target] + (
                    [] if getattr(opts, "value", None) is None else [opts.value]
                )
                action = controller.parse(verb, args, force=getattr(opts, "force", False))
            outcome = controller.execute(action, who=_who(), now=time.time())
        except (ControlError, OSError) as exc:
            raise CommandError(str(exc)) from None
    if opts.json:
        fields = {**controller.place(), **outcome.to_json(), "notes": outcome.notes}
        kind = "action" if controller.where == FLEET else "action-jobdir"
        emit_json(json_document(kind, fields))
        return 0
    line = (
        f"{outcome.action.describe()}: in force {controller.within} "
        f"(control version {outcome.state.version}){outcome.effects()}"
    )
    out = console()
    for note in outcome.notes:
        out.print(f"Note: {note}", markup=False)
    out.print(line, markup=False)
    return 0


def _show(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.ops.controller import Controller

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
        emit_json(json_document("control", {
            "prefix": channel.keyspace.prefix, "state": state.to_json(),
            "counts": counts.to_json(), "log": log,
        }))  # fmt: skip
        return 0
    out = console()
    _print_directives(out, f"{channel.keyspace.prefix!r}", state)
    _print_budgets(out, rules, state, counts, controller.config.topic_names())
    _print_log(out, log, opts.last)
    return 0


def _show_jobdir(opts: argparse.Namespace, controller: JobdirController) -> int:
    from scrapy_banker.ops.jobdir_view import jobdir_budgets
    from scrapy_banker.redis.frontier.control_channel import BudgetCounts

    try:
        state = controller.file.load()
    except ControlError as exc:
        raise CommandError(str(exc)) from None
    log = controller.file.log(opts.last)
    rules = controller.config.budgets()
    # The fleet's counts, from the JOBDIR's files: the pages fetched (exact through a
    # kill) and the pending requests a resume holds over budget.
    try:
        counts: BudgetCounts | None = BudgetCounts(
            **jobdir_budgets(controller.jobdir, rules, state).counts_json()
        )
        unread = None
    except (OSError, ValueError) as exc:
        counts, unread = None, str(exc)
    if opts.json:
        emit_json(json_document("control-jobdir", {
            "jobdir": controller.jobdir, "state": state.to_json(),
            "counts": None if counts is None else counts.to_json(), "log": log,
        }))  # fmt: skip
        return 0
    out = console()
    _print_directives(out, f"JOBDIR {controller.jobdir}", state)
    if counts is None:
        out.print(f"Budget counts: none ({unread})", markup=False)
    else:
        _print_budgets(out, rules, state, counts, controller.config.topic_names(), jobdir=True)
    _print_log(out, log, opts.last)
    return 0


def _table(title: str, *columns: str) -> Any:
    """A Rich table whose first column is left-aligned text, the others right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 or name in ("who", "action") else "right")
    return table


def _row(table: Any, *cells: object) -> None:
    """A row of plain text: a host or a who is never Rich markup."""
    from rich.text import Text

    table.add_row(*(Text(str(c)) for c in cells))


def _print_directives(out: Console, what: str, state: ControlState) -> None:
    """The directives in force: one row per host, topic and the crawl, unset cells blank."""
    rows = len(state.hosts) + len(state.topics) + (state.crawl_budget is not None)
    out.print(
        f"Control of {what}, version {state.version}: "
        + (f"{rows} target(s) with directives" if rows else "no directives in force"),
        markup=False,
    )
    if not rows:
        return
    table = _table("Directives", "target", "paused", "limit", "delay s", "budget")
    for host, hc in sorted(state.hosts.items()):
        _row(
            table, host, "yes" if hc.paused else "", "" if hc.limit is None else hc.limit,
            f"{hc.delay:g}" if hc.delay else "", "" if hc.budget is None else hc.budget,
        )  # fmt: skip
    for topic, tc in sorted(state.topics.items()):
        budget = "" if tc.budget is None else tc.budget
        _row(table, f"topic:{topic}", "yes" if tc.paused else "", "", "", budget)
    if state.crawl_budget is not None:
        _row(table, "crawl", "", "", "", state.crawl_budget)
    out.print(table)


def _print_budgets(
    out: Console,
    rules: BudgetRules,
    state: ControlState,
    counts: BudgetCounts,
    topics: set[str] | frozenset[str],
    *,
    jobdir: bool = False,
) -> None:
    """Pages charged against each budget (the operator's, else the settings'), and held.

    ``jobdir``: a single process's counts from its JOBDIR, in which a page is counted
    once fetched and done (so no separate ``done`` count).
    """
    crawl = rules.crawl_budget(state)
    topic_rows = sorted(
        t for t in set(counts.topics) | set(topics) | set(state.topics)
        if counts.topics.get(t) or rules.topic(t, state) is not None
    )  # fmt: skip
    every = set(counts.hosts) | set(counts.held)
    every |= {h for h, c in state.hosts.items() if c.budget is not None}
    hosts = sorted(every, key=lambda h: (-counts.held.get(h, 0), -counts.hosts.get(h, 0), h))
    if crawl is None and not counts.crawl and not topic_rows and not hosts:
        out.print("Budgets: none in force, no page charged", markup=False)
        return

    def budget(value: int | None) -> str:
        return "none" if value is None else str(value)

    table = _table("Budgets (pages)", "target", "budget", "charged", "held")
    done = f" ({counts.crawl_done} done)" if counts.crawl_done and not jobdir else ""
    _row(table, "crawl", budget(crawl), f"{counts.crawl}{done}", sum(counts.held.values()))
    for t in topic_rows:
        _row(table, f"topic:{t}", budget(rules.topic(t, state)), counts.topics.get(t, 0), "")
    for h in hosts[:HOSTS_SHOWN]:
        _row(table, h, budget(rules.host(h, state)), counts.hosts.get(h, 0),
             counts.held.get(h, 0))  # fmt: skip
    out.print(table)
    if len(hosts) > HOSTS_SHOWN:
        out.print(
            f"{len(hosts) - HOSTS_SHOWN} more hosts with pages charged; --json lists them all",
            markup=False,
        )


def _print_log(out: Console, log: list[dict[str, Any]], last: int) -> None:
    """The action log, newest first: local time (ISO 8601), who, what, the version it made."""
    if not log:
        out.print("No action logged" if last else "Action log not shown (--last 0)", markup=False)
        return
    table = _table(f"Actions (newest first, last {last})", "when", "who", "action", "version")
    for entry in log:
        if "unreadable" in entry:
            _row(table, "", "", f"unreadable log line: {entry['unreadable']}", "")
            continue
        _row(table, when(entry.get("at")), entry.get("who", ""), logged_action(entry),
             entry.get("version", ""))  # fmt: skip
    out.print(table)


def when(at: object) -> str:
    """A log entry's time stamp (s since the epoch) as local ISO 8601 time, to the second."""
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return "" if at is None else str(at)
    try:
        return datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return str(at)


_MORE = re.compile(r"\.\.\. (\d+) more")


def logged_action(entry: dict[str, Any]) -> str:
    """A log entry's action in words (:meth:`Action.describe`), or the entry as it is."""
    try:
        urls = [str(u) for u in entry.get("urls", ())]
        # The log keeps an inject's first 20 URLs and "... N more".
        more = _MORE.fullmatch(urls[-1]) if urls else None
        if more is not None:
            urls = urls[:-1] + [""] * int(more.group(1))
        value = entry.get("value")
        action = Action(
            str(entry["verb"]), str(entry.get("target", "")),
            None if value is None else float(value) if isinstance(value, float) else int(value),
            tuple(urls), entry.get("topic"),
        )  # fmt: skip
        return action.describe()
    except (KeyError, TypeError, ValueError):
        fields = {k: v for k, v in entry.items() if k not in ("at", "who", "version")}
        return json.dumps(fields, sort_keys=True)
