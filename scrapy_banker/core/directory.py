"""Cache-based extendible hashing: the directory that files queue keys into buckets.

Section 1.2.1 of the PQ-MCSA paper ("基于缓存的扩展式哈希算法") keeps three
structures: a *bucket file* (buckets holding record units, RU, each bucket with a
local depth LL), a *directory file* (the array NArray of ``2**GL`` bucket
pointers, GL = global depth = max LL) and an in-memory *cache bucket* for
overflow records, with two flags per bucket: LG (1 when LL == GL, i.e. splitting
the bucket must double the directory) and BNP (1 when some of the bucket's
records live in the cache bucket).  Lookup goes hash → low GL bits → directory
entry → bucket, then the cache bucket if BNP = 1.

Here a *record* is a queue key (usually a host) with its hash and a *load*, the
number of requests pending for it; a bucket is one persisted queue file and one
stats unit.  The paper splits on the number of records; we split on **load**:
a bucket splits when its load passes ``capacity``, so a hot host ends up alone in
its bucket while the long tail of small hosts shares buckets, and the number of
queue files stays bounded.  Because load also goes *down* (requests are
popped), buddies merge back when together they hold at most ``capacity / 2``,
and the directory halves when no bucket needs its last bit.

Pure Python, no Scrapy: the scheduler learns about records changing bucket
through :meth:`ExtendibleDirectory.on_move` listeners.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["STATE_FORMAT", "STATE_VERSION", "ExtendibleDirectory", "MoveListener"]

K = TypeVar("K", bound=Hashable)

#: ``listener(key, old_bucket_id, new_bucket_id)``.
MoveListener = Callable[[K, int, int], None]

#: ``format``/``version`` fields of :meth:`ExtendibleDirectory.to_state`.
STATE_FORMAT = "scrapy-banker/extendible-directory"
STATE_VERSION = 1

#: Hashes are unsigned 32-bit integers (BKDR gives 31 bits, murmur 32).
HASH_BITS = 32
_HASH_LIMIT = 1 << HASH_BITS

_STATE_KEYS = frozenset(
    {
        "format",
        "version",
        "capacity",
        "max_depth",
        "cache_capacity",
        "global_depth",
        "splits",
        "merges",
        "directory",
        "buckets",
    }
)
_BUCKET_KEYS = frozenset({"id", "local_depth", "records", "cached"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    allowed = (
        f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    )
    if not _is_int(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    assert isinstance(value, int)
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _check_load(load: object) -> int:
    return _check_int("load", load, 0)


def _check_hash(h: object) -> int:
    if isinstance(h, int) and not isinstance(h, bool) and 0 <= h < _HASH_LIMIT:
        return int(h)
    raise ValueError(f"hash must be an integer from 0 to 2**{HASH_BITS} - 1, got {h!r}")


def _require(condition: bool, message: str) -> None:
    """``assert`` that survives ``python -O`` (from_state relies on it)."""
    if not condition:
        raise AssertionError(message)


class _Record(Generic[K]):
    """One record unit: a queue key, its hash and its load (pending requests)."""

    __slots__ = ("bucket", "cached", "h", "key", "load")

    def __init__(self, key: K, h: int, load: int, bucket: _Bucket[K]) -> None:
        self.key = key
        self.h = h
        self.load = load
        self.bucket = bucket
        #: True while the record lives in the cache bucket (it still belongs to ``bucket``).
        self.cached = False


def _load_of(record: _Record[Any]) -> int:
    return record.load


class _Bucket(Generic[K]):
    """A bucket: LL (``depth``), the low LL hash bits it owns, its records.

    ``records`` are the resident records (the paper's RU counts them) and
    ``load`` their summed load, the number compared with ``capacity``;
    ``cached`` are its overflow records in the cache bucket, ``cached_load``
    their load and ``cache_hint`` a lower bound on their smallest load, so that
    a pull-back that cannot succeed is decided without scanning them.
    """

    __slots__ = ("cache_hint", "cached", "cached_load", "depth", "id", "load", "pattern", "records")

    def __init__(self, bucket_id: int, depth: int, pattern: int) -> None:
        self.id = bucket_id
        self.depth = depth
        self.pattern = pattern
        self.records: dict[K, _Record[K]] = {}
        self.cached: dict[K, _Record[K]] = {}
        self.load = 0
        self.cached_load = 0
        self.cache_hint = 0


class ExtendibleDirectory(Generic[K]):
    """Maps record keys to bucket ids by the low bits of their hash; splits by load.

    * ``add`` past ``capacity`` splits the bucket (LL + 1, the directory doubles
      when LL == GL, i.e. LG = 1) until the bucket holding the key fits, holds a
      single record (a hot host alone: allowed to stay over capacity) or reaches
      ``max_depth``.  At ``max_depth`` the smallest other records move to the
      cache bucket (BNP = 1) until the bucket fits; a full cache leaves the
      bucket over capacity: a record is never lost.
    * ``remove_load``/``discard`` below ``capacity / 2`` pull cache records back
      and merge buddies (same LL, differing in bit LL - 1) whose total load is
      at most ``capacity / 2``; the directory halves when no bucket has
      LL == GL.  Splitting above ``capacity`` and merging at ``capacity / 2``
      is a hysteresis: a merged bucket needs ``capacity / 2`` more load before
      it splits again, so push/pop around a boundary does not thrash.

    Cache records still *belong* to their bucket (``bucket_of`` returns it,
    ``bucket_keys`` and ``bucket_load`` include them); the cache bucket only
    takes them out of the load checked against ``capacity``
    (:meth:`resident_load`).  Argument errors raise ``ValueError`` (``KeyError``
    for unknown keys and bucket ids).
    """

    def __init__(
        self, capacity: int = 1024, max_depth: int = 16, cache_capacity: int = 4096
    ) -> None:
        """``capacity``: bucket load that triggers a split; ``max_depth``: cap on GL
        (the directory has at most ``2**max_depth`` entries); ``cache_capacity``:
        records the cache bucket holds (0 disables it)."""
        self._capacity = _check_int("capacity", capacity, 1)
        self._max_depth = _check_int("max_depth", max_depth, 0, HASH_BITS)
        self._cache_capacity = _check_int("cache_capacity", cache_capacity, 0)
        self._records: dict[K, _Record[K]] = {}
        self._cache: dict[K, _Record[K]] = {}  # the paper's cache bucket
        self._buckets: dict[int, _Bucket[K]] = {}
        self._free_ids: list[int] = []  # min-heap: ids are reused smallest first
        self._next_id = 0
        #: Live buckets per local depth: GL shrinks when ``_depth_count[GL]`` hits 0.
        self._depth_count = [0] * (self._max_depth + 1)
        self._gl = 0
        self._mask = 0
        self._splits = 0
        self._merges = 0
        self._listeners: list[MoveListener[K]] = []
        self._moves: list[tuple[K, int, int]] = []
        root = self._new_bucket(0, 0)
        self._depth_count[0] = 1
        #: NArray: entry ``i`` is the bucket owning hashes whose low GL bits are ``i``.
        self._dir: list[_Bucket[K]] = [root]

    # -- updates ---------------------------------------------------------------------------

    def add(self, key: K, h: int, load: int = 1) -> int:
        """Add ``load`` to ``key`` (created with hash ``h`` if new); its bucket id after
        any split or overflow.

        A known key must be given the hash it was created with (a key's hash
        decides its bucket, so it cannot change): ``ValueError`` otherwise.
        Load added to a record living in the cache bucket stays there: moving it
        back would evict another record on every push.
        """
        if type(load) is not int or load < 0:
            load = _check_load(load)
        rec = self._records.get(key)
        if rec is not None:
            if rec.h != h:
                raise ValueError(
                    f"key {key!r} was added with hash {rec.h}, got hash {h!r}: "
                    "a key's hash cannot change"
                )
            b = rec.bucket
            if load:
                rec.load += load
                if rec.cached:
                    b.cached_load += load
                else:
                    b.load += load
                    if b.load > self._capacity and len(b.records) > 1:
                        return self._relieve(b, key)
            return b.id
        if type(h) is not int or not 0 <= h < _HASH_LIMIT:
            h = _check_hash(h)
        b = self._dir[h & self._mask]
        rec = _Record(key, h, load, b)
        b.records[key] = rec
        self._records[key] = rec
        b.load += load
        if b.load > self._capacity and len(b.records) > 1:
            return self._relieve(b, key, created=True)
        return b.id

    def remove_load(self, key: K, load: int = 1) -> int:
        """Take ``load`` off ``key``; the record goes when its load reaches 0.

        Returns the bucket id the key was in *before* any merge this triggers
        (listeners hear about the merge).  ``KeyError`` for an unknown key,
        ``ValueError`` if the load would go negative (nothing is changed then).
        """
        rec = self._records.get(key)
        if rec is None:
            raise KeyError(f"unknown queue key {key!r}")
        if type(load) is not int or load < 0:
            load = _check_load(load)
        if load > rec.load:
            raise ValueError(
                f"cannot remove load {load} from queue key {key!r}: it only has {rec.load}"
            )
        b = rec.bucket
        bucket_id = b.id
        rec.load -= load
        if rec.cached:
            b.cached_load -= load
            if rec.load < b.cache_hint:
                b.cache_hint = rec.load
        else:
            b.load -= load
        if rec.load == 0:
            self._delete(rec)
        self._after_removal(b)
        return bucket_id

    def discard(self, key: K) -> None:
        """Delete ``key``'s record whatever its load; like ``set.discard``, an
        unknown key is not an error (the caller is forgetting it anyway)."""
        rec = self._records.get(key)
        if rec is None:
            return
        b = rec.bucket
        if rec.cached:
            b.cached_load -= rec.load
        else:
            b.load -= rec.load
        self._delete(rec)
        self._after_removal(b)

    def on_move(self, callback: MoveListener[K]) -> None:
        """Call ``callback(key, old_bucket, new_bucket)`` for every record a split
        or merge moves to another bucket id, so the owner can move its queued
        requests.  Moving to or from the cache bucket keeps the bucket id and is
        not reported (see :meth:`in_cache`), nor is a key moved by the very
        ``add`` that created it (its return value says where it went).  Events
        of one call are delivered after it completes, in order, so a listener
        sees a consistent directory.
        """
        self._listeners.append(callback)

    # -- queries ---------------------------------------------------------------------------

    def bucket_of(self, key: K) -> int:
        """Bucket id ``key`` belongs to (a cache record's too).  ``KeyError`` if unknown."""
        rec = self._records.get(key)
        if rec is None:
            raise KeyError(f"unknown queue key {key!r}")
        return rec.bucket.id

    def lookup(self, h: int) -> int:
        """Bucket id the directory maps hash ``h`` to: NArray[low GL bits of h]."""
        if type(h) is not int or not 0 <= h < _HASH_LIMIT:
            h = _check_hash(h)
        return self._dir[h & self._mask].id

    def load_of(self, key: K) -> int:
        rec = self._records.get(key)
        if rec is None:
            raise KeyError(f"unknown queue key {key!r}")
        return rec.load

    def in_cache(self, key: K) -> bool:
        """Whether ``key``'s record lives in the cache bucket (``KeyError`` if unknown)."""
        rec = self._records.get(key)
        if rec is None:
            raise KeyError(f"unknown queue key {key!r}")
        return rec.cached

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._records
        except TypeError:  # unhashable
            return False

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[K]:
        return iter(self._records)

    def bucket_keys(self, bucket_id: int) -> frozenset[K]:
        """Keys of ``bucket_id``, including its overflow records in the cache bucket."""
        b = self._bucket(bucket_id)
        return frozenset(b.records).union(b.cached)

    def bucket_load(self, bucket_id: int) -> int:
        """Total load of the records belonging to ``bucket_id`` (cache records included)."""
        b = self._bucket(bucket_id)
        return b.load + b.cached_load

    def resident_load(self, bucket_id: int) -> int:
        """Load of the records stored in the bucket itself: what ``capacity`` bounds."""
        return self._bucket(bucket_id).load

    def local_depth(self, bucket_id: int) -> int:
        """LL of ``bucket_id``: the number of low hash bits all its records share."""
        return self._bucket(bucket_id).depth

    def flags(self, bucket_id: int) -> tuple[int, int]:
        """The paper's (LG, BNP) of ``bucket_id``.

        Derived rather than stored: LG changes for every bucket whenever GL
        does, which would cost O(buckets) per directory doubling or halving.
        """
        b = self._bucket(bucket_id)
        return int(b.depth == self._gl), int(bool(b.cached))

    def buckets(self) -> list[int]:
        """Live bucket ids, ascending."""
        return sorted(self._buckets)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_depth(self) -> int:
        return self._max_depth

    @property
    def cache_capacity(self) -> int:
        return self._cache_capacity

    @property
    def global_depth(self) -> int:
        """GL: max LL over the buckets; the directory has ``2**GL`` entries."""
        return self._gl

    @property
    def n_buckets(self) -> int:
        return len(self._buckets)

    @property
    def directory_size(self) -> int:
        return len(self._dir)

    @property
    def splits(self) -> int:
        return self._splits

    @property
    def merges(self) -> int:
        return self._merges

    @property
    def cache_size(self) -> int:
        """Records currently in the cache bucket."""
        return len(self._cache)

    def __repr__(self) -> str:
        return (
            f"<ExtendibleDirectory records={len(self._records)} buckets={len(self._buckets)} "
            f"GL={self._gl} cache={len(self._cache)}/{self._cache_capacity} "
            f"capacity={self._capacity} max_depth={self._max_depth}>"
        )

    # -- split, overflow, merge ------------------------------------------------------------

    def _bucket(self, bucket_id: int) -> _Bucket[K]:
        b = self._buckets.get(bucket_id)
        if b is None:
            raise KeyError(f"unknown bucket id {bucket_id!r} ({len(self._buckets)} live buckets)")
        return b

    def _new_bucket(self, depth: int, pattern: int) -> _Bucket[K]:
        if self._free_ids:
            bucket_id = heapq.heappop(self._free_ids)
        else:
            bucket_id = self._next_id
            self._next_id += 1
        b: _Bucket[K] = _Bucket(bucket_id, depth, pattern)
        self._buckets[bucket_id] = b
        return b

    def _relieve(self, b: _Bucket[K], key: K, created: bool = False) -> int:
        """Split (or, at ``max_depth``, overflow) until no bucket of this add is
        over capacity with two or more resident records.

        A split can leave every record on one side, so the halves go back on the
        work list.  Only the side holding ``key`` can really be over capacity
        (the other held at most the bucket's load before this add), but
        checking both keeps the invariant obvious.  Moves of a key ``created``
        by this add are not reported: listeners never heard of it, and the add's
        return value tells where it ended up.
        """
        cap = self._capacity
        work = [b]
        while work:
            x = work.pop()
            if x.load <= cap or len(x.records) < 2:
                continue
            if x.depth < self._max_depth:
                work.append(self._split(x))
                work.append(x)
            else:
                self._overflow(x, key)
        if self._moves:
            if created:
                self._moves = [move for move in self._moves if move[0] != key]
            self._flush_moves()
        return self._records[key].bucket.id

    def _split(self, b: _Bucket[K]) -> _Bucket[K]:
        """LL + 1 for ``b`` and a new buddy taking the records with bit LL set."""
        d = b.depth
        if d == self._gl:  # LG = 1: no spare directory bit, double NArray
            self._dir *= 2  # entries i and i + 2**GL share their low GL bits
            self._gl += 1
            self._mask = (1 << self._gl) - 1
        bit = 1 << d
        n = self._new_bucket(d + 1, b.pattern | bit)
        b.depth = d + 1
        self._depth_count[d] -= 1
        self._depth_count[d + 1] += 2
        # b was pointed to by 2**(GL-d) entries; the half with bit d set go to n.
        self._dir[n.pattern :: bit << 1] = [n] * (len(self._dir) >> (d + 1))
        moving = [r for r in b.records.values() if r.h & bit]
        notify = bool(self._listeners)
        for r in moving:
            del b.records[r.key]
            n.records[r.key] = r
            r.bucket = n
            b.load -= r.load
            n.load += r.load
            if notify:
                self._moves.append((r.key, b.id, n.id))
        self._splits += 1
        return n

    def _overflow(self, b: _Bucket[K], protect: K) -> None:
        """At ``max_depth``: move the smallest records but ``protect`` (the key
        just added) to the cache bucket until ``b`` fits or one record remains."""
        room = self._cache_capacity - len(self._cache)
        if room <= 0:
            return  # cache full: stay over capacity, never drop a record
        cap = self._capacity
        victims = sorted((r for r in b.records.values() if r.key != protect), key=_load_of)
        for r in victims:
            if b.load <= cap or len(b.records) <= 1 or room <= 0:
                break
            del b.records[r.key]
            b.cache_hint = min(b.cache_hint, r.load) if b.cached else r.load
            b.cached[r.key] = r
            self._cache[r.key] = r
            r.cached = True
            b.load -= r.load
            b.cached_load += r.load
            room -= 1

    def _delete(self, rec: _Record[K]) -> None:
        b = rec.bucket
        if rec.cached:
            del b.cached[rec.key]
            del self._cache[rec.key]
        else:
            del b.records[rec.key]
        del self._records[rec.key]

    def _after_removal(self, b: _Bucket[K]) -> None:
        cap = self._capacity
        if b.cached and b.load * 2 < cap:
            self._pull_back(b)
        if b.depth and (b.load + b.cached_load) * 2 <= cap:
            self._merge_up(b)
        if self._moves:
            self._flush_moves()

    def _pull_back(self, b: _Bucket[K]) -> None:
        """Below ``capacity / 2``: bring cache records home, smallest first, while
        they fit (the first one always, if the bucket has no resident record)."""
        cap = self._capacity
        if b.records and b.load + b.cache_hint > cap:
            return  # even the smallest cached record would not fit
        for r in sorted(b.cached.values(), key=_load_of):
            if b.records and b.load + r.load > cap:
                break
            del b.cached[r.key]
            del self._cache[r.key]
            b.records[r.key] = r
            r.cached = False
            b.cached_load -= r.load
            b.load += r.load
        b.cache_hint = min((r.load for r in b.cached.values()), default=0)

    def _merge_up(self, b: _Bucket[K]) -> None:
        """Merge ``b`` with its buddy while the pair holds at most ``capacity / 2``,
        then halve the directory while no bucket has LL == GL."""
        cap = self._capacity
        while b.depth:
            d = b.depth
            total = b.load + b.cached_load
            if total * 2 > cap:
                break
            buddy = self._dir[b.pattern ^ (1 << (d - 1))]
            if buddy.depth != d:
                break  # the buddy's half is split deeper: nothing to merge with yet
            total += buddy.load + buddy.cached_load
            if total * 2 > cap:
                break
            # Keep the bucket with more records: fewer moves to report.
            if len(b.records) + len(b.cached) >= len(buddy.records) + len(buddy.cached):
                keep, gone = b, buddy
            else:
                keep, gone = buddy, b
            for r in keep.cached.values():  # total <= capacity / 2: cache records come home
                del self._cache[r.key]
                keep.records[r.key] = r
                r.cached = False
            keep.cached = {}
            notify = bool(self._listeners)
            for source in (gone.records, gone.cached):
                for r in source.values():
                    if r.cached:
                        del self._cache[r.key]
                        r.cached = False
                    keep.records[r.key] = r
                    r.bucket = keep
                    if notify:
                        self._moves.append((r.key, gone.id, keep.id))
            keep.load = total
            keep.cached_load = 0
            keep.cache_hint = 0
            self._dir[gone.pattern :: 1 << d] = [keep] * (len(self._dir) >> d)
            keep.depth = d - 1
            keep.pattern &= (1 << (d - 1)) - 1
            self._depth_count[d] -= 2
            self._depth_count[d - 1] += 1
            del self._buckets[gone.id]
            heapq.heappush(self._free_ids, gone.id)
            self._merges += 1
            b = keep
        gl = self._gl
        if not self._depth_count[gl]:
            while gl and not self._depth_count[gl]:
                gl -= 1
            del self._dir[1 << gl :]  # upper half mirrors the lower one: no LL == GL
            self._gl = gl
            self._mask = (1 << gl) - 1

    def _flush_moves(self) -> None:
        moves, self._moves = self._moves, []
        for listener in self._listeners:
            for key, old, new in moves:
                listener(key, old, new)

    # -- checking --------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first violated invariant.

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
        gl = self._gl
        cap = self._capacity
        _require(0 <= gl <= self._max_depth, f"GL {gl} outside 0..max_depth {self._max_depth}")
        _require(len(self._dir) == 1 << gl, f"directory has {len(self._dir)} entries, GL={gl}")
        _require(self._mask == (1 << gl) - 1, f"mask {self._mask:#x} does not match GL {gl}")
        refs: dict[int, int] = {}
        for i, b in enumerate(self._dir):
            _require(self._buckets.get(b.id) is b, f"directory entry {i} -> dead bucket {b.id}")
            _require(
                i & ((1 << b.depth) - 1) == b.pattern,
                f"directory entry {i} -> bucket {b.id} (LL={b.depth}, bits {b.pattern:b})",
            )
            refs[b.id] = refs.get(b.id, 0) + 1
        depth_count = [0] * (self._max_depth + 1)
        n_records = n_cached = 0
        for bucket_id, b in self._buckets.items():
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
                    _require(self._records.get(key) is r, f"{where} record {key!r} not indexed")
                    _require(
                        r.bucket is b, f"record {key!r} in bucket {bucket_id} points elsewhere"
                    )
                    _require(r.cached == (where == "cached"), f"record {key!r} cached flag")
                    _require(
                        r.h & low == b.pattern,
                        f"record {key!r} hash {r.h:#x} not in bucket {bucket_id} "
                        f"(LL={b.depth}, bits {b.pattern:b})",
                    )
                    _require(self._dir[r.h & self._mask] is b, f"lookup of {key!r} misses")
                    _require(_is_int(r.load) and r.load >= 0, f"record {key!r} load {r.load!r}")
                    total += r.load
                    if where == "cached":
                        _require(self._cache.get(key) is r, f"cached {key!r} not in cache bucket")
                        _require(b.cache_hint <= r.load, f"bucket {bucket_id} cache hint too high")
                stored = b.load if where == "resident" else b.cached_load
                _require(total == stored, f"bucket {bucket_id} {where} load {stored} != {total}")
            n_records += len(b.records) + len(b.cached)
            n_cached += len(b.cached)
            if b.cached:
                _require(
                    b.depth == self._max_depth,
                    f"bucket {bucket_id} uses the cache bucket at LL={b.depth} < max_depth",
                )
            lg, bnp = self.flags(bucket_id)
            _require(lg == int(b.depth == gl) and bnp == int(bool(b.cached)), "LG/BNP flags")
            if b.depth < self._max_depth and len(b.records) >= 2:
                _require(
                    b.load <= cap,
                    f"bucket {bucket_id} holds {len(b.records)} records, load {b.load} "
                    f"> capacity {cap}, and did not split",
                )
            if b.depth:
                buddy = self._dir[b.pattern ^ (1 << (b.depth - 1))]
                if buddy.depth == b.depth:
                    pair = b.load + b.cached_load + buddy.load + buddy.cached_load
                    _require(
                        pair * 2 > cap,
                        f"buddies {bucket_id} and {buddy.id} hold {pair} <= capacity/2 "
                        "and did not merge",
                    )
        _require(depth_count == self._depth_count, "per-depth bucket counts")
        _require(gl == 0 or depth_count[gl] > 0, f"GL={gl} but no bucket has LL == GL")
        _require(n_records == len(self._records), "records lost or duplicated across buckets")
        _require(n_cached == len(self._cache), "cache bucket records lost or duplicated")
        _require(len(self._cache) <= self._cache_capacity, "cache bucket over cache_capacity")
        ids = set(self._buckets)
        free = set(self._free_ids)
        _require(not ids & free and len(free) == len(self._free_ids), "free bucket ids")
        _require(ids | free == set(range(self._next_id)), "bucket ids out of range")
        _require(self._next_id <= 1 << self._max_depth, "more bucket ids than 2**max_depth")
        _require(self._splits >= 0 and self._merges >= 0, "split/merge counts")

    # -- persistence -----------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; requires ``K = str`` (``ValueError`` otherwise).

        ``from_state(to_state())`` is exact: same bucket ids, LL, directory,
        records (in the same order, so later splits and overflows behave the
        same), cache records and counters.  Free ids are not stored: they are
        every id below the largest live one, which allocates ids in the same
        order as the original.
        """

        def triples(records: dict[K, _Record[K]]) -> list[list[Any]]:
            out: list[list[Any]] = []
            for key, r in records.items():
                if not isinstance(key, str):
                    raise ValueError(f"to_state needs str keys, got {key!r}")
                out.append([key, r.h, r.load])
            return out

        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "capacity": self._capacity,
            "max_depth": self._max_depth,
            "cache_capacity": self._cache_capacity,
            "global_depth": self._gl,
            "splits": self._splits,
            "merges": self._merges,
            "directory": [b.id for b in self._dir],
            "buckets": [
                {
                    "id": bucket_id,
                    "local_depth": b.depth,
                    "records": triples(b.records),
                    "cached": triples(b.cached),
                }
                for bucket_id, b in sorted(self._buckets.items())
            ],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ExtendibleDirectory[str]:
        """Rebuild a directory from :meth:`to_state`; ``ValueError`` on malformed state.

        Every invariant of :meth:`check_invariants` is verified, so a state that
        was edited or truncated is refused rather than loaded half-consistent.
        """
        try:
            return cls._from_state(state)
        except (AssertionError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"malformed directory state: {exc}") from exc

    @staticmethod
    def _from_state(state: Mapping[str, Any]) -> ExtendibleDirectory[str]:
        def bad(message: str) -> ValueError:
            return ValueError(f"malformed directory state: {message}")

        if not isinstance(state, Mapping):
            raise bad(f"expected a mapping, got {type(state).__name__}")
        missing = _STATE_KEYS - state.keys()
        extra = state.keys() - _STATE_KEYS
        if missing or extra:
            raise bad(f"missing keys {sorted(missing)}, unexpected keys {sorted(extra)}")
        if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
            raise bad(
                f"format {state['format']!r} version {state['version']!r}, "
                f"expected {STATE_FORMAT!r} version {STATE_VERSION}"
            )
        try:
            d: ExtendibleDirectory[str] = ExtendibleDirectory(
                state["capacity"], state["max_depth"], state["cache_capacity"]
            )
        except ValueError as exc:
            raise bad(str(exc)) from None
        gl = state["global_depth"]
        if not _is_int(gl) or not 0 <= gl <= d._max_depth:
            raise bad(f"global_depth {gl!r} not in 0..max_depth {d._max_depth}")
        for name in ("splits", "merges"):
            if not _is_int(state[name]) or state[name] < 0:
                raise bad(f"{name} {state[name]!r} is not a non-negative integer")
        directory = state["directory"]
        if not isinstance(directory, list) or len(directory) != 1 << gl:
            raise bad(f"directory must be a list of 2**global_depth = {1 << gl} bucket ids")
        raw_buckets = state["buckets"]
        if not isinstance(raw_buckets, list) or not raw_buckets:
            raise bad("buckets must be a non-empty list")
        d._buckets = {}
        d._depth_count = [0] * (d._max_depth + 1)
        first_entry: dict[Any, int] = {}
        for i, bucket_id in enumerate(directory):
            if not _is_int(bucket_id):
                raise bad(f"directory entry {i} is {bucket_id!r}, not a bucket id")
            first_entry.setdefault(bucket_id, i)
        for raw in raw_buckets:
            if not isinstance(raw, Mapping) or raw.keys() != _BUCKET_KEYS:
                raise bad(f"each bucket needs exactly the keys {sorted(_BUCKET_KEYS)}")
            bucket_id, depth = raw["id"], raw["local_depth"]
            # Ids are reused smallest first, so every id ever allocated is below the
            # peak bucket count, itself at most 2**max_depth.
            if (
                not _is_int(bucket_id)
                or not 0 <= bucket_id < 1 << d._max_depth
                or bucket_id in d._buckets
            ):
                raise bad(
                    f"bucket id {bucket_id!r} is not a fresh integer from 0 to 2**max_depth - 1"
                )
            if not _is_int(depth) or not 0 <= depth <= gl:
                raise bad(f"bucket {bucket_id} local_depth {depth!r} not in 0..{gl}")
            if bucket_id not in first_entry:
                raise bad(f"bucket {bucket_id} is not in the directory")
            b: _Bucket[str] = _Bucket(bucket_id, depth, first_entry[bucket_id] & ((1 << depth) - 1))
            d._buckets[bucket_id] = b
            d._depth_count[depth] += 1
            for field, target in (("records", b.records), ("cached", b.cached)):
                triples = raw[field]
                if not isinstance(triples, list):
                    raise bad(f"bucket {bucket_id} {field} must be a list")
                for triple in triples:
                    if not (isinstance(triple, list) and len(triple) == 3):
                        raise bad(f"bucket {bucket_id} record {triple!r} is not [key, hash, load]")
                    key, h, load = triple
                    if not isinstance(key, str) or key in d._records:
                        raise bad(f"record key {key!r} is not a str or is duplicated")
                    if not _is_int(h) or not 0 <= h < _HASH_LIMIT:
                        raise bad(f"record {key!r} hash {h!r} is not a 32-bit unsigned int")
                    if not _is_int(load) or load < 0:
                        raise bad(f"record {key!r} load {load!r} is not a non-negative int")
                    rec = _Record(key, h, load, b)
                    target[key] = rec
                    d._records[key] = rec
                    if field == "cached":
                        rec.cached = True
                        d._cache[key] = rec
                        b.cached_load += load
                    else:
                        b.load += load
            b.cache_hint = min((r.load for r in b.cached.values()), default=0)
        unknown = set(first_entry) - set(d._buckets)
        if unknown:
            raise bad(f"directory points to unknown bucket ids {sorted(unknown)[:10]}")
        d._dir = [d._buckets[i] for i in directory]
        d._gl = gl
        d._mask = (1 << gl) - 1
        d._splits = state["splits"]
        d._merges = state["merges"]
        d._next_id = max(d._buckets) + 1
        d._free_ids = [i for i in range(d._next_id) if i not in d._buckets]  # sorted: a heap
        d.check_invariants()
        return d
