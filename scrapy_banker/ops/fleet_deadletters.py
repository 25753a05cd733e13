"""A fleet's dead letters: listing them, and putting them back in their partition's queue.

A request the workers gave up on (its lease expired after too many
deliveries, or its payload cannot be run) is moved by a script to its
partition's dead-letter list with the reason, its delivery count and its
payload.  :func:`list_dead_letters` reads those lists (``LLEN``/``LRANGE``,
no lock) in partition order; :func:`requeue_dead_letters` is the one fleet
read model that writes, and it writes only through the frontier's own
``requeue`` script, one letter at a time, so a letter is never lost nor
queued twice.

Payloads are never unpickled: a letter's payload is looked at with the
project's JSON codec (:func:`~scrapy_banker.ops.payloads.describe_payload`),
and whatever it refuses is reported as such.  ``scrapy banker deadletters``
and the dashboard print these views; their ``to_json()`` schemas carry
:data:`~scrapy_banker.ops.fleet_view.SCHEMA_VERSION`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.ops.fleet_view import SCHEMA_VERSION, node_registry
from scrapy_banker.ops.payloads import PayloadInfo, describe_payload
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.keys import decode
from scrapy_banker.scheduler.serialize import RequestCodec

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import redis
    from redis.cluster import RedisCluster

    from scrapy_banker.redis.keys import Keyspace

    Client = redis.Redis | RedisCluster

logger = logging.getLogger(__name__)

__all__ = [
    "DeadLetter",
    "RequeueResult",
    "list_dead_letters",
    "parse_letter",
    "requeue_dead_letters",
]


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: where it is, why it is there, what it would fetch."""

    partition: int
    #: Its index in the partition's list when read.
    index: int
    id: str | None
    reason: str
    deliveries: int
    payload: PayloadInfo
    #: The letter exactly as stored: what a requeue removes (and only it).
    raw: str

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "index": self.index,
            "id": self.id,
            "reason": self.reason,
            "deliveries": self.deliveries,
            "url": self.payload.url,
            "method": self.payload.method,
            "callback": self.payload.callback,
            "topic": self.payload.topic,
            "payload_error": self.payload.error,
        }


def parse_letter(partition: int, index: int, raw: Any, codec: RequestCodec) -> DeadLetter:
    """Read one stored letter (its ``index`` in partition ``partition``'s list); never raises."""
    text = decode(raw, lossy=True)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        info = PayloadInfo(None, None, None, None, 0, "unreadable dead letter")
        return DeadLetter(partition, index, None, "unreadable dead letter", 0, info, text)
    payload = data.get("payload")
    deliveries = data.get("deliveries", 0)
    return DeadLetter(
        partition=partition,
        index=index,
        id=str(data["id"]) if data.get("id") is not None else None,
        reason=str(data.get("reason", "")),
        deliveries=deliveries if isinstance(deliveries, int) else 0,
        payload=describe_payload(payload if isinstance(payload, str) else None, codec),
        raw=text,
    )


def list_dead_letters(
    client: Client,
    keyspace: Keyspace,
    *,
    limit: int | None = None,
    partitions: Iterable[int] | None = None,
    codec: RequestCodec | None = None,
) -> list[DeadLetter]:
    """Dead letters in partition order, oldest first; at most ``limit``."""
    codec = codec or RequestCodec()
    wanted = list(range(keyspace.partitions)) if partitions is None else sorted(set(partitions))
    pipe = client.pipeline(transaction=False)
    for p in wanted:
        pipe.llen(keyspace.partition(p).dead)
    lengths = [int(n) for n in pipe.execute()]
    out: list[DeadLetter] = []
    for p, n in zip(wanted, lengths, strict=True):
        if not n:
            continue
        room = n if limit is None else min(n, limit - len(out))
        if room <= 0:
            break
        for i, raw in enumerate(client.lrange(keyspace.partition(p).dead, 0, room - 1)):
            out.append(parse_letter(p, i, raw, codec))
    return out


@dataclass(frozen=True)
class RequeueResult:
    """What :func:`requeue_dead_letters` did, letter by letter."""

    #: (letter, the id it was queued under)
    requeued: tuple[tuple[DeadLetter, str], ...]
    #: (letter, why it was left in the dead-letter list)
    skipped: tuple[tuple[DeadLetter, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "requeue",
            "requeued": [{**d.to_json(), "new_id": new} for d, new in self.requeued],
            "skipped": [{**d.to_json(), "why": why} for d, why in self.skipped],
        }


def requeue_dead_letters(
    client: Client,
    keyspace: Keyspace,
    letters: Sequence[DeadLetter],
    *,
    node_timeout_s: float = 30.0,
) -> RequeueResult:
    """Put dead letters back in their partition's queue, each one atomically.

    Per letter one script (:meth:`RedisFrontier.requeue_dead`) removes exactly
    that stored letter and queues its payload under a fresh id -- or does
    nothing if the letter is gone (requeued by someone else): a letter is
    never lost nor queued twice.  Its fingerprint stays in the seen set, so
    the crawl's dedup still knows it.  A letter without a payload cannot be
    queued and is left where it is.  The crawl's ``finished`` counter is
    bumped afterwards (a drain check running meanwhile does not conclude the
    crawl is over), and the owners of the partitions are woken.
    """
    frontier = RedisFrontier(client, prefix=keyspace.prefix, partitions=keyspace.partitions)
    requeued: list[tuple[DeadLetter, str]] = []
    skipped: list[tuple[DeadLetter, str]] = []
    for letter in letters:
        if letter.id is None or letter.payload.error == "no payload stored":
            skipped.append((letter, "no request id or payload to queue"))
            continue
        new_id = frontier.requeue_dead(letter.partition, letter.raw, letter.payload.priority)
        if new_id is None:
            skipped.append((letter, "no longer in the dead-letter list"))
        else:
            requeued.append((letter, new_id))
    if requeued:
        frontier.bump_finished()
        registry = node_registry(client, keyspace, node_timeout_s)
        table = registry.load_table()
        ready: dict[str, list[int]] = {}
        for letter, _ in requeued:
            owner = table.owners[letter.partition]
            if owner is not None:
                ready.setdefault(owner, []).append(letter.partition)
        registry.notify(ready)
        logger.info("Requeued %d dead letters of %r", len(requeued), keyspace.prefix)
    return RequeueResult(tuple(requeued), tuple(skipped))
