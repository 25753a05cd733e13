"""The invariants of the cache-based extendible-hash directory, checked.

:func:`check_invariants` states, as executable checks, what the PQ-MCSA
paper's section 1.2.1 structures must satisfy -- NArray of ``2**GL`` bucket
pointers, each bucket with LL = M pointed to by the ``2**(GL-M)`` entries
ending in its M bits, lookup by the low GL bits then the cache bucket when
BNP = 1 -- plus what this implementation adds on top: load sums, the split and
merge hysteresis on ``capacity``, the cache bucket used only at ``max_depth``,
bucket id allocation.  The tests run it after every step of a model-based
test; :meth:`~scrapy_banker.core.directory.ExtendibleDirectory.assemble` runs
it on every directory rebuilt from parts, which is how an edited or truncated
JOBDIR snapshot is refused instead of loaded half-consistent.

It is a module of its own because it reads everything and changes nothing: it
sees the directory only through
:meth:`~scrapy_banker.core.directory.ExtendibleDirectory.layout` and its
public queries.  Failures raise ``AssertionError`` explicitly (not with
``assert``), so the checks survive ``python -O``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from scrapy_banker.core.directory import ExtendibleDirectory

__all__ = ["check_invariants"]

K = TypeVar("K", bound=Hashable)


def _require(condition: bool, message: str) -> None:
    """``assert`` that survives ``python -O`` (``from_state`` relies on it)."""
    if not condition:
        raise AssertionError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_invariants(directory: ExtendibleDirectory[K]) -> None:
    """Raise ``AssertionError`` naming the first violated invariant of ``directory``.

    Structure: NArray has ``2**GL`` entries, each pointing to a live bucket;
    a bucket with LL = M is pointed to by exactly ``2**(GL-M)`` entries, all
    ending in its M bits; GL = max LL (0 with a single bucket); the paper's
    lookup (low GL bits, then the cache bucket if BNP = 1) finds every record.
    Loads: bucket sums match; a bucket below ``max_depth`` with two or more
    records is within ``capacity`` (else it would have split); buddies of
    equal LL hold more than ``capacity / 2`` together (else they would have
    merged).  Cache: only buckets at ``max_depth`` use it, BNP = 1 exactly
    for them, and it holds at most ``cache_capacity`` records.
    """
    lay = directory.layout()
    gl = directory.global_depth
    cap = directory.capacity
    max_depth = directory.max_depth
    table = lay.table
    _require(0 <= gl <= max_depth, f"GL {gl} outside 0..max_depth {max_depth}")
    _require(len(table) == 1 << gl, f"directory has {len(table)} entries, GL={gl}")
    _require(lay.mask == (1 << gl) - 1, f"mask {lay.mask:#x} does not match GL {gl}")
    refs: dict[int, int] = {}
    for i, b in enumerate(table):
        _require(lay.buckets.get(b.id) is b, f"directory entry {i} -> dead bucket {b.id}")
        _require(
            i & ((1 << b.depth) - 1) == b.pattern,
            f"directory entry {i} -> bucket {b.id} (LL={b.depth}, bits {b.pattern:b})",
        )
        refs[b.id] = refs.get(b.id, 0) + 1
    depth_count = [0] * (max_depth + 1)
    n_records = n_cached = 0
    for bucket_id, b in lay.buckets.items():
        _require(b.id == bucket_id, f"bucket {b.id} filed under id {bucket_id}")
        _require(0 <= b.depth <= gl, f"bucket {bucket_id} has LL={b.depth} > GL={gl}")
        _require(0 <= b.pattern < 1 << b.depth, f"bucket {bucket_id} bits {b.pattern}")
        n_refs = refs.get(bucket_id, 0)
        _require(
            n_refs == 1 << (gl - b.depth),
            f"bucket {bucket_id} (LL={b.depth}, GL={gl}) has {n_refs} directory entries",
        )
        depth_count[b.depth] += 1
        low = (1 << b.depth) - 1
        for where, records in (("resident", b.records), ("cached", b.cached)):
            total = 0
            for key, r in records.items():
                _require(r.key == key, f"record {r.key!r} filed under {key!r}")
                _require(lay.records.get(key) is r, f"{where} record {key!r} not indexed")
                _require(r.bucket is b, f"record {key!r} in bucket {bucket_id} points elsewhere")
                _require(r.cached == (where == "cached"), f"record {key!r} cached flag")
                _require(
                    r.h & low == b.pattern,
                    f"record {key!r} hash {r.h:#x} not in bucket {bucket_id} "
                    f"(LL={b.depth}, bits {b.pattern:b})",
                )
                _require(table[r.h & lay.mask] is b, f"lookup of {key!r} misses")
                _require(_is_int(r.load) and r.load >= 0, f"record {key!r} load {r.load!r}")
                total += r.load
                if where == "cached":
                    _require(lay.cache.get(key) is r, f"cached {key!r} not in cache bucket")
                    _require(b.cache_hint <= r.load, f"bucket {bucket_id} cache hint too high")
            stored = b.load if where == "resident" else b.cached_load
            _require(total == stored, f"bucket {bucket_id} {where} load {stored} != {total}")
        n_records += len(b.records) + len(b.cached)
        n_cached += len(b.cached)
        if b.cached:
            _require(
                b.depth == max_depth,
                f"bucket {bucket_id} uses the cache bucket at LL={b.depth} < max_depth",
            )
        lg, bnp = directory.flags(bucket_id)
        _require(lg == int(b.depth == gl) and bnp == int(bool(b.cached)), "LG/BNP flags")
        if b.depth < max_depth and len(b.records) >= 2:
            _require(
                b.load <= cap,
                f"bucket {bucket_id} holds {len(b.records)} records, load {b.load} "
                f"> capacity {cap}, and did not split",
            )
        if b.depth:
            buddy = table[b.pattern ^ (1 << (b.depth - 1))]
            if buddy.depth == b.depth:
                pair = b.load + b.cached_load + buddy.load + buddy.cached_load
                _require(
                    pair * 2 > cap,
                    f"buddies {bucket_id} and {buddy.id} hold {pair} <= capacity/2 "
                    "and did not merge",
                )
    _require(depth_count == list(lay.depth_count), "per-depth bucket counts")
    _require(gl == 0 or depth_count[gl] > 0, f"GL={gl} but no bucket has LL == GL")
    _require(n_records == len(lay.records), "records lost or duplicated across buckets")
    _require(n_cached == len(lay.cache), "cache bucket records lost or duplicated")
    _require(len(lay.cache) <= directory.cache_capacity, "cache bucket over cache_capacity")
    ids = set(lay.buckets)
    free = set(lay.free_ids)
    _require(not ids & free and len(free) == len(lay.free_ids), "free bucket ids")
    _require(ids | free == set(range(lay.next_id)), "bucket ids out of range")
    _require(lay.next_id <= 1 << max_depth, "more bucket ids than 2**max_depth")
    _require(directory.splits >= 0 and directory.merges >= 0, "split/merge counts")
