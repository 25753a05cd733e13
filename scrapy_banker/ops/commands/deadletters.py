"""``scrapy banker deadletters [SPIDER] [--jobdir DIR] [--requeue N|all] [--json]``: dead letters.

Which crawl: ``--jobdir``, else a fleet if one is configured, else the
``JOBDIR`` setting (as ``status`` chooses).

A fleet: lists each dead letter with its partition, reason, deliveries and
what its payload would fetch (read with the project's JSON codec, never
unpickled; what the codec refuses is shown as the payload's error).
``--requeue`` puts the first N letters (or all) back in their partition's
queue, one atomic script per letter: a letter is either still listed or
queued, never lost, never queued twice; its fingerprint stays in the seen
set.  A letter whose payload is malformed is requeued too if asked -- the
workers will dead-letter it again, which the listing says beforehand.

A single node: ``JOBDIR/banker-deadletter.jsonl``, read and requeued by
:mod:`scrapy_banker.ops.jobdir_deadletters` (whose docstring has the
semantics): a requeue appends new journal records for the next resume,
under the JOBDIR's lock -- refused (exit code 2, nothing changed) while a
crawl holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

    from scrapy.settings import BaseSettings

    from scrapy_banker.ops.fleet_deadletters import DeadLetter
    from scrapy_banker.ops.jobdir_deadletters import JobdirLetter, RequeueOutcome
    from scrapy_banker.scheduler.serialize import RequestCodec

HELP = (
    "List the dead letters of a fleet or a JOBDIR with their reasons; --requeue N|all puts "
    "them back"
)


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
        "--jobdir", metavar="DIR", help="a single node's JOBDIR (default: the JOBDIR setting)"
    )
    parser.add_argument(
        "--requeue",
        metavar="N|all",
        help="requeue the first N dead letters listed (or all of them); with a JOBDIR, "
        "the first N that can be requeued",
    )
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="list at most N letters"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.ops.fleet_deadletters import list_dead_letters, requeue_dead_letters
    from scrapy_banker.ops.fleet_view import SCHEMA_VERSION

    requeue = None if opts.requeue is None else _count(opts.requeue)
    if opts.limit is not None and opts.limit < 1:
        raise CommandError(f"--limit takes a number >= 1, got {opts.limit}")
    spider_name(settings, opts, required=False)  # an unknown spider is bad input anyway
    jobdir = jobdir_or_fleet(settings, opts, "no dead letters to look at")
    if jobdir is not None:
        return _run_jobdir(opts, settings, str(jobdir), requeue)
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


# -- a single node's JOBDIR ------------------------------------------------------------


def _codec(settings: BaseSettings) -> RequestCodec:
    """The crawl's codec: its ``BANKER_SERIALIZE_ALLOWED_CLASSES`` decide what decodes."""
    from scrapy_banker.scheduler.serialize import RequestCodec
    from scrapy_banker.settings import load_config

    try:
        allowed = load_config(settings).serialize_allowed_classes
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        return RequestCodec(allowed)
    except (ValueError, ImportError, NameError) as exc:
        raise CommandError(
            f"BANKER_SERIALIZE_ALLOWED_CLASSES={list(allowed)!r}: cannot load a class ({exc})"
        ) from None


def _run_jobdir(
    opts: argparse.Namespace, settings: BaseSettings, jobdir: str, requeue: int | None
) -> int:
    from scrapy_banker.ops import jobdir_deadletters as deadletters
    from scrapy_banker.scheduler.jobdir import JobdirLocked

    codec = _codec(settings)
    if opts.requeue is None:
        try:
            letters = deadletters.list_letters(jobdir, codec)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        shown = letters if opts.limit is None else letters[: opts.limit]
        if opts.json:
            emit_json({
                "schema": deadletters.SCHEMA_VERSION,
                "kind": "deadletters-jobdir",
                "jobdir": jobdir,
                "count": len(shown),
                "total": len(letters),
                "letters": [d.to_json() for d in shown],
            })  # fmt: skip
        else:
            _print_jobdir(jobdir, shown, len(letters))
        return 0
    try:
        outcome = deadletters.requeue(jobdir, requeue, codec)
    except JobdirLocked as exc:
        raise CommandError(f"{exc}; nothing requeued") from None
    except (OSError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    if opts.json:
        emit_json(outcome.to_json())
    else:
        _print_requeued(outcome)
    return 0


def _what(d: JobdirLetter) -> str:
    what = d.url or "-"
    if d.callback:
        what += f" -> {d.callback}"
    if d.payload_error:
        what += f" [payload: {d.payload_error}]"
    return what


def _requeue_column(d: JobdirLetter) -> str:
    if d.queued_as is not None:
        return f"already queued as seq {d.queued_as} (a requeue takes it off the list)"
    if not d.requeueable:
        return f"no: {d.why_not}"
    if d.payload_error:
        return "yes, but the next resume dead-letters it again"
    return "yes"


def _print_jobdir(jobdir: str, letters: list[JobdirLetter], total: int) -> None:
    from rich.table import Table

    out = console()
    shown = "" if len(letters) == total else f" (showing {len(letters)})"
    out.print(f"{total} dead letters in {jobdir}{shown}")
    if not letters:
        return
    table = Table()
    for name in ("line", "when", "error", "URL / payload", "requeue"):
        table.add_column(name, justify="right" if name == "line" else "left")
    for d in letters:
        table.add_row(str(d.line), d.when, d.error or "-", _what(d), _requeue_column(d))
    out.print(table)


def _print_requeued(outcome: RequeueOutcome) -> None:
    plan = outcome.plan
    out = console()
    line = f"Requeued {len(plan.requeued)} dead letters into {outcome.jobdir}"
    if plan.requeued:
        first, last = plan.requeued[0][1], plan.requeued[-1][1]
        seqs = f"seq {first}" if first == last else f"seq {first}-{last}"
        line += f" (banker/{outcome.journal}, {seqs})"
    out.print(line + f"; {outcome.left} left on the list")
    for d, seq, _ in plan.requeued:
        warn = (
            f" (payload malformed: {d.payload_error}; the next resume dead-letters it again)"
            if d.payload_error else ""
        )  # fmt: skip
        out.print(f"  line {d.line}: {d.url or '-'} -> seq {seq}{warn}")
    for d, seq in plan.already_queued:
        out.print(f"  line {d.line}: {d.url or '-'} already queued as seq {seq}: off the list")
    for d, why in plan.skipped:
        out.print(f"  line {d.line}: {d.url or '-'} left: {why}")
    if outcome.cut_tail:
        out.print(
            f"  (banker/{outcome.journal} ended with a line cut short by a kill: it was cut "
            "off, as a resume skips it)"
        )
    if plan.requeued:
        out.print(f"They are fetched when the crawl resumes with JOBDIR={outcome.jobdir}")
