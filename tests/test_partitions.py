"""Two-level mapping: balanced by capacity, minimal moves on join/leave, fencing epochs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_banker.core.hashing import bkdr
from scrapy_banker.net.partitions import PartitionTable, target_counts


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


def test_a_rebalance_deals_the_work_out_with_the_partitions() -> None:
    table = PartitionTable(64)
    table.rebalance({"a": 1})
    # All the work sits in a few partitions (the first worker of a fleet
    # leased every seed): a newcomer must get its share of those, not of the rest.
    work = [9 if p % 8 == 0 else 0 for p in range(64)]
    moves = table.rebalance({"a": 1, "b": 1}, work=work)
    assert len(moves) == 32 and all(m.old == "a" and m.new == "b" for m in moves)
    assert sum(work[p] for p in table.owned_by("b")) == sum(work) // 2
    moves = table.rebalance({"a": 1, "b": 1, "c": 1, "d": 1}, work=work)
    assert len(moves) == 32  # still the minimum
    assert sorted(sum(work[p] for p in table.owned_by(n)) for n in "abcd") == [18] * 4
    spread = [p % 5 for p in range(64)]
    table = PartitionTable(64)
    table.rebalance({"a": 1})
    table.rebalance({"a": 1, "b": 1}, work=spread)
    share = sum(spread[p] for p in table.owned_by("b"))
    assert abs(share - sum(spread) / 2) <= max(spread)


def _table(owners: list[str]) -> PartitionTable:
    table = PartitionTable(len(owners))
    table.assign(dict(enumerate(owners)))
    return table


def test_steal_takes_waiting_partitions_of_saturated_nodes_only() -> None:
    # a works on 3 partitions (leases) and has 4 waiting; b works on 1 and has 2 waiting.
    owners = ["a"] * 7 + ["b"] * 3 + ["t"] * 2
    queued = [0, 0, 0, 5, 9, 1, 7, 0, 4, 4, 0, 0]
    leased = [2, 2, 1, 0, 0, 0, 0, 3, 0, 0, 0, 0]
    table = _table(owners)
    epochs = list(table.epochs)
    caps = {"a": 1, "b": 1, "t": 1}
    moves = table.steal("t", caps, queued, leased, slots=3, limit=8)
    # b (1 partition in work < 3 slots) can start its waiting hosts itself: left alone.
    # a is saturated: half of its 4 waiting partitions go, the most queued first.
    assert [(m.partition, m.old, m.new) for m in moves] == [(4, "a", "t"), (6, "a", "t")]
    assert table.owners[4] == table.owners[6] == "t"
    assert [table.epochs[p] - epochs[p] for p in range(12)] == [0] * 4 + [1, 0, 1] + [0] * 5


def test_steal_takes_unleased_partitions_first_and_respects_the_limit() -> None:
    owners = ["a"] * 6 + ["t"]
    queued = [3, 3, 3, 3, 3, 3, 0]
    leased = [1, 1, 1, 0, 0, 0, 0]
    caps = {"a": 1, "t": 1}
    assert len(_table(owners).steal("t", caps, queued, leased, slots=3, limit=1)) == 1
    moves = _table(owners).steal("t", caps, queued, leased, slots=3, limit=9)
    assert {m.partition for m in moves} == {3, 4}  # half of 3 waiting, rounded up
    assert _table(owners).steal("t", caps, queued, [0] * 7, slots=3, limit=9) == []
    assert _table(owners).steal("t", caps, queued, leased, slots=3, limit=0) == []
    # A thief that is not live, or partitions of nodes that are not, are left alone.
    assert _table(owners).steal("x", caps, queued, leased, slots=3, limit=9) == []
    assert _table(owners).steal("t", {"t": 1}, queued, leased, slots=3, limit=9) == []


def test_steal_takes_leased_partitions_beyond_what_the_node_can_fetch() -> None:
    # a leased ahead in 6 partitions but fetches 2 hosts at once: it keeps its
    # two most leased (0, 1); of the 6 others with queued work (5 has none)
    # half go, those without a lease first, the most queued first.
    owners = ["a"] * 9 + ["t"]
    queued = [5, 5, 5, 5, 5, 0, 8, 2, 6, 0]
    leased = [4, 3, 1, 1, 1, 1, 0, 0, 0, 0]
    caps = {"a": 1, "t": 1}
    moves = _table(owners).steal("t", caps, queued, leased, slots=2, limit=9)
    assert [m.partition for m in moves] == [6, 8, 7]
    # Only leased partitions wait: they go too (the BUSY fence keeps the
    # thief off each host until a's leases there are released).
    owners = ["a"] * 5 + ["t"]
    moves = _table(owners).steal("t", caps, [5] * 5 + [0], [3, 2, 1, 1, 1, 0], slots=2, limit=9)
    assert [m.partition for m in moves] == [2, 3]


def test_the_version_travels_with_the_state() -> None:
    table = PartitionTable(4)
    table.rebalance({"a": 1})
    table.version = 7
    state = table.to_state()
    assert next(iter(state)) == "version"  # first: a worker reads it from the head of the JSON
    assert json.dumps(state).startswith('{"version": 7, ')
    assert PartitionTable.from_state(json.loads(json.dumps(state))).version == 7
    del state["version"]  # a table stored before versions existed
    assert PartitionTable.from_state(state).version == 0
    with pytest.raises(ValueError, match="version is -1"):
        PartitionTable.from_state({**state, "version": -1})
