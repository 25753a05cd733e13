"""JOBDIR persistence of the local queue: a snapshot and an append-only journal, never pickle.

Why a journal: a queue saved only at a clean stop (as Scrapy's JOBDIR saves
it) loses work to a ``kill -9``: ``requests.seen`` is then full of URLs
whose requests were never written -- they are neither fetched nor ever
queued again.  Here every request is written when it is queued, and every
completion when its callback's output has been scheduled, so whatever
moment the process dies at, a resume rebuilds the queue and the seen set
from the same records (see :mod:`scrapy_banker.core.journal` for the records and
the replay rule).

Files under ``JOBDIR/banker/``:

* ``snapshot.jsonl`` -- header (generation, topic state, directory after a
  clean stop, the hosts' politeness states), fingerprints of completed
  requests, pending requests;
* ``journal-<generation>.jsonl`` -- records appended since that snapshot.

Durability: each record is one unbuffered ``os.write``, so it is in the
kernel before ``enqueue_request`` returns and survives ``kill -9``; nothing
is ``fsync``'d per record (that would cost a disk flush per request).  A
compaction writes the next snapshot beside the current one, ``fsync``'s it,
swaps it in with ``os.replace`` (and ``fsync``'s the directory), then starts
the next generation's journal and deletes the old one -- a crash at any
point leaves either the old snapshot with its journal or the new one.  So
power loss (or a kernel crash) loses at most what was journaled since the
last compaction or clean stop.

Compaction happens at every resume that replayed a journal, at a clean stop,
and while crawling when the journal has as many records as the snapshot
(and at least :data:`COMPACT_MIN_RECORDS`), which bounds the journal by the
size of the state rather than by the crawl's length.

Entries that cannot be written or read back are logged, counted and kept
in ``JOBDIR/banker-deadletter.jsonl`` -- outside ``banker/`` -- and so are
requests given up on because their host kept refusing (``"when":
"pushback"``, with the journal ``E`` record a requeue appends again: see
:mod:`scrapy_banker.ops.jobdir_deadletters`).

The hosts' politeness states (:class:`~scrapy_banker.core.politeness.Politeness`:
``Retry-After`` blocks, backoff, Crawl-delay) are an optional ``"politeness"``
field of the snapshot header, written at every compaction and restored at
resume; a snapshot without it (an older version's) resumes with no state.
They are wall-clock times, so a block promised before a stop is honoured
after the resume.  A ``kill -9`` loses the changes since the last
compaction (the host is asked again, and answers again).  The pages fetched,
per host, per topic and in all, which budgets are counted against, are not
a copy of memory: a snapshot's ``"budgets"`` field counts the pages done
before it and each journal ``D`` record adds its pages (those not marked
``"u"``), so a resume -- after a clean stop or a ``kill -9`` -- counts
exactly the pages whose completion was journaled, and a request that was in
flight at a kill is fetched and counted again once (as a fleet does).

One process at a time: a crawl holds the advisory lock ``banker/lock``
(``flock``, exclusive, never waited for) from :meth:`JobDir.restore` to
:meth:`JobDir.close_journal`, so a second crawl on the same JOBDIR fails at
open instead of interleaving its journal with the first one's, and
``scrapy banker deadletters --jobdir --requeue`` (which writes the journal
too) refuses to run beside a crawl.  The kernel drops the lock when its
process ends, ``kill -9`` included: a stale lock never blocks a resume.
Where ``fcntl`` does not exist (Windows) no lock is taken.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from scrapy_banker.core.directory import ExtendibleDirectory
from scrapy_banker.core.files import fsync_dir
from scrapy_banker.core.journal import (
    SNAPSHOT_VERSION,
    Enqueued,
    JournalState,
    PageCounts,
    done_line,
    enqueue_line,
    header_line,
    needs_compaction,
    parse_enqueue,
    seen_lines,
)
from scrapy_banker.core.politeness import HostState
from scrapy_banker.errors import BankerError
from scrapy_banker.scheduler.classifier import Classified
from scrapy_banker.scheduler.serialize import MalformedPayload

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy import Request, Spider
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.core.directives import BudgetBook
    from scrapy_banker.core.politeness import Politeness
    from scrapy_banker.scheduler.queue import LocalQueue
    from scrapy_banker.scheduler.serialize import RequestCodec

logger = logging.getLogger(__name__)

__all__ = [
    "COMPACT_MIN_RECORDS",
    "DEADLETTERS",
    "JobDir",
    "JobdirLock",
    "JobdirLocked",
    "append_dead_letter",
]

#: A journal shorter than this is never compacted while crawling (a setting
#: candidate, ``BANKER_JOBDIR_COMPACT_MIN``; a module constant until then).
COMPACT_MIN_RECORDS = 100_000

SNAPSHOT = "snapshot.jsonl"
#: Dead letters, outside ``banker/`` (deleting that folder to start afresh keeps them).
DEADLETTERS = "banker-deadletter.jsonl"
LOCK = "lock"
#: ``flock`` errors that mean "this file system cannot lock", not "someone holds it".
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def append_dead_letter(jobdir: str, record: dict[str, Any]) -> None:
    """Keep ``record`` in ``JOBDIR/banker-deadletter.jsonl`` (one JSON line, appended).

    The one writer of that file: the queue's journal and the revisits' file
    (:mod:`scrapy_banker.scheduler.revisit_log`) both keep what they could
    not write or read back there.
    """
    with open(os.path.join(jobdir, DEADLETTERS), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


class UnresumableJobdir(BankerError, RuntimeError):
    """A JOBDIR this version cannot resume (written by another snapshot version).

    Found before the spider opens (:meth:`JobDir.check`), so the crawl stops
    with one line saying why and what to do, and nothing in the JOBDIR changes.
    """


def check_resumable(root: str) -> None:
    """Raise :class:`UnresumableJobdir` if ``root``'s snapshot has a layout this version
    does not read (its header line only is read; no snapshot: nothing to refuse)."""
    path = os.path.join(root, "banker", SNAPSHOT)
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except FileNotFoundError:
        return
    if not first.startswith('{"banker":'):
        return  # not a header: the replay reports and dead-letters the line
    try:
        version = json.loads(first).get("version")
    except (ValueError, AttributeError):
        return
    if version != SNAPSHOT_VERSION:
        raise UnresumableJobdir(
            f"JOBDIR {root} cannot be resumed by this scrapy-banker: its snapshot ({path}) "
            f"has layout version {version!r}, this version reads {SNAPSHOT_VERSION}; resume "
            "it with the scrapy-banker that wrote it, or give the crawl another JOBDIR"
        )


class JobdirLocked(BankerError, RuntimeError):
    """Another process holds a JOBDIR's lock: a crawl runs on it (or a requeue does).

    A :class:`~scrapy_banker.errors.BankerError`: a crawl refused reports it as one line.
    """


class JobdirLock:
    """The advisory lock ``JOBDIR/banker/lock``: one writer of a JOBDIR at a time.

    :meth:`acquire` takes ``flock(LOCK_EX | LOCK_NB)`` or raises
    :class:`JobdirLocked` naming the JOBDIR and the holder's process id (written
    into the file by the holder).  Only the ``banker/`` directory must exist.
    Released by :meth:`release` or by the end of the process.  Without
    ``fcntl``, or on a file system that cannot lock, nothing is locked (a
    warning says so in the second case).
    """

    def __init__(self, jobdir: str) -> None:
        self.jobdir = jobdir
        self.path = os.path.join(jobdir, "banker", LOCK)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None or fcntl is None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise JobdirLocked(
                f"another crawl holds JOBDIR {self.jobdir} ({holder}lock {self.path}): "
                "wait until it stops, or give this one another JOBDIR"
            ) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKING:
                raise
            logger.warning("Cannot lock JOBDIR %s (%s): a second process on it would not be "
                           "refused", self.jobdir, exc)  # fmt: skip
            return
        with contextlib.suppress(OSError):  # the pid is a courtesy for whoever is refused
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            pid = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
        except OSError:
            return ""
        return f"process {pid}, " if pid.isdigit() else ""

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor of the open file drops the flock


def read_lines(path: str) -> Iterator[str]:
    """A file's lines with their newlines (none if it does not exist)."""
    try:
        f = open(path, encoding="utf-8", errors="replace", newline="")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        yield from f


def journal_name(generation: int) -> str:
    return f"journal-{generation}.jsonl"


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


#: Replays of a JOBDIR a running crawl compacts meanwhile, before the last one is taken.
REPLAY_ATTEMPTS = 20


def replay(path: str) -> tuple[JournalState, list[str]]:
    """Replay ``path``'s snapshot and its journal; returns the state and the files read.

    A running crawl may compact between the two reads (a new snapshot
    renamed into place, its old journal removed): the snapshot read would
    then lack what the vanished journal held.  So the replay is made again
    until the snapshot stayed the same file throughout (an operator's
    command reads a JOBDIR its crawl is writing).
    """
    snapshot = os.path.join(path, SNAPSHOT)
    for _ in range(REPLAY_ATTEMPTS):
        before = _identity(snapshot)
        state = JournalState()
        state.feed(read_lines(snapshot), SNAPSHOT, journal=False)
        generation = 0 if state.header is None else int(state.header.get("generation", 0))
        journal = os.path.join(path, journal_name(generation))
        state.feed(read_lines(journal), journal_name(generation), journal=True)
        if _identity(snapshot) == before:
            break
    return state, [snapshot, journal]


def live_records(
    state: JournalState, files: Iterable[str]
) -> Iterator[tuple[str, int, str, Enqueued]]:
    """``(file, line number, E line, record)`` of each pending request, once, in file order.

    Lines the replay could not parse are not in ``state.live``, so every
    line yielded parses (a line that does not is skipped, not guessed at).
    """
    emitted: set[int] = set()
    live = state.live
    for path in files:
        for lineno, line in enumerate(read_lines(path), 1):
            if not line.startswith('{"e":') or not line.endswith("\n"):
                continue
            try:
                rec = parse_enqueue(line)
            except ValueError:
                continue
            if rec.seq in live and rec.seq not in emitted:
                emitted.add(rec.seq)
                yield os.path.basename(path), lineno, line, rec


class JobDir:
    """One crawl's journal, snapshot and dead letters under ``JOBDIR``."""

    def __init__(
        self,
        jobdir: str,
        codec: RequestCodec,
        stats: StatsCollector,
        fingerprint: Callable[[Request], str] | None = None,
        *,
        politeness: Politeness | None = None,
        budgets: BudgetBook | None = None,
    ) -> None:
        self.root = jobdir
        self.path = os.path.join(jobdir, "banker")
        self.snapshot_path = os.path.join(self.path, SNAPSHOT)
        self.deadletter_path = os.path.join(jobdir, DEADLETTERS)
        self.codec = codec
        self.stats = stats
        self.fingerprint = fingerprint
        self.generation = 0
        self.next_seq = 0
        #: Journal records since the last compaction / in the last snapshot.
        self.journal_records = 0
        self.snapshot_records = 0
        self._fd: int | None = None
        #: Held from :meth:`restore` to :meth:`close_journal`.
        self.lock = JobdirLock(jobdir)
        #: Why :meth:`restore` failed (None: it did not): this object then writes nothing,
        #: not even at close -- the JOBDIR may be another crawl's.
        self._failed: str | None = None
        #: The hosts' states, saved in every snapshot header and restored at resume.
        self.politeness = politeness
        #: Pages charged to budgets (the ``"budgets"`` field), saved and restored alike.
        self.budgets = budgets

    @property
    def failed(self) -> bool:
        """Did :meth:`restore` fail (so nothing is written here)?"""
        return self._failed is not None

    def check(self) -> None:
        """Refuse (:class:`UnresumableJobdir`) a snapshot of a layout this version does not read.

        Reads the snapshot's header line only; called before the spider opens.
        """
        try:
            check_resumable(self.root)
        except UnresumableJobdir as exc:
            self._failed = str(exc)
            raise

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise RuntimeError(
                f"not writing to JOBDIR {self.root}: this crawl could not restore it "
                f"({self._failed})"
            )

    # -- writing --------------------------------------------------------------------

    def _dead_letter(self, record: dict[str, Any]) -> None:
        self._check_writable()
        append_dead_letter(self.root, record)

    def dead_letter_unsaved(self, request: Request, error: str) -> None:
        """A request only memory held at a clean stop: it will not resume."""
        logger.error("Cannot persist %s to JOBDIR, it will not resume: %s", request, error)
        self._dead_letter({"url": request.url, "method": request.method, "error": error,
                           "when": "save"})  # fmt: skip

    def dead_letter_refused(
        self,
        request: Request,
        reason: str,
        c: Classified,
        priority: int,
        fingerprint: str,
        payload: str | None,
        seq: int,
    ) -> None:
        """A request given up on because its host kept refusing: a requeueable letter.

        ``"when": "pushback"``; ``payload`` is its journal ``E`` record (as a
        resume would read it; ``seq`` is where it was journaled, -1 if it was
        not) for ``scrapy banker deadletters --jobdir --requeue``.  Without a
        payload (not serializable) the letter is listed, not requeueable.
        """
        logger.info("Dead-lettered %s in %s: %s", request, self.deadletter_path, reason)
        record: dict[str, Any] = {"when": "pushback", "error": reason, "host": c.slot,
                                  "url": request.url, "method": request.method}  # fmt: skip
        if payload is not None:
            record["payload"] = enqueue_line(
                seq, fingerprint, c.topic, c.slot, c.key, c.key_hash, priority, payload
            ).rstrip("\n")
        self._dead_letter(record)

    def _write(self, data: bytes) -> None:
        """One ``os.write``: in the kernel (safe from ``kill -9``) when this returns."""
        fd = self._fd
        if fd is None:
            raise RuntimeError("JOBDIR journal is not open")
        while data:
            data = data[os.write(fd, data) :]

    def enqueued(
        self, seq: int, fingerprint: str, c: Classified, priority: int, payload: str
    ) -> None:
        """Journal a queued request (``payload``: the codec's JSON, written as is)."""
        self._write(
            enqueue_line(
                seq, fingerprint, c.topic, c.slot, c.key, c.key_hash, priority, payload
            ).encode()
        )
        self.journal_records += 1

    def done(self, seqs: list[int], unused: list[int] | tuple[()] = ()) -> None:
        """Journal completed requests: one line, one write, for the batch.

        ``unused``: those that are no page of a budget (a copy was queued in
        their place, or they were dead-lettered unsent).
        """
        self._write(done_line(seqs, unused).encode())
        self.journal_records += len(seqs)

    def should_compact(self) -> bool:
        return needs_compaction(self.journal_records, self.snapshot_records, COMPACT_MIN_RECORDS)

    def compact(
        self,
        topics: dict[str, Any] | None,
        directory: dict[str, Any] | None = None,
        exclude: frozenset[int] = frozenset(),
    ) -> JournalState:
        """Rewrite snapshot + journal as a new snapshot; start an empty journal.

        The files are the source, not memory: what is written is exactly what
        a crash at this moment would have resumed, minus ``exclude`` (entries
        dead-lettered at resume).  Payloads are copied as text, never
        re-encoded.  Refused (``RuntimeError``) after a failed :meth:`restore`.
        """
        self._check_writable()
        state, files = replay(self.path)
        for seq in exclude:
            state.live.pop(seq, None)
        out = self._new_snapshot(state, topics, directory)
        out.writelines(line for _, _, line, _ in live_records(state, files))
        self._commit_snapshot(out, state)
        return state

    def _new_snapshot(
        self, state: JournalState, topics: dict[str, Any] | None, directory: dict[str, Any] | None
    ) -> TextIO:
        """Start the next generation's snapshot beside the current one (header, seen set)."""
        out = open(self.snapshot_path + ".tmp", "w", encoding="utf-8", newline="")  # noqa: SIM115
        header = header_line(self.generation + 1, max(self.next_seq, state.next_seq),
                             len(state.live), len(state.done), topics, directory)  # fmt: skip
        out.write(self._with_politeness(header, state.pages))
        out.writelines(seen_lines(state.done))
        return out

    def _with_politeness(self, header: str, pages: PageCounts) -> str:
        """``header`` with the hosts' states as its ``"politeness"`` field (if any).

        An optional field beside :func:`~scrapy_banker.core.journal.header_line`'s:
        older versions ignore it, and a header without it means "no state".
        """
        states = None if self.politeness is None else self.politeness.to_json()
        # The pages the files say were fetched (not the memory's count, which
        # includes requests in flight): what a resume after a kill counts from.
        counts = pages.to_json() if pages.crawl or pages.hosts else None
        if not states and not counts:
            return header
        obj = json.loads(header)
        if states:
            obj["politeness"] = states
        if counts:
            obj["budgets"] = counts
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n"

    def _restore_budgets(self, pages: PageCounts) -> None:
        """Adopt the pages fetched so far (the snapshot's counts plus the journal's pages).

        A malformed ``"budgets"`` field was reported by the replay as a
        malformed line (and dead-lettered): its counts start from 0 again.
        """
        if self.budgets is None:
            return
        self.budgets.restore(pages.to_json())
        if pages.crawl:
            logger.info("Resumed the budget counts: %d pages fetched so far", pages.crawl)

    def _restore_politeness(self, raw: Any) -> None:
        """Adopt the header's host states; a malformed field is reported and ignored."""
        politeness = self.politeness
        if politeness is None or raw is None:
            return
        try:
            if not isinstance(raw, dict):
                raise ValueError(f"expected an object, got {type(raw).__name__}")
            states = {str(host): HostState.from_json(data) for host, data in raw.items()}
        except ValueError as exc:
            logger.warning("Ignoring the hosts' politeness states of %s: %s (the hosts are "
                           "asked again as if new)", self.snapshot_path, exc)  # fmt: skip
            return
        for host, state in states.items():
            politeness.put(host, state)
        if states:
            now = time.time()
            blocked = [h for h, st in states.items() if st.blocked_until > now]
            logger.info("Resumed the politeness state of %d hosts (%d still blocked by "
                        "Retry-After or backoff%s)", len(states), len(blocked),
                        f": {', '.join(sorted(blocked)[:5])}" if blocked else "")  # fmt: skip

    def _commit_snapshot(self, out: TextIO, state: JournalState) -> None:
        """``fsync`` it, swap it in, start its empty journal, delete the old one."""
        with out:
            out.flush()
            os.fsync(out.fileno())
        os.replace(self.snapshot_path + ".tmp", self.snapshot_path)
        fsync_dir(self.path)
        self._open_journal(self.generation + 1)
        self.stats.inc_value("banker/jobdir/compactions")
        self.snapshot_records = len(state.live) + len(state.done)

    def _open_journal(self, generation: int) -> None:
        """Start appending to ``generation``'s journal; delete every other journal."""
        self._close_fd()
        path = os.path.join(self.path, journal_name(generation))
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.generation = generation
        self.journal_records = 0
        for name in os.listdir(self.path):
            if name.startswith("journal-") and name != journal_name(generation):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.path, name))

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close_journal(self) -> None:
        """Stop appending and release the JOBDIR lock: the crawl is over with this JOBDIR."""
        self._close_fd()
        self.lock.release()

    # -- resuming -------------------------------------------------------------------

    def restore(
        self,
        queue: LocalQueue,
        spider: Spider | None,
        slot_key: Callable[[Request], str],
        now: float,
    ) -> tuple[int, set[str]]:
        """Queue what the last run left pending; returns ``(restored, seen fingerprints)``.

        Takes the JOBDIR lock first (:class:`JobdirLocked` if another process
        holds it; released by :meth:`close_journal`, or here if the restore
        fails -- after which this object writes nothing, since Scrapy closes
        the scheduler of a crawl that failed to open) and opens the journal
        for appending.  A journal that was replayed (a crash), or a truncated
        or malformed line, is compacted at once, so the new run appends to a
        clean file.
        """
        os.makedirs(self.path, exist_ok=True)
        try:
            self.lock.acquire()
            return self._restore(queue, spider, slot_key, now)
        except BaseException as exc:
            self._failed = str(exc) or type(exc).__name__
            self.close_journal()
            raise

    def _restore(
        self,
        queue: LocalQueue,
        spider: Spider | None,
        slot_key: Callable[[Request], str],
        now: float,
    ) -> tuple[int, set[str]]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.snapshot_path + ".tmp")  # a compaction cut short
        state, files = replay(self.path)
        header = state.header or {}
        self.generation = int(header.get("generation", 0))
        self.next_seq = state.next_seq
        if header.get("topics"):
            queue.topics.restore(header["topics"])
        self._restore_politeness(header.get("politeness"))
        self._restore_budgets(state.pages)
        exact = header.get("directory") is not None and not state.journal_records
        if exact:
            queue.directory = ExtendibleDirectory.from_state(header["directory"])
        for bad in state.malformed:
            self._malformed(bad.source, bad.line, bad.error, bad.text)
        replayed = state.journal_records
        # After a crash the new snapshot is written in the same pass as the queue is rebuilt.
        out = None
        if replayed or state.truncated or state.malformed or state.header is None:
            out = self._new_snapshot(state, queue.topics.to_state(), None)
        dropped: set[int] = set()
        restored = 0
        try:
            for name, lineno, line, rec in live_records(state, files):
                try:
                    request = self.codec.decode(rec.payload, spider)
                    c = Classified(rec.topic, slot_key(request), rec.key, rec.key_hash)
                except (ValueError, MalformedPayload) as exc:
                    dropped.add(rec.seq)
                    self._malformed(name, lineno, str(exc), line)
                    continue
                if exact and rec.key not in queue.directory:
                    # A snapshot whose saved directory lacks what it saved as
                    # pending (written at a stop by a version that kept requests
                    # held over budget out of it): count the loads afresh.
                    logger.warning(
                        "The saved queue directory of %s lacks queue key %r: rebuilding it "
                        "from the pending requests", self.snapshot_path, rec.key,
                    )  # fmt: skip
                    queue.rebuild_directory()
                    exact = False
                queue.push(request, c, now, priority=rec.priority, seq=rec.seq,
                           count_load=not exact)  # fmt: skip
                if out is not None:
                    out.write(line)
                restored += 1
        except BaseException:
            if out is not None:
                out.close()
            raise
        if exact and (dropped or sum(queue.directory.load_of(k) for k in queue.directory)
                      != restored):  # fmt: skip
            queue.rebuild_directory()  # the saved loads counted entries that did not come back
        for seq in dropped:
            state.live.pop(seq, None)
        malformed = len(state.malformed) + len(dropped)
        if state.truncated:
            logger.warning(
                "JOBDIR journal ended with %d line(s) cut short by a kill; skipped (the "
                "requests they concern are fetched again)", state.truncated,
            )  # fmt: skip
            self.stats.set_value("banker/jobdir/truncated", state.truncated)
        if malformed:
            self.stats.inc_value("banker/jobdir/malformed", malformed)
        if out is not None:
            self._commit_snapshot(out, state)
        elif dropped:  # unreadable entries in a clean snapshot: rewrite it without them
            self.compact(queue.topics.to_state(), None, frozenset(dropped))
        else:
            self.snapshot_records = len(state.live) + len(state.done)
            self._open_journal(self.generation)
        self.stats.set_value("banker/jobdir/restored", restored)
        if replayed:
            self.stats.set_value("banker/jobdir/replayed", replayed)
            logger.info(
                "Resumed %d pending requests from %s (%d journal records replayed: the last "
                "run did not stop cleanly)", restored, self.path, replayed,
            )  # fmt: skip
        elif restored:
            logger.info("Resumed %d pending requests from %s", restored, self.path)
        return restored, state.seen()

    def _malformed(self, name: str, lineno: int, error: str, text: str) -> None:
        logger.error("Skipping malformed JOBDIR entry %s:%d (%s); kept in %s",
                     name, lineno, error, self.deadletter_path)  # fmt: skip
        self._dead_letter({"file": name, "line": lineno, "error": error,
                           "payload": text.rstrip("\n"), "when": "restore"})  # fmt: skip
