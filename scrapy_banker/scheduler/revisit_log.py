"""The revisits' state in a JOBDIR: one append-only file of per-URL records, compacted.

A crawl that keeps its pages fresh may be stopped for days and resumed from
cron: what it must find again is, per URL, the
:class:`~scrapy_banker.core.recrawl.UrlState` (the due time, the interval,
the validators, the change-rate estimate) and the request a revisit copies.
:class:`RevisitLog` keeps both in ``JOBDIR/banker/revisits.jsonl``, one JSON
object per line:

* ``{"u": url, "s": state}`` -- the URL's state after a fetch;
* the same with ``"r": payload`` -- the request revisits copy (the JOBDIR
  codec's JSON, :class:`~scrapy_banker.scheduler.serialize.RequestCodec`:
  never pickle, its callback resolved on the running spider as Scrapy's
  ``request_from_dict`` resolves it), written when it changes: at a page's
  first fetch and when the spider fetches the page again itself.

Replaying keeps each URL's last state and last request.  Every record is one
unbuffered ``os.write``, so it is in the kernel before the fetch's answer
moves on and survives ``kill -9``, as the queue's journal does
(:mod:`scrapy_banker.scheduler.jobdir`).  The file is rewritten with one
line per URL (written beside it, ``fsync``'d, swapped in with
``os.replace``) at every resume that replayed more lines than URLs, at a
clean stop, and while crawling once it holds twice as many lines as URLs
(and at least :data:`COMPACT_MIN_LINES`): its size follows the number of
pages, not the length of the crawl.

A line that cannot be read back, or a request whose payload the running
spider cannot rebuild, is logged, counted (``banker/recrawl/malformed``)
and kept in ``JOBDIR/banker-deadletter.jsonl`` as the journal's are; a
request that cannot be written (a class that is not allow-listed, a
callback that is not a spider method) is logged, counted
(``banker/recrawl/unsaved``) and dead-lettered at once: its page is
revisited in this run, not after a resume.

The JOBDIR's lock (taken by the scheduler's
:class:`~scrapy_banker.scheduler.jobdir.JobDir`) covers this file too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.files import fsync_dir
from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.scheduler.jobdir import append_dead_letter
from scrapy_banker.scheduler.serialize import MalformedPayload, UnserializableRequest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy import Request, Spider
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.scheduler.serialize import RequestCodec

logger = logging.getLogger(__name__)

__all__ = ["COMPACT_MIN_LINES", "FILE", "RevisitLog", "Revisited", "read_states"]

FILE = "revisits.jsonl"
#: A file with fewer lines than this is never compacted while crawling.
COMPACT_MIN_LINES = 10_000


@dataclass
class Revisited:
    """One URL as a resume finds it: its state and the request its revisits copy."""

    state: UrlState
    request: Request


class RevisitLog:
    """``JOBDIR/banker/revisits.jsonl``: write each URL's new state; read them all back."""

    def __init__(self, jobdir: str, codec: RequestCodec, stats: StatsCollector | None) -> None:
        self.root = jobdir
        self.dir = os.path.join(jobdir, "banker")
        self.path = os.path.join(self.dir, FILE)
        self.codec = codec
        self.stats = stats
        self._fd: int | None = None
        #: Lines in the file.
        self.lines = 0
        #: Each URL's request payload as written (copied as text at a compaction).
        self.payloads: dict[str, str] = {}

    # -- resuming -------------------------------------------------------------------

    def restore(self, spider: Spider) -> dict[str, Revisited]:
        """Every URL the file knows, with its last state and request; then open it to append.

        A file that replayed more lines than URLs is compacted first.
        """
        os.makedirs(self.dir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path + ".tmp")  # a compaction cut short
        states: dict[str, tuple[int, dict[str, Any]]] = {}
        payloads: dict[str, tuple[int, str]] = {}
        lines = 0
        for line in _lines(self.path):
            lines += 1
            if line.cut:  # cut short by a kill: never acknowledged (the rewrite drops it)
                break
            if line.entry is None:
                self._malformed(line.number, line.error, line.text)
                continue
            url, state, payload = line.entry
            states[url] = (line.number, state)
            if payload is not None:
                payloads[url] = (line.number, payload)
        out: dict[str, Revisited] = {}
        for url, (lineno, raw) in states.items():
            lineno, payload = payloads.get(url, (lineno, ""))
            try:
                if not payload:
                    raise ValueError("no request was saved for this URL")
                request = self.codec.decode(payload, spider)
            except (ValueError, MalformedPayload) as exc:
                self._malformed(lineno, f"{url}: {exc}", payload)
                continue
            out[url] = Revisited(UrlState.from_json(raw), request)
            self.payloads[url] = payload
        self.lines = lines
        if lines > len(out):
            self._rewrite({u: r.state for u, r in out.items()})
        else:
            self._open()
        return out

    # -- writing --------------------------------------------------------------------

    def write(
        self, url: str, state: UrlState, request: Request | None, spider: Spider | None
    ) -> None:
        """Journal ``url``'s new state, and ``request`` when revisits copy a new one."""
        record: dict[str, Any] = {"u": url, "s": state.to_json()}
        if request is not None:
            try:
                record["r"] = self.payloads[url] = self.codec.encode(request, spider)
            except UnserializableRequest as exc:
                self._unsaved(request, str(exc))
        self._append(json.dumps(record, separators=(",", ":")) + "\n")

    def should_compact(self) -> bool:
        return self.lines >= max(COMPACT_MIN_LINES, 2 * len(self.payloads))

    def compact(self, states: dict[str, UrlState]) -> None:
        """Rewrite the file with one line per URL: its state in memory, its request as written."""
        self._rewrite(states)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rewrite(self, states: dict[str, UrlState]) -> None:
        self.close()
        tmp = self.path + ".tmp"
        lines = 0
        with open(tmp, "w", encoding="utf-8", newline="") as out:
            for url, state in states.items():
                payload = self.payloads.get(url)
                if payload is None:  # its request could not be written: it was dead-lettered
                    continue
                record = {"u": url, "s": state.to_json(), "r": payload}
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
                lines += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.dir)
        self.lines = lines
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _append(self, text: str) -> None:
        """One ``os.write``: in the kernel (safe from ``kill -9``) when this returns."""
        if self._fd is None:
            raise RuntimeError(f"the revisits' file {self.path} is not open")
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self._fd, data) :]
        self.lines += 1

    # -- what could not be kept -----------------------------------------------------

    def _unsaved(self, request: Request, error: str) -> None:
        logger.error("Cannot keep the revisits of %s in JOBDIR, a resume will not revisit it: "
                     "%s", request, error)  # fmt: skip
        self._inc("banker/recrawl/unsaved")
        append_dead_letter(self.root, {"url": request.url, "method": request.method,
                                       "error": error, "when": "save"})  # fmt: skip

    def _malformed(self, lineno: int, error: str, text: str) -> None:
        logger.error("Skipping malformed revisit entry %s:%d (%s); kept in the JOBDIR's dead "
                     "letters", self.path, lineno, error)  # fmt: skip
        self._inc("banker/recrawl/malformed")
        letter = {"file": FILE, "line": lineno, "error": error, "payload": text.rstrip("\n"),
                  "when": "restore"}  # fmt: skip
        append_dead_letter(self.root, letter)

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)


def read_states(jobdir: str) -> tuple[dict[str, UrlState], int]:
    """Each URL's last state in ``jobdir``'s revisits file, and how many lines did not
    read (an operator's view: nothing is written, no request is rebuilt)."""
    states: dict[str, UrlState] = {}
    malformed = 0
    for line in _lines(os.path.join(jobdir, "banker", FILE)):
        if line.cut:
            break
        if line.entry is None:
            malformed += 1
            continue
        url, raw, _ = line.entry
        states[url] = UrlState.from_json(raw)
    return states, malformed


@dataclass(frozen=True)
class _Line:
    """One line of the revisits file: what it says, or why it does not read."""

    number: int
    text: str
    #: ``(url, state JSON, request payload or None)``; None when it does not read.
    entry: tuple[str, dict[str, Any], str | None] | None
    error: str = ""
    #: The last line, cut short by a kill: never acknowledged, so never read.
    cut: bool = False


def _lines(path: str) -> Iterator[_Line]:
    """Every line of the file at ``path`` (none if it is absent), parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if not text.endswith("\n"):
                    yield _Line(number, text, None, "cut short", cut=True)
                    return
                try:
                    yield _Line(number, text, _parse(text))
                except ValueError as exc:
                    yield _Line(number, text, None, str(exc))
    except FileNotFoundError:
        return


def _parse(line: str) -> tuple[str, dict[str, Any], str | None]:
    """``(url, state JSON, request payload or None)`` of one line; ``ValueError`` if malformed."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected an object, got {type(record).__name__}")
    url, state, payload = record.get("u"), record.get("s"), record.get("r")
    if not isinstance(url, str) or not url:
        raise ValueError("'u' must be the URL")
    if not isinstance(state, dict):
        raise ValueError("'s' must be the URL's state, an object")
    if payload is not None and not isinstance(payload, str):
        raise ValueError("'r' must be the request's JSON payload, a string")
    UrlState.from_json(state)  # a state that does not read is malformed here, not later
    return url, state, payload
