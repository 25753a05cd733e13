"""Network-aware placement of site partitions onto crawler nodes.

The distributed frontier hashes URLs into logical partitions and gives each
live node a share of them (:mod:`scrapy_banker.partitions`).  Hashing is
network-blind: a site in Singapore is as likely to go to the node in Paris
as to the one in Tokyo.  This module turns what the fleet measured into an
owner for every partition whose site is known:

* :func:`estimate_rtt` -- node x site RTTs: measured where a node has
  fetched or probed the site (denoised), GNP-predicted elsewhere.  Nodes
  cannot measure each other at the application level, so the coordinates
  come from the one-way node x site matrix (:func:`scrapy_banker.gnp.fit_bipartite`):
  landmark nodes probe every site, the others a few reference sites.
* :func:`plan` -- ``top1`` (the nearest node), ``topk`` (among the k
  nearest, for load balance: the least loaded, heaviest partitions first,
  or the GNP paper's uniform Top3 draw), or ``hungarian``
  (batched Hungarian with hard per-node targets on a latency cost or on
  the patent's ``(tasks + 1) / (BC + BS)`` bandwidth cost).

Pure: numpy/scipy only; the Redis adapter is :mod:`scrapy_banker.redis.placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scrapy_banker import assignment, gnp

FloatArray = npt.NDArray[np.float64]

__all__ = ["CHOICES", "COSTS", "MODES", "Estimate", "Observations", "estimate_rtt", "moved", "plan"]

MODES = ("hash", "top1", "topk", "hungarian")
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


def plan(
    obs: Observations,
    mode: str,
    *,
    k: int = 3,
    cost: str = "latency",
    current: Mapping[int, str | None] | None = None,
    dims: int = 3,
    seed: int = 0,
    tolerance: float = 0.1,
    placed: Mapping[int, float] | None = None,
    placed_out: dict[int, float] | None = None,
    choice: str = "least_loaded",
    backlog: Mapping[int, int] | None = None,
) -> dict[int, str]:
    """Owner for every partition whose site has an estimate for every live node.

    ``current`` (partition -> owner) keeps plans stable, because every move
    fences the partition's leases and measurements are noisy: ``top1``
    keeps the current owner while its cost is within ``tolerance`` of the
    cheapest; ``topk`` keeps it while it is one of the ``k`` cheapest (the
    current owner of a never-placed partition is the hash owner, itself a
    uniform random choice, so this is still the paper's Top-K random pick)
    with ``choice="random"``; with ``"least_loaded"`` (the default) ``topk``
    places partitions heaviest first (``backlog``: requests queued or
    leased per partition, plus one, which also weighs each partition's
    cost in a ``hungarian`` solve) onto the least-loaded of their k
    cheapest nodes, see
    :func:`scrapy_banker.assignment.assign_top_k_least_loaded`, keeping the
    current owner while it is a candidate and keeping does not make it the
    busiest node by more than ``tolerance``;
    ``hungarian`` keeps the whole current assignment if it is balanced and
    at most ``tolerance`` dearer in total, else re-solves.  With ``placed``
    (partition -> its cost when a previous ``hungarian`` plan placed it, as
    filled into ``placed_out``, which a kept current table does not fill) a
    re-plan is :func:`scrapy_banker.assignment.reassign`: placed partitions
    stay unless their owner left, is over its target or drifted by more
    than ``tolerance``; the rest (still where hashing put them) are solved
    for.  Without ``current`` the choice is seeded by the partition number,
    not by the order sites were discovered.
    """
    if mode not in MODES:
        raise ValueError(f"unknown placement mode {mode!r}: use one of {', '.join(MODES)}")
    if choice not in CHOICES:
        raise ValueError(f"unknown top-k choice {choice!r}: use one of {', '.join(CHOICES)}")
    if cost not in COSTS:
        raise ValueError(f"unknown placement cost {cost!r}: use one of {', '.join(COSTS)}")
    if mode == "hash" or not obs.capacities or not obs.sites:
        return {}
    est = estimate_rtt(obs, dims=dims, seed=seed)
    known = np.asarray(np.isfinite(est.rtt_ms).all(axis=0), dtype=bool)
    if not known.any():
        return {}
    col = {s: j for j, s in enumerate(est.sites)}
    parts = sorted(p for p, s in obs.sites.items() if known[col[s]])
    site_cost = est.rtt_ms.T  # (sites, nodes)
    if cost == "bandwidth":
        bw = _bandwidth_cost(obs, est)
        if bw is not None:
            site_cost = bw.T
    base = np.array([site_cost[col[obs.sites[p]]] for p in parts], dtype=np.float64)
    nodes = est.nodes
    index = {n: i for i, n in enumerate(nodes)}
    cur = [index.get((current or {}).get(p) or "", -1) for p in parts]
    capacities = np.array([float(obs.capacities[n]) for n in nodes])
    # Partition sizes (backlog + 1), when known: least-loaded topk places the
    # heaviest first, and hungarian minimises RTT x pages rather than RTT per
    # partition -- a balanced plan otherwise gives the largest site a far node
    # as readily as the smallest.
    sizes = (
        None if backlog is None else np.array([1.0 + max(0, int(backlog.get(p, 0))) for p in parts])
    )
    if mode == "top1":
        out: dict[int, str] = {}
        for p, row, c in zip(parts, base, cur, strict=True):
            best = int(np.argmin(row))
            keep = c >= 0 and row[c] <= (1.0 + tolerance) * row[best]
            out[p] = nodes[c if keep else best]
        return out
    if mode == "topk" and choice == "least_loaded":
        owners = assignment.assign_top_k_least_loaded(
            base,
            np.ones(len(parts)) if sizes is None else sizes,
            k,
            capacities=capacities,
            current=np.array(cur, dtype=np.int64),
            tolerance=tolerance,
            seed=seed,
        )
        return {p: nodes[int(o)] for p, o in zip(parts, owners, strict=True)}
    if mode == "topk":
        out = {}
        for p, row, c in zip(parts, base, cur, strict=True):
            cheapest = np.argsort(row, kind="stable")[: max(1, k)]
            if c >= 0 and c in cheapest:
                out[p] = nodes[c]
            else:
                out[p] = nodes[assignment.top_k(row, k, np.random.default_rng([seed, p]))]
        return out
    # Up to EXACT_MAX partitions, one batch without the load factor is the exact
    # balanced optimum (targets hold as hard slot counts); the batched heuristic
    # (90 ms per site against the exact 73 ms on the fleet test's layout) is kept for more.
    # Drift (placed costs) stays per partition: a site's size is not its link.
    solve_cost = base if sizes is None else base * sizes[:, None]
    exact = len(parts) <= EXACT_MAX
    batch = max(1, len(parts)) if exact else None
    weight = 0.0 if exact and cost == "latency" else 1.0  # the patent cost keeps (tasks + 1)
    if placed is not None:
        kept = np.array(
            [c if c >= 0 and p in placed else -1 for p, c in zip(parts, cur, strict=True)],
            dtype=np.int64,
        )
        was = np.array([float(placed.get(p, 0.0)) for p in parts], dtype=np.float64)
        owners, _ = assignment.reassign(
            base,
            kept,
            capacities,
            tolerance=tolerance,
            placed_cost=np.nan_to_num(was),
            batch=batch,
            load_weight=weight,
            weights=sizes,
        )
    else:
        owners = assignment.assign_batched(solve_cost, capacities, batch=batch, load_weight=weight)
        if current and all(c >= 0 for c in cur):
            targets = assignment.targets(len(parts), capacities, len(nodes))
            counts = np.bincount(np.array(cur, dtype=np.int64), minlength=len(nodes))
            old_total = float(sum(solve_cost[r, c] for r, c in enumerate(cur)))
            new_total = float(solve_cost[np.arange(len(parts)), owners].sum())
            if (counts <= targets).all() and old_total <= (1.0 + tolerance) * new_total:
                # Kept, not placed: nothing goes to placed_out, or the next rounds'
                # reassign would pin the network-blind hash placement for good.
                return {p: nodes[c] for p, c in zip(parts, cur, strict=True)}
    if placed_out is not None:
        placed_out.update(
            {p: float(base[r, int(o)]) for r, (p, o) in enumerate(zip(parts, owners, strict=True))}
        )
    return {p: nodes[int(o)] for p, o in zip(parts, owners, strict=True)}


def moved(before: Mapping[int, str | None], after: Mapping[int, str]) -> int:
    """How many partitions ``after`` gives to a different node than ``before``."""
    return sum(1 for p, node in after.items() if before.get(p) != node)
