"""The operator's read model of a fleet: what ``scrapy banker status`` and the dashboard show.

One call, :func:`read_fleet`, reads a crawl's fleet at one instant: the
nodes (heartbeat, capacity, telemetry), the partition table (owners,
hand-overs), per partition the requests queued, leased and dead-lettered,
the topics the live nodes report, placement and the reaper -- and, when
asked (``scrapy banker status``), the pages kept for revisits
(:func:`read_fleet_revisits`, :setting:`BANKER_RECRAWL`).  Everything is
read from Redis through the crawl's own names
(:class:`~scrapy_banker.redis.keys.Keyspace`,
:class:`~scrapy_banker.redis.frontier.registry.NodeRegistry`), so the view can never
drift from what the workers write.  The functions are plain blocking calls
on a redis-py client: the commands call them directly, the dashboard from a
Twisted thread.  Nothing here writes: ``GET``/``HGET``/``ZCARD``/``LLEN``-style
reads in pipelines -- no script, no lock, no key touched.

The other fleet read models build on this one's reads (:func:`node_registry`,
:func:`read_telemetry`, :func:`handover_waits`, :func:`server_time_ms`):
the dead letters (:mod:`scrapy_banker.ops.fleet_deadletters`, which can
also requeue) and one URL's whereabouts (:mod:`scrapy_banker.ops.explanation`).

Each view has ``to_json()``; the schemas (documented in
``docs/ops/commands.rst``) carry :data:`SCHEMA_VERSION` at their top level
and only grow: fields are added, never renamed or removed without bumping
the version.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.core.telemetry import Sample, sample_from_dict
from scrapy_banker.ops.revisits_view import RevisitsView, RevisitTally
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.link import FrontierLink
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.frontier.revisit_states import RevisitStates
from scrapy_banker.redis.keys import EPOCH_LEASES, QUEUED, Keyspace, decode

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    import redis
    from redis.cluster import RedisCluster

    from scrapy_banker.net.partitions import PartitionTable

    Client = redis.Redis | RedisCluster

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEMA_VERSION",
    "FleetView",
    "NodeView",
    "PartitionCounts",
    "PlacementView",
    "ReaperView",
    "TopicView",
    "count_partitions",
    "handover_waits",
    "node_registry",
    "read_fleet",
    "read_fleet_revisits",
    "read_telemetry",
    "revisit_states",
    "round_or_none",
    "server_time_ms",
]

#: Version of every ``to_json()`` schema of the fleet read models: this
#: module's, :mod:`~scrapy_banker.ops.fleet_deadletters`' and
#: :mod:`~scrapy_banker.ops.explanation`'s.
SCHEMA_VERSION = 1
#: Partitions counted per pipeline (4 commands each).
_CHUNK = 256


def round_or_none(x: float | None, digits: int = 3) -> float | None:
    """``x`` rounded for a JSON view (None stays None)."""
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
    #: Requests held over a budget (``lua/charge.lua``), per partition.
    over: tuple[int, ...] = ()


def server_time_ms(client: Client) -> int:
    """The Redis server's clock in milliseconds: the clock leases and heartbeats use."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def count_partitions(client: Client, keyspace: Keyspace, chunk: int = _CHUNK) -> PartitionCounts:
    """Count every partition with plain reads (``HGET``, ``ZCARD``, ``LLEN``, ``ZCOUNT``).

    Not atomic across partitions -- a request may be counted twice or not at
    all while it moves -- which is fine for a view; the crawl's own drain
    check (:meth:`RedisFrontier.census`) is the exact one.
    """
    now = server_time_ms(client)
    queued: list[int] = []
    leased: list[int] = []
    dead: list[int] = []
    expired: list[int] = []
    over: list[int] = []
    size = max(1, chunk)
    for start in range(0, keyspace.partitions, size):
        pipe = client.pipeline(transaction=False)
        for p in range(start, min(keyspace.partitions, start + size)):
            k = keyspace.partition(p)
            pipe.hget(k.meta, QUEUED.name)
            pipe.zcard(k.leases)
            pipe.llen(k.dead)
            pipe.zcount(k.leases, "-inf", now)
            pipe.llen(k.over)
        answers = [int(n or 0) for n in pipe.execute()]
        queued += answers[0::5]
        leased += answers[1::5]
        dead += answers[2::5]
        expired += answers[3::5]
        over += answers[4::5]
    return PartitionCounts(
        tuple(queued), tuple(leased), tuple(dead), tuple(expired), now, tuple(over)
    )


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
            "heartbeat_age_s": round_or_none(self.heartbeat_age_s),
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
            "placed_cost": round_or_none(self.placed_cost, 6),
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
    #: Requests held over a budget (kept, fetched if a budget is raised).
    over_budget: int = 0
    #: The pages kept for revisits (None: none kept, or not read).
    revisits: RevisitsView | None = None

    @property
    def exists(self) -> bool:
        """Whether anything of this crawl is in Redis (a wrong prefix finds nothing)."""
        return bool(
            self.table_version or self.nodes or self.queued or self.leased or self.dead
            or self.finished or self.revisits is not None
        )  # fmt: skip

    @property
    def live_nodes(self) -> tuple[NodeView, ...]:
        return tuple(n for n in self.nodes if n.alive)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
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
                "over_budget": self.over_budget,
                "finished": self.finished,
                "nodes": len(self.nodes),
                "live_nodes": len(self.live_nodes),
            },
            "nodes": [n.to_json() for n in self.nodes],
            "topics": [t.to_json() for t in self.topics],
            "placement": self.placement.to_json(),
            "reaper": self.reaper.to_json(),
        }
        if self.revisits is not None:
            out["revisits"] = self.revisits.to_json()
        return out


def node_registry(client: Client, keyspace: Keyspace, node_timeout_s: float) -> NodeRegistry:
    """The crawl's node registry (table, heartbeats, wake-ups), as a worker builds it."""
    frontier = RedisFrontier(client, prefix=keyspace.prefix, partitions=keyspace.partitions)
    return NodeRegistry(client, frontier, node_timeout_ms=max(1, int(node_timeout_s * 1000)))


def revisit_states(client: Client, keyspace: Keyspace) -> RevisitStates:
    """The crawl's revisit states (``BANKER_RECRAWL``), as its workers keep them."""
    return RevisitStates(FrontierLink.of(client, keyspace))


def read_fleet_revisits(client: Client, keyspace: Keyspace, now: float) -> RevisitsView | None:
    """The pages the fleet keeps for revisits, as of ``now`` (None: none kept).

    Every partition's states, streamed (:meth:`RevisitStates.iter_states
    <scrapy_banker.redis.frontier.revisit_states.RevisitStates.iter_states>`)
    into the JOBDIR view's sums (:class:`~scrapy_banker.ops.revisits_view.RevisitTally`);
    a state that does not read counts as ``malformed``.
    """
    tally = RevisitTally(now)
    for _, _, text in revisit_states(client, keyspace).iter_states(range(keyspace.partitions)):
        try:
            state = UrlState.from_text(text)
        except ValueError:
            tally.malformed += 1
            continue
        tally.add(state)
    return tally.view()


def read_telemetry(client: Client, keyspace: Keyspace, nodes: Iterable[str]) -> dict[str, Sample]:
    """Node -> its latest published sample (none for a node without one, or unreadable)."""
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
        pipe.hget(keyspace.partition(p).meta, EPOCH_LEASES.of(table.epochs[p]))
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
    revisits: bool = False,
) -> FleetView:
    """The fleet now: nodes, table, totals, topics, placement, reaper.

    ``node_timeout_s`` is ``BANKER_REDIS_NODE_TIMEOUT`` (what makes a node
    live); ``placement_mode`` is ``BANKER_PLACEMENT`` if the caller knows it.
    A few dozen round trips for 1,024 partitions; writes nothing.  With
    ``revisits`` the pages kept for revisits are read too
    (:func:`read_fleet_revisits`, on the server's clock): every state, so
    ``scrapy banker status`` asks for them and the dashboard's refreshes do not.
    """
    registry = node_registry(client, keyspace, node_timeout_s)
    counts = count_partitions(client, keyspace)
    now_ms = counts.now_ms
    table = registry.load_table()
    capacities = {decode(n): float(decode(c)) for n, c in client.hgetall(keyspace.nodes).items()}
    scored: Any = client.zrange(keyspace.heartbeats, 0, -1, withscores=True)
    beats = {decode(n): float(score) for n, score in scored}
    names = sorted(set(capacities) | set(beats) | {o for o in table.owners if o is not None})
    timeout_ms = node_timeout_s * 1000
    alive = {n for n, beat in beats.items() if now_ms - beat <= timeout_ms and n in capacities}
    samples = read_telemetry(client, keyspace, names)
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
        over_budget=sum(counts.over),
        revisits=read_fleet_revisits(client, keyspace, now_ms / 1000) if revisits else None,
    )
