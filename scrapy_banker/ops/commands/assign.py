"""``scrapy banker assign [SPIDER] [--apply]``: the partition table the placement would make now.

With ``BANKER_PLACEMENT = "hash"`` (the default) that is the registry's
rebalance for the live nodes, dealing out the work queued and leased now
(:meth:`PartitionTable.rebalance <scrapy_banker.net.partitions.PartitionTable.rebalance>`);
otherwise the network-aware plan from what the fleet measured
(:class:`~scrapy_banker.redis.worker.placement_agent.PlacementAgent`).  Without
``--apply`` the plan is computed on a copy of the table and shown -- moves,
the work they carry, the partitions whose new owner would wait for leases
(the hand-over fence), the plan's costs -- and nothing is written.  With
``--apply`` the same change goes through
:meth:`NodeRegistry.update <scrapy_banker.redis.frontier.registry.NodeRegistry.update>`
under the fleet's rebalance lock, with new epochs for the moved partitions:
fenced exactly like the crawl's own rebalance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands._common import (
    add_target_arguments,
    connect,
    console,
    emit_json,
    redis_errors,
    redis_settings,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence

    from scrapy.settings import BaseSettings

    from scrapy_banker.net.partitions import Move, PartitionTable

HELP = "Show (and with --apply, write) the partition -> node table the placement would make now"

#: The name the rebalance lock records while ``--apply`` holds it.
OPERATOR = "scrapy-banker-assign"
#: Moves listed one by one in the text output (the JSON lists all).
SHOWN = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--apply", action="store_true", help="write the table (fenced like a rebalance)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.net.partitions import PartitionTable
    from scrapy_banker.ops.fleet_view import count_partitions, handover_waits
    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.redis.frontier.registry import NodeRegistry
    from scrapy_banker.settings import load_placement_config

    rconfig = redis_settings(settings, opts)
    try:
        pconfig = load_placement_config(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    client, keyspace = connect(settings, opts)
    with redis_errors(settings):
        frontier = RedisFrontier(client, prefix=keyspace.prefix, partitions=keyspace.partitions)
        registry = NodeRegistry(
            client, frontier, node_timeout_ms=max(1, int(rconfig.node_timeout * 1000))
        )
        table = registry.load_table()
        live = registry.live_nodes()
        if not live:
            raise CommandError(
                f"no live node under prefix {keyspace.prefix!r}: there is nothing to assign "
                "partitions to (start the workers first)"
            )
        counts = count_partitions(client, keyspace)
        work = [q + le for q, le in zip(counts.queued, counts.leased, strict=True)]
        costs: dict[str, Any] = {}
        plan = _planner(client, keyspace, pconfig, frontier, work, costs)
        proposal = PartitionTable.from_state(table.to_state())
        moves = plan(proposal, live)
        busy = handover_waits(client, keyspace, proposal, counts.leased)
        applied: list[Move] | None = None
        if opts.apply:
            applied = registry.update(OPERATOR, plan)
            if applied is None:
                raise CommandError(
                    "another node holds the rebalance lock right now: nothing written, try again"
                )
    data = _report(table, proposal, live, moves, work, busy, pconfig.mode, costs)
    data["applied"] = None if applied is None else len(applied)
    if applied is not None:
        data["table_version_after"] = registry.table_version()
    if opts.json:
        emit_json(data)
    else:
        _print(data)
    return 0


def _planner(
    client: Any,
    keyspace: Any,
    pconfig: Any,
    frontier: Any,
    work: Sequence[int],
    costs: dict[str, Any],
) -> Callable[[PartitionTable, dict[str, float]], list[Move]]:
    """The change the crawl itself would make, as ``NodeRegistry.update`` takes it."""
    if pconfig.mode == "hash":
        return lambda table, live: table.rebalance(live, work=work)
    from scrapy_banker.net.netstats import LinkStats
    from scrapy_banker.redis.worker.placement_agent import PlacementAgent

    # The agent plans from what the fleet published; it measures nothing here.
    agent = PlacementAgent(
        client, keyspace, OPERATOR, pconfig, LinkStats(pconfig.window), backlog=frontier.backlog
    )

    def change(table: PartitionTable, live: dict[str, float]) -> list[Move]:
        problem, result = agent.plan(table, live)
        costs["placed_cost"] = sum(result.placed_costs.values())
        costs["placed"] = len(result.placed_costs)
        costs["sites"] = len(problem.observations.sites)
        return table.assign({p: result.owners[p] for p in result.moves})

    return change


def _report(
    before: PartitionTable,
    after: PartitionTable,
    live: dict[str, float],
    moves: list[Move],
    work: Sequence[int],
    busy: dict[int, int],
    mode: str,
    costs: dict[str, Any],
) -> dict[str, Any]:
    from scrapy_banker.ops.fleet_view import SCHEMA_VERSION

    names = sorted(set(live) | {o for o in before.owners if o is not None})
    nodes = []
    for name in names:
        nodes.append({
            "name": name,
            "live": name in live,
            "capacity": live.get(name),
            "partitions_before": sum(1 for o in before.owners if o == name),
            "partitions_after": sum(1 for o in after.owners if o == name),
            "work_before": sum(w for o, w in zip(before.owners, work, strict=True) if o == name),
            "work_after": sum(w for o, w in zip(after.owners, work, strict=True) if o == name),
        })  # fmt: skip
    moved = sorted(moves, key=lambda m: (-work[m.partition], m.partition))
    return {
        "schema": SCHEMA_VERSION,
        "kind": "assign",
        "mode": mode,
        "table_version": before.version,
        "moves": len(moves),
        "moved_work": sum(work[m.partition] for m in moves),
        "handover_waits": sum(1 for m in moves if busy.get(m.partition)),
        "costs": costs,
        "nodes": nodes,
        "move_list": [
            {
                "partition": m.partition,
                "from": m.old,
                "to": m.new,
                "work": work[m.partition],
                "leases_to_wait_for": busy.get(m.partition, 0),
            }
            for m in moved
        ],
    }


def _print(data: dict[str, Any]) -> None:
    from rich.table import Table

    out = console()
    out.print(
        f"Placement {data['mode']}: {data['moves']} partitions would move "
        f"(table version {data['table_version']}), carrying {data['moved_work']} queued or "
        f"leased requests; {data['handover_waits']} new owners would first wait for the old "
        "owner's leases"
    )
    if data["costs"]:
        out.print("Plan: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in sorted(data["costs"].items())))  # fmt: skip
    table = Table(title="Nodes")
    for name in ("node", "live", "partitions now", "after", "work now", "after"):
        table.add_column(name, justify="left" if name == "node" else "right")
    for n in data["nodes"]:
        table.add_row(
            n["name"], "yes" if n["live"] else "NO", str(n["partitions_before"]),
            str(n["partitions_after"]), str(n["work_before"]), str(n["work_after"]),
        )  # fmt: skip
    out.print(table)
    if data["move_list"]:
        moves = Table(title=f"Moves (largest work first, {min(SHOWN, data['moves'])} shown)")
        for name in ("partition", "from", "to", "work", "leases to wait for"):
            moves.add_column(name, justify="right")
        for m in data["move_list"][:SHOWN]:
            moves.add_row(str(m["partition"]), str(m["from"] or "-"), m["to"], str(m["work"]),
                          str(m["leases_to_wait_for"]))  # fmt: skip
        out.print(moves)
    if data["applied"] is None:
        out.print("Nothing written (dry run): add --apply to write this table.")
    else:
        out.print(
            f"Applied: {data['applied']} partitions moved; table version "
            f"{data.get('table_version_after')}"
        )
