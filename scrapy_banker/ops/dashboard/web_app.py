"""The dashboard's web server: the page, ``GET /api/state`` and the token-guarded actions.

The actions are requeueing dead letters (``POST /api/deadletters/requeue``)
and the run-time control of the crawl (``POST /api/control``: the verbs of
:data:`~scrapy_banker.core.directives.VERBS`), the same checked actions as ``scrapy
banker pause ...`` (:class:`~scrapy_banker.ops.controller.Controller` for a
fleet, :class:`~scrapy_banker.ops.controller.JobdirController` for a single
process's JOBDIR).  The server does not know which: the command hands it a
``read`` function and the blocking calls behind each action.

Why it is built this way:

* **One read per interval.**  A :class:`FleetPoller` reads the fleet (or a
  JOBDIR) on a thread (``deferToThread``: a Redis round trip or a replay of
  the journal never blocks the reactor) once per refresh interval, never two
  reads at a time, and keeps the JSON answer ready; ten open tabs cost Redis
  what one costs.  The readings also
  feed :class:`~scrapy_banker.ops.dashboard.history.RateHistory`, so a page
  opened mid-crawl already shows the pages/s of the minutes before.
* **Read-only unless a token says otherwise.**  ``GET`` never changes
  anything.  Every ``POST`` is refused with 403 when no
  ``BANKER_DASHBOARD_TOKEN`` is configured, with 401 when the request's
  ``Authorization: Bearer`` token is missing or wrong (compared in constant
  time).  A bearer header, unlike a cookie, is never sent by the browser on
  its own, so another site cannot make a visitor's browser post an action.
* **Localhost by default.**  When bound to a loopback address the server
  also refuses requests whose ``Host`` header names anything else: a web
  page that rebinds its own DNS name to 127.0.0.1 cannot read the fleet's
  state through the visitor's browser.
* **Nothing from the internet.**  The page, its script and style sheet are
  package data, served from a fixed list of names (no directory listing, no
  path from the request ever reaches the file system).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import time
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from twisted.internet import defer, threads
from twisted.internet.task import LoopingCall
from twisted.web import resource, server

from scrapy_banker.core.directives import ControlError
from scrapy_banker.ops.dashboard.history import RateHistory

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from twisted.python.failure import Failure

#: Twisted's web request is untyped: ``Any`` keeps mypy --strict's
#: no-untyped-call check from flagging every ``setHeader``.
Request = Any

__all__ = [
    "ACTIONS_DISABLED",
    "ActionRefused",
    "Actions",
    "ControlRequest",
    "Dashboard",
    "FleetPoller",
    "make_site",
    "topic_pages",
]

logger = logging.getLogger(__name__)

#: The 403 body of every POST when no token is configured.
ACTIONS_DISABLED = "actions disabled: set BANKER_DASHBOARD_TOKEN"
#: Bump when a field of ``/api/state`` changes meaning.
API_VERSION = 1
#: Largest POST body read (an action's arguments are a few bytes).
MAX_BODY = 4096
#: Largest ``POST /api/control`` body: ``inject`` carries URLs, a few hundred at most.
MAX_CONTROL_BODY = 64 * 1024

_STATIC: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
}

_SECURITY_HEADERS = {
    b"X-Content-Type-Options": b"nosniff",
    b"X-Frame-Options": b"DENY",
    b"Referrer-Policy": b"no-referrer",
    # Only our own script, style and images; no inline script, no fetch elsewhere.
    b"Content-Security-Policy": (
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
}


def topic_pages(snapshot: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """``{node: {topic: cumulative pages}}`` from the nodes' published telemetry.

    ``snapshot["fleet"]`` is :meth:`FleetView.to_json()
    <scrapy_banker.ops.fleet_view.FleetView.to_json>`.  A node without
    telemetry (not published yet, or expired) contributes nothing;
    :class:`RateHistory` keeps the counts it had.
    """
    fleet = snapshot.get("fleet")
    out: dict[str, dict[str, int]] = {}
    for node in (fleet.get("nodes") if isinstance(fleet, dict) else None) or ():
        sample = node.get("telemetry") if isinstance(node, dict) else None
        if not isinstance(sample, dict):
            continue
        name = str(node.get("name") or sample.get("node") or "?")
        topics = sample.get("topics")
        if isinstance(topics, dict):
            out[name] = {
                str(topic): t["pages"]
                for topic, t in topics.items()
                if isinstance(t, dict) and isinstance(t.get("pages"), int)
            }
    return out


class ActionRefused(Exception):
    """An action the crawl's state forbids now (409): a JOBDIR a running crawl holds.

    Unlike :class:`~scrapy_banker.core.directives.ControlError` (the request is
    wrong, 400) the same request may succeed later; nothing changed.
    """


class FleetPoller:
    """Reads the crawl once per ``refresh_s`` on a thread; serves the last answer.

    ``read()`` returns the sections of the answer (``{"fleet": ...,
    "dead_letters": [...]}``, or ``{"jobdir": ...}`` for a single process),
    JSON-ready; ``initial`` is a first answer already read (the command reads
    once before it listens, so the first page load has numbers).  ``info`` is
    merged into every answer under ``"server"`` (what the page needs to know
    about this server: mode, prefix or JOBDIR, refresh, whether actions are
    on).  ``pages`` turns an answer into the cumulative counters the rates
    come from (``{node: {topic: pages}}``; :func:`topic_pages` for a fleet);
    ``subject`` names what is read in the error of a failed read.  A failed
    read keeps the last good answer and reports the error with it: the page
    then shows the numbers as stale instead of going blank.
    """

    def __init__(
        self,
        reactor: Any,
        read: Callable[[], Mapping[str, Any]],
        refresh_s: float,
        info: Mapping[str, Any],
        history: RateHistory | None = None,
        clock: Callable[[], float] = time.time,
        initial: Mapping[str, Any] | None = None,
        pages: Callable[[Mapping[str, Any]], Mapping[str, Mapping[str, int]]] = topic_pages,
        subject: str = "the fleet",
    ) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s!r}")
        self.reactor = reactor
        self.read = read
        self.refresh_s = refresh_s
        self.info = dict(info)
        self.history = history or RateHistory()
        self.clock = clock
        self.pages = pages
        self.subject = subject
        self.reads = 0
        self._snapshot: Mapping[str, Any] = {"fleet": None}
        self._read_at: float | None = None
        self._error: str | None = None
        self._pending: defer.Deferred[None] | None = None
        self._body = b""
        self._loop = LoopingCall(self.poll)
        self._loop.clock = reactor
        if initial is not None:
            self._read_ok(initial)
        else:
            self._render()

    def start(self) -> defer.Deferred[None]:
        """Read every interval from now on (and at once unless a first answer was given)."""
        self._loop.start(self.refresh_s, now=False)
        return self.poll() if self.reads == 0 else defer.succeed(None)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def poll(self) -> defer.Deferred[None]:
        """One read, unless one is still running (a slow Redis never stacks reads)."""
        if self._pending is not None:
            return self._pending
        d: defer.Deferred[Mapping[str, Any]] = threads.deferToThreadPool(
            self.reactor, self.reactor.getThreadPool(), self.read
        )
        pending = d.addCallbacks(self._read_ok, self._read_failed)
        self._pending = pending

        def done(_: None) -> None:
            self._pending = None

        pending.addBoth(done)
        return pending

    def _read_ok(self, snapshot: Mapping[str, Any]) -> None:
        now = self.clock()
        if self._error is not None:
            logger.info("%s readable again", self.subject.capitalize())
        self._snapshot, self._read_at, self._error = snapshot, now, None
        self.reads += 1
        try:
            self.history.observe(now, self.pages(snapshot))
        except (TypeError, ValueError, AttributeError) as exc:
            logger.warning("Telemetry not understood, no rates this time: %r", exc)
        self._render()

    def _read_failed(self, failure: Failure) -> None:
        message = failure.getErrorMessage() or repr(failure.value)
        error = f"reading {self.subject} failed: {message}"
        if error != self._error:  # once per distinct error, not once per second
            logger.warning("%s", error)
        self._error = error
        self._render()

    def _render(self) -> None:
        state = {
            "version": API_VERSION,
            "server": self.info,
            "now": round(self.clock(), 3),
            "read_at": self._read_at,
            "reads": self.reads,
            "error": self._error,
            **self._snapshot,
            "rates": self.history.to_json(),
        }
        self._body = json.dumps(state, separators=(",", ":"), default=str).encode()

    def body(self) -> bytes:
        """The latest ``/api/state`` answer, serialized once per read."""
        return self._body


@dataclass(frozen=True)
class ControlRequest:
    """The body of ``POST /api/control``: an operator's words, not checked yet.

    Only the shape is checked here (what JSON type each field has); what the
    words mean -- a known host, a budget >= 0, a topic of the crawl -- is the
    :class:`~scrapy_banker.ops.controller.Controller`'s to judge, as on the
    command line, so the two never accept different things.
    """

    verb: str
    args: tuple[str, ...] = ()
    #: The topic of ``inject``.
    topic: str | None = None
    #: Act on a host the crawl has not queued a request of (``--force``).
    force: bool = False

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ControlRequest:
        """From the decoded body; :class:`ControlError` names the field that is wrong."""
        unknown = sorted(set(body) - {"verb", "args", "topic", "force"})
        if unknown:
            raise ControlError(f"unknown fields {unknown}; allowed: verb, args, topic, force")
        verb = body.get("verb")
        if not isinstance(verb, str) or not verb:
            raise ControlError(f'"verb" must be a non-empty string, got {verb!r}')
        args = body.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ControlError(f'"args" must be a list of strings, got {args!r}')
        topic = body.get("topic")
        if topic is not None and not isinstance(topic, str):
            raise ControlError(f'"topic" must be a string or null, got {topic!r}')
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise ControlError(f'"force" must be true or false, got {force!r}')
        return cls(verb, tuple(args), topic or None, force)


@dataclass(frozen=True)
class Actions:
    """What ``POST`` may do: the token, and the blocking calls behind each action.

    The calls block (Redis round trips, a JOBDIR's files): the server runs
    them on the reactor's thread pool, never on the reactor thread.  Either
    may raise :class:`ActionRefused` (answered 409, nothing changed).
    """

    token: str | None
    #: ``requeue(count)`` moves ``count`` dead letters (``None``: all) back to
    #: their queues and returns how many moved.
    requeue: Callable[[int | None], int] | None = None
    #: ``control(request, who)`` checks and carries out an operator's action and
    #: returns its outcome as JSON; :class:`ControlError` when the input is bad
    #: (nothing changed then).
    control: Callable[[ControlRequest, str], Mapping[str, Any]] | None = None

    @property
    def enabled(self) -> bool:
        return self.token is not None


def _loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _host_of(header: str) -> str:
    """``Host`` header -> host name, without the port (IPv6 brackets removed)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Dashboard(resource.Resource):
    """The whole site in one leaf resource: a fixed routing table, no traversal."""

    isLeaf = True

    def __init__(self, poller: FleetPoller, actions: Actions, bind: str = "127.0.0.1") -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.poller = poller
        self.actions = actions
        self.local_only = _loopback(bind)

    # -- plumbing -----------------------------------------------------------------

    def _headers(self, request: Request, content_type: str, status: int = 200) -> None:
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", content_type.encode())
        for name, value in _SECURITY_HEADERS.items():
            request.setHeader(name, value)

    def _json(self, request: Request, status: int, data: Mapping[str, Any]) -> bytes:
        self._headers(request, "application/json", status)
        request.setHeader(b"Cache-Control", b"no-store")
        return json.dumps(data, separators=(",", ":")).encode()

    def _error(self, request: Request, status: int, message: str) -> bytes:
        return self._json(request, status, {"error": message})

    def _host_ok(self, request: Request) -> bool:
        if not self.local_only:
            return True
        raw = request.getHeader(b"host")
        host = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw or "")
        return _host_of(host) in _LOCAL_HOSTS

    def render(self, request: Request) -> bytes | int:
        path = (request.path or b"/").decode("utf-8", errors="replace")
        if not self._host_ok(request):
            return self._error(request, 403, "unexpected Host header (the dashboard is local)")
        method = request.method
        if method in (b"GET", b"HEAD"):
            return self._get(request, path)
        if method == b"POST":
            return self._post(request, path)
        request.setHeader(b"Allow", b"GET, HEAD, POST")
        return self._error(request, 405, "method not allowed")

    # -- GET: never changes anything ------------------------------------------------

    def _get(self, request: Request, path: str) -> bytes:
        if path == "/api/state":
            self._headers(request, "application/json")
            request.setHeader(b"Cache-Control", b"no-store")
            return self.poller.body()
        static = _STATIC.get(path)
        if static is None:
            return self._error(request, 404, "not found")
        name, content_type = static
        data = resources.files("scrapy_banker.ops.dashboard").joinpath("static", name).read_bytes()
        self._headers(request, content_type)
        request.setHeader(b"Cache-Control", b"no-cache")
        return data

    # -- POST: actions, token first --------------------------------------------------

    def _authorized(self, request: Request) -> bool:
        token = self.actions.token
        assert token is not None
        raw = request.getHeader(b"authorization")
        header = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw or "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), token.encode())

    def _post(self, request: Request, path: str) -> bytes | int:
        if not self.actions.enabled:
            return self._error(request, 403, ACTIONS_DISABLED)
        if not self._authorized(request):
            request.setHeader(b"WWW-Authenticate", b'Bearer realm="scrapy-banker dashboard"')
            return self._error(request, 401, "missing or wrong token (Authorization: Bearer …)")
        if path == "/api/deadletters/requeue":
            return self._requeue(request)
        if path == "/api/control":
            return self._control(request)
        return self._error(request, 404, "no such action")

    def _body(self, request: Request, limit: int = MAX_BODY) -> dict[str, Any]:
        assert request.content is not None
        raw = request.content.read(limit + 1)
        if len(raw) > limit:
            raise _TooLarge(f"body too large (more than {limit} bytes)")
        if not raw.strip():
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        return data

    def _requeue(self, request: Request) -> bytes | int:
        requeue = self.actions.requeue
        if requeue is None:
            return self._error(request, 501, "requeue is not available")
        try:
            body = self._body(request)
        except ValueError as exc:
            return self._error(request, 400, f"bad request body: {exc}")
        raw = body.get("count", "all")
        count: int | None
        if raw == "all":
            count = None
        elif isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
            count = raw
        else:
            message = f'"count" must be an integer >= 1 or "all", not {raw!r}'
            return self._error(request, 400, message)
        logger.info("Requeue of %s dead letters requested from the dashboard", raw)
        d = threads.deferToThreadPool(
            self.poller.reactor, self.poller.reactor.getThreadPool(), requeue, count
        )
        finished = [False]
        request.notifyFinish().addErrback(lambda _: finished.__setitem__(0, True))

        def ok(n: int) -> None:
            logger.info("Requeued %d dead letters", n)
            self.poller.poll()  # show the result at the next refresh, not a second later
            if not finished[0]:
                request.write(self._json(request, 200, {"requeued": int(n)}))
                request.finish()

        def failed(failure: Failure) -> None:
            if isinstance(failure.value, ActionRefused):  # not now: nothing changed
                logger.info("Requeue refused: %s", failure.getErrorMessage())
                if not finished[0]:
                    request.write(self._error(request, 409, failure.getErrorMessage()))
                    request.finish()
                return
            logger.warning("Requeue failed: %s", failure.getErrorMessage())
            if not finished[0]:
                request.write(
                    self._error(request, 503, f"requeue failed: {failure.getErrorMessage()}")
                )
                request.finish()

        d.addCallbacks(ok, failed)
        return server.NOT_DONE_YET

    def _control(self, request: Request) -> bytes | int:
        """``POST /api/control``: an operator's action, checked and carried out on a thread."""
        control = self.actions.control
        if control is None:
            return self._error(request, 501, "run-time control is not available")
        try:
            body = self._body(request, MAX_CONTROL_BODY)
        except _TooLarge as exc:
            return self._error(request, 413, str(exc))
        except ValueError as exc:
            return self._error(request, 400, f"bad request body: {exc}")
        try:
            wanted = ControlRequest.from_json(body)
        except ControlError as exc:
            return self._error(request, 400, f"bad request body: {exc}")
        who = f"dashboard {_peer(request)}"
        d = threads.deferToThreadPool(
            self.poller.reactor, self.poller.reactor.getThreadPool(), control, wanted, who
        )
        finished = [False]
        request.notifyFinish().addErrback(lambda _: finished.__setitem__(0, True))

        def answer(status: int, data: Mapping[str, Any]) -> None:
            if not finished[0]:
                request.write(self._json(request, status, data))
                request.finish()

        def ok(outcome: Mapping[str, Any]) -> None:
            self.poller.poll()  # the page shows the new directives at its next refresh
            answer(200, outcome)

        def failed(failure: Failure) -> None:
            if isinstance(failure.value, ControlError):  # bad input: nothing changed
                logger.info("Control refused (%s): %s", who, failure.getErrorMessage())
                answer(400, {"error": failure.getErrorMessage()})
                return
            if isinstance(failure.value, ActionRefused):  # not now: nothing changed
                logger.info("Control refused (%s): %s", who, failure.getErrorMessage())
                answer(409, {"error": failure.getErrorMessage()})
                return
            logger.warning("Control failed (%s): %s", who, failure.getErrorMessage())
            answer(503, {"error": f"control failed: {failure.getErrorMessage()}"})

        d.addCallbacks(ok, failed)
        return server.NOT_DONE_YET


class _TooLarge(ValueError):
    """A POST body over its limit (413, not 400: the request may be fine, only too big)."""


def _peer(request: Request) -> str:
    """The client's address, for the action log (a proxy in front shows as itself)."""
    address = request.getClientAddress()
    host = getattr(address, "host", None)
    return str(host) if host else "unknown"


def make_site(dashboard: Dashboard) -> server.Site:
    """A :class:`~twisted.web.server.Site` without Twisted's access log on stdout."""
    site = server.Site(dashboard)  # type: ignore[no-untyped-call]
    site.displayTracebacks = False
    site.log = lambda request: None  # type: ignore[method-assign]
    return site
