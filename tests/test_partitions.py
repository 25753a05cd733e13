"""Two-level mapping: balanced by capacity, minimal moves on join/leave, fencing epochs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_banker.hashing import bkdr
from scrapy_banker.partitions import PartitionTable, target_counts


def test_targets_are_proportional_and_sum_up() -> None:
    assert target_counts(10, {"a": 1, "b": 1}) == {"a": 5, "b": 5}
    assert target_counts(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert target_counts(1024, {"big": 3, "small": 1}) == {"big": 768, "small": 256}
    assert target_counts(5, {}) == {}
    with pytest.raises(ValueError, match="capacity of node 'x' must be > 0"):
        target_counts(5, {"x": 0})


def test_first_assignment_then_join_moves_only_a_fair_share() -> None:
    table = PartitionTable(1024)
    first = table.rebalance({"n1": 1, "n2": 1, "n3": 1})
    assert len(first) == 1024 and all(m.old is None for m in first)
    before = list(table.owners)
    moves = table.rebalance({"n1": 1, "n2": 1, "n3": 1, "n4": 1})
    assert len(moves) == 256  # exactly the newcomer's share
    assert all(m.new == "n4" for m in moves)
    changed = [p for p in range(1024) if table.owners[p] != before[p]]
    assert sorted(changed) == sorted(m.partition for m in moves)
    assert all(table.epochs[p] == 2 for p in changed)


def test_leave_moves_only_the_leavers_partitions() -> None:
    table = PartitionTable(1000)
    table.rebalance({"a": 1, "b": 1, "c": 1, "d": 1})
    leaving = set(table.owned_by("c"))
    moves = table.rebalance({"a": 1, "b": 1, "d": 1})
    assert {m.partition for m in moves} == leaving
    assert all(m.old == "c" for m in moves)
    assert sorted(table.counts().values()) == [333, 333, 334]


def test_all_nodes_gone_fences_everything() -> None:
    table = PartitionTable(8)
    table.rebalance({"a": 1})
    assert table.rebalance({}) == []
    assert table.owners == [None] * 8 and table.epochs == [2] * 8


def test_a_host_maps_to_one_partition_and_one_owner() -> None:
    table = PartitionTable(1024)
    table.rebalance({"a": 1, "b": 1})
    h = bkdr("h0042.farm.test")
    assert table.owner_of(h) == table.owners[table.partition_of(h)]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 300),
    st.lists(
        st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 4), max_size=6),
        min_size=1,
        max_size=6,
    ),
)
def test_rebalance_is_balanced_and_minimal(size: int, memberships: list[dict[str, int]]) -> None:
    table = PartitionTable(size)
    for caps in memberships:
        before = list(table.owners)
        old_counts = table.counts()
        targets = target_counts(size, caps)
        moves = table.rebalance(caps)
        if not caps:
            assert all(o is None for o in table.owners)
            continue
        assert table.counts() == {n: c for n, c in targets.items() if c}
        orphans = sum(1 for o in before if o is None or o not in caps)
        surplus = sum(max(0, old_counts.get(n, 0) - targets[n]) for n in caps)
        assert len(moves) == orphans + surplus  # the minimum for these targets
        assert len({m.partition for m in moves}) == len(moves)


def test_state_round_trip_and_validation() -> None:
    table = PartitionTable(16)
    table.rebalance({"a": 1, "b": 2})
    back = PartitionTable.from_state(json.loads(json.dumps(table.to_state())))
    assert back.owners == table.owners and back.epochs == table.epochs
    for bad, match in [
        ({"size": 2}, "needs size, owners, epochs"),
        ({"size": 2, "owners": [None], "epochs": [0, 0]}, "owners must be a list of 2"),
        ({"size": 2, "owners": [None, 3], "epochs": [0, 0]}, "owner of 1 is 3"),
        ({"size": 2, "owners": [None, None], "epochs": [0, -1]}, "epoch of 1 is -1"),
    ]:
        with pytest.raises(ValueError, match=match):
            PartitionTable.from_state(bad)
    with pytest.raises(ValueError, match="partitions must be an integer >= 1"):
        PartitionTable(0)
