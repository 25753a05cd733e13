"""Network-aware placement of site partitions onto crawler nodes.

The distributed frontier hashes URLs into logical partitions and gives each
live node a share of them (:mod:`scrapy_banker.net.partitions`).  Hashing is
network-blind: a site in Singapore is as likely to go to the node in Paris
as to the one in Tokyo.  This module turns what the fleet measured into an
owner for every partition whose site is known:

* :func:`estimate_rtt` -- node x site RTTs: measured where a node has
  fetched or probed the site (denoised), GNP-predicted elsewhere.  Nodes
  cannot measure each other at the application level, so the coordinates
  come from the one-way node x site matrix (:func:`scrapy_banker.net.gnp.fit_bipartite`):
  landmark nodes probe every site, the others a few reference sites.
* :class:`PlacementProblem` -- one round's inputs and the steps every
  strategy shares (the estimate, the partition x node cost matrix, the
  partition sizes), computed once.
* The strategies, one class per ``BANKER_PLACEMENT`` mode in
  :data:`STRATEGIES`: :class:`Top1` (the nearest node), :class:`TopK`
  (among the k nearest, for load balance: the least loaded, heaviest
  partitions first, or the GNP paper's uniform Top3 draw),
  :class:`Hungarian` (batched Hungarian with hard per-node targets on a
  latency cost or on the patent's ``(tasks + 1) / (BC + BS)`` bandwidth
  cost) and :class:`Hash` (keep hashing).  Each returns a
  :class:`PlacementResult`.

Pure: numpy/scipy only; the Redis adapter is :mod:`scrapy_banker.redis.worker.placement_agent`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from scrapy_banker.net import assignment, gnp

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "CHOICES",
    "COSTS",
    "MODES",
    "STRATEGIES",
    "CostMatrix",
    "Estimate",
    "Hash",
    "Hungarian",
    "Observations",
    "PlacementProblem",
    "PlacementResult",
    "Strategy",
    "Top1",
    "TopK",
    "estimate_rtt",
    "moved",
    "strategy",
]

#: How ``topk`` picks among the k cheapest nodes.
CHOICES = ("least_loaded", "random")
#: Site partitions up to which a hungarian plan is solved exactly (one
#: partitions x slots assignment, ~0.05 s at 1,024); batched beyond.
EXACT_MAX = 1024
COSTS = ("latency", "bandwidth")


@dataclass(frozen=True)
class Observations:
    """What the fleet knows, as read from Redis (all plain mappings)."""

    #: Live nodes and their capacities (relative shares).
    capacities: Mapping[str, float]
    #: Partition -> the site (netloc) whose requests it holds.
    sites: Mapping[int, str]
    #: node -> site -> denoised RTT in ms (httpping / download latency).
    rtt_ms: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: node -> site -> crawl bandwidth BC in bytes/s.
    bw_Bps: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: node -> storage bandwidth BS in bytes/s.
    storage_Bps: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Estimate:
    nodes: list[str]
    sites: list[str]
    #: (nodes, sites) RTT in ms; NaN where neither measured nor predictable.
    rtt_ms: FloatArray
    measured: npt.NDArray[np.bool_]
    #: GNP coordinates of the nodes and sites the fit placed (empty when no fit
    #: was needed or possible): kept for the operator's map, not for planning.
    node_coords: dict[str, list[float]] = field(default_factory=dict)
    site_coords: dict[str, list[float]] = field(default_factory=dict)


def estimate_rtt(obs: Observations, *, dims: int = 3, seed: int = 0) -> Estimate:
    """Measured RTT where there is one, GNP prediction elsewhere, NaN if unknown.

    A node needs ``dims + 1`` measured sites and a site ``dims`` measuring
    nodes before the embedding places it (a site is usually measured by the
    landmarks plus the node crawling it); with fewer, its missing pairs
    stay NaN and the planner leaves such partitions where they are.
    """
    nodes = sorted(obs.capacities)
    sites = sorted(set(obs.sites.values()))
    m = np.full((len(nodes), len(sites)), np.nan)
    col = {s: j for j, s in enumerate(sites)}
    for i, node in enumerate(nodes):
        for site, ms in obs.rtt_ms.get(node, {}).items():
            j = col.get(site)
            if j is not None and np.isfinite(ms) and ms >= 0:
                m[i, j] = float(ms)
    measured = np.isfinite(m)
    est = m.copy()
    if measured.all() or not measured.any():
        return Estimate(nodes, sites, est, measured)
    rows = measured.sum(axis=1) >= dims + 1
    cols = measured.sum(axis=0) >= max(2, dims)
    if rows.sum() >= 2 and cols.sum() >= dims + 1:
        sub = m[np.ix_(rows, cols)]
        # Fewer dimensions than nodes: a fit with more would be underdetermined.
        d = max(1, min(dims, int(rows.sum()) - 1))
        a, b = gnp.fit_bipartite(sub, dims=d, seed=seed)
        pred = gnp.distances(a.coords, b.coords)
        block = est[np.ix_(rows, cols)]
        est[np.ix_(rows, cols)] = np.where(np.isfinite(block), block, pred)
        fitted_nodes = [n for n, keep in zip(nodes, rows, strict=True) if keep]
        fitted_sites = [s for s, keep in zip(sites, cols, strict=True) if keep]
        return Estimate(
            nodes, sites, est, measured,
            dict(zip(fitted_nodes, a.coords.tolist(), strict=True)),
            dict(zip(fitted_sites, b.coords.tolist(), strict=True)),
        )  # fmt: skip
    return Estimate(nodes, sites, est, measured)


def _bandwidth_cost(obs: Observations, est: Estimate) -> FloatArray | None:
    """The patent's per-task ``1 / (BC_ij + BS_i)``; BC predicted from RTT where unmeasured.

    Unmeasured crawl bandwidth is extrapolated as ``k / RTT`` -- a window-
    limited TCP transfer -- with ``k`` the median of ``BC x RTT`` over the
    measured pairs.  None when nothing was measured.
    """
    n, s = est.rtt_ms.shape
    bc = np.full((n, s), np.nan)
    col = {site: j for j, site in enumerate(est.sites)}
    for i, node in enumerate(est.nodes):
        for site, bps in obs.bw_Bps.get(node, {}).items():
            j = col.get(site)
            if j is not None and np.isfinite(bps) and bps > 0:
                bc[i, j] = float(bps)
    product = bc * est.rtt_ms
    ok = np.isfinite(product) & (product > 0)
    if not ok.any():
        return None
    k = float(np.median(product[ok]))
    predicted = k / np.maximum(est.rtt_ms, gnp.MIN_RTT_MS)
    bc = np.where(np.isfinite(bc), bc, predicted)
    bs = np.array([float(obs.storage_Bps.get(node, 0.0)) for node in est.nodes])
    total = bc + bs[:, None]
    return np.asarray(1.0 / np.maximum(total, 1e-9), dtype=np.float64)


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}: use one of {', '.join(allowed)}")


@dataclass(frozen=True)
class CostMatrix:
    """What every strategy needs, derived once per round from the observations."""

    #: The partitions a plan can place: their site has an estimate for every live node.
    parts: list[int]
    #: Live nodes, the columns of ``base`` (sorted, as in :class:`Estimate`).
    nodes: list[str]
    #: (parts, nodes) cost of one partition per node: RTT in ms, or the
    #: patent's ``1 / (BC + BS)`` with ``cost="bandwidth"`` when BC was measured.
    base: FloatArray
    #: Index in ``nodes`` of each partition's current owner; -1 if it has none
    #: or the owner is not live.
    current: IntArray
    capacities: FloatArray
    #: ``backlog + 1`` per partition; None when the backlog is unknown.
    sizes: FloatArray | None


@dataclass(frozen=True)
class PlacementResult:
    """One plan: every strategy returns this instead of filling caller-owned mappings."""

    #: partition -> its node, for every partition the plan could place.
    owners: dict[int, str]
    #: partition -> its cost on its owner, for the partitions a ``hungarian``
    #: plan placed: what the next round's ``placed`` needs to move only what
    #: drifted.  Empty for the other modes, and when a plan kept the current
    #: table (recording a kept hash placement would pin it for good).
    placed_costs: dict[int, float] = field(default_factory=dict)
    #: The partitions in ``owners`` whose owner differs from the problem's
    #: ``current``, ascending: what the caller must hand over (and fence).
    moves: tuple[int, ...] = ()


@dataclass(frozen=True)
class PlacementProblem:
    """One planning round's inputs, shared by every strategy.

    ``current`` (partition -> owner) keeps plans stable, because every move
    fences the partition's leases and measurements are noisy: each strategy
    keeps an owner while it is good enough by its own rule, within
    ``tolerance``.  Without ``current`` a random choice is seeded by the
    partition number, not by the order sites were discovered.  ``placed``
    (partition -> its cost when a previous ``hungarian`` plan placed it,
    from :attr:`PlacementResult.placed_costs`) turns a ``hungarian``
    re-plan into a minimal-move :func:`scrapy_banker.net.assignment.reassign`;
    ``None`` and an empty mapping differ there (no memory vs nothing placed
    yet).  ``backlog`` is the requests queued or leased per partition.
    """

    observations: Observations
    current: Mapping[int, str | None] = field(default_factory=dict)
    placed: Mapping[int, float] | None = None
    backlog: Mapping[int, int] | None = None
    #: Candidates per partition for ``topk``.
    k: int = 3
    #: ``"latency"`` or ``"bandwidth"`` (:data:`COSTS`).
    cost: str = "latency"
    #: GNP dimensions of the estimate.
    dims: int = 3
    #: Seeds the GNP fit and every random pick, so all nodes plan alike.
    seed: int = 0
    #: How much worse than the best a current owner may be and still keep its
    #: partition (each strategy's own measure): moves fence leases, and
    #: measurements are noisy.
    tolerance: float = 0.1

    def __post_init__(self) -> None:
        _check(self.cost, COSTS, "placement cost")

    @cached_property
    def estimate(self) -> Estimate:
        """The RTT estimate: a GNP fit costs ~0.2 s, so one per round whatever the strategy."""
        return estimate_rtt(self.observations, dims=self.dims, seed=self.seed)

    @cached_property
    def matrix(self) -> CostMatrix | None:
        """The placeable partitions and their costs; None when no partition can be placed.

        Partitions whose site lacks an estimate for some live node stay
        where they are: the planner cannot compare nodes for them.
        """
        obs = self.observations
        if not obs.capacities or not obs.sites:
            return None
        est = self.estimate
        known = np.asarray(np.isfinite(est.rtt_ms).all(axis=0), dtype=bool)
        if not known.any():
            return None
        col = {s: j for j, s in enumerate(est.sites)}
        parts = sorted(p for p, s in obs.sites.items() if known[col[s]])
        site_cost = est.rtt_ms.T  # (sites, nodes)
        if self.cost == "bandwidth":
            bw = _bandwidth_cost(obs, est)
            if bw is not None:
                site_cost = bw.T
        base = np.array([site_cost[col[obs.sites[p]]] for p in parts], dtype=np.float64)
        index = {n: i for i, n in enumerate(est.nodes)}
        cur = np.array([index.get(self.current.get(p) or "", -1) for p in parts], dtype=np.int64)
        capacities = np.array([float(obs.capacities[n]) for n in est.nodes])
        # Partition sizes (backlog + 1), when known: least-loaded topk places the
        # heaviest first, and hungarian minimises RTT x pages rather than RTT per
        # partition -- a balanced plan otherwise gives the largest site a far node
        # as readily as the smallest.
        backlog = self.backlog
        sizes = (
            None
            if backlog is None
            else np.array([1.0 + max(0, int(backlog.get(p, 0))) for p in parts])
        )
        return CostMatrix(parts, est.nodes, base, cur, capacities, sizes)

    @cached_property
    def site_backlog(self) -> dict[str, int]:
        """Requests queued or leased per site: probers measure the largest sites first."""
        per_site: dict[str, int] = {}
        for p, n in (self.backlog or {}).items():
            site = self.observations.sites[p]
            per_site[site] = per_site.get(site, 0) + int(n)
        return per_site

    def result(
        self, owners: IntArray, placed_costs: dict[int, float] | None = None
    ) -> PlacementResult:
        """Name the owners (indices into the matrix's nodes) and list the moves."""
        matrix = self.matrix
        assert matrix is not None  # strategies only solve a placeable problem
        named = {p: matrix.nodes[int(o)] for p, o in zip(matrix.parts, owners, strict=True)}
        moves = tuple(p for p, node in named.items() if self.current.get(p) != node)
        return PlacementResult(named, placed_costs or {}, moves)


class Strategy(ABC):
    """One ``BANKER_PLACEMENT`` mode: a problem in, a result out, no state kept between rounds."""

    #: The mode's name in :data:`STRATEGIES` and ``BANKER_PLACEMENT``.
    name: ClassVar[str]

    @classmethod
    def create(cls, *, choice: str = "least_loaded") -> Strategy:
        """The strategy for the settings; ``choice`` matters to ``topk`` only."""
        return cls()

    def place(self, problem: PlacementProblem) -> PlacementResult:
        """Owners for the partitions that can be placed; an empty result if none can."""
        matrix = problem.matrix
        if matrix is None:
            return PlacementResult({})
        return self._solve(problem, matrix)

    @abstractmethod
    def _solve(self, problem: PlacementProblem, matrix: CostMatrix) -> PlacementResult: ...


class Hash(Strategy):
    """Network-blind: the hash placement stays, so nothing is estimated or moved."""

    name = "hash"

    def place(self, problem: PlacementProblem) -> PlacementResult:
        """Empty, without asking for the problem's matrix: hashing needs no GNP fit."""
        return PlacementResult({})

    def _solve(self, problem: PlacementProblem, matrix: CostMatrix) -> PlacementResult:
        return PlacementResult({})  # not reached: place() never builds the matrix


class Top1(Strategy):
    """The cheapest node, keeping the current owner while within ``tolerance`` of it.

    No load balance: a region with many sites loads its nearest node.  The
    tolerance stops two nearly equidistant nodes from trading a partition
    back and forth on noisy measurements.
    """

    name = "top1"

    def _solve(self, problem: PlacementProblem, matrix: CostMatrix) -> PlacementResult:
        owners = np.empty(len(matrix.parts), dtype=np.int64)
        for r, (row, c) in enumerate(zip(matrix.base, matrix.current, strict=True)):
            best = int(np.argmin(row))
            keep = c >= 0 and row[c] <= (1.0 + problem.tolerance) * row[best]
            owners[r] = c if keep else best
        return problem.result(owners)


@dataclass(frozen=True)
class TopK(Strategy):
    """One of the ``k`` cheapest nodes, for load balance; ``choice`` says which.

    ``"least_loaded"`` places partitions heaviest first (by backlog) onto
    the least-loaded candidate, see
    :func:`scrapy_banker.net.assignment.assign_top_k_least_loaded`, keeping the
    current owner while it is a candidate and keeping does not make it the
    busiest node by more than ``tolerance``: crawl sites are Zipf-sized and
    the paper's uniform draw sends the largest to a far node two times in
    three.  ``"random"`` is that draw (seeded by the partition number),
    keeping an owner that is already one of the ``k`` cheapest: the hash
    owner is itself a uniform random choice, so this is still the paper's
    Top-K pick, with fewer moves.
    """

    name: ClassVar[str] = "topk"
    choice: str = "least_loaded"

    def __post_init__(self) -> None:
        _check(self.choice, CHOICES, "top-k choice")

    @classmethod
    def create(cls, *, choice: str = "least_loaded") -> Strategy:
        return cls(choice)

    def _solve(self, problem: PlacementProblem, matrix: CostMatrix) -> PlacementResult:
        if self.choice == "least_loaded":
            owners = assignment.assign_top_k_least_loaded(
                matrix.base,
                np.ones(len(matrix.parts)) if matrix.sizes is None else matrix.sizes,
                problem.k,
                capacities=matrix.capacities,
                current=matrix.current,
                tolerance=problem.tolerance,
                seed=problem.seed,
            )
            return problem.result(owners)
        owners = np.empty(len(matrix.parts), dtype=np.int64)
        rows = zip(matrix.parts, matrix.base, matrix.current, strict=True)
        for r, (p, row, c) in enumerate(rows):
            cheapest = np.argsort(row, kind="stable")[: max(1, problem.k)]
            if c >= 0 and c in cheapest:
                owners[r] = c
            else:
                rng = np.random.default_rng([problem.seed, p])
                owners[r] = assignment.top_k(row, problem.k, rng)
        return problem.result(owners)


class Hungarian(Strategy):
    """Balanced assignment with hard per-node targets proportional to capacity.

    Without ``placed`` the current table is kept whole if it is balanced
    and at most ``tolerance`` dearer in total than a fresh solve, else
    replaced.  With ``placed`` a re-plan is
    :func:`scrapy_banker.net.assignment.reassign`: placed partitions stay unless
    their owner left, is over its target or drifted by more than
    ``tolerance``; the rest (still where hashing put them) are solved for.
    Partitions are weighted by size (``backlog + 1``) when the backlog is
    known.
    """

    name = "hungarian"

    def _solve(self, problem: PlacementProblem, matrix: CostMatrix) -> PlacementResult:
        parts, base, cur, sizes = matrix.parts, matrix.base, matrix.current, matrix.sizes
        # Up to EXACT_MAX partitions, one batch without the load factor is the exact
        # balanced optimum (targets hold as hard slot counts); the batched heuristic
        # (90 ms per site against the exact 73 ms on the fleet test's layout) is kept
        # for more.  Drift (placed costs) stays per partition: a site's size is not its link.
        solve_cost = base if sizes is None else base * sizes[:, None]
        exact = len(parts) <= EXACT_MAX
        batch = max(1, len(parts)) if exact else None
        weight = 0.0 if exact and problem.cost == "latency" else 1.0  # the patent keeps (tasks + 1)
        placed = problem.placed
        if placed is not None:
            kept = np.array(
                [c if c >= 0 and p in placed else -1 for p, c in zip(parts, cur, strict=True)],
                dtype=np.int64,
            )
            was = np.array([float(placed.get(p, 0.0)) for p in parts], dtype=np.float64)
            owners, _ = assignment.reassign(
                base,
                kept,
                matrix.capacities,
                tolerance=problem.tolerance,
                placed_cost=np.nan_to_num(was),
                batch=batch,
                load_weight=weight,
                weights=sizes,
            )
        else:
            owners = assignment.assign_batched(
                solve_cost, matrix.capacities, batch=batch, load_weight=weight
            )
            if problem.current and (cur >= 0).all():
                n_nodes = len(matrix.nodes)
                targets = assignment.targets(len(parts), matrix.capacities, n_nodes)
                counts = np.bincount(cur, minlength=n_nodes)
                old_total = float(sum(solve_cost[r, c] for r, c in enumerate(cur)))
                new_total = float(solve_cost[np.arange(len(parts)), owners].sum())
                tolerated = old_total <= (1.0 + problem.tolerance) * new_total
                if (counts <= targets).all() and tolerated:
                    # Kept, not placed: no placed costs, or the next rounds' reassign
                    # would pin the network-blind hash placement for good.
                    return problem.result(cur)
        chosen = enumerate(zip(parts, owners, strict=True))
        return problem.result(owners, {p: float(base[r, int(o)]) for r, (p, o) in chosen})


#: Mode name -> strategy class, in the order the settings error lists them.
STRATEGIES: Mapping[str, type[Strategy]] = {cls.name: cls for cls in (Hash, Top1, TopK, Hungarian)}
#: ``BANKER_PLACEMENT``'s allowed values.
MODES = tuple(STRATEGIES)


def strategy(mode: str, *, choice: str = "least_loaded") -> Strategy:
    """The strategy for ``BANKER_PLACEMENT`` / ``BANKER_PLACEMENT_TOPK_CHOICE``.

    ``choice`` is checked whatever the mode, so a typo fails at once rather
    than when someone switches to ``topk``.
    """
    _check(mode, MODES, "placement mode")
    _check(choice, CHOICES, "top-k choice")
    return STRATEGIES[mode].create(choice=choice)


def moved(before: Mapping[int, str | None], after: Mapping[int, str]) -> int:
    """How many partitions ``after`` gives to a different node than ``before``."""
    return sum(1 for p, node in after.items() if before.get(p) != node)
