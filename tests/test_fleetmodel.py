"""The fleet-size model (scrapy_banker.net.fleetmodel) and its benchmark's smoke run.

The model is arithmetic over a worker's code paths; these tests pin the
relations an operator relies on when reading its tables -- what scales with
pages, what with the fleet, what with the partitions -- rather than the
measured costs, which belong to the machine (``benchmarks/fleet_model.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from conftest import BENCH, run_python

from scrapy_banker.net import fleetmodel
from scrapy_banker.net.fleetmodel import (
    CATEGORIES,
    DEFAULT_COSTS,
    KINDS,
    CostTable,
    Flow,
    OpCost,
    WorkerConfig,
    cluster_plan,
    fleet_flows,
    imbalance,
    max_masters,
    predict,
    reap_rounds_per_s,
    saturation_workers,
    worker_flows,
)

UNIT = CostTable(
    ops={k: OpCost(1.0, 1.0) for k in KINDS}, per_command_us=0.0, per_round_trip_us=0.0
)


def calls(flows: list[Flow], kind: str, category: str | None = None) -> float:
    return sum(f.calls for f in flows if f.kind == kind and category in (None, f.category))


@pytest.mark.parametrize(
    ("copy", "module", "name"),
    [
        ("SYNC_INTERVAL_S", "worker.jobs", "SYNC_INTERVAL_S"),
        ("FULL_SCAN_INTERVAL_S", "worker.jobs", "FULL_SCAN_INTERVAL_S"),
        ("POP_CHUNK", "worker.jobs", "POP_CHUNK"),
        ("CENSUS_INTERVAL_S", "worker.jobs", "CENSUS_INTERVAL_S"),
        ("DRAINED_CENSUS_INTERVAL_S", "worker.jobs", "DRAINED_CENSUS_INTERVAL_S"),
        ("REAP_HOLD_FRACTION", "worker.jobs", "REAP_HOLD_FRACTION"),
        ("ACTIVE_IDLE_SLEEP_S", "worker", "ACTIVE_IDLE_SLEEP_S"),
        ("REAP_CHUNK", "frontier", "REAP_CHUNK"),
        ("CENSUS_CHUNK", "frontier", "CENSUS_CHUNK"),
    ],
)
def test_the_models_constants_are_the_workers(copy: str, module: str, name: str) -> None:
    """The model keeps literal copies (it may not import redis-py): they must not drift."""
    import importlib

    worker_module = importlib.import_module(f"scrapy_banker.redis.{module}")
    assert getattr(fleetmodel, copy) == getattr(worker_module, name)


def test_the_worker_uses_the_constants_the_model_copies() -> None:
    """The frontier's chunk defaults are the named constants, not numbers of their own."""
    import inspect

    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.redis.frontier.census import CENSUS_CHUNK, WorkCensus
    from scrapy_banker.redis.frontier.reaper import REAP_CHUNK, LeaseReaper

    for reap_all, census in (
        (RedisFrontier.reap_all, RedisFrontier.census),
        (LeaseReaper.reap_all, WorkCensus.census),
    ):
        reap = inspect.signature(reap_all).parameters["chunk"].default
        chunk = inspect.signature(census).parameters["chunk"].default
        assert (reap, chunk) == (REAP_CHUNK, CENSUS_CHUNK)
    assert WorkerConfig().reap_hold_fraction == fleetmodel.REAP_HOLD_FRACTION
    assert WorkerConfig().idle_sleep_s == fleetmodel.ACTIVE_IDLE_SLEEP_S


def test_default_costs_cover_every_kind() -> None:
    assert set(DEFAULT_COSTS.ops) == set(KINDS)
    assert all(c.base_us >= 0 and c.per_item_us >= 0 for c in DEFAULT_COSTS.ops.values())
    assert DEFAULT_COSTS.source  # says where the numbers come from


def test_enqueues_follow_links_dedup_and_seen_cache() -> None:
    cfg = WorkerConfig(pages_per_s=10, links_per_page=20, duplicate_fraction=0.9,
                       seen_cache_hit=0.5)  # fmt: skip
    flows = worker_flows(cfg, 4)
    assert calls(flows, "enqueue_new") == pytest.approx(10 * 20 * 0.1)
    assert calls(flows, "enqueue_dup") == pytest.approx(10 * 20 * 0.9 * 0.5)
    # Every page is acked once, with a bump of the finished counter per flush.
    assert calls(flows, "ack") == pytest.approx(10)
    assert calls(flows, "bump", "ack") == pytest.approx(10)
    no_cache = worker_flows(replace(cfg, seen_cache_hit=0.0), 4)
    assert calls(no_cache, "enqueue_dup") == pytest.approx(2 * calls(flows, "enqueue_dup"))


def test_pops_lease_every_page_in_both_regimes() -> None:
    """Leases per second equal pages per second, whether scans or targeted pops feed the worker."""
    for workers in (1, 8, 1000):
        cfg = WorkerConfig(pages_per_s=20)
        pop = [f for f in worker_flows(cfg, workers) if f.kind == "pop"]
        assert len(pop) == 1
        assert pop[0].calls * pop[0].items == pytest.approx(20)


def test_polls_and_heartbeats_do_not_depend_on_pages() -> None:
    slow = worker_flows(WorkerConfig(pages_per_s=1), 10)
    fast = worker_flows(WorkerConfig(pages_per_s=100), 10)
    for kind, category in (("getrange", "table_poll"), ("spop", "table_poll"),
                           ("zadd", "registry"), ("hgetall", "registry")):  # fmt: skip
        assert calls(slow, kind, category) == calls(fast, kind, category) > 0
    assert calls(slow, "getrange", "table_poll") == pytest.approx(10)  # ten polls a second
    assert calls(slow, "zadd", "registry") == pytest.approx(0.5)  # one beat per 2 s


def test_drained_fleet_polls_less_and_counts_every_partition() -> None:
    cfg = WorkerConfig(drained=True, idle_sleep_s=2.0)
    flows = worker_flows(cfg, 10)
    assert calls(flows, "getrange", "table_poll") == pytest.approx(0.5)
    census = [f for f in flows if f.kind == "count"]
    assert census and census[0].calls * census[0].items == pytest.approx(1024 * 0.5)
    assert calls(flows, "enqueue_new") == 0 and calls(flows, "ack") == 0


def test_registry_reads_grow_with_the_fleet() -> None:
    small = predict(WorkerConfig(), 10, UNIT)
    large = predict(WorkerConfig(), 1000, UNIT)
    per_worker_small = small.cpu_by_category["registry"] / 10
    per_worker_large = large.cpu_by_category["registry"] / 1000
    assert per_worker_large > 10 * per_worker_small  # HGETALL / ZRANGEBYSCORE of N nodes


def test_a_held_reaper_lock_reaps_about_once_per_interval_whatever_the_fleet() -> None:
    cfg = WorkerConfig(rtt_ms=0.5)
    one, _ = reap_rounds_per_s(cfg, 1, DEFAULT_COSTS)
    assert one == pytest.approx(1 / cfg.reap_interval_s, rel=0.05)
    for workers in (10, 100, 10_000):
        rounds, refused = reap_rounds_per_s(cfg, workers, DEFAULT_COSTS)
        assert 1 / cfg.reap_interval_s <= rounds <= 1 / (0.8 * cfg.reap_interval_s)
        assert rounds + refused == pytest.approx(workers / cfg.reap_interval_s)
    # The hold is what keeps the reaper flat: without it 100 workers reap ~100x.
    unheld = WorkerConfig(rtt_ms=0.5, reap_hold_fraction=0.0)
    assert reap_rounds_per_s(unheld, 100, DEFAULT_COSTS)[0] > 50 * one


def test_reaper_without_the_hold_is_an_erlang_loss_system() -> None:
    cfg = WorkerConfig(rtt_ms=0.5, reap_hold_fraction=0.0)
    few, refused = reap_rounds_per_s(cfg, 1, DEFAULT_COSTS)
    assert few == pytest.approx(1 / cfg.reap_interval_s, rel=0.05) and refused >= 0
    many, refused_many = reap_rounds_per_s(cfg, 100_000, DEFAULT_COSTS)
    duration = (math.ceil(1024 / 128) + 5) * 0.0005 + 1024 * DEFAULT_COSTS.cost("reap").us(0) * 1e-6
    assert many < 1 / duration  # never more than back-to-back rounds
    assert many == pytest.approx(1 / duration, rel=0.01)
    assert refused_many > 0.9 * 100_000 / cfg.reap_interval_s


def test_load_sums_its_categories() -> None:
    load = predict(WorkerConfig(), 50, DEFAULT_COSTS)
    assert set(load.cpu_by_category) == set(CATEGORIES)
    assert load.cpu == pytest.approx(
        sum(load.cpu_by_category.values()) + DEFAULT_COSTS.idle_us_per_s / 1e6
    )
    assert load.commands_per_s == pytest.approx(sum(load.commands_by_category.values()))
    assert 0 < load.script_calls_per_s < load.commands_per_s
    assert load.cpu_per_page_us == pytest.approx(load.cpu * 1e6 / (50 * 20))


def test_cpu_grows_with_fleet_and_pages() -> None:
    cfg = WorkerConfig()
    cpus = [predict(cfg, n, DEFAULT_COSTS).cpu for n in (1, 10, 100, 1000)]
    assert cpus == sorted(cpus) and cpus[0] < cpus[-1]
    assert predict(replace(cfg, pages_per_s=50), 100, DEFAULT_COSTS).cpu > cpus[2]


def test_saturation_is_the_edge() -> None:
    cfg = WorkerConfig(pages_per_s=20)
    n = saturation_workers(cfg, DEFAULT_COSTS, 1.0)
    assert n is not None and 1 <= n < 10_000_000
    assert predict(cfg, n, DEFAULT_COSTS).cpu <= 1.0 < predict(cfg, n + 1, DEFAULT_COSTS).cpu
    assert saturation_workers(cfg, DEFAULT_COSTS, 1e-9) is None
    with pytest.raises(ValueError, match="utilisation"):
        saturation_workers(cfg, DEFAULT_COSTS, 0)


def test_imbalance_and_useful_masters() -> None:
    assert imbalance(1, 1024) == 1.0
    factors = [imbalance(m, 1024) for m in (2, 8, 32, 128)]
    assert factors == sorted(factors) and factors[0] > 1
    assert imbalance(16, 16384) < imbalance(16, 1024)  # more partitions, better spread
    best = max_masters(1024, 1.25)
    assert imbalance(best, 1024) <= 1.25 < imbalance(best + 1, 1024)
    assert max_masters(16384, 1.25) > best


def test_cluster_plan_keeps_the_busiest_master_under_target() -> None:
    cfg = WorkerConfig(pages_per_s=5)
    plan = cluster_plan(cfg, 1000, DEFAULT_COSTS, target_utilisation=0.5)
    if plan.masters is not None:
        assert plan.busiest_cpu is not None and plan.busiest_cpu <= 0.5
        assert plan.masters == 1 or (
            cluster_plan(
                cfg, 1000, DEFAULT_COSTS, target_utilisation=0.5, max_masters_tried=plan.masters - 1
            ).masters
            is None
        )
    tiny = cluster_plan(cfg, 10_000, UNIT, target_utilisation=1e-6)
    assert tiny.masters is None and "more masters do not help" in tiny.reason


def test_hot_keys_are_the_fleet_wide_ones() -> None:
    flows = fleet_flows(WorkerConfig(), 10, DEFAULT_COSTS)
    keys = {(f.category, f.kind): fleetmodel.hot_key(f) for f in flows}
    assert keys[("table_poll", "getrange")] == "table"
    assert keys[("ack", "bump")] == "finished"
    assert keys[("registry", "zadd")] == "heartbeats"
    assert keys[("enqueue", "enqueue_new")] is None  # partition keys spread
    assert keys[("table_poll", "spop")] is None  # one ready set per node


@pytest.mark.parametrize(
    ("field", "value"),
    [("duplicate_fraction", 1.5), ("heartbeat_s", 0), ("partitions", 0), ("pages_per_s", -1),
     ("leases_per_pop", 5.0)],
)  # fmt: skip
def test_config_refuses_nonsense(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        WorkerConfig(**{field: value})  # type: ignore[arg-type]


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        worker_flows(WorkerConfig(), 0)


@pytest.mark.slow
def test_benchmark_tiny_reports_calibration_and_check() -> None:
    """The benchmark runs on a real redis-server and ends with its JSON line."""
    proc = run_python(BENCH / "fleet_model.py", "--tiny", timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind in ("enqueue_new", "pop", "ack", "renew", "reap", "count", "getrange"):
        assert result[f"usec_per_call_{kind}"] >= 0
    assert result["usec_per_call_enqueue_new"] > 0
    for n in (1, 2):
        assert result[f"measured_redis_cpu_{n}w"] > 0
        assert result[f"predicted_redis_cpu_{n}w"] > 0
    assert isinstance(result["saturation_workers_at_20pps"], int)
    assert "cluster_masters_for_1000w" in result
    assert result["checks"][0]["pages_per_s_per_worker"] > 0
