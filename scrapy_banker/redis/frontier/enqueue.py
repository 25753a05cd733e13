"""Queueing a request unless the crawl has seen it: one script, so never one without the other.

The enqueue script (``lua/enqueue.lua``) checks the request's fingerprint
against the crawl's seen set and queues it in the same step: a URL is never
marked seen without being queued, nor queued twice.  The seen set is, by
``BANKER_DEDUP``:

``set``
    a Redis set of fingerprints per partition, exact;
``bloom``
    a Bloom filter -- RedisBloom's ``BF.*`` where the server has it
    (:meth:`Enqueuer.native_bloom`), else a bit array the script sets itself
    (:mod:`scrapy_banker.core.bloom`).  On one server the filter is
    crawl-wide, split in shards a fingerprint picks by its hash
    (:meth:`Enqueuer.bloom_shards`); on Redis Cluster each partition keeps
    its own, since the check and the enqueue must share a slot.

:func:`in_bloom` reads a filter back without settings, for the operator's
``scrapy banker explain``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

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
from scrapy_banker.redis.keys import BLOOM_GEOMETRY, BLOOM_LAYERS, decode
from scrapy_banker.redis.scripts import ScriptCall, ScriptRunner

if TYPE_CHECKING:
    from collections.abc import Iterable

    import redis
    from redis.cluster import RedisCluster

    from scrapy_banker.core.ops import EnqueueOp
    from scrapy_banker.redis.frontier.link import FrontierLink
    from scrapy_banker.redis.keys import Keyspace

logger = logging.getLogger(__name__)

__all__ = ["Enqueuer", "in_bloom"]


class Enqueuer:
    """Queues requests in their partition unless the crawl's seen set holds them."""

    def __init__(
        self,
        link: FrontierLink,
        *,
        dedup: str = "set",
        capacity: int = 100_000_000,
        error: float = 0.001,
        shard_bits: int = SHARD_BITS,
    ) -> None:
        if dedup not in ("set", "bloom"):
            raise ValueError(f"dedup must be 'set' or 'bloom', got {dedup!r}")
        self.link = link
        #: ``set`` or ``bloom`` (BANKER_DEDUP).
        self.dedup = dedup
        self.dedup_capacity = int(capacity)
        #: URLs each partition's Bloom filter is sized for (Redis Cluster), and the target error.
        self.bloom_capacity = -(-self.dedup_capacity // link.partitions)
        self.bloom_error = float(error)
        #: The bit-array geometry (m, k), used when the server has no ``BF.*``.
        self.bloom_bits, self.bloom_k = bloom_geometry(self.bloom_capacity, error)
        if self.bloom_bits > MAX_BLOOM_BITS:
            raise ValueError(
                f"a Bloom filter of {self.bloom_capacity} URLs at {error} needs "
                f"{self.bloom_bits} bits, more than a Redis string holds: use more partitions"
            )
        self._native_bloom: bool | None = None
        #: Shards of the crawl-wide filter, and each one's sizing (one server).
        self._shards: int | None = None
        self._shard_capacity = 0
        self._shard_geometry = (0, 0)
        self._shard_bits = shard_bits

    def enqueue_many(self, ops: Iterable[EnqueueOp]) -> list[str | None]:
        """Queue each request unless seen, one round trip for the batch: its id or None."""
        calls = [self.call(op) for op in ops]
        values = self.link.scripts.values("enqueue", calls)
        return [None if r is None else decode(r) for r in values]

    def call(self, op: EnqueueOp) -> ScriptCall:
        """The enqueue script's run for ``op`` (a batch may mix it with other scripts)."""
        k = self.link.keys(op.partition)
        if self.dedup == "set":
            bloom, geometry = k.bloom, k.meta
        else:
            bloom, geometry = self.bloom_keys(op.partition, op.fingerprint)
        return ScriptCall(
            [k.levels, k.seen, k.payloads, k.meta, bloom, geometry],
            [op.fingerprint, op.payload, int(op.priority), "1" if op.dont_filter else "0",
             *self._dedup_args(op.fingerprint)],
        )  # fmt: skip

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
            (answer,) = self.link.scripts.values("bloom_probe", [ScriptCall([key], ["probe"])])
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
            if self.link.cluster:
                self._shards = 0
            else:
                client = self.link.client
                key = self.link.keyspace.bloom_shards
                wanted = bloom_shard_count(self.dedup_capacity, self.bloom_error, self._shard_bits)
                client.set(key, wanted, nx=True)
                self._shards = int(client.get(key) or wanted)
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
            k = self.link.keys(partition)
            return k.bloom, k.meta
        keyspace = self.link.keyspace
        shard = bloom_shard(fingerprint, shards)
        return keyspace.bloom_shard(shard), keyspace.bloom_shard_meta(shard)

    def shard_keys(self) -> list[str]:
        """Every key of the crawl-wide filter's shards, as many as the crawl wrote.

        Read from Redis, not from this worker's sizing, for a fresh start
        (:meth:`RedisFrontier.clear <scrapy_banker.redis.frontier.RedisFrontier.clear>`);
        the next enqueue sizes the filter again (:meth:`reset`).
        """
        keyspace = self.link.keyspace
        shards = 0 if self.link.cluster else int(self.link.client.get(keyspace.bloom_shards) or 0)
        keys: list[str] = []
        for shard in range(shards):
            keys += [keyspace.bloom_shard(shard), keyspace.bloom_shard_meta(shard)]
        return keys

    def reset(self) -> None:
        """Forget the filter's sizing: a fresh crawl sizes it again."""
        self._shards = None

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
        geometry, layers = client.hmget(geometry_key, [BLOOM_GEOMETRY.name, BLOOM_LAYERS.name])
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
