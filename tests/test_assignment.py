"""Tests of the pure assignment core (``scrapy_banker.net.assignment``).

The Hungarian reference is only worth keeping if it provably solves the same
problem as scipy, so it is compared on thousands of random matrices -- ties,
rectangular shapes and floats included -- and on Hypothesis' shrunk corner
cases.  The batched and minimal-move functions carry the distributed
scheduler's invariants (no node above its target, every task placed, no
needless moves), which are asserted exactly, not statistically.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest
from conftest import BENCH, run_python
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.optimize import linear_sum_assignment

from scrapy_banker.net.assignment import (
    FloatArray,
    IntArray,
    assign_batched,
    assign_top_k,
    assign_top_k_least_loaded,
    cheapest,
    hungarian_reference,
    patent_cost,
    reassign,
    solve,
    targets,
    top_k,
)
from scrapy_banker.net.partitions import target_counts


def _check_matching(cost: FloatArray, rows: IntArray, cols: IntArray) -> None:
    """A valid answer in linear_sum_assignment's format with scipy's optimal total."""
    n_rows, n_cols = cost.shape
    assert rows.dtype == np.int64 and cols.dtype == np.int64
    assert len(rows) == len(cols) == min(n_rows, n_cols)
    assert np.all(np.diff(rows) > 0), "rows must be sorted and distinct"
    assert len(np.unique(cols)) == len(cols), "a column is used twice"
    assert np.all((rows >= 0) & (rows < n_rows)) and np.all((cols >= 0) & (cols < n_cols))
    r_sp, c_sp = linear_sum_assignment(cost)
    optimum = cost[r_sp, c_sp].sum()
    scale = max(1.0, float(np.abs(cost).max())) if cost.size else 1.0
    assert cost[rows, cols].sum() == pytest.approx(optimum, rel=0, abs=1e-9 * scale)


def _random_matrices(count: int, seed: int) -> Iterator[FloatArray]:
    rng = np.random.default_rng(seed)
    for i in range(count):
        n_rows, n_cols = (int(x) for x in rng.integers(1, 9, size=2))
        if i % 4 == 0:
            n_cols = n_rows
        kind = i % 3
        if kind == 0:  # few distinct values: many ties and many optimal assignments
            yield rng.integers(0, 3, size=(n_rows, n_cols)).astype(np.float64)
        elif kind == 1:
            yield rng.integers(-50, 50, size=(n_rows, n_cols)).astype(np.float64)
        else:
            yield rng.random((n_rows, n_cols)) * 10.0 ** rng.integers(-6, 7)


# -- Hungarian reference ---------------------------------------------------------------------


def test_hungarian_reference_matches_scipy_on_thousands_of_random_matrices() -> None:
    shapes = {"square": 0, "tall": 0, "wide": 0}
    for cost in _random_matrices(3000, seed=7):
        rows, cols = hungarian_reference(cost)
        _check_matching(cost, rows, cols)
        n_rows, n_cols = cost.shape
        shapes["square" if n_rows == n_cols else "tall" if n_rows > n_cols else "wide"] += 1
    assert min(shapes.values()) > 500, shapes


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=8),
        elements=st.one_of(
            st.integers(-3, 3).map(float),
            st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
        ),
    )
)
def test_hungarian_reference_property(cost: FloatArray) -> None:
    rows, cols = hungarian_reference(cost)
    _check_matching(cost, rows, cols)


def test_hungarian_reference_needs_the_adjustment_step() -> None:
    # After row and column reduction the zeros of this matrix can be covered
    # by 2 lines, so the z-adjustment must run before 3 independent zeros exist.
    cost = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [3.0, 6.0, 9.0]])
    rows, cols = hungarian_reference(cost)
    assert rows.tolist() == [0, 1, 2]
    assert cost[rows, cols].sum() == 10.0
    _check_matching(cost, rows, cols)


def test_hungarian_reference_rectangular_keeps_only_real_pairs() -> None:
    tall = np.array([[5.0, 9.0], [1.0, 7.0], [8.0, 2.0]])
    rows, cols = hungarian_reference(tall)
    assert (rows.tolist(), cols.tolist()) == ([1, 2], [0, 1])
    rows, cols = hungarian_reference(tall.T)
    assert (rows.tolist(), cols.tolist()) == ([0, 1], [1, 2])


@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)])
def test_hungarian_reference_empty(shape: tuple[int, int]) -> None:
    rows, cols = hungarian_reference(np.zeros(shape))
    assert rows.shape == cols.shape == (0,)
    assert rows.dtype == cols.dtype == np.int64


def test_hungarian_reference_is_exact_on_large_integers_and_tiny_floats() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        big = rng.integers(10**12, 10**12 + 5, size=(6, 6)).astype(np.float64)
        _check_matching(big, *hungarian_reference(big))
        tiny = rng.random((5, 7)) * 1e-200
        rows, cols = hungarian_reference(tiny)
        r_sp, c_sp = linear_sum_assignment(tiny)
        assert tiny[rows, cols].sum() == pytest.approx(tiny[r_sp, c_sp].sum(), rel=1e-9)


@pytest.mark.parametrize("solver", [hungarian_reference, solve])
@pytest.mark.parametrize(
    ("cost", "message"),
    [
        ([[1.0, np.nan]], "NaN or infinite"),
        ([[1.0, np.inf]], "NaN or infinite"),
        ([1.0, 2.0], "2-D"),
        ([[[1.0]]], "2-D"),
        ([["a"]], "numeric"),
    ],
)
def test_solvers_reject_bad_matrices(
    solver: Callable[[npt.ArrayLike], tuple[IntArray, IntArray]], cost: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        solver(cost)  # type: ignore[arg-type]


def test_solve_is_scipy_with_int64_output() -> None:
    for cost in _random_matrices(200, seed=11):
        rows, cols = solve(cost)
        _check_matching(cost, rows, cols)


# -- the patent's cost, cheapest and Top-K ---------------------------------------------------


def test_patent_cost_values_and_broadcast() -> None:
    tasks = [0, 1, 3]
    storage = [10.0, 20.0, 5.0]
    crawl = [[10.0, 20.0, 15.0], [30.0, 0.0, 35.0]]
    cost = patent_cost(tasks, crawl, storage)
    expected = np.array([[1 / 20, 2 / 40, 4 / 20], [1 / 40, 2 / 20, 4 / 40]])
    assert cost.shape == (2, 3) and cost.dtype == np.float64
    np.testing.assert_allclose(cost, expected)
    shared = patent_cost(tasks, crawl[0], storage)
    assert shared.shape == (1, 3)
    np.testing.assert_allclose(shared[0], expected[0])


def test_patent_example_one_picks_the_fifth_node() -> None:
    # Embodiment 1: six nodes priced 30, 30, 20, 40, 10, 30 -> the fifth.
    assert cheapest([30, 30, 20, 40, 10, 30]) == 4


@pytest.mark.parametrize(
    ("tasks", "crawl", "storage", "message"),
    [
        ([0, -1], [1.0, 1.0], [1.0, 1.0], "tasks must be non-negative"),
        ([0, 0], [1.0, np.nan], [1.0, 1.0], "crawl_bw contains NaN"),
        ([0, 0], [1.0, -2.0], [1.0, 1.0], "crawl_bw must be non-negative"),
        ([0, 0], [1.0, 1.0], [1.0, np.nan], "storage_bw contains NaN"),
        ([0, 0], [[1.0, 1.0], [0.0, 2.0]], [0.0, 1.0], "is 0 for task 1 on node 0"),
        ([0, 0], [1.0, 1.0], [1.0, 1.0, 1.0], r"storage_bw has shape \(3,\), expected \(2,\)"),
        ([0, 0], [[1.0, 1.0, 1.0]], [1.0, 1.0], r"crawl_bw has shape \(1, 3\)"),
        ([[0, 0]], [1.0, 1.0], [1.0, 1.0], "tasks must be 1-D"),
    ],
)
def test_patent_cost_errors(tasks: object, crawl: object, storage: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        patent_cost(tasks, crawl, storage)  # type: ignore[arg-type]


def test_cheapest_breaks_ties_to_the_lowest_index() -> None:
    assert cheapest([3.0, 1.0, 1.0, 2.0]) == 1
    assert cheapest([5.0]) == 0
    with pytest.raises(ValueError, match="empty"):
        cheapest([])
    with pytest.raises(ValueError, match="NaN"):
        cheapest([1.0, np.nan])
    with pytest.raises(ValueError, match="1-D"):
        cheapest([[1.0, 2.0]])


def test_top_k_draws_only_and_all_of_the_k_cheapest() -> None:
    costs = [9.0, 1.0, 7.0, 3.0, 2.0, 8.0]
    rng = np.random.default_rng(0)
    draws = np.array([top_k(costs, 3, rng) for _ in range(3000)])
    assert set(draws.tolist()) == {1, 3, 4}
    shares = np.bincount(draws, minlength=6)[[1, 3, 4]] / draws.size
    np.testing.assert_allclose(shares, 1 / 3, atol=0.05)  # uniform: ~15 sigma away when not


def test_top_k_edge_cases() -> None:
    rng = np.random.default_rng(1)
    assert {top_k([4.0, 2.0, 3.0], 1, rng) for _ in range(50)} == {1}  # k=1 is cheapest
    assert {top_k([4.0, 2.0], 10, rng) for _ in range(200)} == {0, 1}  # k clipped to n
    # A tie at the boundary goes to the lower index.
    assert {top_k([1.0, 2.0, 2.0, 2.0], 2, rng) for _ in range(200)} == {0, 1}
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            top_k([1.0, 2.0], bad, rng)  # type: ignore[arg-type]


def test_assign_top_k_is_per_task_deterministic() -> None:
    rng = np.random.default_rng(2)
    cost = rng.random((300, 8))
    owners = assign_top_k(cost, 3, seed=42)
    assert owners.dtype == np.int64
    for task in (0, 17, 299):
        expected = top_k(cost[task], 3, np.random.default_rng((42, task)))
        assert owners[task] == expected
    # A task's node does not depend on the other tasks.
    np.testing.assert_array_equal(assign_top_k(cost[:100], 3, seed=42), owners[:100])
    np.testing.assert_array_equal(assign_top_k(cost, 3, seed=42), owners)
    # Only each task's 3 cheapest are ever used, and another seed draws differently.
    ranks = np.argsort(np.argsort(cost, axis=1, kind="stable"), axis=1)
    assert np.all(ranks[np.arange(300), owners] < 3)
    assert not np.array_equal(assign_top_k(cost, 3, seed=43), owners)
    np.testing.assert_array_equal(assign_top_k(cost, 1), cost.argmin(axis=1))


def test_assign_top_k_errors() -> None:
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        assign_top_k(np.ones((2, 2)), 0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        assign_top_k(np.ones((2, 2)), 1, seed=-1)
    with pytest.raises(ValueError, match="no node"):
        assign_top_k(np.ones((2, 0)), 1)
    with pytest.raises(ValueError, match="NaN"):
        assign_top_k([[np.nan]], 1)
    assert assign_top_k(np.ones((0, 3)), 2).shape == (0,)


def test_least_loaded_top_k_is_longest_first_list_scheduling_on_each_tasks_k_nearest() -> None:
    rng = np.random.default_rng(5)
    cost = rng.uniform(20.0, 300.0, size=(200, 6))
    weights = np.floor(200.0 / np.arange(1, 201))  # Zipf-sized tasks
    owners = assign_top_k_least_loaded(cost, weights, 3, seed=1)
    assert owners.dtype == np.int64
    ranks = np.argsort(np.argsort(cost, axis=1, kind="stable"), axis=1)
    assert np.all(ranks[np.arange(200), owners] < 3)  # only ever one of the 3 cheapest
    assert owners[0] == cost[0].argmin()  # the heaviest task gets its cheapest node
    # Replaying the rule by hand gives the same choices.
    load = np.zeros(6)
    for t in range(200):
        cand = np.argsort(cost[t], kind="stable")[:3]
        after = load[cand] + weights[t] * cost[t, cand]
        assert owners[t] in cand[after == after.min()]
        load[owners[t]] += weights[t] * cost[t, owners[t]]

    # Its busiest node finishes sooner than the uniform draw's, on average.
    def makespan(o: IntArray) -> float:
        return float(np.bincount(o, weights * cost[np.arange(200), o], minlength=6).max())

    uniform = [makespan(assign_top_k(cost, 3, seed=s)) for s in range(20)]
    assert makespan(owners) < 0.5 * float(np.mean(uniform))  # 0.29x when written
    np.testing.assert_array_equal(
        assign_top_k_least_loaded(cost, weights, 3, seed=1), owners
    )  # deterministic


def test_least_loaded_top_k_capacity_current_and_tolerance() -> None:
    cost = np.full((4, 2), 10.0)
    # Node 1 has three times the capacity: it takes three of four equal tasks.
    for seed in range(5):
        owners = assign_top_k_least_loaded(cost, [1, 1, 1, 1], 2, capacities=[1.0, 3.0], seed=seed)
        assert sorted(owners.tolist()) == [0, 1, 1, 1]
    two = np.array([[10.0, 10.5], [30.0, 20.0]])
    assert assign_top_k_least_loaded(two, [1, 1], 2).tolist() == [0, 1]
    # The current owner of task 0 is 5 % dearer: kept within a 10 % tolerance, not at 0.
    kept = assign_top_k_least_loaded(two, [1, 1], 2, current=[1, -1], tolerance=0.1)
    assert kept[0] == 1
    moved = assign_top_k_least_loaded(two, [1, 1], 2, current=[1, -1], tolerance=0.0)
    assert moved[0] == 0
    # An owner outside the k cheapest is never kept.
    assert assign_top_k_least_loaded(two, [1, 1], 1, current=[1, 0], tolerance=9.0).tolist() == [
        0,
        1,
    ]
    # Zero-weight tasks follow the loads of the others: onto the idle node.
    assert assign_top_k_least_loaded(two, [5, 0], 2)[1] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": [1.0]}, r"weights has shape \(1,\), expected \(2,\): one per task"),
        ({"weights": [1.0, -1.0]}, "weights must be non-negative"),
        ({"weights": [1.0, np.nan]}, "weights contains NaN"),
        ({"k": 0}, "k must be an integer >= 1"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"tolerance": -0.1}, "tolerance must be finite and >= 0"),
        ({"tolerance": np.inf}, "tolerance must be finite and >= 0"),
        ({"capacities": [1.0, 0.0]}, "capacities must be 2 numbers > 0"),
        ({"capacities": [1.0]}, "capacities must be 2 numbers > 0"),
        ({"current": [0]}, "current must have one owner index per task"),
    ],
)
def test_least_loaded_top_k_errors(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"weights": [1.0, 1.0], "k": 1, **kwargs}
    weights = args.pop("weights")
    k = args.pop("k")
    with pytest.raises(ValueError, match=message):
        assign_top_k_least_loaded(np.ones((2, 2)), weights, k, **args)  # type: ignore[arg-type]


def test_least_loaded_top_k_edge_cases() -> None:
    assert assign_top_k_least_loaded(np.ones((0, 3)), [], 2).shape == (0,)
    with pytest.raises(ValueError, match="no node"):
        assign_top_k_least_loaded(np.ones((2, 0)), [1, 1], 1)
    with pytest.raises(ValueError, match="base_cost must be non-negative"):
        assign_top_k_least_loaded([[-1.0]], [1], 1)


def test_reassign_weights_steer_the_solve_not_the_drift() -> None:
    # Two nodes, two slots each; node 0 is cheaper for every task by the same margin.
    cost = np.array([[10.0, 20.0]] * 4)
    free = np.full(4, -1)
    heavy = [1.0, 1.0, 1.0, 50.0]
    owners, _ = reassign(cost, free, weights=heavy, tolerance=0.0)
    assert owners[3] == 0 and np.bincount(owners, minlength=2).tolist() == [2, 2]
    # Placed tasks whose weights change are kept: drift is per unweighted cost.
    placed = cost[np.arange(4), owners]
    again, moved = reassign(
        cost, owners, weights=[50.0, 1.0, 1.0, 1.0], placed_cost=placed, tolerance=0.0
    )
    assert moved == 0 and np.array_equal(again, owners)
    with pytest.raises(ValueError, match="weights has shape"):
        reassign(cost, free, weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="weights must be non-negative"):
        reassign(cost, free, weights=[1.0, 1.0, 1.0, -1.0])


# -- targets and batched assignment ----------------------------------------------------------


def test_targets_are_proportional_and_match_the_partition_table() -> None:
    assert targets(10, None, 3).tolist() == [4, 3, 3]
    assert targets(10, [1.0, 1.0, 2.0], 3).tolist() == [3, 2, 5]
    assert targets(0, None, 2).tolist() == [0, 0]
    assert targets(0, None, 0).tolist() == []
    rng = np.random.default_rng(5)
    for _ in range(200):
        nodes = int(rng.integers(1, 12))
        tasks = int(rng.integers(0, 500))
        caps = rng.choice([0.5, 1.0, 2.0, 3.0], size=nodes)
        mine = targets(tasks, caps, nodes)
        assert mine.sum() == tasks and np.all(mine >= 0)
        assert np.all(np.abs(mine - tasks * caps / caps.sum()) < 1)
        # Same integers as the partition table's rule (names sort like indices).
        theirs = target_counts(tasks, {f"n{i:03d}": float(c) for i, c in enumerate(caps)})
        assert mine.tolist() == [theirs[f"n{i:03d}"] for i in range(nodes)]


def _random_balanced_cost(cost: FloatArray, goal: IntArray, seed: int) -> float:
    shuffled = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(goal)), goal))
    return float(cost[np.arange(cost.shape[0]), shuffled].sum())


@settings(max_examples=60, deadline=None)
@given(
    tasks=st.integers(0, 300),
    nodes=st.integers(1, 12),
    batch=st.one_of(st.none(), st.integers(1, 40)),
    weighted=st.booleans(),
    load_weight=st.sampled_from([0.0, 1.0, 2.5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_assign_batched_holds_targets_exactly(
    tasks: int, nodes: int, batch: int | None, weighted: bool, load_weight: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, 5, size=(tasks, nodes)) * rng.random((tasks, nodes))
    caps = rng.uniform(0.2, 4.0, nodes) if weighted else None
    owners = assign_batched(cost, caps, batch=batch, load_weight=load_weight)
    assert owners.shape == (tasks,) and owners.dtype == np.int64
    assert np.all((owners >= 0) & (owners < nodes)), "every task is assigned"
    goal = targets(tasks, caps, nodes)
    np.testing.assert_array_equal(np.bincount(owners, minlength=nodes), goal)


def test_assign_batched_beats_random_balanced_assignments() -> None:
    rng = np.random.default_rng(8)
    for tasks, nodes in [(1000, 10), (2000, 40), (500, 3), (37, 5)]:
        cost = rng.lognormal(0.0, 1.0, size=(tasks, nodes))
        caps = rng.uniform(0.5, 2.0, nodes)
        owners = assign_batched(cost, caps)
        total = cost[np.arange(tasks), owners].sum()
        goal = targets(tasks, caps, nodes)
        assert all(total <= _random_balanced_cost(cost, goal, s) for s in range(20))
        assert total >= cost.min(axis=1).sum()


def test_assign_batched_all_equal_costs_balance() -> None:
    owners = assign_batched(np.ones((103, 10)))
    counts = np.bincount(owners, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 103
    assert counts.tolist() == targets(103, None, 10).tolist()


def test_assign_batched_gives_each_task_its_node_when_nothing_competes() -> None:
    # 3 nodes, each the clear favourite of exactly its share of tasks.
    cost = np.full((9, 3), 10.0)
    favourite = np.repeat(np.arange(3), 3)[np.random.default_rng(4).permutation(9)]
    cost[np.arange(9), favourite] = 1.0
    np.testing.assert_array_equal(assign_batched(cost, batch=2), favourite)


def test_assign_batched_balances_at_cluster_scale() -> None:
    # ~0.1 s; how fast is the benchmarks' business (benchmarks/assignment_scale.py).
    cost = np.random.default_rng(9).random((10_000, 100))
    owners = assign_batched(cost)
    assert np.bincount(owners, minlength=100).tolist() == [100] * 100


def test_assign_batched_order_and_batch() -> None:
    cost = np.random.default_rng(10).random((50, 5))
    default = assign_batched(cost)
    np.testing.assert_array_equal(assign_batched(cost), default)  # deterministic
    forward = assign_batched(cost, order=np.arange(50), batch=50)
    assert np.bincount(forward, minlength=5).tolist() == [10] * 5
    # One batch of all tasks with every slot is an exact transportation solve.
    columns = np.repeat(np.arange(5), 10)
    r, c = linear_sum_assignment(cost[:, columns])
    exact = cost[r, columns[c]].sum()
    single = assign_batched(cost, batch=50, load_weight=0.0)
    assert cost[np.arange(50), single].sum() <= exact * 1.25


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_cost": [[1.0, np.nan]]}, "NaN"),
        ({"base_cost": [[1.0, -1.0]]}, "non-negative"),
        ({"base_cost": [1.0, 2.0]}, "2-D"),
        ({"capacities": [1.0]}, r"capacities has shape \(1,\), expected \(2,\)"),
        ({"capacities": [1.0, 0.0]}, "capacities must be > 0"),
        ({"capacities": [1.0, -3.0]}, "capacities must be > 0"),
        ({"capacities": [1.0, np.nan]}, "capacities contains NaN"),
        ({"batch": 0}, "batch must be an integer >= 1"),
        ({"batch": 2.5}, "batch must be an integer >= 1"),
        ({"load_weight": -1.0}, "load_weight must be finite and >= 0"),
        ({"order": [0, 0, 1]}, r"order must be a permutation of range\(3\)"),
        ({"order": [0, 1]}, r"order must be a permutation of range\(3\)"),
        ({"base_cost": np.ones((3, 0))}, "no node"),
    ],
)
def test_assign_batched_errors(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"base_cost": np.ones((3, 2))}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        assign_batched(**arguments)  # type: ignore[arg-type]


def test_assign_batched_no_tasks() -> None:
    assert assign_batched(np.ones((0, 4))).shape == (0,)
    assert assign_batched(np.ones((0, 0))).shape == (0,)


# -- reassign --------------------------------------------------------------------------------


def _cluster(tasks: int, nodes: int, seed: int) -> tuple[FloatArray, IntArray]:
    cost = np.random.default_rng(seed).lognormal(0.0, 0.5, size=(tasks, nodes))
    return cost, assign_batched(cost)


def test_reassign_unchanged_moves_nothing() -> None:
    for seed in range(5):
        cost, owners = _cluster(500, 7, seed)
        new, moved = reassign(cost, owners)
        assert moved == 0
        np.testing.assert_array_equal(new, owners)
        # With placed costs that are still current, nothing has drifted either.
        new, moved = reassign(cost, owners, placed_cost=cost[np.arange(500), owners])
        assert moved == 0
        np.testing.assert_array_equal(new, owners)


@pytest.mark.parametrize(("tasks", "nodes", "gone"), [(500, 7, 3), (1000, 10, 9), (5, 10, 2)])
def test_reassign_when_a_node_leaves_moves_only_its_tasks(
    tasks: int, nodes: int, gone: int
) -> None:
    cost, owners = _cluster(tasks, nodes, 1)
    survivors = np.delete(cost, gone, axis=1)
    current = np.where(owners == gone, -1, np.where(owners > gone, owners - 1, owners))
    new, moved = reassign(survivors, current)
    goal = targets(tasks, None, nodes - 1)
    np.testing.assert_array_equal(np.bincount(new, minlength=nodes - 1), goal)
    # Only a surviving node above its new target may lose tasks, and only its surplus.
    before = np.bincount(current[current >= 0], minlength=nodes - 1)
    surplus = int(np.maximum(before - goal, 0).sum())
    assert moved == surplus
    assert int(np.count_nonzero((current >= 0) & (new != current))) == surplus
    if tasks >= nodes:
        assert surplus == 0  # targets only grow when a node leaves
    # The departed node's tasks all found a new home.
    assert np.all(new[current == -1] >= 0)


def test_reassign_departed_index_out_of_range_is_forced_and_not_counted() -> None:
    cost, owners = _cluster(400, 8, 2)
    new, moved = reassign(cost[:, :-1], owners)  # node 7 left; its index is now out of range
    assert moved == 0
    changed = new != owners
    np.testing.assert_array_equal(changed, owners == 7)


@pytest.mark.parametrize(("tasks", "nodes"), [(1000, 10), (997, 7), (50, 3)])
def test_reassign_when_a_node_joins_moves_exactly_the_surplus(tasks: int, nodes: int) -> None:
    cost, owners = _cluster(tasks, nodes, 3)
    newcomer = np.random.default_rng(4).lognormal(0.0, 0.5, size=(tasks, 1))
    grown = np.hstack([cost, newcomer])
    new, moved = reassign(grown, owners)
    goal = targets(tasks, None, nodes + 1)
    np.testing.assert_array_equal(np.bincount(new, minlength=nodes + 1), goal)
    surplus = int(np.maximum(np.bincount(owners, minlength=nodes + 1) - goal, 0).sum())
    assert moved == surplus == goal[-1]  # ~ tasks / (nodes + 1), the least possible
    assert tasks // (nodes + 1) <= moved <= tasks // (nodes + 1) + 1
    # Each old node gave away tasks it was relatively bad for, and all went to the newcomer.
    assert np.all(new[new != owners] == nodes)


def test_reassign_over_target_node_sheds_the_tasks_it_is_worst_for() -> None:
    # Node 1 joins; node 0 must give up two tasks: those it is 5x and 3x worse for.
    cost = np.array([[1.0, 1.0], [1.0, 10.0], [5.0, 1.0], [3.0, 1.0]])
    new, moved = reassign(cost, [0, 0, 0, 0])
    assert new.tolist() == [0, 0, 1, 1]
    assert moved == 2


def test_reassign_capacity_change_moves_the_difference() -> None:
    cost, owners = _cluster(600, 3, 5)
    new, moved = reassign(cost, owners, capacities=[2.0, 1.0, 1.0])
    assert np.bincount(new, minlength=3).tolist() == [300, 150, 150]
    assert moved == 100  # nodes 1 and 2 each hand 50 to node 0


def test_reassign_drift_releases_only_tasks_whose_cost_rose() -> None:
    tasks, nodes = 400, 4
    cost, owners = _cluster(tasks, nodes, 6)
    placed = cost[np.arange(tasks), owners]
    drifted = cost.copy()
    # Node 0 became 5x dearer for its own tasks 0..9 and node 1 for its 0..9;
    # both groups are cheap on the other node, so swapping them pays.
    on0 = np.flatnonzero(owners == 0)[:10]
    on1 = np.flatnonzero(owners == 1)[:10]
    drifted[on0, 0] *= 5
    drifted[on1, 1] *= 5
    drifted[on0, 1] = placed[on0] * 0.5
    drifted[on1, 0] = placed[on1] * 0.5
    new, moved = reassign(drifted, owners, placed_cost=placed, tolerance=0.1)
    assert moved == 20
    assert np.all(new[on0] == 1) and np.all(new[on1] == 0)
    np.testing.assert_array_equal(np.bincount(new, minlength=nodes), targets(tasks, None, nodes))
    # Within the tolerance nothing moves.
    new, moved = reassign(cost * 1.05, owners, placed_cost=placed, tolerance=0.1)
    assert moved == 0
    # Without placed costs, drift is not judged: a pure minimal-move re-placement.
    assert reassign(drifted, owners)[1] == 0


def test_reassign_places_tasks_without_an_owner() -> None:
    cost = np.random.default_rng(7).random((30, 3))
    new, moved = reassign(cost, np.full(30, -1))
    assert moved == 0
    assert np.bincount(new, minlength=3).tolist() == [10, 10, 10]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"current": [0, 1]}, r"current has shape \(2,\), expected \(3,\)"),
        ({"current": [0, 1, 0.5]}, "integer node indices"),
        ({"current": [0, 1, np.nan]}, "current contains NaN"),
        ({"base_cost": [[1.0, np.nan]] * 3}, "base_cost contains NaN"),
        ({"tolerance": -0.1}, "tolerance must be finite and >= 0"),
        ({"capacities": [1.0, 0.0]}, "capacities must be > 0"),
        ({"batch": 0}, "batch must be an integer >= 1"),
        ({"placed_cost": [1.0, 1.0]}, r"placed_cost has shape \(2,\), expected \(3,\)"),
        ({"placed_cost": [1.0, 1.0, -1.0]}, "placed_cost must be non-negative"),
    ],
)
def test_reassign_errors(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"base_cost": np.ones((3, 2)), "current": [0, 1, 0]}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        reassign(**arguments)  # type: ignore[arg-type]


# -- the benchmark ---------------------------------------------------------------------------


@pytest.mark.slow
def test_benchmark_tiny_reports_no_mismatch() -> None:
    proc = run_python(BENCH / "assignment_scale.py", "--tiny", timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) > 1, "human-readable lines must precede the JSON line"
    result = json.loads(lines[-1])
    assert result["mismatches"] == 0 and result["matrices"] > 0
    assert result["seconds"] > 0  # how fast is the benchmark's report, not a test's
    assert result["moved"] == result["moved_lower_bound"] > 0
    assert result["moved_survivors"] == 0
    assert result["total_cost"] < result["random_cost"]
