"""Expired leases back to the queue -- or, after too many deliveries, to the dead letters.

A lease nobody renewed (its worker died, froze, or lost Redis for longer than
the TTL) has expired on the server's clock; the reap script
(``lua/reap.lua``) puts its request back in the queue where it was, or, once
``max_deliveries`` of its fetches began without an ack, moves it to the
partition's dead-letter list with the reason.  Any node may reap; a
fleet-wide lock (:attr:`~scrapy_banker.redis.keys.Keyspace.reaper_lock`)
makes a round single-flight, and holding it for most of the interval makes
it one round per interval for the whole fleet.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_banker.redis.frontier.census import finished_bump
from scrapy_banker.redis.keys import decode
from scrapy_banker.redis.scripts import ScriptCall

if TYPE_CHECKING:
    from scrapy_banker.redis.frontier.link import FrontierLink

logger = logging.getLogger(__name__)

__all__ = ["REAP_CHUNK", "REAP_LIMIT", "LeaseReaper"]

#: Partitions reaped per round trip by :meth:`LeaseReaper.reap_all`.
REAP_CHUNK = 128
#: Expired leases one reap script handles in a partition.
REAP_LIMIT = 1000


class LeaseReaper:
    """Gives expired leases back, or dead-letters them after ``max_deliveries``."""

    def __init__(self, link: FrontierLink, max_deliveries: int) -> None:
        self.link = link
        self.max_deliveries = max_deliveries

    def reap(self, partition: int, limit: int = REAP_LIMIT) -> tuple[int, int]:
        """Expired leases: back to the queue, or dead-lettered; returns (requeued, dead)."""
        (answer,) = self.link.scripts.values("reap", [self._call(partition, limit)])
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
        link = self.link
        client, lock = link.client, link.keyspace.reaper_lock
        if not client.set(lock, node, nx=True, px=lock_ttl_ms):
            return None
        requeued = dead = 0
        try:
            # A reaper round may dead-letter: it finishes requests like an ack.
            link.scripts.values("bump", [finished_bump(link.keyspace)])
            for start in range(0, link.partitions, max(1, chunk)):
                parts = range(start, min(link.partitions, start + max(1, chunk)))
                calls = [self._call(partition, REAP_LIMIT) for partition in parts]
                answers = link.scripts.values("reap", calls)
                for partition, answer in zip(parts, answers, strict=True):
                    r, d = self._reaped(partition, answer)
                    requeued += r
                    dead += d
        except BaseException:
            self._release(lock, node)
            raise
        if hold_ms > 0:
            # Only our own lock (it may have expired and been taken meanwhile).
            if decode(client.get(lock) or b"") == node:
                client.pexpire(lock, hold_ms)
        else:
            self._release(lock, node)
        return requeued, dead

    def _call(self, partition: int, limit: int) -> ScriptCall:
        k = self.link.keys(partition)
        keys = [k.levels, k.leases, k.payloads, k.meta, k.dead, *self.link.budget_keys]
        return ScriptCall(keys, [self.max_deliveries, int(limit), partition])

    def _reaped(self, partition: int, answer: Any) -> tuple[int, int]:
        requeued, dead = int(answer[0]), int(answer[1])
        if dead:
            logger.warning(
                "Dead-lettered %d requests of partition %d after %d deliveries",
                dead, partition, self.max_deliveries,
            )  # fmt: skip
        return requeued, dead

    def _release(self, lock: str, node: str) -> None:
        # Release only our own lock (it may have expired and been taken).
        client = self.link.client
        if decode(client.get(lock) or b"") == node:
            client.delete(lock)
