"""Which workers are alive, and which partitions each one owns.

Each worker registers itself (id, capacity) and renews a heartbeat; a worker
whose heartbeat is older than the timeout is dead.  Any worker may rebalance
-- single-flight, under a short Redis lock -- with
:meth:`PartitionTable.rebalance <scrapy_banker.net.partitions.PartitionTable.rebalance>`,
which moves the fewest partitions.  The table (owners + epochs) is stored as
JSON; each partition's ``owner`` key, ``node@epoch``, is what the Lua pop
checks, so a worker that lost a partition is fenced off at once even before it
reloads the table.  Every write bumps the table's version, stored first in
its JSON, so workers notice a change by reading a few bytes
(:meth:`NodeRegistry.table_version`) many times a second instead of
reloading the table every heartbeat.  Heartbeats use the Redis server's
clock, so workers' clock skew does not matter.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from scrapy_banker.net.partitions import Move, PartitionTable
from scrapy_banker.redis.keys import decode

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from scrapy_banker.redis.frontier import RedisFrontier

logger = logging.getLogger(__name__)

__all__ = ["NodeRegistry"]

#: The head of a stored table: ``{"version": 12, ...``.
_VERSION = re.compile(rb'^\{"version": (\d+)')
#: Bytes of the stored table :meth:`NodeRegistry.table_version` reads.
_HEAD = 40


class NodeRegistry:
    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        frontier: RedisFrontier,
        *,
        node_timeout_ms: int = 30_000,
    ) -> None:
        if isinstance(node_timeout_ms, bool) or not isinstance(node_timeout_ms, int):
            raise ValueError(f"node_timeout_ms must be an integer, got {node_timeout_ms!r}")
        if node_timeout_ms < 1:
            raise ValueError(f"node_timeout_ms must be >= 1, got {node_timeout_ms}")
        self.client = client
        self.frontier = frontier
        self.node_timeout_ms = node_timeout_ms
        #: Shared with the frontier: one crawl, one set of key names.
        self.keyspace = frontier.keyspace

    @property
    def table_key(self) -> str:
        return self.keyspace.table

    @property
    def lock_key(self) -> str:
        return self.keyspace.rebalance_lock

    def _now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def register(self, node: str, capacity: float = 1.0) -> None:
        if not node or "@" in node:
            raise ValueError(f"node id must be non-empty and without '@', got {node!r}")
        if not capacity > 0:
            raise ValueError(f"capacity of node {node!r} must be > 0, got {capacity!r}")
        keys = self.keyspace
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(keys.nodes, node, repr(float(capacity)))
        pipe.zadd(keys.heartbeats, {node: self._now_ms()})
        pipe.execute()

    def heartbeat(self, node: str) -> None:
        self.client.zadd(self.keyspace.heartbeats, {node: self._now_ms()}, xx=True)

    def leave(self, node: str) -> None:
        """A clean stop: forget the node now instead of waiting for its timeout."""
        keys = self.keyspace
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(keys.nodes, node)
        pipe.zrem(keys.heartbeats, node)
        pipe.execute()

    def live_nodes(self) -> dict[str, float]:
        cutoff = self._now_ms() - self.node_timeout_ms
        beats = self.client.zrangebyscore(self.keyspace.heartbeats, cutoff, "+inf")
        alive = {decode(n) for n in beats}
        capacities = self.client.hgetall(self.keyspace.nodes)
        return {decode(n): float(decode(c)) for n, c in capacities.items() if decode(n) in alive}

    def load_table(self) -> PartitionTable:
        raw = self.client.get(self.keyspace.table)
        if raw is None:
            return PartitionTable(self.frontier.partitions)
        table = PartitionTable.from_state(json.loads(raw))
        if table.size != self.frontier.partitions:
            raise ValueError(
                f"the partition table in Redis has {table.size} partitions but this "
                f"worker is configured for {self.frontier.partitions}: all workers of a "
                "crawl must use the same partition count"
            )
        return table

    def table_version(self) -> int:
        """The stored table's version (0: none stored yet), read from its first bytes."""
        head = self.client.getrange(self.keyspace.table, 0, _HEAD - 1)
        match = _VERSION.match(head if isinstance(head, bytes) else str(head).encode())
        return int(match.group(1)) if match else 0

    def poll(self, node: str) -> tuple[int, list[int]]:
        """What changed for ``node``: the table's version, and the partitions others woke.

        One round trip, made many times a second by every worker: the first
        bytes of the table and the node's :meth:`ready set
        <scrapy_banker.redis.keys.Keyspace.ready>`, emptied as it is read.
        """
        pipe = self.client.pipeline(transaction=False)
        pipe.getrange(self.keyspace.table, 0, _HEAD - 1)
        pipe.spop(self.keyspace.ready(node), self.frontier.partitions)
        head, ready = pipe.execute()
        match = _VERSION.match(head if isinstance(head, bytes) else str(head).encode())
        return (int(match.group(1)) if match else 0), [int(p) for p in ready or ()]

    def notify(self, ready: Mapping[str, Iterable[int]], ttl_s: int = 60) -> None:
        """Tell each node which of its partitions just got work (see :meth:`poll`)."""
        if not ready:
            return
        pipe = self.client.pipeline(transaction=False)
        for node, partitions in ready.items():
            key = self.keyspace.ready(node)
            pipe.sadd(key, *partitions)
            pipe.expire(key, ttl_s)
        pipe.execute()

    def rebalance(
        self, node: str, lock_ttl_ms: int = 10_000, *, work: Sequence[int] | None = None
    ) -> list[Move] | None:
        """Recompute ownership for the live nodes; None if another node is doing it.

        ``work`` (requests queued or leased per partition) chooses which
        partitions move, see
        :meth:`PartitionTable.rebalance <scrapy_banker.net.partitions.PartitionTable.rebalance>`.
        """
        moves = self.update(node, lambda table, live: table.rebalance(live, work=work), lock_ttl_ms)
        if moves:
            logger.info("Rebalanced: %d partitions moved", len(moves))
        return moves

    def steal(
        self,
        thief: str,
        queued: Sequence[int],
        leased: Sequence[int],
        *,
        slots: int,
        limit: int,
        lock_ttl_ms: int = 10_000,
    ) -> list[Move] | None:
        """Take partitions whose work waits for a saturated node; None if the lock is busy.

        See :meth:`PartitionTable.steal <scrapy_banker.net.partitions.PartitionTable.steal>`;
        the counts come from :meth:`RedisFrontier.census
        <scrapy_banker.redis.frontier.RedisFrontier.census>`.
        """
        return self.update(
            thief,
            lambda table, live: table.steal(thief, live, queued, leased, slots=slots, limit=limit),
            lock_ttl_ms,
        )

    def update(
        self,
        node: str,
        change: Callable[[PartitionTable, dict[str, float]], list[Move]],
        lock_ttl_ms: int = 10_000,
    ) -> list[Move] | None:
        """Apply ``change`` to the table under the single-flight lock; None if busy.

        Rebalancing and network-aware placement both go through here, so two
        nodes never write the table at once and every move gets its fencing
        owner key.
        """
        keys = self.keyspace
        if not self.client.set(keys.rebalance_lock, node, nx=True, px=lock_ttl_ms):
            return None
        try:
            table = self.load_table()
            moves = change(table, self.live_nodes())
            if not moves and not any(o is None for o in table.owners):
                return moves
            table.version += 1
            pipe = self.client.pipeline(transaction=False)
            # Owner keys first: the old owners are fenced before the new
            # version tells the new owners to pop.
            for move in moves:
                pipe.set(
                    keys.partition(move.partition).owner,
                    f"{move.new}@{table.epochs[move.partition]}",
                )
            for p, owner in enumerate(table.owners):
                if owner is None:  # no live node: fence everyone
                    pipe.delete(keys.partition(p).owner)
            pipe.set(keys.table, json.dumps(table.to_state()))
            pipe.execute()
        finally:
            if decode(self.client.get(keys.rebalance_lock) or b"") == node:
                self.client.delete(keys.rebalance_lock)
        return moves

    def owned(self, node: str) -> dict[int, int]:
        """Partitions this node owns now, with the epoch to pop them with."""
        table = self.load_table()
        return {p: table.epochs[p] for p in table.owned_by(node)}
