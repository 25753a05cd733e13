"""Spill files: a fleet worker's queue operations Redis never received, kept on disk.

Why: a worker holds its queue operations (the children a callback yielded,
acks, nacks, dead letters) in memory while Redis is unreachable, and sends
them when Redis comes back.  If Redis is still gone when the worker stops,
those operations would die with the process -- and the enqueues among them
are requests nobody else knows about.  So they are written here, and the
next worker started with the same spill directory replays them into Redis.

Replaying is safe to repeat: an enqueue goes through the crawl's normal
dedup (a request already queued or fetched is dropped), and an ack, nack or
dead letter names one delivery (``id#delivery``), so a stale one -- the
lease expired and the request went to another worker -- changes nothing.
Only ``dont_filter`` requests, which opt out of dedup, may be queued twice by
a replay that is cut short and repeated.

Format (JSON lines, never pickle; every line carries ``"v"``, the format
version)::

    {"v":1,"kind":"header","prefix":"banker:s","partitions":1024,"node":"n1","written":"..."}
    {"v":1,"op":"enqueue","p":7,"fp":"FP","prio":0,"df":false,"payload":"..."}
    {"v":1,"op":"dead","p":7,"id":"ID","d":2,"reason":"..."}
    {"v":1,"op":"ack","p":7,"id":"ID","d":1}
    {"v":1,"op":"nack","p":7,"id":"ID","d":1}
    {"v":1,"op":"revisit","p":7,"url":"URL","s":"STATE","due":1.5e9,"r":"PAYLOAD"}

The operations are the worker's own values
(:class:`~scrapy_banker.core.ops.EnqueueOp`,
:class:`~scrapy_banker.core.ops.LeaseToken`,
:class:`~scrapy_banker.core.ops.RevisitWrite`: a page's revisit state,
sent with the enqueues, so the ack of the fetch that made it never lands
before it); a token's ``leased_at`` and
``epoch`` are not written, as they are not part of its identity.  Ids and
fingerprints are opaque strings here.  A line that does not parse
(a torn write, a hand edit, a newer version) is reported, never fatal: the
caller keeps it in a ``.bad`` file and replays the rest.

This module is the pure part (format, parse, merge) plus the file handling
(atomic write, exclusive claim); it imports nothing from Scrapy, Twisted or
redis-py so it is testable with plain pytest.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from scrapy_banker.core.files import fsync_dir
from scrapy_banker.core.ops import EnqueueOp, LeaseToken, RevisitWrite

try:  # POSIX: two workers never replay the same file at once
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SPILL_VERSION",
    "BadLine",
    "ClaimedSpill",
    "ParsedSpill",
    "SpillDir",
    "SpillHeader",
    "SpillOps",
    "format_spill",
    "merge",
    "parse_spill",
]

#: The format version every line carries; a line of another version is bad.
SPILL_VERSION = 1
#: Spill files are ``spill-<UTC time>-<node>.jsonl``; other names are left alone.
SPILL_GLOB = "spill-*.jsonl"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class SpillOps:
    """Operations not sent, in the order they must be sent: enqueues (and revisit states),
    dead letters, acks, nacks.

    Enqueues go first for the same reason as in a live flush: a parent's ack
    must never land before the children its callback yielded.
    """

    enqueues: list[EnqueueOp] = field(default_factory=list)
    dead: list[tuple[LeaseToken, str]] = field(default_factory=list)
    acks: list[LeaseToken] = field(default_factory=list)
    nacks: list[LeaseToken] = field(default_factory=list)
    #: Pages' revisit states (the latest of each URL).
    revisits: list[RevisitWrite] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.enqueues) + len(self.dead) + len(self.acks) + len(self.nacks)
            + len(self.revisits)
        )  # fmt: skip

    def counts(self) -> dict[str, int]:
        """Operations of each kind, for the log and the stats."""
        return {
            "enqueue": len(self.enqueues),
            "dead": len(self.dead),
            "ack": len(self.acks),
            "nack": len(self.nacks),
            "revisit": len(self.revisits),
        }

    def describe(self) -> str:
        """``"3 enqueues, 0 dead letters, 2 acks, 1 nack"`` for a log line."""
        c = self.counts()
        return (
            f"{_n(c['enqueue'], 'enqueue')}, {_n(c['dead'], 'dead letter')}, "
            f"{_n(c['ack'], 'ack')}, {_n(c['nack'], 'nack')}"
            + (f", {_n(c['revisit'], 'revisit state')}" if c["revisit"] else "")
        )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class SpillHeader:
    """Which crawl a spill belongs to: replaying it into another would be wrong."""

    prefix: str
    partitions: int
    node: str = ""
    written: str = ""


@dataclass(frozen=True)
class BadLine:
    """A line that could not be read, kept verbatim for the ``.bad`` file."""

    number: int
    text: str
    reason: str


@dataclass
class ParsedSpill:
    header: SpillHeader | None
    ops: SpillOps
    bad: list[BadLine]


# -- format ---------------------------------------------------------------------------


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def _lease(op: str, lease: LeaseToken, **extra: Any) -> str:
    return _line(
        {"v": SPILL_VERSION, "op": op, "p": lease.partition, "id": lease.id,
         "d": lease.delivery, **extra}
    )  # fmt: skip


def format_spill(header: SpillHeader, ops: SpillOps) -> str:
    """The file's text: the header, then one line per operation, in sending order."""
    head = {"v": SPILL_VERSION, "kind": "header", "prefix": header.prefix,
            "partitions": header.partitions, "node": header.node,
            "written": header.written}  # fmt: skip
    out = [_line(head)]
    for e in ops.enqueues:
        op = {"v": SPILL_VERSION, "op": "enqueue", "p": e.partition, "fp": e.fingerprint,
              "prio": int(e.priority), "df": bool(e.dont_filter), "payload": e.payload}  # fmt: skip
        out.append(_line(op))
    for r in ops.revisits:
        out.append(_line({"v": SPILL_VERSION, "op": "revisit", "p": r.partition, "url": r.url,
                          "s": r.state, "due": r.due, "r": r.payload}))  # fmt: skip
    out.extend(_lease("dead", lease, reason=reason) for lease, reason in ops.dead)
    out.extend(_lease("ack", lease) for lease in ops.acks)
    out.extend(_lease("nack", lease) for lease in ops.nacks)
    return "".join(out)


# -- parse ----------------------------------------------------------------------------


class _Bad(ValueError):
    pass


def _int(obj: dict[str, Any], key: str, low: int = 0, high: int | None = None) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{key!r} must be an integer, got {value!r}")
    if value < low or (high is not None and value >= high):
        raise _Bad(f"{key!r}={value} out of range")
    return value


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (key != "reason" and not value):
        raise _Bad(f"{key!r} must be a non-empty string, got {value!r}")
    return value


def _parse_lease(obj: dict[str, Any], partitions: int) -> LeaseToken:
    return LeaseToken(_int(obj, "p", 0, partitions), _str(obj, "id"), _int(obj, "d", 1))


def parse_spill(text: str, partitions: int) -> ParsedSpill:
    """Read a spill file's text; partitions out of ``range(partitions)`` make a line bad.

    Never raises on content: whatever does not parse is returned in
    :attr:`ParsedSpill.bad` with the reason, and the rest is kept.
    """
    header: SpillHeader | None = None
    ops = SpillOps()
    bad: list[BadLine] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise _Bad(f"not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise _Bad("not a JSON object")
            if obj.get("v") != SPILL_VERSION:
                raise _Bad(f"unsupported version {obj.get('v')!r} (this reader: {SPILL_VERSION})")
            kind = obj.get("kind")
            if kind == "header":
                if header is not None:
                    raise _Bad("a second header")
                header = SpillHeader(
                    _str(obj, "prefix"), _int(obj, "partitions", 1),
                    str(obj.get("node", "")), str(obj.get("written", "")),
                )  # fmt: skip
                continue
            op = obj.get("op")
            if op == "enqueue":
                df = obj.get("df", False)
                payload = obj.get("payload")
                if not isinstance(df, bool):
                    raise _Bad(f"'df' must be a boolean, got {df!r}")
                if not isinstance(payload, str) or not payload:
                    raise _Bad("'payload' must be a non-empty string")
                prio = obj.get("prio", 0)
                if isinstance(prio, bool) or not isinstance(prio, int):
                    raise _Bad(f"'prio' must be an integer, got {prio!r}")
                ops.enqueues.append(
                    EnqueueOp(_int(obj, "p", 0, partitions), _str(obj, "fp"), payload, prio, df)
                )  # fmt: skip
            elif op == "revisit":
                due = obj.get("due")
                if isinstance(due, bool) or not isinstance(due, (int, float)):
                    raise _Bad(f"'due' must be a number, got {due!r}")
                payload = obj.get("r", "")
                if not isinstance(payload, str):
                    raise _Bad(f"'r' must be a string, got {payload!r}")
                ops.revisits.append(RevisitWrite(
                    _int(obj, "p", 0, partitions), _str(obj, "url"), _str(obj, "s"),
                    float(due), payload,
                ))  # fmt: skip
            elif op == "dead":
                ops.dead.append((_parse_lease(obj, partitions), _str(obj, "reason")))
            elif op == "ack":
                ops.acks.append(_parse_lease(obj, partitions))
            elif op == "nack":
                ops.nacks.append(_parse_lease(obj, partitions))
            else:
                raise _Bad(f"unknown op {op!r}")
        except _Bad as exc:
            bad.append(BadLine(number, raw, str(exc)))
    return ParsedSpill(header, ops, bad)


# -- merge ----------------------------------------------------------------------------


def merge(spills: Iterable[SpillOps]) -> SpillOps:
    """Several spills as one, in order, without repeating an operation.

    An enqueue that dedup would drop anyway (same fingerprint, same
    partition, not ``dont_filter``) is kept once; ``dont_filter`` ones are
    all kept, as the crawl asked for each.  Acks, nacks and dead letters of
    the same delivery are kept once; a page's revisit state is the latest
    one written (keeping an earlier payload when the latest has none).
    """
    out = SpillOps()
    seen_fp: set[tuple[int, str]] = set()
    seen_dead: set[LeaseToken] = set()
    seen_ack: set[LeaseToken] = set()
    seen_nack: set[LeaseToken] = set()
    revisits: dict[str, RevisitWrite] = {}
    for ops in spills:
        for r in ops.revisits:
            older = revisits.pop(r.url, None)
            revisits[r.url] = r if older is None else r.merged(older)
        for e in ops.enqueues:
            if not e.dont_filter:
                key = (e.partition, e.fingerprint)
                if key in seen_fp:
                    continue
                seen_fp.add(key)
            out.enqueues.append(e)
        for lease, reason in ops.dead:
            if lease not in seen_dead:
                seen_dead.add(lease)
                out.dead.append((lease, reason))
        for lease in ops.acks:
            if lease not in seen_ack:
                seen_ack.add(lease)
                out.acks.append(lease)
        for lease in ops.nacks:
            if lease not in seen_nack:
                seen_nack.add(lease)
                out.nacks.append(lease)
    out.revisits = list(revisits.values())
    return out


# -- files ----------------------------------------------------------------------------


@dataclass
class ClaimedSpill:
    """A spill file this process holds the lock of until it is replayed (or given up)."""

    path: Path
    parsed: ParsedSpill
    #: Where the malformed lines were kept, if any.
    bad_path: Path | None
    _handle: IO[bytes] | None = None

    def release(self, *, remove: bool) -> None:
        """Delete the file (Redis confirmed every operation) or leave it; drop the lock."""
        try:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                fsync_dir(self.path.parent)
        finally:
            if self._handle is not None:
                self._handle.close()  # releases the flock
                self._handle = None


class SpillDir:
    """The directory one crawl's spill files live in."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def files(self) -> list[Path]:
        """Spill files present, oldest first (the time is in the name)."""
        if not self.path.is_dir():
            return []
        return sorted(self.path.glob(SPILL_GLOB))

    def write(self, header: SpillHeader, ops: SpillOps) -> Path:
        """Write ``ops`` to a new file atomically: temp file, fsync, rename, fsync of the dir.

        A crash at any point leaves either no file or the whole file, never
        half of one.  Each spill gets its own name, so two workers stopping
        at once never overwrite each other.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        node = _UNSAFE.sub("_", header.node)[:80] or "node"
        final = self.path / f"spill-{stamp}-{node}-{os.getpid()}.jsonl"
        n = 1
        while final.exists():
            n += 1
            final = self.path / f"spill-{stamp}-{node}-{os.getpid()}-{n}.jsonl"
        _atomic_write(final, format_spill(header, ops))
        return final

    def claim(self, prefix: str, partitions: int) -> tuple[list[ClaimedSpill], list[Path]]:
        """Lock and read every spill file of this crawl; (claimed, files of another crawl).

        A file another live process holds (it is replaying it) is skipped.
        Malformed lines are written next to their file as ``<name>.bad`` and
        left out; the file itself is only removed once replayed.
        """
        claimed: list[ClaimedSpill] = []
        foreign: list[Path] = []
        for path in self.files():
            try:
                handle = path.open("rb")
            except FileNotFoundError:  # replayed and removed by another worker meanwhile
                continue
            if fcntl is not None:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    handle.close()
                    continue
            if not path.exists():  # removed between open and lock: already replayed
                handle.close()
                continue
            text = handle.read().decode("utf-8", errors="replace")
            parsed = parse_spill(text, partitions)
            header = parsed.header
            if header is not None and (header.prefix, header.partitions) != (prefix, partitions):
                handle.close()
                foreign.append(path)
                continue
            bad_path = None
            if parsed.bad:
                bad_path = path.with_name(path.name + ".bad")
                _atomic_write(bad_path, "".join(b.text + "\n" for b in parsed.bad))
            claimed.append(ClaimedSpill(path, parsed, bad_path, handle))
        return claimed, foreign


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
