"""The one thread that talks to Redis for a worker process.

Scrapy's engine runs on the reactor thread; a Redis round trip there -- let
alone a retry loop while Redis restarts -- would freeze every download.  So
the scheduler only appends to in-memory op lists and reads an inbound deque;
this thread does all the I/O, batched:

* enqueues, dead-letters, acks and nacks are flushed in that order from one
  atomic snapshot (:meth:`RedisFrontier.flush
  <scrapy_banker.redis.frontier.RedisFrontier.flush>`: one round trip on a
  single server), so a parent's ack is never sent before the child requests
  its callback yielded are safely in Redis (if the enqueue fails, the ack is
  held back too, and the parent is redelivered -- at-least-once);
* pops fill a bounded local buffer from the partitions this node owns and
  knows to hold work -- its own enqueues, the partitions other workers woke
  (:meth:`NodeRegistry.poll <scrapy_banker.redis.registry.NodeRegistry.poll>`)
  and newly owned ones -- with a slow full scan as a safety net; a partition
  whose requests this node already holds (buffered or in flight) up to a cap
  is skipped, so the buffer holds hosts that can start, not a backlog that
  could have gone to an idle worker;
* many times a second it reads the partition table's version and reloads the
  table when it changed, so a partition that moved is given up (and its
  buffered requests handed back) within tens of milliseconds;
* a heartbeat registers the node, renews every lease it holds and rebalances
  when the live set of nodes changed; a reaper (single-flight across the
  fleet) returns expired leases;
* when the scheduler has room it cannot fill, it counts every partition
  (:meth:`RedisFrontier.census <scrapy_banker.redis.frontier.RedisFrontier.census>`):
  if nothing is queued or leased anywhere the crawl is over (exactly, not
  after a quiet period), else it may take over partitions whose work waits
  for a saturated node (:meth:`NodeRegistry.steal
  <scrapy_banker.redis.registry.NodeRegistry.steal>`);
* when Redis is unreachable it keeps everything queued in memory and retries
  with jittered exponential backoff (on top of redis-py's own ``Retry``);
  when it is idle it polls less and less often, up to a cap;
* operations a previous worker spilled to disk (:mod:`scrapy_banker.core.spill`)
  are replayed before anything else (:meth:`FrontierWorker.replay`), and what
  is still unsent when it stops is handed out for spilling
  (:meth:`FrontierWorker.take_unsent`).

Nothing here imports Scrapy or Twisted: the scheduler hands in an
``on_ready`` callback that wakes its engine from this thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

import redis

from scrapy_banker.core.spill import SpilledEnqueue, SpilledLease, SpillOps, merge
from scrapy_banker.redis.frontier import EnqueueOp, LeaseToken

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_banker.net.partitions import Move, PartitionTable
    from scrapy_banker.redis.frontier import Census, Leased, RedisFrontier
    from scrapy_banker.redis.placement import PlacementAgent
    from scrapy_banker.redis.registry import NodeRegistry

logger = logging.getLogger(__name__)

__all__ = ["FrontierWorker"]

#: What a failed Redis call raises once redis-py's own retries are spent.
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    OSError,
)

#: How often (s) a busy worker reads the table's version and its ready set.
SYNC_INTERVAL_S = 0.1
#: How often (s) every owned partition is popped, whether known to hold work
#: or not: work queued by a tool, or a wake-up lost with a stale table.
FULL_SCAN_INTERVAL_S = 2.0
#: How often (s) a worker with room it cannot fill counts the crawl's work.
CENSUS_INTERVAL_S = 0.1
#: ... and once the crawl was found drained (a RedisSpider waiting for URLs).
DRAINED_CENSUS_INTERVAL_S = 0.5
#: While the crawl is not drained, idle sleeps stay this short ...
ACTIVE_IDLE_SLEEP_S = 0.1
#: ... and until it has been drained this long (s).
DRAINED_BACKOFF_AFTER_S = 10.0
#: A partition refused as BUSY (a hand-over waiting for the previous owner's
#: leases) is not asked again for this long.
BUSY_RETRY_S = 0.05
#: Steal attempts: at least this far apart, backing off to the maximum when
#: there was nothing to take.
STEAL_INTERVAL_S = 0.25
STEAL_BACKOFF_MAX_S = 2.0


class FrontierWorker:
    """Background Redis I/O for one node; the reactor thread never blocks on Redis."""

    def __init__(
        self,
        frontier: RedisFrontier,
        registry: NodeRegistry,
        node: str,
        *,
        capacity: float = 1.0,
        heartbeat_s: float = 2.0,
        reap_interval_s: float = 5.0,
        pop_per_partition: int = 4,
        idle_backoff_max_s: float = 2.0,
        error_backoff_max_s: float = 10.0,
        enqueue_batch: int = 500,
        on_ready: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        placement: PlacementAgent | None = None,
        slots: int = 8,
        steal: bool = True,
        seen_cache: int = 0,
        held_cap: int | None = None,
    ) -> None:
        self.frontier = frontier
        self.placement = placement
        self.registry = registry
        self.node = node
        self.capacity = capacity
        self.heartbeat_s = heartbeat_s
        self.reap_interval_s = reap_interval_s
        self.pop_per_partition = pop_per_partition
        #: Requests of one partition this node has buffered or downloading
        #: beyond which it does not pop that partition: its host's per-domain
        #: slots and a request ready behind them.  More would only lease work
        #: this node cannot start, which an idle node could.  A request whose
        #: download is over no longer counts, though its lease is held until
        #: its callback's output is queued: parsing and the ack's round trip
        #: must not keep a busy host's slots empty.
        self.held_cap = pop_per_partition if held_cap is None else held_cap
        self.idle_backoff_max_s = idle_backoff_max_s
        # Never back off past a heartbeat: a worker that retries less often
        # than it beats is declared dead by the others after a Redis outage
        # shorter than the node timeout, and its unacked work is fetched again
        # (the chaos soak measured 787 such duplicates with a 10 s cap).
        self.error_backoff_max_s = min(error_backoff_max_s, heartbeat_s)
        self.enqueue_batch = enqueue_batch
        self.on_ready = on_ready
        self.clock = clock
        #: Hosts this node fetches at once (``CONCURRENT_REQUESTS`` over the
        #: per-domain limit): how many partitions it can work on.
        self.slots = max(1, slots)
        self.steal_enabled = steal
        self.seen_cache = seen_cache
        #: Leased requests for the scheduler; deque appends/pops are thread-safe.
        self.inbound: deque[Leased] = deque()
        #: Partition -> epoch this node may pop; replaced whole, so a read is atomic.
        self.owned: dict[int, int] = {}
        #: The partition table as last loaded (who owns what, for wake-ups).
        self.table: PartitionTable | None = None
        #: How many more requests the scheduler would like buffered (set by it).
        self.want = 0
        #: Set by the scheduler: nothing buffered, nothing in flight.
        self.local_idle = False
        #: Set by the scheduler: its downloader has room that nothing buffered can use.
        self.hungry = False
        #: Server-side view: when the whole crawl was last seen empty (None: not empty).
        self.drained_since: float | None = None
        #: False from the first failed Redis call until one succeeds again.
        self.connected = True
        #: Fingerprints Redis confirmed are in the crawl's seen sets (up to
        #: ``seen_cache``; then it starts over): the scheduler drops a
        #: request found here without a round trip.  Written by this thread
        #: only; set membership tests are atomic for the reactor thread.
        self.seen: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._enqueues: list[EnqueueOp] = []
        self._dead: list[tuple[LeaseToken, str]] = []
        self._acks: list[LeaseToken] = []
        self._nacks: list[LeaseToken] = []
        self._starts: list[LeaseToken] = []
        self._downloaded: list[LeaseToken] = []
        # Leases this node holds (buffered or in flight): renewed each heartbeat.
        # Only this thread touches it.
        self._held: dict[int, set[str]] = {}
        # The part of _held still buffered or downloading: what held_cap limits.
        self._downloading: dict[int, set[str]] = {}
        #: When the last renewal round of every held lease was sent (monotonic,
        #: taken before the call; written by this thread, read by the reactor's).
        self.renewed_at = float("-inf")
        self._counters: dict[str, int] = {}
        self._cursor = 0
        self._nonempty: set[int] = set()
        self._busy_until: dict[int, float] = {}
        self._table_version = -1
        self._next_full_scan = 0.0
        self._next_sync = 0.0
        self._next_census = 0.0
        self._next_steal = 0.0
        self._steal_backoff = STEAL_INTERVAL_S
        self._idle_sleep = 0.0
        self._error_sleep = 0.0
        self._next_beat = 0.0
        self._next_reap = 0.0
        self._registered = False
        #: The latest telemetry write (key, JSON, expiry in ms), replaced whole
        #: by the reactor thread; a newer one supersedes an unsent one.
        self._telemetry: tuple[str, str, int] | None = None
        #: Spilled operations of an earlier worker, sent before anything else;
        #: what is left of them (confirmed batches are removed).
        self._replay: SpillOps | None = None
        self._on_replayed: Callable[[], None] | None = None

    # -- reactor-thread API ---------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"banker-redis-{self.node}", daemon=True
        )
        self._thread.start()

    def replay(self, ops: SpillOps, on_done: Callable[[], None]) -> None:
        """Before :meth:`start`: send ``ops`` (a spill) first; ``on_done`` once Redis took all.

        ``on_done`` runs on this worker's thread, after Redis confirmed the
        last batch: only then may the spill file go.  Replaying is
        idempotent (dedup; delivery-numbered acks and nacks), so a replay cut
        short by an outage is simply sent again.
        """
        if not len(ops):
            on_done()
            return
        # A copy: confirmed batches are cut off it as they go.
        self._replay = SpillOps(list(ops.enqueues), list(ops.dead), list(ops.acks), list(ops.nacks))
        self._on_replayed = on_done

    def enqueue(self, op: EnqueueOp) -> None:
        with self._lock:
            self._enqueues.append(op)
        self.drained_since = None
        self._kick()

    def ack(self, token: LeaseToken) -> None:
        """The request is done, callback output included (its children are enqueued first)."""
        with self._lock:
            self._acks.append(token)
        self._kick()

    def nack(self, token: LeaseToken) -> None:
        """Give the request back unprocessed (a clean stop, a partition this node lost)."""
        with self._lock:
            self._nacks.append(token)
        self._kick()

    def started(self, token: LeaseToken) -> None:
        """The request went to the downloader: this delivery counts if its lease expires."""
        with self._lock:
            self._starts.append(token)
        self._kick()

    def downloaded(self, token: LeaseToken) -> None:
        """The request's download is over: its host's slot is free (its lease is still held)."""
        with self._lock:
            self._downloaded.append(token)
        self._kick()

    def dead_letter(self, token: LeaseToken, reason: str) -> None:
        with self._lock:
            self._dead.append((token, reason))
        self._kick()

    def request(self, want: int) -> None:
        """The scheduler's buffer could take ``want`` more requests."""
        self.want = max(0, want)
        if want > 0:
            self._kick()

    def publish_telemetry(self, key: str, value: str, px_ms: int) -> None:
        """SET ``key`` to ``value`` (expiring) on the next step; replaces an unsent one.

        Telemetry is not work: it is sent after the step's queue operations,
        never retried, and dropped if Redis refuses it (the expiry then tells
        readers the node went quiet).
        """
        self._telemetry = (key, value, px_ms)
        self._kick()

    def _kick(self) -> None:
        # Event.set takes a lock and notifies even when the event is set
        # already; a callback queues several ops in a row, and this runs on
        # the reactor thread.
        if not self._wake.is_set():
            self._wake.set()

    def pending_ops(self) -> int:
        """Operations not confirmed by Redis yet, a spill being replayed included."""
        replay = self._replay
        with self._lock:
            return (
                len(self._enqueues) + len(self._dead) + len(self._acks) + len(self._nacks)
                + (len(replay) if replay is not None else 0)
            )  # fmt: skip

    def take_unsent(self) -> SpillOps:
        """After :meth:`stop`: every operation Redis never confirmed, for a spill file.

        What is left of a replayed spill comes first, then this run's own
        operations, each kind in the order it was queued, without the repeats
        a replay would drop (:func:`~scrapy_banker.core.spill.merge`).
        """
        with self._lock:
            own = SpillOps(
                [SpilledEnqueue(o.partition, o.fingerprint, o.payload, int(o.priority),
                                bool(o.dont_filter)) for o in self._enqueues],
                [(_spilled(t), reason) for t, reason in self._dead],
                [_spilled(t) for t in self._acks],
                [_spilled(t) for t in self._nacks],
            )  # fmt: skip
            self._enqueues, self._dead, self._acks, self._nacks = [], [], [], []
        replay, self._replay, self._on_replayed = self._replay, None, None
        # Merged even alone: a link found twice before Redis went away is
        # one enqueue in the file (the dedup would drop the second anyway).
        return merge([replay, own] if replay is not None else [own])

    def take_counters(self) -> dict[str, int]:
        """Counters since the last call, for the scheduler to add to the crawl stats."""
        with self._lock:
            out, self._counters = self._counters, {}
        return out

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
                if self._replay is not None:
                    self._send_replay()
                self._flush()
            except REDIS_ERRORS as exc:
                logger.warning("Redis unavailable while stopping (%s); retrying", exc)
                time.sleep(0.5)
        try:
            self.registry.leave(self.node)
            self._rebalance()
        except REDIS_ERRORS as exc:
            logger.warning(
                "Could not leave the fleet cleanly (%s): the other nodes take this "
                "node's partitions after the node timeout",
                exc,
            )
        return self.pending_ops()

    # -- worker thread ----------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counters[name] = self._counters.get(name, 0) + n

    def _run(self) -> None:
        while not self._stopping:
            try:
                busy = self._step()
            except REDIS_ERRORS as exc:
                self._failed(exc)
                continue
            except Exception:  # a bug: say it loudly, keep the node alive
                logger.exception("Unexpected error in the Redis worker thread")
                self._count("banker/redis/worker_errors")
                self._wake.wait(1.0)
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
            cap = self.idle_backoff_max_s
            since = self.drained_since
            if since is None or self.clock() - since < DRAINED_BACKOFF_AFTER_S:
                cap = min(cap, ACTIVE_IDLE_SLEEP_S)
            self._idle_sleep = min(cap, max(0.02, self._idle_sleep * 2 or 0.02))
            self._count("banker/redis/idle_waits")
            self._wake.wait(self._idle_sleep)
            self._wake.clear()

    def _failed(self, exc: BaseException) -> None:
        self._count("banker/redis/errors")
        if self.connected:
            logger.warning(
                "Redis unavailable (%s): keeping work in memory and retrying with backoff", exc
            )
        self.connected = False
        self._error_sleep = min(self.error_backoff_max_s, max(0.1, self._error_sleep * 2))
        # Full jitter, so a fleet does not reconnect in lock-step; cut short by
        # stop(), whose own flush takes over (and gets the full join timeout).
        until = time.monotonic() + random.uniform(0, self._error_sleep)
        while not self._stopping and (left := until - time.monotonic()) > 0:
            time.sleep(min(0.1, left))

    def _step(self) -> bool:
        if self._replay is not None:
            self._send_replay()
            return True
        now = self.clock()
        if now >= self._next_beat:
            self._heartbeat()
            self._next_beat = now + self.heartbeat_s
        flushed = self._flush()
        telemetry = self._telemetry
        if telemetry is not None:
            # Taken before the call: a write that fails is dropped, not retried
            # (the next interval brings a newer one).
            self._telemetry = None
            key, value, px_ms = telemetry
            self.frontier.client.set(key, value, px=px_ms)
        if now >= self._next_reap:
            self._next_reap = now + self.reap_interval_s
            # Held for most of the interval after a round: one round per
            # interval fleet-wide, whoever comes first.
            reaped = self.frontier.reap_all(self.node, hold_ms=int(self.reap_interval_s * 800))
            if reaped is not None:
                self._count("banker/redis/reaped", reaped[0])
                self._count("banker/redis/reaped_dead", reaped[1])
                if reaped[0]:
                    self._next_full_scan = 0.0  # requeued work: find it
        if now >= self._next_sync:
            self._sync()
            self._next_sync = now + SYNC_INTERVAL_S
        popped = self._pop() if self.want > 0 and self.owned else 0
        idle = not flushed and not popped and (self.local_idle or self.hungry)
        if idle and now >= self._next_census:
            self._idle_census(now)
        return bool(flushed or popped)

    # -- membership, table ------------------------------------------------------------

    def _heartbeat(self) -> None:
        registry = self.registry
        if not self._registered:
            registry.register(self.node, self.capacity)
            self._registered = True
        else:
            registry.heartbeat(self.node)
        live = registry.live_nodes()
        if self.node not in live:  # timed out (e.g. a long Redis outage): join again
            registry.register(self.node, self.capacity)
            live = registry.live_nodes()
        table = self.table
        if table is None or self._stale(registry.table_version()):
            table = registry.load_table()
        owners = {o for o in table.owners if o is not None}
        if owners != set(live) or any(o is None for o in table.owners):
            moves = self._rebalance()
            if moves:
                self._count("banker/redis/partitions_moved", len(moves))
                if self.placement is not None:
                    self.placement.replan()
            table = registry.load_table()
        self._apply(table)
        held = {p: sorted(ids) for p, ids in self._held.items() if ids}
        if held:
            sent = self.clock()
            self.frontier.renew_many(held)
            self.renewed_at = sent
        if self.placement is not None:
            self._place()

    def _rebalance(self) -> list[Move] | None:
        """Rebalance for the live nodes, dealing out the work there is now evenly."""
        census = self.frontier.census(each=True)
        work = [q + n for q, n in zip(census.queued, census.leased, strict=True)]
        return self.registry.rebalance(self.node, work=work)

    def _apply(self, table: PartitionTable) -> None:
        """Take a freshly loaded table as the truth about what this node owns."""
        self.table = table
        self._table_version = table.version
        owned = {p: table.epochs[p] for p in table.owned_by(self.node)}
        old = self.owned
        if owned.keys() != old.keys():
            logger.info("Node %s owns %d of %d partitions", self.node, len(owned), table.size)
        # Newly owned partitions may hold work: pop them next.
        self._nonempty |= {p for p, e in owned.items() if old.get(p) != e}
        if owned != old:
            self.owned = owned

    def _stale(self, version: int) -> bool:
        """Is the stored table newer than ours?  (0: no table, or one without a
        version, written by an older scrapy-banker: reload it to be sure.)"""
        return version == 0 or version != self._table_version

    def _sync(self) -> None:
        """Reload the table if it changed; note the partitions other workers woke."""
        version, ready = self.registry.poll(self.node)
        if self._stale(version):
            self._apply(self.registry.load_table())
        owned = self.owned
        self._nonempty.update(p for p in ready if p in owned)

    def _place(self) -> None:
        assert self.placement is not None
        try:
            moves = self.placement.beat(self.registry)
        except REDIS_ERRORS:
            raise
        except Exception:  # a planning bug must not stop heartbeats and lease renewals
            logger.exception("Network-aware placement failed; keeping the current table")
            self._count("banker/placement/errors")
            return
        if moves:
            self._count("banker/placement/moves", len(moves))
            self._apply(self.registry.load_table())

    # -- the end of the crawl, work stealing ---------------------------------------------

    def _idle_census(self, now: float) -> None:
        """The scheduler has room it cannot fill: is the crawl over, or is there work to take?"""
        steal = self.steal_enabled and self.hungry and now >= self._next_steal
        census = self.frontier.census(each=steal)
        self._count("banker/redis/drain_checks")
        if census.drained and not self.pending_ops():
            if self.drained_since is None:
                self.drained_since = now
            self._next_census = now + DRAINED_CENSUS_INTERVAL_S
            return
        self.drained_since = None
        self._next_census = now + CENSUS_INTERVAL_S
        if steal:
            self._steal(census, now)

    def _steal(self, census: Census, now: float) -> None:
        limit = self.slots - len(self._held)
        if limit < 1 or self.table is None:
            return
        moves = self.registry.steal(
            self.node, census.queued, census.leased, slots=self.slots, limit=limit
        )
        if moves is None:  # another node is rewriting the table: soon again
            self._next_steal = now + STEAL_INTERVAL_S
            return
        if moves:
            self._count("banker/redis/steals")
            self._count("banker/redis/partitions_stolen", len(moves))
            logger.debug("Took %d waiting partitions from %s", len(moves),
                         sorted({m.old for m in moves if m.old}))  # fmt: skip
            self._apply(self.registry.load_table())
            self._steal_backoff = STEAL_INTERVAL_S
        else:
            self._steal_backoff = min(STEAL_BACKOFF_MAX_S, self._steal_backoff * 2)
        self._next_steal = now + self._steal_backoff

    # -- flushing ---------------------------------------------------------------------

    def _flush(self) -> int:
        with self._lock:
            enqueues, self._enqueues = self._enqueues, []
            dead, self._dead = self._dead, []
            acks, self._acks = self._acks, []
            nacks, self._nacks = self._nacks, []
            starts, self._starts = self._starts, []
        if not (enqueues or dead or acks or nacks or starts):
            return 0
        sent = 0
        try:
            # Big batches of children go first on their own; the last one
            # travels with the acks, in order, in one round trip.
            while len(enqueues) - sent > self.enqueue_batch:
                batch = enqueues[sent : sent + self.enqueue_batch]
                self._enqueued(batch, self.frontier.flush(batch).enqueued)
                sent += len(batch)
            rest = enqueues[sent:]
            done = self.frontier.flush(rest, dead, _refs(acks), _refs(nacks), _refs(starts))
            self._enqueued(rest, done.enqueued)
            sent = len(enqueues)
        except BaseException:
            # Put back what was not confirmed, in front of anything newer, so
            # the order (children before the parent's ack) still holds.  Every
            # operation is idempotent, so re-sending a batch that did reach
            # Redis is harmless.
            with self._lock:
                self._enqueues[:0] = enqueues[sent:]
                self._dead[:0] = dead
                self._acks[:0] = acks
                self._nacks[:0] = nacks
                self._starts[:0] = starts
            raise
        self._count("banker/redis/dead_lettered", done.dead_lettered)
        self._count("banker/redis/acked", done.acked)
        self._count("banker/redis/nacked", done.nacked)
        for token, _ in dead:
            self._forget(token)
        for token in acks:
            self._forget(token)
        for token in nacks:
            self._forget(token)
        if done.nacked:
            self._nonempty.update(t.partition for t in nacks if t.partition in self.owned)
        return 1

    def _send_replay(self) -> None:
        """Send the spill being replayed, enqueues first, dropping each batch Redis confirmed."""
        replay = self._replay
        assert replay is not None
        while replay.enqueues:
            batch = [
                EnqueueOp(e.partition, e.fingerprint, e.payload, e.priority, e.dont_filter)
                for e in replay.enqueues[: self.enqueue_batch]
            ]
            last = len(batch) == len(replay.enqueues)
            dead = [(_token(s), reason) for s, reason in replay.dead] if last else []
            acks = [_token(s) for s in replay.acks] if last else []
            nacks = [_token(s) for s in replay.nacks] if last else []
            done = self.frontier.flush(batch, dead, _refs(acks), _refs(nacks))
            self._enqueued(batch, done.enqueued)
            del replay.enqueues[: len(batch)]
            self._count("banker/redis/spill/replayed", len(batch))
            self._count("banker/redis/spill/enqueued", sum(r is not None for r in done.enqueued))
            if last:
                self._replayed_rest(replay, done.dead_lettered, done.acked, done.nacked)
        if len(replay):  # no enqueue left, or none at all
            dead = [(_token(s), reason) for s, reason in replay.dead]
            acks = [_token(s) for s in replay.acks]
            nacks = [_token(s) for s in replay.nacks]
            done = self.frontier.flush([], dead, _refs(acks), _refs(nacks))
            self._replayed_rest(replay, done.dead_lettered, done.acked, done.nacked)
        self._replay = None
        on_done, self._on_replayed = self._on_replayed, None
        if on_done is not None:
            on_done()

    def _replayed_rest(self, replay: SpillOps, dead: int, acked: int, nacked: int) -> None:
        """The spill's dead letters, acks and nacks were confirmed (stale ones did nothing)."""
        self._count("banker/redis/spill/replayed", len(replay.dead) + len(replay.acks)
                    + len(replay.nacks))  # fmt: skip
        self._count("banker/redis/dead_lettered", dead)
        self._count("banker/redis/acked", acked)
        self._count("banker/redis/nacked", nacked)
        replay.dead.clear()
        replay.acks.clear()
        replay.nacks.clear()

    def _enqueued(self, ops: list[EnqueueOp], results: list[str | None]) -> None:
        """Bookkeeping of an enqueue batch Redis answered."""
        owned, table = self.owned, self.table
        wake: dict[str, set[int]] = {}
        added = 0
        seen = self.seen
        cache = self.seen_cache > 0
        if cache and len(seen) + len(ops) > self.seen_cache:
            seen.clear()
        for op, result in zip(ops, results, strict=True):
            if cache and not op.dont_filter:
                seen.add(op.fingerprint)  # queued now, or already seen: in the seen set
            if result is None:
                continue
            added += 1
            p = op.partition
            if p in owned:
                self._nonempty.add(p)
            elif table is not None:
                owner = table.owners[p]
                if owner is not None:
                    wake.setdefault(owner, set()).add(p)
        self._count("banker/redis/enqueued", added)
        self._count("banker/redis/duplicates", len(results) - added)
        if wake:
            self.registry.notify(wake)

    def holds(self, token: LeaseToken, now: float) -> bool:
        """Whether ``token``'s lease is known to run for a while yet (a fifth of the TTL).

        It ran at least until the later of its pop and the last renewal
        round, both stamped before the call was sent, plus the TTL.  A node
        that was stopped past that -- SIGSTOP, a suspended VM, a Redis outage
        longer than the lease -- may have seen it reaped and leased to
        another node, which fetches it: fetching it here too would break the
        host's politeness and duplicate the page.  Its partitions may still
        look owned here, since the table is reloaded only on the next step;
        and once it is, a partition it got back under a new epoch does not
        vouch for leases taken under the old one.
        """
        epoch = self.owned.get(token.partition)
        if epoch is None or (token.epoch and epoch != token.epoch):
            # Lost, or owned again under a newer epoch (stopped past the node
            # timeout and joined again): leases of the old epoch were reaped
            # and may be another node's, and renewals do not say whose.
            return False
        ttl = self.frontier.lease_ttl_ms / 1000
        return now < max(token.leased_at, self.renewed_at) + 0.8 * ttl

    def _forget(self, token: LeaseToken) -> None:
        for held in (self._held, self._downloading):
            ids = held.get(token.partition)
            if ids is not None:
                ids.discard(token.id)
                if not ids:
                    del held[token.partition]

    def _take_downloaded(self) -> None:
        with self._lock:
            done, self._downloaded = self._downloaded, []
        downloading = self._downloading
        for token in done:
            ids = downloading.get(token.partition)
            if ids is not None:
                ids.discard(token.id)
                if not ids:
                    del downloading[token.partition]

    # -- popping ----------------------------------------------------------------------

    def _pop(self) -> int:
        owned = self.owned
        now = self.clock()
        self._take_downloaded()
        held, cap, busy_until = self._downloading, self.held_cap, self._busy_until
        full_scan = now >= self._next_full_scan
        if not full_scan:
            # Only partitions known to have work: with M >> nodes most owned
            # partitions are empty, and scanning them all each round costs CPU.
            order = [p for p in self._nonempty if p in owned]
        else:
            # Every owned partition, those with work first, the rest in a
            # rotating order: work queued where nobody told this node is
            # found too.
            self._next_full_scan = now + FULL_SCAN_INTERVAL_S
            order = [p for p in owned if p in self._nonempty]
            rest = sorted(p for p in owned if p not in self._nonempty)
            if rest:
                start = self._cursor % len(rest)
                order += rest[start:] + rest[:start]
                self._cursor += 64
        # Ask for about what the scheduler wants, not a few requests of every
        # partition with work: a lease is work no other node can take.
        # Partitions this node already works on come first (their hosts are
        # busy here anyway); one it holds enough of is left alone.
        order.sort(key=lambda p: p not in held)
        counts: dict[int, int] = {}
        total = 0
        for p in order:
            room = cap - len(held.get(p, ()))
            if room > 0 and busy_until.get(p, 0.0) <= now:
                counts[p] = n = min(self.pop_per_partition, room)
                total += n
                if total >= self.want and not full_scan:
                    break
        if not counts:
            return 0
        got = 0
        candidates = list(counts)
        for i in range(0, len(candidates), 128):
            chunk = {p: owned[p] for p in candidates[i : i + 128]}
            sent = self.clock()
            result = self.frontier.pop_many(chunk, self.node, self.pop_per_partition, counts=counts)
            for p in result.empty:
                self._nonempty.discard(p)
                busy_until.pop(p, None)
            for p in result.busy:
                self._nonempty.add(p)
                busy_until[p] = now + BUSY_RETRY_S
            if result.busy:
                self._count("banker/redis/handover_waits", len(result.busy))
            if result.not_owned:
                self._count("banker/redis/fenced", len(result.not_owned))
                self._next_sync = 0.0  # reload the table now
                self.owned = {p: e for p, e in self.owned.items() if p not in result.not_owned}
            for leased in result.leased:
                self._nonempty.add(leased.partition)
                held.setdefault(leased.partition, set()).add(leased.id)
                self._held.setdefault(leased.partition, set()).add(leased.id)
                self.inbound.append(replace(leased, leased_at=sent, epoch=chunk[leased.partition]))
            got += len(result.leased)
            if got >= self.want:
                break
        if got:
            self.drained_since = None
            self.want = max(0, self.want - got)
            self._count("banker/redis/popped", got)
            if self.on_ready is not None:
                self.on_ready()
        return got


def _spilled(token: LeaseToken) -> SpilledLease:
    return SpilledLease(token.partition, token.id, token.delivery)


def _token(lease: SpilledLease) -> LeaseToken:
    return LeaseToken(lease.partition, lease.id, lease.delivery)


def _refs(tokens: list[LeaseToken]) -> dict[int, list[str]]:
    """Partition -> ``id#delivery`` refs: the ack and nack scripts act on that delivery only."""
    out: dict[int, list[str]] = {}
    for token in tokens:
        out.setdefault(token.partition, []).append(token.ref)
    return out
