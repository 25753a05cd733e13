"""The cache-based extendible-hash directory: model-checked, hot hosts, cache, merges, state,
the state codec and invariant checker modules and the seams they use."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from scrapy_banker.core import directory_check, directory_state
from scrapy_banker.core.directory import BucketParts, ExtendibleDirectory
from scrapy_banker.core.hashing import bkdr

# -- model-based stateful test -------------------------------------------------------------

KEYS = [f"k{i}" for i in range(12)]

# Few distinct low bits so that keys collide and splits go deep; a couple of
# values with high bits set so that max_depth > 4 splits still separate some.
HASHES = st.one_of(
    st.integers(0, 15),
    st.sampled_from([0, 1, 16, 32, 48, 2**31, 2**31 + 1, 2**32 - 1, 2**32 - 16]),
)


class DirectoryMachine(RuleBasedStateMachine):
    """Random add/remove_load/discard against a plain dict; every step checks
    the invariants, the contents, and what a listener learnt from on_move."""

    def __init__(self) -> None:
        super().__init__()
        self.d: ExtendibleDirectory[str] = ExtendibleDirectory()
        self.model: dict[str, int] = {}
        self.hash_of: dict[str, int] = {}
        self.view: dict[str, int] = {}

    def _listen(self, key: str, old: int, new: int) -> None:
        assert old != new
        assert self.view.get(key) == old, (key, old, new, self.view.get(key))
        self.view[key] = new

    @initialize(
        capacity=st.integers(1, 12),
        max_depth=st.integers(0, 6),
        cache_capacity=st.integers(0, 4),
        hashes=st.lists(HASHES, min_size=len(KEYS), max_size=len(KEYS)),
    )
    def setup(self, capacity: int, max_depth: int, cache_capacity: int, hashes: list[int]) -> None:
        self.d = ExtendibleDirectory(capacity, max_depth, cache_capacity)
        self.d.on_move(self._listen)
        self.hash_of = dict(zip(KEYS, hashes, strict=True))

    @rule(key=st.sampled_from(KEYS), load=st.integers(0, 15))
    def add(self, key: str, load: int) -> None:
        bucket = self.d.add(key, self.hash_of[key], load)
        self.model[key] = self.model.get(key, 0) + load
        self.view[key] = bucket
        assert bucket == self.d.bucket_of(key)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def remove_load(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        load = data.draw(st.integers(0, self.model[key]))
        before = self.d.bucket_of(key)
        assert self.d.remove_load(key, load) == before
        self.model[key] -= load
        if self.model[key] == 0:
            del self.model[key]
            del self.view[key]

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def remove_too_much(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        before = self.d.to_state()
        with pytest.raises(ValueError, match="only has"):
            self.d.remove_load(key, self.model[key] + 1)
        assert self.d.to_state() == before

    @rule(key=st.sampled_from(KEYS))
    def remove_unknown_or_discard(self, key: str) -> None:
        if key not in self.model:
            with pytest.raises(KeyError, match="unknown queue key"):
                self.d.remove_load(key)
        self.d.discard(key)
        self.model.pop(key, None)
        self.view.pop(key, None)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def wrong_hash(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        with pytest.raises(ValueError, match="hash cannot change"):
            self.d.add(key, (self.hash_of[key] + 1) % 2**32)

    @rule()
    def round_trip(self) -> None:
        state = json.loads(json.dumps(self.d.to_state()))
        restored = ExtendibleDirectory.from_state(state)
        assert restored.to_state() == self.d.to_state()
        self.d = restored
        self.d.on_move(self._listen)

    @invariant()
    def consistent(self) -> None:
        d = self.d
        d.check_invariants()
        assert len(d) == len(self.model)
        assert {k: d.load_of(k) for k in KEYS if k in d} == self.model
        seen: dict[str, int] = {}
        for bucket_id in d.buckets():
            for key in d.bucket_keys(bucket_id):
                assert key not in seen, f"{key} in buckets {seen[key]} and {bucket_id}"
                seen[key] = bucket_id
            assert d.bucket_load(bucket_id) == sum(self.model[k] for k in d.bucket_keys(bucket_id))
            lg, bnp = d.flags(bucket_id)
            assert lg == int(d.local_depth(bucket_id) == d.global_depth)
            assert bnp == int(any(d.in_cache(k) for k in d.bucket_keys(bucket_id)))
        assert seen == {k: d.bucket_of(k) for k in self.model}
        assert self.view == seen
        assert d.cache_size == sum(d.in_cache(k) for k in self.model) <= d.cache_capacity
        assert d.directory_size == 2**d.global_depth
        for key in self.model:  # a cache record is still found through its bucket
            assert d.lookup(self.hash_of[key]) == d.bucket_of(key)
        # Proven with any add/remove history: same-LL buddies hold > capacity/2
        # together, so there are B < 2 * total / capacity "bottom" pairs, every
        # other bucket is the lone leaf child of one of the <= B * GL split nodes
        # above them: n_buckets <= B * (GL + 2), and a single bucket when empty.
        total = sum(self.model.values())
        assert d.n_buckets <= max(1, 2 * total / d.capacity * (d.global_depth + 2))


DirectoryMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDirectoryModel = DirectoryMachine.TestCase


# -- hot host alone ------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["hot_first", "hot_last", "interleaved"])
def test_hot_host_ends_alone_and_buckets_stay_few(order: str) -> None:
    capacity = 200
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=capacity)
    hosts = [f"host{i}.example.com" for i in range(1000)]
    hot = "hot.example.org"
    if order == "hot_first":
        d.add(hot, bkdr(hot), 5000)
    for host in hosts:
        d.add(host, bkdr(host))
        if order == "interleaved":
            d.add(hot, bkdr(hot), 5)
    if order == "hot_last":
        d.add(hot, bkdr(hot), 5000)
    d.check_invariants()

    hot_bucket = d.bucket_of(hot)
    assert d.bucket_keys(hot_bucket) == {hot}
    assert d.bucket_load(hot_bucket) == 5000  # over capacity, alone: the desired outcome
    for bucket_id in d.buckets():
        if bucket_id != hot_bucket:
            assert d.bucket_load(bucket_id) <= capacity

    total = 1000 + 5000
    # Proven (adds only): split buckets of one depth own disjoint hash classes,
    # each with load > capacity, so there are at most total // (capacity + 1)
    # splits per depth and n_buckets = 1 + splits <= 1 + GL * (total // (capacity + 1)).
    assert d.n_buckets <= 1 + d.global_depth * (total // (capacity + 1))
    # Observed (17 buckets, GL = 12): the useful buckets plus the chain of small
    # ones cut off the hot host's path, at most one per depth.
    assert d.n_buckets <= math.ceil(total / (capacity / 2)) + d.global_depth
    assert d.n_buckets < 40


def test_hot_host_alone_does_not_split_forever() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=10, max_depth=8)
    assert d.add("hot", 0b1010, 1000) == 0
    assert (d.n_buckets, d.splits, d.global_depth) == (1, 0, 0)
    d.add("other", 0b0010, 1)  # shares the low 3 bits: splits 4 times to separate
    d.check_invariants()
    assert d.bucket_of("hot") != d.bucket_of("other")
    assert d.local_depth(d.bucket_of("hot")) == 4
    assert d.splits == 4 and d.global_depth == 4 and d.n_buckets == 5


# -- cache bucket: LG / BNP ----------------------------------------------------------------


def test_overflow_uses_cache_bucket_and_flags() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=10, max_depth=2, cache_capacity=2)
    moves: list[tuple[str, int, int]] = []
    d.on_move(lambda key, old, new: moves.append((key, old, new)))
    # Hashes all end in 0b00: at max_depth 2 they can never be separated.
    for i, load in enumerate([3, 2, 1]):
        d.add(f"small{i}", 0b100 * (i + 1), load)
    d.add("other", 0b01, 4)  # bit 0 set: separates at depth 1 below
    assert d.n_buckets == 1
    b0 = d.add("big", 0b10000, 8)  # bucket load 18 > 10: split, split, then overflow
    d.check_invariants()
    assert d.global_depth == 2
    assert d.local_depth(b0) == 2
    assert d.flags(b0) == (1, 1)  # LL == GL and overflow records in the cache
    assert d.cache_size == 2  # the two smallest others (1 and 2) went to the cache
    assert d.in_cache("small2") and d.in_cache("small1") and not d.in_cache("small0")
    assert d.resident_load(b0) == 11  # still over: the cache is full, nothing is lost
    assert d.bucket_load(b0) == 14
    assert d.bucket_keys(b0) == {"small0", "small1", "small2", "big"}
    assert d.bucket_of("small2") == b0  # cache records still belong to their bucket
    other = d.bucket_of("other")
    assert d.local_depth(other) == 1 and d.flags(other) == (0, 0)
    assert {key for key, _, _ in moves} == {"other"}  # the cache keeps bucket ids

    d.remove_load("big", 8)  # resident 3 < capacity / 2: the cache records come home
    d.check_invariants()
    assert d.cache_size == 0 and d.flags(b0) == (1, 0)
    assert d.resident_load(b0) == 6


def test_cache_records_keep_their_load_and_come_home_on_merge() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=4, max_depth=1, cache_capacity=8)
    d.add("a", 0, 2)
    d.add("b", 2, 1)
    bucket = d.add("c", 4, 2)  # 5 > 4, all even: one useless split, then "b" to the cache
    d.check_invariants()
    assert d.in_cache("b") and d.flags(bucket) == (1, 1)
    assert d.resident_load(bucket) == 4 and d.bucket_load(bucket) == 5
    d.add("b", 2, 5)  # load added to a cached record stays in the cache
    assert d.in_cache("b") and d.load_of("b") == 6 and d.resident_load(bucket) == 4
    d.remove_load("b", 5)
    d.discard("a")  # resident 2 is not < capacity / 2: "b" stays cached
    assert d.in_cache("b")
    d.discard("c")  # resident 0: "b" comes home, and the buddies merge back to GL = 0
    d.check_invariants()
    assert not d.in_cache("b") and d.cache_size == 0
    assert d.global_depth == 0 and d.flags(d.bucket_of("b")) == (1, 0)


def test_zero_cache_capacity_leaves_bucket_over_capacity() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=2, max_depth=0, cache_capacity=0)
    for i in range(5):
        assert d.add(f"k{i}", i, 1) == 0
    d.check_invariants()
    assert d.bucket_load(0) == 5 and d.cache_size == 0 and len(d) == 5


# -- merges --------------------------------------------------------------------------------


def test_merges_bring_bucket_count_back_down() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=50)
    hosts = [f"site{i}.example.net" for i in range(2000)]
    for host in hosts:
        d.add(host, bkdr(host), 3)
    d.check_invariants()
    peak = d.n_buckets
    assert peak >= 6000 // 50 and d.global_depth > 5
    for host in hosts[::2]:
        d.remove_load(host, 3)
    d.check_invariants()
    assert d.n_buckets < peak
    for host in hosts[1::2]:
        d.remove_load(host, 3)
    d.check_invariants()
    assert (len(d), d.n_buckets, d.global_depth, d.directory_size) == (0, 1, 0, 1)
    assert d.merges == d.splits == peak - 1
    assert len(d.buckets()) == 1


def test_merge_reports_moves_and_bucket_ids_are_reused() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=4)
    moves: list[tuple[str, int, int]] = []
    d.on_move(lambda key, old, new: moves.append((key, old, new)))
    d.add("even", 0, 3)
    d.add("odd", 1, 1)
    assert d.add("odd", 1, 1) == 1  # load 5 > 4: split, "odd" moves to the new bucket 1
    assert moves == [("odd", 0, 1)]
    assert d.remove_load("even", 3) == 0  # 0 + 2 <= 4/2: merge, "even" record gone
    d.check_invariants()
    assert d.n_buckets == 1 and d.merges == 1 and d.global_depth == 0
    assert d.bucket_of("odd") == 1  # the bucket with more records survives
    assert moves == [("odd", 0, 1)]
    d.add("odd2", 3, 3)  # split again: the freed id 0 is reused
    assert d.bucket_of("odd") == 0 and d.n_buckets == 3


def test_new_key_moved_by_its_own_add_is_not_reported() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=4)
    moves: list[tuple[str, int, int]] = []
    d.on_move(lambda key, old, new: moves.append((key, old, new)))
    d.add("a", 0, 3)
    assert d.add("b", 0b110, 2) == 2  # two useless splits, "b" lands in bucket 2
    assert moves == []
    assert d.add("c", 0b010, 4) == 2  # split on bit 2: "b" (known) moves to 3, "c" stays
    assert moves == [("b", 2, 3)]


def test_hysteresis_no_thrash_around_capacity() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=10)
    d.add("a", 0, 5)
    d.add("b", 1, 6)
    assert d.splits == 1
    for _ in range(100):
        d.remove_load("b")
        d.add("b", 1)
    assert (d.splits, d.merges) == (1, 0)


# -- state ---------------------------------------------------------------------------------


def _busy_directory() -> ExtendibleDirectory[str]:
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=20, max_depth=3, cache_capacity=3)
    for i in range(60):
        d.add(f"h{i}", bkdr(f"h{i}") if i % 3 else 8 * i, 1 + i % 7)
    for i in range(60):
        if i % 3 and i % 4:
            d.discard(f"h{i}")
    d.check_invariants()
    assert d.cache_size > 0 and d.merges > 0
    return d


_BUSY_STATE = _busy_directory().to_state()


def test_state_round_trip_is_exact() -> None:
    d = _busy_directory()
    state = d.to_state()
    restored = ExtendibleDirectory.from_state(json.loads(json.dumps(state)))
    assert restored.to_state() == state
    assert restored.buckets() == d.buckets()
    for key in d:
        assert restored.bucket_of(key) == d.bucket_of(key)
        assert restored.in_cache(key) == d.in_cache(key)
    # Future behaviour matches too (same record order, same free bucket ids).
    for directory in (d, restored):
        for i in range(60, 90):
            directory.add(f"h{i}", bkdr(f"h{i}"), 4)
        directory.discard("h1")
    assert restored.to_state() == d.to_state()


def _mutations() -> list[tuple[str, Any]]:
    def set_(field: str, value: Any) -> Any:
        def apply(s: dict[str, Any]) -> None:
            s[field] = value

        return apply

    def first_bucket(field: str, value: Any) -> Any:
        def apply(s: dict[str, Any]) -> None:
            s["buckets"][0][field] = value

        return apply

    def first_record(index: int, value: Any) -> Any:
        def apply(s: dict[str, Any]) -> None:
            next(b for b in s["buckets"] if b["records"])["records"][0][index] = value

        return apply

    def drop(field: str) -> Any:
        def apply(s: dict[str, Any]) -> None:
            del s[field]

        return apply

    def duplicate_record(s: dict[str, Any]) -> None:
        bucket = next(b for b in s["buckets"] if b["records"])
        bucket["records"].append(list(bucket["records"][0]))

    def swap_directory(s: dict[str, Any]) -> None:
        s["directory"][0], s["directory"][1] = s["directory"][1], s["directory"][0]

    def move_record(s: dict[str, Any]) -> None:
        src = next(b for b in s["buckets"] if b["records"])
        dst = next(b for b in s["buckets"] if b is not src)
        dst["records"].append(src["records"].pop())

    return [
        ("missing keys", drop("merges")),
        ("unexpected keys", set_("extra", 1)),
        ("version", set_("version", 2)),
        ("capacity must be", set_("capacity", 0)),
        ("global_depth", set_("global_depth", 99)),
        ("directory must be", set_("directory", [0])),
        ("directory entry", lambda s: s.update(directory=["x"] * len(s["directory"]))),
        ("local_depth", first_bucket("local_depth", -1)),
        ("bucket id", first_bucket("id", "zero")),
        ("load", first_record(2, -3)),
        ("hash", first_record(1, 2**32)),
        ("not a str", first_record(0, 7)),
        ("duplicated", duplicate_record),
        ("directory entry|directory entries", swap_directory),
        ("not in bucket|merge", move_record),
        ("splits", set_("splits", -1)),
        ("capacity", set_("capacity", 2)),  # buckets now over capacity and unsplit
    ]


@pytest.mark.parametrize(("match", "mutate"), _mutations())
def test_malformed_state_is_refused(match: str, mutate: Any) -> None:
    state = json.loads(json.dumps(_busy_directory().to_state()))
    mutate(state)
    with pytest.raises(ValueError, match=f"malformed directory state: .*({match})"):
        ExtendibleDirectory.from_state(state)


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**33),
    st.text(max_size=3),
    st.lists(st.integers(-1, 9), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_fuzzed_state_is_refused_or_consistent(data: st.DataObject) -> None:
    """Replacing any one value of a good state gives ValueError or a valid directory."""
    state = json.loads(json.dumps(_BUSY_STATE))
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            paths.append((node, k))
            if isinstance(v, (dict, list)):
                walk(v)

    walk(state)
    parent, k = data.draw(st.sampled_from(paths))
    parent[k] = data.draw(JSON_VALUES)
    try:
        restored = ExtendibleDirectory.from_state(state)
    except ValueError as exc:
        assert str(exc).startswith("malformed directory state: ")
    else:
        restored.check_invariants()


# Written by ExtendibleDirectory.to_state() before persistence left the class
# (json.dumps, default separators), from the operations below: a JOBDIR
# snapshot holds exactly this, so it must load and re-encode byte for byte.
# It has a freed id (0), buckets of LL 1, 2 and 3 under GL 3, a cache record.
# (key, hash, load): a negative load is a remove_load.
_PRE_SPLIT_OPS = [
    ("h.example", 3, 3), ("j.example", 12, 3), ("a.example", 6, 2), ("d.example", 4, 1),
    ("g.example", 14, 1), ("a.example", 6, -1), ("b.example", 5, 1), ("j.example", 12, -3),
    ("e.example", 7, 3), ("d.example", 4, -1), ("h.example", 3, 1), ("e.example", 7, 3),
    ("g.example", 14, 2), ("f.example", 15, 3),
]  # fmt: skip
_PRE_SPLIT_STATE = (
    '{"format": "scrapy-banker/extendible-directory", "version": 1, "capacity": 4, '
    '"max_depth": 3, "cache_capacity": 2, "global_depth": 3, "splits": 4, "merges": 1, '
    '"directory": [2, 1, 2, 3, 2, 1, 2, 4], "buckets": ['
    '{"id": 1, "local_depth": 2, "records": [["b.example", 5, 1]], "cached": []}, '
    '{"id": 2, "local_depth": 1, "records": [["a.example", 6, 1], ["g.example", 14, 3]], '
    '"cached": []}, '
    '{"id": 3, "local_depth": 3, "records": [["h.example", 3, 4]], "cached": []}, '
    '{"id": 4, "local_depth": 3, "records": [["f.example", 15, 3]], '
    '"cached": [["e.example", 7, 6]]}]}'
)


def test_state_written_before_the_codec_moved_out_loads_and_reencodes_identically() -> None:
    saved = json.loads(_PRE_SPLIT_STATE)
    restored = ExtendibleDirectory.from_state(saved)
    assert restored.to_state() == saved
    assert json.dumps(restored.to_state()) == _PRE_SPLIT_STATE
    assert directory_state.to_state(restored) == saved
    assert restored.in_cache("e.example") and restored.bucket_of("e.example") == 4
    # The same operations today write the same state.
    d: ExtendibleDirectory[str] = ExtendibleDirectory(capacity=4, max_depth=3, cache_capacity=2)
    for key, h, load in _PRE_SPLIT_OPS:
        if load > 0:
            d.add(key, h, load)
        else:
            d.remove_load(key, -load)
    assert json.dumps(d.to_state()) == _PRE_SPLIT_STATE
    # ... and the freed id 0 is the next one handed out, as before the save.
    for directory in (d, restored):
        directory.add("g2.example", 0b0110, 2)
    assert restored.to_state() == d.to_state()
    assert 0 in d.buckets()


def test_codec_and_checker_modules_match_the_methods() -> None:
    d = _busy_directory()
    assert directory_state.to_state(d) == d.to_state()
    assert directory_state.from_state(d.to_state()).to_state() == d.to_state()
    state = d.to_state()
    assert (state["format"], state["version"]) == (
        directory_state.STATE_FORMAT,
        directory_state.STATE_VERSION,
    )
    directory_check.check_invariants(d)


def test_layout_is_a_read_only_view() -> None:
    d = _busy_directory()
    lay = d.layout()
    assert len(lay.table) == d.directory_size and lay.mask == d.directory_size - 1
    assert sorted(lay.buckets) == d.buckets() and set(lay.records) == set(d)
    assert {k for k, r in lay.records.items() if r.cached} == set(lay.cache)
    for bucket_id, b in lay.buckets.items():
        assert set(b.records) | set(b.cached) == d.bucket_keys(bucket_id)
        assert b.load == d.resident_load(bucket_id)
        assert all(r.bucket is b for r in b.records.values())
    with pytest.raises(TypeError):
        lay.records["x"] = lay.records["h0"]  # type: ignore[index]
    with pytest.raises(TypeError):
        lay.table[0] = lay.table[1]  # type: ignore[index]


def test_assemble_verifies_the_parts() -> None:
    parts = [
        BucketParts(0, 1, [("even", 0, 3)], []),
        BucketParts(1, 1, [("odd", 1, 2)], []),
    ]
    d = ExtendibleDirectory.assemble(4, 8, 0, table=[0, 1], buckets=parts, splits=1, merges=0)
    assert (d.global_depth, d.bucket_of("odd"), d.bucket_load(0), len(d)) == (1, 1, 3, 2)
    d.add("odd2", 3, 1)
    assert d.bucket_of("odd2") == 1
    # Together 5 > capacity / 2 = 2: legal.  With capacity 16 they should have merged.
    with pytest.raises(AssertionError, match="did not merge"):
        ExtendibleDirectory.assemble(16, 8, 0, table=[0, 1], buckets=parts, splits=1, merges=0)
    # The table swapped: bucket 0 now owns the odd hashes, but holds "even".
    with pytest.raises(AssertionError, match="'even' hash 0x0 not in bucket 0"):
        ExtendibleDirectory.assemble(4, 8, 0, table=[1, 0], buckets=parts, splits=1, merges=0)


def test_state_needs_a_mapping_and_str_keys() -> None:
    with pytest.raises(ValueError, match="expected a mapping"):
        ExtendibleDirectory.from_state([])  # type: ignore[arg-type]
    d: ExtendibleDirectory[int] = ExtendibleDirectory()
    d.add(1, 1)
    with pytest.raises(ValueError, match="needs str keys"):
        d.to_state()


# -- argument errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, r"capacity must be an integer >= 1, got 0"),
        ({"capacity": 2.5}, r"capacity must be an integer >= 1, got 2.5"),
        ({"capacity": True}, r"capacity must be an integer >= 1, got True"),
        ({"max_depth": -1}, r"max_depth must be an integer from 0 to 32, got -1"),
        ({"max_depth": 33}, r"max_depth must be an integer from 0 to 32, got 33"),
        ({"cache_capacity": -5}, r"cache_capacity must be an integer >= 0, got -5"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ExtendibleDirectory(**kwargs)


def test_bad_call_arguments() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory()
    with pytest.raises(ValueError, match=r"hash must be an integer from 0 to 2\*\*32 - 1, got -1"):
        d.add("a", -1)
    with pytest.raises(ValueError, match=r"hash must be .* got 4294967296"):
        d.add("a", 2**32)
    with pytest.raises(ValueError, match=r"hash must be .* got '12'"):
        d.lookup("12")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"load must be an integer >= 0, got -1"):
        d.add("a", 1, -1)
    assert "a" not in d and len(d) == 0
    d.add("a", 1, 2)
    with pytest.raises(ValueError, match=r"key 'a' was added with hash 1, got hash 2"):
        d.add("a", 2)
    with pytest.raises(ValueError, match=r"cannot remove load 3 from queue key 'a': it only has 2"):
        d.remove_load("a", 3)
    with pytest.raises(ValueError, match=r"load must be an integer >= 0, got 1.0"):
        d.remove_load("a", 1.0)  # type: ignore[arg-type]
    for call in (d.remove_load, d.bucket_of, d.load_of, d.in_cache):
        with pytest.raises(KeyError, match=r"unknown queue key 'zz'"):
            call("zz")
    for bucket_call in (d.bucket_keys, d.bucket_load, d.local_depth, d.flags):
        with pytest.raises(KeyError, match=r"unknown bucket id 9"):
            bucket_call(9)
    d.discard("zz")  # like set.discard: no error
    assert [] not in d  # unhashable: simply not a key
    assert d.load_of("a") == 2
    d.check_invariants()


def test_initial_state_matches_paper() -> None:
    d: ExtendibleDirectory[str] = ExtendibleDirectory()
    # One bucket, LL = 0, RU = 0, one directory entry pointing to it.
    assert (d.n_buckets, d.global_depth, d.directory_size, len(d)) == (1, 0, 1, 0)
    assert d.local_depth(0) == 0 and d.bucket_load(0) == 0 and d.flags(0) == (1, 0)
    assert d.lookup(2**32 - 1) == 0
    d.add("zero", 5, 0)  # a record may exist with no load yet
    assert "zero" in d and d.load_of("zero") == 0
    assert d.remove_load("zero", 0) == 0 and "zero" not in d
