"""The extendible-hash directory's JSON form: what a JOBDIR snapshot stores of it.

:func:`to_state` writes every structure of the PQ-MCSA paper's section 1.2.1
that decides where a key goes next -- the directory file (NArray, as bucket
ids), the bucket file (each bucket's id, local depth LL and records) and the
cache bucket (each bucket's overflow records, which set its BNP flag) -- plus
the settings and split/merge counters.  :func:`from_state` rebuilds the
directory exactly, so that a resumed crawl files keys into the same buckets,
hence the same queue files, as the crawl that wrote the snapshot.

The format is a contract with snapshots already on disk: the keys, their
order and ``STATE_VERSION`` change only together with a reader for the old
version.  Decoding trusts nothing: the shape and types are checked here, and
:meth:`~scrapy_banker.core.directory.ExtendibleDirectory.assemble` then
verifies every invariant, so an edited or truncated state is refused with
``ValueError`` rather than loaded half-consistent.  Encoding reads the
directory through
:meth:`~scrapy_banker.core.directory.ExtendibleDirectory.layout` only.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

from scrapy_banker.core.directory import HASH_BITS, BucketParts, ExtendibleDirectory, RecordView

__all__ = ["STATE_FORMAT", "STATE_VERSION", "from_state", "to_state"]

K = TypeVar("K", bound=Hashable)

#: ``format``/``version`` fields of :func:`to_state`.
STATE_FORMAT = "scrapy-banker/extendible-directory"
STATE_VERSION = 1

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


def to_state(directory: ExtendibleDirectory[K]) -> dict[str, Any]:
    """JSON-serialisable snapshot of ``directory``; requires ``K = str``
    (``ValueError`` otherwise).

    ``from_state(to_state(d))`` is exact: same bucket ids, LL, directory,
    records (in the same order, so later splits and overflows behave the
    same), cache records and counters.  Free ids are not stored: they are
    every id below the largest live one, which allocates ids in the same
    order as the original.
    """

    def triples(records: Mapping[K, RecordView[K]]) -> list[list[Any]]:
        out: list[list[Any]] = []
        for key, r in records.items():
            if not isinstance(key, str):
                raise ValueError(f"to_state needs str keys, got {key!r}")
            out.append([key, r.h, r.load])
        return out

    lay = directory.layout()
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "capacity": directory.capacity,
        "max_depth": directory.max_depth,
        "cache_capacity": directory.cache_capacity,
        "global_depth": directory.global_depth,
        "splits": directory.splits,
        "merges": directory.merges,
        "directory": [b.id for b in lay.table],
        "buckets": [
            {
                "id": bucket_id,
                "local_depth": b.depth,
                "records": triples(b.records),
                "cached": triples(b.cached),
            }
            for bucket_id, b in sorted(lay.buckets.items())
        ],
    }


def from_state(state: Mapping[str, Any]) -> ExtendibleDirectory[str]:
    """Rebuild a directory from :func:`to_state`; ``ValueError`` on malformed state.

    Every invariant of
    :meth:`~scrapy_banker.core.directory.ExtendibleDirectory.check_invariants`
    is verified, so a state that was edited or truncated is refused rather
    than loaded half-consistent.
    """
    try:
        return _from_state(state)
    except (AssertionError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"malformed directory state: {exc}") from exc


def _bad(message: str) -> ValueError:
    return ValueError(f"malformed directory state: {message}")


def _from_state(state: Mapping[str, Any]) -> ExtendibleDirectory[str]:
    if not isinstance(state, Mapping):
        raise _bad(f"expected a mapping, got {type(state).__name__}")
    missing = _STATE_KEYS - state.keys()
    extra = state.keys() - _STATE_KEYS
    if missing or extra:
        raise _bad(f"missing keys {sorted(missing)}, unexpected keys {sorted(extra)}")
    if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
        raise _bad(
            f"format {state['format']!r} version {state['version']!r}, "
            f"expected {STATE_FORMAT!r} version {STATE_VERSION}"
        )
    capacity, max_depth, cache_capacity = (
        state["capacity"],
        state["max_depth"],
        state["cache_capacity"],
    )
    try:  # the constructor's checks and messages, before max_depth bounds what follows
        ExtendibleDirectory(capacity, max_depth, cache_capacity)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    gl = state["global_depth"]
    if not _is_int(gl) or not 0 <= gl <= max_depth:
        raise _bad(f"global_depth {gl!r} not in 0..max_depth {max_depth}")
    for name in ("splits", "merges"):
        if not _is_int(state[name]) or state[name] < 0:
            raise _bad(f"{name} {state[name]!r} is not a non-negative integer")
    directory = state["directory"]
    if not isinstance(directory, list) or len(directory) != 1 << gl:
        raise _bad(f"directory must be a list of 2**global_depth = {1 << gl} bucket ids")
    raw_buckets = state["buckets"]
    if not isinstance(raw_buckets, list) or not raw_buckets:
        raise _bad("buckets must be a non-empty list")
    in_directory: set[int] = set()
    for i, bucket_id in enumerate(directory):
        if not _is_int(bucket_id):
            raise _bad(f"directory entry {i} is {bucket_id!r}, not a bucket id")
        in_directory.add(bucket_id)
    buckets: list[BucketParts[str]] = []
    bucket_ids: set[int] = set()
    keys: set[str] = set()
    for raw in raw_buckets:
        if not isinstance(raw, Mapping) or raw.keys() != _BUCKET_KEYS:
            raise _bad(f"each bucket needs exactly the keys {sorted(_BUCKET_KEYS)}")
        bucket_id, depth = raw["id"], raw["local_depth"]
        # Ids are reused smallest first, so every id ever allocated is below the
        # peak bucket count, itself at most 2**max_depth.
        if not _is_int(bucket_id) or not 0 <= bucket_id < 1 << max_depth or bucket_id in bucket_ids:
            raise _bad(f"bucket id {bucket_id!r} is not a fresh integer from 0 to 2**max_depth - 1")
        if not _is_int(depth) or not 0 <= depth <= gl:
            raise _bad(f"bucket {bucket_id} local_depth {depth!r} not in 0..{gl}")
        if bucket_id not in in_directory:
            raise _bad(f"bucket {bucket_id} is not in the directory")
        bucket_ids.add(bucket_id)
        records = _records(raw, "records", bucket_id, keys)
        cached = _records(raw, "cached", bucket_id, keys)
        buckets.append(BucketParts(bucket_id, depth, records, cached))
    unknown = in_directory - bucket_ids
    if unknown:
        raise _bad(f"directory points to unknown bucket ids {sorted(unknown)[:10]}")
    return ExtendibleDirectory.assemble(
        capacity,
        max_depth,
        cache_capacity,
        table=directory,
        buckets=buckets,
        splits=state["splits"],
        merges=state["merges"],
    )


def _records(
    raw: Mapping[str, Any], field: str, bucket_id: int, keys: set[str]
) -> list[tuple[str, int, int]]:
    """The ``[key, hash, load]`` triples of ``raw[field]``, checked; adds their keys to ``keys``."""
    triples = raw[field]
    if not isinstance(triples, list):
        raise _bad(f"bucket {bucket_id} {field} must be a list")
    out: list[tuple[str, int, int]] = []
    for triple in triples:
        if not (isinstance(triple, list) and len(triple) == 3):
            raise _bad(f"bucket {bucket_id} record {triple!r} is not [key, hash, load]")
        key, h, load = triple
        if not isinstance(key, str) or key in keys:
            raise _bad(f"record key {key!r} is not a str or is duplicated")
        if not _is_int(h) or not 0 <= h < _HASH_LIMIT:
            raise _bad(f"record {key!r} hash {h!r} is not a 32-bit unsigned int")
        if not _is_int(load) or load < 0:
            raise _bad(f"record {key!r} load {load!r} is not a non-negative int")
        keys.add(key)
        out.append((key, h, load))
    return out
