"""The farm's HTTP server: a lean HTTP/1.1 server for a :class:`FarmModel` on Twisted.

:class:`FarmServer` holds the server-wide state: it dispatches on the ``Host``
header (generated hosts from the model, static sites from
:mod:`~scrapy_banker.testing.farm.static`), injects delays with ``callLater``
(never by sleeping) and keeps the bookkeeping counters (per host requests,
maximum in-flight requests per host, per crawler node) that politeness and
network-awareness tests need.  :class:`FarmProtocol` is a hand-written
protocol rather than ``twisted.web`` because the benchmarks need several
thousand pages per second from one core.

Push-back (``FarmConfig.rate_limits``, ``bursts``, ``crawl_delays`` and
their static-site twins) is decided at receipt time by the model's
:class:`~scrapy_banker.testing.farm.pushback.PushbackTracker`: a refused
request is answered ``429`` (with ``Retry-After`` when the host announces
one) or ``503`` after the host's base latency only, and still counts in
``requests``, ``per_host``, ``fetches`` and ``statuses``.  ``stats()`` adds
``refused``, ``retry_after_violations``, ``crawl_delay_violations`` and
``robots_fetches`` (totals) with a ``<name>_per_host`` dict each, and
``refused_urls`` (URL -> refusals) next to ``fetches``; a page whose
``fetches`` equal its ``refused_urls`` was only ever refused.

This module is the child process's entry point
(:class:`~scrapy_banker.testing.farm.launcher.WebFarm` starts it).  Run
``python -m scrapy_banker.testing.farm.server --config-json '{"hosts": 5}'``
to serve a farm by hand; it prints ``LISTENING <port>`` once it accepts
connections.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Protocol, cast
from urllib.parse import parse_qs, urlsplit

from twisted.internet import protocol
from twisted.python.failure import Failure

from scrapy_banker.testing.farm.model import (
    _REASONS,
    NODE_HEADER,
    STATS_PREFIX,
    FarmConfig,
    FarmModel,
    _status_body,
)
from scrapy_banker.testing.farm.pushback import ROBOTS_PATH
from scrapy_banker.testing.farm.static import StaticSite

logger = logging.getLogger(__name__)

__all__ = ["FarmFactory", "FarmProtocol", "FarmServer", "main"]

_NODE_HEADER_LOWER: Final = NODE_HEADER.lower().encode()
_HTML: Final = b"text/html; charset=utf-8"
_JSON: Final = b"application/json"
_TEXT: Final = b"text/plain; charset=utf-8"
_XML: Final = b"application/xml"
#: A generated host's sitemap, served when its pages change (``page_changes``).
SITEMAP_PATH: Final = "/sitemap.xml"


def _response(
    status: int,
    body: bytes,
    content_type: bytes,
    keep_alive: bool,
    http10: bool,
    head: bool,
    headers: bytes = b"",
) -> bytes:
    connection = (
        b""
        if keep_alive and not http10
        else (b"Connection: keep-alive\r\n" if keep_alive else b"Connection: close\r\n")
    )
    header = (
        b"HTTP/1.1 %d %s\r\nServer: scrapy-banker-farm\r\nContent-Type: %s\r\n"
        b"Content-Length: %d\r\n%s%s\r\n"
        % (status, _REASONS.get(status, b"Error"), content_type, len(body), headers, connection)
    )
    return header if head else header + body


class _DelayedCall(Protocol):
    # Structural stand-ins for Twisted's zope interfaces, which mypy cannot
    # check without the zope plugin.
    def active(self) -> bool: ...
    def cancel(self) -> None: ...


class _Clock(Protocol):
    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object
    ) -> _DelayedCall: ...


class _Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def loseConnection(self) -> None: ...
    def setTcpNoDelay(self, enabled: bool) -> None: ...


class _Answer:
    __slots__ = ("body", "content_type", "delay", "headers", "host", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        delay: float = 0.0,
        host: str | None = None,
        content_type: bytes = _HTML,
        headers: bytes = b"",
    ) -> None:
        self.status = status
        self.body = body
        self.delay = delay
        self.host = host
        self.content_type = content_type
        #: Extra header lines, each ending in CRLF (``Retry-After``).
        self.headers = headers


class FarmServer:
    """Server-wide state: the model, cached bodies and bookkeeping counters.

    Separated from the protocol so dispatch logic is testable without
    sockets, and so one instance can be shared by all connections.
    """

    #: Bodies are cached because rendering dominates the cost of a request.
    max_cached_bodies = 200_000

    def __init__(self, model: FarmModel, clock: _Clock, port: int = 0) -> None:
        self.model = model
        self.clock = clock
        self.port = port
        self._bodies: dict[tuple[int, str], tuple[int, bytes, float]] = {}
        self._sites: dict[str, StaticSite] = {}
        #: Receipt-time push-back decisions and counters (reset by :meth:`reset`).
        self.pushback = model.pushback_tracker()
        self.reset()

    def reset(self) -> None:
        """Forget counters, transient-error and push-back memory: as if freshly started.

        In-flight requests are kept (they will still be answered), so the
        maxima restart from the current in-flight numbers.  Rate-limit
        windows, announced Retry-After periods, burst counts and the burst
        clock start afresh.
        """
        self.pushback.reset()
        self.refused_urls: dict[str, int] = {}
        self.requests = 0
        #: Bytes of every site's answer written (status line, headers and body).
        self.bytes_sent = 0
        self.per_host: dict[str, int] = {}
        self.per_node: dict[str, int] = {}
        self.statuses: dict[int, int] = {}
        self.fetches: dict[str, int] = {}
        self._transient_seen: set[tuple[int, str]] = set()
        inflight: dict[str, int] = getattr(self, "inflight", {})
        self.inflight = {h: n for h, n in inflight.items() if n > 0}
        self.max_inflight = dict(self.inflight)
        #: Monotonic times of the first request received and the last answer sent.
        self.first_at: float | None = None
        self.last_done_at: float | None = None
        #: ``[seconds since the first request, in flight, {host: in flight}]``.
        self.samples: list[list[Any]] = []
        #: Host -> seconds since the first request at which its last answer left.
        self.host_done: dict[str, float] = {}
        #: Host -> ``[wall time, +1 (received) or -1 (answered)]``, in order: when
        #: each request arrived and left (what an operator's pause or limit changed).
        self.host_events: dict[str, list[tuple[float, int]]] = {}
        #: Changing pages: when their clock started (monotonic), and, per page
        #: URL, the seconds on it at which a copy was served (200) or confirmed (304).
        self.changes_t0 = time.monotonic()
        self.page_fetches: dict[str, list[float]] = {}

    def sample(self) -> None:
        """Record the requests in flight now (called every ``sample_interval_s``)."""
        if self.first_at is None:
            return
        busy = {h: n for h, n in self.inflight.items() if n > 0}
        self.samples.append([round(time.monotonic() - self.first_at, 3), sum(busy.values()), busy])

    def enter(self, host: str) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.host_events.setdefault(host, []).append((time.time(), 1))
        n = self.inflight.get(host, 0) + 1
        self.inflight[host] = n
        if n > self.max_inflight.get(host, 0):
            self.max_inflight[host] = n

    def leave(self, host: str) -> None:
        self.host_events.setdefault(host, []).append((time.time(), -1))
        self.inflight[host] -= 1
        now = self.last_done_at = time.monotonic()
        if self.first_at is not None:
            self.host_done[host] = round(now - self.first_at, 3)

    def stats(self, urls: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "bytes_sent": self.bytes_sent,
            "per_host": dict(self.per_host),
            "max_inflight_per_host": dict(self.max_inflight),
            "inflight": {h: n for h, n in self.inflight.items() if n},
            "per_node": dict(self.per_node),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            # From the first request received to the last answer sent: the crawl's
            # span as the sites saw it (no process start-up, no idle-close wait).
            "host_done_s": dict(self.host_done),
            "span_s": (
                None
                if self.first_at is None or self.last_done_at is None
                else round(self.last_done_at - self.first_at, 4)
            ),
        }
        out.update(self.pushback.stats())
        if self.model.changes is not None:
            out["changes_clock_s"] = round(time.monotonic() - self.changes_t0, 4)
            out["page_fetches"] = {u: list(t) for u, t in self.page_fetches.items()}
        if urls:
            out["fetches"] = dict(self.fetches)
            out["refused_urls"] = dict(self.refused_urls)
            out["host_events"] = {h: list(e) for h, e in self.host_events.items()}
        return out

    def _cached(self, i: int, path: str) -> tuple[int, bytes, float]:
        key = (i, path)
        hit = self._bodies.get(key)
        if hit is None:
            status, body, _ = self.model.page(i, path, self.port)
            # The node-independent part of the delay: bandwidth (+ timeout).
            extra = self.model.bandwidth_delay_s(i, len(body))
            if self.model.fault(i, path) == "timeout":
                extra += self.model.config.timeout_s
            if len(self._bodies) >= self.max_cached_bodies:
                self._bodies.clear()
            hit = self._bodies[key] = (status, body, extra)
        return hit

    def _static(self, hostname: str) -> StaticSite | None:
        root = self.model.config.static_sites.get(hostname)
        if root is None:
            return None
        site = self._sites.get(hostname)
        if site is None:
            site = self._sites[hostname] = StaticSite(root)
        return site

    def handle(
        self,
        target: str,
        host_header: str,
        node: str | None,
        method: str = "GET",
        if_none_match: str | None = None,
    ) -> _Answer:
        """Answer one request; counters and push-back are updated at receipt time.

        Generated hosts answer GET and HEAD (405 otherwise); static sites
        answer POST like GET.  A host that pushes back refuses before any
        of that (any method), and a generated host with a Crawl-delay
        serves its ``/robots.txt``.  With ``page_changes`` configured, a
        generated page carries its version in its text and as an ``ETag``,
        and ``If-None-Match`` with the current one is answered ``304``.
        """
        if target.startswith(("http://", "https://")):  # absolute-form (proxies)
            parts = urlsplit(target)
            host_header = parts.netloc
            target = parts.path + (f"?{parts.query}" if parts.query else "")
        path, _, query = target.partition("?")
        if path.startswith(STATS_PREFIX):
            return self._bookkeeping(path, query)
        hostname = host_header.rsplit(":", 1)[0] if ":" in host_header else host_header
        hostname = hostname.strip().rstrip(".").lower()
        self.requests += 1
        self.per_host[hostname] = self.per_host.get(hostname, 0) + 1
        url = f"http://{hostname}:{self.port}{target}"
        self.fetches[url] = self.fetches.get(url, 0) + 1
        if node is not None:
            self.per_node[node] = self.per_node.get(node, 0) + 1
        pushback = self.pushback
        site = self._static(hostname)
        i = None if site is not None else self.model.host_index(hostname)
        refusal = None
        if pushback.active or path == ROBOTS_PATH:
            if i is not None:
                base = self.model.latency_ms(i, node)
            else:
                cfg = self.model.config
                base = cfg.static_latency_ms.get(hostname, cfg.latency_ms)
            refusal = pushback.receive(
                hostname, path, time.monotonic(), time.time(), reply_s=base / 1000.0, node=node
            )
        if refusal is not None:
            retry_after = (
                b""
                if refusal.retry_after is None
                else b"Retry-After: %s\r\n" % refusal.retry_after.encode("latin-1")
            )
            body = _status_body(refusal.status, f"{hostname}{path}")
            answer = _Answer(refusal.status, body, base / 1000.0, hostname, headers=retry_after)
            self.refused_urls[url] = self.refused_urls.get(url, 0) + 1
        elif site is not None:
            status, body, ctype = site.answer(path)
            delay = self.model.config.static_latency_ms.get(hostname, self.model.config.latency_ms)
            answer = _Answer(status, body, delay / 1000.0, hostname, ctype)
        elif method not in ("GET", "HEAD"):
            answer = _Answer(405, _status_body(405, method), host=hostname)
        elif i is None:
            answer = _Answer(404, _status_body(404, f"unknown host {hostname}"), host=hostname)
        elif path == SITEMAP_PATH and self.model.changes is not None:
            body = self._sitemap(i, hostname)
            delay = self.model.latency_ms(i, node) / 1000.0
            answer = _Answer(200, body, delay, hostname, _XML)
        elif path == ROBOTS_PATH and (robots := self.model.robots_txt(i)) is not None:
            delay = self.model.latency_ms(i, node) / 1000.0
            delay += self.model.bandwidth_delay_s(i, len(robots))
            answer = _Answer(200, robots, delay, hostname, _TEXT)
        else:
            status, body, extra = self._cached(i, path)
            delay = self.model.latency_ms(i, node) / 1000.0 + extra
            if status == 200 and self.model.fault(i, path) == "transient":
                key = (i, path)
                if key not in self._transient_seen:
                    self._transient_seen.add(key)
                    body = _status_body(503, f"{hostname}{path}")
                    status = 503
                    delay -= extra
                    delay += self.model.bandwidth_delay_s(i, len(body))
            answer = _Answer(status, body, max(delay, 0.0), hostname)
            if status == 200 and self.model.changes is not None:
                answer = self._changing(answer, url, f"{hostname}{path}", if_none_match)
        self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
        return answer

    def _changing(self, answer: _Answer, url: str, key: str, if_none_match: str | None) -> _Answer:
        """``answer`` as the page's version now: its text, its ``ETag``, or a ``304``."""
        changes = self.model.changes
        assert changes is not None  # typing: only called with changes configured
        now = time.monotonic() - self.changes_t0
        etag = changes.etag(key, now)
        self.page_fetches.setdefault(url, []).append(round(now, 4))
        headers = b"ETag: %s\r\n" % etag.encode("ascii")
        if if_none_match is not None and etag in (t.strip() for t in if_none_match.split(",")):
            return _Answer(304, b"", answer.delay, answer.host, headers=headers)
        mark = b"<p>Revision %d</p>" % changes.version(key, now)
        body = answer.body
        at = body.rfind(b"</body>")
        body = body[:at] + mark + body[at:] if at >= 0 else body + mark
        return _Answer(200, body, answer.delay, answer.host, answer.content_type, headers)

    def _sitemap(self, i: int, hostname: str) -> bytes:
        """Host ``i``'s pages with the time of their current version as ``lastmod``
        (a lying host, :meth:`ChangeModel.lies`: the time of this answer)."""
        changes = self.model.changes
        assert changes is not None  # typing: only served with changes configured
        now = time.monotonic() - self.changes_t0
        wall_at_zero = time.time() - now  # the changes' clock, as wall-clock time
        lies = changes.lies(hostname)
        entries = []
        for path in self.model.paths(i):
            at = now if lies else changes.changed_at(f"{hostname}{path}", now)
            stamp = datetime.fromtimestamp(wall_at_zero + at, tz=timezone.utc)
            loc = f"http://{hostname}:{self.port}{path}"
            entries.append(f"<url><loc>{loc}</loc><lastmod>{stamp.isoformat()}</lastmod></url>")
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(entries)
            + "</urlset>"
        ).encode()

    def _bookkeeping(self, path: str, query: str) -> _Answer:
        if path == STATS_PREFIX + "stats":
            urls = parse_qs(query).get("urls", ["0"])[0] not in ("", "0", "false")
            body = json.dumps(self.stats(urls), sort_keys=True).encode()
        elif path == STATS_PREFIX + "samples":
            body = json.dumps(self.samples).encode()
        elif path == STATS_PREFIX + "reset":
            self.reset()
            body = b'{"ok": true}'
        elif path == STATS_PREFIX + "config":
            body = self.model.config.to_json().encode()
        else:
            return _Answer(404, _status_body(404, path))
        return _Answer(200, body, content_type=_JSON)


class _Slot:
    """One pipelined request awaiting its (possibly delayed) response."""

    __slots__ = ("call", "close", "data", "host")

    def __init__(self, host: str | None, close: bool) -> None:
        self.host = host
        self.close = close
        self.data: bytes | None = None
        self.call: _DelayedCall | None = None


class FarmProtocol(protocol.Protocol):
    """Minimal HTTP/1.1 (GET/HEAD, keep-alive, pipelining) for speed.

    Responses leave in request order even when a later request's delay is
    shorter, as HTTP/1.1 pipelining demands; a request counts as in flight
    for its host until its response is written.
    """

    max_header_bytes = 65536

    def __init__(self, server: FarmServer) -> None:
        self._server = server
        self._buf = b""
        self._skip = 0
        self._queue: deque[_Slot] = deque()
        self._stop_reading = False
        self._lost = False

    def connectionMade(self) -> None:
        transport = cast(_Transport, self.transport)
        with contextlib.suppress(AttributeError, OSError):  # non-TCP transports
            transport.setTcpNoDelay(True)

    def dataReceived(self, data: bytes) -> None:
        if self._stop_reading:
            return
        buf = self._buf + data if self._buf else data
        pos = 0
        size = len(buf)
        while not self._stop_reading:
            if self._skip:
                take = min(self._skip, size - pos)
                pos += take
                self._skip -= take
                if self._skip:
                    break
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                break
            body_len = self._request(buf[pos:end])
            pos = end + 4
            if body_len:
                take = min(body_len, size - pos)
                pos += take
                self._skip = body_len - take
        self._buf = buf[pos:] if pos < size else b""
        if len(self._buf) > self.max_header_bytes and not self._stop_reading:
            self._buf = b""
            self._reply(_Answer(431, _status_body(431, "header too large")), False, False, False)

    def _request(self, head: bytes) -> int:
        """Parse one request head and queue its answer; returns the body length to skip."""
        lines = head.lstrip(b"\r\n").split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._reply(_Answer(400, _status_body(400, "bad request line")), False, False, False)
            return 0
        method, target, version = parts
        host = b""
        node: str | None = None
        connection = b""
        if_none_match: str | None = None
        body_len = 0
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip().lower()
            if name == b"host":
                host = value.strip()
            elif name == _NODE_HEADER_LOWER:
                node = value.strip().decode("latin-1")
            elif name == b"connection":
                connection = value.strip().lower()
            elif name == b"if-none-match":
                if_none_match = value.strip().decode("latin-1")
            elif name == b"content-length":
                try:
                    body_len = int(value)
                except ValueError:
                    body_len = -1
            elif name == b"transfer-encoding" and value.strip().lower() != b"identity":
                self._reply(_Answer(501, _status_body(501, "chunked bodies")), False, False, False)
                return 0
        if body_len < 0:
            self._reply(_Answer(400, _status_body(400, "bad Content-Length")), False, False, False)
            return 0
        http10 = version == b"HTTP/1.0"
        keep_alive = b"keep-alive" in connection if http10 else b"close" not in connection
        answer = self._server.handle(
            target.decode("latin-1"),
            host.decode("latin-1"),
            node,
            method.decode("latin-1"),
            if_none_match,
        )
        self._reply(answer, keep_alive, http10, method == b"HEAD")
        return body_len

    def _reply(self, answer: _Answer, keep_alive: bool, http10: bool, head: bool) -> None:
        if not keep_alive:
            self._stop_reading = True
        slot = _Slot(answer.host, not keep_alive)
        if answer.host is not None:
            self._server.enter(answer.host)
        self._queue.append(slot)
        data = _response(
            answer.status,
            answer.body,
            answer.content_type,
            keep_alive,
            http10,
            head,
            answer.headers,
        )
        if answer.host is not None:  # a site's answer, not the farm's own bookkeeping
            self._server.bytes_sent += len(data)
        if answer.delay > 0:
            slot.call = self._server.clock.callLater(answer.delay, self._ready, slot, data)
        else:
            self._ready(slot, data)

    def _ready(self, slot: _Slot, data: bytes) -> None:
        slot.call = None
        slot.data = data
        queue = self._queue
        transport = cast("_Transport | None", self.transport)
        if transport is None or self._lost:
            return
        while queue and queue[0].data is not None:
            done = queue.popleft()
            transport.write(cast(bytes, done.data))
            if done.host is not None:
                self._server.leave(done.host)
            if done.close:
                transport.loseConnection()
                self._abandon()
                return

    def _abandon(self) -> None:
        """Cancel queued answers; their requests are no longer in flight."""
        while self._queue:
            slot = self._queue.popleft()
            if slot.call is not None and slot.call.active():
                slot.call.cancel()
            if slot.host is not None:
                self._server.leave(slot.host)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._lost = True
        self._stop_reading = True
        self._abandon()


class FarmFactory(protocol.Factory):
    """Builds one :class:`FarmProtocol` per connection, all sharing one server."""

    noisy = False

    def __init__(self, server: FarmServer) -> None:
        self.server = server

    def buildProtocol(self, addr: Any) -> FarmProtocol:
        return FarmProtocol(self.server)


# ---------------------------------------------------------------------- process
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the server process (``python -m scrapy_banker.testing.farm.server``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config-json", help="FarmConfig as JSON (default: FarmConfig())")
    source.add_argument("--config-file", help="file holding the FarmConfig JSON")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 = any free port)")
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s webfarm %(levelname)s %(message)s",
    )
    if args.config_file:
        config = FarmConfig.from_json(Path(args.config_file).read_text())
    elif args.config_json:
        config = FarmConfig.from_json(args.config_json)
    else:
        config = FarmConfig()
    model = FarmModel(config)
    if config.rtt_matrix is not None:
        model.rtt_matrix_ms()  # load and check the matrix now: fail before LISTENING

    from twisted.internet import reactor as _reactor

    reactor = cast(Any, _reactor)
    server = FarmServer(model, reactor)
    if config.sample_interval_s > 0:
        from twisted.internet.task import LoopingCall

        LoopingCall(server.sample).start(config.sample_interval_s, now=False)
    listening = reactor.listenTCP(
        args.port, FarmFactory(server), backlog=1024, interface=args.interface
    )
    server.port = int(listening.getHost().port)
    logger.info("serving %d hosts, %d urls on port %d", config.hosts, model.n_urls(), server.port)
    sys.stdout.write(f"LISTENING {server.port}\n")
    sys.stdout.flush()
    reactor.run()  # installs SIGINT/SIGTERM handlers that stop the reactor
    logger.info("stopped after %d requests", server.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
