"""Redis side of network-aware placement: publish measurements, apply plans.

Runs on the :class:`~scrapy_banker.redis.worker.FrontierWorker` thread, once
per heartbeat, so the reactor never waits on Redis:

* sites seen by the scheduler are published as ``{prefix}:sites``
  (partition -> netloc) and ``{prefix}:schemes`` (netloc -> scheme);
* this node's denoised measurements go to ``{prefix}:net:rtt:{node}`` and
  ``{prefix}:net:bw:{node}`` (netloc -> ms / bytes/s), its storage bandwidth
  BS (the patent's standard 100 KB object written three times) to
  ``{prefix}:net:bs``;
* a ``hungarian`` plan records each placed partition's cost on its owner in
  ``{prefix}:net:placed``, so the next plan moves only what drifted;
* every ``BANKER_PLACEMENT_INTERVAL`` seconds one node (the first to take
  ``{prefix}:net:plan-gate``, which expires after the interval, then under
  the registry's rebalance lock) reads what the fleet measured and each
  site partition's backlog (published as ``{prefix}:net:backlog``, so that
  every prober measures the largest sites first), runs the
  :mod:`scrapy_banker.net.placement` strategy ``BANKER_PLACEMENT`` names and
  moves the partitions whose owner changed -- with new epochs, so the
  hand-over is fenced exactly like a rebalance.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.telemetry import PlacementSample
from scrapy_banker.net.netstats import LinkStats, storage_bandwidth
from scrapy_banker.net.partitions import Move, PartitionTable
from scrapy_banker.net.placement import Observations, PlacementProblem, PlacementResult, strategy
from scrapy_banker.redis.keys import Keyspace, decode

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

    from scrapy_banker.redis.frontier.registry import NodeRegistry
    from scrapy_banker.settings import PlacementConfig

logger = logging.getLogger(__name__)

__all__ = ["PlacementAgent"]


def _floats(raw: Mapping[Any, Any]) -> dict[str, float]:
    """Decode a Redis hash of numbers, skipping (not crashing on) garbage."""
    out: dict[str, float] = {}
    for key, value in raw.items():
        try:
            number = float(decode(value, lossy=True))
        except ValueError:
            continue
        if math.isfinite(number) and number >= 0:
            out[decode(key, lossy=True)] = number
    return out


class PlacementAgent:
    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        prefix: str | Keyspace,
        node: str,
        config: PlacementConfig,
        links: LinkStats,
        *,
        clock: Callable[[], float] = time.monotonic,
        backlog: Callable[[Iterable[int]], Mapping[int, int]] | None = None,
    ) -> None:
        self.client = client
        #: The crawl's key names (a bare prefix will do: placement keys are fleet-wide).
        self.keyspace = prefix if isinstance(prefix, Keyspace) else Keyspace(prefix)
        self.prefix = self.keyspace.prefix
        self.node = node
        self.config = config
        self.links = links
        self.clock = clock
        #: Requests queued or leased per partition (``RedisFrontier.backlog``): the
        #: partitions' sizes for topk and hungarian plans, and the probe order.
        self.backlog = backlog
        self.sites_key = self.keyspace.sites
        self.schemes_key = self.keyspace.schemes
        self.bs_key = self.keyspace.net_bs
        #: partition -> its cost when a hungarian plan placed it (for minimal-move re-plans).
        self.placed_key = self.keyspace.net_placed
        #: Held for one interval by the node that planned: one plan per interval
        #: fleet-wide, not one per node (a plan costs ~0.2 s of CPU with GNP).
        self.plan_key = self.keyspace.plan_gate
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[str, str]] = {}
        self._noted: set[int] = set()
        self._published: dict[str, dict[str, float]] = {}
        self._storage_done = False
        self._next_plan = 0.0
        self._replan = False
        #: netloc -> scheme of every site the fleet knows (read by the prober).
        self.known: dict[str, str] = {}
        #: netloc -> requests queued or leased for it at the last plan, fleet-wide
        #: (``{prefix}:net:backlog``): the prober measures the largest sites first.
        #: Replaced, never mutated, so the reactor thread can read it safely.
        self.backlogs: dict[str, float] = {}
        self.backlog_key = self.keyspace.net_backlog
        self.runs = 0
        #: The map of the latest plan this node made (telemetry); replaced whole.
        self.latest: PlacementSample | None = None

    def rtt_key(self, node: str) -> str:
        return self.keyspace.rtt(node)

    def bw_key(self, node: str) -> str:
        return self.keyspace.bw(node)

    # -- reactor thread ---------------------------------------------------------------

    def note_site(self, partition: int, site: str, scheme: str) -> None:
        """Remember which site a partition holds (first one wins, fleet-wide)."""
        if partition in self._noted:
            return
        with self._lock:
            self._noted.add(partition)
            self._pending[partition] = (site, scheme)

    # -- worker thread ----------------------------------------------------------------

    def beat(self, registry: NodeRegistry) -> list[Move]:
        """Publish, refresh the known sites, and plan when it is time; the moves made."""
        client = self.client
        with self._lock:
            pending, self._pending = self._pending, {}
        try:
            if pending:
                pipe = client.pipeline(transaction=False)
                for partition, (site, scheme) in pending.items():
                    pipe.hsetnx(self.sites_key, str(partition), site)
                    pipe.hsetnx(self.schemes_key, site, scheme)
                pipe.execute()
        except Exception:
            with self._lock:  # keep them for the next beat
                self._pending.update(pending)
            raise
        if not self._storage_done:
            self._measure_storage()
        self._publish()
        schemes = client.hgetall(self.schemes_key).items()
        self.known = {decode(k, lossy=True): decode(v, lossy=True) for k, v in schemes}
        backlogs = _floats(client.hgetall(self.backlog_key))
        if backlogs != self.backlogs:
            self.backlogs = backlogs
        if self.config.mode == "hash":
            return []
        now = self.clock()
        forced, self._replan = self._replan, False
        if not forced and now < self._next_plan:
            return []
        self._next_plan = now + self.config.interval
        interval_ms = int(self.config.interval * 1000)
        if interval_ms > 0:
            if forced:  # this node just rebalanced: its plan supersedes any gate
                client.set(self.plan_key, self.node, px=interval_ms)
            elif not client.set(self.plan_key, self.node, nx=True, px=interval_ms):
                return []  # another node planned less than an interval ago
        # registry.update passes on only the moves; the rest of the plan is kept
        # here, to be published once the table is written.
        planned: list[tuple[PlacementProblem, PlacementResult]] = []
        unsettled: list[bool] = []

        def change(table: PartitionTable, live: dict[str, float]) -> list[Move]:
            if {o for o in table.owners if o is not None} != set(live):
                # A node joined, left or missed its heartbeats and the rebalance
                # has not run yet: a plan over ``live`` alone would give every
                # site to the others while the table's other node keeps its
                # share of the rest.  The rebalance comes first; plan after it.
                unsettled.append(True)
                return []
            problem, result = self.plan(table, live)
            planned.append((problem, result))
            return table.assign({p: result.owners[p] for p in result.moves})

        moves = registry.update(self.node, change)
        if moves is None or unsettled:  # the table is busy or unsettled: retry next beat
            if interval_ms > 0:
                client.delete(self.plan_key)
            self._next_plan = now
            return []
        if planned:  # the plan just written to the table
            self._publish_plan(*planned[-1])
            self.latest = plan_sample(self.config.mode, *planned[-1])
        self.runs += 1
        if moves:
            logger.info("Placement (%s): %d partitions moved", self.config.mode, len(moves))
        return moves

    def replan(self) -> None:
        """Plan on the next beat, whatever the interval: the table was just rebalanced.

        A rebalance (a node joined or left) reassigns partitions by count,
        network-blind; left alone, placed sites would stay wherever it put
        them for up to an interval (10 s by default).
        """
        self._replan = True

    def _measure_storage(self) -> None:
        probe_key = self.keyspace.bs_probe(self.node)
        bs = storage_bandwidth(
            lambda blob: self.client.set(probe_key, blob, px=60_000),
            size=self.config.storage_probe_bytes,
        )
        self.client.delete(probe_key)
        self.client.hset(self.bs_key, self.node, repr(bs))
        self._storage_done = True
        logger.info("Storage bandwidth BS of node %s: %.0f bytes/s", self.node, bs)

    def _publish(self) -> None:
        snapshot = self.links.snapshot()
        rtt = {s: v["rtt_ms"] for s, v in snapshot.items() if v.get("n", 0) > 0}
        bw = {s: v["bw_Bps"] for s, v in snapshot.items() if v.get("bw_Bps", 0.0) > 0}
        changed_rtt = {s: ms for s, ms in rtt.items() if self._published.get(s, {}).get("r") != ms}
        changed_bw = {s: b for s, b in bw.items() if self._published.get(s, {}).get("b") != b}
        if not changed_rtt and not changed_bw:
            return
        pipe = self.client.pipeline(transaction=False)
        if changed_rtt:
            pipe.hset(self.rtt_key(self.node), mapping={s: repr(v) for s, v in changed_rtt.items()})
        if changed_bw:
            pipe.hset(self.bw_key(self.node), mapping={s: repr(v) for s, v in changed_bw.items()})
        pipe.execute()
        for s, ms in changed_rtt.items():
            self._published.setdefault(s, {})["r"] = ms
        for s, b in changed_bw.items():
            self._published.setdefault(s, {})["b"] = b

    def observations(self, live: Mapping[str, float]) -> Observations:
        client = self.client
        sites: dict[int, str] = {}
        for key, value in client.hgetall(self.sites_key).items():
            try:
                sites[int(decode(key, lossy=True))] = decode(value, lossy=True)
            except ValueError:
                logger.warning("Ignoring malformed entry %r in %s", key, self.sites_key)
        rtt = {node: _floats(client.hgetall(self.rtt_key(node))) for node in live}
        bw = {node: _floats(client.hgetall(self.bw_key(node))) for node in live}
        bs = _floats(client.hgetall(self.bs_key))
        return Observations(dict(live), sites, rtt, bw, bs)

    def plan(
        self, table: PartitionTable, live: Mapping[str, float]
    ) -> tuple[PlacementProblem, PlacementResult]:
        """Read this round's problem from Redis and the table, and solve it; writes nothing.

        Public for ``scrapy banker assign``, which shows the plan a beat would
        apply without applying it.
        """
        obs = self.observations(live)
        valid = {p: s for p, s in obs.sites.items() if 0 <= p < table.size}
        obs = Observations(obs.capacities, valid, obs.rtt_ms, obs.bw_Bps, obs.storage_Bps)
        placed: dict[int, float] | None = None
        if self.config.mode == "hungarian":
            placed = {}
            for key, cost in _floats(self.client.hgetall(self.placed_key)).items():
                if key.isdigit():
                    placed[int(key)] = cost
        problem = PlacementProblem(
            obs,
            current={p: table.owners[p] for p in valid},
            placed=placed or None,
            backlog=None if self.backlog is None else self.backlog(valid),
            k=self.config.topk,
            cost=self.config.cost,
            dims=self.config.dims,
            tolerance=self.config.tolerance,
        )
        chosen = strategy(self.config.mode, choice=self.config.topk_choice)
        return problem, chosen.place(problem)

    def _publish_plan(self, problem: PlacementProblem, result: PlacementResult) -> None:
        """After the table was written, so the placed costs are those of the owners in force."""
        if problem.site_backlog:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.backlog_key)
            pipe.hset(self.backlog_key, mapping={s: n for s, n in problem.site_backlog.items()})
            pipe.execute()
        if result.placed_costs:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.placed_key)
            pipe.hset(
                self.placed_key, mapping={str(p): repr(c) for p, c in result.placed_costs.items()}
            )
            pipe.execute()


def plan_sample(mode: str, problem: PlacementProblem, result: PlacementResult) -> PlacementSample:
    """The operator's map of one plan: GNP coordinates and site -> node.

    Coordinates come from the plan's own GNP fit when it made one (never a
    fit made for the picture); sites the plan could not place keep the owner
    they had.
    """
    est = problem.__dict__.get("estimate")  # the cached fit, if the strategy made one
    nodes: dict[str, list[float]] = {}
    sites: dict[str, list[float]] = {}
    if est is not None:
        nodes = {n: [round(x, 3) for x in xs] for n, xs in est.node_coords.items()}
        sites = {s: [round(x, 3) for x in xs] for s, xs in est.site_coords.items()}
    assignment: dict[str, str] = {}
    for partition, site in problem.observations.sites.items():
        owner = result.owners.get(partition) or problem.current.get(partition)
        if owner is not None:
            assignment[site] = owner
    return PlacementSample(mode, nodes, sites, assignment)
