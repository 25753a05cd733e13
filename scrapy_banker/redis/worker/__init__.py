"""The one thread that talks to Redis for a worker process.

Scrapy's engine runs on the reactor thread; a Redis round trip there -- let
alone a retry loop while Redis restarts -- would freeze every download.  So
the scheduler only appends to in-memory op lists and reads an inbound deque
(:class:`FrontierWorker`'s reactor-thread methods); this thread does all the
I/O, batched, as a small loop over named jobs
(:mod:`scrapy_banker.redis.worker.jobs`), each with its own timer:

1. a spill an earlier worker left (:mod:`scrapy_banker.core.spill`) is
   replayed before anything else (:class:`~scrapy_banker.redis.worker.jobs.Replayer`);
2. a heartbeat registers the node, renews every lease it holds and
   rebalances when the live set of nodes changed
   (:class:`~scrapy_banker.redis.worker.jobs.Membership`);
3. queued operations are sent in the order the crawl's guarantees need
   (:class:`~scrapy_banker.redis.worker.jobs.Flusher`), then the latest
   telemetry sample (:class:`~scrapy_banker.redis.worker.jobs.TelemetryWriter`);
4. expired leases go back to the queue, single-flight across the fleet
   (:class:`~scrapy_banker.redis.worker.jobs.Reaper`);
5. the partition table is followed many times a second
   (:class:`~scrapy_banker.redis.worker.jobs.TableSync`);
6. the scheduler's buffer is filled from the partitions this node owns
   (:class:`~scrapy_banker.redis.worker.jobs.Popper`), and, with
   ``BANKER_RECRAWL``, the pages due for a revisit are taken from them
   (:class:`~scrapy_banker.redis.worker.jobs.RevisitPopper`);
7. when the scheduler has room it cannot fill, the crawl's work is counted:
   over, or waiting for a saturated node to be taken over
   (:class:`~scrapy_banker.redis.worker.jobs.DrainWatch`).

The jobs share their state through
:class:`~scrapy_banker.redis.worker.state.WorkerState`, whose module says
which thread writes what.  When Redis is unreachable the loop keeps
everything queued in memory and retries with jittered exponential backoff
(on top of redis-py's own ``Retry``); when it is idle it polls less and less
often, up to a cap.  What is still unsent when it stops is handed out for
spilling (:meth:`FrontierWorker.take_unsent`).

Nothing here imports Scrapy or Twisted: the scheduler hands in an
``on_ready`` callback that wakes its engine from this thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_banker.core.spill import merge
from scrapy_banker.redis.connection import REDIS_ERRORS
from scrapy_banker.redis.worker.control_box import ControlJob
from scrapy_banker.redis.worker.jobs import (
    DrainWatch,
    Flusher,
    Membership,
    Popper,
    Reaper,
    Replayer,
    RevisitPopper,
    TableSync,
    TelemetryWriter,
)
from scrapy_banker.redis.worker.state import FleetLink, WorkerState

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable, Mapping

    from scrapy_banker.core.directives import BudgetRules, ControlState
    from scrapy_banker.core.ops import EnqueueOp, LeaseToken, RevisitWrite
    from scrapy_banker.core.spill import SpillOps
    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.redis.frontier.control_channel import ControlChannel
    from scrapy_banker.redis.frontier.registry import NodeRegistry
    from scrapy_banker.redis.frontier.revisit_states import DueRevisit
    from scrapy_banker.redis.worker.control_box import Charge
    from scrapy_banker.redis.worker.placement_agent import PlacementAgent

logger = logging.getLogger(__name__)

__all__ = ["FrontierWorker", "WorkerOptions"]

#: While the crawl is not drained, idle sleeps stay this short (s) ...
ACTIVE_IDLE_SLEEP_S = 0.1
#: ... and until it has been drained this long (s).
DRAINED_BACKOFF_AFTER_S = 10.0
#: The first idle sleep (s); each idle step after it sleeps twice as long, up to a cap.
MIN_IDLE_SLEEP_S = 0.02
#: The first sleep (s) after a failed Redis call; it doubles up to the error backoff cap.
MIN_ERROR_SLEEP_S = 0.1
#: How long (s) the loop pauses after an unexpected error (a bug) before going on.
BUG_PAUSE_S = 1.0
#: How long (s) :meth:`FrontierWorker.stop` waits between two flushes Redis refused.
STOP_RETRY_S = 0.5


@dataclass(frozen=True)
class WorkerOptions:
    """How a :class:`FrontierWorker` paces and sizes its work (``BANKER_REDIS_*`` settings)."""

    #: This node's share of the partitions, relative to the others'.
    capacity: float = 1.0
    #: Seconds between heartbeats (and lease renewals).
    heartbeat_s: float = 2.0
    #: Seconds between reaper rounds.
    reap_interval_s: float = 5.0
    #: Requests leased per partition and pop.
    pop_per_partition: int = 4
    #: Requests of one partition buffered or downloading beyond which it is
    #: not popped (:attr:`Popper.held_cap
    #: <scrapy_banker.redis.worker.jobs.Popper.held_cap>`); None: ``pop_per_partition``.
    held_cap: int | None = None
    #: Longest idle sleep (s) once the crawl has been drained for a while.
    idle_backoff_max_s: float = 2.0
    #: Longest sleep (s) between retries while Redis is unreachable (at most a heartbeat).
    error_backoff_max_s: float = 10.0
    #: Enqueues per round trip when many are queued.
    enqueue_batch: int = 500
    #: Hosts this node fetches at once: how many partitions it can work on.
    slots: int = 8
    #: Take over partitions whose work waits for a saturated node.
    steal: bool = True
    #: Fingerprints confirmed by Redis remembered for the scheduler's dedup (0: off).
    seen_cache: int = 0


class FrontierWorker:
    """Background Redis I/O for one node; the reactor thread never blocks on Redis."""

    def __init__(
        self,
        frontier: RedisFrontier,
        registry: NodeRegistry,
        node: str,
        options: WorkerOptions | None = None,
        *,
        placement: PlacementAgent | None = None,
        on_ready: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        control: ControlChannel | None = None,
        budgets: BudgetRules | None = None,
    ) -> None:
        options = WorkerOptions() if options is None else options
        self.options = options
        self.link = FleetLink(frontier, registry, node)
        self.clock = clock
        # Never back off past a heartbeat: a worker that retries less often
        # than it beats is declared dead by the others after a Redis outage
        # shorter than the node timeout, and its unacked work is fetched again
        # (the chaos soak measured 787 such duplicates with a 10 s cap).
        self.error_backoff_max_s = min(options.error_backoff_max_s, options.heartbeat_s)
        self.state = state = WorkerState(node)
        link = self.link
        batch = options.enqueue_batch
        self.flusher = Flusher(link, state, enqueue_batch=batch, seen_cache=options.seen_cache)
        self.replayer = Replayer(link, state, self.flusher, enqueue_batch=batch)
        self.sync = TableSync(link, state)
        held_cap = options.pop_per_partition if options.held_cap is None else options.held_cap
        self.popper = Popper(
            link, state, self.sync, pop_per_partition=options.pop_per_partition,
            held_cap=held_cap, clock=clock, on_ready=on_ready,
        )  # fmt: skip
        self.membership = Membership(
            link, state, capacity=options.capacity, interval_s=options.heartbeat_s,
            placement=placement, clock=clock,
        )  # fmt: skip
        self.reaper = Reaper(link, state, interval_s=options.reap_interval_s)
        self.drain = DrainWatch(
            link, state, pending=self.pending_ops, slots=options.slots, steal=options.steal
        )
        self.telemetry = TelemetryWriter(link, state)
        self.revisits = RevisitPopper(link, state, wall=time.time, on_ready=on_ready)
        #: Reads the operator's directives, charges budgets (None: no control channel).
        self.control = None if control is None else ControlJob(
            link, state, control, interval_s=options.heartbeat_s / 2, rules=budgets,
            on_ready=on_ready,
        )  # fmt: skip
        #: Leased requests for the scheduler; deque appends/pops are thread-safe.
        self.inbound = state.inbound
        #: False from the first failed Redis call until one succeeds again.
        self.connected = True
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._idle_sleep = 0.0
        self._error_sleep = 0.0

    # -- what the reactor thread reads -------------------------------------------------

    @property
    def owned(self) -> dict[int, int]:
        """Partition -> epoch this node may pop; replaced whole, so a read is atomic."""
        return self.state.ownership.owned

    @property
    def seen(self) -> set[str]:
        """Fingerprints Redis confirmed are seen (:attr:`Flusher.seen
        <scrapy_banker.redis.worker.jobs.Flusher.seen>`)."""
        return self.flusher.seen

    @property
    def drained_since(self) -> float | None:
        """When the whole crawl was last seen empty (None: not empty)."""
        return self.state.signals.drained_since

    @property
    def held_when_drained(self) -> int:
        """Requests held over a budget when the crawl was last seen empty."""
        return self.state.signals.held_when_drained

    @property
    def local_idle(self) -> bool:
        """Set by the scheduler: nothing buffered, nothing in flight."""
        return self.state.signals.local_idle

    @local_idle.setter
    def local_idle(self, value: bool) -> None:
        self.state.signals.local_idle = value

    @property
    def hungry(self) -> bool:
        """Set by the scheduler: its downloader has room that nothing buffered can use."""
        return self.state.signals.hungry

    @hungry.setter
    def hungry(self, value: bool) -> None:
        self.state.signals.hungry = value

    # -- reactor-thread API ---------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"banker-redis-{self.link.node}", daemon=True
        )
        self._thread.start()

    def replay(self, ops: SpillOps, on_done: Callable[[], None]) -> None:
        """Before :meth:`start`: send ``ops`` (a spill) first; ``on_done`` once Redis took all.

        ``on_done`` runs on this worker's thread, after Redis confirmed the
        last batch: only then may the spill file go.
        """
        if not len(ops):
            on_done()
            return
        self.replayer.load(ops, on_done)

    def enqueue(self, op: EnqueueOp) -> None:
        self.state.outbox.enqueue(op)
        self.state.signals.drained_since = None
        self._kick()

    def ack(self, token: LeaseToken, refund: bool = False) -> None:
        """The request is done, callback output included (its children are enqueued first).

        ``refund``: it was not fetched after all (put back for later): its
        budget page is given back.
        """
        self.state.outbox.ack(token, refund)
        self._kick()

    def nack(self, token: LeaseToken) -> None:
        """Give the request back unprocessed (a clean stop, a partition this node lost)."""
        self.state.outbox.nack(token)
        self._kick()

    def started(self, token: LeaseToken) -> None:
        """The request went to the downloader: this delivery counts if its lease expires."""
        self.state.outbox.started(token)
        self._kick()

    def downloaded(self, token: LeaseToken) -> None:
        """The request's download is over: its host's slot is free (its lease is still held)."""
        self.state.outbox.downloaded(token)
        self._kick()

    def dead_letter(self, token: LeaseToken, reason: str) -> None:
        self.state.outbox.dead_letter(token, reason)
        self._kick()

    def refund(self, token: LeaseToken) -> None:
        """A copy of the leased request was queued: its ack gives the budget page back."""
        self.state.outbox.refund(token)

    def note_host(self, host: str) -> None:
        """A host the crawl queued requests of (what the operator's commands accept)."""
        self.state.control.note_host(host)

    def note_topic(self, topic: str) -> None:
        """A topic the crawl queued requests under (what the operator's commands accept)."""
        self.state.control.note_topic(topic)

    def charge(self, charge: Charge) -> None:
        """Charge a leased request to its budgets before it is let go (answer in
        :attr:`ControlBox.results <scrapy_banker.redis.worker.control_box.ControlBox.results>`)."""
        self.state.control.charge(charge)
        self._kick()

    def host_state(self, host: str, partition: int, epoch: int, state: str) -> None:
        """Write ``host``'s politeness state (JSON, ``""`` once back to the default) to
        its partition with the next batch, ahead of that batch's acks (see
        :mod:`scrapy_banker.redis.frontier.hosts`); ``epoch``: the partition's epoch
        this node leased the host's requests under (0: the one it owns now)."""
        self.state.outbox.host_state(host, partition, epoch, state)
        self._kick()

    @property
    def control_state(self) -> ControlState:
        """The operator's directives as last read (replaced whole: a read is atomic)."""
        return self.state.control.state

    @property
    def charge_results(self) -> deque[tuple[LeaseToken, int]]:
        """(token, CHARGED | HELD | GONE) of the charges sent."""
        return self.state.control.results

    @property
    def crawl_charged(self) -> int | None:
        """Pages charged to the crawl at the last read (None: no crawl budget)."""
        return self.state.control.crawl_charged

    @property
    def crawl_done(self) -> int | None:
        """Pages charged to the crawl and done (acked) at the last read."""
        return self.state.control.crawl_done

    @property
    def adopted(self) -> deque[tuple[int, int, dict[str, str]]]:
        """(partition, epoch, host -> state JSON) of partitions this node took over,
        each appended before the partition's first leases in :attr:`inbound`."""
        return self.state.adopted

    @property
    def queued(self) -> Mapping[int, int]:
        """Owned partition -> requests still queued there in Redis at its last pop."""
        return self.state.queued

    def request(self, want: int) -> None:
        """The scheduler's buffer could take ``want`` more requests."""
        self.state.signals.want = max(0, want)
        if want > 0:
            self._kick()

    def enable_revisits(self) -> None:
        """The crawl revisits pages: take the due ones from the owned partitions."""
        self.revisits.enabled = True
        self._kick()

    def save_revisit(self, write: RevisitWrite) -> None:
        """Keep a page's revisit state in its partition with the next batch, before
        that batch's acks (a newer state of the page replaces one not sent yet)."""
        self.state.outbox.revisit(write)
        self._kick()

    def dead_revisit(self, partition: int, url: str, reason: str) -> None:
        """Move ``url``'s revisit state, which did not read, to its partition's dead letters."""
        self.state.revisits_dead.append((partition, url, reason))
        self._kick()

    @property
    def revisits_due(self) -> deque[DueRevisit]:
        """Pages taken for a revisit, for the reactor thread (deque pops are thread-safe)."""
        return self.state.revisits_due

    @property
    def revisit_next_due(self) -> float | None:
        """The earliest due time left in the owned partitions at the last take."""
        return self.state.revisit_next_due

    def publish_telemetry(self, key: str, value: str, px_ms: int) -> None:
        """SET ``key`` to ``value`` (expiring) on the next step; replaces an unsent one.

        See :class:`~scrapy_banker.redis.worker.jobs.TelemetryWriter`.
        """
        self.state.outbox.telemetry = (key, value, px_ms)
        self._kick()

    def _kick(self) -> None:
        # Event.set takes a lock and notifies even when the event is set
        # already; a callback queues several ops in a row, and this runs on
        # the reactor thread.
        if not self._wake.is_set():
            self._wake.set()

    def holds(self, token: LeaseToken, now: float) -> bool:
        """Whether ``token``'s lease is known to run for a while yet (a fifth of the TTL).

        A node that was stopped past that -- SIGSTOP, a suspended VM, a Redis
        outage longer than the lease -- may have seen it reaped and leased to
        another node, which fetches it: fetching it here too would break the
        host's politeness and duplicate the page.  Its partitions may still
        look owned here, since the table is reloaded only on the next step;
        see :meth:`LeaseBook.holds <scrapy_banker.redis.worker.state.LeaseBook.holds>`.
        """
        ttl_s = self.link.frontier.lease_ttl_ms / 1000
        leases = self.state.leases
        # The stamp first, then the table: the heartbeat that moves the stamp
        # applied its table before, so a woken node never pairs a fresh
        # renewal with the table it had before it stopped.
        renewed_at = leases.renewed_at
        return leases.holds(token, self.owned, ttl_s, now, renewed_at)

    def pending_ops(self) -> int:
        """Operations not confirmed by Redis yet, a spill being replayed included."""
        return len(self.state.outbox) + self.replayer.pending()

    def take_unsent(self) -> SpillOps:
        """After :meth:`stop`: every operation Redis never confirmed, for a spill file.

        What is left of a replayed spill comes first, then this run's own
        operations, each kind in the order it was queued, without the repeats
        a replay would drop (:func:`~scrapy_banker.core.spill.merge`).
        """
        own = self.state.outbox.take_unsent()
        replay = self.replayer.take()
        # Merged even alone: a link found twice before Redis went away is
        # one enqueue in the file (the dedup would drop the second anyway).
        return merge([replay, own] if replay is not None else [own])

    def take_counters(self) -> dict[str, int]:
        """Counters since the last call, for the scheduler to add to the crawl stats."""
        return self.state.counters.take()

    def stop(self, timeout: float = 10.0) -> int:
        """Flush what is queued (for up to ``timeout`` s), leave the fleet; ops not sent.

        Called off the reactor thread (``deferToThread``).  Leaving the
        registry and rebalancing hands this node's partitions to the others at
        once instead of after the node timeout.
        """
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        deadline = self.clock() + timeout
        while self.pending_ops() and self.clock() < deadline:
            try:
                self.replayer.run_once()
                self.flusher.run_once()
            except REDIS_ERRORS as exc:
                logger.warning("Redis unavailable while stopping (%s); retrying", exc)
                time.sleep(STOP_RETRY_S)
        try:
            self.membership.leave()
        except REDIS_ERRORS as exc:
            logger.warning(
                "Could not leave the fleet cleanly (%s): the other nodes take this "
                "node's partitions after the node timeout",
                exc,
            )
        return self.pending_ops()

    # -- worker thread ----------------------------------------------------------------

    def step(self) -> bool:
        """One round of the jobs, each when it is due; whether it sent or leased anything."""
        if self.replayer.run_once():
            return True
        now = self.clock()
        self.membership.run_once(now)
        flushed = self.flusher.run_once()
        self.telemetry.run_once()
        charged = self.control is not None and self.control.run_once(now)
        self.reaper.run_once(now)
        self.sync.run_once(now)
        popped = self.popper.run_once()
        revisited = self.revisits.run_once(now)
        signals = self.state.signals
        if not flushed and not popped and (signals.local_idle or signals.hungry):
            self.drain.run_once(now)
        return bool(flushed or popped or charged or revisited)

    def _run(self) -> None:
        counters = self.state.counters
        while not self._stopping:
            try:
                busy = self.step()
            except REDIS_ERRORS as exc:
                self._failed(exc)
                continue
            except Exception:  # a bug: say it loudly, keep the node alive
                logger.exception("Unexpected error in the Redis worker thread")
                counters.add("banker/redis/worker_errors")
                self._wake.wait(BUG_PAUSE_S)
                self._wake.clear()
                continue
            if not self.connected:
                self.connected = True
                logger.info("Redis is reachable again")
            self._error_sleep = 0.0
            if busy:
                self._idle_sleep = 0.0
                continue
            # Short sleeps while the crawl goes on (work may reach this node's
            # partitions, or wait to be stolen) and for a while after it
            # looked over -- the start of a crawl looks the same, until one
            # worker reads the seeds and queues them in everyone's
            # partitions; long ones once it has been over for a while.
            cap = self.options.idle_backoff_max_s
            since = self.drained_since
            if since is None or self.clock() - since < DRAINED_BACKOFF_AFTER_S:
                cap = min(cap, ACTIVE_IDLE_SLEEP_S)
            doubled = self._idle_sleep * 2 or MIN_IDLE_SLEEP_S
            self._idle_sleep = min(cap, max(MIN_IDLE_SLEEP_S, doubled))
            counters.add("banker/redis/idle_waits")
            self._wake.wait(self._idle_sleep)
            self._wake.clear()

    def _failed(self, exc: BaseException) -> None:
        self.state.counters.add("banker/redis/errors")
        if self.connected:
            logger.warning(
                "Redis unavailable (%s): keeping work in memory and retrying with backoff", exc
            )
        self.connected = False
        self._error_sleep = min(
            self.error_backoff_max_s, max(MIN_ERROR_SLEEP_S, self._error_sleep * 2)
        )
        # Full jitter, so a fleet does not reconnect in lock-step; cut short by
        # stop(), whose own flush takes over (and gets the full join timeout).
        until = time.monotonic() + random.uniform(0, self._error_sleep)
        while not self._stopping and (left := until - time.monotonic()) > 0:
            time.sleep(min(0.1, left))
