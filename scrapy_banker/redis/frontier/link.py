"""What the parts of a crawl's Redis frontier share: one client, its scripts, its keys.

:class:`~scrapy_banker.redis.frontier.RedisFrontier` is composed of parts by
concern -- queueing with dedup (:mod:`~scrapy_banker.redis.frontier.enqueue`),
leases (:mod:`~scrapy_banker.redis.frontier.leases`), the reaper
(:mod:`~scrapy_banker.redis.frontier.reaper`), counting the work left
(:mod:`~scrapy_banker.redis.frontier.census`) and dead letters
(:mod:`~scrapy_banker.redis.frontier.dead_letters`).  Each one talks to Redis
through the same :class:`FrontierLink`: every key name comes from its one
:class:`~scrapy_banker.redis.keys.Keyspace` and every Lua script runs through
its one :class:`~scrapy_banker.redis.scripts.ScriptRunner`, so no part keeps
names or scripts of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_banker.redis.scripts import ScriptRunner

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from scrapy_banker.redis.keys import Keyspace, PartitionKeys

__all__ = ["FrontierLink"]


@dataclass(frozen=True)
class FrontierLink:
    """One crawl's client, key names and script runner, shared by the frontier's parts."""

    client: redis.Redis | RedisCluster
    keyspace: Keyspace
    scripts: ScriptRunner
    #: A cluster pipeline runs each node's commands in parallel: what must
    #: happen in order is sent one round trip per step there.
    cluster: bool

    @classmethod
    def of(cls, client: redis.Redis | RedisCluster, keyspace: Keyspace) -> FrontierLink:
        """The link of ``client`` (a single server or a cluster) to the crawl of ``keyspace``."""
        return cls(client, keyspace, ScriptRunner(client), hasattr(client, "get_nodes"))

    @property
    def partitions(self) -> int:
        return self.keyspace.partitions

    def keys(self, partition: int) -> PartitionKeys:
        return self.keyspace.partition(partition)

    @property
    def budget_keys(self) -> list[str]:
        """The crawl-wide budget hash, as the last key of a script that may refund a page.

        Empty on a cluster: it is in another slot than any partition, so a
        partition's script cannot touch it there -- topic and crawl budgets
        need a single server (:mod:`scrapy_banker.redis.frontier.control_channel`).
        """
        return [] if self.cluster else [self.keyspace.budget]
