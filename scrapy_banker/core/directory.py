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

This module is the algorithm and its queries.  Its JSON form
(:mod:`scrapy_banker.core.directory_state`) and its invariant checker
(:mod:`scrapy_banker.core.directory_check`) live next to it and use two seams
only: :meth:`ExtendibleDirectory.layout`, a read-only view of the buckets,
records and NArray typed by :class:`RecordView` and :class:`BucketView`, and
:meth:`ExtendibleDirectory.assemble`, which builds a directory from plain
parts and verifies it.  The hot path (``add``/``remove_load``) keeps its plain
slotted objects; the views only narrow their type.

Pure Python, no Scrapy: the scheduler learns about records changing bucket
through :meth:`ExtendibleDirectory.on_move` listeners.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "BucketParts",
    "BucketView",
    "DirectoryLayout",
    "ExtendibleDirectory",
    "MoveListener",
    "RecordView",
]

K = TypeVar("K", bound=Hashable)

#: ``listener(key, old_bucket_id, new_bucket_id)``.
MoveListener = Callable[[K, int, int], None]

#: Hashes are unsigned 32-bit integers (BKDR gives 31 bits, murmur 32).
HASH_BITS = 32
_HASH_LIMIT = 1 << HASH_BITS


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    allowed = (
        f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    )
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _check_load(load: object) -> int:
    return _check_int("load", load, 0)


def _check_hash(h: object) -> int:
    if isinstance(h, int) and not isinstance(h, bool) and 0 <= h < _HASH_LIMIT:
        return int(h)
    raise ValueError(f"hash must be an integer from 0 to 2**{HASH_BITS} - 1, got {h!r}")


# -- read-only views and plain parts: what other modules see of the internals ------------------


class RecordView(Protocol[K]):
    """A record unit as :meth:`ExtendibleDirectory.layout` shows it (read-only).

    ``h`` is the key's hash, ``load`` its pending requests; ``cached`` is true
    while the record lives in the cache bucket (it still belongs to ``bucket``).
    """

    @property
    def key(self) -> K: ...
    @property
    def h(self) -> int: ...
    @property
    def load(self) -> int: ...
    @property
    def cached(self) -> bool: ...
    @property
    def bucket(self) -> BucketView[K]: ...


class BucketView(Protocol[K]):
    """A bucket as :meth:`ExtendibleDirectory.layout` shows it (read-only).

    ``depth`` is LL and ``pattern`` the low LL hash bits the bucket owns;
    ``records`` are its resident records (in insertion order) and ``load`` their
    summed load, ``cached`` its overflow records in the cache bucket and
    ``cached_load`` theirs; ``cache_hint`` is a lower bound on the smallest
    cached load.
    """

    @property
    def id(self) -> int: ...
    @property
    def depth(self) -> int: ...
    @property
    def pattern(self) -> int: ...
    @property
    def records(self) -> Mapping[K, RecordView[K]]: ...
    @property
    def cached(self) -> Mapping[K, RecordView[K]]: ...
    @property
    def load(self) -> int: ...
    @property
    def cached_load(self) -> int: ...
    @property
    def cache_hint(self) -> int: ...


@dataclass(frozen=True)
class DirectoryLayout(Generic[K]):
    """The directory's internals, read-only, as returned by :meth:`ExtendibleDirectory.layout`.

    The mappings are read-only proxies of the live ones and the sequences
    copies; buckets and records are the directory's own objects (so the
    checker can compare identities).  Valid until the next update.
    """

    #: NArray: entry ``i`` is the bucket owning hashes whose low GL bits are ``i``.
    table: Sequence[BucketView[K]]
    #: ``2**GL - 1``: the bits of a hash that index ``table``.
    mask: int
    #: Live buckets by id.
    buckets: Mapping[int, BucketView[K]]
    #: Every record, resident or cached, by key.
    records: Mapping[K, RecordView[K]]
    #: The paper's cache bucket: overflow records by key.
    cache: Mapping[K, RecordView[K]]
    #: Number of live buckets per local depth, ``0..max_depth``.
    depth_count: Sequence[int]
    #: Freed bucket ids, a min-heap: ids are reused smallest first.
    free_ids: Sequence[int]
    #: Smallest id never allocated.
    next_id: int


@dataclass(frozen=True)
class BucketParts(Generic[K]):
    """One bucket for :meth:`ExtendibleDirectory.assemble`: its id, LL and the
    ``(key, hash, load)`` of its resident and cached records, in order."""

    id: int
    local_depth: int
    records: Sequence[tuple[K, int, int]]
    cached: Sequence[tuple[K, int, int]]


# -- the internals ---------------------------------------------------------------------------


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

    # -- seams: a read-only layout out, validated parts in -------------------------------------

    def layout(self) -> DirectoryLayout[K]:
        """A read-only view of the internals, for the state codec and the checker."""
        return DirectoryLayout(
            table=tuple(self._dir),
            mask=self._mask,
            buckets=MappingProxyType(self._buckets),
            records=MappingProxyType(self._records),
            cache=MappingProxyType(self._cache),
            depth_count=tuple(self._depth_count),
            free_ids=tuple(self._free_ids),
            next_id=self._next_id,
        )

    @classmethod
    def assemble(
        cls,
        capacity: int,
        max_depth: int,
        cache_capacity: int,
        *,
        table: Sequence[int],
        buckets: Sequence[BucketParts[K]],
        splits: int,
        merges: int,
    ) -> ExtendibleDirectory[K]:
        """Build a directory from its parts, then :meth:`check_invariants` it.

        ``table`` is NArray as bucket ids (``2**GL`` of them), ``buckets`` the
        live buckets.  The parts must be well-formed: integers in range, bucket
        ids distinct and each in ``table``, every entry of ``table`` one of
        them, keys distinct (:func:`scrapy_banker.core.directory_state.from_state`
        checks this of JSON input).  Whether they form a directory is then
        verified: ``AssertionError`` if not.  Free ids are every id below the
        largest live one that is not live, which allocates ids in the same order
        as the directory the parts were taken from.
        """
        d: ExtendibleDirectory[K] = cls(capacity, max_depth, cache_capacity)
        first_entry: dict[int, int] = {}
        for i, bucket_id in enumerate(table):
            first_entry.setdefault(bucket_id, i)
        d._buckets = {}
        d._depth_count = [0] * (d._max_depth + 1)
        for part in buckets:
            depth = part.local_depth
            b: _Bucket[K] = _Bucket(part.id, depth, first_entry[part.id] & ((1 << depth) - 1))
            d._buckets[part.id] = b
            d._depth_count[depth] += 1
            for key, h, load in part.records:
                b.records[key] = d._records[key] = _Record(key, h, load, b)
                b.load += load
            for key, h, load in part.cached:
                rec = _Record(key, h, load, b)
                rec.cached = True
                b.cached[key] = d._records[key] = d._cache[key] = rec
                b.cached_load += load
            b.cache_hint = min((r.load for r in b.cached.values()), default=0)
        d._dir = [d._buckets[i] for i in table]
        d._gl = len(table).bit_length() - 1
        d._mask = (1 << d._gl) - 1
        d._splits = splits
        d._merges = merges
        d._next_id = max(d._buckets) + 1
        d._free_ids = [i for i in range(d._next_id) if i not in d._buckets]  # sorted: a heap
        d.check_invariants()
        return d

    # Persistence and checking live in their own modules, imported on use (they
    # import this one); these methods keep them one call away from a directory.

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first violated invariant; see
        :func:`scrapy_banker.core.directory_check.check_invariants`."""
        from scrapy_banker.core.directory_check import check_invariants

        check_invariants(self)

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; requires ``K = str`` (``ValueError`` otherwise).
        See :func:`scrapy_banker.core.directory_state.to_state`."""
        from scrapy_banker.core.directory_state import to_state

        return to_state(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ExtendibleDirectory[str]:
        """Rebuild a directory from :meth:`to_state`; ``ValueError`` on malformed state.
        See :func:`scrapy_banker.core.directory_state.from_state`."""
        from scrapy_banker.core.directory_state import from_state

        return from_state(state)
