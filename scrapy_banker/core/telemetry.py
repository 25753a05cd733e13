"""One sample of what a crawler is doing, and the JSON-lines record of them.

The time-series file (``BANKER_TIMESERIES_FILE``), the Prometheus metrics,
the terminal progress and the plots all read the same :class:`Sample`, taken
from the scheduler's parts at one instant; so a figure on a plot, a metric
and a line of progress never disagree about what they count.  The record is
plain JSON, one object per line, versioned: a plot of an old file either
reads it or says which line it cannot read, and nothing read from disk is
ever unpickled.

Pure: no Scrapy, Twisted or Redis here.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "FORMAT_VERSION",
    "BankerSample",
    "FleetSample",
    "PlacementSample",
    "Sample",
    "SlotSample",
    "TopicSample",
    "dump_sample",
    "iter_samples",
    "sample_from_dict",
    "sample_json",
]

#: Bumped when a field changes meaning; readers refuse what they do not know.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class TopicSample:
    """One topic at one instant."""

    #: Responses received for the topic since the crawl started (cumulative).
    pages: int
    #: Requests waiting in the scheduler for the topic.
    queued: int
    #: Requests of the topic being downloaded.
    inflight: int
    #: Its current time slice in seconds (the adjuster moves it).
    slice_s: float


@dataclass(frozen=True)
class SlotSample:
    """One download slot (a host, by default) at one instant."""

    slot: str
    inflight: int
    #: ``CONCURRENT_REQUESTS_PER_DOMAIN`` (or the slot's own concurrency).
    limit: int
    queued: int


@dataclass(frozen=True)
class BankerSample:
    """Banker's-algorithm state, summed per resource (``BANKER_RESOURCES``)."""

    total: dict[str, int]
    available: dict[str, int]
    allocated: dict[str, int]
    #: Sum over running tasks of claim minus allocation: what they may still ask.
    need: dict[str, int]
    #: Tasks holding a grant now.
    tasks: int
    #: Requests parked because granting them would leave an unsafe state.
    parked: int


@dataclass(frozen=True)
class FleetSample:
    """This node's share of a Redis fleet, as its worker thread last saw it."""

    partitions_owned: int
    partitions_total: int
    #: Requests this node holds leases on (in flight or buffered locally).
    leased: int
    #: Operations waiting to be sent to Redis.
    pending_ops: int
    connected: bool


@dataclass(frozen=True)
class PlacementSample:
    """The network-aware placement's latest plan (GNP map and assignment)."""

    #: ``BANKER_PLACEMENT`` mode (``top1``, ``topk``, ``hungarian``...).
    mode: str
    #: GNP coordinates of nodes and of sites (netlocs), all of one dimension.
    nodes: dict[str, list[float]]
    sites: dict[str, list[float]]
    #: Site -> node it was placed on.
    assignment: dict[str, str]


@dataclass(frozen=True)
class Sample:
    """What one crawler was doing at wall-clock time ``t``."""

    t: float
    node: str
    #: Responses received since the crawl started (cumulative, all topics).
    pages: int
    #: Requests waiting in the scheduler.
    queued: int
    #: Requests being downloaded.
    inflight: int
    topics: dict[str, TopicSample] = field(default_factory=dict)
    #: The busiest slots first, at most a configured number.
    slots: tuple[SlotSample, ...] = ()
    banker: BankerSample | None = None
    fleet: FleetSample | None = None
    placement: PlacementSample | None = None
    version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_json(sample: Sample) -> str:
    """``sample`` as one compact JSON object: a line of the record, a node's Redis value."""
    return json.dumps(sample.to_dict(), separators=(",", ":"), sort_keys=True)


def dump_sample(sample: Sample, out: IO[str]) -> None:
    """Append ``sample`` as one JSON line (the caller flushes)."""
    out.write(sample_json(sample))
    out.write("\n")


def _int(d: Mapping[str, Any], key: str) -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key!r} must be an integer >= 0, got {value!r}")
    return value


def _num(d: Mapping[str, Any], key: str) -> float:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key!r} must be a finite number, got {value!r}")
    return float(value)


def _counts(d: Mapping[str, Any], key: str) -> dict[str, int]:
    value = d[key]
    if not isinstance(value, dict):
        raise ValueError(f"{key!r} must be an object, got {value!r}")
    return {str(k): _int(value, k) for k in value}


def _coords(d: Mapping[str, Any], key: str) -> dict[str, list[float]]:
    value = d[key]
    if not isinstance(value, dict):
        raise ValueError(f"{key!r} must be an object, got {value!r}")
    out: dict[str, list[float]] = {}
    for name, xs in value.items():
        if not isinstance(xs, list):
            raise ValueError(f"coordinates of {name!r} must be a list, got {xs!r}")
        out[str(name)] = [_num({"x": x}, "x") for x in xs]
    return out


def sample_from_dict(d: Any) -> Sample:
    """Rebuild a sample from its JSON form; ``ValueError`` says what is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"a sample must be a JSON object, got {type(d).__name__}")
    version = d.get("version")
    if version != FORMAT_VERSION:
        raise ValueError(f"unknown sample format version {version!r} (this reader: 1)")
    try:
        topics_raw = d["topics"]
        if not isinstance(topics_raw, dict):
            raise ValueError(f"'topics' must be an object, got {topics_raw!r}")
        topics = {
            str(name): TopicSample(
                _int(t, "pages"), _int(t, "queued"), _int(t, "inflight"), _num(t, "slice_s")
            )
            for name, t in topics_raw.items()
        }
        slots = tuple(
            SlotSample(str(s["slot"]), _int(s, "inflight"), _int(s, "limit"), _int(s, "queued"))
            for s in d["slots"]
        )
        b = d.get("banker")
        banker = None
        if b is not None:
            banker = BankerSample(
                _counts(b, "total"), _counts(b, "available"), _counts(b, "allocated"),
                _counts(b, "need"), _int(b, "tasks"), _int(b, "parked"),
            )  # fmt: skip
        f = d.get("fleet")
        fleet = None
        if f is not None:
            fleet = FleetSample(
                _int(f, "partitions_owned"), _int(f, "partitions_total"), _int(f, "leased"),
                _int(f, "pending_ops"), bool(f["connected"]),
            )  # fmt: skip
        pl = d.get("placement")
        placement = None
        if pl is not None:
            placement = PlacementSample(
                str(pl["mode"]), _coords(pl, "nodes"), _coords(pl, "sites"),
                {str(k): str(v) for k, v in pl["assignment"].items()},
            )  # fmt: skip
        return Sample(
            t=_num(d, "t"), node=str(d["node"]), pages=_int(d, "pages"),
            queued=_int(d, "queued"), inflight=_int(d, "inflight"), topics=topics,
            slots=slots, banker=banker, fleet=fleet, placement=placement,
        )  # fmt: skip
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed sample: {exc!r}") from None


def iter_samples(lines: IO[str]) -> Iterator[tuple[int, Sample | ValueError]]:
    """``(line number, sample or the error that line raised)``; blank lines skipped.

    A crawl killed mid-write leaves a truncated last line: the reader reports
    it and goes on instead of refusing the whole record.
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, sample_from_dict(json.loads(line))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            yield number, exc
