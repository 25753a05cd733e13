"""The operator's read model of a fleet: what ``scrapy banker`` and the dashboard show.

Everything here is read from Redis through the crawl's own names
(:class:`~scrapy_banker.redis.keys.Keyspace`,
:class:`~scrapy_banker.redis.registry.NodeRegistry`,
:class:`~scrapy_banker.redis.frontier.RedisFrontier`), so the view can never
drift from what the workers write.  The functions are plain blocking calls
on a redis-py client: the commands call them directly, the dashboard from a
Twisted thread.  Only :func:`requeue_dead_letters` writes (through the
frontier's ``requeue`` script); everything else is ``GET``/``ZCARD``/
``LLEN``/``ZSCAN``-style reads -- no script, no lock, no key touched.

Payloads are never unpickled: a dead letter's payload is looked at with the
project's JSON codec (:class:`~scrapy_banker.scheduler.serialize.RequestCodec`), and
whatever it refuses is reported as such.

Each view has ``to_json()``; the schema (documented in ``docs/ops/commands.rst``)
carries :data:`SCHEMA_VERSION` at its top level and only grows: fields are
added, never renamed or removed without bumping the version.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.telemetry import Sample, sample_from_dict
from scrapy_banker.net.partitions import PartitionTable
from scrapy_banker.redis.frontier import RedisFrontier, in_bloom
from scrapy_banker.redis.keys import Keyspace, decode
from scrapy_banker.redis.registry import NodeRegistry
from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec, method_name_problem

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    import redis
    from redis.cluster import RedisCluster
    from scrapy import Request

    from scrapy_banker.settings import BankerConfig

    Client = redis.Redis | RedisCluster

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEMA_VERSION",
    "Copy",
    "DeadLetter",
    "Explanation",
    "FleetView",
    "NodeView",
    "PartitionCounts",
    "PlacementView",
    "ReaperView",
    "RequeueResult",
    "TopicView",
    "count_partitions",
    "describe_payload",
    "explain_url",
    "list_dead_letters",
    "read_fleet",
    "requeue_dead_letters",
]

#: Version of every ``to_json()`` schema of this module.
SCHEMA_VERSION = 1
#: Partitions counted per pipeline (5 commands each).
_CHUNK = 256
#: Queued entries read per round trip when looking for one request's copies.
_PAGE = 1000


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


# -- counting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionCounts:
    """Per partition: queued, leased, dead-lettered, and leases already past expiry."""

    queued: tuple[int, ...]
    leased: tuple[int, ...]
    dead: tuple[int, ...]
    #: Leases whose expiry (server clock) has passed: the reaper's next round
    #: gives them back to the queue or dead-letters them.
    expired: tuple[int, ...]
    #: The server's clock when counting started, in milliseconds.
    now_ms: int


def _now_ms(client: Client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def count_partitions(client: Client, keyspace: Keyspace, chunk: int = _CHUNK) -> PartitionCounts:
    """Count every partition with plain reads (``HGET``, ``ZCARD``, ``LLEN``, ``ZCOUNT``).

    Not atomic across partitions -- a request may be counted twice or not at
    all while it moves -- which is fine for a view; the crawl's own drain
    check (:meth:`RedisFrontier.census`) is the exact one.
    """
    now = _now_ms(client)
    queued: list[int] = []
    leased: list[int] = []
    dead: list[int] = []
    expired: list[int] = []
    size = max(1, chunk)
    for start in range(0, keyspace.partitions, size):
        pipe = client.pipeline(transaction=False)
        for p in range(start, min(keyspace.partitions, start + size)):
            k = keyspace.partition(p)
            pipe.hget(k.meta, "n")  # the level lists' count (enqueue.lua, pop.lua)
            pipe.zcard(k.queue)  # the old layout
            pipe.zcard(k.leases)
            pipe.llen(k.dead)
            pipe.zcount(k.leases, "-inf", now)
        answers = [int(n or 0) for n in pipe.execute()]
        queued += [a + b for a, b in zip(answers[0::5], answers[1::5], strict=True)]
        leased += answers[2::5]
        dead += answers[3::5]
        expired += answers[4::5]
    return PartitionCounts(tuple(queued), tuple(leased), tuple(dead), tuple(expired), now)


# -- the fleet --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """One worker as the registry, the table and its own telemetry describe it."""

    name: str
    #: ``BANKER_REDIS_NODE_CAPACITY`` it registered with (None: heartbeat only).
    capacity: float | None
    #: Seconds since its last heartbeat, on the server's clock (None: none recorded).
    heartbeat_age_s: float | None
    #: Heartbeat younger than the node timeout -- what the registry calls live.
    alive: bool
    partitions_owned: int
    #: Requests queued / leased / dead-lettered in the partitions it owns.
    queued: int
    leased: int
    dead: int
    #: Its latest published sample (expires a few intervals after it stops).
    telemetry: Sample | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "capacity": self.capacity,
            "heartbeat_age_s": _round(self.heartbeat_age_s),
            "alive": self.alive,
            "partitions_owned": self.partitions_owned,
            "queued": self.queued,
            "leased": self.leased,
            "dead": self.dead,
            "telemetry": None if self.telemetry is None else self.telemetry.to_dict(),
        }


@dataclass(frozen=True)
class TopicView:
    """One topic, summed over the live nodes' telemetry."""

    name: str
    #: Responses received (cumulative since each node started).
    pages: int
    #: Requests the nodes hold locally for the topic (not the Redis queues).
    queued: int
    inflight: int
    #: Nodes whose sample mentions the topic.
    nodes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pages": self.pages,
            "queued": self.queued,
            "inflight": self.inflight,
            "nodes": self.nodes,
        }


@dataclass(frozen=True)
class PlacementView:
    """Network-aware placement, from its published keys and the nodes' telemetry."""

    #: The mode the caller runs with (``BANKER_PLACEMENT``), or the one a
    #: node's telemetry reports when the caller did not say.
    mode: str
    #: Partitions whose site (netloc) is known.
    sites: int
    #: Partitions a ``hungarian`` plan placed, and the sum of their costs.
    placed: int
    placed_cost: float
    #: Sites with a backlog recorded at the last plan, and its total.
    backlog_sites: int
    backlog: float
    #: The node that planned within the last interval (holds the plan gate).
    planner: str | None
    #: Latest plan as a node's telemetry reports it: site -> node.
    assignment: dict[str, str] = field(default_factory=dict)
    #: The node whose sample the assignment comes from.
    assignment_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "sites": self.sites,
            "placed": self.placed,
            "placed_cost": _round(self.placed_cost, 6),
            "backlog_sites": self.backlog_sites,
            "backlog": self.backlog,
            "planner": self.planner,
            "assignment": dict(sorted(self.assignment.items())),
            "assignment_from": self.assignment_from,
        }


@dataclass(frozen=True)
class ReaperView:
    """What the reaper has to do and whether a round is running now."""

    #: The node running a reaper round right now (holds the reaper lock).
    running_on: str | None
    #: Leases past their expiry: the next round requeues or dead-letters them.
    expired_leases: int

    def to_json(self) -> dict[str, Any]:
        return {"running_on": self.running_on, "expired_leases": self.expired_leases}


@dataclass(frozen=True)
class FleetView:
    """One crawl's fleet at one instant (see :func:`read_fleet`)."""

    prefix: str
    partitions: int
    #: The Redis server's clock (seconds since the epoch) when read.
    server_time: float
    node_timeout_s: float
    #: Version of the partition table (0: no table stored yet).
    table_version: int
    #: Partitions with an owner; without one; owned by a node that is not live.
    owned: int
    unowned: int
    owned_by_dead: int
    #: Partitions whose new owner waits for the previous owner's leases (BUSY).
    handover: int
    queued: int
    leased: int
    dead: int
    #: The crawl's "finished" counter: bumped before each batch that finishes
    #: requests (ack batches, dead letters, reaper rounds) -- it moves while
    #: the crawl makes progress.
    finished: int
    #: The node rebalancing the table right now (holds the rebalance lock).
    rebalancing: str | None
    nodes: tuple[NodeView, ...]
    topics: tuple[TopicView, ...]
    placement: PlacementView
    reaper: ReaperView

    @property
    def exists(self) -> bool:
        """Whether anything of this crawl is in Redis (a wrong prefix finds nothing)."""
        return bool(
            self.table_version or self.nodes or self.queued or self.leased or self.dead
            or self.finished
        )  # fmt: skip

    @property
    def live_nodes(self) -> tuple[NodeView, ...]:
        return tuple(n for n in self.nodes if n.alive)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "fleet",
            "prefix": self.prefix,
            "partitions": self.partitions,
            "server_time": round(self.server_time, 3),
            "node_timeout_s": self.node_timeout_s,
            "table": {
                "version": self.table_version,
                "owned": self.owned,
                "unowned": self.unowned,
                "owned_by_dead": self.owned_by_dead,
                "handover": self.handover,
                "rebalancing": self.rebalancing,
            },
            "totals": {
                "queued": self.queued,
                "leased": self.leased,
                "dead": self.dead,
                "finished": self.finished,
                "nodes": len(self.nodes),
                "live_nodes": len(self.live_nodes),
            },
            "nodes": [n.to_json() for n in self.nodes],
            "topics": [t.to_json() for t in self.topics],
            "placement": self.placement.to_json(),
            "reaper": self.reaper.to_json(),
        }


def _registry(client: Client, keyspace: Keyspace, node_timeout_s: float) -> NodeRegistry:
    frontier = RedisFrontier(client, prefix=keyspace.prefix, partitions=keyspace.partitions)
    return NodeRegistry(client, frontier, node_timeout_ms=max(1, int(node_timeout_s * 1000)))


def _telemetry(client: Client, keyspace: Keyspace, nodes: Iterable[str]) -> dict[str, Sample]:
    names = list(nodes)
    if not names:
        return {}
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(keyspace.telemetry(name))
    out: dict[str, Sample] = {}
    for name, raw in zip(names, pipe.execute(), strict=True):
        if raw is None:
            continue
        try:
            out[name] = sample_from_dict(json.loads(decode(raw, lossy=True)))
        except ValueError as exc:
            logger.warning("Ignoring unreadable telemetry of node %s: %s", name, exc)
    return out


def handover_waits(
    client: Client, keyspace: Keyspace, table: PartitionTable, leased: Sequence[int]
) -> dict[int, int]:
    """Partition -> leases still held under an older epoch than the table's.

    The pop script's ``BUSY`` test (``pop.lua``): a new owner pops nothing
    until the previous owner's leases are acked or expire.  Read only for
    partitions that have leases at all.
    """
    candidates = [p for p in range(keyspace.partitions) if leased[p] > 0]
    if not candidates:
        return {}
    pipe = client.pipeline(transaction=False)
    for p in candidates:
        # pop.lua counts the leases taken at each epoch in meta "h:<epoch>".
        pipe.hget(keyspace.partition(p).meta, f"h:{table.epochs[p]}")
    out: dict[int, int] = {}
    for p, raw in zip(candidates, pipe.execute(), strict=True):
        mine = int(decode(raw)) if raw is not None else 0
        if leased[p] > mine:
            out[p] = leased[p] - mine
    return out


def _holder(client: Client, key: str) -> str | None:
    raw = client.get(key)
    return None if raw is None else decode(raw, lossy=True)


def _hash_floats(raw: Mapping[Any, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in raw.items():
        try:
            x = float(decode(v, lossy=True))
        except ValueError:
            continue
        if math.isfinite(x):
            out[decode(k, lossy=True)] = x
    return out


def read_fleet(
    client: Client,
    keyspace: Keyspace,
    *,
    node_timeout_s: float = 30.0,
    placement_mode: str | None = None,
) -> FleetView:
    """The fleet now: nodes, table, totals, topics, placement, reaper.

    ``node_timeout_s`` is ``BANKER_REDIS_NODE_TIMEOUT`` (what makes a node
    live); ``placement_mode`` is ``BANKER_PLACEMENT`` if the caller knows it.
    A few dozen round trips for 1,024 partitions; writes nothing.
    """
    registry = _registry(client, keyspace, node_timeout_s)
    counts = count_partitions(client, keyspace)
    now_ms = counts.now_ms
    table = registry.load_table()
    capacities = {decode(n): float(decode(c)) for n, c in client.hgetall(keyspace.nodes).items()}
    scored: Any = client.zrange(keyspace.heartbeats, 0, -1, withscores=True)
    beats = {decode(n): float(score) for n, score in scored}
    names = sorted(set(capacities) | set(beats) | {o for o in table.owners if o is not None})
    timeout_ms = node_timeout_s * 1000
    alive = {n for n, beat in beats.items() if now_ms - beat <= timeout_ms and n in capacities}
    samples = _telemetry(client, keyspace, names)
    per_node: dict[str, list[int]] = {n: [0, 0, 0, 0] for n in names}
    unowned = owned_by_dead = 0
    for p, owner in enumerate(table.owners):
        if owner is None:
            unowned += 1
            continue
        if owner not in alive:
            owned_by_dead += 1
        acc = per_node[owner]
        acc[0] += 1
        acc[1] += counts.queued[p]
        acc[2] += counts.leased[p]
        acc[3] += counts.dead[p]
    nodes = tuple(
        NodeView(
            name=n,
            capacity=capacities.get(n),
            heartbeat_age_s=None if n not in beats else max(0.0, (now_ms - beats[n]) / 1000),
            alive=n in alive,
            partitions_owned=per_node[n][0],
            queued=per_node[n][1],
            leased=per_node[n][2],
            dead=per_node[n][3],
            telemetry=samples.get(n),
        )
        for n in names
    )
    topics: dict[str, list[int]] = {}
    for n in sorted(alive):
        sample = samples.get(n)
        for name, t in (sample.topics if sample else {}).items():
            acc = topics.setdefault(name, [0, 0, 0, 0])
            acc[0] += t.pages
            acc[1] += t.queued
            acc[2] += t.inflight
            acc[3] += 1
    placed = _hash_floats(client.hgetall(keyspace.net_placed))
    backlog = _hash_floats(client.hgetall(keyspace.net_backlog))
    assignment: dict[str, str] = {}
    assignment_from = None
    reported_mode = None
    newest = -1.0
    for n, sample in samples.items():
        if sample.placement is not None and sample.t > newest:
            newest = sample.t
            assignment = dict(sample.placement.assignment)
            assignment_from = n
            reported_mode = sample.placement.mode
    placement = PlacementView(
        mode=placement_mode or reported_mode or "hash",
        sites=int(client.hlen(keyspace.sites)),
        placed=len(placed),
        placed_cost=sum(placed.values()),
        backlog_sites=len(backlog),
        backlog=sum(backlog.values()),
        planner=_holder(client, keyspace.plan_gate),
        assignment=assignment,
        assignment_from=assignment_from,
    )
    return FleetView(
        prefix=keyspace.prefix,
        partitions=keyspace.partitions,
        server_time=now_ms / 1000,
        node_timeout_s=node_timeout_s,
        table_version=table.version,
        owned=keyspace.partitions - unowned,
        unowned=unowned,
        owned_by_dead=owned_by_dead,
        handover=len(handover_waits(client, keyspace, table, counts.leased)),
        queued=sum(counts.queued),
        leased=sum(counts.leased),
        dead=sum(counts.dead),
        finished=int(decode(client.get(keyspace.finished) or b"0")),
        rebalancing=_holder(client, keyspace.rebalance_lock),
        nodes=nodes,
        topics=tuple(
            TopicView(name, *acc)  # type: ignore[arg-type]
            for name, acc in sorted(topics.items())
        ),
        placement=placement,
        reaper=ReaperView(
            running_on=_holder(client, keyspace.reaper_lock),
            expired_leases=sum(counts.expired),
        ),
    )


# -- payloads and dead letters ----------------------------------------------------------


@dataclass(frozen=True)
class PayloadInfo:
    """What a stored payload says, as far as the JSON codec accepts it."""

    url: str | None
    method: str | None
    callback: str | None
    topic: str | None
    priority: int
    #: Why the codec refuses it (None: a request the crawl can run).
    error: str | None


def describe_payload(payload: str | None, codec: RequestCodec | None = None) -> PayloadInfo:
    """Read a payload with the project's codec, without a spider and without pickle.

    Callbacks are names the running spider resolves; here they are reported,
    not resolved, so a payload is checked with its callback names set aside.
    """
    if payload is None:
        return PayloadInfo(None, None, None, None, 0, "no payload stored")
    codec = codec or RequestCodec()
    try:
        # Any payload format (plain JSON, compact "2", compressed "Z"), long keys.
        raw = codec.payload_dict(payload)
    except MalformedPayload as exc:
        return PayloadInfo(None, None, None, None, 0, str(exc))
    callback = raw.get("callback")
    meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
    topic = meta.get("banker_topic") if isinstance(meta, dict) else None
    url = raw.get("url") if isinstance(raw.get("url"), str) else None
    method = raw.get("method") if isinstance(raw.get("method"), str) else None
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        priority = 0
    bare = {k: v for k, v in raw.items() if k not in ("callback", "errback")}
    error: str | None = None
    try:
        codec.decode(json.dumps(bare))
    except MalformedPayload as exc:
        error = str(exc)
    for name in ("callback", "errback"):
        value = raw.get(name)
        problem = None if value is None else method_name_problem(value)
        if problem is not None:
            error = error or f"{name} {value!r} {problem}"
    return PayloadInfo(
        url=url,
        method=method,
        callback=callback if isinstance(callback, str) else None,
        topic=topic if isinstance(topic, str) else None,
        priority=priority,
        error=error,
    )


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


def _letter(partition: int, index: int, raw: Any, codec: RequestCodec) -> DeadLetter:
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
            out.append(_letter(p, i, raw, codec))
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
        registry = _registry(client, keyspace, node_timeout_s)
        table = registry.load_table()
        ready: dict[str, list[int]] = {}
        for letter, _ in requeued:
            owner = table.owners[letter.partition]
            if owner is not None:
                ready.setdefault(owner, []).append(letter.partition)
        registry.notify(ready)
        logger.info("Requeued %d dead letters of %r", len(requeued), keyspace.prefix)
    return RequeueResult(tuple(requeued), tuple(skipped))


# -- one URL ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    """One copy of a request found in its partition."""

    id: str
    #: ``queued``, ``leased`` or ``dead``.
    state: str
    #: Queued: requests ahead of it in the partition's queue.
    ahead: int | None = None
    #: Leased: deliveries so far and seconds until the lease expires (< 0: expired).
    deliveries: int | None = None
    expires_in_s: float | None = None
    #: Dead: why.
    reason: str | None = None
    #: What its payload says (topic, callback...).
    payload: PayloadInfo | None = None
    #: Leased: the partition epoch it was leased under (its owner then).
    epoch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "ahead": self.ahead,
            "deliveries": self.deliveries,
            "expires_in_s": _round(self.expires_in_s),
            "reason": self.reason,
            "epoch": self.epoch,
            "topic": None if self.payload is None else self.payload.topic,
            "callback": None if self.payload is None else self.payload.callback,
        }


@dataclass(frozen=True)
class Explanation:
    """Where one URL is in the crawl, and why it waits if it does."""

    url: str
    fingerprint: str
    topic: str
    #: How the topic was found: from a stored copy's meta, or by the rules.
    topic_source: str
    slot: str
    queue_key: str
    key_hash: int
    hash_function: str
    #: Bucket of the single-node directory (a JOBDIR's), None without one.
    bucket: int | None
    partition: int
    owner: str | None
    owner_alive: bool
    owner_epoch: int
    seen: bool
    copies: tuple[Copy, ...]
    #: ``queued``, ``leased``, ``dead``, ``done`` (seen, nothing left) or ``unknown``.
    state: str
    #: One sentence: why it waits (None when it does not wait).
    waiting: str | None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "explain",
            "url": self.url,
            "fingerprint": self.fingerprint,
            "topic": self.topic,
            "topic_source": self.topic_source,
            "slot": self.slot,
            "queue_key": self.queue_key,
            "key_hash": self.key_hash,
            "hash_function": self.hash_function,
            "bucket": self.bucket,
            "partition": self.partition,
            "owner": self.owner,
            "owner_alive": self.owner_alive,
            "owner_epoch": self.owner_epoch,
            "seen": self.seen,
            "state": self.state,
            "copies": [c.to_json() for c in self.copies],
            "waiting": self.waiting,
            "notes": list(self.notes),
        }


def _find_copies(
    client: Client, keyspace: Keyspace, partition: int, fingerprint: str, url: str,
    now_ms: int, codec: RequestCodec,
) -> list[Copy]:  # fmt: skip
    """Every queued, leased and dead copy of the request in its partition.

    Ids are sequence numbers (``enqueue.lua``), so a copy is found by the URL
    its payload names: the partition's level lists are read 1,000 entries
    per round trip, in the order they will be popped (that order is the
    ``ahead`` count).  A partition holds its share of the crawl (1/1,024 of
    it by default) and this runs when an operator asks, never in a crawl.
    The old layout's ids, ``<fingerprint>:<seq>``, are found by ``ZSCAN MATCH``.
    """
    k = keyspace.partition(partition)
    legacy = f"{fingerprint}:"

    def mine(copy_id: str, payload: PayloadInfo) -> bool:
        return copy_id.startswith(legacy) or payload.url == url

    found: list[Copy] = []
    ahead = 0
    queued: list[tuple[str, PayloadInfo, int]] = []
    for level in client.zrange(k.levels, 0, -1):
        key = k.level(decode(level))
        start = 0
        while True:
            page = client.lrange(key, start, start + _PAGE - 1)
            for j, item in enumerate(page):
                copy_id, _, text = decode(item, lossy=True).partition(" ")
                if url in text or text[:1] == "Z":  # cheap filter before decoding
                    info = describe_payload(text, codec)
                    if mine(copy_id, info):
                        queued.append((copy_id, info, ahead + start + j))
            start += len(page)
            if len(page) < _PAGE:
                break
        ahead += start
    pattern = f"{fingerprint}:*"
    old = [decode(m) for m, _ in client.zscan_iter(k.queue, match=pattern, count=1000)]
    held: Any = client.zrange(k.leases, 0, -1, withscores=True)
    leases = [(decode(m), float(score)) for m, score in held]
    pipe = client.pipeline(transaction=False)
    for i in old:
        pipe.hget(k.payloads, i)
        pipe.zrank(k.queue, i)
    for i, _ in leases:
        pipe.hget(k.payloads, i)
    answers = pipe.execute()
    for n, i in enumerate(old):
        raw, rank = answers[2 * n], answers[2 * n + 1]
        info = describe_payload(None if raw is None else decode(raw, lossy=True), codec)
        queued.append((i, info, ahead + (0 if rank is None else int(rank))))
    leased: list[tuple[str, PayloadInfo, float]] = []
    for (i, score), raw in zip(leases, answers[2 * len(old) :], strict=True):
        info = describe_payload(None if raw is None else decode(raw, lossy=True), codec)
        if mine(i, info):
            leased.append((i, info, score))
    ids = [i for i, _, _ in queued] + [i for i, _, _ in leased]
    if ids:
        pipe = client.pipeline(transaction=False)
        for i in ids:
            pipe.hget(k.meta, f"d:{i}")  # deliveries, as pop.lua counts them
        for i, _, _ in leased:
            pipe.hget(k.meta, f"e:{i}")  # the epoch it was leased under (pop.lua)
        answers = pipe.execute()
        counts = answers[: len(ids)]
        deliveries = {
            i: 0 if d is None else int(decode(d)) for i, d in zip(ids, counts, strict=True)
        }
        epochs = answers[len(ids) :]
        for i, info, position in queued:
            found.append(Copy(i, "queued", ahead=position, deliveries=deliveries[i],
                              payload=info))  # fmt: skip
        for (i, info, score), epoch in zip(leased, epochs, strict=True):
            found.append(Copy(i, "leased", deliveries=deliveries[i],
                              expires_in_s=(score - now_ms) / 1000, payload=info,
                              epoch=None if epoch is None else int(decode(epoch))))  # fmt: skip
    for index, raw in enumerate(client.lrange(k.dead, 0, -1)):
        letter = _letter(partition, index, raw, codec)
        if letter.id is not None and mine(letter.id, letter.payload):
            found.append(Copy(letter.id, "dead", deliveries=letter.deliveries,
                              reason=letter.reason, payload=letter.payload))  # fmt: skip
    return found


def _slot_full(sample: Sample | None, slot: str) -> str | None:
    if sample is None:
        return None
    for s in sample.slots:
        if s.slot == slot and s.inflight >= s.limit:
            return (
                f"{sample.node}'s download slot for {slot} is full "
                f"({s.inflight}/{s.limit} in flight, {s.queued} more waiting there)"
            )
    return None


def _preempted(sample: Sample | None, topic: str, priority: Callable[[str], int]) -> str | None:
    if sample is None:
        return None
    mine = priority(topic)
    busy = [
        (priority(name), name, t.queued + t.inflight)
        for name, t in sample.topics.items()
        if name != topic and priority(name) > mine and t.queued + t.inflight > 0
    ]
    if not busy:
        return None
    prio, name, n = max(busy)
    return (
        f"topic {topic} (priority {mine}) is preempted on {sample.node} by topic {name} "
        f"(priority {prio}, {n} requests queued or in flight there)"
    )


def _parked(sample: Sample | None) -> str | None:
    if sample is None or sample.banker is None or not sample.banker.parked:
        return None
    b = sample.banker
    short = {r: n for r, n in b.available.items() if b.need.get(r, 0) > n}
    what = ", ".join(f"{r}: {n} available, {b.need[r]} still claimed" for r, n in short.items())
    return (
        f"{sample.node}'s admission gate parks {b.parked} requests whose grant would leave "
        f"an unsafe state" + (f" ({what})" if what else "")
    )


def _why_waiting(
    copy: Copy,
    *,
    partition: int,
    owner: str | None,
    owner_alive: bool,
    owner_age_s: float | None,
    node_timeout_s: float,
    busy: int,
    sample: Sample | None,
    slot: str,
    topic: str,
    priority: Callable[[str], int],
    leased_in_partition: int,
    owner_epoch: int,
    holder: str | None,
) -> str | None:
    """One sentence from the state just read, most decisive reason first."""
    if copy.state == "dead":
        return (
            f"it is dead-lettered ({copy.reason}); nothing fetches it until it is requeued "
            "(scrapy banker deadletters --requeue)"
        )
    if copy.state == "leased":
        left = copy.expires_in_s or 0.0
        if left < 0:
            return (
                f"its lease expired {-left:.1f} s ago (delivery {copy.deliveries}): the "
                "reaper's next round gives it back to the queue or dead-letters it"
            )
        if copy.epoch is not None and copy.epoch != owner_epoch:
            return (
                f"it was leased at epoch {copy.epoch}, before partition {partition} moved to "
                f"{owner} (epoch {owner_epoch}): {holder or 'the previous owner'} is fetching "
                f"it, and {owner} pops nothing from the partition until it is acked or the "
                f"lease expires (in {left:.1f} s unless renewed)"
            )
        return (
            f"it is leased to {owner} (delivery {copy.deliveries}), being fetched or "
            f"buffered there; the lease expires in {left:.1f} s unless renewed"
        )
    if owner is None:
        return f"partition {partition} has no owner: no live worker has taken it (none running?)"
    if not owner_alive:
        age = "never" if owner_age_s is None else f"{owner_age_s:.1f} s ago"
        return (
            f"its owner {owner} is not live (last heartbeat {age}, timeout "
            f"{node_timeout_s:g} s): the partition waits for a live worker to rebalance it"
        )
    if busy:
        return (
            f"partition {partition} is in hand-over to {owner}, which pops nothing until the "
            f"previous owner's {busy} leases are acked or expire (BUSY fence)"
        )
    for reason in (_slot_full(sample, slot), _preempted(sample, topic, priority), _parked(sample)):
        if reason is not None:
            return reason
    ahead = copy.ahead or 0
    tail = "" if sample is not None else f" ({owner} publishes no telemetry)"
    if ahead:
        return (
            f"{ahead} requests are ahead of it in partition {partition}, which {owner} works "
            f"through ({leased_in_partition} leased now){tail}"
        )
    return f"it is next in partition {partition}: {owner} pops it on its next refill{tail}"


def explain_url(
    client: Client,
    keyspace: Keyspace,
    request: Request,
    *,
    fingerprint: str,
    config: BankerConfig,
    node_timeout_s: float = 30.0,
    bucket: int | None = None,
    codec: RequestCodec | None = None,
) -> Explanation:
    """Classify ``request`` like the crawl does and find it in Redis.

    ``fingerprint`` is the hex fingerprint of Scrapy's request fingerprinter
    (the one the crawl's enqueue script deduplicates on); ``bucket`` the
    single-node directory bucket, when the caller has a directory to ask.
    """
    # Imported here: the classifier pulls in Scrapy's downloader, which the
    # dashboard's read path does not need.
    from scrapy_banker.scheduler.classifier import Classifier
    from scrapy_banker.scheduler.downloader import DownloaderView

    codec = codec or RequestCodec()
    classifier = Classifier(config, DownloaderView(), None)
    had_topic = "banker_topic" in request.meta
    c = classifier.classify(request)
    partition = c.key_hash % keyspace.partitions
    registry = _registry(client, keyspace, node_timeout_s)
    table = registry.load_table()
    owner = table.owners[partition]
    now_ms = _now_ms(client)
    k = keyspace.partition(partition)
    pipe = client.pipeline(transaction=False)
    pipe.sismember(k.seen, fingerprint)
    pipe.zcard(k.leases)
    if owner is not None:
        pipe.zscore(keyspace.heartbeats, owner)
        pipe.hexists(keyspace.nodes, owner)
    answers = pipe.execute()
    # Seen by the exact set, or by the Bloom filter (BANKER_DEDUP = "bloom"):
    # whichever the crawl wrote, as its enqueue script checks both.
    seen = bool(answers[0]) or in_bloom(client, keyspace, partition, fingerprint)
    leased_now = int(answers[1])
    owner_age_s: float | None = None
    owner_alive = False
    if owner is not None:
        beat, registered = answers[2], answers[3]
        if beat is not None:
            owner_age_s = max(0.0, (now_ms - float(beat)) / 1000)
            owner_alive = bool(registered) and owner_age_s <= node_timeout_s
    copies = _find_copies(client, keyspace, partition, fingerprint, request.url, now_ms, codec)
    notes: list[str] = []
    topic, topic_source = c.topic, "rules"
    stored = [cp.payload.topic for cp in copies if cp.payload and cp.payload.topic]
    if stored:
        topic, topic_source = stored[0], "stored request"
    elif not had_topic and any(rule.callback is not None for rule in config.topic_rules):
        notes.append(
            "topic from the URL rules only: the request's callback is unknown here, so "
            "callback rules were tried against Scrapy's default 'parse'"
        )
    busy = handover_waits(client, keyspace, table, [
        leased_now if p == partition else 0 for p in range(keyspace.partitions)
    ]).get(partition, 0)  # fmt: skip
    beats: Any = client.zrange(keyspace.heartbeats, 0, -1)
    samples = _telemetry(
        client, keyspace, sorted({decode(n) for n in beats} | {owner or ""} - {""})
    )
    sample = samples.get(owner) if owner is not None else None
    # Who holds a lease taken before a hand-over: the node whose telemetry
    # shows a request in flight in the URL's slot (None if nobody says so).
    holder = next(
        (n for n, sm in sorted(samples.items())
         if n != owner and any(s.slot == c.slot and s.inflight for s in sm.slots)),
        None,
    )  # fmt: skip
    state = "unknown"
    waiting: str | None = None
    for wanted in ("leased", "queued", "dead"):
        match = next((cp for cp in copies if cp.state == wanted), None)
        if match is not None:
            state = wanted
            waiting = _why_waiting(
                match,
                partition=partition,
                owner=owner,
                owner_alive=owner_alive,
                owner_age_s=owner_age_s,
                node_timeout_s=node_timeout_s,
                busy=busy,
                sample=sample,
                slot=c.slot,
                topic=topic,
                priority=config.topic_priority,
                leased_in_partition=leased_now,
                owner_epoch=table.epochs[partition],
                holder=holder,
            )
            break
    if state == "unknown" and seen:
        state = "done"
    if len(copies) > 1:
        notes.append(f"{len(copies)} copies found (dont_filter requests or redeliveries)")
    return Explanation(
        url=request.url,
        fingerprint=fingerprint,
        topic=topic,
        topic_source=topic_source,
        slot=c.slot,
        queue_key=c.key,
        key_hash=c.key_hash,
        hash_function=config.queue_hash,
        bucket=bucket,
        partition=partition,
        owner=owner,
        owner_alive=owner_alive,
        owner_epoch=table.epochs[partition],
        seen=seen,
        copies=tuple(copies),
        state=state,
        waiting=waiting,
        notes=tuple(notes),
    )
