"""Partitioned, leased request queues in Redis (at-least-once delivery).

scrapy-redis pops requests destructively: a worker that dies loses everything
it popped.  Here a pop is a Lua script that moves each request into a *lease*
set scored by the Redis server's clock plus a TTL and counts its deliveries;
the worker acknowledges a request once its response (and the requests it
yielded) are processed, renews its leases with a heartbeat, and any node's
reaper gives expired leases back to the queue -- or, after too many
deliveries, to a dead-letter list with the reason.  Dedup and enqueue are one
script, so a URL is never marked seen without being queued.

Every key of a partition shares the hash tag ``{<prefix>:<partition>}``, so
each script touches one cluster slot and works on Redis Cluster.  No
``KEYS``/``SCAN``: partitions are addressed by number.  Payloads are opaque
strings here (JSON requests, see :mod:`scrapy_banker.serialize`); nothing is
ever unpickled.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

logger = logging.getLogger(__name__)

__all__ = ["Leased", "NotOwner", "PartitionKeys", "RedisFrontier"]


class NotOwner(RuntimeError):
    """The partition is owned by another node or epoch: this node is fenced off."""


@dataclass(frozen=True)
class PartitionKeys:
    queue: str
    leases: str
    payloads: str
    meta: str
    owner: str
    dead: str
    seen: str


@dataclass(frozen=True)
class Leased:
    partition: int
    id: str
    payload: str
    deliveries: int


def _script(name: str) -> str:
    return resources.files("scrapy_banker.redis").joinpath("lua", f"{name}.lua").read_text("utf-8")


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
    ) -> None:
        for name, value, low in (
            ("partitions", partitions, 1),
            ("lease_ttl_ms", lease_ttl_ms, 1),
            ("max_deliveries", max_deliveries, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not prefix or any(c in prefix for c in "{}"):
            raise ValueError(f"prefix must be non-empty and free of braces, got {prefix!r}")
        self.client = client
        self.prefix = prefix
        self.partitions = partitions
        self.lease_ttl_ms = lease_ttl_ms
        self.max_deliveries = max_deliveries
        self._enqueue_source = _script("enqueue")
        self._enqueue = client.register_script(self._enqueue_source)
        self._pop = client.register_script(_script("pop"))
        self._ack = client.register_script(_script("ack"))
        self._renew = client.register_script(_script("renew"))
        self._reap = client.register_script(_script("reap"))
        self._deadletter = client.register_script(_script("deadletter"))

    def keys(self, partition: int) -> PartitionKeys:
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition must be in [0, {self.partitions}), got {partition!r}")
        tag = f"{{{self.prefix}:{partition}}}"
        return PartitionKeys(
            queue=f"{tag}:q",
            leases=f"{tag}:leases",
            payloads=f"{tag}:payloads",
            meta=f"{tag}:meta",
            owner=f"{tag}:owner",
            dead=f"{tag}:dead",
            seen=f"{tag}:seen",
        )

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
        k = self.keys(partition)
        result = self._enqueue(
            keys=[k.queue, k.seen, k.payloads, k.meta],
            args=[fingerprint, payload, int(priority), "1" if dont_filter else "0"],
        )
        return None if result is None else _text(result)

    def enqueue_many(self, items: Iterable[tuple[int, str, str, int, bool]]) -> list[str | None]:
        """Pipelined :meth:`enqueue`; items are (partition, fingerprint, payload, priority,
        dont_filter)."""
        calls: list[tuple[list[str], list[Any]]] = []
        for partition, fingerprint, payload, priority, dont_filter in items:
            k = self.keys(partition)
            keys = [k.queue, k.seen, k.payloads, k.meta]
            args: list[Any] = [fingerprint, payload, int(priority), "1" if dont_filter else "0"]
            calls.append((keys, args))
        if isinstance(self.client, RedisCluster):
            results = self._enqueue_many_cluster(calls)
        else:
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                self._enqueue(keys=keys, args=args, client=pipe)
            results = pipe.execute()
        return [None if r is None else _text(r) for r in results]

    def _enqueue_many_cluster(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """redis-py's cluster pipeline refuses script objects: send raw EVALSHA.

        The script is loaded on every primary first; a node restarted since
        has lost it, so a NOSCRIPT answer reloads it and retries the batch
        once.  Entries that already ran on other nodes are deduplicated by
        their seen set on the retry, except ``dont_filter`` ones, which may be
        queued twice: a duplicate, never a loss (at-least-once).
        """
        assert isinstance(self.client, RedisCluster)
        for attempt in (1, 2):
            sha = self.client.script_load(self._enqueue_source)
            pipe = self.client.pipeline()  # type: ignore[no-untyped-call]
            for keys, args in calls:
                pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            try:
                return list(pipe.execute())
            except NoScriptError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # -- ownership ------------------------------------------------------------------

    def set_owner(self, partition: int, node: str, epoch: int) -> None:
        self.client.set(self.keys(partition).owner, f"{node}@{epoch}")

    def owner(self, partition: int) -> str | None:
        value = self.client.get(self.keys(partition).owner)
        return None if value is None else _text(value)

    # -- consuming --------------------------------------------------------------------

    def pop(self, partition: int, node: str, epoch: int, count: int = 1) -> list[Leased]:
        """Lease up to ``count`` requests of a partition this node owns at ``epoch``."""
        k = self.keys(partition)
        try:
            flat = self._pop(
                keys=[k.queue, k.leases, k.payloads, k.meta, k.owner],
                args=[node, int(epoch), self.lease_ttl_ms, int(count)],
            )
        except Exception as exc:  # redis.ResponseError, without importing redis here
            if "NOTOWNER" in str(exc):
                raise NotOwner(
                    f"partition {partition} is not owned by {node}@{epoch} ({exc})"
                ) from None
            raise
        # A payload that is not UTF-8 (garbage, a planted pickle) must not crash
        # the worker here: decoded lossily, the codec refuses it and the caller
        # dead-letters it.
        return [
            Leased(partition, _text(flat[i]), _text(flat[i + 1], lossy=True), int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]

    def ack(self, partition: int, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        k = self.keys(partition)
        return int(self._ack(keys=[k.leases, k.payloads, k.meta], args=list(ids)))

    def renew(self, partition: int, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        k = self.keys(partition)
        return int(self._renew(keys=[k.leases], args=[self.lease_ttl_ms, *ids]))

    def reap(self, partition: int, limit: int = 1000) -> tuple[int, int]:
        """Expired leases: back to the queue, or dead-lettered; returns (requeued, dead)."""
        k = self.keys(partition)
        requeued, dead = self._reap(
            keys=[k.queue, k.leases, k.payloads, k.meta, k.dead],
            args=[self.max_deliveries, int(limit), partition],
        )
        if dead:
            logger.warning(
                "Dead-lettered %d requests of partition %d after %d deliveries",
                dead, partition, self.max_deliveries,
            )  # fmt: skip
        return int(requeued), int(dead)

    def reap_all(self, node: str, lock_ttl_ms: int = 10_000) -> tuple[int, int] | None:
        """Reap every partition, single-flight across the cluster; None if another node is."""
        lock = f"{self.prefix}:reaper-lock"
        if not self.client.set(lock, node, nx=True, px=lock_ttl_ms):
            return None
        requeued = dead = 0
        try:
            for partition in range(self.partitions):
                r, d = self.reap(partition)
                requeued += r
                dead += d
        finally:
            # Release only our own lock (it may have expired and been taken).
            if _text(self.client.get(lock) or b"") == node:
                self.client.delete(lock)
        return requeued, dead

    def dead_letter(self, partition: int, request_id: str, reason: str) -> None:
        """Move a leased request to the dead-letter list now (e.g. a malformed payload)."""
        k = self.keys(partition)
        self._deadletter(
            keys=[k.leases, k.payloads, k.meta, k.dead], args=[request_id, reason, partition]
        )

    def dead_letters(self, partition: int) -> list[dict[str, Any]]:
        """The partition's dead letters; a binary payload comes back lossily decoded."""
        out: list[dict[str, Any]] = []
        for raw in self.client.lrange(self.keys(partition).dead, 0, -1):
            text = _text(raw, lossy=True)
            try:
                out.append(json.loads(text))
            except ValueError:
                out.append({"raw": text, "reason": "unreadable dead letter"})
        return out

    # -- inspection -------------------------------------------------------------------

    def queued(self, partition: int) -> int:
        return int(self.client.zcard(self.keys(partition).queue))

    def leased(self, partition: int) -> int:
        return int(self.client.zcard(self.keys(partition).leases))


def _text(value: Any, lossy: bool = False) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace" if lossy else "strict")
    return str(value)
