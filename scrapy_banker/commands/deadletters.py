"""``scrapy banker deadletters [SPIDER] [--requeue N|all] [--json]``: the fleet's dead letters.

Lists each dead letter with its partition, reason, deliveries and what its
payload would fetch (read with the project's JSON codec, never unpickled;
what the codec refuses is shown as the payload's error).  ``--requeue``
puts the first N letters (or all) back in their partition's queue, one
atomic script per letter: a letter is either still listed or queued, never
lost, never queued twice; its fingerprint stays in the seen set.  A letter
whose payload is malformed is requeued too if asked -- the workers will
dead-letter it again, which the listing says beforehand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_banker.commands import CommandError
from scrapy_banker.commands._common import (
    add_target_arguments,
    connect,
    console,
    emit_json,
    redis_errors,
    redis_settings,
    safe_url,
)

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import BaseSettings

    from scrapy_banker.redis.inspect import DeadLetter

HELP = "List the fleet's dead letters with their reasons; --requeue N|all puts them back"


def _count(value: str) -> int | None:
    """``all`` -> None, else an integer >= 1."""
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise CommandError(f"--requeue takes a number >= 1 or 'all', got {value!r}")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--requeue",
        metavar="N|all",
        help="requeue the first N dead letters listed (or all of them)",
    )
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="list at most N letters"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.redis.inspect import SCHEMA_VERSION, list_dead_letters, requeue_dead_letters

    requeue = None if opts.requeue is None else _count(opts.requeue)
    if opts.limit is not None and opts.limit < 1:
        raise CommandError(f"--limit takes a number >= 1, got {opts.limit}")
    config = redis_settings(settings, opts)
    client, keyspace = connect(settings, opts)
    with redis_errors(settings):
        if not client.exists(keyspace.table) and not client.exists(keyspace.finished):
            raise CommandError(
                f"no crawl under prefix {keyspace.prefix!r} at {safe_url(settings)} "
                "(wrong spider or --prefix, or the crawl has not started)"
            )
        if opts.requeue is None:
            letters = list_dead_letters(client, keyspace, limit=opts.limit)
            if opts.json:
                emit_json({
                    "schema": SCHEMA_VERSION,
                    "kind": "deadletters",
                    "prefix": keyspace.prefix,
                    "count": len(letters),
                    "letters": [d.to_json() for d in letters],
                })  # fmt: skip
            else:
                _print(letters, keyspace.prefix)
            return 0
        letters = list_dead_letters(client, keyspace, limit=requeue)
        result = requeue_dead_letters(client, keyspace, letters, node_timeout_s=config.node_timeout)
    if opts.json:
        emit_json({**result.to_json(), "prefix": keyspace.prefix})
    else:
        out = console()
        out.print(
            f"Requeued {len(result.requeued)} dead letters of {keyspace.prefix!r}"
            + (f"; left {len(result.skipped)}" if result.skipped else "")
        )
        for letter, new_id in result.requeued:
            warn = (
                f" (payload malformed: {letter.payload.error}; it will be dead-lettered again)"
                if letter.payload.error else ""
            )  # fmt: skip
            out.print(f"  partition {letter.partition}: {letter.id} -> {new_id}{warn}")
        for letter, why in result.skipped:
            out.print(f"  partition {letter.partition}: {letter.id} left: {why}")
    return 0


def _print(letters: list[DeadLetter], prefix: str) -> None:
    from rich.table import Table

    out = console()
    out.print(f"{len(letters)} dead letters under {prefix!r}")
    if not letters:
        return
    table = Table()
    for name in ("partition", "id", "deliveries", "reason", "URL / payload"):
        table.add_column(name, justify="right" if name in ("partition", "deliveries") else "left")
    for d in letters:
        what = d.payload.url or "-"
        if d.payload.error:
            what += f" [payload: {d.payload.error}]"
        table.add_row(str(d.partition), d.id or "-", str(d.deliveries), d.reason, what)
    out.print(table)
