"""The operator's read model of one node's JOBDIR (``scrapy banker status --jobdir``).

:class:`~scrapy_banker.scheduler.BankerScheduler` keeps ``JOBDIR/banker/``
(see :mod:`scrapy_banker.scheduler.jobdir`): a snapshot and the journal
appended since, replayed here exactly as a resume would replay them -- so
the view is right during a crawl and after a ``kill -9``, not only after a
clean stop.  The clean-stop-only layout of earlier versions (``state.json``
and ``queues/<bucket>.jsonl``, seen set in Scrapy's ``requests.seen``) is
still read.  What could not be saved or restored is in
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
from scrapy_banker.scheduler.jobdir import (
    SNAPSHOT,
    STATE_VERSION,
    live_records,
    read_seen_file,
    replay,
)
from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Request

__all__ = [
    "JobdirEntry",
    "JobdirView",
    "find_in_jobdir",
    "jobdir_directory",
    "read_jobdir",
]

#: Same numbering as :data:`scrapy_banker.ops.fleet.SCHEMA_VERSION`.
SCHEMA_VERSION = 1


def _paths(jobdir: str) -> tuple[str, str, str, str]:
    banker = os.path.join(jobdir, "banker")
    return (
        os.path.join(banker, "state.json"),
        os.path.join(banker, "queues"),
        os.path.join(jobdir, "banker-deadletter.jsonl"),
        os.path.join(jobdir, "requests.seen"),
    )


def _state(jobdir: str) -> dict[str, Any]:
    """``state.json``, or ``ValueError`` saying in one line what is missing."""
    if not os.path.isdir(jobdir):
        raise ValueError(f"no JOBDIR at {jobdir}")
    state_path = _paths(jobdir)[0]
    if not os.path.exists(state_path):
        raise ValueError(
            f"{jobdir} holds no scrapy-banker state (neither banker/{SNAPSHOT} nor the "
            "older banker/state.json: the crawl used another scheduler, or never started)"
        )
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {state_path}: {exc}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise ValueError(
            f"{state_path}: unsupported state version {version!r} "
            f"(this scrapy-banker reads version {STATE_VERSION})"
        )
    return state


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
    #: FIFO order within a lane (the line number in the old layout).
    seq: int = 0


def _entries(queues: str, only: int | None = None) -> Iterator[JobdirEntry | tuple[str, int]]:
    """Saved entries, or ``(file, line)`` for a line that is not a valid entry."""
    names = sorted(os.listdir(queues)) if os.path.isdir(queues) else []
    for name in names:
        stem = name.removesuffix(".jsonl")
        if not stem.isdigit() or (only is not None and int(stem) != only):
            continue
        with open(os.path.join(queues, name), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                try:
                    rec = json.loads(line)
                    yield JobdirEntry(
                        int(stem), lineno, str(rec["topic"]), str(rec["slot"]), str(rec["key"]),
                        int(rec["hash"]), int(rec["priority"]), dict(rec["request"]), lineno,
                    )  # fmt: skip
                except (ValueError, KeyError, TypeError):
                    yield name, lineno


def _seen(path: str) -> set[str] | None:
    """Hex fingerprints in Scrapy's ``requests.seen`` (None: no such file)."""
    return read_seen_file(path)


@dataclass
class _Journaled:
    """A snapshot + journal JOBDIR, replayed."""

    state: JournalState
    entries: list[JobdirEntry]
    directory: ExtendibleDirectory[str] | None
    saved_directory: bool


def _journaled(jobdir: str) -> _Journaled | None:
    """Replay the snapshot layout (None: this JOBDIR has none)."""
    path = os.path.join(jobdir, "banker")
    if not os.path.exists(os.path.join(path, SNAPSHOT)):
        return None
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
    return _Journaled(state, entries, final, directory is not None)


@dataclass(frozen=True)
class JobdirView:
    """What one node's JOBDIR holds since its last clean stop."""

    path: str
    #: Requests saved (``state.json``'s count) and found in the bucket files.
    pending: int
    queued: int
    #: topic -> requests saved for it; its time slice and dispatch count.
    topics: dict[str, dict[str, Any]]
    #: bucket -> (requests, distinct queue keys).
    buckets: dict[int, tuple[int, int]]
    #: The slots (hosts) with most saved requests, most first.
    top_slots: tuple[tuple[str, int], ...]
    #: Directory shape: global depth, buckets (None: not saved, rebuilt on resume).
    global_depth: int | None
    n_buckets: int | None
    #: Lines of the bucket files that are not valid entries.
    malformed: int
    #: ``banker-deadletter.jsonl``: entries, by ``when`` (save / restore).
    dead_letters: int
    dead_letter_kinds: dict[str, int]
    #: Fingerprints in Scrapy's ``requests.seen`` (None: no such file).
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
    if not os.path.isdir(jobdir):
        raise ValueError(f"no JOBDIR at {jobdir}")
    _, queues, deadletter_path, seen_path = _paths(jobdir)
    journaled = _journaled(jobdir)
    entries: list[JobdirEntry | tuple[str, int]]
    if journaled is not None:
        header = journaled.state.header or {}
        entries = list(journaled.entries)
        malformed = len(journaled.state.malformed)
        saved_topics = (header.get("topics") or {}).get("topics") or {}
        directory = journaled.directory
        pending = len(journaled.state.live)
        seen: int | None = len(journaled.state.seen())
    else:
        state = _state(jobdir)
        entries = list(_entries(queues))
        malformed = 0
        saved_topics = (state.get("topics") or {}).get("topics") or {}
        saved = state.get("directory")
        directory = None if not saved else ExtendibleDirectory.from_state(saved)
        pending = int(state.get("pending", 0))
        fingerprints = _seen(seen_path)
        seen = None if fingerprints is None else len(fingerprints)
    per_topic: Counter[str] = Counter()
    per_slot: Counter[str] = Counter()
    per_bucket: Counter[int] = Counter()
    keys: dict[int, set[str]] = {}
    for entry in entries:
        if isinstance(entry, tuple):
            malformed += 1
            continue
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
        pending=pending,
        queued=sum(per_bucket.values()),
        topics=topics,
        buckets={b: (n, len(keys[b])) for b, n in per_bucket.items()},
        top_slots=tuple(per_slot.most_common(top)),
        global_depth=None if directory is None else directory.global_depth,
        n_buckets=None if directory is None else directory.n_buckets,
        malformed=malformed,
        dead_letters=dead,
        dead_letter_kinds=dict(kinds),
        seen=seen,
    )


def jobdir_directory(jobdir: str) -> ExtendibleDirectory[str] | None:
    """The extendible-hash directory (None: not saved, the crawl rebuilds it).

    In the snapshot layout: the one saved at a clean stop, else the pending
    requests' keys filed into a default-shaped one.
    """
    journaled = _journaled(jobdir)
    if journaled is not None:
        return journaled.directory
    state = _state(jobdir)
    directory = state.get("directory")
    return None if not directory else ExtendibleDirectory.from_state(directory)


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
    codec: RequestCodec | None = None,
) -> JobdirFind:
    """Find ``request`` (by fingerprint) among the pending requests, the dead letters
    and the seen set.  In the old layout only the bucket its hash maps to is read."""
    codec = codec or RequestCodec()
    wanted = fingerprint(request)
    _, queues, deadletter_path, seen_path = _paths(jobdir)
    found: JobdirEntry | None = None
    lane: list[JobdirEntry] = []
    journaled = _journaled(jobdir) if os.path.isdir(jobdir) else None
    if journaled is not None:
        # Journal records carry the fingerprint: no request is decoded.
        fps = {e.seq: fp for e in journaled.entries if (fp := journaled.state.live.get(e.seq))}
        for entry in journaled.entries:
            if found is None and fps.get(entry.seq) == wanted:
                found = entry
            lane.append(entry)
        seen: bool | None = wanted in journaled.state.seen()
        bucket = None if journaled.directory is None else journaled.directory.lookup(key_hash)
    else:
        directory = jobdir_directory(jobdir)
        bucket = None if directory is None else directory.lookup(key_hash)
        for item in _entries(queues, only=bucket):
            if isinstance(item, tuple):
                continue
            entry = item
            bare = {k: v for k, v in entry.request.items() if k not in ("callback", "errback")}
            try:
                saved = codec.decode(json.dumps(bare))
            except MalformedPayload:
                continue
            if found is None and fingerprint(saved) == wanted:
                found = entry
            lane.append(entry)
        fingerprints = _seen(seen_path)
        seen = None if fingerprints is None else wanted in fingerprints
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
