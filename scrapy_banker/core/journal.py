"""The JOBDIR journal's record format and replay rule: what a crash leaves, and what it means.

Why a journal: a ``kill -9`` gives a process no chance to save its queue, so
every request must reach the operating system when it is queued, not at a
clean stop.  Appending one short line per event is the cheapest way to do
that (one ``write`` per enqueue, no rewrite of anything), and replaying the
lines in order rebuilds the queue exactly.  This module is the pure part:
how records are spelled and how a sequence of them is replayed.  Files,
``fsync`` and Scrapy live in :mod:`scrapy_banker.scheduler.jobdir`.

Records (JSON lines, never pickle):

* ``E`` -- a request entered the frontier::

    {"e":SEQ,"f":"FP","t":"TOPIC","s":"SLOT","k":"KEY","h":HASH,"p":PRIORITY,"r":PAYLOAD}

  ``PAYLOAD`` is the request codec's JSON text spliced in as is (``"r"`` is
  always last), so the request is encoded once and a reader can hand it to
  the codec without decoding and re-encoding it.  ``f`` is the request's
  fingerprint, empty for ``dont_filter`` requests (which are never "seen").
* ``D`` -- requests whose callback output has been fully scheduled:
  ``{"d":[SEQ,...]}``.  An ``E`` without a ``D`` is pending again after a
  crash; a ``D`` always follows the ``E`` of every child of its request,
  because children are queued (and journaled) before their parent is done.
  An optional ``"u":[SEQ,...]`` names those of them that used no budget (a
  copy was queued in their place -- a retry, a redirect -- or they were
  dead-lettered unsent): every other ``D`` is one page fetched, which is how
  budgets are counted exactly after a crash (:attr:`JournalState.pages`).
* ``S`` -- in a snapshot only: fingerprints of completed requests,
  ``{"s":["FP",...]}``; they keep the seen set without keeping the requests.
* the snapshot's first line is its header (``{"banker":"snapshot",...}``).

The seen set after a replay is every fingerprint of an ``E`` (pending or
done) plus the snapshot's ``S`` lines, so the queue and the seen set always
agree: a URL is seen if and only if its request was journaled.

A final line without its newline was cut by the kill: it is skipped and
counted (:attr:`JournalState.truncated`), never fatal, and its loss is safe
(an ``E`` cut short belongs to a parent with no ``D`` yet, which is fetched
again; a ``D`` cut short only repeats requests).  Any other line that does
not parse is reported in :attr:`JournalState.malformed` for the caller to
dead-letter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "SNAPSHOT_VERSION",
    "BadLine",
    "Enqueued",
    "JournalState",
    "PageCounts",
    "UnsupportedSnapshot",
    "done_line",
    "enqueue_line",
    "header_line",
    "needs_compaction",
    "parse_enqueue",
    "seen_lines",
]

#: Version of the snapshot + journal layout (1 is the clean-stop-only layout, not read).
SNAPSHOT_VERSION = 2

_PAYLOAD_SEP = ',"r":'
_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


class UnsupportedSnapshot(ValueError):
    """A snapshot written by another layout version: never guessed at."""


class Enqueued(NamedTuple):
    """One parsed ``E`` record; ``payload`` is the codec's JSON text, untouched.

    A tuple, not a dataclass: a resume builds one per pending request.
    """

    seq: int
    fingerprint: str
    topic: str
    slot: str
    key: str
    key_hash: int
    priority: int
    payload: str


@dataclass(frozen=True)
class BadLine:
    """A line that is neither a valid record nor a truncated tail."""

    source: str
    line: int
    error: str
    text: str


def enqueue_line(
    seq: int,
    fingerprint: str,
    topic: str,
    slot: str,
    key: str,
    key_hash: int,
    priority: int,
    payload: str,
) -> str:
    """The ``E`` record of a request, newline included (``payload``: the codec's JSON)."""
    return (
        f'{{"e":{seq},"f":{_dumps(fingerprint)},"t":{_dumps(topic)},"s":{_dumps(slot)},'
        f'"k":{_dumps(key)},"h":{key_hash},"p":{priority}{_PAYLOAD_SEP}{payload}}}\n'
    )


def done_line(seqs: Iterable[int], unused: Iterable[int] = ()) -> str:
    """One ``D`` record for the requests ``seqs`` (one write for a batch).

    ``unused``: those of ``seqs`` that are no page of any budget.
    """
    line = '{"d":[' + ",".join(str(int(s)) for s in seqs) + "]"
    free = ",".join(str(int(s)) for s in unused)
    return line + (',"u":[' + free + "]}\n" if free else "}\n")


def seen_lines(fingerprints: Iterable[str], per_line: int = 1000) -> Iterator[str]:
    """``S`` records of a snapshot, ``per_line`` fingerprints each."""
    chunk: list[str] = []
    for fp in fingerprints:
        chunk.append(fp)
        if len(chunk) >= per_line:
            yield _dumps({"s": chunk}) + "\n"
            chunk = []
    if chunk:
        yield _dumps({"s": chunk}) + "\n"


def header_line(
    generation: int,
    next_seq: int,
    pending: int,
    seen: int,
    topics: dict[str, Any] | None,
    directory: dict[str, Any] | None,
) -> str:
    """The snapshot's first line: what the rest of it and its journal need to be read."""
    return (
        _dumps(
            {
                "banker": "snapshot",
                "version": SNAPSHOT_VERSION,
                "generation": generation,
                "next_seq": next_seq,
                "pending": pending,
                "seen": seen,
                "topics": topics,
                "directory": directory,
            }
        )
        + "\n"
    )


def parse_enqueue(line: str) -> Enqueued:
    """Parse an ``E`` line; ``ValueError`` if it is not one.

    Only the short head before ``"r":`` goes through ``json.loads``: the
    payload is returned as text for the codec (a ``,"r":`` cannot occur
    inside the head's JSON strings, whose quotes are escaped).
    """
    text = line.rstrip("\n")
    cut = text.find(_PAYLOAD_SEP)
    if cut < 0 or not text.endswith("}"):
        raise ValueError("not an enqueue record")
    head = json.loads(text[:cut] + "}")
    if not isinstance(head, dict):
        raise ValueError("not an enqueue record")
    try:
        return Enqueued(
            seq=_int(head["e"]),
            fingerprint=str(head["f"]),
            topic=str(head["t"]),
            slot=str(head["s"]),
            key=str(head["k"]),
            key_hash=_int(head["h"]),
            priority=_int(head["p"]),
            payload=text[cut + len(_PAYLOAD_SEP) : -1],
        )
    except KeyError as exc:
        raise ValueError(f"enqueue record without {exc}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def needs_compaction(journal_records: int, snapshot_records: int, minimum: int) -> bool:
    """Compact when the journal has grown as large as the snapshot (and past ``minimum``).

    Rewriting costs O(snapshot); waiting until the journal holds as many
    records keeps that cost O(1) per record amortised, and bounds the
    journal by ``max(minimum, snapshot)`` records -- so by what is pending
    and seen, not by how long the crawl has run.
    """
    return journal_records >= max(minimum, snapshot_records)


@dataclass
class PageCounts:
    """Pages fetched per host, per topic and in all: what budgets are counted against."""

    hosts: dict[str, int] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)
    crawl: int = 0

    def add(self, host: str, topic: str, n: int = 1) -> None:
        self.hosts[host] = self.hosts.get(host, 0) + n
        self.topics[topic] = self.topics.get(topic, 0) + n
        self.crawl += n

    def to_json(self) -> dict[str, Any]:
        return {"hosts": dict(self.hosts), "topics": dict(self.topics), "crawl": self.crawl}

    def restore(self, data: Any) -> None:
        """Counts from :meth:`to_json` (a snapshot header); ``ValueError`` naming what is
        malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        hosts, topics = data.get("hosts", {}), data.get("topics", {})
        if not isinstance(hosts, Mapping) or not isinstance(topics, Mapping):
            raise ValueError("budget counts must be objects")
        self.hosts = {str(h): _count(f"hosts[{h!r}]", n) for h, n in hosts.items()}
        self.topics = {str(t): _count(f"topics[{t!r}]", n) for t, n in topics.items()}
        self.crawl = _count("crawl", data.get("crawl", 0))


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


@dataclass
class JournalState:
    """Replay of a snapshot and its journal: which requests are pending, what was seen.

    Feed the snapshot's lines, then the journal's, with :meth:`feed`.  Only
    sequence numbers and fingerprints are kept (not the payloads), so the
    caller streams the files a second time to rebuild requests -- memory
    stays proportional to the pending set, not to the bytes on disk.
    """

    #: Pending requests: seq -> fingerprint, in journal order.
    live: dict[int, str] = field(default_factory=dict)
    #: Fingerprints of completed requests.
    done: set[str] = field(default_factory=set)
    #: The snapshot header (None: no snapshot was fed).
    header: dict[str, Any] | None = None
    #: Lowest sequence number not used yet.
    next_seq: int = 0
    #: Final lines without their newline (cut by a kill), skipped.
    truncated: int = 0
    malformed: list[BadLine] = field(default_factory=list)
    #: Records (``E`` + ``D`` sequence numbers) read from journals.
    journal_records: int = 0
    #: Pages fetched per host, per topic and in all (``"crawl"``): the snapshot
    #: header's ``"budgets"`` plus the journal's ``D`` records (not ``"u"``).
    pages: PageCounts = field(default_factory=lambda: PageCounts())
    #: Pending requests' (host, topic), for :attr:`pages` (pairs are shared).
    lanes: dict[int, tuple[str, str]] = field(default_factory=dict)
    _pairs: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def seen(self) -> set[str]:
        """The seen set: fingerprints of every journaled request, done or pending."""
        out = set(self.done)
        out.update(fp for fp in self.live.values() if fp)
        return out

    def feed(self, lines: Iterable[str], source: str, *, journal: bool) -> None:
        """Replay ``lines`` (each with its newline, as read from a file) in order."""
        pending: str | None = None
        lineno = 0
        for lineno, line in enumerate(lines, 1):
            if pending is not None:
                self._bad(source, lineno - 1, "line without newline", pending)
            if not line.endswith("\n"):
                pending = line  # the last line if nothing follows: truncated
                continue
            pending = None
            if line.strip():
                self._record(line, source, lineno, journal)
        if pending is not None:
            self.truncated += 1

    def _header(self, line: str, source: str, lineno: int, journal: bool) -> None:
        """A snapshot header; one of another version is fatal (``UnsupportedSnapshot``)."""
        try:
            obj = json.loads(line)
        except ValueError as exc:
            self._bad(source, lineno, str(exc), line)
            return
        if journal or self.header is not None or not isinstance(obj, dict):
            self._bad(source, lineno, "unexpected snapshot header", line)
            return
        if obj.get("version") != SNAPSHOT_VERSION:
            raise UnsupportedSnapshot(
                f"{source}: unsupported snapshot version {obj.get('version')!r} "
                f"(this scrapy-banker reads version {SNAPSHOT_VERSION})"
            )
        self.header = obj
        budgets = obj.get("budgets")
        if budgets is not None:
            try:
                self.pages.restore(budgets)
            except ValueError as exc:
                self._bad(source, lineno, f"budget counts: {exc}", line)
        next_seq = obj.get("next_seq", 0)
        self.next_seq = max(self.next_seq, next_seq if isinstance(next_seq, int) else 0)

    def _bad(self, source: str, lineno: int, error: str, text: str) -> None:
        self.malformed.append(BadLine(source, lineno, error, text.rstrip("\n")))

    def _record(self, line: str, source: str, lineno: int, journal: bool) -> None:
        if line.startswith('{"banker":'):
            self._header(line, source, lineno, journal)
            return
        try:
            if line.startswith('{"e":'):
                rec = parse_enqueue(line)
                if rec.seq not in self.live:
                    self.live[rec.seq] = rec.fingerprint
                    pair = (rec.slot, rec.topic)
                    self.lanes[rec.seq] = self._pairs.setdefault(pair, pair)
                self.next_seq = max(self.next_seq, rec.seq + 1)
                self.journal_records += journal
                return
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a record")
            if "d" in obj and journal:
                seqs = [_int(s) for s in obj["d"]]
                unused = {_int(s) for s in obj.get("u", ())}
                pages = self.pages
                for seq in seqs:
                    fp = self.live.pop(seq, None)
                    if fp:
                        self.done.add(fp)
                    lane = self.lanes.pop(seq, None)
                    if lane is not None and seq not in unused:
                        pages.add(*lane)
                self.journal_records += len(seqs)
            elif "s" in obj and not journal:
                self.done.update(str(fp) for fp in obj["s"])
            else:
                raise ValueError("unknown record")
        except (ValueError, TypeError) as exc:
            self._bad(source, lineno, str(exc), line)
