"""The operator's read model of one node's JOBDIR (``scrapy banker status --jobdir``).

:class:`~scrapy_banker.scheduler.BankerScheduler` keeps ``JOBDIR/banker/``
(see :mod:`scrapy_banker.scheduler.jobdir`): a snapshot and the journal
appended since, replayed here exactly as a resume would replay them -- so
the view is right during a crawl and after a ``kill -9``, not only after a
clean stop.  What could not be saved or restored is in
``JOBDIR/banker-deadletter.jsonl``.  This module reads those files -- never
writes, never unpickles -- into views with a stable ``to_json()``.

Buckets: after a clean stop the snapshot holds the directory; otherwise the
requests' queue keys are filed into a fresh directory of the default shape
(``BANKER_BUCKET_CAPACITY`` etc. are not known here), as a resume that
rebuilds the directory would.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.directory import ExtendibleDirectory
from scrapy_banker.core.journal import BadLine, JournalState, UnsupportedSnapshot, parse_enqueue
from scrapy_banker.scheduler.jobdir import SNAPSHOT, live_records, replay

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

__all__ = [
    "JobdirEntry",
    "JobdirView",
    "find_in_jobdir",
    "jobdir_directory",
    "read_jobdir",
]

#: Same numbering as :data:`scrapy_banker.ops.fleet_view.SCHEMA_VERSION`.
SCHEMA_VERSION = 1
#: What could not be saved or restored, beside ``banker/``.
_DEADLETTER_FILE = "banker-deadletter.jsonl"


@dataclass(frozen=True)
class JobdirEntry:
    """One saved request line."""

    bucket: int
    line: int
    topic: str
    slot: str
    key: str
    key_hash: int
    priority: int
    request: dict[str, Any]
    #: FIFO order within a lane (the journal's sequence number).
    seq: int = 0


@dataclass
class _Journaled:
    """A snapshot + journal JOBDIR, replayed."""

    state: JournalState
    entries: list[JobdirEntry]
    #: The one saved at a clean stop, else the pending keys filed into a fresh one.
    directory: ExtendibleDirectory[str]


def _journaled(jobdir: str) -> _Journaled:
    """Replay the snapshot and its journal; ``ValueError`` saying in one line what is missing."""
    if not os.path.isdir(jobdir):
        raise ValueError(f"no JOBDIR at {jobdir}")
    path = os.path.join(jobdir, "banker")
    if not os.path.exists(os.path.join(path, SNAPSHOT)):
        raise ValueError(
            f"{jobdir} holds no scrapy-banker state (no banker/{SNAPSHOT}: the crawl used "
            "another scheduler, or never started)"
        )
    try:
        state, files = replay(path)
    except UnsupportedSnapshot as exc:
        raise ValueError(str(exc)) from None
    header = state.header or {}
    saved = header.get("directory")
    directory = None if not saved else ExtendibleDirectory.from_state(saved)
    rebuilt: ExtendibleDirectory[str] | None = None if directory else ExtendibleDirectory()
    records = []
    for _, lineno, line, rec in live_records(state, files):
        try:
            request = json.loads(rec.payload)
            if not isinstance(request, dict):
                raise ValueError("payload is not an object")
        except ValueError:
            state.malformed.append(BadLine(SNAPSHOT, lineno, "unreadable", line))
            continue
        if rebuilt is not None:
            rebuilt.add(rec.key, rec.key_hash, 1)
        records.append((rec, lineno, request))
    final = directory or rebuilt
    assert final is not None
    entries = [
        JobdirEntry(final.bucket_of(rec.key) if directory is None else final.lookup(rec.key_hash),
                    lineno, rec.topic, rec.slot, rec.key, rec.key_hash, rec.priority, request,
                    rec.seq)
        for rec, lineno, request in records
    ]  # fmt: skip
    return _Journaled(state, entries, final)


def jobdir_hosts_and_topics(jobdir: str) -> tuple[set[str], set[str]]:
    """The hosts (download slots) and topics of the requests a JOBDIR holds pending."""
    entries = _journaled(jobdir).entries
    return {e.slot for e in entries}, {e.topic for e in entries}


@dataclass(frozen=True)
class JobdirView:
    """What one node's JOBDIR holds since its last clean stop."""

    path: str
    #: Requests the journal holds pending, and those of them whose payload reads back.
    pending: int
    queued: int
    #: topic -> requests saved for it; its time slice and dispatch count.
    topics: dict[str, dict[str, Any]]
    #: bucket -> (requests, distinct queue keys).
    buckets: dict[int, tuple[int, int]]
    #: The slots (hosts) with most saved requests, most first.
    top_slots: tuple[tuple[str, int], ...]
    #: Directory shape: global depth, buckets (the one saved at a clean stop, else the
    #: one a resume would rebuild).
    global_depth: int | None
    n_buckets: int | None
    #: Snapshot and journal lines that are not valid entries.
    malformed: int
    #: ``banker-deadletter.jsonl``: entries, by ``when`` (save / restore).
    dead_letters: int
    dead_letter_kinds: dict[str, int]
    #: Fingerprints the journal records as seen (every request it queued, not
    #: ``dont_filter`` ones).
    seen: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "jobdir",
            "path": self.path,
            "pending": self.pending,
            "queued": self.queued,
            "topics": [{"name": n, **t} for n, t in sorted(self.topics.items())],
            "buckets": [
                {"bucket": b, "queued": q, "keys": k} for b, (q, k) in sorted(self.buckets.items())
            ],
            "top_slots": [{"slot": s, "queued": n} for s, n in self.top_slots],
            "directory": {"global_depth": self.global_depth, "buckets": self.n_buckets},
            "malformed": self.malformed,
            "dead_letters": self.dead_letters,
            "dead_letter_kinds": dict(sorted(self.dead_letter_kinds.items())),
            "seen": self.seen,
        }


def read_jobdir(jobdir: str, *, top: int = 10) -> JobdirView:
    """Read a JOBDIR; ``ValueError`` with one line when there is nothing to read."""
    journaled = _journaled(jobdir)
    deadletter_path = os.path.join(jobdir, _DEADLETTER_FILE)
    header = journaled.state.header or {}
    entries = journaled.entries
    malformed = len(journaled.state.malformed)
    saved_topics = (header.get("topics") or {}).get("topics") or {}
    directory = journaled.directory
    per_topic: Counter[str] = Counter()
    per_slot: Counter[str] = Counter()
    per_bucket: Counter[int] = Counter()
    keys: dict[int, set[str]] = {}
    for entry in entries:
        per_topic[entry.topic] += 1
        per_slot[entry.slot] += 1
        per_bucket[entry.bucket] += 1
        keys.setdefault(entry.bucket, set()).add(entry.key)
    topics: dict[str, dict[str, Any]] = {}
    for name in sorted(set(per_topic) | set(saved_topics)):
        saved_topic = saved_topics.get(name) or {}
        topics[name] = {
            "queued": per_topic.get(name, 0),
            "slice_s": saved_topic.get("slice_total"),
            "dispatched": saved_topic.get("dispatched"),
        }
    kinds: Counter[str] = Counter()
    dead = 0
    if os.path.exists(deadletter_path):
        with open(deadletter_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                dead += 1
                try:
                    kinds[str(json.loads(line).get("when", "unknown"))] += 1
                except (ValueError, AttributeError):
                    kinds["unreadable"] += 1
    return JobdirView(
        path=jobdir,
        pending=len(journaled.state.live),
        queued=sum(per_bucket.values()),
        topics=topics,
        buckets={b: (n, len(keys[b])) for b, n in per_bucket.items()},
        top_slots=tuple(per_slot.most_common(top)),
        global_depth=directory.global_depth,
        n_buckets=directory.n_buckets,
        malformed=malformed,
        dead_letters=dead,
        dead_letter_kinds=dict(kinds),
        seen=len(journaled.state.seen()),
    )


def jobdir_directory(jobdir: str) -> ExtendibleDirectory[str]:
    """The extendible-hash directory a resume would start from.

    The one saved at a clean stop, else the pending requests' keys filed
    into a default-shaped one.
    """
    return _journaled(jobdir).directory


@dataclass(frozen=True)
class JobdirFind:
    """Where one request is in a JOBDIR."""

    #: ``queued`` (saved, fetched when the crawl resumes), ``dead``, ``done``
    #: (seen, nothing saved) or ``unknown``.
    state: str
    bucket: int | None
    seen: bool | None
    entry: JobdirEntry | None
    ahead: int | None
    dead_reason: str | None


def find_in_jobdir(
    jobdir: str,
    request: Request,
    key_hash: int,
    fingerprint: Callable[[Request], str],
) -> JobdirFind:
    """Find ``request`` (by fingerprint) among the pending requests, the dead letters
    and the seen set.  Journal records carry the fingerprint: no request is decoded."""
    wanted = fingerprint(request)
    journaled = _journaled(jobdir)
    deadletter_path = os.path.join(jobdir, _DEADLETTER_FILE)
    found: JobdirEntry | None = None
    lane: list[JobdirEntry] = []
    fps = {e.seq: fp for e in journaled.entries if (fp := journaled.state.live.get(e.seq))}
    for entry in journaled.entries:
        if found is None and fps.get(entry.seq) == wanted:
            found = entry
        lane.append(entry)
    seen: bool | None = wanted in journaled.state.seen()
    bucket: int | None = journaled.directory.lookup(key_hash)
    ahead = 0
    if found is not None:
        # Ahead in its lane: same topic and slot, served by priority then FIFO.
        ahead = sum(
            1 for e in lane
            if e.topic == found.topic and e.slot == found.slot
            and (-e.priority, e.seq) < (-found.priority, found.seq)
        )  # fmt: skip
        bucket = found.bucket
    dead_reason = None
    if found is None and os.path.exists(deadletter_path):
        with open(deadletter_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and (
                    rec.get("url") == request.url or _payload_url(rec) == request.url
                ):
                    dead_reason = f"{rec.get('when', '?')}: {rec.get('error', '?')}"
                    break
    if found is not None:
        state = "queued"
    elif dead_reason is not None:
        state = "dead"
    elif seen:
        state = "done"
    else:
        state = "unknown"
    return JobdirFind(state, bucket, seen, found, ahead if found else None, dead_reason)


def _payload_url(rec: dict[str, Any]) -> str | None:
    """The URL of a dead-lettered journal line, if it can be read."""
    payload = rec.get("payload")
    if not isinstance(payload, str):
        return None
    try:
        return str(json.loads(parse_enqueue(payload + "\n").payload).get("url"))
    except (ValueError, AttributeError):
        return None
