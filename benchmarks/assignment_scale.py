"""Assignment core at cluster scale: batched Hungarian speed, minimal moves, reference check.

Why: the distributed scheduler re-places every logical partition whenever a
node joins or leaves, so :func:`scrapy_banker.net.assignment.assign_batched` must
place 10,000 partitions on 100 nodes well under a second, and
:func:`~scrapy_banker.net.assignment.reassign` must move only what a membership
change forces.  And the batches are only as good as the solver: the
readable implementation of the patent's Hungarian steps
(:func:`~scrapy_banker.net.assignment.hungarian_reference`) is checked against
scipy's ``linear_sum_assignment`` on thousands of random matrices, which
also checks our reading of the patent.

What is measured:

* a latency-like cost: nodes and partitions' sites are points around six
  regional centres on a 100 x 100 plane; cost = (5 + distance) x
  lognormal(0, 0.1) jitter -- "milliseconds of RTT", seeded;
* ``assign_batched`` on it, best of ``--repeats`` (``time.perf_counter``), with
  its total cost next to a random balanced assignment's and the sum of each
  partition's cheapest node (a lower bound no balanced assignment reaches);
* ``reassign`` after the last node leaves: how long, how many partitions
  changed owner (``moved``) against those of the departed node
  (``moved_lower_bound``; equal means no surviving owner lost a partition);
* ``hungarian_reference`` vs ``linear_sum_assignment`` on random matrices of
  1..``--max-size`` rows and columns (square and rectangular both ways;
  half small-integer costs full of ties, half floats): ``mismatches`` counts
  optimal totals that disagree (assignments may differ on ties) or invalid
  matchings, and must be 0;
* both solvers on one 60 x 60 float matrix, for scale.

Usage::

    python benchmarks/assignment_scale.py --quick     # 2,000 reference matrices, ~5 s
    python benchmarks/assignment_scale.py             # 10,000 reference matrices

The last stdout line is a JSON object with ``seconds``, ``target_met``
(``seconds < 1``), ``tasks``, ``nodes``, ``total_cost``, ``random_cost``,
``lower_bound_cost``, ``reassign_seconds``, ``moved``, ``moved_lower_bound``,
``moved_survivors``, ``mismatches``, ``matrices``, ``reference_60_seconds``,
``scipy_60_seconds`` and ``reference_vs_scipy_60`` (the time ratio).  It exits
non-zero if a node exceeds its target, a partition is left unassigned or the
reference disagrees with scipy.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import _common
import _harness
import numpy as np
from scipy.optimize import linear_sum_assignment

from scrapy_banker.net.assignment import (
    FloatArray,
    assign_batched,
    hungarian_reference,
    reassign,
    targets,
)

TARGET_SECONDS = 1.0


@dataclass(frozen=True)
class Config:
    tasks: int
    nodes: int
    matrices: int
    max_size: int
    repeats: int


FULL = Config(tasks=10_000, nodes=100, matrices=10_000, max_size=12, repeats=3)
QUICK = Config(tasks=10_000, nodes=100, matrices=2_000, max_size=12, repeats=3)
TINY = Config(tasks=2_000, nodes=20, matrices=200, max_size=8, repeats=1)


def latency_cost(tasks: int, nodes: int, seed: int) -> FloatArray:
    """RTT-like costs: regional clusters make many nodes nearly as good as the best."""
    rng = np.random.default_rng(seed)
    centres = rng.random((6, 2)) * 100
    node_xy = centres[rng.integers(0, 6, nodes)] + rng.normal(0, 5, (nodes, 2))
    site_xy = centres[rng.integers(0, 6, tasks)] + rng.normal(0, 8, (tasks, 2))
    distance = np.linalg.norm(site_xy[:, None, :] - node_xy[None, :, :], axis=2)
    cost: FloatArray = (5.0 + distance) * rng.lognormal(0.0, 0.1, (tasks, nodes))
    return cost


def best_of(repeats: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """Best wall time of ``repeats`` runs with cyclic GC paused, as ``timeit`` does."""
    best = float("inf")
    result: Any = None
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = run()
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best, result


def reference_mismatches(count: int, max_size: int, seed: int) -> int:
    """Random matrices on which the reference is not a valid optimal matching."""
    rng = np.random.default_rng(seed)
    bad = 0
    for i in range(count):
        rows, cols = (int(x) for x in rng.integers(1, max_size + 1, size=2))
        if i % 3 == 0:  # square
            cols = rows
        if i % 2:
            cost = rng.integers(0, 5, size=(rows, cols)).astype(np.float64)
        else:
            cost = rng.normal(0.0, 10.0, size=(rows, cols))
        r_ref, c_ref = hungarian_reference(cost)
        r_sp, c_sp = linear_sum_assignment(cost)
        valid = (
            len(r_ref) == min(rows, cols)
            and np.all(np.diff(r_ref) > 0)
            and len(np.unique(c_ref)) == len(c_ref)
        )
        scale = max(1.0, float(np.abs(cost).max()))
        if not valid or not np.isclose(
            cost[r_ref, c_ref].sum(), cost[r_sp, c_sp].sum(), rtol=0, atol=1e-9 * scale
        ):
            bad += 1
    return bad


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="2,000 reference matrices", tiny="")
    parser.add_argument("--tasks", type=int, default=None, help="partitions to place")
    parser.add_argument("--nodes", type=int, default=None, help="nodes to place them on")
    parser.add_argument("--matrices", type=int, default=None, help="reference check matrices")
    parser.add_argument("--max-size", type=int, default=None, help="largest reference matrix")
    _harness.add_repeats(parser, "timed runs (best is kept)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random input")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    config = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        tasks="tasks", nodes="nodes", matrices="matrices", max_size="max_size", repeats="repeats",
    )  # fmt: skip
    tasks, nodes, matrices = config.tasks, config.nodes, config.matrices
    max_size, repeats = config.max_size, config.repeats
    if tasks < 1 or nodes < 2 or matrices < 0 or max_size < 1:
        print("need tasks >= 1, nodes >= 2, matrices >= 0, max-size >= 1")
        return 2

    cost = latency_cost(tasks, nodes, args.seed)
    goal = targets(tasks, None, nodes)
    seconds, owners = best_of(repeats, lambda: assign_batched(cost))
    counts = np.bincount(owners, minlength=nodes)
    ok = bool(np.all(owners >= 0) and np.array_equal(counts, goal))
    rows = np.arange(tasks)
    total = float(cost[rows, owners].sum())
    shuffled = np.random.default_rng(args.seed).permutation(np.repeat(np.arange(nodes), goal))
    random_total = float(cost[rows, shuffled].sum())
    lower = float(cost.min(axis=1).sum())
    print(
        f"assign_batched: {tasks:,} partitions on {nodes} nodes in {seconds:.3f} s "
        f"(best of {repeats}); per-node counts {counts.min()}..{counts.max()}, targets "
        f"{'held' if ok else 'VIOLATED'}; total cost {total:,.0f} vs random balanced "
        f"{random_total:,.0f} (cheapest-node bound {lower:,.0f})"
    )
    verdict = "met" if seconds < TARGET_SECONDS else "MISSED"
    print(f"assign_batched seconds: {seconds:.3g} s (target < {TARGET_SECONDS:g} s: {verdict})")

    # The last node leaves; surviving indices are unchanged, so `owners` is
    # still a valid `current` (the departed node's index is now out of range).
    survivors = cost[:, :-1]
    orphans = int(np.count_nonzero(owners == nodes - 1))
    reassign_seconds, (after, moved_survivors) = best_of(
        repeats, lambda: reassign(survivors, owners)
    )
    moved = int(np.count_nonzero(after != owners))
    after_counts = np.bincount(after, minlength=nodes - 1)
    ok = ok and bool(np.array_equal(after_counts, targets(tasks, None, nodes - 1)))
    print(
        f"reassign after node {nodes - 1} leaves: {reassign_seconds:.3f} s; {moved} partitions "
        f"moved, {orphans} of them forced (the departed node's); surviving owners lost "
        f"{moved_survivors}"
    )

    started = time.perf_counter()
    mismatches = reference_mismatches(matrices, max_size, args.seed)
    check_seconds = time.perf_counter() - started
    print(
        f"hungarian_reference vs scipy: {mismatches} mismatches on {matrices:,} matrices "
        f"of 1..{max_size} rows/columns ({check_seconds:.1f} s)"
    )

    big = np.random.default_rng(args.seed).random((60, 60))
    ref_seconds, _ = best_of(repeats, lambda: hungarian_reference(big))
    scipy_seconds, _ = best_of(repeats, lambda: linear_sum_assignment(big))
    ratio = _common.ratio(ref_seconds, scipy_seconds)
    print(
        f"60 x 60: reference {ref_seconds * 1e3:.2f} ms, scipy {scipy_seconds * 1e3:.3f} ms "
        f"({ratio:,.0f}x)"
    )

    _common.emit_json(
        {
            "seconds": seconds,
            "target_met": seconds < TARGET_SECONDS,
            "tasks": tasks,
            "nodes": nodes,
            "total_cost": total,
            "random_cost": random_total,
            "lower_bound_cost": lower,
            "reassign_seconds": reassign_seconds,
            "moved": moved,
            "moved_lower_bound": orphans,
            "moved_survivors": moved_survivors,
            "mismatches": mismatches,
            "matrices": matrices,
            "reference_60_seconds": ref_seconds,
            "scipy_60_seconds": scipy_seconds,
            "reference_vs_scipy_60": _common.finite_or_none(ratio),
        }
    )
    return 0 if ok and mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
