"""What the jobs of a fleet worker share, each piece with one writer.

:class:`~scrapy_banker.redis.worker.FrontierWorker` runs its jobs
(:mod:`scrapy_banker.redis.worker.jobs`) on one thread and is called by the
scheduler from the reactor thread.  The state they share is split by who
writes it, so the threads meet in as few places as possible:

* :class:`Outbox` -- queue operations the reactor thread appends under a lock
  and the worker thread takes whole (the only lock the reactor ever waits
  on, held for a list append), the hosts' politeness states and the pages'
  revisit states to write;
* :class:`Signals` -- single attributes written by one thread and read by the
  other (a read or a write of one attribute is atomic);
* :class:`Counters` -- stats added up under a lock and taken by the reactor;
* :class:`Ownership` -- the partitions this node may pop, replaced whole by
  the worker thread, so a reader never sees half a change;
* :class:`LeaseBook` and :class:`WorkHints` -- the worker thread's alone,
  except :meth:`LeaseBook.holds`, which reads two atomically replaced values.

:class:`FleetLink` names what the jobs talk to (the frontier, the registry,
this node); :class:`WorkerState` bundles the rest for them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy_banker.core.spill import SpillOps
from scrapy_banker.redis.worker.control_box import ControlBox

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from scrapy_banker.core.ops import EnqueueOp, LeaseToken, RevisitWrite
    from scrapy_banker.net.partitions import PartitionTable
    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.redis.frontier.leases import Leased
    from scrapy_banker.redis.frontier.registry import NodeRegistry
    from scrapy_banker.redis.frontier.revisit_states import DueRevisit

logger = logging.getLogger(__name__)

__all__ = [
    "TRUSTED_LEASE_FRACTION",
    "Batch",
    "Counters",
    "FleetLink",
    "LeaseBook",
    "Outbox",
    "Ownership",
    "Signals",
    "WorkHints",
    "WorkerState",
]

#: A lease is trusted for this share of its TTL after its pop or the last
#: renewal round (both stamped before the call was sent).
TRUSTED_LEASE_FRACTION = 0.8


@dataclass(frozen=True)
class FleetLink:
    """What a worker's jobs talk to: the crawl's frontier and node registry, as ``node``."""

    frontier: RedisFrontier
    registry: NodeRegistry
    node: str


@dataclass
class Batch:
    """One atomic snapshot of the outbox, each kind in the order it was queued."""

    enqueues: list[EnqueueOp]
    dead: list[tuple[LeaseToken, str]]
    acks: list[LeaseToken]
    nacks: list[LeaseToken]
    starts: list[LeaseToken]
    #: Host -> (partition, epoch, state JSON or "" to delete): the latest of each.
    hosts: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    #: Acks of requests never fetched after all (put back): their budget page goes back.
    refunds: set[LeaseToken] = field(default_factory=set)
    #: URL -> its latest revisit state (``BANKER_RECRAWL``).
    revisits: dict[str, RevisitWrite] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.enqueues or self.dead or self.acks or self.nacks or self.starts or self.hosts
            or self.revisits
        )  # fmt: skip


class Outbox:
    """Operations the reactor thread queued for Redis and the worker thread has not sent.

    Appends and takes are each one short critical section; the worker thread
    sends a taken :class:`Batch` without the lock and puts back what Redis
    did not confirm (:meth:`put_back`), in front of anything newer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._enqueues: list[EnqueueOp] = []
        self._dead: list[tuple[LeaseToken, str]] = []
        self._acks: list[LeaseToken] = []
        self._nacks: list[LeaseToken] = []
        self._starts: list[LeaseToken] = []
        self._downloaded: list[LeaseToken] = []
        self._hosts: dict[str, tuple[int, int, str]] = {}
        self._refunds: set[LeaseToken] = set()
        self._revisits: dict[str, RevisitWrite] = {}
        #: The latest telemetry write (key, JSON, expiry in ms), replaced whole
        #: by the reactor thread; a newer one supersedes an unsent one.
        self.telemetry: tuple[str, str, int] | None = None

    # -- the reactor thread ------------------------------------------------------------

    def enqueue(self, op: EnqueueOp) -> None:
        with self._lock:
            self._enqueues.append(op)

    def dead_letter(self, token: LeaseToken, reason: str) -> None:
        with self._lock:
            self._dead.append((token, reason))

    def ack(self, token: LeaseToken, refund: bool = False) -> None:
        with self._lock:
            self._acks.append(token)
            if refund:
                self._refunds.add(token)

    def refund(self, token: LeaseToken) -> None:
        """Give ``token``'s budget page back when it is acked (kept until that ack)."""
        with self._lock:
            self._refunds.add(token)

    def nack(self, token: LeaseToken) -> None:
        with self._lock:
            self._nacks.append(token)
            self._refunds.discard(token)  # a nack gives the page back anyway

    def started(self, token: LeaseToken) -> None:
        with self._lock:
            self._starts.append(token)

    def downloaded(self, token: LeaseToken) -> None:
        with self._lock:
            self._downloaded.append(token)

    def host_state(self, host: str, partition: int, epoch: int, state: str) -> None:
        """Write ``host``'s politeness state (JSON; ``""``: back to the default) with its
        partition; a newer state of the host replaces one not sent yet."""
        with self._lock:
            self._hosts[host] = (partition, epoch, state)

    def revisit(self, write: RevisitWrite) -> None:
        """Keep a page's revisit state; a newer state of the page replaces one not sent yet
        (keeping its request payload when the newer one carries none)."""
        with self._lock:
            older = self._revisits.pop(write.url, None)
            self._revisits[write.url] = write if older is None else write.merged(older)

    def __len__(self) -> int:
        """Operations not sent yet (enqueues, dead letters, acks, nacks, revisit states)."""
        with self._lock:
            return (
                len(self._enqueues) + len(self._dead) + len(self._acks) + len(self._nacks)
                + len(self._revisits)
            )  # fmt: skip

    # -- the worker thread -------------------------------------------------------------

    def take(self) -> Batch:
        """Everything to send, in one snapshot (the outbox is empty after it)."""
        with self._lock:
            refunds = {t for t in self._acks if t in self._refunds} if self._refunds else set()
            batch = Batch(
                self._enqueues, self._dead, self._acks, self._nacks, self._starts, self._hosts,
                refunds, self._revisits,
            )  # fmt: skip
            self._enqueues, self._dead, self._acks, self._nacks, self._starts = [], [], [], [], []
            self._hosts = {}
            self._revisits = {}
            self._refunds -= refunds
        return batch

    def put_back(self, batch: Batch, sent: int = 0) -> None:
        """Redis did not confirm ``batch`` past its first ``sent`` enqueues: send it again first.

        Put in front of anything newer, so the order (children before the
        parent's ack) still holds.  Every operation is idempotent, so sending
        again a part that did reach Redis is harmless.
        """
        with self._lock:
            self._enqueues[:0] = batch.enqueues[sent:]
            self._dead[:0] = batch.dead
            self._acks[:0] = batch.acks
            self._nacks[:0] = batch.nacks
            self._starts[:0] = batch.starts
            self._refunds |= batch.refunds
            for host, write in batch.hosts.items():
                self._hosts.setdefault(host, write)  # a newer state wins
            for url, revisit in batch.revisits.items():
                newer = self._revisits.get(url)
                self._revisits[url] = revisit if newer is None else newer.merged(revisit)

    def take_downloaded(self) -> list[LeaseToken]:
        with self._lock:
            done, self._downloaded = self._downloaded, []
        return done

    def take_telemetry(self) -> tuple[str, str, int] | None:
        telemetry, self.telemetry = self.telemetry, None
        return telemetry

    # -- after the worker stopped ------------------------------------------------------

    def take_unsent(self) -> SpillOps:
        """The enqueues, dead letters, acks, nacks and revisit states never sent, for a spill.

        Host states are not spilled: a replay comes after the partition may
        have moved on, and a state is a hint, not work.
        """
        with self._lock:
            own = SpillOps(
                self._enqueues, self._dead, self._acks, self._nacks, list(self._revisits.values())
            )
            self._enqueues, self._dead, self._acks, self._nacks = [], [], [], []
            self._hosts = {}
            self._revisits = {}
        return own


class Counters:
    """Stats counted on the worker thread, taken by the scheduler for the crawl stats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[name] = self._counts.get(name, 0) + n

    def take(self) -> dict[str, int]:
        """Counters since the last call."""
        with self._lock:
            out, self._counts = self._counts, {}
        return out


@dataclass
class Signals:
    """Single values one thread writes and the other reads."""

    #: How many more requests the scheduler would like buffered (set by it).
    want: int = 0
    #: Set by the scheduler: nothing buffered, nothing in flight.
    local_idle: bool = False
    #: Set by the scheduler: its downloader has room that nothing buffered can use.
    hungry: bool = False
    #: Server-side view: when the whole crawl was last seen empty (None: not
    #: empty).  Set by the worker thread; cleared by either when work appears.
    drained_since: float | None = None
    #: Requests held over a budget when the crawl was last seen empty.
    held_when_drained: int = 0


class WorkHints:
    """Which owned partitions the next pop asks (the worker thread's alone).

    With many more partitions than nodes most owned partitions are empty:
    pops go to those known to hold work -- this node's own enqueues, the
    partitions other workers woke, newly owned ones, nacked ones -- and a
    slow full scan of every owned partition is the safety net.
    """

    def __init__(self) -> None:
        #: Partitions known (or likely) to hold queued work.
        self.nonempty: set[int] = set()
        #: Partition -> when to ask again after a ``BUSY`` refusal (monotonic).
        self.busy_until: dict[int, float] = {}
        #: When the next pop asks every owned partition (monotonic).
        self.next_full_scan = 0.0
        #: Where the next full scan starts among the partitions without known work.
        self.cursor = 0
        #: Partitions this node wrote pages' revisit states to since the revisits'
        #: last take asked them (:class:`~scrapy_banker.redis.worker.jobs.RevisitPopper`).
        self.revisits: set[int] = set()

    def scan_soon(self) -> None:
        """Work may be anywhere (requeued by the reaper): the next pop scans everything."""
        self.next_full_scan = 0.0


class Ownership:
    """The partitions this node owns, from the partition table as last loaded."""

    def __init__(self, node: str, hints: WorkHints) -> None:
        self.node = node
        self.hints = hints
        #: Partition -> epoch this node may pop; replaced whole, so a read is atomic.
        self.owned: dict[int, int] = {}
        #: The partition table as last loaded (who owns what, for wake-ups).
        self.table: PartitionTable | None = None
        #: The version of :attr:`table` (-1: none loaded yet).
        self.version = -1
        #: Partition -> the epoch whose hosts' states this node read (the
        #: worker thread's alone): a partition popped under another epoch is
        #: new here, and its states are read before its requests go out.
        self.adopted: dict[int, int] = {}

    def apply(self, table: PartitionTable) -> None:
        """Take a freshly loaded table as the truth about what this node owns."""
        self.table = table
        self.version = table.version
        owned = {p: table.epochs[p] for p in table.owned_by(self.node)}
        old = self.owned
        if owned.keys() != old.keys():
            logger.info("Node %s owns %d of %d partitions", self.node, len(owned), table.size)
        # Newly owned partitions may hold work: pop them next.
        self.hints.nonempty |= {p for p, e in owned.items() if old.get(p) != e}
        if owned != old:
            self.owned = owned

    def stale(self, version: int) -> bool:
        """Is the stored table newer than ours?  (0: no table, or one without a
        version, written by an older scrapy-banker: reload it to be sure.)"""
        return version == 0 or version != self.version

    def drop(self, partitions: Iterable[int]) -> None:
        """This node was fenced off from ``partitions``: stop popping them at once."""
        lost = set(partitions)
        self.owned = {p: e for p, e in self.owned.items() if p not in lost}


class LeaseBook:
    """The leases this node holds, buffered or in flight (the worker thread's alone)."""

    def __init__(self) -> None:
        #: Partition -> ids of every lease held: renewed each heartbeat.
        self.held: dict[int, set[str]] = {}
        #: The part of :attr:`held` still buffered or downloading: what the
        #: per-partition cap of the pops limits.
        self.downloading: dict[int, set[str]] = {}
        #: When the last renewal round of every held lease was sent (monotonic,
        #: taken before the call; written by the worker thread, read by the reactor's).
        self.renewed_at = float("-inf")

    def add(self, partition: int, lease_id: str) -> None:
        self.downloading.setdefault(partition, set()).add(lease_id)
        self.held.setdefault(partition, set()).add(lease_id)

    def forget(self, token: LeaseToken) -> None:
        """The lease was acked, nacked or dead-lettered (whatever Redis answered)."""
        for held in (self.held, self.downloading):
            _discard(held, token)

    def downloads_done(self, tokens: Iterable[LeaseToken]) -> None:
        """Their downloads are over: their hosts' slots are free, their leases still held."""
        for token in tokens:
            _discard(self.downloading, token)

    def renewals(self) -> dict[int, list[str]]:
        """Partition -> ids of every lease held, for a renewal round."""
        return {p: sorted(ids) for p, ids in self.held.items() if ids}

    def holds(
        self,
        token: LeaseToken,
        owned: dict[int, int],
        ttl_s: float,
        now: float,
        renewed_at: float | None = None,
    ) -> bool:
        """Whether ``token``'s lease is known to run for a while yet (a fifth of the TTL).

        It ran at least until the later of its pop and the last renewal
        round, both stamped before the call was sent, plus the TTL.  Under a
        partition this node lost, or owns again under a newer epoch (stopped
        past the node timeout and joined again), it is not held: leases of
        the old epoch were reaped and may be another node's, and renewals do
        not say whose.  ``renewed_at``: :attr:`renewed_at` as the caller read
        it *before* ``owned`` (a heartbeat applies the table it loaded before
        it stamps its renewal, so a fresh stamp comes with a fresh table).
        """
        if renewed_at is None:
            renewed_at = self.renewed_at
        epoch = owned.get(token.partition)
        if epoch is None or (token.epoch and epoch != token.epoch):
            return False
        return now < max(token.leased_at, renewed_at) + TRUSTED_LEASE_FRACTION * ttl_s


def _discard(book: dict[int, set[str]], token: LeaseToken) -> None:
    ids = book.get(token.partition)
    if ids is not None:
        ids.discard(token.id)
        if not ids:
            del book[token.partition]


class WorkerState:
    """Everything a worker's jobs share; see the module docstring for who writes what."""

    def __init__(self, node: str) -> None:
        self.outbox = Outbox()
        self.counters = Counters()
        self.signals = Signals()
        self.hints = WorkHints()
        self.ownership = Ownership(node, self.hints)
        self.leases = LeaseBook()
        #: Leased requests for the scheduler; deque appends and pops are thread-safe.
        self.inbound: deque[Leased] = deque()
        #: Owned partition -> requests still queued there in Redis at its last
        #: pop (nonzero only): the pops lease the longest first, and the
        #: scheduler's long-pole pacing counts them.  The worker thread
        #: replaces it whole, so a read is atomic.
        self.queued: Mapping[int, int] = {}
        #: (partition, epoch, host -> state JSON) read from Redis when this node
        #: took a partition over, each appended before the partition's first
        #: leases in :attr:`inbound`: the scheduler adopts them before it
        #: dispatches those.
        self.adopted: deque[tuple[int, int, dict[str, str]]] = deque()
        #: Budget charges and the operator's directives
        #: (:mod:`scrapy_banker.redis.worker.control_box`).
        self.control = ControlBox()
        #: Pages due for a revisit, taken from the owned partitions
        #: (:class:`~scrapy_banker.redis.worker.jobs.RevisitPopper`), for the reactor.
        self.revisits_due: deque[DueRevisit] = deque()
        #: The earliest due time left in the owned partitions at the last take
        #: (None: none), replaced whole by the worker thread.
        self.revisit_next_due: float | None = None
        #: (partition, URL, reason) of revisit states the reactor could not read,
        #: for the dead letters (sent by the next take; lost with the process,
        #: they stay in Redis and come due again).
        self.revisits_dead: deque[tuple[int, str, str]] = deque()
