"""A single node's dead letters (``JOBDIR/banker-deadletter.jsonl``): listing them, and
putting the ones that carry a journal record back into the JOBDIR's journal.

:class:`~scrapy_banker.scheduler.jobdir.JobDir` writes two kinds of letter:

* ``"when": "restore"`` -- an entry a resume could not read back, with the
  whole journal line it came from as ``payload`` (and ``file``, ``line``,
  ``error``).  When that line parses as an ``E`` record
  (:func:`~scrapy_banker.core.journal.parse_enqueue`) the letter can be requeued;
* ``"when": "save"`` -- a request only memory held at a clean stop (``url``,
  ``method``, ``error``): nothing of it was written, so it cannot be
  requeued; it is listed, and a requeue leaves it and says why;
* ``"when": "pushback"`` -- a request given up on because its host refused
  past :setting:`BANKER_PUSHBACK_MAX_REFUSALS` (``error``: ``pushback: <host>
  refused N times``; ``host``, ``url``, ``method``), written by
  :meth:`~scrapy_banker.scheduler.jobdir.JobDir.dead_letter_refused` with the
  journal ``E`` record a resume would read as ``payload`` -- requeued exactly
  like a restore letter.  One whose request could not be encoded has no
  payload: listed, not requeueable.  After a requeue the next resume sends
  the host one request again (once its last ``Retry-After`` or backoff is
  over); if it still refuses, its requests come back here.

A letter's request payload is checked with the project's JSON codec and no
spider, as a fleet's is (:func:`~scrapy_banker.ops.payloads.check_payload`):
callback and errback names are set aside (only
:func:`~scrapy_banker.scheduler.serialize.method_name_problem` is asked about them --
whether the spider has the method is known only to the crawl), the rest must
decode.  What the codec refuses is the letter's ``payload_error``; such a
letter is still requeued if asked, and the next resume dead-letters it again,
which the listing says beforehand.

Requeue (:func:`requeue`), under the JOBDIR lock
(:class:`~scrapy_banker.scheduler.jobdir.JobdirLock`: never beside a crawl,
:class:`~scrapy_banker.scheduler.jobdir.JobdirLocked` otherwise, nothing
changed):

1. the snapshot and journal are replayed
   (:func:`~scrapy_banker.scheduler.jobdir.replay`) for the current
   generation and the next free sequence number;
2. each chosen letter becomes a NEW ``E`` record -- a fresh sequence number
   from that ``next_seq`` on, the same fingerprint, topic, slot, queue key,
   hash, priority and payload text (never re-encoded) -- and all of them are
   appended to the current generation's journal in one ``O_APPEND`` write,
   then ``fsync``'d.  A final line cut short by a kill is cut off first, as
   a resume would skip it, so the new records start on a line of their own;
3. ``banker-deadletter.jsonl`` is rewritten without those letters, every
   other line byte for byte (temporary file, ``fsync``, ``os.replace``).

A crash between 2 and 3 leaves a letter both queued and listed -- a
duplicate fetch at worst, never a loss.  A letter whose fingerprint is
already pending in the journal (such an interrupted requeue, or two letters
of one request) is not queued again: it is only taken off the list.  The
next resume replays the new records like any journal record (its log says
the journal was replayed, and it compacts): every journaled fingerprint is
in the seen set, and pending requests are queued without passing the
dupefilter, so the requests are fetched, once.

``count``: the first N letters that can be requeued, in file order (None:
all); the letters that cannot, met on the way, are reported and left.

Everything here is typed and free of Scrapy beyond the codec; the command
(:mod:`scrapy_banker.ops.commands.deadletters`) only prints.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.files import fsync_dir
from scrapy_banker.core.journal import Enqueued, JournalState, enqueue_line, parse_enqueue
from scrapy_banker.ops.payloads import check_payload
from scrapy_banker.scheduler.jobdir import (
    DEADLETTERS,
    SNAPSHOT,
    JobdirLock,
    journal_name,
    replay,
)
from scrapy_banker.scheduler.serialize import RequestCodec

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "DEADLETTER_FILE",
    "SCHEMA_VERSION",
    "JobdirLetter",
    "RequeueOutcome",
    "RequeuePlan",
    "journal_dir",
    "list_letters",
    "parse_letter",
    "pending_fingerprints",
    "plan_requeue",
    "read_letters",
    "requeue",
    "without_lines",
]

#: Same numbering as :data:`scrapy_banker.ops.jobdir_view.SCHEMA_VERSION`.
SCHEMA_VERSION = 1
#: The file's name, as its one writer (:func:`scrapy_banker.scheduler.jobdir.append_dead_letter`)
#: names it.
DEADLETTER_FILE = DEADLETTERS

_SAVE_WHY = "only memory held it at a clean stop: nothing was saved, no payload to queue"
#: Letters whose ``payload`` is a journal ``E`` record a requeue appends again.
_REQUEUEABLE_KINDS = frozenset({"restore", "pushback"})


@dataclass(frozen=True)
class JobdirLetter:
    """One line of ``banker-deadletter.jsonl``: why it is there, what it would fetch."""

    #: Its line number in the file as read (1 = first line).
    line: int
    #: ``restore``, ``save``, ``pushback``, ``unreadable`` (not a JSON object), or what the
    #: letter says.
    when: str
    #: Why the crawl dead-lettered it.
    error: str
    #: ``FILE:LINE`` of the entry a resume could not read back (restore letters).
    source: str | None = None
    url: str | None = None
    method: str | None = None
    callback: str | None = None
    topic: str | None = None
    priority: int | None = None
    fingerprint: str | None = None
    #: The ``E`` record a requeue appends again (None: the letter cannot be requeued).
    record: Enqueued | None = None
    #: What the codec says of the request payload now, without a spider (None: it decodes).
    payload_error: str | None = None
    #: Why the letter cannot be requeued (None: it can).
    why_not: str | None = None
    #: Set by :func:`list_letters`: the sequence number under which its fingerprint is
    #: pending in the journal already (a requeue only takes such a letter off the list).
    queued_as: int | None = None

    @property
    def requeueable(self) -> bool:
        return self.record is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "when": self.when,
            "error": self.error,
            "source": self.source,
            "url": self.url,
            "method": self.method,
            "callback": self.callback,
            "topic": self.topic,
            "priority": self.priority,
            "fingerprint": self.fingerprint,
            "payload_error": self.payload_error,
            "requeueable": self.requeueable,
            "why_not": self.why_not,
            "queued_as": self.queued_as,
        }


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_letter(line: int, text: str, codec: RequestCodec) -> JobdirLetter:
    """Read one dead letter (``text`` without its newline); never raises."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        data, why = None, f"not JSON: {exc}"
    else:
        why = f"not a JSON object: {type(data).__name__}"
    if not isinstance(data, dict):
        return JobdirLetter(line, "unreadable", f"unreadable dead letter ({why})",
                            why_not="unreadable dead letter")  # fmt: skip
    when = str(data.get("when", "unknown"))
    error = str(data.get("error", ""))
    file, file_line = data.get("file"), data.get("line")
    source = f"{file}:{file_line}" if file is not None else None
    url, method = _str(data.get("url")), _str(data.get("method"))
    letter = JobdirLetter(line, when, error, source, url, method)
    if when == "save":
        return replace(letter, why_not=_SAVE_WHY)
    if when not in _REQUEUEABLE_KINDS:
        return replace(letter, why_not=f"a letter of unknown kind {when!r}")
    payload = data.get("payload")
    if not isinstance(payload, str):
        return replace(letter, why_not="no payload stored")
    try:
        record = parse_enqueue(payload + "\n")
    except ValueError as exc:
        return replace(
            letter,
            why_not=f"its payload is not a journal E record ({exc}): a malformed line; "
            "nothing to queue",
        )
    raw, payload_error = check_payload(record.payload, codec)
    raw = raw or {}
    return replace(
        letter,
        url=_str(raw.get("url")) or url,
        method=_str(raw.get("method")) or method,
        callback=_str(raw.get("callback")),
        topic=record.topic,
        priority=record.priority,
        fingerprint=record.fingerprint,
        record=record,
        payload_error=payload_error,
    )


def _lines(path: str) -> list[bytes]:
    """The file's lines without their newlines (none if it does not exist)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the newline ending the last line
    return lines


def read_letters(jobdir: str, codec: RequestCodec | None = None) -> list[JobdirLetter]:
    """Every dead letter of ``jobdir``, in file order (blank lines are no letters)."""
    codec = codec or RequestCodec()
    out = []
    for n, raw in enumerate(_lines(os.path.join(jobdir, DEADLETTER_FILE)), 1):
        text = raw.decode("utf-8", errors="replace")
        if text.strip():
            out.append(parse_letter(n, text, codec))
    return out


def pending_fingerprints(state: JournalState) -> dict[str, int]:
    """Fingerprint -> sequence number of the requests pending after a replay (not ``""``)."""
    return {fp: seq for seq, fp in state.live.items() if fp}


def journal_dir(jobdir: str) -> str:
    """``jobdir/banker``; ``ValueError`` in one line if it holds neither a snapshot nor a
    journal (no scrapy-banker JOBDIR)."""
    if not os.path.isdir(jobdir):
        raise ValueError(f"no JOBDIR at {jobdir}")
    path = os.path.join(jobdir, "banker")
    names = set(os.listdir(path)) if os.path.isdir(path) else set()
    if SNAPSHOT in names or any(n.startswith("journal-") for n in names):
        return path
    raise ValueError(
        f"{jobdir} holds no scrapy-banker journal (neither banker/{SNAPSHOT} nor a "
        "banker/journal-*.jsonl: the crawl used another scheduler, or never started)"
    )


def list_letters(jobdir: str, codec: RequestCodec | None = None) -> list[JobdirLetter]:
    """:func:`read_letters`, each marked with the sequence number it is pending under, if any.

    Reads only (no lock): during a crawl this is a view of a moving JOBDIR.
    """
    path = journal_dir(jobdir)
    letters = read_letters(jobdir, codec)
    pending = pending_fingerprints(replay(path)[0])
    return [
        replace(d, queued_as=pending.get(d.fingerprint)) if d.fingerprint else d for d in letters
    ]


@dataclass(frozen=True)
class RequeuePlan:
    """What a requeue does to each letter it looks at (nothing written yet)."""

    #: (letter, its new sequence number, its new ``E`` line with newline)
    requeued: tuple[tuple[JobdirLetter, int, str], ...]
    #: (letter, the sequence number its fingerprint is pending under): only taken off the list
    already_queued: tuple[tuple[JobdirLetter, int], ...]
    #: (letter, why it is left on the list)
    skipped: tuple[tuple[JobdirLetter, str], ...]

    @property
    def removed(self) -> frozenset[int]:
        """Line numbers of the letters taken off the list."""
        return frozenset(
            [d.line for d, _, _ in self.requeued] + [d.line for d, _ in self.already_queued]
        )

    def journal_text(self) -> str:
        """The new ``E`` records, in order: one append."""
        return "".join(line for _, _, line in self.requeued)


def plan_requeue(
    letters: Sequence[JobdirLetter],
    count: int | None,
    next_seq: int,
    pending: Mapping[str, int],
) -> RequeuePlan:
    """Choose the letters and build their new ``E`` records (sequence numbers from ``next_seq``).

    ``count``: how many letters to take off the list (None: all that can be);
    ``pending``: fingerprint -> sequence number of requests already pending.
    """
    if count is not None and count < 1:
        raise ValueError(f"count must be None or >= 1, got {count}")
    queued = dict(pending)
    seq = next_seq
    requeued: list[tuple[JobdirLetter, int, str]] = []
    already: list[tuple[JobdirLetter, int]] = []
    skipped: list[tuple[JobdirLetter, str]] = []
    for letter in letters:
        if count is not None and len(requeued) + len(already) >= count:
            break
        rec = letter.record
        if rec is None:
            skipped.append((letter, letter.why_not or "cannot be requeued"))
            continue
        if rec.fingerprint and rec.fingerprint in queued:
            already.append((letter, queued[rec.fingerprint]))
            continue
        line = enqueue_line(seq, rec.fingerprint, rec.topic, rec.slot, rec.key, rec.key_hash,
                            rec.priority, rec.payload)  # fmt: skip
        requeued.append((letter, seq, line))
        if rec.fingerprint:
            queued[rec.fingerprint] = seq
        seq += 1
    return RequeuePlan(tuple(requeued), tuple(already), tuple(skipped))


def without_lines(lines: Iterable[bytes], removed: frozenset[int]) -> bytes:
    """The file's content without the lines numbered in ``removed`` (1 = first line)."""
    return b"".join(line + b"\n" for n, line in enumerate(lines, 1) if n not in removed)


@dataclass(frozen=True)
class RequeueOutcome:
    """What :func:`requeue` did."""

    jobdir: str
    #: The journal file the records were appended to.
    journal: str
    plan: RequeuePlan
    #: Letters still on the list afterwards.
    left: int
    #: Whether a final journal line cut short by a kill was cut off before the append.
    cut_tail: bool

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "schema": SCHEMA_VERSION,
            "kind": "requeue-jobdir",
            "jobdir": self.jobdir,
            "journal": self.journal,
            "requeued": [{**d.to_json(), "new_seq": seq} for d, seq, _ in plan.requeued],
            "already_queued": [{**d.to_json(), "seq": seq} for d, seq in plan.already_queued],
            "skipped": [{**d.to_json(), "why": why} for d, why in plan.skipped],
            "left": self.left,
            "cut_tail": self.cut_tail,
        }


def requeue(jobdir: str, count: int | None, codec: RequestCodec | None = None) -> RequeueOutcome:
    """Requeue dead letters into ``jobdir``'s journal (the module docstring's steps).

    ``ValueError`` (one line) if there is nothing to requeue into,
    :class:`~scrapy_banker.scheduler.jobdir.JobdirLocked` if a crawl holds the
    JOBDIR; nothing is changed in either case.
    """
    path = journal_dir(jobdir)
    lock = JobdirLock(jobdir)
    lock.acquire()
    try:
        letters = read_letters(jobdir, codec)
        state, _ = replay(path)
        generation = 0 if state.header is None else int(state.header.get("generation", 0))
        plan = plan_requeue(letters, count, state.next_seq, pending_fingerprints(state))
        journal = journal_name(generation)
        cut = False
        if plan.requeued:
            cut = _append(os.path.join(path, journal), plan.journal_text().encode())
        if plan.removed:
            letters_path = os.path.join(jobdir, DEADLETTER_FILE)
            _replace(letters_path, without_lines(_lines(letters_path), plan.removed))
    finally:
        lock.release()
    return RequeueOutcome(jobdir, journal, plan, len(letters) - len(plan.removed), cut)


def _tail_without_newline(fd: int, size: int) -> int:
    """Bytes after the file's last newline (a final line cut short), 0 if it ends with one."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        os.lseek(fd, start, os.SEEK_SET)  # reads only: O_APPEND writes go to the end anyway
        chunk = os.read(fd, end - start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return size - (start + at + 1)
        end = start
    return size


def _append(journal: str, data: bytes) -> bool:
    """Append ``data`` in one ``O_APPEND`` write and ``fsync`` it; True if a cut tail was dropped.

    The ``fsync`` comes before the dead-letter list is rewritten, so not even
    power loss can leave a letter off the list and out of the journal.
    """
    created = not os.path.exists(journal)
    fd = os.open(journal, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        tail = _tail_without_newline(fd, size)
        if tail:
            os.ftruncate(fd, size - tail)
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(os.path.dirname(journal))
    return tail > 0


def _replace(path: str, content: bytes) -> None:
    """Write ``path`` anew atomically: a temporary file, ``fsync``, ``os.replace``."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        shutil.copymode(path, tmp)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
