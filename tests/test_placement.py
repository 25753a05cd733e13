"""Network-aware placement: the pure planner, and a real fleet under WAN emulation."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import redis
from conftest import PLANETLAB, farm_fixture

from scrapy_banker.net import gnp, placement
from scrapy_banker.net.partitions import PartitionTable
from scrapy_banker.net.placement import (
    MODES,
    STRATEGIES,
    Hash,
    Hungarian,
    Observations,
    PlacementProblem,
    PlacementResult,
    Top1,
    TopK,
    estimate_rtt,
    moved,
    strategy,
)
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.settings import DEFAULTS, load_placement_config
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer


def world(
    nodes: int = 6, sites: int = 40, seed: int = 0, coverage: float = 0.15
) -> tuple[Observations, np.ndarray, list[str], list[str]]:
    """Nodes and sites on a plane; even nodes are landmarks that measured every site."""
    rng = np.random.default_rng(seed)
    true = gnp.distances(rng.uniform(0, 200, (nodes, 2)), rng.uniform(0, 200, (sites, 2))) + 2
    names = [f"n{i}" for i in range(nodes)]
    snames = [f"s{j:02d}.test:80" for j in range(sites)]
    rtt: dict[str, dict[str, float]] = {}
    for i, n in enumerate(names):
        rtt[n] = {
            s: float(true[i, j] * rng.lognormal(0, 0.03))
            for j, s in enumerate(snames)
            if i % 2 == 0 or j < 6 or rng.random() < coverage
        }
    obs = Observations(
        capacities=dict.fromkeys(names, 1.0),
        sites={100 + j: s for j, s in enumerate(snames)},
        rtt_ms=rtt,
    )
    return obs, true, names, snames


def paid(assigned: dict[int, str], true: np.ndarray, names: list[str]) -> float:
    return float(np.mean([true[names.index(node), p - 100] for p, node in assigned.items()]))


def place(
    obs: Observations, mode: str, choice: str = "least_loaded", **params: Any
) -> PlacementResult:
    """One round of the ``mode`` strategy; ``params`` are :class:`PlacementProblem`'s."""
    return strategy(mode, choice=choice).place(PlacementProblem(obs, **params))


def owners(
    obs: Observations, mode: str, choice: str = "least_loaded", **params: Any
) -> dict[int, str]:
    return place(obs, mode, choice, **params).owners


def test_unmeasured_pairs_are_predicted_by_gnp() -> None:
    obs, true, _, _ = world()
    est = estimate_rtt(obs, dims=2)
    missing = ~est.measured
    assert missing.sum() > 50  # most odd-node pairs were never measured
    assert np.isfinite(est.rtt_ms).all()
    err = gnp.relative_errors(est.rtt_ms[missing], true[missing])
    assert np.median(err) < 0.15
    # Measured values are kept as measured.
    i, j = 0, 5
    assert est.rtt_ms[i, j] == obs.rtt_ms["n0"][est.sites[j]]


def test_modes_beat_random_and_hungarian_balances() -> None:
    obs, true, names, _ = world(seed=3)
    random_cost = float(true.mean())
    best = float(true.min(axis=0).mean())
    top1 = owners(obs, "top1", dims=2)
    top3 = owners(obs, "topk", k=3, dims=2)
    hung = owners(obs, "hungarian", dims=2)
    assert len(top1) == len(top3) == len(hung) == 40
    assert paid(top1, true, names) <= best * 1.3  # GNP picks a near-best node
    assert paid(top1, true, names) < 0.6 * random_cost
    assert paid(top3, true, names) < random_cost
    assert paid(hung, true, names) < random_cost
    counts = np.bincount([names.index(n) for n in hung.values()], minlength=6)
    assert counts.max() - counts.min() <= 1  # equal capacities: equal shares
    # topk only ever picks among the 3 cheapest estimates.
    est = estimate_rtt(obs, dims=2)
    for p, node in top3.items():
        j = est.sites.index(obs.sites[p])
        assert node in {est.nodes[i] for i in np.argsort(est.rtt_ms[:, j])[:3]}


def test_plans_are_stable_and_hungarian_keeps_a_good_enough_table() -> None:
    obs, _, _, _ = world(seed=5)
    assert owners(obs, "topk", dims=2, seed=1) == owners(obs, "topk", dims=2, seed=1)
    first = owners(obs, "hungarian", dims=2)
    # Noise-level drift: the current table is kept, nothing moves.
    jittered = Observations(
        obs.capacities,
        obs.sites,
        {n: {s: v * 1.01 for s, v in m.items()} for n, m in obs.rtt_ms.items()},
    )
    again = place(jittered, "hungarian", dims=2, current=first)
    assert moved(first, again.owners) == 0
    assert again.moves == () and again.placed_costs == {}
    # A node leaves: only what it owned (plus rebalancing surplus) moves.
    gone = "n1"
    caps = {n: c for n, c in obs.capacities.items() if n != gone}
    after = place(Observations(caps, obs.sites, obs.rtt_ms), "hungarian", dims=2, current=first)
    assert gone not in after.owners.values()
    assert moved(first, after.owners) >= sum(1 for n in first.values() if n == gone)
    assert len(after.moves) == moved(first, after.owners)


def _two_sites(r0: tuple[float, float, float], r1: tuple[float, float, float]) -> Observations:
    """Three nodes that all measured both sites: no GNP prediction involved."""
    names = ("a", "b", "c")
    return Observations(
        capacities=dict.fromkeys(names, 1.0),
        sites={0: "s0.test:80", 1: "s1.test:80"},
        rtt_ms={n: {"s0.test:80": r0[i], "s1.test:80": r1[i]} for i, n in enumerate(names)},
    )


def test_top1_moves_only_when_the_gain_beats_the_tolerance() -> None:
    obs = _two_sites((100.0, 105.0, 300.0), (100.0, 150.0, 300.0))
    assert owners(obs, "top1") == {0: "a", 1: "a"}
    # b is 5 % dearer than a for s0 (kept, noise), 50 % dearer for s1 (moved).
    kept = place(obs, "top1", current={0: "b", 1: "b"}, tolerance=0.1)
    assert kept.owners == {0: "b", 1: "a"}
    assert kept.moves == (1,) and kept.placed_costs == {}
    assert owners(obs, "top1", current={0: "b", 1: "b"}, tolerance=0.0) == {0: "a", 1: "a"}
    # An owner that is no longer live is replaced.
    assert owners(obs, "top1", current={0: "gone", 1: None}) == {0: "a", 1: "a"}


def test_random_topk_keeps_an_owner_among_the_k_cheapest_and_replaces_others() -> None:
    obs = _two_sites((10.0, 20.0, 30.0), (30.0, 20.0, 10.0))
    # c is among the 2 cheapest for s1 (kept) but the dearest for s0 (moved to a or b).
    got = owners(obs, "topk", "random", k=2, current={0: "c", 1: "c"})
    assert got[1] == "c" and got[0] in {"a", "b"}
    for seed in range(20):
        kept = place(obs, "topk", "random", k=2, seed=seed, current={0: "b", 1: "b"})
        assert kept.owners == {0: "b", 1: "b"}
        assert kept.moves == ()


def test_least_loaded_topk_keeps_an_owner_only_within_the_tolerance() -> None:
    obs = _two_sites((10.0, 10.5, 30.0), (30.0, 20.0, 10.0))
    # Both idle nodes: each site goes to its cheapest candidate...
    assert owners(obs, "topk", k=2) == {0: "a", 1: "c"}
    # ...but b, 5 % dearer for s0, is kept there (noise); for s1 it is 2x dearer: moved.
    assert owners(obs, "topk", k=2, current={0: "b", 1: "b"}) == {0: "b", 1: "c"}
    assert owners(obs, "topk", k=2, current={0: "b", 1: "b"}, tolerance=0.0) == {0: "a", 1: "c"}


def _zipf_world() -> tuple[Observations, dict[int, int]]:
    """Node a is nearest to every site; one site holds most of the work."""
    names = ("a", "b", "c", "d")
    sites = {p: f"s{p}.test:80" for p in range(12)}
    rtt = {n: {s: 50.0 + 40.0 * i + p for p, s in sites.items()} for i, n in enumerate(names)}
    obs = Observations(dict.fromkeys(names, 1.0), sites, rtt)
    backlog = {p: 2 for p in sites}
    backlog[7] = 200  # the dominant site
    return obs, backlog


def test_least_loaded_topk_puts_the_heaviest_site_on_its_nearest_node_and_spreads_the_rest() -> (
    None
):
    obs, backlog = _zipf_world()
    got = owners(obs, "topk", k=3, backlog=backlog)
    assert got[7] == "a"
    # a is busy with the big site: the light ones go to the other two candidates.
    assert all(got[p] in {"b", "c"} for p in got if p != 7)
    assert {got[p] for p in got if p != 7} == {"b", "c"}
    # The paper's uniform draw puts the big site on a far node for most seeds.
    far = sum(
        owners(obs, "topk", "random", k=3, seed=seed, backlog=backlog)[7] != "a"
        for seed in range(30)
    )
    assert far > 10
    # Without backlog every partition weighs one: the 3 nearest share the time
    # (sum of RTTs), not the count -- the nearer a node, the more sites it takes.
    even = owners(obs, "topk", k=3)
    assert set(even.values()) == {"a", "b", "c"}
    load = {n: sum(obs.rtt_ms[n][obs.sites[p]] for p, v in even.items() if v == n) for n in "abc"}
    assert max(load.values()) - min(load.values()) <= 150.0  # at most one site's cost apart
    counts = [sum(1 for v in even.values() if v == n) for n in "abc"]
    assert counts[0] > counts[2]


def test_least_loaded_topk_replans_move_little_while_backlogs_drain() -> None:
    rng = np.random.default_rng(4)
    names = [f"n{i}" for i in range(5)]
    sites = {p: f"s{p}.test:80" for p in range(60)}
    rtt = {n: {s: float(rng.uniform(20, 300)) for s in sites.values()} for n in names}
    obs = Observations(dict.fromkeys(names, 1.0), sites, rtt)
    backlog = {p: int(300 / (p + 1)) for p in sites}  # Zipf-sized
    first = owners(obs, "topk", k=3, backlog=backlog)
    total = 0
    current = first
    for _ in range(5):  # five plans while every queue drains a little
        backlog = {p: max(0, b - int(rng.integers(0, 4))) for p, b in backlog.items()}
        again = place(obs, "topk", k=3, backlog=backlog, current=current)
        assert len(again.moves) == moved(current, again.owners)
        total += moved(current, again.owners)
        current = again.owners
    assert current[0] == first[0]  # the dominant site never leaves its node
    assert total <= 6  # a few light partitions at most, over five re-plans
    fresh = moved(first, owners(obs, "topk", k=3, backlog=backlog))
    assert fresh > total + 5  # a plan from scratch on the drained backlogs reshuffles more


def test_hungarian_weighs_partitions_by_backlog_and_stays_balanced() -> None:
    obs, backlog = _zipf_world()
    # Every site prefers a over b over c over d by the same margins: unweighted,
    # which sites get a's 3 slots is a tie.  Weighted, the big site gets one.
    for current in ({}, {p: "d" for p in obs.sites}):
        got = owners(obs, "hungarian", backlog=backlog, current=current)
        assert got[7] == "a"
        counts = [sum(1 for v in got.values() if v == n) for n in "abcd"]
        assert counts == [3, 3, 3, 3]
    # Re-plans after placement: the backlog drains, nothing drifted, nothing moves.
    first = place(obs, "hungarian", backlog=backlog)
    placed = first.placed_costs
    drained = {p: n // 4 for p, n in backlog.items()}
    again = owners(obs, "hungarian", backlog=drained, current=first.owners, placed=placed)
    assert moved(first.owners, again) == 0
    # A site whose backlog grew is not "drifted": its link did not change.
    grown = {**drained, 3: 500}
    regrown = place(obs, "hungarian", backlog=grown, current=first.owners, placed=placed)
    assert moved(first.owners, regrown.owners) == 0


def test_plan_rejects_an_unknown_topk_choice() -> None:
    with pytest.raises(ValueError, match=r"unknown top-k choice 'best'.*least_loaded, random"):
        strategy("topk", choice="best")
    with pytest.raises(ValueError, match=r"unknown top-k choice 'best'.*least_loaded, random"):
        TopK("best")


@pytest.mark.parametrize("seed", [11, 12, 15])
def test_hungarian_replan_of_placed_partitions_moves_the_minimum_when_a_node_joins(
    seed: int,
) -> None:
    obs, _, names, _ = world(seed=seed)
    without = Observations(
        {n: c for n, c in obs.capacities.items() if n != "n5"}, obs.sites, obs.rtt_ms
    )
    planned = place(without, "hungarian", dims=2)
    first, placed = planned.owners, planned.placed_costs
    assert "n5" not in first.values() and placed.keys() == first.keys()
    assert all(v > 0 for v in placed.values())
    fresh = owners(obs, "hungarian", dims=2, current=first)  # no memory of what was placed
    replanned = place(obs, "hungarian", dims=2, current=first, placed=placed)
    replan, placed_again = replanned.owners, replanned.placed_costs
    counts = np.bincount([names.index(n) for n in replan.values()], minlength=6)
    assert counts.max() - counts.min() <= 1  # the newcomer gets its share ...
    before = np.bincount([names.index(n) for n in first.values()], minlength=6)
    lower = int(np.maximum(before - counts, 0).sum())  # surplus that must move
    assert lower <= moved(first, replan) <= lower + 2  # ... moving about that much
    assert moved(first, fresh) > moved(first, replan)  # a re-solve moves more
    # Nothing changed: nothing moves.
    assert moved(replan, owners(obs, "hungarian", dims=2, current=replan, placed=placed_again)) == 0


def test_a_kept_hash_placement_is_not_recorded_as_placed() -> None:
    """Regression: recording a kept hash table pinned it through every later reassign."""
    near = _two_sites((10.0, 10.5, 300.0), (10.5, 10.0, 300.0))
    hashed = {0: "b", 1: "a"}  # balanced and within the tolerance of the best
    kept = place(near, "hungarian", current=hashed)
    assert kept.owners == hashed
    assert kept.placed_costs == {}
    # Better measurements show a real gain: the plan moves, and is recorded.
    far = _two_sites((10.0, 100.0, 300.0), (100.0, 10.0, 300.0))
    got = place(far, "hungarian", current=hashed, placed=kept.placed_costs or None)
    assert got.owners == {0: "a", 1: "b"}
    assert got.placed_costs == {0: 10.0, 1: 10.0}


def test_hungarian_places_what_hashing_put_somewhere_even_with_placed_partitions() -> None:
    obs, true, names, _ = world(seed=4)
    hashed = {p: names[p % 6] for p in obs.sites}  # a network-blind start
    placed = {p: 1.0 for p in list(obs.sites)[:5]}  # only five were placed before
    got = owners(obs, "hungarian", dims=2, current=hashed, placed=placed)
    assert moved(hashed, got) > 10
    assert paid(got, true, names) < paid(hashed, true, names)


def test_bandwidth_cost_prefers_fast_links_and_storage() -> None:
    caps = {"a": 1.0, "b": 1.0}
    sites = {1: "x:80", 2: "y:80"}
    rtt = {"a": {"x:80": 50.0, "y:80": 50.0}, "b": {"x:80": 50.0, "y:80": 50.0}}
    bw = {"a": {"x:80": 9e6, "y:80": 1e6}, "b": {"x:80": 1e6, "y:80": 9e6}}
    obs = Observations(caps, sites, rtt, bw, {"a": 1e5, "b": 1e5})
    assert owners(obs, "hungarian", cost="bandwidth") == {1: "a", 2: "b"}
    assert owners(obs, "top1", cost="bandwidth") == {1: "a", 2: "b"}


def test_nothing_known_means_no_plan_and_bad_modes_fail() -> None:
    assert owners(Observations({"a": 1.0}, {}), "top1") == {}
    assert owners(Observations({"a": 1.0}, {1: "x"}), "top1") == {}  # never measured
    assert owners(Observations({"a": 1.0}, {1: "x"}, {"a": {"x": 5.0}}), "hash") == {}
    with pytest.raises(ValueError, match="unknown placement mode 'nearest'"):
        strategy("nearest")
    with pytest.raises(ValueError, match="unknown placement cost 'money'"):
        PlacementProblem(Observations({"a": 1.0}, {1: "x"}), cost="money")


def test_the_registry_names_one_strategy_class_per_mode() -> None:
    assert MODES == tuple(STRATEGIES) == ("hash", "top1", "topk", "hungarian")
    assert dict(STRATEGIES) == {"hash": Hash, "top1": Top1, "topk": TopK, "hungarian": Hungarian}
    for mode, cls in STRATEGIES.items():
        made = strategy(mode, choice="random")
        assert type(made) is cls and made.name == mode
    assert strategy("topk") == TopK("least_loaded")
    assert strategy("topk", choice="random") == TopK("random")


def test_one_problem_estimates_once_for_every_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    obs, backlog = _zipf_world()
    current = {p: "d" for p in obs.sites}
    fits: list[Observations] = []

    def counting(seen: Observations, **kwargs: Any) -> placement.Estimate:
        fits.append(seen)
        return estimate_rtt(seen, **kwargs)

    monkeypatch.setattr(placement, "estimate_rtt", counting)
    problem = PlacementProblem(obs, current=current, backlog=backlog)
    assert Hash().place(problem) == PlacementResult({})
    assert fits == []  # hashing needs no estimate
    results = {mode: strategy(mode).place(problem) for mode in ("top1", "topk", "hungarian")}
    assert len(fits) == 1
    assert problem.matrix is problem.matrix
    assert problem.site_backlog == {obs.sites[p]: n for p, n in backlog.items()}
    for mode, result in results.items():
        fresh = place(obs, mode, current=current, backlog=backlog)
        assert result == fresh
        assert result.moves == tuple(p for p, n in result.owners.items() if current[p] != n)
    assert results["top1"].placed_costs == results["topk"].placed_costs == {}
    assert results["hungarian"].placed_costs.keys() == results["hungarian"].owners.keys()
    with pytest.raises(dataclasses.FrozenInstanceError):
        results["top1"].owners = {}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("BANKER_PLACEMENT", "nearest", r"BANKER_PLACEMENT='nearest'.*hash, top1, topk"),
        ("BANKER_PLACEMENT_COST", "money", r"BANKER_PLACEMENT_COST='money'.*latency"),
        ("BANKER_PLACEMENT_TOPK", 0, r"BANKER_PLACEMENT_TOPK=0.*>= 1"),
        (
            "BANKER_PLACEMENT_TOPK_CHOICE",
            "uniform",
            r"BANKER_PLACEMENT_TOPK_CHOICE='uniform'.*least_loaded, random",
        ),
        ("BANKER_PROBE_PATH", "robots.txt", r"BANKER_PROBE_PATH='robots.txt'.*'/'"),
        ("BANKER_PROBE_RATE", -1, r"BANKER_PROBE_RATE=-1.*>= 0"),
        ("BANKER_NET_WINDOW", 2, r"BANKER_NET_WINDOW=2.*>= 3"),
    ],
)
def test_bad_placement_settings_fail_with_the_setting_name(
    name: str, value: Any, pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        load_placement_config({**DEFAULTS, name: value})


def test_table_assign_bumps_epochs_and_skips_no_ops() -> None:
    table = PartitionTable(8)
    table.rebalance({"a": 1.0, "b": 1.0})
    owner = table.owners[3]
    other = "b" if owner == "a" else "a"
    before = list(table.epochs)
    moves = table.assign({3: other, 4: table.owners[4] or "a"})
    assert [(m.partition, m.old, m.new) for m in moves] == [(3, owner, other)]
    assert table.epochs[3] == before[3] + 1 and table.epochs[4] == before[4]
    with pytest.raises(ValueError, match="partition 9 outside"):
        table.assign({9: "a"})


# ---------------------------------------------------------------- a real fleet

NODES = ("w0", "w1", "w2")
HOSTS = 12


def _wan_config(_: pytest.TempPathFactory) -> FarmConfig:
    # Three nodes far apart (Europe / US / Asia-like) and sites spread among them.
    rows = {"w0": 0, "w1": 120, "w2": 300}
    rng = np.random.default_rng(7)
    others = [c for c in range(490) if c not in rows.values()]
    cols = {i: int(c) for i, c in enumerate(rng.choice(others, size=HOSTS, replace=False))}
    return FarmConfig(
        seed=21,
        hosts=HOSTS,
        total_pages=360,
        rtt_matrix=str(PLANETLAB),
        node_rows=rows,
        host_columns=cols,
        latency_scale=1.0,
    )


wan_web = farm_fixture(_wan_config)


@pytest.fixture(scope="module")
def wan_farm(wan_web: WebFarm) -> tuple[WebFarm, np.ndarray]:
    """The WAN farm and its true node x host RTTs (ms)."""
    m = gnp.read_rtt_matrix(PLANETLAB)
    rows, cols = wan_web.config.node_rows, wan_web.config.host_columns
    true = np.array([[m[rows[n], cols[h]] for h in range(HOSTS)] for n in NODES])
    return wan_web, true


def _crawl_with_fleet(
    farm: WebFarm,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    placement: dict[str, Any],
    expect_moves: bool = True,
) -> tuple[PartitionTable, list[dict[str, Any]], dict[int, str]]:
    """Three real workers crawl the WAN-emulated farm; the last full table, stats, sites."""
    farm.reset()
    seeds = farm.start_urls()
    settings: dict[str, Any] = {
        "SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler",
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": redis_server.url,
        "BANKER_REDIS_PARTITIONS": 1024,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 1.5,
        "BANKER_REDIS_HEARTBEAT": 0.3,
        "BANKER_REDIS_NODE_TIMEOUT": 3.0,
        "BANKER_REDIS_LEASE_TTL": 3.0,
        "BANKER_REDIS_REAP_INTERVAL": 1.0,
        "CONCURRENT_REQUESTS": 8,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOADER_MIDDLEWARES": {"scrapy_banker.testing.wan.NodeHeaderMiddleware": 50},
        "BANKER_PLACEMENT_INTERVAL": 0.5,
        "BANKER_GNP_LANDMARK": True,
        "BANKER_GNP_DIMS": 2,
        "BANKER_PROBE_RATE": 30,
        "BANKER_PROBE_SAMPLES": 5,
        **placement,
    }
    workers = [
        FleetWorker(
            n, tmp_path, {"settings": {**settings, "BANKER_REDIS_NODE_ID": n}, "seeds": seeds}
        )
        for n in NODES
    ]
    # The table empties when the workers leave: keep the last one the whole
    # fleet shared.
    frontier = RedisFrontier(redis_client, prefix="banker:fleet", partitions=1024)
    registry = NodeRegistry(redis_client, frontier)
    table = None
    deadline = time.monotonic() + 180
    while any(w.proc.poll() is None for w in workers):
        assert time.monotonic() < deadline, "the crawl did not finish"
        current = registry.load_table()
        if set(current.owners) == set(NODES):
            table = current
        time.sleep(0.1)
    for w in workers:
        code = w.wait(5)
        assert code == 0, f"worker {w.name} exited with {code}:\n{w.log_tail()}"
    assert table is not None
    stats = [w.stats() for w in workers]
    fetches = farm.stats(urls=True)["fetches"]
    pages = {u: n for u, n in fetches.items() if not u.endswith("/robots.txt")}
    assert set(pages) == farm.expected_urls()
    assert all(n == 1 for n in pages.values()), "a page was fetched twice"
    probes = sum(n for u, n in fetches.items() if u.endswith("/robots.txt"))
    assert probes == sum(s.get("banker/net/probes", 0) for s in stats) > 0
    assert probes <= len(NODES) * HOSTS * 5  # BANKER_PROBE_SAMPLES per (node, site)
    if expect_moves:
        assert sum(s.get("banker/placement/moves", 0) for s in stats) > 0
    assert not any(s.get("banker/placement/errors") for s in stats)
    assert all(s.get("banker/net/samples", 0) > 0 for s in stats)
    sites = {int(k): v.decode() for k, v in redis_client.hgetall("banker:fleet:sites").items()}
    # A partition is represented by the first site hashed to it; with 1,024
    # partitions two of 12 hosts rarely share one.
    assert HOSTS - 2 <= len(sites) <= HOSTS
    # Storage bandwidth BS was measured by every node.
    assert set(redis_client.hgetall("banker:fleet:net:bs")) == {n.encode() for n in NODES}
    return table, stats, sites


@pytest.mark.slow
def test_fleet_moves_each_site_to_its_nearest_node(
    wan_farm: tuple[WebFarm, np.ndarray],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    farm, true = wan_farm
    host_of = {urlsplit(u).netloc: i for i, u in enumerate(farm.start_urls())}
    table, _, sites = _crawl_with_fleet(
        farm, redis_server, redis_client, tmp_path, {"BANKER_PLACEMENT": "top1"}
    )
    # The sites' partitions ended on the node nearest to them.  Measured
    # latency includes each process's own load (three crawlers share two
    # cores here), so a near-tie can go either way: most, not all.
    placed = {p: table.owners[p] for p in sites}
    nearest = {p: NODES[int(np.argmin(true[:, host_of[s]]))] for p, s in sites.items()}
    on_nearest = sum(placed[p] == nearest[p] for p in sites)
    assert on_nearest >= 0.75 * len(sites), (placed, nearest)
    paid = np.mean([true[NODES.index(placed[p]), host_of[s]] for p, s in sites.items()])
    assert paid < 0.6 * true.mean()  # hash placement pays the mean RTT


@pytest.mark.slow
@pytest.mark.parametrize("cost", ["latency", "bandwidth"])
def test_fleet_hungarian_balances_sites_and_loses_nothing(
    wan_farm: tuple[WebFarm, np.ndarray],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    cost: str,
) -> None:
    farm, true = wan_farm
    host_of = {urlsplit(u).netloc: i for i, u in enumerate(farm.start_urls())}
    table, stats, sites = _crawl_with_fleet(
        farm,
        redis_server,
        redis_client,
        tmp_path,
        {"BANKER_PLACEMENT": "hungarian", "BANKER_PLACEMENT_COST": cost},
        # The patent's 1 / (BC + BS) hardly depends on the site when the store is
        # a local Redis (BS >> BC): keeping a balanced hash placement is right.
        expect_moves=cost == "latency",
    )
    placed = {p: table.owners[p] for p in sites}
    counts = [sum(1 for n in placed.values() if n == node) for node in NODES]
    assert max(counts) - min(counts) <= 1, placed  # equal capacities: equal shares of sites
    recorded = {int(k) for k in redis_client.hgetall("banker:fleet:net:placed")}
    if sum(s.get("banker/placement/moves", 0) for s in stats):
        assert recorded == set(sites)  # costs kept for minimal-move re-plans
    else:
        assert recorded == set()  # a kept hash table is not pinned as "placed"
    if cost == "latency":
        # The balanced optimum pays 0.61x the mean RTT on this layout.
        paid = np.mean([true[NODES.index(placed[p]), host_of[s]] for p, s in sites.items()])
        assert paid < 0.8 * true.mean(), (paid, true.mean())


@pytest.mark.slow
def test_fleet_least_loaded_topk_gives_the_largest_sites_their_nearest_node(
    wan_farm: tuple[WebFarm, np.ndarray],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    farm, true = wan_farm
    urls = farm.start_urls()  # host 0 is the largest (Zipf), host 1 the second
    host_of = {urlsplit(u).netloc: i for i, u in enumerate(urls)}
    table, _, sites = _crawl_with_fleet(
        farm,
        redis_server,
        redis_client,
        tmp_path,
        {"BANKER_PLACEMENT": "topk", "BANKER_PLACEMENT_TOPK": 2},
    )
    part_of = {host_of[s]: p for p, s in sites.items()}
    for host in (0, 1):  # 120 and 62 of the 360 pages; 2-101 ms vs 27-146 ms away
        nearest = NODES[int(np.argmin(true[:, host]))]
        assert table.owners[part_of[host]] == nearest, (host, nearest, table.owners[part_of[host]])
    # Only ever one of each site's 2 nearest nodes (the third is >= 43 ms farther
    # than the second for every host of this layout).
    for p, s in sites.items():
        two = {NODES[i] for i in np.argsort(true[:, host_of[s]])[:2]}
        assert table.owners[p] in two, (s, table.owners[p], true[:, host_of[s]])
