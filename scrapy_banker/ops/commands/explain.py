"""``scrapy banker explain URL [SPIDER]``: where one URL is in the crawl, and why it waits.

The URL is classified by the crawl's own code (topic rules, queue key, BKDR
hash, partition) and looked up by the fingerprint of Scrapy's request
fingerprinter -- the one the crawl deduplicates on -- in its partition's seen
set, queue, leases and dead letters (a fleet), or among a JOBDIR's pending
requests, dead letters and seen set (a single node; a pending request whose
host, topic or crawl budget is spent is ``over budget``, as on a fleet, the
budgets being the operator's in ``JOBDIR/banker/control.json`` over the
settings').  The sentence saying why it
waits is built only from what was read: the owner's heartbeat, the
hand-over fence, the owner's telemetry (its slot for the host, the topics it
serves, its admission gate), the queue ahead of it.  Reads only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands._common import (
    add_target_arguments,
    connect,
    console,
    emit_json,
    jobdir_or_fleet,
    redis_errors,
    redis_settings,
    spider_name,
)

if TYPE_CHECKING:
    import argparse

    from scrapy import Request
    from scrapy.settings import BaseSettings

    from scrapy_banker.ops.jobdir_view import Budget
    from scrapy_banker.settings import BankerConfig

HELP = "Explain one URL: topic, queue key, hash, partition, owner, state, and why it waits"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the URL to explain (as the crawl queued it)")
    add_target_arguments(parser)
    parser.add_argument(
        "--jobdir",
        metavar="DIR",
        help="explain against a single node's JOBDIR instead of a Redis fleet",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _request(url: str) -> Request:
    from scrapy import Request

    from scrapy_banker.core.hashing import host_of

    try:
        request = Request(url)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"not a URL the crawl could queue: {exc}") from None
    if not host_of(request.url):
        raise CommandError(f"URL {url!r} has no host name")
    return request


def _fingerprinter(settings: BaseSettings) -> Any:
    """The project's request fingerprinter (``REQUEST_FINGERPRINTER_CLASS``), as the crawl's."""
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings
    from scrapy.utils.misc import build_from_crawler, load_object

    # A crawler is only the fingerprinter's way to its settings: it is never
    # started, so no reactor is installed and nothing is crawled.
    crawler = Crawler(Spider, Settings(settings.copy_to_dict()))
    return build_from_crawler(load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"]), crawler)


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.settings import load_config

    request = _request(opts.url)
    try:
        config = load_config(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    fingerprinter = _fingerprinter(settings)

    def fingerprint(r: Request) -> str:
        return str(fingerprinter.fingerprint(r).hex())

    spider_name(settings, opts, required=False)  # an unknown spider is bad input anyway
    jobdir = jobdir_or_fleet(settings, opts, "nothing to look in")
    if jobdir is not None:
        data = _explain_jobdir(jobdir, request, config, fingerprint)
    else:
        data = _explain_fleet(opts, settings, request, config, fingerprint(request))
    if opts.json:
        emit_json(data)
    else:
        _print(data)
    return 0


def _explain_fleet(
    opts: argparse.Namespace,
    settings: BaseSettings,
    request: Request,
    config: BankerConfig,
    fingerprint: str,
) -> dict[str, Any]:
    from scrapy_banker.ops.explanation import explain_url

    rconfig = redis_settings(settings, opts)
    client, keyspace = connect(settings, opts)
    with redis_errors(settings):
        found = explain_url(
            client,
            keyspace,
            request,
            fingerprint=fingerprint,
            config=config,
            node_timeout_s=rconfig.node_timeout,
        )
    if found.state == "unknown" and not found.revisit_kept:
        raise CommandError(
            f"{request.url} is not in this crawl: fingerprint {fingerprint} was never queued "
            f"under prefix {keyspace.prefix!r} and no revisit state is kept for it (it would "
            f"go to partition {found.partition}, owner {found.owner or 'none'})"
        )
    return found.to_json()


def _explain_jobdir(
    jobdir: str, request: Request, config: BankerConfig, fingerprint: Any
) -> dict[str, Any]:
    from scrapy_banker.ops.jobdir_view import SCHEMA_VERSION, find_in_jobdir
    from scrapy_banker.ops.revisits_view import describe
    from scrapy_banker.scheduler.classifier import Classifier
    from scrapy_banker.scheduler.downloader import DownloaderView
    from scrapy_banker.scheduler.revisit_log import read_states

    c = Classifier(config, DownloaderView(), None).classify(request)
    try:
        found = find_in_jobdir(jobdir, request, c.key_hash, fingerprint, config.budgets())
    except (OSError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    # A page the crawl revisits (a start URL too: Scrapy asks for those with
    # dont_filter, so the journal never marks them seen).
    revisit = read_states(jobdir)[0].get(request.url)
    if found.state == "unknown" and revisit is None:
        raise CommandError(
            f"{request.url} is not in this crawl: not pending in {jobdir}, not a dead letter, "
            "not seen by its journal, not revisited"
        )
    topic = found.entry.topic if found.entry is not None else c.topic
    waiting = None
    if found.state == "over budget" and found.held is not None:
        waiting = _over_budget(found.held, found.budgets, jobdir)
    elif found.state == "queued":
        waiting = (
            f"it was saved in bucket {found.bucket} at the last clean stop, with "
            f"{found.ahead} requests of topic {topic} for {c.slot} ahead of it; "
            + _when_resumed(found.budgets, found.ahead or 0, jobdir)
        )
    elif found.state == "dead":
        waiting = f"it is in banker-deadletter.jsonl ({found.dead_reason}) and will not resume"
    notes = [] if found.control_error is None else [found.control_error]
    if found.entry is None and any(r.callback is not None for r in config.topic_rules):
        notes.append(
            "topic from the URL rules only: the request's callback is unknown here, so "
            "callback rules were tried against Scrapy's default 'parse'"
        )
    return {
        "schema": SCHEMA_VERSION,
        "kind": "explain-jobdir",
        "url": request.url,
        "fingerprint": fingerprint(request),
        "topic": topic,
        "topic_source": "saved request" if found.entry is not None else "rules",
        "slot": c.slot,
        "queue_key": c.key,
        "key_hash": c.key_hash,
        "hash_function": config.queue_hash,
        "bucket": found.bucket,
        "seen": found.seen,
        "state": found.state,
        "waiting": waiting,
        "notes": notes,
        # The budget it is held over (state "over budget"), and every budget in force
        # for it with the pages fetched against it (the operator's over the settings').
        "over_budget": None if found.held is None else found.held.to_json(),
        "budgets": [b.to_json() for b in found.budgets],
        # When the page is fetched again (BANKER_RECRAWL), in words; None: it is not.
        "revisit": None if revisit is None else describe(revisit, time.time()),
    }


def _fetched(b: Budget, pages: int, *, more: bool = False) -> str:
    """``its host (a.test) has been fetched 4 pages`` / ``the crawl may fetch 3 more pages``."""
    if more:
        return (
            f"the crawl may fetch {pages} more pages" if b.kind == "crawl"
            else f"{b.subject()} may be fetched {pages} more pages"
        )  # fmt: skip
    return (
        f"the crawl has fetched {pages} pages" if b.kind == "crawl"
        else f"{b.subject()} has been fetched {pages} pages"
    )  # fmt: skip


def _over_budget(held: Budget, budgets: tuple[Budget, ...], jobdir: str) -> str:
    """Why a pending request waits when a budget is spent: the fleet's sentence, with the count."""
    others = [b for b in budgets if b.spent and b != held]
    also = "".join(
        f"; the {'crawl' if b.kind == 'crawl' else f'{b.kind} {b.name}'} budget is spent too "
        f"({b.budget}, {b.fetched} fetched)"
        for b in others
    )
    raised = "the budget is" if not others else "the budgets are"
    ways = "; ".join(b.release(jobdir) for b in [held, *others])
    return (
        f"it is over budget: {_fetched(held, held.fetched)}, as many as its budget "
        f"({held.budget}) allows{also}; it is kept, and fetched if {raised} raised ({ways}) "
        f"and the crawl resumes with JOBDIR={jobdir}"
    )


def _when_resumed(budgets: tuple[Budget, ...], ahead: int, jobdir: str) -> str:
    """When a pending request not held is fetched: at the resume, if its budgets leave room."""
    tight = min(budgets, key=lambda b: b.budget - b.fetched, default=None)
    resumes = f"it is fetched when the crawl resumes with JOBDIR={jobdir}"
    if tight is None:
        return resumes
    room = tight.budget - tight.fetched
    if room > ahead:
        return f"{resumes} ({_fetched(tight, room, more=True)}: {tight.describe()})"
    return (
        f"{_fetched(tight, room, more=True)} ({tight.describe()}), no more than the requests "
        f"ahead of it: it is likely held over budget when the crawl resumes with "
        f"JOBDIR={jobdir}, unless the budget is raised ({tight.release(jobdir)})"
    )


_LABELS = (
    ("url", "URL"),
    ("fingerprint", "fingerprint"),
    ("topic", "topic"),
    ("topic_source", "topic from"),
    ("slot", "download slot"),
    ("queue_key", "queue key"),
    ("key_hash", "key hash"),
    ("hash_function", "hash function"),
    ("bucket", "directory bucket"),
    ("partition", "partition"),
    ("owner", "owner"),
    ("owner_alive", "owner live"),
    ("owner_epoch", "owner epoch"),
    ("seen", "seen"),
    ("state", "state"),
)


def _print(data: dict[str, Any]) -> None:
    from rich.table import Table

    out = console()
    table = Table(show_header=False, box=None)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, label in _LABELS:
        if key in data:
            value = data[key]
            table.add_row(label, "-" if value is None else str(value))
    for copy in data.get("copies", []):
        detail = copy["state"]
        if copy["ahead"] is not None:
            detail += f", {copy['ahead']} ahead"
        if copy["state"] == "leased":
            detail += f", delivery {copy['deliveries']}, expires in {copy['expires_in_s']} s"
        if copy["reason"]:
            detail += f": {copy['reason']}"
        table.add_row("copy", f"{copy['id']} ({detail})")
    out.print(table)
    if data.get("waiting"):
        out.print(f"Why it waits: {data['waiting']}")
    elif data.get("state") == "done":
        out.print("Not waiting: it was queued and nothing of it is left (fetched or dropped).")
    if data.get("revisit"):
        out.print(f"Revisit: {data['revisit']}")
    for note in data.get("notes", []):
        out.print(f"Note: {note}")
