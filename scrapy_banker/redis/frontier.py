"""Partitioned, leased request queues in Redis (at-least-once delivery).

scrapy-redis pops requests destructively: a worker that dies loses everything
it popped.  Here a pop is a Lua script that moves each request into a *lease*
set scored by the Redis server's clock plus a TTL and counts its deliveries;
the worker acknowledges a request once its response (and the requests it
yielded) are processed, renews its leases with a heartbeat, and any node's
reaper gives expired leases back to the queue -- or, after too many
deliveries, to a dead-letter list with the reason.  Dedup and enqueue are one
script, so a URL is never marked seen without being queued.

A queued request is one entry ``"<id> <payload>"`` in a list per priority
(:meth:`PartitionKeys.level <scrapy_banker.redis.keys.PartitionKeys.level>`);
its id is the partition's sequence number.  Redis packs list entries a few
bytes apart, where a sorted-set entry plus a hash entry cost ~200 bytes more
per request: at a web crawl's frontier size that is most of the memory.
Only a leased request gets per-request entries (its lease, its payload,
its delivery count), which the ack removes.

Every key of a partition shares the hash tag ``{<prefix>:<partition>}`` (see
:mod:`scrapy_banker.redis.keys`), so each script touches one cluster slot and
works on Redis Cluster.  No ``KEYS``/``SCAN``: partitions are addressed by
number.  Every script runs through one
:class:`~scrapy_banker.redis.scripts.ScriptRunner`, in pipelined batches; a
single call is a batch of one.  Payloads are opaque strings here (JSON
requests, see :mod:`scrapy_banker.scheduler.serialize`); nothing is ever unpickled.
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from scrapy_banker.core.bloom import (
    MAX_BLOOM_BITS,
    SHARD_BITS,
    bloom_geometry,
    bloom_hashes,
    bloom_layers,
    bloom_positions,
    bloom_shard,
    bloom_shard_count,
)
from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.redis.keys import Keyspace, PartitionKeys, decode
from scrapy_banker.redis.scripts import Busy, Fenced, Refusal, ScriptCall, ScriptRunner

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

__all__ = [
    "Census",
    "Flushed",
    "Leased",
    "NotOwner",
    "PartitionKeys",
    "PopResult",
    "RedisFrontier",
    "in_bloom",
]

#: Partitions reaped per round trip by :meth:`RedisFrontier.reap_all`.
REAP_CHUNK = 128
#: Partitions counted by one census script on one server (:meth:`RedisFrontier.census`).
CENSUS_CHUNK = 256


class NotOwner(RuntimeError):
    """The partition is owned by another node or epoch: this node is fenced off."""


@dataclass(frozen=True)
class Leased:
    partition: int
    id: str
    payload: str
    deliveries: int
    #: See :attr:`LeaseToken.leased_at` and :attr:`LeaseToken.epoch`.
    leased_at: float = field(default=0.0, compare=False)
    epoch: int = field(default=0, compare=False)

    @property
    def token(self) -> LeaseToken:
        return LeaseToken(self.partition, self.id, self.deliveries, self.leased_at, self.epoch)


@dataclass
class PopResult:
    """What one pipelined pop over many partitions found."""

    leased: list[Leased]
    #: Partitions this node was fenced off from (another node or epoch owns them).
    not_owned: list[int]
    #: Partitions handed over to this node whose previous owner still has
    #: requests in flight: popping waits until they are acked or expire.
    busy: list[int]
    #: Partitions that had nothing queued.
    empty: list[int]


@dataclass
class Flushed:
    """What one :meth:`RedisFrontier.flush` did."""

    #: Per enqueue, in order: the new request's id, or None (a duplicate).
    enqueued: list[str | None]
    dead_lettered: int
    acked: int
    nacked: int


@dataclass(frozen=True)
class Census:
    """Work left in the crawl, from one :meth:`RedisFrontier.census`."""

    #: :attr:`Keyspace.finished <scrapy_banker.redis.keys.Keyspace.finished>`
    #: read before and after counting the partitions.
    before: int
    after: int
    #: Queued + leased requests found; with ``each=False`` counting stops at
    #: the first partition with work, so only ``work == 0`` is exact.
    work: int
    #: Per partition (``each=True`` only; else empty).
    queued: list[int]
    leased: list[int]

    @property
    def drained(self) -> bool:
        """Nothing queued or leased anywhere, and nothing finished while counting.

        Each partition is counted atomically; work moves from one partition
        to another only by a request's children being queued before the
        request is acked, and every ack batch bumps the version first --
        after its children were queued.  So if work moved from a partition
        not counted yet to one already counted, the version changed in
        between; if it did not, the crawl really was empty.
        """
        return self.work == 0 and self.before == self.after


class RedisFrontier:
    """The queue operations of one crawl's frontier, on a redis-py client."""

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        prefix: str = "banker",
        partitions: int = 1024,
        lease_ttl_ms: int = 60_000,
        max_deliveries: int = 3,
        dedup: str = "set",
        dedup_capacity: int = 100_000_000,
        dedup_error: float = 0.001,
        bloom_shard_bits: int = SHARD_BITS,
    ) -> None:
        self.keyspace = Keyspace(prefix, partitions)
        if dedup not in ("set", "bloom"):
            raise ValueError(f"dedup must be 'set' or 'bloom', got {dedup!r}")
        #: ``set`` or ``bloom`` (BANKER_DEDUP).
        self.dedup = dedup
        self.dedup_capacity = int(dedup_capacity)
        #: URLs each partition's Bloom filter is sized for (Redis Cluster), and the target error.
        self.bloom_capacity = -(-self.dedup_capacity // partitions)
        self.bloom_error = float(dedup_error)
        #: The bit-array geometry (m, k), used when the server has no ``BF.*``.
        self.bloom_bits, self.bloom_k = bloom_geometry(self.bloom_capacity, dedup_error)
        if self.bloom_bits > MAX_BLOOM_BITS:
            raise ValueError(
                f"a Bloom filter of {self.bloom_capacity} URLs at {dedup_error} needs "
                f"{self.bloom_bits} bits, more than a Redis string holds: use more partitions"
            )
        self._native_bloom: bool | None = None
        #: Shards of the crawl-wide filter, and each one's sizing (one server).
        self._shards: int | None = None
        self._shard_capacity = 0
        self._shard_geometry = (0, 0)
        self._shard_bits = bloom_shard_bits
        for name, value, low in (
            ("lease_ttl_ms", lease_ttl_ms, 1),
            ("max_deliveries", max_deliveries, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self.client = client
        self.prefix = prefix
        self.partitions = partitions
        self.lease_ttl_ms = lease_ttl_ms
        self.max_deliveries = max_deliveries
        self.scripts = ScriptRunner(client)
        #: A cluster pipeline runs each node's commands in parallel: what must
        #: happen in order is sent one round trip per step there.
        self.cluster = hasattr(client, "get_nodes")
        # Every partition's (meta, leases) keys, for census scans.
        self._count_keys: list[tuple[str, str]] | None = None

    def keys(self, partition: int) -> PartitionKeys:
        return self.keyspace.partition(partition)

    # -- producing ----------------------------------------------------------------

    def enqueue(
        self,
        partition: int,
        fingerprint: str,
        payload: str,
        priority: int = 0,
        dont_filter: bool = False,
    ) -> str | None:
        """Queue a request unless its fingerprint was seen; returns its id or None."""
        op = EnqueueOp(partition, fingerprint, payload, priority, dont_filter)
        return self.enqueue_many([op])[0]

    def enqueue_many(self, ops: Iterable[EnqueueOp]) -> list[str | None]:
        """Pipelined :meth:`enqueue`: one round trip for the batch."""
        calls = [self._enqueue_call(op) for op in ops]
        return [None if r is None else decode(r) for r in self.scripts.values("enqueue", calls)]

    def native_bloom(self) -> bool:
        """Whether the server has RedisBloom's ``BF.*`` commands; asked once, then remembered.

        Native filters scale (a full one gets a larger layer) and are written
        in C; the Lua bit array is the fallback every Redis >= 6.2 runs.  A
        fleet shares one server, so every worker makes the same choice.
        """
        if self._native_bloom is None:
            # BF.EXISTS on one of our keys, from a script: redis-py can neither
            # parse ``COMMAND INFO`` of an unknown command nor route one on a
            # cluster.  -1: unknown command; a bit array there (-2) means
            # the module is loaded but this crawl was started without it.
            key, _ = self.bloom_keys(0, "0" * 40)
            (answer,) = self.scripts.values("bloom_probe", [ScriptCall([key], ["probe"])])
            self._native_bloom = int(answer) >= 0
            logger.info(
                "BANKER_DEDUP=bloom: %s", "native BF.* filters" if self._native_bloom
                else "Lua bit arrays (the server has no BF.* commands)",
            )  # fmt: skip
        return self._native_bloom

    def bloom_shards(self) -> int:
        """Shards of the crawl-wide Bloom filter; 0 on Redis Cluster (a filter per partition).

        The first worker of a crawl writes the count (``SET NX``) from its
        settings; every worker then reads it, so a worker started with other
        settings keeps reading the same bits.
        """
        if self._shards is None:
            if self.cluster:
                self._shards = 0
            else:
                key = self.keyspace.bloom_shards
                wanted = bloom_shard_count(self.dedup_capacity, self.bloom_error, self._shard_bits)
                self.client.set(key, wanted, nx=True)
                self._shards = int(self.client.get(key) or wanted)
                share = -(-self.dedup_capacity // self._shards)
                # Fingerprints spread over shards binomially: four standard
                # deviations of headroom keep a shard of a crawl that reaches
                # its capacity from growing a layer (twice the bits) for a
                # few URLs over its share (+0.06 % at 5*10^7 URLs a shard).
                headroom = math.ceil(4 * math.sqrt(share)) if self._shards > 1 else 0
                self._shard_capacity = share + headroom
                self._shard_geometry = bloom_geometry(self._shard_capacity, self.bloom_error)
        return self._shards

    def bloom_keys(self, partition: int, fingerprint: str) -> tuple[str, str]:
        """The filter that holds ``fingerprint``, and the hash with its bit array's geometry."""
        shards = self.bloom_shards()
        if not shards:
            k = self.keys(partition)
            return k.bloom, k.meta
        shard = bloom_shard(fingerprint, shards)
        return self.keyspace.bloom_shard(shard), self.keyspace.bloom_shard_meta(shard)

    def _dedup_args(self, fingerprint: str) -> list[str | int]:
        """The enqueue script's dedup arguments (ARGV 5..) for this frontier's mode."""
        if self.dedup == "set":
            return ["set"]
        sharded = bool(self.bloom_shards())
        capacity = self._shard_capacity if sharded else self.bloom_capacity
        if self.native_bloom():
            return ["bf", capacity, repr(self.bloom_error)]
        bits, k = self._shard_geometry if sharded else (self.bloom_bits, self.bloom_k)
        h1, h2 = bloom_hashes(fingerprint)
        return ["lua", bits, k, h1, h2, capacity]

    def _enqueue_call(self, op: EnqueueOp) -> ScriptCall:
        k = self.keys(op.partition)
        if self.dedup == "set":
            bloom, geometry = k.bloom, k.meta
        else:
            bloom, geometry = self.bloom_keys(op.partition, op.fingerprint)
        return ScriptCall(
            [k.levels, k.seen, k.payloads, k.meta, bloom, geometry],
            [op.fingerprint, op.payload, int(op.priority), "1" if op.dont_filter else "0",
             *self._dedup_args(op.fingerprint)],
        )  # fmt: skip

    def flush(
        self,
        enqueues: Sequence[EnqueueOp] = (),
        dead: Sequence[tuple[LeaseToken, str]] = (),
        acks: Mapping[int, Sequence[str]] | None = None,
        nacks: Mapping[int, Sequence[str]] | None = None,
        starts: Mapping[int, Sequence[str]] | None = None,
    ) -> Flushed:
        """A worker's queued operations, in the order the crawl's guarantees need.

        Enqueues first (a callback's children), then -- when anything
        finishes -- the :attr:`~scrapy_banker.redis.keys.Keyspace.finished`
        bump, dead letters, acks (``partition -> refs``) and nacks.  So a
        parent's ack never lands before its children, and a drain check
        (:meth:`census`) that missed the children sees the version move.  One
        pipeline, one round trip on a single server, whose commands run in
        the order sent; on a cluster one round trip per step.  ``starts``
        (``partition -> refs`` of deliveries whose fetch began, see
        :meth:`start_many`) go first: they only mark leases.
        """
        calls: list[tuple[str, ScriptCall]] = [
            ("start", ScriptCall([self.keys(p).meta], list(refs)))
            for p, refs in (starts or {}).items()
            if refs
        ]
        calls += [("enqueue", self._enqueue_call(op)) for op in enqueues]
        steps = [len(calls)]
        acks = {p: ids for p, ids in (acks or {}).items() if ids}
        nacks = {p: ids for p, ids in (nacks or {}).items() if ids}
        if dead or acks:
            calls.append(("bump", ScriptCall([self.keyspace.finished], [])))
            steps.append(len(calls))
        for token, reason in dead:
            k = self.keys(token.partition)
            calls.append(("deadletter", ScriptCall(
                [k.leases, k.payloads, k.meta, k.dead], [token.id, reason, token.partition]
            )))  # fmt: skip
        for p, ids in acks.items():
            k = self.keys(p)
            calls.append(("ack", ScriptCall([k.leases, k.payloads, k.meta], list(ids))))
        for p, ids in nacks.items():
            k = self.keys(p)
            calls.append(("nack", ScriptCall([k.levels, k.leases, k.meta, k.payloads], list(ids))))
        if self.cluster:
            answers: list[Any] = []
            for start, end in zip([0, *steps], [*steps, len(calls)], strict=True):
                answers += self.scripts.run_batch(calls[start:end])
        else:
            answers = self.scripts.run_batch(calls)
        for answer in answers:
            if isinstance(answer, Refusal):
                raise redis.ResponseError(answer.reply)
        out = Flushed([], 0, 0, 0)
        for (name, _), answer in zip(calls, answers, strict=True):
            if name == "enqueue":
                out.enqueued.append(None if answer is None else decode(answer))
            elif name == "deadletter":
                out.dead_lettered += int(answer)
            elif name == "ack":
                out.acked += int(answer)
            elif name == "nack":
                out.nacked += int(answer)
        return out

    # -- ownership ------------------------------------------------------------------

    def set_owner(self, partition: int, node: str, epoch: int) -> None:
        self.client.set(self.keys(partition).owner, f"{node}@{epoch}")

    def owner(self, partition: int) -> str | None:
        value = self.client.get(self.keys(partition).owner)
        return None if value is None else decode(value)

    # -- consuming --------------------------------------------------------------------

    def pop(self, partition: int, node: str, epoch: int, count: int = 1) -> list[Leased]:
        """Lease up to ``count`` requests of a partition this node owns at ``epoch``."""
        (answer,) = self._pop({partition: epoch}, node, count)
        if isinstance(answer, Fenced):
            raise NotOwner(f"partition {partition} is not owned by {node}@{epoch} ({answer.reply})")
        if isinstance(answer, Busy):
            return []  # the previous owner's requests are still in flight
        return _leased(partition, answer)

    def pop_many(
        self,
        owned: Mapping[int, int],
        node: str,
        count_per_partition: int = 1,
        *,
        counts: Mapping[int, int] | None = None,
    ) -> PopResult:
        """:meth:`pop` on many partitions in one round trip; ``owned``: partition -> epoch.

        ``counts`` (partition -> how many) overrides ``count_per_partition``.
        """
        result = PopResult([], [], [], [])
        answers = self._pop(owned, node, count_per_partition, counts)
        for p, answer in zip(owned, answers, strict=True):
            if isinstance(answer, Fenced):
                result.not_owned.append(p)
            elif isinstance(answer, Busy):
                result.busy.append(p)
            elif answer:
                result.leased.extend(_leased(p, answer))
            else:
                result.empty.append(p)
        return result

    def _pop(
        self,
        owned: Mapping[int, int],
        node: str,
        count: int,
        counts: Mapping[int, int] | None = None,
    ) -> list[Any]:
        calls = []
        for p, epoch in owned.items():
            k = self.keys(p)
            n = count if counts is None else counts.get(p, count)
            calls.append(ScriptCall(
                [k.levels, k.leases, k.payloads, k.meta, k.owner],
                [node, int(epoch), self.lease_ttl_ms, int(n)],
            ))  # fmt: skip
        return self.scripts.run("pop", calls)

    def ack(self, partition: int, ids: Sequence[str]) -> int:
        """Forget processed requests; ids, or ``id#delivery`` (:attr:`LeaseToken.ref`)."""
        return self.ack_many({partition: ids})

    def ack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        """Pipelined :meth:`ack`: partition -> ids."""
        return self._per_partition("ack", ids, lambda k: [k.leases, k.payloads, k.meta], [])

    def nack(self, partition: int, ids: Sequence[str]) -> int:
        """Give leased requests back unprocessed; the delivery does not count."""
        return self.nack_many({partition: ids})

    def nack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        return self._per_partition(
            "nack", ids, lambda k: [k.levels, k.leases, k.meta, k.payloads], []
        )

    def start_many(self, refs: Mapping[int, Sequence[str]]) -> int:
        """Mark deliveries whose fetch began (``partition -> id#delivery refs``).

        Only such a delivery counts towards :attr:`max_deliveries` when its
        lease expires: a request that sat in the buffer of a worker that died
        or froze goes back to the queue with no mark against it, so a run of
        faults cannot dead-letter a request that was never fetched.  A
        request that kills its worker as it is fetched still reaches the dead
        letters -- if the mark left the worker first (its thread sends it
        within milliseconds).
        """
        return self._per_partition("start", refs, lambda k: [k.meta], [])

    def renew(self, partition: int, ids: Sequence[str]) -> int:
        return self.renew_many({partition: ids})

    def renew_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        return self._per_partition("renew", ids, lambda k: [k.leases], [self.lease_ttl_ms])

    def _per_partition(
        self,
        name: str,
        ids: Mapping[int, Sequence[str]],
        keys_of: Callable[[PartitionKeys], list[str]],
        head: list[str | int],
    ) -> int:
        calls = [
            ScriptCall(keys_of(self.keys(p)), [*head, *batch]) for p, batch in ids.items() if batch
        ]
        return sum(int(answer) for answer in self.scripts.values(name, calls))

    def outstanding(self, *, any_: bool = False, chunk: int = 128) -> int:
        """Requests queued or leased in the whole crawl: 0 means the crawl is done.

        Two reads per partition (:meth:`_count_into`), ``chunk`` partitions per pipeline (no
        ``SCAN``); called only by idle workers, to decide whether the crawl is
        over.  With ``any_`` the count stops at the first non-empty chunk, in
        a random chunk order: an idle worker of a busy fleet asks this twice a
        second and needs a yes/no, not 2,048 answers.
        """
        size = max(1, chunk)
        starts = list(range(0, self.partitions, size))
        if any_:
            random.shuffle(starts)
        total = 0
        for start in starts:
            pipe = self.client.pipeline(transaction=False)
            for p in range(start, min(self.partitions, start + size)):
                _count_into(pipe, self.keys(p))
            total += sum(int(n or 0) for n in pipe.execute())
            if any_ and total:
                break
        return total

    def census(
        self,
        *,
        each: bool = False,
        chunk: int = CENSUS_CHUNK,
        between: Callable[[int], object] | None = None,
    ) -> Census:
        """Count the work left in every partition, between two readings of the version.

        ``Census.drained`` is exact (see there); called by idle workers to
        decide whether the crawl is over, and with ``each`` by hungry ones
        to see which partitions wait.  Each partition's queue and leases are counted
        in one script; on one server a script counts ``chunk`` partitions
        (one round trip for all), on a cluster one partition (its slot).
        ``between`` is called with each chunk's index after it was counted
        (the chunks then go one round trip each): a test can move work in
        the middle of a scan.
        """
        if self._count_keys is None:
            self._count_keys = [(k.meta, k.leases) for k in map(self.keys, range(self.partitions))]
        size = 1 if self.cluster else max(1, chunk)
        calls = []
        for start in range(0, self.partitions, size):
            keys = [key for pair in self._count_keys[start : start + size] for key in pair]
            calls.append(("count", ScriptCall(keys, ["each" if each else "sum"])))
        before = self.finished_version()
        if between is None:
            answers = self.scripts.run_batch(calls)
        else:
            answers = []
            for i, call in enumerate(calls):
                answers += self.scripts.run_batch([call])
                between(i)
        after = self.finished_version()
        queued: list[int] = []
        leased: list[int] = []
        work = 0
        for answer in answers:
            if isinstance(answer, Refusal):
                raise redis.ResponseError(answer.reply)
            if each:
                counts = [int(n) for n in answer]
                queued += counts[0::2]
                leased += counts[1::2]
                work += sum(counts)
            else:
                work += int(answer)
        return Census(before, after, work, queued, leased)

    def finished_version(self) -> int:
        """The crawl's :attr:`~scrapy_banker.redis.keys.Keyspace.finished` counter."""
        return int(self.client.get(self.keyspace.finished) or 0)

    def backlog(self, partitions: Iterable[int], *, chunk: int = 128) -> dict[int, int]:
        """Requests queued or leased per partition: the work each would take with it.

        The placement planner weighs partitions by it (:meth:`_count_into`,
        ``chunk`` partitions per pipeline).
        """
        wanted = sorted({p for p in partitions if 0 <= p < self.partitions})
        out: dict[int, int] = {}
        for start in range(0, len(wanted), max(1, chunk)):
            part = wanted[start : start + max(1, chunk)]
            pipe = self.client.pipeline(transaction=False)
            for p in part:
                _count_into(pipe, self.keys(p))
            counts = pipe.execute()
            for i, p in enumerate(part):
                out[p] = sum(int(n or 0) for n in counts[2 * i : 2 * i + 2])
        return out

    def clear(self) -> int:
        """Delete every key of this crawl (all partitions): a fresh start.

        What goes and what stays (the fleet's network measurements) is
        :meth:`Keyspace.cleared <scrapy_banker.redis.keys.Keyspace.cleared>`;
        returns how many keys existed.
        """
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.zrange(self.keys(p).levels, 0, -1)
        lists = [
            self.keys(p).level(decode(level))
            for p, levels in enumerate(pipe.execute())
            for level in levels
        ]
        shards = 0 if self.cluster else int(self.client.get(self.keyspace.bloom_shards) or 0)
        for shard in range(shards):
            lists += [self.keyspace.bloom_shard(shard), self.keyspace.bloom_shard_meta(shard)]
        self._shards = None  # a fresh crawl sizes its filter again
        pipe = self.client.pipeline(transaction=False)
        for key in [*lists, *self.keyspace.cleared()]:
            pipe.delete(key)
        return sum(int(n) for n in pipe.execute())

    def _reap_call(self, partition: int, limit: int) -> ScriptCall:
        k = self.keys(partition)
        keys = [k.levels, k.leases, k.payloads, k.meta, k.dead]
        return ScriptCall(keys, [self.max_deliveries, int(limit), partition])

    def _reaped(self, partition: int, answer: Any) -> tuple[int, int]:
        requeued, dead = int(answer[0]), int(answer[1])
        if dead:
            logger.warning(
                "Dead-lettered %d requests of partition %d after %d deliveries",
                dead, partition, self.max_deliveries,
            )  # fmt: skip
        return requeued, dead

    def reap(self, partition: int, limit: int = 1000) -> tuple[int, int]:
        """Expired leases: back to the queue, or dead-lettered; returns (requeued, dead)."""
        (answer,) = self.scripts.values("reap", [self._reap_call(partition, limit)])
        return self._reaped(partition, answer)

    def reap_all(
        self, node: str, lock_ttl_ms: int = 10_000, chunk: int = REAP_CHUNK, hold_ms: int = 0
    ) -> tuple[int, int] | None:
        """Reap every partition, single-flight across the cluster; None if another node is.

        ``chunk`` partitions per round trip: one ``EVALSHA`` per partition sent
        one at a time cost an idle worker of a 1024-partition crawl ~1,000
        round trips every reap interval, most of them on empty lease sets.

        ``hold_ms``: keep the lock that long after a finished round instead of
        releasing it, so the fleet reaps once per interval rather than once
        per worker per interval (the fleet-size model measured the reaper at
        a third of Redis's CPU for 100 workers when every worker's round ran).
        """
        lock = self.keyspace.reaper_lock
        if not self.client.set(lock, node, nx=True, px=lock_ttl_ms):
            return None
        requeued = dead = 0
        try:
            # A reaper round may dead-letter: it finishes requests like an ack.
            self.scripts.values("bump", [ScriptCall([self.keyspace.finished], [])])
            for start in range(0, self.partitions, max(1, chunk)):
                parts = range(start, min(self.partitions, start + max(1, chunk)))
                calls = [self._reap_call(partition, 1000) for partition in parts]
                answers = self.scripts.values("reap", calls)
                for partition, answer in zip(parts, answers, strict=True):
                    r, d = self._reaped(partition, answer)
                    requeued += r
                    dead += d
        except BaseException:
            self._release(lock, node)
            raise
        if hold_ms > 0:
            # Only our own lock (it may have expired and been taken meanwhile).
            if decode(self.client.get(lock) or b"") == node:
                self.client.pexpire(lock, hold_ms)
        else:
            self._release(lock, node)
        return requeued, dead

    def _release(self, lock: str, node: str) -> None:
        # Release only our own lock (it may have expired and been taken).
        if decode(self.client.get(lock) or b"") == node:
            self.client.delete(lock)

    def dead_letter(self, partition: int, request_id: str, reason: str) -> None:
        """Move a leased request to the dead-letter list now (e.g. a malformed payload)."""
        k = self.keys(partition)
        keys = [k.leases, k.payloads, k.meta, k.dead]
        self.scripts.values("deadletter", [ScriptCall(keys, [request_id, reason, partition])])

    def dead_letters(self, partition: int) -> list[dict[str, Any]]:
        """The partition's dead letters; a binary payload comes back lossily decoded."""
        out: list[dict[str, Any]] = []
        for raw in self.client.lrange(self.keys(partition).dead, 0, -1):
            text = decode(raw, lossy=True)
            try:
                out.append(json.loads(text))
            except ValueError:
                out.append({"raw": text, "reason": "unreadable dead letter"})
        return out

    def requeue_dead(self, partition: int, letter: str, priority: int = 0) -> str | None:
        """Queue one dead letter again; its new id, or None if it is gone or has no payload.

        ``letter`` is the list entry exactly as stored (what
        :meth:`dead_letters` decodes): the script removes that entry and
        queues its payload in one step, so a letter is never lost nor queued
        twice.  Only the operator's ``scrapy banker deadletters --requeue``
        calls this; follow it with :meth:`bump_finished`.
        """
        k = self.keys(partition)
        (answer,) = self.scripts.values(
            "requeue", [ScriptCall([k.dead, k.levels, k.meta], [letter, int(priority)])]
        )  # fmt: skip
        return None if answer is None else decode(answer)

    def bump_finished(self) -> int:
        """Move the crawl's ``finished`` version, as a batch that changed the work does."""
        (answer,) = self.scripts.values("bump", [ScriptCall([self.keyspace.finished], [])])
        return int(answer)

    # -- inspection -------------------------------------------------------------------

    def queued(self, partition: int) -> int:
        pipe = self.client.pipeline(transaction=False)
        _count_into(pipe, self.keys(partition), leased=False)
        return sum(int(n or 0) for n in pipe.execute())

    def leased(self, partition: int) -> int:
        return int(self.client.zcard(self.keys(partition).leases))


def in_bloom(
    client: redis.Redis | RedisCluster, keyspace: Keyspace, partition: int, fingerprint: str
) -> bool:
    """Whether the crawl's Bloom filter (native or bit array) says it holds ``fingerprint``.

    For the operator's ``explain``: it reads whichever filter the crawl
    wrote -- a crawl-wide sharded one (one server) or the partition's
    (Redis Cluster), native or a bit array (the key's type tells), its
    geometry from where the enqueue script keeps it -- so it needs no
    settings.  A crawl without a filter holds nothing.
    """
    shards = int(client.get(keyspace.bloom_shards) or 0)
    if shards:
        shard = bloom_shard(fingerprint, shards)
        key, geometry_key = keyspace.bloom_shard(shard), keyspace.bloom_shard_meta(shard)
    else:
        keys = keyspace.partition(partition)
        key, geometry_key = keys.bloom, keys.meta
    kind = decode(client.type(key))
    if kind == "none":
        return False
    if kind == "string":
        geometry, layers = client.hmget(geometry_key, ["bf", "bfl"])
        if geometry is None:
            return False
        bits, hashes = (int(x) for x in decode(geometry).split(":"))
        for offset, size, k in bloom_layers(bits, hashes, int(layers or 1)):
            pipe = client.pipeline(transaction=False)
            for position in bloom_positions(fingerprint, size, k):
                pipe.getbit(key, offset + position)
            if all(int(bit) for bit in pipe.execute()):
                return True
        return False
    (answer,) = ScriptRunner(client).values("bloom_probe", [ScriptCall([key], [fingerprint])])
    return int(answer) == 1


def _count_into(pipe: Any, keys: PartitionKeys, *, leased: bool = True) -> None:
    """Queue on ``pipe`` the reads that add up to a partition's work (``int(x or 0)`` each).

    The level lists are counted by the meta's ``n`` (what the scripts keep
    in step), the leases by their sorted set's size.
    """
    pipe.hget(keys.meta, "n")
    if leased:
        pipe.zcard(keys.leases)


def _leased(partition: int, flat: Sequence[Any]) -> list[Leased]:
    # A payload that is not UTF-8 (garbage, a planted pickle) must not crash
    # the worker here: decoded lossily, the codec refuses it and the caller
    # dead-letters it.
    return [
        Leased(partition, decode(flat[i]), decode(flat[i + 1], lossy=True), int(flat[i + 2]))
        for i in range(0, len(flat), 3)
    ]
