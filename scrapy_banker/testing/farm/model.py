"""The farm's pure site model: which hosts, pages, links, delays and faults it has.

:class:`FarmConfig` is everything that determines a farm (JSON round-trippable,
since it is all the server process is given); :class:`FarmModel` derives from
it, deterministically from ``seed``, every host's pages, their bytes, their
links, their delays and their injected faults.  Tests compute the exact set
of URLs a perfect crawl must fetch (:meth:`FarmModel.expected_urls`) without
ever talking to the server.  No Twisted, no sockets.

Push-back (all off by default): ``rate_limits`` / ``static_rate_limits``
(429, with ``Retry-After`` in seconds, as a date, or without it),
``bursts`` / ``static_bursts`` (headerless 503s) and ``crawl_delays``
(``/robots.txt`` with a ``Crawl-delay``), or :meth:`FarmConfig.with_pushback`
to draw shares of the hosts from the seed.  :meth:`FarmModel.pushback`
says what a host does, :meth:`FarmModel.pushback_tracker` builds the
receipt-time decisions and counters the server applies
(:mod:`~scrapy_banker.testing.farm.pushback`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from scrapy_banker.net.gnp import read_rtt_matrix
from scrapy_banker.testing.farm.changes import ChangeModel
from scrapy_banker.testing.farm.pushback import (
    Burst,
    HostPushback,
    PushbackTracker,
    RateLimit,
)

logger = logging.getLogger(__name__)

__all__ = [
    "NODE_HEADER",
    "STATS_PREFIX",
    "FarmConfig",
    "FarmModel",
    "Fault",
    "load_rtt_matrix",
]

Fault = Literal["ok", "error", "transient", "timeout", "missing"]

#: Header a crawler node sends so the farm can apply node-to-host RTTs.
NODE_HEADER: Final = "X-Banker-Node"
#: Prefix of the bookkeeping endpoints, served on every host.
STATS_PREFIX: Final = "/__farm__/"

_FAULT_OK: Final = 0
_FAULT_ERROR: Final = 1
_FAULT_TRANSIENT: Final = 2
_FAULT_TIMEOUT: Final = 3
_FAULT_NAMES: Final[tuple[Fault, ...]] = ("ok", "error", "transient", "timeout")

#: Spread of the log-normal page-size distribution: a few big pages, many small.
_SIZE_SIGMA: Final = 0.8
_MIN_PAGE_BYTES: Final = 256
_MAX_SIZE_FACTOR: Final = 16
_FILLER_BYTES: Final = 1 << 16
_WORDS: Final = (
    b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    b"incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud "
    b"exercitation ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure "
    b"in reprehenderit voluptate velit esse cillum fugiat nulla pariatur excepteur sint "
    b"occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est"
).split()


def _index(key: object, what: str) -> int:
    try:
        return int(cast(Any, key))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: {key!r} is not a host index") from exc


def _static_name(name: object) -> str:
    return str(name).strip(".").lower()


def _crawl_delay(key: object, value: object) -> float:
    """A Crawl-delay in seconds, rounded to the millisecond robots.txt shows."""
    try:
        delay = round(float(cast(Any, value)), 3)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"crawl_delays[{key}]: {value!r} is not a number of seconds") from exc
    if isinstance(value, bool) or not math.isfinite(delay) or delay <= 0:
        raise ValueError(
            f"crawl_delays[{key}] must be a finite number of seconds >= 0.001, got {value!r}"
        )
    return delay


def _int_keys(raw: Mapping[Any, Any], what: str) -> dict[int, float]:
    """Normalise a host-index mapping; JSON turns int keys into strings."""
    out: dict[int, float] = {}
    for key, value in raw.items():
        try:
            out[int(key)] = float(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what}: bad entry {key!r}: {value!r}") from exc
    return out


@dataclass(frozen=True)
class FarmConfig:
    """Everything that determines a farm; two equal configs serve identical bytes.

    The config is the only thing passed to the server process, so it must be
    JSON round-trippable (:meth:`to_json` / :meth:`from_json`); dicts keyed
    by host index are re-keyed to ``int`` after loading.  Treat the dict
    fields as read-only: the dataclass is frozen and hashed by its JSON form.

    Units: latencies in milliseconds, bandwidth in kilobits per second
    (``1 kbps = 1000 bit/s``), ``timeout_s`` in seconds.  The fault rates are
    fractions of *content* pages (``/<topic>/<k>.html``); root and topic
    index pages never fail so that every page stays reachable.

    Push-back (every field empty by default, which changes nothing): a
    host in ``rate_limits`` answers ``429`` above its :class:`RateLimit`
    (with ``Retry-After`` in seconds, as an HTTP date, or without it), one
    in ``bursts`` answers ``503`` inside its :class:`Burst` windows, one in
    ``crawl_delays`` serves ``/robots.txt`` with that ``Crawl-delay`` and
    counts the requests that come too soon.  Refusals cost the host's base
    latency only (no bandwidth, no timeout), and ``/robots.txt`` is never
    refused.  Specs may be given as objects or as their JSON dicts.
    :meth:`with_pushback` fills the three fields from shares of the hosts.
    """

    seed: int = 0
    hosts: int = 20
    total_pages: int = 2000
    min_pages_per_host: int = 3
    zipf_s: float = 1.0
    topics: tuple[str, ...] = ("news", "archive", "products")
    links_per_page: int = 4
    cross_host_link_prob: float = 0.1
    page_bytes: int = 2048
    latency_ms: float = 0.0
    host_latency_ms: dict[int, float] = field(default_factory=dict)
    bandwidth_kbps: float | None = None
    host_bandwidth_kbps: dict[int, float] = field(default_factory=dict)
    rtt_matrix: str | None = None
    node_rows: dict[str, int] = field(default_factory=dict)
    host_columns: dict[int, int] = field(default_factory=dict)
    latency_scale: float = 1.0
    error_rate: float = 0.0
    transient_error_rate: float = 0.0
    timeout_rate: float = 0.0
    timeout_s: float = 30.0
    domain: str = "farm.test"
    #: Virtual host name -> directory served as it is (:mod:`.static`).
    static_sites: dict[str, str] = field(default_factory=dict)
    #: Virtual host name of a static site -> its latency (default ``latency_ms``).
    static_latency_ms: dict[str, float] = field(default_factory=dict)
    #: Seconds between samples of the requests in flight (0: no sampling).
    sample_interval_s: float = 0.0
    #: Host index -> its :class:`RateLimit` (429 above the rate).
    rate_limits: dict[int, RateLimit] = field(default_factory=dict)
    #: Static site name -> its :class:`RateLimit`.
    static_rate_limits: dict[str, RateLimit] = field(default_factory=dict)
    #: Host index -> its :class:`Burst` (headerless 503s).
    bursts: dict[int, Burst] = field(default_factory=dict)
    #: Static site name -> its :class:`Burst`.
    static_bursts: dict[str, Burst] = field(default_factory=dict)
    #: Host index -> Crawl-delay in seconds (rounded to ms) its robots.txt announces.
    crawl_delays: dict[int, float] = field(default_factory=dict)
    #: Generated pages change over time (empty: never): the keyword arguments of
    #: :class:`~scrapy_banker.testing.farm.changes.ChangeModel` but its seed
    #: (``rate_min``, ``rate_max``, ``static_share``, ``lying_share``), rates per
    #: farm second.  Each generated host then also serves ``/sitemap.xml``.
    page_changes: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise containers so that configs built by hand, from JSON or
        # from keyword dicts compare equal.
        setattr_ = object.__setattr__
        setattr_(self, "topics", tuple(str(t) for t in self.topics))
        setattr_(self, "host_latency_ms", _int_keys(self.host_latency_ms, "host_latency_ms"))
        setattr_(
            self, "host_bandwidth_kbps", _int_keys(self.host_bandwidth_kbps, "host_bandwidth_kbps")
        )
        setattr_(self, "node_rows", {str(k): int(v) for k, v in self.node_rows.items()})
        setattr_(self, "host_columns", {int(k): int(v) for k, v in self.host_columns.items()})
        setattr_(self, "domain", self.domain.strip(".").lower())
        setattr_(
            self,
            "static_sites",
            {str(k).strip(".").lower(): str(v) for k, v in self.static_sites.items()},
        )
        setattr_(
            self,
            "static_latency_ms",
            {str(k).strip(".").lower(): float(v) for k, v in self.static_latency_ms.items()},
        )
        if self.bandwidth_kbps is not None:
            setattr_(self, "bandwidth_kbps", float(self.bandwidth_kbps))
        setattr_(
            self,
            "rate_limits",
            {
                _index(k, "rate_limits"): RateLimit.coerce(v, f"rate_limits[{k}]")
                for k, v in self.rate_limits.items()
            },
        )
        setattr_(
            self,
            "static_rate_limits",
            {
                _static_name(k): RateLimit.coerce(v, f"static_rate_limits[{k!r}]")
                for k, v in self.static_rate_limits.items()
            },
        )
        setattr_(
            self,
            "bursts",
            {_index(k, "bursts"): Burst.coerce(v, f"bursts[{k}]") for k, v in self.bursts.items()},
        )
        setattr_(
            self,
            "static_bursts",
            {
                _static_name(k): Burst.coerce(v, f"static_bursts[{k!r}]")
                for k, v in self.static_bursts.items()
            },
        )
        setattr_(
            self,
            "crawl_delays",
            {_index(k, "crawl_delays"): _crawl_delay(k, v) for k, v in self.crawl_delays.items()},
        )
        setattr_(self, "page_changes", {str(k): float(v) for k, v in self.page_changes.items()})
        self._validate()

    def _validate(self) -> None:
        if self.hosts < 1:
            raise ValueError("hosts must be >= 1")
        if self.total_pages < 0 or self.min_pages_per_host < 1:
            raise ValueError("total_pages must be >= 0 and min_pages_per_host >= 1")
        if not self.topics:
            raise ValueError("at least one topic is required")
        for topic in self.topics:
            if not topic or "/" in topic or topic.startswith("__") or not topic.isascii():
                raise ValueError(f"bad topic name {topic!r}")
        if len(set(self.topics)) != len(self.topics):
            raise ValueError("topics must be unique")
        if self.links_per_page < 0 or self.page_bytes < 0:
            raise ValueError("links_per_page and page_bytes must be >= 0")
        rates = (self.error_rate, self.transient_error_rate, self.timeout_rate)
        if any(r < 0 for r in rates) or sum(rates) > 1.0:
            raise ValueError("fault rates must be >= 0 and sum to <= 1")
        if not 0.0 <= self.cross_host_link_prob <= 1.0:
            raise ValueError("cross_host_link_prob must be in [0, 1]")
        if not self.domain:
            raise ValueError("domain must not be empty")
        if not self.sample_interval_s >= 0:
            raise ValueError("sample_interval_s must be >= 0")
        for name in self.static_latency_ms:
            if name not in self.static_sites:
                raise ValueError(f"static_latency_ms names {name!r}, which is no static site")
        for what, indexed in (
            ("rate_limits", self.rate_limits),
            ("bursts", self.bursts),
            ("crawl_delays", self.crawl_delays),
        ):
            outside = sorted(k for k in indexed if not 0 <= k < self.hosts)
            if outside:
                raise ValueError(f"{what} names hosts {outside} outside range(0, {self.hosts})")
        if self.page_changes:
            known = {"rate_min", "rate_max", "static_share", "lying_share"}
            unknown = sorted(set(self.page_changes) - known)
            if unknown:
                raise ValueError(f"page_changes has unknown keys {unknown}")
            ChangeModel(seed=self.seed, **self.page_changes)  # its own errors
        for what, named in (
            ("static_rate_limits", self.static_rate_limits),
            ("static_bursts", self.static_bursts),
        ):
            for name in named:
                if name not in self.static_sites:
                    raise ValueError(f"{what} names {name!r}, which is no static site")

    @property
    def has_pushback(self) -> bool:
        """Whether any host rate-limits, bursts or announces a Crawl-delay."""
        return bool(
            self.rate_limits
            or self.static_rate_limits
            or self.bursts
            or self.static_bursts
            or self.crawl_delays
        )

    def with_pushback(
        self,
        retry_after_share: float = 0.2,
        headerless_share: float = 0.1,
        crawl_delay_share: float = 0.1,
        *,
        rate_limit: RateLimit | None = None,
        date_share: float = 0.5,
        burst: Burst | None = None,
        crawl_delay_s: float = 0.5,
    ) -> FarmConfig:
        """A copy whose generated hosts push back, the hosts drawn from ``seed``.

        Three disjoint sets of hosts, taken in turn from one seeded
        permutation of the host indexes (``share x hosts``, rounded half
        up, each):

        * ``retry_after_share`` -- rate-limited (``rate_limit``, default 4
          requests per second) with ``Retry-After``: the first
          ``date_share`` of them (rounded half up) as an HTTP date, the
          others in delta-seconds;
        * ``headerless_share`` -- refusals without Retry-After, alternately
          a headerless 429 rate limit and 503 bursts (``burst``, default
          2 s in every 10 s), the first being a 429;
        * ``crawl_delay_share`` -- a robots.txt with ``Crawl-delay:
          crawl_delay_s``.

        ``rate_limits``, ``bursts`` and ``crawl_delays`` are replaced; the
        static sites' push-back and every other field are kept.
        """
        shares = (retry_after_share, headerless_share, crawl_delay_share)
        if any(not 0.0 <= s <= 1.0 for s in (*shares, date_share)) or sum(shares) > 1.0:
            raise ValueError("push-back shares must be in [0, 1] and sum to <= 1")
        limit = rate_limit if rate_limit is not None else RateLimit(requests=4, window_s=1.0)
        bursting = burst if burst is not None else Burst(period_s=10.0, duration_s=2.0)
        order = np.random.default_rng([self.seed, 0x9B5B]).permutation(self.hosts).tolist()
        n_ra, n_bare, n_cd = (int(s * self.hosts + 0.5) for s in shares)
        n_date = int(date_share * n_ra + 0.5)
        with_ra = order[:n_ra]
        bare = order[n_ra : n_ra + n_bare]
        delayed = order[n_ra + n_bare : n_ra + n_bare + n_cd]
        rate_limits = {
            i: dataclasses.replace(limit, retry_after="date" if k < n_date else "seconds")
            for k, i in enumerate(with_ra)
        }
        for i in bare[0::2]:
            rate_limits[i] = dataclasses.replace(limit, retry_after="none")
        return dataclasses.replace(
            self,
            rate_limits=dict(sorted(rate_limits.items())),
            bursts={i: bursting for i in sorted(bare[1::2])},
            crawl_delays=dict.fromkeys(sorted(delayed), crawl_delay_s),
        )

    def __hash__(self) -> int:
        return hash(self.to_json())

    def to_json(self) -> str:
        """Serialise deterministically (sorted keys) for the server's command line."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FarmConfig:
        """Inverse of :meth:`to_json`; unknown keys are an error, not silently dropped."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("farm config JSON must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown farm config keys: {unknown}")
        return cls(**data)


def load_rtt_matrix(path: str | os.PathLike[str]) -> npt.NDArray[np.float64]:
    """Read a square, whitespace-separated RTT matrix in milliseconds.

    Files may be gzip-compressed (detected by magic bytes, not by name) and
    may contain ``#`` comment lines.  Missing measurements -- tokens such as
    ``NA``/``nan``/``-``/``?``, negative numbers, or a ``0`` off the diagonal
    (an RTT of exactly zero between two distinct machines is a placeholder,
    not a measurement) -- are repaired so that lookups never fail: first
    from the symmetric entry, then with the median of the row's valid
    off-diagonal values, and finally with the global median.
    """
    m = read_rtt_matrix(path)
    n = m.shape[0]
    off_diag = ~np.eye(n, dtype=bool)
    np.fill_diagonal(m, np.where(np.isnan(np.diag(m)), 0.0, np.diag(m)))
    missing = np.isnan(m)
    if missing.any():
        m = np.where(missing, m.T, m)
        missing = np.isnan(m)
        if missing.any():
            off = np.where(off_diag, m, math.nan)  # a row's typical RTT ignores itself
            valid = ~np.isnan(off)
            overall = float(np.median(off[valid])) if valid.any() else 0.0
            row_med = np.array(
                [
                    float(np.median(row[ok])) if ok.any() else overall
                    for row, ok in zip(off, valid, strict=True)
                ]
            )
            m = np.where(missing, row_med[:, None], m)
        logger.info("RTT matrix %s: repaired missing entries", path)
    return m


class _Host:
    """Precomputed per-host data; built lazily because farms can be large."""

    __slots__ = (
        "cross",
        "faults",
        "first_leaf",
        "in_links",
        "index",
        "n_pages",
        "name",
        "path_index",
        "paths",
        "sizes",
        "topics",
    )

    def __init__(
        self,
        index: int,
        name: str,
        n_pages: int,
        topics: tuple[str, ...],
        paths: tuple[str, ...],
        in_links: npt.NDArray[np.int64],
        cross: dict[int, tuple[int, int]],
        sizes: npt.NDArray[np.int64],
        faults: npt.NDArray[np.uint8],
    ) -> None:
        self.index = index
        self.name = name
        self.n_pages = n_pages
        self.topics = topics
        self.paths = paths
        self.path_index = {p: k for k, p in enumerate(paths)}
        self.first_leaf = 1 + len(topics)
        self.in_links = in_links
        self.cross = cross
        self.sizes = sizes
        self.faults = faults


class FarmModel:
    """Pure, deterministic description of a farm (no Twisted, no sockets).

    Site layout of host ``i`` (``n = n_pages(i)`` content pages):

    * ``/`` -- the root, linking to every topic index of the host;
    * ``/<topic>/`` -- topic indexes, linking to *all* pages of that topic;
    * ``/<topic>/<k>.html`` for ``k in range(n)`` -- content pages, topic
      ``topics[k % len(topics)]`` (round-robin), each with up to
      ``links_per_page`` random links inside the host (duplicates removed)
      and, with probability ``cross_host_link_prob``, one link to a content
      page of another host.

    Content pages chosen by the fault draw answer 500 (``"error"``, always,
    with a link-less body), 503 on the first request only (``"transient"``)
    or only after ``timeout_s`` (``"timeout"``).  Links are absolute URLs
    with the server's port, hence the ``port`` argument of the URL-building
    methods.
    """

    def __init__(self, config: FarmConfig | None = None) -> None:
        self.config = config if config is not None else FarmConfig()
        self._counts = self._allocate_pages()
        self._host_cache: dict[int, _Host] = {}
        self._names = tuple(f"h{i:04d}.{self.config.domain}" for i in range(self.config.hosts))
        self._name_index = {name: i for i, name in enumerate(self._names)}
        self._rtt: npt.NDArray[np.float64] | None = None
        self._filler = self._make_filler()
        #: How the generated pages change over time (None: they never do).
        self.changes = (
            ChangeModel(seed=self.config.seed, **self.config.page_changes)
            if self.config.page_changes
            else None
        )

    # ------------------------------------------------------------------ layout
    def _allocate_pages(self) -> tuple[int, ...]:
        """Zipf shares with the largest-remainder method, then the floor.

        Largest remainder keeps the sum exactly ``total_pages`` (before the
        per-host minimum is applied) and keeps counts non-increasing in the
        host index, so host 0 is always (one of) the biggest.
        """
        cfg = self.config
        ranks = np.arange(1, cfg.hosts + 1, dtype=np.float64)
        weights = ranks ** (-cfg.zipf_s)
        share = cfg.total_pages * weights / weights.sum()
        base = np.floor(share).astype(np.int64)
        remainder = int(cfg.total_pages - base.sum())
        if remainder > 0:
            order = np.argsort(-(share - base), kind="stable")
            base[order[:remainder]] += 1
        counts = np.maximum(base, cfg.min_pages_per_host)
        return tuple(int(c) for c in counts)

    def _make_filler(self) -> bytes:
        rng = np.random.default_rng([self.config.seed, 0xF111E5])
        words = [_WORDS[int(k)] for k in rng.integers(0, len(_WORDS), _FILLER_BYTES // 5)]
        blob = b" ".join(words)[:_FILLER_BYTES]
        return blob + b" " + blob  # doubled so any window of <= 64 KiB is one slice

    @property
    def hosts(self) -> int:
        return self.config.hosts

    def host_name(self, i: int) -> str:
        """``h0042.farm.test``; the index is zero-padded to (at least) 4 digits."""
        return self._names[i]

    def host_index(self, name: str) -> int | None:
        """Inverse of :meth:`host_name`; tolerates a ``:port`` suffix and case."""
        host = name.rsplit(":", 1)[0] if ":" in name else name
        return self._name_index.get(host.strip().rstrip(".").lower())

    def n_pages(self, i: int) -> int:
        """Number of *content* pages of host ``i`` (root and indexes excluded)."""
        self._check_host(i)
        return self._counts[i]

    def page_counts(self) -> tuple[int, ...]:
        """Content pages per host, host 0 first."""
        return self._counts

    def n_urls(self, i: int | None = None) -> int:
        """Number of servable paths of host ``i`` (or of the whole farm)."""
        if i is None:
            return sum(self.n_urls(h) for h in range(self.hosts))
        n = self.n_pages(i)
        return 1 + min(n, len(self.config.topics)) + n

    def _check_host(self, i: int) -> None:
        if not 0 <= i < self.config.hosts:
            raise IndexError(f"host index {i} out of range(0, {self.config.hosts})")

    def _host(self, i: int) -> _Host:
        host = self._host_cache.get(i)
        if host is None:
            host = self._build_host(i)
            self._host_cache[i] = host
        return host

    def _leaf_path(self, k: int) -> str:
        topics = self.config.topics
        return f"/{topics[k % len(topics)]}/{k}.html"

    def _build_host(self, i: int) -> _Host:
        self._check_host(i)
        cfg = self.config
        n = self._counts[i]
        n_topics = len(cfg.topics)
        used = cfg.topics[: min(n, n_topics)]
        paths = ("/", *(f"/{t}/" for t in used), *(self._leaf_path(k) for k in range(n)))
        n_paths = len(paths)
        first_leaf = 1 + len(used)
        # Independent streams per aspect: changing links_per_page must not
        # reshuffle which URLs fail, and vice versa.
        link_rng = np.random.default_rng([cfg.seed, i, 1])
        leaf_pos = np.arange(first_leaf, n_paths, dtype=np.int64)
        if n_paths > 1 and cfg.links_per_page > 0:
            targets = link_rng.integers(0, n_paths - 1, size=(n, cfg.links_per_page))
            targets += targets >= leaf_pos[:, None]  # never link to yourself
        else:
            targets = np.zeros((n, 0), dtype=np.int64)
        cross: dict[int, tuple[int, int]] = {}
        if cfg.hosts > 1 and cfg.cross_host_link_prob > 0 and n:
            picks = np.flatnonzero(link_rng.random(n) < cfg.cross_host_link_prob)
            other = link_rng.integers(0, cfg.hosts - 1, size=len(picks))
            other += other >= i
            frac = link_rng.random(len(picks))
            for k, j, f in zip(picks.tolist(), other.tolist(), frac.tolist(), strict=True):
                cross[k] = (j, min(int(f * self._counts[j]), self._counts[j] - 1))
        size_rng = np.random.default_rng([cfg.seed, i, 2])
        mean = float(cfg.page_bytes)
        raw = mean * np.exp(_SIZE_SIGMA * size_rng.standard_normal(n) - _SIZE_SIGMA**2 / 2)
        low = min(_MIN_PAGE_BYTES, cfg.page_bytes)
        sizes = np.clip(raw, low, max(low, _MAX_SIZE_FACTOR * mean)).astype(np.int64)
        u = np.random.default_rng([cfg.seed, i, 3]).random(n)
        e, t = cfg.error_rate, cfg.error_rate + cfg.transient_error_rate
        faults = np.full(n, _FAULT_OK, dtype=np.uint8)
        faults[u < e] = _FAULT_ERROR
        faults[(u >= e) & (u < t)] = _FAULT_TRANSIENT
        faults[(u >= t) & (u < t + cfg.timeout_rate)] = _FAULT_TIMEOUT
        return _Host(i, self._names[i], n, used, paths, targets, cross, sizes, faults)

    def paths(self, i: int) -> list[str]:
        """All servable paths of host ``i``: root, topic indexes, content pages."""
        return list(self._host(i).paths)

    def topic_of(self, path: str) -> str | None:
        """Topic encoded in ``path`` (``/news/`` and ``/news/3.html`` -> ``news``)."""
        parts = path.split("?", 1)[0].split("/")
        if len(parts) >= 3 and parts[1] in self.config.topics:
            return parts[1]
        return None

    def url(self, i: int, path: str = "/", port: int = 80) -> str:
        return f"http://{self.host_name(i)}:{port}{path}"

    def start_urls(self, port: int) -> list[str]:
        """Every host's root URL -- from these, every page is reachable."""
        return [self.url(i, "/", port) for i in range(self.hosts)]

    def all_urls(self, port: int) -> set[str]:
        """Every servable URL of the farm."""
        return {self.url(i, p, port) for i in range(self.hosts) for p in self._host(i).paths}

    def fault(self, i: int, path: str) -> Fault:
        """Injected failure mode of a URL (``"missing"`` for unknown paths)."""
        host = self._host(i)
        pidx = host.path_index.get(path)
        if pidx is None:
            return "missing"
        if pidx < host.first_leaf:
            return "ok"
        return _FAULT_NAMES[int(host.faults[pidx - host.first_leaf])]

    def _targets(self, i: int, pidx: int) -> list[tuple[int, int]]:
        """Outgoing links of a page as ``(host, path index)``; error pages have none."""
        host = self._host(i)
        if pidx == 0:
            return [(i, k) for k in range(1, host.first_leaf)]
        if pidx < host.first_leaf:
            step = len(self.config.topics)
            first = host.first_leaf
            return [(i, first + k) for k in range(pidx - 1, host.n_pages, step)]
        leaf = pidx - host.first_leaf
        if host.faults[leaf] == _FAULT_ERROR:
            return []
        out = [(i, int(t)) for t in dict.fromkeys(host.in_links[leaf].tolist())]
        cross = host.cross.get(leaf)
        if cross is not None:
            j, m = cross
            out.append((j, 1 + min(self._counts[j], len(self.config.topics)) + m))
        return out

    def _path_at(self, i: int, pidx: int) -> str:
        return self._host(i).paths[pidx]

    def links(self, i: int, path: str, port: int) -> list[str]:
        """Absolute link URLs of a page, in document order."""
        pidx = self._host(i).path_index.get(path)
        if pidx is None:
            return []
        return [self.url(j, self._path_at(j, q), port) for j, q in self._targets(i, pidx)]

    def size_hint(self, i: int, path: str) -> int:
        """Body size used for bandwidth delays (independent of the port)."""
        host = self._host(i)
        pidx = host.path_index.get(path)
        if pidx is None:
            return 0
        if pidx >= host.first_leaf:
            return int(host.sizes[pidx - host.first_leaf])
        return len(self.page(i, path, 0)[1])

    def page(self, i: int, path: str, port: int) -> tuple[int, bytes, list[str]]:
        """``(status, body, links)`` for a URL; byte-identical for equal configs.

        ``"transient"`` and ``"timeout"`` pages return their eventual 200
        answer here; the server adds the first 503 and the hang.
        """
        host = self._host(i)
        pidx = host.path_index.get(path)
        if pidx is None:
            return 404, _status_body(404, f"{host.name}{path}"), []
        if pidx >= host.first_leaf and host.faults[pidx - host.first_leaf] == _FAULT_ERROR:
            return 500, _status_body(500, f"{host.name}{path}"), []
        links = [
            (self.url(j, self._path_at(j, q), port), self._path_at(j, q), j)
            for j, q in self._targets(i, pidx)
        ]
        title = f"{host.name}{path}".encode()
        topic = self.topic_of(path) or ""
        head = b"".join(
            (
                b'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>',
                title,
                b'</title></head>\n<body data-topic="',
                topic.encode(),
                b'">\n<h1>',
                title,
                b"</h1>\n<ul>\n",
                *(
                    b'<li><a href="%s">%s%s</a></li>\n'
                    % (u.encode(), self._names[j].encode(), p.encode())
                    for u, p, j in links
                ),
                b"</ul>\n<p>",
            )
        )
        tail = b"</p>\n</body></html>\n"
        filler = b""
        if pidx >= host.first_leaf:
            leaf = pidx - host.first_leaf
            need = int(host.sizes[leaf]) - len(head) - len(tail)
            if need > 0:
                filler = self._filler_slice(i * 7919 + leaf * 104729, need)
        return 200, head + filler + tail, [u for u, _, _ in links]

    def _filler_slice(self, offset: int, need: int) -> bytes:
        half = len(self._filler) // 2
        if need <= half:
            start = offset % half
            return self._filler[start : start + need]
        reps = need // half + 1
        return (self._filler[:half] * reps)[:need]

    # --------------------------------------------------------------- crawling
    def expected_urls(self, port: int, start_urls: Iterable[str] | None = None) -> set[str]:
        """URLs a perfect crawl fetches: BFS over links from ``start_urls``.

        Every reachable URL is included, error (500) pages too: a crawler
        fetches them once, it just finds no links in them.  Start URLs that
        are not farm pages are included as given (the crawler fetches them
        and gets a 404).  Default start: every host's root, which reaches
        every page.
        """
        seen: set[tuple[int, int]] = set()
        extra: set[str] = set()
        frontier: deque[tuple[int, int]] = deque()
        if start_urls is None:
            frontier.extend((i, 0) for i in range(self.hosts))
        else:
            for url in start_urls:
                parts = urlsplit(url)
                idx = self.host_index(parts.hostname or "")
                pidx = None if idx is None else self._host(idx).path_index.get(parts.path or "/")
                if idx is None or pidx is None:
                    extra.add(url)
                else:
                    frontier.append((idx, pidx))
        seen.update(frontier)
        while frontier:
            i, pidx = frontier.popleft()
            for node in self._targets(i, pidx):
                if node not in seen:
                    seen.add(node)
                    frontier.append(node)
        return extra | {self.url(i, self._path_at(i, q), port) for i, q in seen}

    # --------------------------------------------------------------- push-back
    def burst_phase_s(self, host: int | str) -> float:
        """The host's offset into its time-mode burst cycle, from the seed (0 without one)."""
        i, name = self._pushback_key(host)
        cfg = self.config
        burst = cfg.bursts.get(i) if i is not None else cfg.static_bursts.get(name)
        if burst is None or burst.period_s <= 0:
            return 0.0
        key = [cfg.seed, i, 4] if i is not None else [cfg.seed, zlib.crc32(name.encode()), 5]
        return float(np.random.default_rng(key).random()) * burst.period_s

    def _pushback_key(self, host: int | str) -> tuple[int | None, str]:
        if isinstance(host, int):
            self._check_host(host)
            return host, self._names[host]
        name = (host.rsplit(":", 1)[0] if ":" in host else host).strip().rstrip(".").lower()
        if name in self.config.static_sites:
            return None, name
        return self._name_index.get(name), name

    def pushback(self, host: int | str) -> HostPushback | None:
        """What a host (index, generated name or static site name) does to push back, or None."""
        i, name = self._pushback_key(host)
        cfg = self.config
        if i is None:
            limit = cfg.static_rate_limits.get(name)
            burst = cfg.static_bursts.get(name)
            delay = None
        else:
            limit = cfg.rate_limits.get(i)
            burst = cfg.bursts.get(i)
            delay = cfg.crawl_delays.get(i)
        if limit is None and burst is None and delay is None:
            return None
        return HostPushback(name, i, limit, burst, self.burst_phase_s(host), delay)

    def pushback_hosts(self) -> dict[str, HostPushback]:
        """Every host that pushes back, by name: generated hosts by index, then static sites."""
        cfg = self.config
        indexes = sorted({*cfg.rate_limits, *cfg.bursts, *cfg.crawl_delays})
        names = sorted({*cfg.static_rate_limits, *cfg.static_bursts})
        specs = [self.pushback(i) for i in indexes] + [self.pushback(n) for n in names]
        return {spec.host: spec for spec in specs if spec is not None}

    def robots_txt(self, i: int) -> bytes | None:
        """Body of host ``i``'s ``/robots.txt``: its Crawl-delay, or None (a 404) without one."""
        self._check_host(i)
        spec = self.pushback(i)
        return None if spec is None else spec.robots_txt()

    def pushback_tracker(self) -> PushbackTracker:
        """The receipt-time decisions and counters the server applies (pure: pass a clock)."""
        return PushbackTracker(self.pushback, active=self.config.has_pushback)

    # ---------------------------------------------------------------- latency
    def rtt_matrix_ms(self) -> npt.NDArray[np.float64]:
        """The repaired RTT matrix (ms), loaded on first use and checked against the config."""
        if self._rtt is None:
            if self.config.rtt_matrix is None:
                raise ValueError("no rtt_matrix configured")
            m = load_rtt_matrix(self.config.rtt_matrix)
            n = m.shape[0]
            for node, row in self.config.node_rows.items():
                if not 0 <= row < n:
                    raise ValueError(f"node_rows[{node!r}] = {row} outside the {n}x{n} matrix")
            for host, col in self.config.host_columns.items():
                if not 0 <= col < n:
                    raise ValueError(f"host_columns[{host}] = {col} outside the {n}x{n} matrix")
            self._rtt = m
        return self._rtt

    def host_column(self, i: int) -> int:
        """Matrix column standing for host ``i`` (spread so hosts differ)."""
        col = self.config.host_columns.get(i)
        return col if col is not None else (i * 7 + 1) % self.rtt_matrix_ms().shape[0]

    def latency_ms(self, i: int, node: str | None = None) -> float:
        """One response's base delay: node->host RTT if known, else the host's latency."""
        cfg = self.config
        if node is not None and cfg.rtt_matrix is not None and node in cfg.node_rows:
            m = self.rtt_matrix_ms()
            return float(m[cfg.node_rows[node], self.host_column(i)]) * cfg.latency_scale
        return cfg.host_latency_ms.get(i, cfg.latency_ms)

    def bandwidth_delay_s(self, i: int, nbytes: int) -> float:
        kbps = self.config.host_bandwidth_kbps.get(i, self.config.bandwidth_kbps)
        if not kbps or kbps <= 0:
            return 0.0
        return nbytes * 8.0 / (kbps * 1000.0)

    def delay_s(
        self, i: int, path: str, node: str | None = None, nbytes: int | None = None
    ) -> float:
        """Seconds the server waits before answering ``path`` on host ``i``.

        latency (or RTT for a known ``node``) + body size / bandwidth, plus
        ``timeout_s`` for ``"timeout"`` URLs.  ``nbytes`` defaults to
        :meth:`size_hint`; the server passes the real body length.
        """
        size = self.size_hint(i, path) if nbytes is None else nbytes
        delay = self.latency_ms(i, node) / 1000.0 + self.bandwidth_delay_s(i, size)
        if self.fault(i, path) == "timeout":
            delay += self.config.timeout_s
        return delay


_REASONS: Final = {
    200: b"OK",
    304: b"Not Modified",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    503: b"Service Unavailable",
}


def _status_body(status: int, what: str) -> bytes:
    reason = _REASONS.get(status, b"Error").decode()
    return (
        f"<!DOCTYPE html>\n<html><head><title>{status} {reason}</title></head>\n"
        f"<body><h1>{status} {reason}</h1><p>{what}</p></body></html>\n"
    ).encode()
