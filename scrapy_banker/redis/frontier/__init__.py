"""Partitioned, leased request queues in Redis (at-least-once delivery).

:class:`RedisFrontier` is one crawl's frontier on a redis-py client, composed
of parts by concern, each in its own module:

* :class:`~scrapy_banker.redis.frontier.enqueue.Enqueuer` -- a request is
  queued unless the crawl's seen set (a set or a Bloom filter) holds it, in
  one script, so a URL is never marked seen without being queued;
* :class:`~scrapy_banker.redis.frontier.leases.Leases` -- pops lease
  requests until they are acked, nacked or expire; a partition is popped
  only by its owner at its epoch;
* :class:`~scrapy_banker.redis.frontier.reaper.LeaseReaper` -- expired
  leases back to the queue, or to the dead letters after too many deliveries;
* :class:`~scrapy_banker.redis.frontier.census.WorkCensus` -- the work left,
  per partition or crawl-wide, and whether the crawl is over;
* :class:`~scrapy_banker.redis.frontier.dead_letters.DeadLetters` -- what the
  crawl gave up on, with the reason;
* :class:`~scrapy_banker.redis.frontier.hosts.HostStates` -- each host's
  politeness state, kept with its partition so that it moves with the host;
* :class:`~scrapy_banker.redis.frontier.revisit_states.RevisitStates` -- each
  page's revisit state and due time (``BANKER_RECRAWL``), kept the same way.

They share one :class:`~scrapy_banker.redis.frontier.link.FrontierLink`: the
key names of one :class:`~scrapy_banker.redis.keys.Keyspace` and one
:class:`~scrapy_banker.redis.scripts.ScriptRunner`, which runs every Lua
script in pipelined batches (a single call is a batch of one).  The facade
keeps the operations callers use by name and adds the two that span parts:
:meth:`RedisFrontier.flush` (a worker's queued operations in the order the
crawl's guarantees need) and :meth:`RedisFrontier.clear`.

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
number.  Payloads are opaque strings here (JSON requests, see
:mod:`scrapy_banker.scheduler.serialize`); nothing is ever unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from scrapy_banker.core.bloom import SHARD_BITS
from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.redis.frontier.census import CENSUS_CHUNK, WorkCensus, finished_bump
from scrapy_banker.redis.frontier.dead_letters import DeadLetters
from scrapy_banker.redis.frontier.enqueue import Enqueuer
from scrapy_banker.redis.frontier.hosts import HostStates
from scrapy_banker.redis.frontier.leases import Leases
from scrapy_banker.redis.frontier.link import FrontierLink
from scrapy_banker.redis.frontier.reaper import REAP_CHUNK, REAP_LIMIT, LeaseReaper
from scrapy_banker.redis.frontier.revisit_states import RevisitStates
from scrapy_banker.redis.keys import Keyspace, PartitionKeys, decode
from scrapy_banker.redis.scripts import Refusal, ScriptCall

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

    from redis.cluster import RedisCluster

    from scrapy_banker.core.ops import LeaseToken, RevisitWrite
    from scrapy_banker.redis.frontier.census import Census
    from scrapy_banker.redis.frontier.hosts import HostWrite
    from scrapy_banker.redis.frontier.leases import Leased, PopResult

__all__ = ["Flushed", "RedisFrontier"]


@dataclass
class Flushed:
    """What one :meth:`RedisFrontier.flush` did."""

    #: Per enqueue, in order: the new request's id, or None (a duplicate).
    enqueued: list[str | None]
    dead_lettered: int
    acked: int
    nacked: int
    #: Host states written (fields set or deleted), and writes refused
    #: because the node no longer owns the partition nor holds leases there.
    host_states: int = 0
    host_states_fenced: int = 0
    #: Revisit states written (older ones than Redis kept change nothing).
    revisits_saved: int = 0


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
        self.link = link = FrontierLink.of(client, self.keyspace)
        #: Queueing and the seen sets (``BANKER_DEDUP``).
        self.enqueuer = Enqueuer(
            link, dedup=dedup, capacity=dedup_capacity, error=dedup_error,
            shard_bits=bloom_shard_bits,
        )  # fmt: skip
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
        self.scripts = link.scripts
        self.cluster = link.cluster
        self.leases = Leases(link, lease_ttl_ms)
        self.reaper = LeaseReaper(link, max_deliveries)
        self.work = WorkCensus(link)
        self.deadletters = DeadLetters(link)
        self.hosts = HostStates(link)
        self.revisits = RevisitStates(link)

    def keys(self, partition: int) -> PartitionKeys:
        return self.keyspace.partition(partition)

    # -- what spans the parts ----------------------------------------------------------

    def flush(
        self,
        enqueues: Sequence[EnqueueOp] = (),
        dead: Sequence[tuple[LeaseToken, str]] = (),
        acks: Mapping[int, Sequence[str]] | None = None,
        nacks: Mapping[int, Sequence[str]] | None = None,
        starts: Mapping[int, Sequence[str]] | None = None,
        hosts: Sequence[HostWrite] = (),
        node: str = "",
        revisits: Sequence[RevisitWrite] = (),
    ) -> Flushed:
        """A worker's queued operations, in the order the crawl's guarantees need.

        Enqueues first (a callback's children) with the host states ``node``
        writes (:class:`~scrapy_banker.redis.frontier.hosts.HostStates`: a
        new owner waits for the acks below before it reads them), then -- when anything
        finishes -- the :attr:`~scrapy_banker.redis.keys.Keyspace.finished`
        bump, dead letters, acks (``partition -> refs``) and nacks.  So a
        parent's ack never lands before its children, and a drain check
        (:meth:`census`) that missed the children sees the version move.  One
        pipeline, one round trip on a single server, whose commands run in
        the order sent; on a cluster one round trip per step.  ``starts``
        (``partition -> refs`` of deliveries whose fetch began, see
        :meth:`start_many`) go first: they only mark leases.  Pages' revisit
        states (:mod:`~scrapy_banker.redis.frontier.revisit_states`) go with the
        enqueues: the ack of the fetch that made one never lands before it.
        """
        leases = self.leases
        calls: list[tuple[str, ScriptCall]] = [
            ("start", call) for call in leases.calls("start", starts or {})
        ]
        calls += [("enqueue", self.enqueuer.call(op)) for op in enqueues]
        calls += [("hosts", self.hosts.call(node, w)) for w in hosts if w.states]
        calls += [("revisit_save", self.revisits.call(w)) for w in revisits]
        steps = [len(calls)]
        acks = {p: ids for p, ids in (acks or {}).items() if ids}
        nacks = {p: ids for p, ids in (nacks or {}).items() if ids}
        if dead or acks:
            calls.append(("bump", finished_bump(self.keyspace)))
            steps.append(len(calls))
        calls += [("deadletter", self.deadletters.call(token, why)) for token, why in dead]
        calls += [("ack", call) for call in leases.calls("ack", acks)]
        calls += [("nack", call) for call in leases.calls("nack", nacks)]
        if self.cluster:
            answers: list[Any] = []
            for start, end in zip([0, *steps], [*steps, len(calls)], strict=True):
                answers += self.scripts.run_batch(calls[start:end])
        else:
            answers = self.scripts.run_batch(calls)
        for (name, _), answer in zip(calls, answers, strict=True):
            if isinstance(answer, Refusal) and name != "hosts":
                raise redis.ResponseError(answer.reply)
        out = Flushed([], 0, 0, 0)
        for (name, _), answer in zip(calls, answers, strict=True):
            if name == "hosts":
                if isinstance(answer, Refusal):
                    out.host_states_fenced += 1
                else:
                    out.host_states += int(answer)
            elif name == "enqueue":
                out.enqueued.append(None if answer is None else decode(answer))
            elif name == "deadletter":
                out.dead_lettered += int(answer)
            elif name == "ack":
                out.acked += int(answer)
            elif name == "nack":
                out.nacked += int(answer)
            elif name == "revisit_save":
                out.revisits_saved += int(answer)
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
        lists += self.enqueuer.shard_keys()
        self.enqueuer.reset()  # a fresh crawl sizes its filter again
        pipe = self.client.pipeline(transaction=False)
        for key in [*lists, *self.keyspace.cleared()]:
            pipe.delete(key)
        return sum(int(n) for n in pipe.execute())

    # -- the parts' operations, by name ---------------------------------------------------

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
        return self.enqueuer.enqueue_many([op])[0]

    def enqueue_many(self, ops: Iterable[EnqueueOp]) -> list[str | None]:
        """Pipelined :meth:`enqueue`: one round trip for the batch."""
        return self.enqueuer.enqueue_many(ops)

    def set_owner(self, partition: int, node: str, epoch: int) -> None:
        self.leases.set_owner(partition, node, epoch)

    def owner(self, partition: int) -> str | None:
        return self.leases.owner(partition)

    def pop(self, partition: int, node: str, epoch: int, count: int = 1) -> list[Leased]:
        """Lease up to ``count`` requests of a partition this node owns at ``epoch``."""
        return self.leases.pop(partition, node, epoch, count)

    def pop_many(
        self,
        owned: Mapping[int, int],
        node: str,
        count_per_partition: int = 1,
        *,
        counts: Mapping[int, int] | None = None,
        read_hosts: Collection[int] = (),
    ) -> PopResult:
        """:meth:`pop` on many partitions in one round trip; ``owned``: partition -> epoch.

        See :meth:`Leases.pop_many <scrapy_banker.redis.frontier.leases.Leases.pop_many>`
        (``read_hosts``: partitions whose hosts' states to read after the pop).
        """
        return self.leases.pop_many(
            owned, node, count_per_partition, counts=counts, read_hosts=read_hosts
        )

    def ack(self, partition: int, ids: Sequence[str]) -> int:
        """Forget processed requests; ids, or ``id#delivery`` (:attr:`LeaseToken.ref`)."""
        return self.leases.ack_many({partition: ids})

    def ack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        """Pipelined :meth:`ack`: partition -> ids."""
        return self.leases.ack_many(ids)

    def nack(self, partition: int, ids: Sequence[str]) -> int:
        """Give leased requests back unprocessed; the delivery does not count."""
        return self.leases.nack_many({partition: ids})

    def nack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        return self.leases.nack_many(ids)

    def start_many(self, refs: Mapping[int, Sequence[str]]) -> int:
        """Mark deliveries whose fetch began (:meth:`Leases.start_many
        <scrapy_banker.redis.frontier.leases.Leases.start_many>`)."""
        return self.leases.start_many(refs)

    def renew(self, partition: int, ids: Sequence[str]) -> int:
        return self.leases.renew_many({partition: ids})

    def renew_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        return self.leases.renew_many(ids)

    def reap(self, partition: int, limit: int = REAP_LIMIT) -> tuple[int, int]:
        """Expired leases: back to the queue, or dead-lettered; returns (requeued, dead)."""
        return self.reaper.reap(partition, limit)

    def reap_all(
        self, node: str, lock_ttl_ms: int = 10_000, chunk: int = REAP_CHUNK, hold_ms: int = 0
    ) -> tuple[int, int] | None:
        """Reap every partition, single-flight across the fleet; None if another node is.

        See :meth:`LeaseReaper.reap_all
        <scrapy_banker.redis.frontier.reaper.LeaseReaper.reap_all>`.
        """
        return self.reaper.reap_all(node, lock_ttl_ms, chunk, hold_ms)

    def outstanding(self, *, any_: bool = False, chunk: int = 128) -> int:
        """Requests queued or leased in the whole crawl (:meth:`WorkCensus.outstanding
        <scrapy_banker.redis.frontier.census.WorkCensus.outstanding>`)."""
        return self.work.outstanding(any_=any_, chunk=chunk)

    def census(
        self,
        *,
        each: bool = False,
        chunk: int = CENSUS_CHUNK,
        between: Callable[[int], object] | None = None,
    ) -> Census:
        """Count the work left in every partition, between two readings of the version.

        See :meth:`WorkCensus.census <scrapy_banker.redis.frontier.census.WorkCensus.census>`.
        """
        return self.work.census(each=each, chunk=chunk, between=between)

    def held(self) -> int:
        """Requests held over a budget crawl-wide (:meth:`WorkCensus.held
        <scrapy_banker.redis.frontier.census.WorkCensus.held>`)."""
        return self.work.held()

    def finished_version(self) -> int:
        """The crawl's :attr:`~scrapy_banker.redis.keys.Keyspace.finished` counter."""
        return self.work.finished_version()

    def bump_finished(self) -> int:
        """Move the crawl's ``finished`` version, as a batch that changed the work does."""
        return self.work.bump_finished()

    def backlog(self, partitions: Iterable[int], *, chunk: int = 128) -> dict[int, int]:
        """Requests queued or leased per partition (:meth:`WorkCensus.backlog
        <scrapy_banker.redis.frontier.census.WorkCensus.backlog>`)."""
        return self.work.backlog(partitions, chunk=chunk)

    def queued(self, partition: int) -> int:
        return self.work.queued(partition)

    def leased(self, partition: int) -> int:
        return self.work.leased(partition)

    def dead_letter(self, partition: int, request_id: str, reason: str) -> None:
        """Move a leased request to the dead-letter list now (e.g. a malformed payload)."""
        self.deadletters.dead_letter(partition, request_id, reason)

    def dead_letters(self, partition: int) -> list[dict[str, Any]]:
        """The partition's dead letters; a binary payload comes back lossily decoded."""
        return self.deadletters.dead_letters(partition)

    def requeue_dead(self, partition: int, letter: str, priority: int = 0) -> str | None:
        """Queue one dead letter again; its new id, or None if it is gone or has no payload.

        See :meth:`DeadLetters.requeue_dead
        <scrapy_banker.redis.frontier.dead_letters.DeadLetters.requeue_dead>`; follow it with
        :meth:`bump_finished`.
        """
        return self.deadletters.requeue_dead(partition, letter, priority)
