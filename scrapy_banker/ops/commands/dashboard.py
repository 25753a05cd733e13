"""``scrapy banker dashboard [SPIDER] [--jobdir DIR]``: the live dashboard in a browser.

Serves :mod:`scrapy_banker.ops.dashboard` on ``--bind`` (127.0.0.1 unless told
otherwise) and ``--port``, prints its URL and runs until Ctrl-C.  Which crawl
is chosen as every other ``scrapy banker`` command chooses it
(:func:`~scrapy_banker.ops.commands._common.jobdir_or_fleet`): ``--jobdir
DIR``, else a fleet if one is configured, else the ``JOBDIR`` setting, else
one line saying to give one of them and exit code 2.

* A fleet is found like the crawl finds it: ``REDIS_URL`` (or
  ``REDIS_HOST``/...) and ``BANKER_REDIS_PREFIX`` with ``%(spider)s`` the
  SPIDER argument; it is read through
  :func:`scrapy_banker.ops.fleet_view.read_fleet`, the read model ``scrapy
  banker status`` shows too.  Redis unreachable at start-up is one line on
  stderr and exit code 2; once running, a Redis outage is shown on the page
  (the last numbers, marked stale) and the server keeps trying.
* A single process's JOBDIR is read through
  :func:`scrapy_banker.ops.jobdir_view.read_jobdir` (what ``scrapy banker
  status --jobdir`` shows): pending requests per topic and host, dead
  letters, requests done, how long ago the journal was written.  Reads only:
  no lock is taken, a running crawl is never disturbed.

Actions -- requeue dead letters, and the run-time control of ``scrapy banker
VERB ...`` (the verbs of :data:`~scrapy_banker.core.directives.VERBS`) -- need
``BANKER_DASHBOARD_TOKEN``; without it the dashboard is read-only.  They go
through the same code as the command line (a
:class:`~scrapy_banker.ops.controller.Controller` on the fleet's Redis, a
:class:`~scrapy_banker.ops.controller.JobdirController` on
``JOBDIR/banker/control.json``; :func:`scrapy_banker.ops.jobdir_deadletters.requeue`
for a JOBDIR's dead letters), so the page and the command line accept and
refuse the same things: the verbs a single process cannot carry out (``purge``,
``inject``: the table says which) are neither offered nor accepted for a JOBDIR,
and a JOBDIR's dead letters are not requeued while its crawl runs.
The page also shows the directives in force, the budget counts (a fleet's)
and the latest actions, read with the crawl.  A port in use or a bad option
is one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_banker.ops.commands import CommandError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping

    from scrapy.settings import BaseSettings

    from scrapy_banker.ops.controller import Controller, ControlTarget
    from scrapy_banker.ops.dashboard.web_app import ControlRequest
    from scrapy_banker.ops.jobdir_view import JobdirView
    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

HELP = (
    "Serve a live web dashboard of a Redis fleet or a JOBDIR (read-only unless "
    "BANKER_DASHBOARD_TOKEN)"
)

DEFAULT_PORT = 8765
DEFAULT_BIND = "127.0.0.1"
#: Dead letters shown on the page (the count above the list is exact).
DEAD_LETTERS_SHOWN = 50
#: Latest control actions shown on the page (``scrapy banker control --log N`` for more).
CONTROL_LOG_SHOWN = 20
#: Hosts whose budget counts the page gets, most charged first (a crawl may have millions).
BUDGET_HOSTS_SHOWN = 50
#: A JOBDIR's hosts with the most pending requests the page gets.
JOBDIR_HOSTS_SHOWN = 20
#: Reads of a JOBDIR that a compaction swapped the snapshot under, before the last is kept.
JOBDIR_READ_ATTEMPTS = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scrapy_banker.ops.commands._common import add_target_arguments

    add_target_arguments(parser)
    parser.add_argument(
        "--jobdir",
        metavar="DIR",
        help="a single process's JOBDIR (default: a fleet if REDIS_URL is set, else the "
        "JOBDIR setting)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"TCP port to serve on (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    parser.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="ADDRESS",
        help=f"address to listen on (default {DEFAULT_BIND}: this machine only)",
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often the fleet (or the JOBDIR) is read, whatever the number of viewers "
        "(default 1)",
    )


def _reactor(settings: BaseSettings) -> Any:
    """The installed reactor, or the one the settings name, installed now.

    Scrapy >= 2.14 runs this command without a crawler process, so no
    reactor is installed yet; 2.13 creates one and installs its reactor.
    Any reactor serves a web page; the settings' one is used so that the
    process looks like the project's other commands.
    """
    from scrapy.utils.reactor import install_reactor

    if "twisted.internet.reactor" not in sys.modules:
        path = settings.get("TWISTED_REACTOR")
        if path:
            install_reactor(str(path), settings.get("ASYNCIO_EVENT_LOOP"))
    from twisted.internet import reactor

    return reactor


def read_control(controller: ControlTarget) -> dict[str, Any]:
    """The ``control`` section of ``/api/state``: directives, budgets, the latest actions.

    A control document that cannot be read (not JSON, an unknown field) is
    shown as ``error`` rather than failing the whole read: the rest of the
    crawl is still worth seeing, and the crawl ignores such a document too.
    A fleet's budget counts are in Redis: only the most charged hosts' are
    kept (:data:`BUDGET_HOSTS_SHOWN`) plus every host a directive names;
    ``hosts_total`` and ``held_total`` say how many there are in all.  A
    single process's are read from its JOBDIR's files, as ``control --jobdir`` does.
    """
    from scrapy_banker.core.directives import ControlState

    errors: list[str] = []
    state: ControlState | None
    try:
        state = controller.load()
    except ValueError as exc:  # ControlError: the document holds garbage
        state = None
        errors.append(str(exc))
    except OSError as exc:  # a JOBDIR's control file that cannot be opened
        state = None
        errors.append(f"the control file cannot be read: {exc}")
    counts: dict[str, Any] | None = None
    shown: set[str] = set() if state is None else set(state.hosts)
    try:
        counts = controller.counts_json(state or ControlState())
    except ValueError as exc:  # a count that is not an integer; a JOBDIR with nothing yet
        errors.append(f"budget counts unreadable: {exc}")
    if counts is not None:
        charged: dict[str, int] = counts["hosts"]
        held: dict[str, int] = counts["held"]
        every = set(charged) | set(held)
        ranked = sorted(every, key=lambda h: (-charged.get(h, 0) - held.get(h, 0), h))
        shown |= set(ranked[:BUDGET_HOSTS_SHOWN])
        counts["hosts_total"] = len(every)
        counts["hosts"] = {h: n for h, n in charged.items() if h in shown}
        counts["held"] = {h: n for h, n in held.items() if h in shown}
        counts["held_total"] = sum(held.values())
    rules = controller.config.budgets()
    in_force = state if state is not None else ControlState()
    budgets = {
        "crawl": rules.crawl_budget(in_force),
        "topics": {
            t: b for t in sorted(controller.config.topic_names())
            if (b := rules.topic(t, in_force)) is not None
        },
        "host_default": rules.default,
        "host_patterns": [list(p) for p in rules.patterns],
        # The budget of each host shown: the operator's, else the settings'.
        "hosts": {
            h: b for h in sorted(shown) if (b := rules.host(h, in_force)) is not None
        },
    }  # fmt: skip
    log = controller.log(CONTROL_LOG_SHOWN)
    return {
        "state": None if state is None else state.to_json(),
        "error": "; ".join(errors) or None,
        "counts": counts,
        "budgets": budgets,
        "log": log,
    }


def verb_info(where: str) -> dict[str, Any]:
    """The ``server`` fields of ``/api/state`` that tell the page the operator's verbs.

    ``verbs``: what each verb ``where`` can carry out takes, in words.
    ``control_verbs``: every verb of the table, in its order, with what the
    form needs to offer it (:meth:`~scrapy_banker.core.directives.Verb.to_json`:
    ``name``, ``help``, ``takes_value``, placeholders, ``available`` here).
    """
    from scrapy_banker.core.directives import VERBS, verbs_in

    return {
        "verbs": {v.name: v.usage for v in verbs_in(where)},
        "control_verbs": [v.to_json(where) for v in VERBS.values()],
    }


def _controller(client: Any, settings: BaseSettings, opts: argparse.Namespace) -> Controller:
    """A :class:`Controller` on the crawl's keyspace, built like ``scrapy banker pause``'s."""
    from scrapy_banker.ops.commands._common import redis_settings
    from scrapy_banker.ops.controller import Controller
    from scrapy_banker.redis.frontier import RedisFrontier

    config = _config(settings)
    rconfig = redis_settings(settings, opts)
    frontier = RedisFrontier(
        client, prefix=rconfig.prefix, partitions=rconfig.partitions,
        dedup=rconfig.dedup, dedup_capacity=rconfig.dedup_capacity,
        dedup_error=rconfig.dedup_error,
    )  # fmt: skip
    return Controller.from_settings(frontier, config, settings)


def _config(settings: BaseSettings) -> BankerConfig:
    """The crawl's :class:`~scrapy_banker.settings.BankerConfig`; a bad setting is one line."""
    from scrapy_banker.settings import load_config

    try:
        return load_config(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


@dataclass
class _Source:
    """What the server reads and acts on: a fleet or a JOBDIR, as the page sees it."""

    #: Names the crawl in the printed line (``'banker:myspider'``, ``JOBDIR /path``).
    title: str
    #: The ``server`` fields of ``/api/state`` that depend on the crawl.
    info: dict[str, Any]
    read: Callable[[], dict[str, Any]]
    requeue: Callable[[int | None], int]
    controller: ControlTarget
    #: Where the controller carries actions out (``FLEET``, ``JOBDIR`` of
    #: :mod:`scrapy_banker.core.directives`): the page offers the verbs it can.
    where: str
    #: ``{node: {topic: cumulative pages}}`` of an answer, for the rates.
    pages: Callable[[Mapping[str, Any]], Mapping[str, Mapping[str, int]]] | None = None
    #: What a failed read's error names.
    subject: str = "the fleet"
    close: Callable[[], None] = field(default=lambda: None)


def _fleet_source(settings: BaseSettings, opts: argparse.Namespace) -> _Source:
    """The fleet on Redis; ``CommandError`` if Redis does not answer or a setting is bad."""
    from scrapy_banker.core.directives import FLEET
    from scrapy_banker.ops.commands._common import connect, redis_settings

    node_timeout = redis_settings(settings, opts).node_timeout
    placement_mode = settings.get("BANKER_PLACEMENT") or None
    # Short timeouts, no retries: a start-up against a dead server fails in
    # seconds, and once running each refresh is a fresh attempt anyway.
    client, keyspace = connect(settings, opts)
    controller = _controller(client, settings, opts)

    from scrapy_banker.ops.fleet_deadletters import list_dead_letters, requeue_dead_letters
    from scrapy_banker.ops.fleet_view import read_fleet

    def read() -> dict[str, Any]:
        fleet = read_fleet(
            client, keyspace, node_timeout_s=node_timeout, placement_mode=placement_mode
        )
        letters = (
            list_dead_letters(client, keyspace, limit=DEAD_LETTERS_SHOWN) if fleet.dead else []
        )
        return {
            "fleet": fleet.to_json(),
            "dead_letters": [d.to_json() for d in letters],
            "control": read_control(controller),
        }

    def requeue(count: int | None) -> int:
        letters = list_dead_letters(client, keyspace, limit=count)
        result = requeue_dead_letters(client, keyspace, letters, node_timeout_s=node_timeout)
        return len(result.requeued)

    info = {"mode": "fleet", "prefix": keyspace.prefix, "node_timeout_s": node_timeout}
    return _Source(
        title=repr(keyspace.prefix), info=info, read=read, requeue=requeue,
        controller=controller, where=FLEET, close=client.close,
    )  # fmt: skip


def _stamp(path: str) -> tuple[int, int, int] | None:
    """A file's identity and version: a compaction replaces the snapshot (a new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read_jobdir_view(jobdir: str) -> tuple[JobdirView, float | None]:
    """:func:`~scrapy_banker.ops.jobdir_view.read_jobdir` of a running crawl's JOBDIR,
    and when its snapshot or journal was last written (Unix seconds; None: never).

    A compaction while the files are read (a new snapshot swapped in, the old
    journal deleted) can make one read miss the journal's records: such a
    read, seen by the snapshot's changed identity, is done again.
    """
    from scrapy_banker.ops.jobdir_view import read_jobdir
    from scrapy_banker.scheduler.jobdir import SNAPSHOT

    folder = os.path.join(jobdir, "banker")
    snapshot = os.path.join(folder, SNAPSHOT)
    for _ in range(JOBDIR_READ_ATTEMPTS):
        before = _stamp(snapshot)
        view = read_jobdir(jobdir, top=JOBDIR_HOSTS_SHOWN)
        if _stamp(snapshot) == before:
            break
    written: float | None = None
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name == SNAPSHOT or (
                    entry.name.startswith("journal-") and entry.name.endswith(".jsonl")
                ):
                    try:
                        mtime = entry.stat().st_mtime
                    except OSError:  # deleted by a compaction meanwhile
                        continue
                    written = mtime if written is None else max(written, mtime)
    except OSError:
        pass
    return view, written


def _jobdir_pages(snapshot: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The requests a JOBDIR's journal records as done, as one counter for the rates."""
    view = snapshot.get("jobdir")
    done = view.get("done") if isinstance(view, dict) else None
    return {"process": {"done": done}} if isinstance(done, int) else {}


def _jobdir_source(jobdir: str, settings: BaseSettings) -> _Source:
    """A single process's JOBDIR; ``CommandError`` if it holds no scrapy-banker crawl."""
    from scrapy_banker.core.directives import JOBDIR
    from scrapy_banker.ops import jobdir_deadletters
    from scrapy_banker.ops.controller import JobdirController
    from scrapy_banker.ops.dashboard.web_app import ActionRefused
    from scrapy_banker.scheduler.jobdir import JobdirLocked
    from scrapy_banker.scheduler.serialize import RequestCodec

    config = _config(settings)
    allowed = config.serialize_allowed_classes
    try:
        codec = RequestCodec(allowed)
    except (ValueError, ImportError, NameError) as exc:
        raise CommandError(
            f"BANKER_SERIALIZE_ALLOWED_CLASSES={list(allowed)!r}: cannot load a class ({exc})"
        ) from None
    controller = JobdirController(jobdir, config)
    letters_path = os.path.join(jobdir, jobdir_deadletters.DEADLETTER_FILE)
    # The letters shown, parsed again only when their file changes.
    shown_letters: dict[str, Any] = {"stamp": None, "json": []}

    def dead_letters() -> list[dict[str, Any]]:
        stamp = _stamp(letters_path)
        if stamp != shown_letters["stamp"]:
            letters = jobdir_deadletters.read_letters(jobdir, codec)[:DEAD_LETTERS_SHOWN]
            shown_letters.update(stamp=stamp, json=[d.to_json() for d in letters])
        return list(shown_letters["json"])

    def read() -> dict[str, Any]:
        view, written = read_jobdir_view(jobdir)
        return {
            "fleet": None,
            "jobdir": {
                **view.to_json(),
                # Done: every fingerprint seen, less those still pending
                # (dont_filter requests have none: a few too few, never too many).
                "done": max(0, (view.seen or 0) - view.pending),
                "written_at": written,
            },
            "dead_letters": dead_letters() if view.dead_letters else [],
            "control": read_control(controller),
        }

    def requeue(count: int | None) -> int:
        try:
            outcome = jobdir_deadletters.requeue(jobdir, count, codec)
        except JobdirLocked as exc:  # the crawl runs: what the command says, as a 409
            raise ActionRefused(f"{exc}; nothing requeued") from None
        return len(outcome.plan.requeued)

    info = {"mode": "jobdir", "jobdir": jobdir, "prefix": None, "node_timeout_s": None}
    return _Source(
        title=f"JOBDIR {jobdir}", info=info, read=read, requeue=requeue,
        controller=controller, where=JOBDIR, pages=_jobdir_pages, subject="the JOBDIR",
    )  # fmt: skip


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.ops.commands._common import jobdir_or_fleet, spider_name
    from scrapy_banker.settings import load_ops_config

    if not 0 <= opts.port <= 65535:
        raise CommandError(f"--port must be in [0, 65535], got {opts.port}")
    if not 0.2 <= opts.refresh <= 60:
        raise CommandError(f"--refresh must be between 0.2 and 60 seconds, got {opts.refresh:g}")
    try:
        token = load_ops_config(settings).dashboard_token
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    spider_name(settings, opts, required=False)  # an unknown spider is bad input anyway
    # The same choice, and the same words when there is none, as every command.
    jobdir = jobdir_or_fleet(settings, opts, "nothing to show")
    source = _fleet_source(settings, opts) if jobdir is None else _jobdir_source(jobdir, settings)
    try:
        return _serve(source, opts, settings, token)
    finally:
        source.close()


def _serve(
    source: _Source, opts: argparse.Namespace, settings: BaseSettings, token: str | None
) -> int:
    """Read once, listen, print the URL, serve until Ctrl-C."""
    controller = source.controller
    # One action at a time: two tabs acting at once land one after the other.
    acting = threading.Lock()

    def control(wanted: ControlRequest, who: str) -> dict[str, Any]:
        with acting:
            action = controller.parse(
                wanted.verb, wanted.args, topic=wanted.topic, force=wanted.force
            )
            return controller.execute(action, who=who, now=time.time()).to_json()

    def requeue(count: int | None) -> int:
        with acting:
            return source.requeue(count)

    try:
        first = source.read()  # a broken source shows now, not in the page
    except Exception as exc:
        if source.info["mode"] != "jobdir":
            prefix = source.info["prefix"]
            raise CommandError(f"cannot read the fleet at {prefix!r}: {exc}") from None
        if isinstance(exc, (OSError, ValueError)):
            raise CommandError(str(exc)) from None  # what scrapy banker status --jobdir says
        raise CommandError(f"cannot read {source.title}: {exc}") from None

    reactor = _reactor(settings)
    from twisted.internet.error import CannotListenError

    from scrapy_banker.ops.dashboard.web_app import (
        Actions,
        Dashboard,
        FleetPoller,
        make_site,
        topic_pages,
    )

    info = {
        **source.info,
        "refresh_s": opts.refresh,
        "actions": {
            "enabled": token is not None,
            "requeue": token is not None,
            "pause": token is not None,
            "control": token is not None,
        },
        **verb_info(source.where),
    }
    poller = FleetPoller(
        reactor, source.read, opts.refresh, info, initial=first,
        pages=source.pages or topic_pages, subject=source.subject,
    )  # fmt: skip
    actions = Actions(token=token, requeue=requeue, control=control)
    dashboard = Dashboard(poller, actions, bind=opts.bind)
    try:
        port = reactor.listenTCP(opts.port, make_site(dashboard), interface=opts.bind)
    except CannotListenError as exc:
        raise CommandError(f"cannot listen on {opts.bind}:{opts.port}: {exc.socketError}") from None
    host = port.getHost()
    shown = f"[{host.host}]" if ":" in host.host else host.host
    url = f"http://{shown}:{host.port}/"
    mode = "actions enabled (token set)" if token else "read-only: set BANKER_DASHBOARD_TOKEN"
    sys.stdout.write(f"scrapy-banker dashboard for {source.title}: {url} ({mode})\n")
    sys.stdout.flush()
    if opts.bind not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "The dashboard listens on %s: anyone who can reach it sees the crawl", opts.bind
        )
    reactor.callWhenRunning(poller.start)
    reactor.addSystemEventTrigger("before", "shutdown", poller.stop)
    reactor.run()
    return 0
