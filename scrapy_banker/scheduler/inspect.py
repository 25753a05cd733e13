"""The operator's read model of one node's JOBDIR (``scrapy banker status --jobdir``).

A clean stop of :class:`~scrapy_banker.scheduler.BankerScheduler` writes
``JOBDIR/banker/`` (see :mod:`scrapy_banker.scheduler.jobdir`): the topic
state and extendible-hash directory in ``state.json``, the pending requests as
JSON lines per directory bucket in ``queues/``, and what could not be saved or
restored in ``JOBDIR/banker-deadletter.jsonl``.  Scrapy's dupefilter keeps its
fingerprints in ``JOBDIR/requests.seen``.  This module reads those files --
never writes, never unpickles -- into views with a stable ``to_json()``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.directory import ExtendibleDirectory
from scrapy_banker.scheduler.jobdir import STATE_VERSION
from scrapy_banker.serialize import MalformedPayload, RequestCodec

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

#: Same numbering as :data:`scrapy_banker.redis.inspect.SCHEMA_VERSION`.
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
            f"{jobdir} holds no scrapy-banker state ({state_path} missing: the crawl never "
            "stopped cleanly with this JOBDIR, or used another scheduler)"
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
                        int(rec["hash"]), int(rec["priority"]), dict(rec["request"]),
                    )  # fmt: skip
                except (ValueError, KeyError, TypeError):
                    yield name, lineno


def _seen(path: str) -> set[str] | None:
    """Hex fingerprints in Scrapy's ``requests.seen`` (None: no such file).

    Scrapy >= 2.14 writes each fingerprint as a 2-byte big-endian length and
    its bytes; older versions one hex fingerprint per line.  Both are read.
    """
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    out: set[str] = set()
    i = 0
    while i + 2 <= len(data):
        size = int.from_bytes(data[i : i + 2], "big")
        if not 0 < size <= 64 or i + 2 + size > len(data):
            break
        out.add(data[i + 2 : i + 2 + size].hex())
        i += 2 + size
    if i == len(data):
        return out
    text = data.decode("ascii", errors="replace")
    return {line.strip() for line in text.splitlines() if line.strip()}


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
    state = _state(jobdir)
    _, queues, deadletter_path, seen_path = _paths(jobdir)
    per_topic: Counter[str] = Counter()
    per_slot: Counter[str] = Counter()
    per_bucket: Counter[int] = Counter()
    keys: dict[int, set[str]] = {}
    malformed = 0
    for entry in _entries(queues):
        if isinstance(entry, tuple):
            malformed += 1
            continue
        per_topic[entry.topic] += 1
        per_slot[entry.slot] += 1
        per_bucket[entry.bucket] += 1
        keys.setdefault(entry.bucket, set()).add(entry.key)
    saved_topics = (state.get("topics") or {}).get("topics") or {}
    topics: dict[str, dict[str, Any]] = {}
    for name in sorted(set(per_topic) | set(saved_topics)):
        saved = saved_topics.get(name) or {}
        topics[name] = {
            "queued": per_topic.get(name, 0),
            "slice_s": saved.get("slice_total"),
            "dispatched": saved.get("dispatched"),
        }
    directory = state.get("directory")
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
        pending=int(state.get("pending", 0)),
        queued=sum(per_bucket.values()),
        topics=topics,
        buckets={b: (n, len(keys[b])) for b, n in per_bucket.items()},
        top_slots=tuple(per_slot.most_common(top)),
        global_depth=None if not directory else int(directory.get("global_depth", 0)),
        n_buckets=None if not directory else len(directory.get("buckets", [])) or None,
        malformed=malformed,
        dead_letters=dead,
        dead_letter_kinds=dict(kinds),
        seen=None if (fingerprints := _seen(seen_path)) is None else len(fingerprints),
    )


def jobdir_directory(jobdir: str) -> ExtendibleDirectory[str] | None:
    """The saved extendible-hash directory (None: not saved, the crawl rebuilds it)."""
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
    """Find ``request`` (by fingerprint) in the bucket its hash maps to, the dead letters
    and Scrapy's seen file.  Only one bucket file is read."""
    codec = codec or RequestCodec()
    directory = jobdir_directory(jobdir)
    _, queues, deadletter_path, seen_path = _paths(jobdir)
    wanted = fingerprint(request)
    bucket = None if directory is None else directory.lookup(key_hash)
    found: JobdirEntry | None = None
    ahead = 0
    lane: list[JobdirEntry] = []
    for entry in _entries(queues, only=bucket):
        if isinstance(entry, tuple):
            continue
        bare = {k: v for k, v in entry.request.items() if k not in ("callback", "errback")}
        try:
            saved = codec.decode(json.dumps(bare))
        except MalformedPayload:
            continue
        if found is None and fingerprint(saved) == wanted:
            found = entry
        lane.append(entry)
    if found is not None:
        # Ahead in its lane: same topic and slot, served by priority then FIFO.
        ahead = sum(
            1 for e in lane
            if e.topic == found.topic and e.slot == found.slot
            and (-e.priority, e.line) < (-found.priority, found.line)
        )  # fmt: skip
        bucket = found.bucket
    fingerprints = _seen(seen_path)
    seen = None if fingerprints is None else wanted in fingerprints
    dead_reason = None
    if found is None and os.path.exists(deadletter_path):
        with open(deadletter_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("url") == request.url:
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
