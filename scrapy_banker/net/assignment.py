"""Bandwidth-aware task assignment: the patent's cost, Top-K, Hungarian batches, minimal moves.

The source is a Chinese patent on assigning crawl tasks to crawl agents by
measured bandwidth (``../shared/papers/bandwidth-hungarian-task-allocation.txt``
in the project's workspace).  It prices task *j* on agent *i* as
``c_ij = (tasks on i + 1) / (BC_ij + BS_i)`` -- the crawl bandwidth from the
agent to the task's site plus the agent's bandwidth to storage, discounted by
the agent's load -- and then

* gives a single task to the cheapest agent, and
* cuts many tasks into batches of K (K = number of agents) and solves each
  batch as a K x K assignment problem with the Hungarian method.

Everything here is pure numpy/scipy so that it can be tested exhaustively and
benchmarked without a crawler; the Scrapy/Redis integration feeds it a cost
matrix and applies the owners it returns.  Rows are tasks and columns are
nodes throughout (the patent's matrix is the transpose).

Two departures from the letter of the patent, both for a distributed crawler
that must never overload a node:

* :func:`assign_batched` enforces a hard per-node target (proportional to
  capacity, summing to the number of tasks) instead of relying on the
  ``(tasks + 1)`` factor alone to spread load;
* :func:`reassign` re-places tasks after a membership or cost change while
  moving as few of them as those targets allow, because every move hands a
  partition's queue to another node.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = [
    "FloatArray",
    "IntArray",
    "assign_batched",
    "assign_top_k",
    "assign_top_k_least_loaded",
    "cheapest",
    "hungarian_reference",
    "patent_cost",
    "reassign",
    "solve",
    "targets",
    "top_k",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: A node offers each batch up to this many times its proportional share of
#: slots.  With exactly its share, every node takes one task per batch when
#: capacities are equal -- the patent's load factor is then the same for all
#: nodes, a no-op -- and tasks that want the same node are split across
#: batches by chance.  Twice the share lets a popular node take several good
#: tasks at once: 2-12% lower total cost than 1 on 10 of 12 random and
#: latency-like test matrices (at most 4% higher on the other two); 3 is no
#: better overall.
_SLOT_SLACK = 2

#: Absolute slack in :func:`reassign`'s tolerance test, so that a cost that is
#: "equal" after float round-off (say, recomputed in another process) does not
#: count as drift.
_DRIFT_EPSILON = 1e-12


# -- input checking --------------------------------------------------------------------------


def _float_array(value: npt.ArrayLike, name: str) -> FloatArray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric: {exc}") from exc
    return array


def _finite(array: FloatArray, name: str) -> None:
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")


def _non_negative(array: FloatArray, name: str) -> None:
    _finite(array, name)
    if np.any(array < 0):
        raise ValueError(f"{name} must be non-negative")


def _matrix(cost: npt.ArrayLike, name: str = "cost") -> FloatArray:
    array = _float_array(cost, name)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (tasks x nodes) matrix, got shape {array.shape}")
    _finite(array, name)
    return array


def _vector(costs: npt.ArrayLike, name: str = "costs") -> FloatArray:
    array = _float_array(costs, name)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one cost per node), got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty: there is no node to choose")
    _finite(array, name)
    return array


def _positive_int(value: object, name: str) -> int:
    # bool is an int subclass; True as a batch size is always a bug.
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return number


def _seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _tolerance(tolerance: float) -> float:
    tol = float(tolerance)
    if not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance!r}")
    return tol


def _task_weights(weights: npt.ArrayLike, n_tasks: int) -> FloatArray:
    w = _float_array(weights, "weights")
    if w.shape != (n_tasks,):
        raise ValueError(f"weights has shape {w.shape}, expected ({n_tasks},): one per task")
    _non_negative(w, "weights")
    return w


# -- the patent's cost and the single-task rules ---------------------------------------------


def patent_cost(
    tasks: npt.ArrayLike, crawl_bw: npt.ArrayLike, storage_bw: npt.ArrayLike
) -> FloatArray:
    """The patent's ``c_ij = (tasks on node + 1) / (BC_ij + BS_j)``, shape ``(n_tasks, n_nodes)``.

    ``tasks`` has one load per node, ``storage_bw`` one bandwidth per node;
    ``crawl_bw`` is per task and node, or one row per node that every task
    shares.  Bandwidth in the denominator makes fast paths cheap; the ``+ 1``
    keeps an idle node's cost finite and non-zero, so that load still
    matters between idle nodes of different speed.  A zero denominator is an
    error rather than ``inf``: a node with no measured bandwidth at all is a
    measurement bug that an infinite cost would silently hide.
    """
    load = _float_array(tasks, "tasks")
    crawl = _float_array(crawl_bw, "crawl_bw")
    storage = _float_array(storage_bw, "storage_bw")
    if load.ndim != 1:
        raise ValueError(f"tasks must be 1-D (one count per node), got shape {load.shape}")
    nodes = load.shape[0]
    if storage.shape != (nodes,):
        raise ValueError(
            f"storage_bw has shape {storage.shape}, expected ({nodes},): one value per node"
        )
    if crawl.ndim == 1:
        crawl = crawl[np.newaxis, :]
    if crawl.ndim != 2 or crawl.shape[1] != nodes:
        raise ValueError(
            f"crawl_bw has shape {np.shape(crawl_bw)}, expected (n_tasks, {nodes}) or ({nodes},)"
        )
    _non_negative(load, "tasks")
    _non_negative(crawl, "crawl_bw")
    _non_negative(storage, "storage_bw")
    denominator = crawl + storage
    zero = np.argwhere(denominator == 0)
    if zero.size:
        task, node = (int(i) for i in zero[0])
        raise ValueError(
            f"crawl_bw + storage_bw is 0 for task {task} on node {node}: "
            "the cost would be infinite (is the bandwidth measured?)"
        )
    cost: FloatArray = (load + 1.0) / denominator
    return cost


def cheapest(costs: npt.ArrayLike) -> int:
    """The patent's single-task rule: the node with the lowest cost, lowest index on ties.

    Ties go to the lowest index so that every process computing the choice
    from the same numbers agrees on it.
    """
    return int(np.argmin(_vector(costs)))


def top_k(costs: npt.ArrayLike, k: int, rng: np.random.Generator) -> int:
    """A node drawn uniformly among the ``k`` cheapest (``k`` is clipped to the node count).

    Sending every task to the single cheapest node herds them onto it until
    the load term catches up; drawing among a few good nodes (the "Top3"
    policy) spreads a burst of tasks while keeping each on a good path.  The
    ``k`` cheapest are taken with a stable sort, so a tie at the boundary is
    resolved towards the lower index.
    """
    row = _vector(costs)
    k = min(_positive_int(k, "k"), row.shape[0])
    best = np.argsort(row, kind="stable")[:k]
    return int(best[rng.integers(k)])


def assign_top_k(base_cost: npt.ArrayLike, k: int, seed: int = 0) -> IntArray:
    """:func:`top_k` for every task, each with its own generator seeded by ``(seed, task)``.

    Per-task seeding makes a task's node a function of its row and index
    alone: the result is reproducible across processes and does not change
    when other tasks are added, removed or visited in another order.
    """
    cost = _matrix(base_cost, "base_cost")
    k = _positive_int(k, "k")
    seed = _seed(seed)
    n_tasks, n_nodes = cost.shape
    owners = np.empty(n_tasks, dtype=np.int64)
    if n_tasks == 0:
        return owners
    if n_nodes == 0:
        raise ValueError("base_cost has no node column: there is no node to choose")
    k = min(k, n_nodes)
    # One vectorised stable sort instead of a sort per task; identical to
    # top_k(row, k, default_rng((seed, task))) row by row.
    best = np.argsort(cost, axis=1, kind="stable")[:, :k]
    for task in range(n_tasks):
        pick = np.random.default_rng((int(seed), task)).integers(k)
        owners[task] = best[task, pick]
    return owners


def assign_top_k_least_loaded(
    base_cost: npt.ArrayLike,
    weights: npt.ArrayLike,
    k: int,
    *,
    capacities: npt.ArrayLike | None = None,
    current: npt.ArrayLike | None = None,
    tolerance: float = 0.0,
    seed: int = 0,
) -> IntArray:
    """Top-K by projected finish time: heaviest task first, each onto the least-loaded of its K.

    The uniform draw of :func:`assign_top_k` spreads *many similar* tasks,
    but crawl partitions are Zipf-sized: a uniform draw sends the one site
    holding a fifth of the work to a far node two times in three, and that
    site's politeness-limited tail then decides when the crawl ends.  This
    is list scheduling (longest first) restricted to each task's ``k``
    cheapest nodes: a task of ``weights[t]`` pages costs ``weights[t] *
    base_cost[t, i]`` on node ``i``; node ``i``'s load is the sum over its
    tasks divided by its capacity; each task, heaviest first, goes to the
    candidate where the load after adding it is lowest.  The heaviest task
    therefore lands on its cheapest node, and light ones fill the nodes that
    are still free, which is the balance the paper wanted from the draw.

    ``current`` (an owner index per task, -1 for none) keeps a task where it
    is while that node is among its ``k`` cheapest and the projected load
    there stays within ``tolerance`` of the larger of the best candidate's
    and the busiest node's so far: every move hands a queue over, and
    re-plans see backlogs shrink, so without this slack light partitions
    would shuttle between nodes at every plan.  Ties between candidates are drawn with a
    generator seeded by ``(seed, task)``, as in :func:`assign_top_k`.
    """
    cost = _matrix(base_cost, "base_cost")
    _non_negative(cost, "base_cost")
    n_tasks, n_nodes = cost.shape
    w = _task_weights(weights, n_tasks)
    k = _positive_int(k, "k")
    seed = _seed(seed)
    tolerance = _tolerance(tolerance)
    owners = np.empty(n_tasks, dtype=np.int64)
    if n_tasks == 0:
        return owners
    if n_nodes == 0:
        raise ValueError("base_cost has no node column: there is no node to choose")
    cap = np.ones(n_nodes) if capacities is None else _vector(capacities, "capacities")
    if cap.shape[0] != n_nodes or not (cap > 0).all():
        raise ValueError(f"capacities must be {n_nodes} numbers > 0, got {cap.tolist()!r}")
    cur = np.full(n_tasks, -1, dtype=np.int64) if current is None else np.asarray(current)
    if cur.shape != (n_tasks,):
        raise ValueError(f"current must have one owner index per task, got shape {cur.shape}")
    k = min(k, n_nodes)
    best = np.argsort(cost, axis=1, kind="stable")[:, :k]
    load = np.zeros(n_nodes)
    # Heaviest first; equal weights in task order, so the plan does not depend on the sort.
    for task in np.lexsort((np.arange(n_tasks), -w)):
        cand = best[task]
        after = (load[cand] + w[task] * cost[task, cand]) / cap[cand]
        low = float(after.min())
        here = int(cur[task])
        hit = np.flatnonzero(cand == here)
        # Staying is fine unless it makes its node the busiest (beyond the
        # tolerance): a light task moved between two nodes below the busiest
        # one costs a hand-over and gains nothing.
        ceiling = max(low, float((load / cap).max()))
        if hit.size and after[hit[0]] <= (1.0 + tolerance) * ceiling:
            choice = here
        else:
            tied = cand[after <= low * (1.0 + 1e-12)]
            pick = np.random.default_rng((int(seed), int(task))).integers(tied.size)
            choice = int(tied[pick])
        owners[task] = choice
        load[choice] += w[task] * cost[task, choice]
    return owners


# -- the Hungarian method --------------------------------------------------------------------


def _zero_tolerance(cost: FloatArray) -> float:
    """How close to zero counts as zero in :func:`hungarian_reference`.

    Integer costs stay integers through reductions and adjustments, so they
    are compared exactly; float costs accumulate round-off (each entry sees at
    most a few ``n^2`` additions), far below ``1e-12 * n * max|c|``.
    """
    size = max(cost.shape)
    scale = float(np.max(np.abs(cost))) if cost.size else 0.0
    if scale < 2.0**50 and np.array_equal(cost, np.round(cost)):
        return 0.0
    return float(1e-12 * size * max(scale, 1e-300))


def _augment_or_cover(
    zero: npt.NDArray[np.bool_], match_row: IntArray, match_col: IntArray
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]] | None:
    """Grow the matching on zeros by one augmenting path, or prove it maximum.

    A breadth-first search from every unmatched row along alternating paths
    (zero edge to a column, matched edge back to a row).  Reaching an
    unmatched column means the matching can grow: flip the path and return
    ``None``.  Otherwise the search's reach gives König's minimum cover --
    the *unreached* rows plus the *reached* columns -- whose size equals the
    matching's: these are the patent's "fewest lines through all zeros".
    Returned as (reached rows, reached columns).
    """
    size = zero.shape[0]
    reached_row = match_row < 0
    reached_col = np.zeros(size, dtype=bool)
    came_from = np.full(size, -1, dtype=np.int64)  # row through which a column was reached
    queue = deque(int(r) for r in np.flatnonzero(reached_row))
    while queue:
        row = queue.popleft()
        for col in np.flatnonzero(zero[row] & ~reached_col):
            reached_col[col] = True
            came_from[col] = row
            partner = int(match_col[col])
            if partner < 0:
                # Flip the alternating path ending at this free column.
                c = int(col)
                while c >= 0:
                    r = int(came_from[c])
                    previous = int(match_row[r])
                    match_row[r] = c
                    match_col[c] = r
                    c = previous
                return None
            if not reached_row[partner]:
                reached_row[partner] = True
                queue.append(partner)
    return reached_row, reached_col


def hungarian_reference(cost: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    """The patent's Hungarian steps, written to be read and checked, not to be fast.

    Kept next to :func:`solve` (scipy) as an executable specification: the
    tests and ``benchmarks/assignment_scale.py`` compare the two on
    thousands of matrices, which is how we know the batched assignment
    really solves the patent's problem.  The steps:

    1. pad a rectangular matrix to square with zeros -- every complete
       assignment pays the padding the same number of times, so it cannot
       change which real pairs are optimal;
    2. subtract each row's minimum, then each column's;
    3. cover all zeros with the fewest lines.  The patent draws lines
       greedily ("a line through the most zeros first"), which can use more
       lines than necessary and then loop; a maximum matching on the zeros
       and König's theorem give the true minimum;
    4. if fewer lines than rows, subtract the smallest uncovered value ``z``
       from every uncovered entry and add it to every doubly covered one,
       then go back to 3 (re-reducing rows and columns, the patent's
       "return to step 3", is a no-op here: every row and column keeps a
       zero).  Matched zeros are covered exactly once, so the matching
       survives the adjustment and only grows;
    5. a matching of size n is ``n`` independent zeros: the assignment.

    Returns ``(row_ind, col_ind)`` like ``scipy.optimize.linear_sum_assignment``:
    real rows only, sorted, ``min(n_rows, n_cols)`` pairs.  On ties it may pick
    a different, equally cheap, assignment.
    """
    matrix = _matrix(cost)
    n_rows, n_cols = matrix.shape
    if n_rows == 0 or n_cols == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy()
    size = max(n_rows, n_cols)
    work = np.zeros((size, size))
    work[:n_rows, :n_cols] = matrix
    tolerance = _zero_tolerance(work)

    work -= work.min(axis=1, keepdims=True)
    work -= work.min(axis=0, keepdims=True)

    match_row = np.full(size, -1, dtype=np.int64)
    match_col = np.full(size, -1, dtype=np.int64)
    while True:
        zero = work <= tolerance
        cover = _augment_or_cover(zero, match_row, match_col)
        if cover is None:
            if np.all(match_row >= 0):
                break
            continue  # the matching grew; look for another augmenting path
        reached_row, reached_col = cover
        # Lines: unreached rows and reached columns.  Uncovered = reached rows
        # x unreached columns (all non-zero, or the search would have gone on);
        # doubly covered = unreached rows x reached columns.
        uncovered = np.ix_(reached_row, ~reached_col)
        z = float(work[uncovered].min())
        work[uncovered] -= z
        work[np.ix_(~reached_row, reached_col)] += z

    rows = np.flatnonzero(match_row[:n_rows] < n_cols).astype(np.int64)
    return rows, match_row[rows].astype(np.int64)


def _scipy_lsa() -> Callable[[FloatArray], tuple[IntArray, IntArray]]:
    """scipy's solver, imported on first use.

    ``scipy.optimize`` costs ~0.45 s of CPU to import; every worker imports
    this module (the placement strategies name the allowed
    ``BANKER_PLACEMENT`` modes), but only a placement plan solves anything.
    Imported eagerly, it would cost four workers starting together on two
    cores ~1 s before their first request.
    """
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment  # type: ignore[no-any-return]


def solve(cost: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    """Production solver: scipy's ``linear_sum_assignment`` (a shortest augmenting path
    Hungarian variant, in C), with this module's input checks and int64 output."""
    matrix = _matrix(cost)
    rows, cols = _scipy_lsa()(matrix)
    return rows.astype(np.int64), cols.astype(np.int64)


# -- many tasks: targets and batches ---------------------------------------------------------


def targets(n_tasks: int, capacities: npt.ArrayLike | None, n_nodes: int) -> IntArray:
    """Tasks each node may own: proportional to capacity, summing to ``n_tasks``.

    Largest-remainder rounding with ties to the lower index -- the rule of
    :func:`scrapy_banker.net.partitions.target_counts` -- so that every caller
    (and :func:`assign_batched` and :func:`reassign` between them) computes
    the same integers from the same capacities.
    """
    if capacities is None:
        caps = np.ones(n_nodes)
    else:
        caps = _float_array(capacities, "capacities")
        if caps.shape != (n_nodes,):
            raise ValueError(
                f"capacities has shape {caps.shape}, expected ({n_nodes},): one per node"
            )
        _finite(caps, "capacities")
        if np.any(caps <= 0):
            raise ValueError("capacities must be > 0 (drop a node instead of giving it 0)")
    if n_nodes == 0:
        if n_tasks:
            raise ValueError("there are tasks but no node to assign them to")
        return np.zeros(0, dtype=np.int64)
    quotas = n_tasks * caps / caps.sum()
    counts: IntArray = np.floor(quotas).astype(np.int64)
    left = n_tasks - int(counts.sum())
    # Round-off can make floor(quota) overshoot by one in extreme cases; never
    # hand out more than n_tasks.
    while left < 0:
        over = int(np.argmax(counts - quotas))
        counts[over] -= 1
        left += 1
    by_remainder = np.lexsort((np.arange(n_nodes), -(quotas - counts)))
    counts[by_remainder[:left]] += 1
    return counts


def _regret_order(cost: FloatArray) -> IntArray:
    """Tasks by decreasing gap between their best and second-best node.

    A task with a large gap loses most if it misses its best node, so it
    chooses first; a task that is indifferent is best placed last, in
    whatever room is left.  Stable, so equal gaps keep task order.
    """
    if cost.shape[1] < 2:
        return np.arange(cost.shape[0], dtype=np.int64)
    two = np.partition(cost, 1, axis=1)[:, :2]
    gap = two[:, 1] - two[:, 0]
    return np.argsort(-gap, kind="stable").astype(np.int64)


def _place(
    cost: FloatArray,
    room: IntArray,
    load: IntArray,
    tasks: IntArray,
    batch: int,
    load_weight: float,
    owners: IntArray,
) -> None:
    """Assign ``tasks`` (in this order) in batches, never exceeding ``room`` per node.

    Each batch is one rectangular assignment problem whose columns are node
    *slots*: node ``j`` offers ``min(room_j, 2 * ceil(b * room_j / remaining))``
    of them -- together at least ``b``, so a batch is always feasible, and
    never more than the node has room for, so targets hold by construction.  Slot costs
    carry the patent's load factor ``(load_j + 1) ** load_weight``, updated
    between batches.  ``room`` and ``load`` are updated in place.
    """
    n_nodes = cost.shape[1]
    remaining = int(tasks.shape[0])
    node_ids = np.arange(n_nodes)
    for start in range(0, tasks.shape[0], batch):
        chunk = tasks[start : start + batch]
        size = int(chunk.shape[0])
        share = -(-size * room // remaining)  # ceil without floats; <= room as size <= remaining
        slots = np.minimum(room, _SLOT_SLACK * share)
        columns = np.repeat(node_ids, slots)
        factor = (load + 1.0) ** load_weight if load_weight else np.ones(n_nodes)
        sub = cost[chunk][:, columns] * factor[columns]
        rows, cols = _scipy_lsa()(sub)
        chosen = columns[cols]
        owners[chunk[rows]] = chosen
        taken = np.bincount(chosen, minlength=n_nodes)
        room -= taken
        load += taken
        remaining -= size


def _batch_size(batch: int | None, n_nodes: int) -> int:
    return max(n_nodes, 1) if batch is None else _positive_int(batch, "batch")


def _load_weight(load_weight: float) -> float:
    weight = float(load_weight)
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"load_weight must be finite and >= 0, got {load_weight!r}")
    return weight


def assign_batched(
    base_cost: npt.ArrayLike,
    capacities: npt.ArrayLike | None = None,
    *,
    batch: int | None = None,
    load_weight: float = 1.0,
    order: npt.ArrayLike | None = None,
) -> IntArray:
    """Owner node of each of many tasks: the patent's Hungarian batches, with hard targets.

    The patent solves K tasks at a time (K = nodes) and relies on the
    ``(tasks + 1)`` factor to spread load.  That factor alone lets a node
    that is cheap for everyone collect far more than its share, so here
    every node ``j`` has a hard target (:func:`targets`: proportional to
    ``capacities``, summing to the number of tasks) that it never exceeds,
    and every task is assigned.  Within that, each batch is an optimal
    assignment (:func:`solve`) on ``base_cost * (load + 1) ** load_weight``.

    ``order`` is the processing order (a permutation of the task indices);
    by default tasks with the largest gap between their best and second-best
    node go first, so the tasks that care most get their choice.  Batches
    of ``batch`` tasks (default: the node count) keep each solve small --
    10,000 tasks on 100 nodes take a fraction of a second -- at the price of
    global optimality.  Costs must be non-negative: the load factor scales
    them, which would reward load on a negative cost.
    """
    cost = _matrix(base_cost, "base_cost")
    _non_negative(cost, "base_cost")
    n_tasks, n_nodes = cost.shape
    goal = targets(n_tasks, capacities, n_nodes)
    size = _batch_size(batch, n_nodes)
    weight = _load_weight(load_weight)
    if order is None:
        sequence = _regret_order(cost)
    else:
        sequence = np.asarray(order)
        if sequence.shape != (n_tasks,) or not np.array_equal(
            np.sort(sequence), np.arange(n_tasks)
        ):
            raise ValueError(f"order must be a permutation of range({n_tasks})")
        sequence = sequence.astype(np.int64)
    owners = np.full(n_tasks, -1, dtype=np.int64)
    if n_tasks:
        _place(cost, goal.copy(), np.zeros(n_nodes, dtype=np.int64), sequence, size, weight, owners)
    return owners


def reassign(
    base_cost: npt.ArrayLike,
    current: npt.ArrayLike,
    capacities: npt.ArrayLike | None = None,
    *,
    tolerance: float = 0.1,
    batch: int | None = None,
    placed_cost: npt.ArrayLike | None = None,
    load_weight: float = 1.0,
    weights: npt.ArrayLike | None = None,
) -> tuple[IntArray, int]:
    """Re-place tasks after nodes join or leave, or costs drift, moving as few as possible.

    Every move hands a partition's queue to another node, so a task stays on
    its current node when that node

    * is alive (``0 <= current[p] < n_nodes``; ``-1`` means no owner),
    * is under its target (the same :func:`targets` as :func:`assign_batched`,
      so balance holds after any sequence of calls), and
    * has not drifted: if ``placed_cost`` -- each task's cost on its owner
      when it was placed -- is given, the cost there now is at most
      ``(1 + tolerance) * placed_cost[p]`` (plus a round-off epsilon).

    When a node has more candidates than its target, it keeps those for
    which it is relatively cheapest (cost / task's best cost), so the tasks
    with most to gain are the ones that move.  All other tasks are placed
    with :func:`assign_batched`'s batches (and its ``load_weight``) into the
    room left, and keep their node if the solver gives it back to them.

    Drift is measured against the task's own placed cost, not against its
    cheapest node: under balanced targets most tasks legitimately sit on a
    node dearer than their cheapest, and releasing all of those would
    reshuffle a stable cluster on every call.

    ``weights`` (one per task, e.g. its backlog) scale each task's row for
    the solve only, so the assignment minimises the weighted total (a large
    task wins its cheap node); drift and the over-target ranking stay on the
    unweighted costs -- a task's size changing is not its link drifting.

    Returns ``(owners, moved)``; ``moved`` counts the tasks that had a live
    owner and now have another one (tasks of a departed node must move and
    are not counted).
    """
    cost = _matrix(base_cost, "base_cost")
    _non_negative(cost, "base_cost")
    n_tasks, n_nodes = cost.shape
    owner = _float_array(current, "current")
    if owner.shape != (n_tasks,):
        raise ValueError(f"current has shape {owner.shape}, expected ({n_tasks},): one per task")
    _finite(owner, "current")
    if not np.array_equal(owner, np.round(owner)):
        raise ValueError("current must hold integer node indices (-1 for none)")
    now = owner.astype(np.int64)
    tol = _tolerance(tolerance)
    goal = targets(n_tasks, capacities, n_nodes)
    size = _batch_size(batch, n_nodes)

    alive = (now >= 0) & (now < n_nodes)
    keep = alive.copy()
    index = np.flatnonzero(alive)
    own_cost = cost[index, now[index]]
    if placed_cost is not None:
        placed = _float_array(placed_cost, "placed_cost")
        if placed.shape != (n_tasks,):
            raise ValueError(
                f"placed_cost has shape {placed.shape}, expected ({n_tasks},): one per task"
            )
        _non_negative(placed, "placed_cost")
        drifted = own_cost > (1.0 + tol) * placed[index] + _DRIFT_EPSILON
        keep[index[drifted]] = False

    # Over-target nodes keep their relatively cheapest candidates.
    candidates = np.flatnonzero(keep)
    if candidates.size:
        best = cost[candidates].min(axis=1)
        mine = cost[candidates, now[candidates]]
        # mine / best, where a free best node makes any positive cost infinitely worse.
        ratio = np.divide(mine, best, out=np.full_like(mine, np.inf), where=best > 0)
        ratio[(best == 0) & (mine == 0)] = 1.0
        ranked = candidates[np.lexsort((candidates, ratio, now[candidates]))]
        nodes = now[ranked]
        # Position of each candidate within its node's group (groups are contiguous).
        starts = np.searchsorted(nodes, nodes, side="left")
        rank_in_node = np.arange(ranked.size) - starts
        keep[ranked[rank_in_node >= goal[nodes]]] = False

    owners = np.where(keep, now, -1).astype(np.int64)
    load = np.bincount(owners[keep], minlength=n_nodes).astype(np.int64)
    room = goal - load
    loose = np.flatnonzero(~keep).astype(np.int64)
    if loose.size:
        solve_cost = cost
        if weights is not None:
            solve_cost = cost * _task_weights(weights, n_tasks)[:, None]
        sub = solve_cost[loose]
        sequence = loose[_regret_order(sub)]
        _place(solve_cost, room, load, sequence, size, _load_weight(load_weight), owners)
    moved = int(np.count_nonzero(alive & (owners != now)))
    return owners, moved
