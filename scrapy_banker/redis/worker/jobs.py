"""The jobs of a fleet worker's Redis thread, one class each.

:class:`~scrapy_banker.redis.worker.FrontierWorker` runs them in turn on its
one thread, which does all of a node's Redis I/O; each keeps its own timers
and shares the rest through :class:`~scrapy_banker.redis.worker.state.WorkerState`.
Each has a public step -- ``run_once`` (when due) and the unconditional
action it times -- so a test drives a job exactly as the loop does:

* :class:`Replayer` -- a spill of an earlier worker, sent before anything else;
* :class:`Membership` -- registration, heartbeat, lease renewal, rebalancing
  when the live set of nodes changed, network-aware placement;
* :class:`Flusher` -- enqueues, dead letters, acks and nacks, in that order,
  from one atomic snapshot (:meth:`RedisFrontier.flush
  <scrapy_banker.redis.frontier.RedisFrontier.flush>`: one round trip on a
  single server), so a parent's ack is never sent before the child requests
  its callback yielded are safely in Redis (if the enqueue fails the ack is
  held back too, and the parent is redelivered -- at-least-once);
* :class:`TelemetryWriter` -- the node's latest telemetry sample;
* :class:`Reaper` -- expired leases back to the queue (single-flight across
  the fleet);
* :class:`TableSync` -- the partition table's version, read many times a
  second, and the table reloaded when it changed, so a partition that moved
  is given up within tens of milliseconds; the partitions other workers woke
  (:meth:`NodeRegistry.poll <scrapy_banker.redis.frontier.registry.NodeRegistry.poll>`);
* :class:`Popper` -- a bounded local buffer, filled from the owned partitions
  known to hold work (with a slow full scan as a safety net); a partition
  whose requests this node already holds up to a cap is skipped, so the
  buffer holds hosts that can start, not a backlog an idle worker could take;
* :class:`RevisitPopper` -- with ``BANKER_RECRAWL``, the pages due for a
  revisit in the owned partitions, handed to the scheduler to queue
  (:mod:`scrapy_banker.redis.frontier.revisit_states`);
* :class:`DrainWatch` -- when the scheduler has room it cannot fill, a count
  of every partition (:meth:`RedisFrontier.census
  <scrapy_banker.redis.frontier.RedisFrontier.census>`): if nothing is
  queued or leased anywhere the crawl is over (exactly, not after a quiet
  period), else partitions whose work waits for a saturated node may be
  taken over (:meth:`NodeRegistry.steal
  <scrapy_banker.redis.frontier.registry.NodeRegistry.steal>`).

The intervals are module constants; ``scrapy_banker.net.fleetmodel`` models
the Redis load they cause with copies of them (``tests/test_fleetmodel.py``
checks that the copies match).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from scrapy_banker.core.spill import SpillOps
from scrapy_banker.redis.connection import REDIS_ERRORS
from scrapy_banker.redis.frontier.hosts import HostWrite

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence, Set

    from scrapy_banker.core.ops import EnqueueOp, LeaseToken
    from scrapy_banker.net.partitions import Move
    from scrapy_banker.redis.frontier import Flushed
    from scrapy_banker.redis.frontier.census import Census
    from scrapy_banker.redis.worker.placement_agent import PlacementAgent
    from scrapy_banker.redis.worker.state import FleetLink, WorkerState

logger = logging.getLogger(__name__)

__all__ = [
    "BUSY_RETRY_S",
    "CENSUS_INTERVAL_S",
    "DRAINED_CENSUS_INTERVAL_S",
    "FULL_SCAN_INTERVAL_S",
    "POP_CHUNK",
    "REAP_HOLD_FRACTION",
    "REVISIT_FULL_SCAN_S",
    "REVISIT_POP_LIMIT",
    "REVISIT_POP_S",
    "STEAL_BACKOFF_MAX_S",
    "STEAL_INTERVAL_S",
    "SYNC_INTERVAL_S",
    "DrainWatch",
    "Flusher",
    "Membership",
    "Popper",
    "Reaper",
    "Replayer",
    "RevisitPopper",
    "TableSync",
    "TelemetryWriter",
]

#: How often (s) a busy worker reads the table's version and its ready set.
SYNC_INTERVAL_S = 0.1
#: How often (s) every owned partition is popped, whether known to hold work
#: or not: work queued by a tool, or a wake-up lost with a stale table.
FULL_SCAN_INTERVAL_S = 2.0
#: Partitions per pop pipeline (one round trip).
POP_CHUNK = 128
#: How far the start of a full scan's rotating order moves from one scan to the next.
SCAN_CURSOR_STEP = 64
#: A partition refused as BUSY (a hand-over waiting for the previous owner's
#: leases) is not asked again for this long (s).
BUSY_RETRY_S = 0.05
#: How often (s) a worker with room it cannot fill counts the crawl's work.
CENSUS_INTERVAL_S = 0.1
#: ... and once the crawl was found drained (a RedisSpider waiting for URLs).
DRAINED_CENSUS_INTERVAL_S = 0.5
#: Steal attempts: at least this far apart (s), backing off to the maximum
#: when there was nothing to take.
STEAL_INTERVAL_S = 0.25
STEAL_BACKOFF_MAX_S = 2.0
#: Share of the reap interval a finished reaper round keeps the fleet-wide
#: lock: one round per interval fleet-wide, whoever comes first.
REAP_HOLD_FRACTION = 0.8
#: Seconds between two takes of the due revisits of the owned partitions ...
REVISIT_POP_S = 0.5
#: ... and the most pages one take hands out per partition.
REVISIT_POP_LIMIT = 256
#: Seconds between two takes that ask every owned partition, not only those known to
#: hold revisit states (pages another worker wrote to a partition this node took over).
REVISIT_FULL_SCAN_S = 5.0


def refs(
    tokens: Sequence[LeaseToken], refunds: Set[LeaseToken] = frozenset()
) -> dict[int, list[str]]:
    """Partition -> ``id#delivery`` refs: the ack and nack scripts act on that delivery only.

    A token in ``refunds`` gets an ``r``: the ack gives its budget page back.
    """
    out: dict[int, list[str]] = {}
    for token in tokens:
        ref = token.ref + "r" if refunds and token in refunds else token.ref
        out.setdefault(token.partition, []).append(ref)
    return out


class Flusher:
    """Sends the outbox: its enqueues in batches, the rest with the last batch, in order."""

    def __init__(
        self, link: FleetLink, state: WorkerState, *, enqueue_batch: int, seen_cache: int
    ) -> None:
        self.link = link
        self.state = state
        self.enqueue_batch = enqueue_batch
        self.seen_cache = seen_cache
        #: Fingerprints Redis confirmed are in the crawl's seen sets (up to
        #: ``seen_cache``; then it starts over): the scheduler drops a
        #: request found here without a round trip.  Written by the worker
        #: thread only; set membership tests are atomic for the reactor thread.
        self.seen: set[str] = set()

    def run_once(self) -> bool:
        """Send what the outbox holds; False if it held nothing."""
        state = self.state
        batch = state.outbox.take()
        if not batch:
            return False
        frontier = self.link.frontier
        enqueues = batch.enqueues
        sent = 0
        try:
            # Big batches of children go first on their own; the last one
            # travels with the acks, in order, in one round trip.
            while len(enqueues) - sent > self.enqueue_batch:
                chunk = enqueues[sent : sent + self.enqueue_batch]
                self.record_enqueued(chunk, frontier.flush(chunk).enqueued)
                sent += len(chunk)
            rest = enqueues[sent:]
            done = frontier.flush(
                rest, batch.dead, refs(batch.acks, batch.refunds), refs(batch.nacks),
                refs(batch.starts), hosts=self.host_writes(batch.hosts), node=self.link.node,
                revisits=list(batch.revisits.values()),
            )  # fmt: skip
            self.record_enqueued(rest, done.enqueued)
            sent = len(enqueues)
        except BaseException:
            state.outbox.put_back(batch, sent)
            raise
        counters = state.counters
        counters.add("banker/redis/host_states_written", done.host_states)
        counters.add("banker/redis/host_states_fenced", done.host_states_fenced)
        counters.add("banker/redis/dead_lettered", done.dead_lettered)
        counters.add("banker/redis/acked", done.acked)
        counters.add("banker/redis/nacked", done.nacked)
        counters.add("banker/redis/revisits_saved", done.revisits_saved)
        state.hints.revisits.update(w.partition for w in batch.revisits.values())
        leases = state.leases
        for token, _ in batch.dead:
            leases.forget(token)
        for token in batch.acks:
            leases.forget(token)
        for token in batch.nacks:
            leases.forget(token)
        if done.nacked:
            owned = state.ownership.owned
            state.hints.nonempty.update(t.partition for t in batch.nacks if t.partition in owned)
        return True

    def host_writes(self, hosts: Mapping[str, tuple[int, int, str]]) -> list[HostWrite]:
        """The batch's host states, one write per partition and epoch.

        A state whose epoch is unknown (0) goes under the epoch this node
        owns the partition at; one of a partition this node neither owns nor
        leased from is dropped (its owner keeps its own).
        """
        owned = self.state.ownership.owned
        grouped: dict[tuple[int, int], dict[str, str]] = {}
        for host, (partition, epoch, value) in hosts.items():
            epoch = epoch or owned.get(partition, 0)
            if epoch:
                grouped.setdefault((partition, epoch), {})[host] = value
        return [HostWrite(p, e, states) for (p, e), states in grouped.items()]

    def record_enqueued(self, ops: Sequence[EnqueueOp], results: Sequence[str | None]) -> None:
        """Bookkeeping of an enqueue batch Redis answered: seen cache, hints, wake-ups."""
        state = self.state
        owned, table = state.ownership.owned, state.ownership.table
        nonempty = state.hints.nonempty
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
                nonempty.add(p)
            elif table is not None:
                owner = table.owners[p]
                if owner is not None:
                    wake.setdefault(owner, set()).add(p)
        state.counters.add("banker/redis/enqueued", added)
        state.counters.add("banker/redis/duplicates", len(results) - added)
        if wake:
            self.link.registry.notify(wake)


class Replayer:
    """Sends the operations an earlier worker spilled, before anything else.

    Confirmed batches are cut off :attr:`ops` as they go, so what is left is
    exactly what Redis has not confirmed.  Replaying is idempotent (dedup;
    delivery-numbered acks and nacks), so a replay cut short by an outage is
    simply sent again.
    """

    def __init__(
        self, link: FleetLink, state: WorkerState, flusher: Flusher, *, enqueue_batch: int
    ) -> None:
        self.link = link
        self.state = state
        self.flusher = flusher
        self.enqueue_batch = enqueue_batch
        #: What is left of the spill being replayed (None: nothing to replay).
        self.ops: SpillOps | None = None
        self._on_done: Callable[[], None] | None = None

    def load(self, ops: SpillOps, on_done: Callable[[], None]) -> None:
        """Replay ``ops``; ``on_done`` once Redis took all of them."""
        # A copy: confirmed batches are cut off it as they go.
        self.ops = SpillOps(
            list(ops.enqueues), list(ops.dead), list(ops.acks), list(ops.nacks),
            list(ops.revisits),
        )  # fmt: skip
        self._on_done = on_done

    def pending(self) -> int:
        ops = self.ops
        return len(ops) if ops is not None else 0

    def take(self) -> SpillOps | None:
        """What is left, for a spill file; the replay is dropped."""
        ops, self.ops, self._on_done = self.ops, None, None
        return ops

    def run_once(self) -> bool:
        """Send the whole spill, enqueues first; False if there is none."""
        replay = self.ops
        if replay is None:
            return False
        frontier, counters = self.link.frontier, self.state.counters
        while replay.enqueues:
            batch = replay.enqueues[: self.enqueue_batch]
            last = len(batch) == len(replay.enqueues)
            dead = replay.dead if last else []
            acks = refs(replay.acks) if last else {}
            nacks = refs(replay.nacks) if last else {}
            revisits = replay.revisits if last else []
            done = frontier.flush(batch, dead, acks, nacks, revisits=revisits)
            self.flusher.record_enqueued(batch, done.enqueued)
            del replay.enqueues[: len(batch)]
            counters.add("banker/redis/spill/replayed", len(batch))
            counters.add("banker/redis/spill/enqueued", sum(r is not None for r in done.enqueued))
            if last:
                self._rest_confirmed(replay, done)
        if len(replay):  # no enqueue left, or none at all
            done = frontier.flush(
                [], replay.dead, refs(replay.acks), refs(replay.nacks), revisits=replay.revisits
            )
            self._rest_confirmed(replay, done)
        self.ops = None
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()
        return True

    def _rest_confirmed(self, replay: SpillOps, done: Flushed) -> None:
        """The spill's dead letters, acks, nacks and revisit states were confirmed (stale
        ones did nothing)."""
        counters = self.state.counters
        counters.add("banker/redis/spill/replayed", len(replay.dead) + len(replay.acks)
                     + len(replay.nacks) + len(replay.revisits))  # fmt: skip
        counters.add("banker/redis/dead_lettered", done.dead_lettered)
        counters.add("banker/redis/acked", done.acked)
        counters.add("banker/redis/nacked", done.nacked)
        counters.add("banker/redis/revisits_saved", done.revisits_saved)
        replay.dead.clear()
        replay.acks.clear()
        replay.nacks.clear()
        replay.revisits.clear()


class RevisitPopper:
    """Takes the pages due for a revisit from the owned partitions (``BANKER_RECRAWL``).

    Off until the crawl's revisits turn it on (:attr:`enabled`); then every
    :data:`REVISIT_POP_S` it runs ``revisit_pop.lua``, in one pipeline, on
    the owned partitions known to hold revisit states -- those a take found
    some in, and those this node wrote states to
    (:attr:`WorkHints.revisits <scrapy_banker.redis.worker.state.WorkHints.revisits>`)
    -- and on every owned partition each :data:`REVISIT_FULL_SCAN_S` (pages
    other workers wrote to a partition this node took over), so an idle
    fleet does not run a script per partition twice a second.  What was due
    goes to :attr:`WorkerState.revisits_due
    <scrapy_banker.redis.worker.state.WorkerState.revisits_due>` for the
    reactor thread, which queues the revisits like any request.  Each page
    handed out is due again after a hold (the lease TTL, or its interval if
    longer), so one this node dies holding comes due again.
    """

    def __init__(
        self, link: FleetLink, state: WorkerState, *, wall: Callable[[], float],
        on_ready: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self.link = link
        self.state = state
        self.wall = wall
        self.on_ready = on_ready
        #: Set (once) by the reactor thread when the crawl revisits pages.
        self.enabled = False
        self.next_at = 0.0
        #: When the next take asks every owned partition (the clock of :meth:`run_once`).
        self.next_full_at = 0.0
        #: Partitions the last takes found revisit states in.
        self.held: set[int] = set()

    def run_once(self, now: float) -> bool:
        """Take the due pages when it is time; whether any were taken."""
        if not self.enabled or now < self.next_at:
            return False
        self.next_at = now + REVISIT_POP_S
        return self.take(now) > 0

    def take(self, now: float) -> int:
        """Take the due pages of the owned partitions that may hold some (all of them at
        the first take and each :data:`REVISIT_FULL_SCAN_S`); how many."""
        state = self.state
        dead = state.revisits_dead
        if dead:
            letters = [dead.popleft() for _ in range(len(dead))]
            try:
                state.counters.add(
                    "banker/redis/revisits_dead", self.link.frontier.revisits.dead_many(letters)
                )
            except BaseException:
                dead.extendleft(reversed(letters))
                raise
        owned = state.ownership.owned
        written = state.hints.revisits
        full = now >= self.next_full_at
        if full:
            asked = dict(owned)
        else:
            asked = {p: e for p, e in owned.items() if p in self.held or p in written}
        hold_s = self.link.frontier.lease_ttl_ms / 1000
        popped = self.link.frontier.revisits.pop_many(
            self.link.node, asked, self.wall(), hold_s, REVISIT_POP_LIMIT
        )
        if full:  # only once it succeeded: a take Redis refused is tried whole again
            self.next_full_at = now + REVISIT_FULL_SCAN_S
        written.difference_update(asked)
        self.held = (self.held - asked.keys()) | popped.held
        state.revisits_due.extend(popped.due)
        state.revisit_next_due = popped.next_due
        state.counters.add("banker/redis/revisits_due", len(popped.due))
        if popped.due and self.on_ready is not None:
            self.on_ready()
        return len(popped.due)


class TelemetryWriter:
    """SETs the node's latest telemetry sample, with its expiry.

    Telemetry is not work: it is sent after the step's queue operations,
    never retried, and dropped if Redis refuses it (the expiry then tells
    readers the node went quiet).
    """

    def __init__(self, link: FleetLink, state: WorkerState) -> None:
        self.link = link
        self.state = state

    def run_once(self) -> bool:
        # Taken before the call: a write that fails is dropped, not retried
        # (the next interval brings a newer one).
        telemetry = self.state.outbox.take_telemetry()
        if telemetry is None:
            return False
        key, value, px_ms = telemetry
        self.link.frontier.client.set(key, value, px=px_ms)
        return True


class Reaper:
    """Returns expired leases to the queue, once per interval fleet-wide."""

    def __init__(self, link: FleetLink, state: WorkerState, *, interval_s: float) -> None:
        self.link = link
        self.state = state
        self.interval_s = interval_s
        self.next_at = 0.0

    def run_once(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.interval_s
        self.reap()
        return True

    def reap(self) -> None:
        # The lock is held for most of the interval after a round: one round
        # per interval fleet-wide, whoever comes first.
        hold_ms = int(self.interval_s * (REAP_HOLD_FRACTION * 1000))
        reaped = self.link.frontier.reap_all(self.link.node, hold_ms=hold_ms)
        if reaped is not None:
            counters = self.state.counters
            counters.add("banker/redis/reaped", reaped[0])
            counters.add("banker/redis/reaped_dead", reaped[1])
            if reaped[0]:
                self.state.hints.scan_soon()  # requeued work: find it


class TableSync:
    """Follows the partition table and the wake-ups other workers leave for this node."""

    def __init__(self, link: FleetLink, state: WorkerState) -> None:
        self.link = link
        self.state = state
        self.next_at = 0.0

    def run_once(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.sync()
        self.next_at = now + SYNC_INTERVAL_S
        return True

    def sync(self) -> None:
        """Reload the table if it changed; note the partitions other workers woke."""
        registry, ownership = self.link.registry, self.state.ownership
        version, ready = registry.poll(self.link.node)
        if ownership.stale(version):
            ownership.apply(registry.load_table())
        owned = ownership.owned
        self.state.hints.nonempty.update(p for p in ready if p in owned)

    def soon(self) -> None:
        """Sync on the next step (this node was fenced off: the table moved)."""
        self.next_at = 0.0


class Popper:
    """Fills the scheduler's buffer with leases on the partitions this node owns."""

    def __init__(
        self,
        link: FleetLink,
        state: WorkerState,
        sync: TableSync,
        *,
        pop_per_partition: int,
        held_cap: int,
        clock: Callable[[], float],
        on_ready: Callable[[], None] | None,
    ) -> None:
        self.link = link
        self.state = state
        self.sync = sync
        self.pop_per_partition = pop_per_partition
        #: Requests of one partition this node has buffered or downloading
        #: beyond which it does not pop that partition: its host's per-domain
        #: slots and a request ready behind them.  More would only lease work
        #: this node cannot start, which an idle node could.  A request whose
        #: download is over no longer counts, though its lease is held until
        #: its callback's output is queued: parsing and the ack's round trip
        #: must not keep a busy host's slots empty.
        self.held_cap = held_cap
        self.clock = clock
        self.on_ready = on_ready

    def run_once(self) -> int:
        """Pop if the scheduler wants requests and this node owns partitions."""
        if self.state.signals.want > 0 and self.state.ownership.owned:
            return self.pop()
        return 0

    def pop(self) -> int:
        """Lease about what the scheduler wants; how many requests were leased."""
        state = self.state
        ownership, hints, leases = state.ownership, state.hints, state.leases
        signals = state.signals
        owned = ownership.owned
        now = self.clock()
        leases.downloads_done(state.outbox.take_downloaded())
        held, cap, busy_until = leases.downloading, self.held_cap, hints.busy_until
        nonempty = hints.nonempty
        full_scan = now >= hints.next_full_scan
        if not full_scan:
            # Only partitions known to have work: with M >> nodes most owned
            # partitions are empty, and scanning them all each round costs CPU.
            order = [p for p in nonempty if p in owned]
        else:
            # Every owned partition, those with work first, the rest in a
            # rotating order: work queued where nobody told this node is
            # found too.
            hints.next_full_scan = now + FULL_SCAN_INTERVAL_S
            order = [p for p in owned if p in nonempty]
            rest = sorted(p for p in owned if p not in nonempty)
            if rest:
                start = hints.cursor % len(rest)
                order += rest[start:] + rest[:start]
                hints.cursor += SCAN_CURSOR_STEP
        # Ask for about what the scheduler wants, not a few requests of every
        # partition with work: a lease is work no other node can take.
        # Partitions this node already works on come first (their hosts are
        # busy here anyway), then the longest backlogs (the census of the
        # last pops): the long pole's requests are leased before the rest.
        # One it holds enough of is left alone.
        queued = state.queued
        order.sort(key=lambda p: (p not in held, -queued.get(p, 0)))
        counts: dict[int, int] = {}
        total = 0
        for p in order:
            room = cap - len(held.get(p, ()))
            if room > 0 and busy_until.get(p, 0.0) <= now:
                counts[p] = n = min(self.pop_per_partition, room)
                total += n
                if total >= signals.want and not full_scan:
                    break
        if not counts:
            return 0
        got = 0
        counted: dict[int, int] = {}
        candidates = list(counts)
        frontier, node, counters = self.link.frontier, self.link.node, state.counters
        adopted = ownership.adopted
        for i in range(0, len(candidates), POP_CHUNK):
            chunk = {p: owned[p] for p in candidates[i : i + POP_CHUNK]}
            # Partitions new here (or here again under a new epoch): their
            # hosts' states are read after the pop, before their leases go out.
            new = {p for p, e in chunk.items() if adopted.get(p) != e}
            sent = self.clock()
            result = frontier.pop_many(
                chunk, node, self.pop_per_partition, counts=counts, read_hosts=new
            )
            self.adopt(result.hosts, chunk)
            counted.update(result.queued)
            for p in result.empty:
                nonempty.discard(p)
                busy_until.pop(p, None)
            for p in result.busy:
                nonempty.add(p)
                busy_until[p] = now + BUSY_RETRY_S
            if result.busy:
                counters.add("banker/redis/handover_waits", len(result.busy))
            if result.not_owned:
                counters.add("banker/redis/fenced", len(result.not_owned))
                self.sync.soon()  # reload the table now
                ownership.drop(result.not_owned)
            for leased in result.leased:
                nonempty.add(leased.partition)
                leases.add(leased.partition, leased.id)
                state.inbound.append(replace(leased, leased_at=sent, epoch=chunk[leased.partition]))
            got += len(result.leased)
            if got >= signals.want:
                break
        if counted:
            state.queued = {p: n for p, n in {**queued, **counted}.items() if n and p in owned}
        if got:
            signals.drained_since = None
            signals.want = max(0, signals.want - got)
            counters.add("banker/redis/popped", got)
            if self.on_ready is not None:
                self.on_ready()
        return got

    def adopt(self, hosts: Mapping[int, dict[str, str]], epochs: Mapping[int, int]) -> None:
        """Hand the scheduler the hosts' states of partitions popped for the first
        time at their epoch, before their leases (:attr:`WorkerState.adopted
        <scrapy_banker.redis.worker.state.WorkerState.adopted>`).

        Read in the pop's pipeline, after a pop that was not ``BUSY``: every
        lease of an earlier owner was released, after the states it wrote.
        """
        state = self.state
        adopted = state.ownership.adopted
        for p, states in hosts.items():
            adopted[p] = epochs[p]
            state.adopted.append((p, epochs[p], states))
            state.counters.add("banker/redis/host_states_adopted", len(states))


class Membership:
    """This node in the fleet: registration, heartbeats, lease renewals, rebalancing."""

    def __init__(
        self,
        link: FleetLink,
        state: WorkerState,
        *,
        capacity: float,
        interval_s: float,
        placement: PlacementAgent | None,
        clock: Callable[[], float],
    ) -> None:
        self.link = link
        self.state = state
        self.capacity = capacity
        self.interval_s = interval_s
        self.placement = placement
        self.clock = clock
        self.registered = False
        self.next_at = 0.0

    def run_once(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.beat()
        self.next_at = now + self.interval_s
        return True

    def beat(self) -> None:
        """Register or beat, rebalance if the live nodes changed, renew every held lease."""
        registry, node, ownership = self.link.registry, self.link.node, self.state.ownership
        if not self.registered:
            registry.register(node, self.capacity)
            self.registered = True
        else:
            registry.heartbeat(node)
        live = registry.live_nodes()
        if node not in live:  # timed out (e.g. a long Redis outage): join again
            registry.register(node, self.capacity)
            live = registry.live_nodes()
        table = ownership.table
        if table is None or ownership.stale(registry.table_version()):
            table = registry.load_table()
        owners = {o for o in table.owners if o is not None}
        if owners != set(live) or any(o is None for o in table.owners):
            moves = self.rebalance()
            if moves:
                self.state.counters.add("banker/redis/partitions_moved", len(moves))
                if self.placement is not None:
                    self.placement.replan()
            table = registry.load_table()
        ownership.apply(table)
        leases = self.state.leases
        held = leases.renewals()
        if held:
            sent = self.clock()
            self.link.frontier.renew_many(held)
            leases.renewed_at = sent
        if self.placement is not None:
            self._place(self.placement)

    def rebalance(self) -> list[Move] | None:
        """Rebalance for the live nodes, dealing out the work there is now evenly."""
        census = self.link.frontier.census(each=True)
        work = [q + n for q, n in zip(census.queued, census.leased, strict=True)]
        return self.link.registry.rebalance(self.link.node, work=work)

    def leave(self) -> None:
        """Leave the fleet and hand this node's partitions to the others at once."""
        self.link.registry.leave(self.link.node)
        self.rebalance()

    def _place(self, placement: PlacementAgent) -> None:
        try:
            moves = placement.beat(self.link.registry)
        except REDIS_ERRORS:
            raise
        except Exception:  # a planning bug must not stop heartbeats and lease renewals
            logger.exception("Network-aware placement failed; keeping the current table")
            self.state.counters.add("banker/placement/errors")
            return
        if moves:
            self.state.counters.add("banker/placement/moves", len(moves))
            self.state.ownership.apply(self.link.registry.load_table())


class DrainWatch:
    """When the scheduler has room it cannot fill: is the crawl over, or is there work to take?"""

    def __init__(
        self,
        link: FleetLink,
        state: WorkerState,
        *,
        pending: Callable[[], int],
        slots: int,
        steal: bool,
    ) -> None:
        self.link = link
        self.state = state
        #: This node's operations Redis has not confirmed: the crawl is not
        #: over while there are any.
        self.pending = pending
        #: Hosts this node fetches at once (``CONCURRENT_REQUESTS`` over the
        #: per-domain limit): how many partitions it can work on.
        self.slots = max(1, slots)
        self.steal_enabled = steal
        self.next_at = 0.0
        self.next_steal = 0.0
        self.steal_backoff = STEAL_INTERVAL_S

    def run_once(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.check(now)
        return True

    def check(self, now: float) -> None:
        """Count the crawl's work: note when it drained; steal if hungry and it is time."""
        signals, counters = self.state.signals, self.state.counters
        steal = self.steal_enabled and signals.hungry and now >= self.next_steal
        if not steal and self.state.leases.held:
            # This node's own leases are work in Redis: the crawl is not
            # drained, so a census could only say so again.  A hungry node
            # of a busy crawl would otherwise count every partition ten
            # times a second (most of its worker thread's CPU, and Redis's).
            signals.drained_since = None
            self.next_at = now + CENSUS_INTERVAL_S
            return
        census = self.link.frontier.census(each=steal)
        counters.add("banker/redis/drain_checks")
        if census.drained and not self.pending():
            if signals.drained_since is None:
                signals.held_when_drained = self.link.frontier.held()
                signals.drained_since = now
            self.next_at = now + DRAINED_CENSUS_INTERVAL_S
            return
        signals.drained_since = None
        self.next_at = now + CENSUS_INTERVAL_S
        if steal:
            self.steal(census, now)

    def steal(self, census: Census, now: float) -> None:
        """Take over partitions whose work waits for a saturated node, up to this node's slots."""
        state = self.state
        limit = self.slots - len(state.leases.held)
        if limit < 1 or state.ownership.table is None:
            return
        registry, node = self.link.registry, self.link.node
        moves = registry.steal(node, census.queued, census.leased, slots=self.slots, limit=limit)
        if moves is None:  # another node is rewriting the table: soon again
            self.next_steal = now + STEAL_INTERVAL_S
            return
        if moves:
            state.counters.add("banker/redis/steals")
            state.counters.add("banker/redis/partitions_stolen", len(moves))
            logger.debug("Took %d waiting partitions from %s", len(moves),
                         sorted({m.old for m in moves if m.old}))  # fmt: skip
            state.ownership.apply(registry.load_table())
            self.steal_backoff = STEAL_INTERVAL_S
        else:
            self.steal_backoff = min(STEAL_BACKOFF_MAX_S, self.steal_backoff * 2)
        self.next_steal = now + self.steal_backoff
