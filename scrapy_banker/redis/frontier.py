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
import random
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from redis.cluster import RedisCluster

logger = logging.getLogger(__name__)

__all__ = ["Leased", "NotOwner", "PartitionKeys", "PopResult", "RedisFrontier"]

#: Scripts run by name; each is loaded once per server and run by EVALSHA.
_SCRIPTS = ("enqueue", "pop", "ack", "nack", "renew", "reap", "deadletter")


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
        self._sources = {name: _script(name) for name in _SCRIPTS}
        self._shas: dict[str, str] = {}
        self._enqueue_source = self._sources["enqueue"]
        self._enqueue = client.register_script(self._enqueue_source)
        self._pop = client.register_script(self._sources["pop"])
        self._ack = client.register_script(self._sources["ack"])
        self._nack = client.register_script(self._sources["nack"])
        self._renew = client.register_script(self._sources["renew"])
        self._reap = client.register_script(self._sources["reap"])
        self._deadletter = client.register_script(self._sources["deadletter"])

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
        results = self._evalsha_many("enqueue", calls)
        for r in results:
            if isinstance(r, Exception):
                raise r
        return [None if r is None else _text(r) for r in results]

    def _evalsha_many(self, name: str, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run one script many times in one round trip; errors come back in place.

        Raw EVALSHA in a non-transactional pipeline: redis-py's cluster
        pipeline refuses script objects, and raw commands work the same on a
        single server.  A server restarted since the script was loaded
        answers NOSCRIPT: the script is reloaded and only those calls are
        sent again.  Every script is idempotent or deduplicated (enqueue by
        its seen set), so re-sending is a duplicate at worst, never a loss.
        """
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2, 3):
            sha = self._shas.get(name)
            if sha is None or attempt > 1:
                sha = self._shas[name] = str(self.client.script_load(self._sources[name]))
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                keys, args = calls[i]
                pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            retry = []
            for i, answer in zip(todo, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt < 3:
                    retry.append(i)
                else:
                    results[i] = answer
            if not retry:
                break
            todo = retry
        return results

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
        except redis.ResponseError as exc:
            if "NOTOWNER" in str(exc):
                raise NotOwner(
                    f"partition {partition} is not owned by {node}@{epoch} ({exc})"
                ) from None
            if str(exc).startswith("BUSY"):
                return []  # the previous owner's requests are still in flight
            raise
        return _leased(partition, flat)

    def pop_many(
        self, owned: Mapping[int, int], node: str, count_per_partition: int = 1
    ) -> PopResult:
        """:meth:`pop` on many partitions in one round trip; ``owned``: partition -> epoch."""
        partitions = list(owned)
        calls: list[tuple[list[str], list[Any]]] = []
        for p in partitions:
            k = self.keys(p)
            calls.append((
                [k.queue, k.leases, k.payloads, k.meta, k.owner],
                [node, int(owned[p]), self.lease_ttl_ms, int(count_per_partition)],
            ))  # fmt: skip
        result = PopResult([], [], [], [])
        for p, answer in zip(partitions, self._evalsha_many("pop", calls), strict=True):
            if isinstance(answer, redis.ResponseError):
                text = str(answer)
                if "NOTOWNER" in text:
                    result.not_owned.append(p)
                elif text.startswith("BUSY"):
                    result.busy.append(p)
                else:
                    raise answer
            elif isinstance(answer, Exception):
                raise answer
            elif answer:
                result.leased.extend(_leased(p, answer))
            else:
                result.empty.append(p)
        return result

    def ack(self, partition: int, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        k = self.keys(partition)
        return int(self._ack(keys=[k.leases, k.payloads, k.meta], args=list(ids)))

    def ack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        """Pipelined :meth:`ack`: partition -> ids."""
        return self._per_partition("ack", ids, lambda k: [k.leases, k.payloads, k.meta], [])

    def nack(self, partition: int, ids: Sequence[str]) -> int:
        """Give leased requests back unprocessed; the delivery does not count."""
        return self.nack_many({partition: ids})

    def nack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        return self._per_partition("nack", ids, lambda k: [k.queue, k.leases, k.meta], [])

    def renew_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        return self._per_partition("renew", ids, lambda k: [k.leases], [self.lease_ttl_ms])

    def _per_partition(
        self,
        name: str,
        ids: Mapping[int, Sequence[str]],
        keys_of: Callable[[PartitionKeys], list[str]],
        head: list[Any],
    ) -> int:
        calls = [(keys_of(self.keys(p)), [*head, *batch]) for p, batch in ids.items() if batch]
        total = 0
        for answer in self._evalsha_many(name, calls):
            if isinstance(answer, Exception):
                raise answer
            total += int(answer)
        return total

    def outstanding(self, *, any_: bool = False, chunk: int = 128) -> int:
        """Requests queued or leased in the whole crawl: 0 means the crawl is done.

        Two ``ZCARD`` per partition, ``chunk`` partitions per pipeline (no
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
                k = self.keys(p)
                pipe.zcard(k.queue)
                pipe.zcard(k.leases)
            total += sum(int(n) for n in pipe.execute())
            if any_ and total:
                break
        return total

    def backlog(self, partitions: Iterable[int], *, chunk: int = 128) -> dict[int, int]:
        """Requests queued or leased per partition: the work each would take with it.

        The placement planner weighs partitions by it (two ``ZCARD`` each,
        ``chunk`` partitions per pipeline).
        """
        wanted = sorted({p for p in partitions if 0 <= p < self.partitions})
        out: dict[int, int] = {}
        for start in range(0, len(wanted), max(1, chunk)):
            part = wanted[start : start + max(1, chunk)]
            pipe = self.client.pipeline(transaction=False)
            for p in part:
                k = self.keys(p)
                pipe.zcard(k.queue)
                pipe.zcard(k.leases)
            counts = pipe.execute()
            for i, p in enumerate(part):
                out[p] = int(counts[2 * i]) + int(counts[2 * i + 1])
        return out

    def clear(self) -> int:
        """Delete every key of this crawl (all partitions): a fresh start.

        Placement state tied to the old table goes too (the partition -> site
        map, the placed costs, the backlogs, the plan gate); the fleet's
        network measurements (``{prefix}:net:rtt:*``, ``:net:bw:*``,
        ``:net:bs``) are kept on purpose: links do not change between
        crawls, and a re-crawl that finds them places its sites at once.
        """
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.partitions):
            k = self.keys(p)
            for key in (k.queue, k.leases, k.payloads, k.meta, k.owner, k.dead, k.seen):
                pipe.delete(key)
        for suffix in (
            "nodes",
            "heartbeats",
            "table",
            "rebalance-lock",
            "reaper-lock",
            "sites",
            "schemes",
            "net:placed",
            "net:backlog",
            "net:plan-gate",
        ):
            pipe.delete(f"{self.prefix}:{suffix}")
        return sum(int(n) for n in pipe.execute())

    def renew(self, partition: int, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        k = self.keys(partition)
        return int(self._renew(keys=[k.leases], args=[self.lease_ttl_ms, *ids]))

    def _reap_call(self, partition: int, limit: int) -> tuple[list[str], list[Any]]:
        k = self.keys(partition)
        keys = [k.queue, k.leases, k.payloads, k.meta, k.dead]
        return keys, [self.max_deliveries, int(limit), partition]

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
        keys, args = self._reap_call(partition, limit)
        return self._reaped(partition, self._reap(keys=keys, args=args))

    def reap_all(
        self, node: str, lock_ttl_ms: int = 10_000, chunk: int = 128
    ) -> tuple[int, int] | None:
        """Reap every partition, single-flight across the cluster; None if another node is.

        ``chunk`` partitions per round trip: one ``EVALSHA`` per partition sent
        one at a time cost an idle worker of a 1024-partition crawl ~1,000
        round trips every reap interval, most of them on empty lease sets.
        """
        lock = f"{self.prefix}:reaper-lock"
        if not self.client.set(lock, node, nx=True, px=lock_ttl_ms):
            return None
        requeued = dead = 0
        try:
            for start in range(0, self.partitions, max(1, chunk)):
                parts = range(start, min(self.partitions, start + max(1, chunk)))
                calls = [self._reap_call(partition, 1000) for partition in parts]
                for partition, answer in zip(parts, self._evalsha_many("reap", calls), strict=True):
                    if isinstance(answer, Exception):
                        raise answer
                    r, d = self._reaped(partition, answer)
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


def _leased(partition: int, flat: Sequence[Any]) -> list[Leased]:
    # A payload that is not UTF-8 (garbage, a planted pickle) must not crash
    # the worker here: decoded lossily, the codec refuses it and the caller
    # dead-letters it.
    return [
        Leased(partition, _text(flat[i]), _text(flat[i + 1], lossy=True), int(flat[i + 2]))
        for i in range(0, len(flat), 3)
    ]


def _text(value: Any, lossy: bool = False) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace" if lossy else "strict")
    return str(value)
