"""``scrapy banker dashboard [SPIDER]``: the live fleet dashboard in a browser.

Serves :mod:`scrapy_banker.ops.dashboard` on ``--bind`` (127.0.0.1 unless told
otherwise) and ``--port``, prints its URL and runs until Ctrl-C.  The fleet is
found like the crawl finds it: ``REDIS_URL`` (or ``REDIS_HOST``/...) and
``BANKER_REDIS_PREFIX`` with ``%(spider)s`` the SPIDER argument; it is read
through :func:`scrapy_banker.ops.fleet_view.read_fleet`, the read model
``scrapy banker status`` shows too.  Redis unreachable at start-up, a port in
use or a bad option is one line on stderr and exit code 2; once running, a
Redis outage is shown on the page (the last numbers, marked stale) and the
server keeps trying.

Actions -- requeue dead letters, and the run-time control of ``scrapy banker
pause|resume|limit|delay|budget|purge|inject`` (one
:class:`~scrapy_banker.ops.control.Controller`, so the page and the command
line accept and refuse the same things) -- need ``BANKER_DASHBOARD_TOKEN``;
without it the dashboard is read-only.  The page also shows the directives
in force, the budget counts and the latest actions, read with the fleet.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from scrapy_banker.ops.commands import CommandError

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import BaseSettings

    from scrapy_banker.ops.control import Controller
    from scrapy_banker.ops.dashboard.server import ControlRequest

logger = logging.getLogger(__name__)

HELP = "Serve a live web dashboard of a Redis fleet (read-only unless BANKER_DASHBOARD_TOKEN)"

DEFAULT_PORT = 8765
DEFAULT_BIND = "127.0.0.1"
#: Dead letters shown on the page (the count above the list is exact).
DEAD_LETTERS_SHOWN = 50
#: Latest control actions shown on the page (``scrapy banker control --log N`` for more).
CONTROL_LOG_SHOWN = 20
#: Hosts whose budget counts the page gets, most charged first (a crawl may have millions).
BUDGET_HOSTS_SHOWN = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scrapy_banker.ops.commands._common import add_target_arguments

    add_target_arguments(parser)
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
        help="how often the fleet is read from Redis, whatever the number of viewers (default 1)",
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


def read_control(controller: Controller) -> dict[str, Any]:
    """The ``control`` section of ``/api/state``: directives, budgets, the latest actions.

    A control document that cannot be read (not JSON, an unknown field) is
    shown as ``error`` rather than failing the whole read: the rest of the
    fleet is still worth seeing, and the workers ignore such a document too.
    Only the most charged hosts' counts are kept (:data:`BUDGET_HOSTS_SHOWN`)
    plus every host a directive names; ``hosts_total`` and ``held_total``
    say how many there are in all.
    """
    from scrapy_banker.core.control import ControlState

    channel = controller.channel
    errors: list[str] = []
    state: ControlState | None
    try:
        state = channel.load()
    except ValueError as exc:  # ControlError: the document holds garbage
        state = None
        errors.append(str(exc))
    counts: dict[str, Any] | None
    shown: set[str] = set() if state is None else set(state.hosts)
    try:
        counts = channel.counts().to_json()
    except ValueError as exc:  # a count that is not an integer
        counts = None
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
    return {
        "state": None if state is None else state.to_json(),
        "error": "; ".join(errors) or None,
        "counts": counts,
        "budgets": budgets,
        "log": channel.log(CONTROL_LOG_SHOWN),
    }


def _controller(client: Any, settings: BaseSettings, opts: argparse.Namespace) -> Controller:
    """A :class:`Controller` on the crawl's keyspace, built like ``scrapy banker pause``'s."""
    from scrapy_banker.ops.commands._common import redis_settings
    from scrapy_banker.ops.control import Controller
    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.settings import load_config

    try:
        config = load_config(settings)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    rconfig = redis_settings(settings, opts)
    frontier = RedisFrontier(
        client, prefix=rconfig.prefix, partitions=rconfig.partitions,
        dedup=rconfig.dedup, dedup_capacity=rconfig.dedup_capacity,
        dedup_error=rconfig.dedup_error,
    )  # fmt: skip
    return Controller.from_settings(frontier, config, settings)


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    from scrapy_banker.settings import load_ops_config

    if not 0 <= opts.port <= 65535:
        raise CommandError(f"--port must be in [0, 65535], got {opts.port}")
    if not 0.2 <= opts.refresh <= 60:
        raise CommandError(f"--refresh must be between 0.2 and 60 seconds, got {opts.refresh:g}")
    try:
        token = load_ops_config(settings).dashboard_token
    except ValueError as exc:
        raise CommandError(str(exc)) from None
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

    # One action at a time: two tabs acting at once land one after the other.
    acting = threading.Lock()

    def control(wanted: ControlRequest, who: str) -> dict[str, Any]:
        with acting:
            action = controller.parse(
                wanted.verb, wanted.args, topic=wanted.topic, force=wanted.force
            )
            return controller.execute(action, who=who, now=time.time()).to_json()

    try:
        first = read()  # a broken server shows now, not in the page
    except Exception as exc:
        raise CommandError(f"cannot read the fleet at {keyspace.prefix!r}: {exc}") from None

    reactor = _reactor(settings)
    from twisted.internet.error import CannotListenError

    from scrapy_banker.core.control import VERBS
    from scrapy_banker.ops.dashboard.server import Actions, Dashboard, FleetPoller, make_site

    info = {
        "prefix": keyspace.prefix,
        "refresh_s": opts.refresh,
        "node_timeout_s": node_timeout,
        "actions": {
            "enabled": token is not None,
            "requeue": token is not None,
            "pause": token is not None,
            "control": token is not None,
        },
        # What each control verb takes, for the page's form.
        "verbs": dict(VERBS),
    }
    poller = FleetPoller(reactor, read, opts.refresh, info, initial=first)
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
    sys.stdout.write(f"scrapy-banker dashboard for {keyspace.prefix!r}: {url} ({mode})\n")
    sys.stdout.flush()
    if opts.bind not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "The dashboard listens on %s: anyone who can reach it sees the fleet", opts.bind
        )
    reactor.callWhenRunning(poller.start)
    reactor.addSystemEventTrigger("before", "shutdown", poller.stop)
    reactor.run()
    client.close()
    return 0
