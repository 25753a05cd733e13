"""Banker's algorithm core: the paper's examples, bad input, and the fast check vs the naive one."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_banker.core.bankers_algorithm import BankersState, naive_safe_sequence


def test_paper_example_four_processes_twenty_units() -> None:
    """§1.3: P1..P4 need 15, 5, 8, 10 of 20 units and hold 8, 4, 4, 2: safe."""
    state = BankersState({"units": 20})
    for pid, claim, held in (("P1", 15, 8), ("P2", 5, 4), ("P3", 8, 4), ("P4", 10, 2)):
        state.add_process(pid, {"units": claim})
        assert state.request(pid, {"units": held}).granted
    assert state.available.tolist() == [2]
    assert state.is_safe()
    # The paper prints <P1, P2, P3, P4>, but P1 needs 7 > 2 free: a real safe
    # order starts with P2 (needs 1), after which P3 (4 <= 6) and P4 (8 <= 10) fit.
    assert state.safe_sequence() == ["P2", "P3", "P4", "P1"]
    # Granting P4 its 2 free units would leave 0 free and nobody able to finish.
    decision = state.request("P4", {"units": 2})
    assert not decision.granted and decision.reason == "unsafe"
    assert state.available.tolist() == [2]  # rolled back
    # P2's last unit is safe: it can finish and return 5.
    assert state.request("P2", {"units": 1}).granted
    assert state.finish("P2") == {"units": 5}
    assert state.available.tolist() == [6]


def test_paper_example_ten_resources() -> None:
    """§2.3: available [5]*10, process0 max [1,1,2,1,...], request [1]*10: safe, granted."""
    names = [f"r{i}" for i in range(10)]
    state = BankersState(dict.fromkeys(names, 5))
    claim = [1, 1, 2, 1, 1, 1, 1, 1, 1, 1]
    state.add_process("process0", dict(zip(names, claim, strict=True)))
    assert state.need_of("process0") == dict(zip(names, claim, strict=True))
    assert state.is_safe()
    assert state.request("process0", dict.fromkeys(names, 1)).granted
    assert state.available.tolist() == [4] * 10
    assert state.need_of("process0") == dict(zip(names, [0, 0, 1] + [0] * 7, strict=True))


def test_insufficient_is_not_unsafe() -> None:
    state = BankersState({"pages": 2})
    state.add_process("a", {"pages": 2})
    state.add_process("b", {"pages": 2})
    assert state.request("a", {"pages": 2}).granted
    decision = state.request("b", {"pages": 1})
    assert (decision.granted, decision.reason) == (False, "insufficient")


def test_hold_and_wait_deadlock_is_avoided() -> None:
    """Two tasks each needing 2 browser pages of 2: a naive allocator gives each one."""
    state = BankersState({"pages": 2})
    state.add_process("t1", {"pages": 2})
    state.add_process("t2", {"pages": 2})
    assert state.request("t1", {"pages": 1}).granted
    assert state.request("t2", {"pages": 1}).reason == "unsafe"  # would deadlock
    assert state.request("t1", {"pages": 1}).granted
    state.finish("t1")
    assert state.request("t2", {"pages": 2}).granted


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda s: s.add_process("x", {"pages": 3}),
            r"max claim of 'x' asks 3 'pages', more than the total 2",
        ),
        (
            lambda s: s.add_process("x", {"gpus": 1}),
            r"unknown resource 'gpus'; known: \['pages', 'slots'\]",
        ),
        (lambda s: s.add_process("x", {"pages": -1}), r"must be >= 0, got -1"),
        (lambda s: s.add_process("x", {"pages": 1.5}), r"must be an integer, got 1.5"),
        (lambda s: s.add_process("a", {"pages": 1}), r"process 'a' is already declared"),
        (lambda s: s.request("a", {"pages": 2}), r"asks 2 'pages' but its declared need is 1"),
        (lambda s: s.request("nobody", {"pages": 1}), r"unknown process 'nobody'"),
        (lambda s: s.release("a", {"pages": 1}), r"returns 1 'pages' but it holds 0"),
        (lambda s: s.request("a", ["pages"]), r"must be a mapping"),
    ],
)
def test_bad_input_is_refused_clearly(call: object, match: str) -> None:
    state = BankersState({"pages": 2, "slots": 4})
    state.add_process("a", {"pages": 1})
    with pytest.raises((ValueError, KeyError), match=match):
        call(state)  # type: ignore[operator]


def test_bad_totals() -> None:
    with pytest.raises(ValueError, match="at least one resource"):
        BankersState({})
    with pytest.raises(ValueError, match=r"total\['x'\] must be >= 0"):
        BankersState({"x": -2})


def test_snapshot_and_format() -> None:
    state = BankersState({"slots": 4, "pages": 2})
    state.add_process("task-1", {"slots": 2, "pages": 1})
    state.request("task-1", {"slots": 1})
    snap = json.loads(json.dumps(state.snapshot()))
    assert snap["available"] == {"slots": 3, "pages": 2}
    assert snap["processes"]["task-1"]["need"] == {"slots": 1, "pages": 1}
    text = state.format()
    assert "available" in text and "task-1" in text and "need" in text


def test_rows_are_reused() -> None:
    state = BankersState({"u": 10})
    for i in range(100):
        state.add_process(i, {"u": 1})
        state.request(i, {"u": 1})
        state.finish(i)
    assert len(state) == 0 and state.available.tolist() == [10]
    assert state._max.shape[0] <= 16


@st.composite
def states(draw: st.DrawFn) -> tuple[list[int], list[list[int]], list[list[int]]]:
    m = draw(st.integers(1, 4))
    n = draw(st.integers(0, 12))
    total = draw(st.lists(st.integers(0, 12), min_size=m, max_size=m))
    alloc, need = [], []
    free = list(total)
    for _ in range(n):
        a = [draw(st.integers(0, f)) for f in free]
        free = [f - x for f, x in zip(free, a, strict=True)]
        alloc.append(a)
        need.append([draw(st.integers(0, t - x)) for t, x in zip(total, a, strict=True)])
    return total, alloc, need


def _load(total: list[int], alloc: list[list[int]], need: list[list[int]]) -> BankersState:
    names = [f"r{i}" for i in range(len(total))]
    state = BankersState(dict(zip(names, total, strict=True)))
    for i, (a, nd) in enumerate(zip(alloc, need, strict=True)):
        state.add_process(
            i, dict(zip(names, [x + y for x, y in zip(a, nd, strict=True)], strict=True))
        )
        state._alloc[state._rows[i]] = a
        state.available -= np.array(a, dtype=np.int64)
    return state


@settings(max_examples=400, deadline=None)
@given(states())
def test_fast_check_agrees_with_the_papers_algorithm(
    sample: tuple[list[int], list[list[int]], list[list[int]]],
) -> None:
    total, alloc, need = sample
    state = _load(total, alloc, need)
    naive = naive_safe_sequence(state.available.tolist(), alloc, need)
    assert state.is_safe() == (naive is not None)


@settings(max_examples=100, deadline=None)
@given(states(), st.data())
def test_granted_requests_keep_the_state_safe(
    sample: tuple[list[int], list[list[int]], list[list[int]]], data: st.DataObject
) -> None:
    total, alloc, need = sample
    state = _load(total, alloc, need)
    if not state.is_safe() or not len(state):
        return
    for _ in range(10):
        pid = data.draw(st.sampled_from(list(state._rows)))
        need_vec = state.need_of(pid)
        req = {r: data.draw(st.integers(0, v)) for r, v in need_vec.items()}
        before = state.available.copy()
        decision = state.request(pid, req)
        if decision.granted:
            assert naive_safe_sequence(*_matrices(state)) is not None
        else:
            assert (state.available == before).all()


def _matrices(state: BankersState) -> tuple[list[int], list[list[int]], list[list[int]]]:
    rows = list(state._rows.values())
    return (
        state.available.tolist(),
        state._alloc[rows].tolist(),
        (state._max[rows] - state._alloc[rows]).tolist(),
    )
