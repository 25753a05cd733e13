"""The one thread that talks to Redis for a worker process.

Scrapy's engine runs on the reactor thread; a Redis round trip there -- let
alone a retry loop while Redis restarts -- would freeze every download.  So
the scheduler only appends to in-memory op lists and reads an inbound deque;
this thread does all the I/O, batched:

* enqueues, dead-letters, acks and nacks are flushed in that order from one
  atomic snapshot, so a parent's ack is never sent before the child requests
  its callback yielded are safely in Redis (if the enqueue fails, the ack is
  held back too, and the parent is redelivered -- at-least-once);
* pops fill a bounded local buffer from the partitions this node owns, in a
  rotating order so no partition starves;
* a heartbeat registers the node, renews every lease it holds, reloads which
  partitions it owns and rebalances when the live set of nodes changed; a
  reaper (single-flight across the fleet) returns expired leases;
* when Redis is unreachable it keeps everything queued in memory and retries
  with jittered exponential backoff (on top of redis-py's own ``Retry``);
  when it is idle it polls less and less often, up to a cap.

Nothing here imports Scrapy or Twisted: the scheduler hands in an
``on_ready`` callback that wakes its engine from this thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_banker.redis.frontier import EnqueueOp, Leased, LeaseToken, RedisFrontier
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
    ) -> None:
        self.frontier = frontier
        self.placement = placement
        self.registry = registry
        self.node = node
        self.capacity = capacity
        self.heartbeat_s = heartbeat_s
        self.reap_interval_s = reap_interval_s
        self.pop_per_partition = pop_per_partition
        self.idle_backoff_max_s = idle_backoff_max_s
        self.error_backoff_max_s = error_backoff_max_s
        self.enqueue_batch = enqueue_batch
        self.on_ready = on_ready
        self.clock = clock
        #: Leased requests for the scheduler; deque appends/pops are thread-safe.
        self.inbound: deque[Leased] = deque()
        #: Partition -> epoch this node may pop; replaced whole, so a read is atomic.
        self.owned: dict[int, int] = {}
        #: How many more requests the scheduler would like buffered (set by it).
        self.want = 0
        #: Set by the scheduler: nothing buffered, nothing in flight.
        self.local_idle = False
        #: Server-side view: when the whole crawl was last seen empty (None: not empty).
        self.drained_since: float | None = None
        #: False from the first failed Redis call until one succeeds again.
        self.connected = True
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._enqueues: list[EnqueueOp] = []
        self._dead: list[tuple[LeaseToken, str]] = []
        self._acks: list[LeaseToken] = []
        self._nacks: list[LeaseToken] = []
        # Leases this node holds (buffered or in flight): renewed each heartbeat.
        # Only this thread touches it.
        self._held: dict[int, set[str]] = {}
        self._counters: dict[str, int] = {}
        self._cursor = 0
        self._nonempty: set[int] = set()
        self._next_full_scan = 0.0
        self._idle_sleep = 0.0
        self._error_sleep = 0.0
        self._next_beat = 0.0
        self._next_reap = 0.0
        self._next_drain_check = 0.0
        self._registered = False

    # -- reactor-thread API ---------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"banker-redis-{self.node}", daemon=True
        )
        self._thread.start()

    def enqueue(self, op: EnqueueOp) -> None:
        with self._lock:
            self._enqueues.append(op)
        self.drained_since = None
        self._wake.set()

    def ack(self, token: LeaseToken) -> None:
        """The request is done, callback output included (its children are enqueued first)."""
        with self._lock:
            self._acks.append(token)
        self._wake.set()

    def nack(self, token: LeaseToken) -> None:
        """Give the request back unprocessed (a clean stop, a partition this node lost)."""
        with self._lock:
            self._nacks.append(token)
        self._wake.set()

    def dead_letter(self, token: LeaseToken, reason: str) -> None:
        with self._lock:
            self._dead.append((token, reason))
        self._wake.set()

    def request(self, want: int) -> None:
        """The scheduler's buffer could take ``want`` more requests."""
        self.want = max(0, want)
        if want > 0:
            self._wake.set()

    def pending_ops(self) -> int:
        with self._lock:
            return len(self._enqueues) + len(self._dead) + len(self._acks) + len(self._nacks)

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
                self._flush()
            except REDIS_ERRORS as exc:
                logger.warning("Redis unavailable while stopping (%s); retrying", exc)
                time.sleep(0.5)
        try:
            self.registry.leave(self.node)
            self.registry.rebalance(self.node)
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
            self._idle_sleep = min(self.idle_backoff_max_s, max(0.02, self._idle_sleep * 2 or 0.02))
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
        # Full jitter, so a fleet does not reconnect in lock-step.
        time.sleep(random.uniform(0, self._error_sleep))

    def _step(self) -> bool:
        now = self.clock()
        if now >= self._next_beat:
            self._heartbeat()
            self._next_beat = now + self.heartbeat_s
        flushed = self._flush()
        if now >= self._next_reap:
            self._next_reap = now + self.reap_interval_s
            reaped = self.frontier.reap_all(self.node)
            if reaped is not None:
                self._count("banker/redis/reaped", reaped[0])
                self._count("banker/redis/reaped_dead", reaped[1])
        popped = self._pop() if self.want > 0 and self.owned else 0
        if not flushed and not popped and self.local_idle and now >= self._next_drain_check:
            self._next_drain_check = now + 0.5
            if self.frontier.outstanding(any_=True) == 0 and not self.pending_ops():
                if self.drained_since is None:
                    self.drained_since = now
            else:
                self.drained_since = None
        return bool(flushed or popped)

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
        table = registry.load_table()
        owners = {o for o in table.owners if o is not None}
        if owners != set(live) or any(o is None for o in table.owners):
            moves = registry.rebalance(self.node)
            if moves:
                self._count("banker/redis/partitions_moved", len(moves))
                if self.placement is not None:
                    self.placement.replan()
            table = registry.load_table()
        owned = {p: table.epochs[p] for p in table.owned_by(self.node)}
        if owned.keys() != self.owned.keys():
            logger.info("Node %s owns %d of %d partitions", self.node, len(owned), table.size)
        self.owned = owned
        held = {p: sorted(ids) for p, ids in self._held.items() if ids}
        if held:
            self.frontier.renew_many(held)
        if self.placement is not None:
            self._place()

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
            table = self.registry.load_table()
            self.owned = {p: table.epochs[p] for p in table.owned_by(self.node)}

    def _flush(self) -> int:
        with self._lock:
            enqueues, self._enqueues = self._enqueues, []
            dead, self._dead = self._dead, []
            acks, self._acks = self._acks, []
            nacks, self._nacks = self._nacks, []
        if not (enqueues or dead or acks or nacks):
            return 0
        sent = 0
        try:
            while sent < len(enqueues):
                batch = enqueues[sent : sent + self.enqueue_batch]
                results = self.frontier.enqueue_many(batch)
                sent += len(batch)
                for op, result in zip(batch, results, strict=True):
                    if result is not None and op.partition in self.owned:
                        self._nonempty.add(op.partition)
                added = sum(r is not None for r in results)
                self._count("banker/redis/enqueued", added)
                self._count("banker/redis/duplicates", len(results) - added)
            while dead:
                token, reason = dead[0]
                self.frontier.dead_letter(token.partition, token.id, reason)
                self._forget(token)
                self._count("banker/redis/dead_lettered")
                dead.pop(0)
            if acks:
                self._count("banker/redis/acked", self.frontier.ack_many(_refs(acks)))
                for token in acks:
                    self._forget(token)
                acks = []
            if nacks:
                self._count("banker/redis/nacked", self.frontier.nack_many(_refs(nacks)))
                for token in nacks:
                    self._forget(token)
                nacks = []
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
            raise
        return 1

    def _forget(self, token: LeaseToken) -> None:
        ids = self._held.get(token.partition)
        if ids is not None:
            ids.discard(token.id)
            if not ids:
                del self._held[token.partition]

    def _pop(self) -> int:
        owned = self.owned
        now = self.clock()
        if self._nonempty & owned.keys() and now < self._next_full_scan:
            # Only partitions known to have work: with M >> nodes most owned
            # partitions are empty, and scanning them all each round costs CPU.
            order = [p for p in owned if p in self._nonempty]
        else:
            # Every owned partition, those with work first, the rest in a
            # rotating order: work another node queued there is found too.
            self._next_full_scan = now + 0.25
            order = [p for p in owned if p in self._nonempty]
            rest = sorted(p for p in owned if p not in self._nonempty)
            if rest:
                start = self._cursor % len(rest)
                order += rest[start:] + rest[:start]
                self._cursor += 64
        got = 0
        for i in range(0, len(order), 128):
            chunk = {p: owned[p] for p in order[i : i + 128]}
            result = self.frontier.pop_many(chunk, self.node, self.pop_per_partition)
            for p in result.empty:
                self._nonempty.discard(p)
            for p in result.busy:
                self._nonempty.add(p)
            if result.busy:
                self._count("banker/redis/handover_waits", len(result.busy))
            if result.not_owned:
                self._count("banker/redis/fenced", len(result.not_owned))
                self._next_beat = 0.0  # reload the table now
                self.owned = {p: e for p, e in self.owned.items() if p not in result.not_owned}
            for leased in result.leased:
                self._nonempty.add(leased.partition)
                self._held.setdefault(leased.partition, set()).add(leased.id)
                self.inbound.append(leased)
            got += len(result.leased)
            if got >= self.want:
                break
        if got:
            self.want = max(0, self.want - got)
            self._count("banker/redis/popped", got)
            if self.on_ready is not None:
                self.on_ready()
        return got


def _refs(tokens: list[LeaseToken]) -> dict[int, list[str]]:
    """Partition -> ``id#delivery`` refs: the ack and nack scripts act on that delivery only."""
    out: dict[int, list[str]] = {}
    for token in tokens:
        out.setdefault(token.partition, []).append(token.ref)
    return out
