"""``scrapy banker status [SPIDER] [--jobdir DIR] [--json]``: what a crawl holds now.

A single node: what its JOBDIR holds since its last clean stop (topics,
requests per topic and per directory bucket, dead letters), the pages
fetched against each budget and the pending requests held over budget --
those a resume holds again until the budget is raised (the operator's
budgets in ``JOBDIR/banker/control.json`` over the settings').  A fleet: what
Redis holds (nodes with heartbeat age, owned partitions, in flight and
capacity; the partition table; queued / leased / dead-lettered totals; the
reaper; placement mode and latest plan; topic counters from the nodes'
telemetry).  Either way, a crawl that keeps pages for revisits
(``BANKER_RECRAWL``) adds a line about them
(:mod:`scrapy_banker.ops.revisits_view`).  A Rich table on a terminal, plain
text in a pipe, one JSON document with ``--json`` (schema in
``docs/ops/commands.rst``).  Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_banker.core.directives import CRAWL
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
    spider_name,
)

if TYPE_CHECKING:
    import argparse

    from rich.console import Console
    from scrapy.settings import BaseSettings

    from scrapy_banker.ops.fleet_view import FleetView
    from scrapy_banker.ops.jobdir_view import JobdirBudgets, JobdirView

HELP = "Show a crawl's state: a node's JOBDIR, or a Redis fleet (nodes, partitions, topics)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--jobdir", metavar="DIR", help="a single node's JOBDIR (default: the JOBDIR setting)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    spider_name(settings, opts, required=False)  # an unknown spider is bad input anyway
    jobdir = jobdir_or_fleet(settings, opts, "nothing to inspect")
    if jobdir is not None:
        from scrapy_banker.ops.jobdir_view import read_jobdir
        from scrapy_banker.settings import load_config

        try:
            # The budgets a resume with these settings (the project's, plus -s) would
            # apply, under the operator's in JOBDIR/banker/control.json.
            rules = load_config(settings).budgets()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            view = read_jobdir(jobdir, budgets=rules)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if opts.json:
            emit_json(view.to_json())
        else:
            _print_jobdir(view)
        return 0
    from scrapy_banker.ops.fleet_view import read_fleet
    from scrapy_banker.settings import load_placement_config

    config = redis_settings(settings, opts)
    try:
        mode = load_placement_config(settings).mode
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    client, keyspace = connect(settings, opts)
    with redis_errors(settings):
        fleet = read_fleet(
            client, keyspace, node_timeout_s=config.node_timeout, placement_mode=mode,
            revisits=True,
        )  # fmt: skip
    if not fleet.exists:
        raise CommandError(
            f"no crawl under prefix {keyspace.prefix!r} at {safe_url(settings)} "
            "(wrong spider or --prefix, or the crawl has not started)"
        )
    if opts.json:
        emit_json(fleet.to_json())
    else:
        _print_fleet(fleet)
    return 0


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _print_fleet(fleet: FleetView) -> None:
    from rich.table import Table

    out = console()
    live = len(fleet.live_nodes)
    out.print(
        f"Fleet {fleet.prefix!r}: {live} live of {len(fleet.nodes)} nodes, "
        f"{fleet.partitions} partitions (table version {fleet.table_version})"
    )
    out.print(
        f"Requests: {fleet.queued} queued, {fleet.leased} leased, {fleet.dead} dead-lettered"
        + (f", {fleet.over_budget} held over budget" if fleet.over_budget else "")
        + f"; finished counter {fleet.finished}"
    )
    out.print(
        f"Partitions: {fleet.owned} owned, {fleet.unowned} without owner, "
        f"{fleet.owned_by_dead} owned by a dead node, {fleet.handover} in hand-over"
        + (f"; {fleet.rebalancing} is rebalancing now" if fleet.rebalancing else "")
    )
    reaper = fleet.reaper
    live_names = {n.name for n in fleet.live_nodes}
    running = ""
    if reaper.running_on in live_names:
        running = f"; a round is running on {reaper.running_on}"
    elif reaper.running_on:
        running = f"; its lock is still held by {reaper.running_on} (not live: it expires)"
    out.print(f"Reaper: {reaper.expired_leases} expired leases waiting{running}")
    if fleet.revisits is not None:
        out.print(fleet.revisits.summary(), markup=False, soft_wrap=True)
    nodes = Table(title="Nodes")
    for name in ("node", "live", "heartbeat", "capacity", "partitions", "queued", "leased",
                 "dead", "in flight", "pages"):  # fmt: skip
        nodes.add_column(name, justify="left" if name == "node" else "right")
    for n in fleet.nodes:
        t = n.telemetry
        nodes.add_row(
            n.name,
            "yes" if n.alive else "NO",
            _age(n.heartbeat_age_s),
            "-" if n.capacity is None else f"{n.capacity:g}",
            str(n.partitions_owned),
            str(n.queued),
            str(n.leased),
            str(n.dead),
            "-" if t is None else str(t.inflight),
            "-" if t is None else str(t.pages),
        )
    out.print(nodes)
    if fleet.topics:
        topics = Table(title="Topics (live nodes' telemetry)")
        for name in ("topic", "pages", "queued on nodes", "in flight", "nodes"):
            topics.add_column(name, justify="left" if name == "topic" else "right")
        for tv in fleet.topics:
            topics.add_row(tv.name, str(tv.pages), str(tv.queued), str(tv.inflight), str(tv.nodes))
        out.print(topics)
    else:
        out.print("Topics: no live node publishes telemetry")
    pl = fleet.placement
    line = f"Placement: {pl.mode}; {pl.sites} partitions with a known site"
    if pl.mode != "hash":
        line += f", {pl.placed} placed by a hungarian plan (cost {pl.placed_cost:.3g})"
        if pl.planner:
            line += f", last planned by {pl.planner}"
        if pl.assignment:
            owners: dict[str, int] = {}
            for node in pl.assignment.values():
                owners[node] = owners.get(node, 0) + 1
            spread = ", ".join(f"{n}: {c}" for n, c in sorted(owners.items()))
            line += f"; latest plan ({pl.assignment_from}): sites per node {spread}"
    out.print(line)


def _print_jobdir(view: JobdirView) -> None:
    from rich.table import Table

    out = console()
    out.print(
        f"JOBDIR {view.path}: {view.queued} requests pending"
        + (f", {view.over_budget} held over budget" if view.over_budget else "")
        + (
            f" ({view.pending} in the journal, {view.pending - view.queued} unreadable)"
            if view.pending != view.queued
            else ""
        ),
        markup=False,
        soft_wrap=True,
    )
    seen = "no journal" if view.seen is None else f"{view.seen} fingerprints seen"
    out.print(
        f"Dead letters: {view.dead_letters}"
        + (f" ({', '.join(f'{k}: {n}' for k, n in view.dead_letter_kinds.items())})"
           if view.dead_letter_kinds else "")
        + f"; {seen}; {view.malformed} malformed lines"
    )  # fmt: skip
    if view.revisits is not None:
        out.print(view.revisits.summary(), markup=False, soft_wrap=True)
    if view.global_depth is not None:
        out.print(
            f"Directory: global depth {view.global_depth}, {view.n_buckets} buckets "
            f"({len(view.buckets)} with saved requests)"
        )
    topics = Table(title="Topics")
    for name in ("topic", "queued", "slice s", "dispatched"):
        topics.add_column(name, justify="left" if name == "topic" else "right")
    for name, t in sorted(view.topics.items()):
        slice_s = t.get("slice_s")
        topics.add_row(
            name,
            str(t["queued"]),
            "-" if slice_s is None else f"{slice_s:g}",
            "-" if t.get("dispatched") is None else str(t["dispatched"]),
        )
    out.print(topics)
    buckets = Table(title="Buckets")
    for name in ("bucket", "queued", "queue keys"):
        buckets.add_column(name, justify="right")
    for b, (q, k) in sorted(view.buckets.items()):
        buckets.add_row(str(b), str(q), str(k))
    out.print(buckets)
    if view.top_slots:
        out.print("Busiest slots: " + ", ".join(f"{slot} ({n})" for slot, n in view.top_slots))
    if view.budgets is not None:
        _print_budgets(out, view.path, view.budgets)


def _print_budgets(out: Console, jobdir: str, b: JobdirBudgets) -> None:
    """Pages fetched against each budget; the requests held over one, and what releases them."""
    from rich.table import Table

    from scrapy_banker.ops.commands.control import HOSTS_SHOWN

    def say(text: str) -> None:
        out.print(text, markup=False, soft_wrap=True)  # a sentence: never wrapped in a pipe

    if b.control_error:
        say(f"Note: {b.control_error}")
    pages = b.pages
    if not b.in_force:
        say(
            f"Budgets: none in force; {pages.crawl} pages fetched"
            + (f" ({len(pages.hosts)} hosts)" if pages.hosts else "")
        )
        return

    def budget(value: int | None) -> str:
        return "none" if value is None else str(value)

    table = Table(title="Budgets (pages)")
    for i, name in enumerate(("target", "budget", "fetched", "pending", "held")):
        table.add_column(name, justify="left" if i == 0 else "right")
    _row(table, "crawl", budget(b.crawl_budget), pages.crawl, b.pending, b.held)
    for t in b.topics():
        _row(table, f"topic:{t}", budget(b.topic_budget(t)), pages.topics.get(t, 0),
             b.pending_topics.get(t, 0), b.held_topics.get(t, 0))  # fmt: skip
    hosts = b.hosts()
    for h in hosts[:HOSTS_SHOWN]:
        _row(table, h, budget(b.host_budget(h)), pages.hosts.get(h, 0),
             b.pending_hosts.get(h, 0), b.held_hosts.get(h, 0))  # fmt: skip
    out.print(table)
    if len(hosts) > HOSTS_SHOWN:
        say(f"{len(hosts) - HOSTS_SHOWN} more hosts; --json lists them all")
    if not b.held:
        say(
            f"Held over budget: none; the {b.pending} pending requests are fetched when the "
            f"crawl resumes with JOBDIR={jobdir}, as far as their budgets allow"
        )
        return
    by_target = b.held_by_target()
    order = {"host": 0, "topic": 1, "crawl": 2}
    over = sorted(b.over.values(), key=lambda h: (order[h.kind], -by_target.get(h.target, 0),
                                                  h.target))  # fmt: skip
    crawl = b.over.get(CRAWL)
    if crawl is not None:
        say(
            f"Held over budget: crawl budget {crawl.budget} spent ({crawl.fetched} fetched): "
            "every pending request is held"
        )
    else:
        say(f"Held over budget: {b.held} of {b.pending} pending requests")
    listed = [h for h in over if h.kind != "crawl"]
    for held in listed[:HOSTS_SHOWN]:
        say(
            f"  {held.target}: {by_target.get(held.target, 0)} held over budget "
            f"({held.kind} budget {held.budget}, {held.fetched} fetched)"
        )
    if len(listed) > HOSTS_SHOWN:
        say(f"  {len(listed) - HOSTS_SHOWN} more budgets with requests held; --json lists them")
    target = over[0].target if len(over) == 1 else "TARGET"
    settings = sorted({h.set_by for h in over} - {"operator"})
    free = b.pending - b.held
    say(
        f"To fetch them, raise their budget with scrapy banker budget {target} N "
        f"--jobdir {jobdir}"
        + (f" (TARGET as listed: {', '.join(h.target for h in over[:5])}"
           + (", ..." if len(over) > 5 else "") + ")" if len(over) > 1 else "")
        + (f", or in the settings ({', '.join(settings)})" if settings else "")
        + f", then resume the crawl with JOBDIR={jobdir}"
        + (f"; the other {free} pending requests are fetched when it resumes, as far as "
           "their budgets allow" if free else "")
    )  # fmt: skip


def _row(table: Any, *cells: object) -> None:
    """A row of plain text: a host is never Rich markup."""
    from rich.text import Text

    table.add_row(*(Text(str(c)) for c in cells))
