"""A deterministic local "web farm": many virtual hosts served by one process.

Scheduling components can only be judged against a web whose shape, latency
and failures are known in advance.  This module provides three layers:

* :class:`FarmConfig` / :class:`FarmModel` -- a *pure* description of the
  farm: which hosts exist, which pages they have, what every page contains,
  which links it carries, how long it takes to answer and whether it fails.
  Everything is derived from ``seed``, so tests can compute the exact set of
  URLs a perfect crawl must fetch (:meth:`FarmModel.expected_urls`) without
  ever talking to the server.
* :class:`FarmServer` / :class:`FarmProtocol` -- a lean HTTP/1.1 server on a
  Twisted reactor.  It dispatches on the ``Host`` header, injects delays with
  ``callLater`` (never by sleeping) and keeps the bookkeeping counters (per
  host requests, maximum in-flight requests per host, per crawler node) that
  politeness and network-awareness tests need.  A hand-written protocol is
  used instead of ``twisted.web`` because the benchmarks need several
  thousand pages per second from one core.
* :class:`WebFarm` -- a launcher that runs the server in a child process
  (``python -m scrapy_banker.testing.webfarm``) so crawls under test never
  share a reactor or a GIL with the site they crawl.

Run ``python -m scrapy_banker.testing.webfarm --config-json '{"hosts": 5}'``
to serve a farm by hand; it prints ``LISTENING <port>`` once it accepts
connections.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Literal, Protocol, cast
from urllib.parse import parse_qs, urlsplit

import numpy as np
import numpy.typing as npt
from twisted.internet import protocol
from twisted.python.failure import Failure

from scrapy_banker.net.gnp import read_rtt_matrix
from scrapy_banker.testing.static_sites import StaticSite

logger = logging.getLogger(__name__)

__all__ = [
    "FarmConfig",
    "FarmModel",
    "FarmProtocol",
    "FarmServer",
    "Fault",
    "WebFarm",
    "load_rtt_matrix",
    "main",
]

Fault = Literal["ok", "error", "transient", "timeout", "missing"]

#: Header a crawler node sends so the farm can apply node-to-host RTTs.
NODE_HEADER: Final = "X-Banker-Node"
_NODE_HEADER_LOWER: Final = NODE_HEADER.lower().encode()
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
    #: Virtual host name -> directory served as it is (:mod:`.static_sites`).
    static_sites: dict[str, str] = field(default_factory=dict)
    #: Virtual host name of a static site -> its latency (default ``latency_ms``).
    static_latency_ms: dict[str, float] = field(default_factory=dict)
    #: Seconds between samples of the requests in flight (0: no sampling).
    sample_interval_s: float = 0.0

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
        setattr_(self, "static_sites",
                 {str(k).strip(".").lower(): str(v) for k, v in self.static_sites.items()})
        setattr_(self, "static_latency_ms",
                 {str(k).strip(".").lower(): float(v) for k, v in self.static_latency_ms.items()})
        if self.bandwidth_kbps is not None:
            setattr_(self, "bandwidth_kbps", float(self.bandwidth_kbps))
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
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    503: b"Service Unavailable",
}
_HTML: Final = b"text/html; charset=utf-8"
_JSON: Final = b"application/json"


def _status_body(status: int, what: str) -> bytes:
    reason = _REASONS.get(status, b"Error").decode()
    return (
        f"<!DOCTYPE html>\n<html><head><title>{status} {reason}</title></head>\n"
        f"<body><h1>{status} {reason}</h1><p>{what}</p></body></html>\n"
    ).encode()


def _response(
    status: int, body: bytes, content_type: bytes, keep_alive: bool, http10: bool, head: bool
) -> bytes:
    connection = (
        b""
        if keep_alive and not http10
        else (b"Connection: keep-alive\r\n" if keep_alive else b"Connection: close\r\n")
    )
    header = (
        b"HTTP/1.1 %d %s\r\nServer: scrapy-banker-farm\r\nContent-Type: %s\r\n"
        b"Content-Length: %d\r\n%s\r\n"
        % (status, _REASONS.get(status, b"Error"), content_type, len(body), connection)
    )
    return header if head else header + body


class _DelayedCall(Protocol):
    # Structural stand-ins for Twisted's zope interfaces, which mypy cannot
    # check without the zope plugin.
    def active(self) -> bool: ...
    def cancel(self) -> None: ...


class _Clock(Protocol):
    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object
    ) -> _DelayedCall: ...


class _Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def loseConnection(self) -> None: ...
    def setTcpNoDelay(self, enabled: bool) -> None: ...


class _Answer:
    __slots__ = ("body", "content_type", "delay", "host", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        delay: float = 0.0,
        host: str | None = None,
        content_type: bytes = _HTML,
    ) -> None:
        self.status = status
        self.body = body
        self.delay = delay
        self.host = host
        self.content_type = content_type


class FarmServer:
    """Server-wide state: the model, cached bodies and bookkeeping counters.

    Separated from the protocol so dispatch logic is testable without
    sockets, and so one instance can be shared by all connections.
    """

    #: Bodies are cached because rendering dominates the cost of a request.
    max_cached_bodies = 200_000

    def __init__(self, model: FarmModel, clock: _Clock, port: int = 0) -> None:
        self.model = model
        self.clock = clock
        self.port = port
        self._bodies: dict[tuple[int, str], tuple[int, bytes, float]] = {}
        self._sites: dict[str, StaticSite] = {}
        self.reset()

    def reset(self) -> None:
        """Forget counters and transient-error memory: as if freshly started.

        In-flight requests are kept (they will still be answered), so the
        maxima restart from the current in-flight numbers.
        """
        self.requests = 0
        self.per_host: dict[str, int] = {}
        self.per_node: dict[str, int] = {}
        self.statuses: dict[int, int] = {}
        self.fetches: dict[str, int] = {}
        self._transient_seen: set[tuple[int, str]] = set()
        inflight: dict[str, int] = getattr(self, "inflight", {})
        self.inflight = {h: n for h, n in inflight.items() if n > 0}
        self.max_inflight = dict(self.inflight)
        #: Monotonic times of the first request received and the last answer sent.
        self.first_at: float | None = None
        self.last_done_at: float | None = None
        #: ``[seconds since the first request, in flight, {host: in flight}]``.
        self.samples: list[list[Any]] = []
        #: Host -> seconds since the first request at which its last answer left.
        self.host_done: dict[str, float] = {}

    def sample(self) -> None:
        """Record the requests in flight now (called every ``sample_interval_s``)."""
        if self.first_at is None:
            return
        busy = {h: n for h, n in self.inflight.items() if n > 0}
        self.samples.append(
            [round(time.monotonic() - self.first_at, 3), sum(busy.values()), busy]
        )

    def enter(self, host: str) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        n = self.inflight.get(host, 0) + 1
        self.inflight[host] = n
        if n > self.max_inflight.get(host, 0):
            self.max_inflight[host] = n

    def leave(self, host: str) -> None:
        self.inflight[host] -= 1
        now = self.last_done_at = time.monotonic()
        if self.first_at is not None:
            self.host_done[host] = round(now - self.first_at, 3)

    def stats(self, urls: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "per_host": dict(self.per_host),
            "max_inflight_per_host": dict(self.max_inflight),
            "inflight": {h: n for h, n in self.inflight.items() if n},
            "per_node": dict(self.per_node),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            # From the first request received to the last answer sent: the crawl's
            # span as the sites saw it (no process start-up, no idle-close wait).
            "host_done_s": dict(self.host_done),
            "span_s": (
                None
                if self.first_at is None or self.last_done_at is None
                else round(self.last_done_at - self.first_at, 4)
            ),
        }
        if urls:
            out["fetches"] = dict(self.fetches)
        return out

    def _cached(self, i: int, path: str) -> tuple[int, bytes, float]:
        key = (i, path)
        hit = self._bodies.get(key)
        if hit is None:
            status, body, _ = self.model.page(i, path, self.port)
            # The node-independent part of the delay: bandwidth (+ timeout).
            extra = self.model.bandwidth_delay_s(i, len(body))
            if self.model.fault(i, path) == "timeout":
                extra += self.model.config.timeout_s
            if len(self._bodies) >= self.max_cached_bodies:
                self._bodies.clear()
            hit = self._bodies[key] = (status, body, extra)
        return hit

    def _static(self, hostname: str) -> StaticSite | None:
        root = self.model.config.static_sites.get(hostname)
        if root is None:
            return None
        site = self._sites.get(hostname)
        if site is None:
            site = self._sites[hostname] = StaticSite(root)
        return site

    def handle(
        self, target: str, host_header: str, node: str | None, method: str = "GET"
    ) -> _Answer:
        """Answer one request; counters are updated at receipt time.

        Generated hosts answer GET and HEAD (405 otherwise); static sites
        answer POST like GET.
        """
        if target.startswith(("http://", "https://")):  # absolute-form (proxies)
            parts = urlsplit(target)
            host_header = parts.netloc
            target = parts.path + (f"?{parts.query}" if parts.query else "")
        path, _, query = target.partition("?")
        if path.startswith(STATS_PREFIX):
            return self._bookkeeping(path, query)
        hostname = host_header.rsplit(":", 1)[0] if ":" in host_header else host_header
        hostname = hostname.strip().rstrip(".").lower()
        self.requests += 1
        self.per_host[hostname] = self.per_host.get(hostname, 0) + 1
        url = f"http://{hostname}:{self.port}{target}"
        self.fetches[url] = self.fetches.get(url, 0) + 1
        if node is not None:
            self.per_node[node] = self.per_node.get(node, 0) + 1
        site = self._static(hostname)
        i = None if site is not None else self.model.host_index(hostname)
        if site is not None:
            status, body, ctype = site.answer(path)
            delay = self.model.config.static_latency_ms.get(hostname, self.model.config.latency_ms)
            answer = _Answer(status, body, delay / 1000.0, hostname, ctype)
        elif method not in ("GET", "HEAD"):
            answer = _Answer(405, _status_body(405, method), host=hostname)
        elif i is None:
            answer = _Answer(404, _status_body(404, f"unknown host {hostname}"), host=hostname)
        else:
            status, body, extra = self._cached(i, path)
            delay = self.model.latency_ms(i, node) / 1000.0 + extra
            if status == 200 and self.model.fault(i, path) == "transient":
                key = (i, path)
                if key not in self._transient_seen:
                    self._transient_seen.add(key)
                    body = _status_body(503, f"{hostname}{path}")
                    status = 503
                    delay -= extra
                    delay += self.model.bandwidth_delay_s(i, len(body))
            answer = _Answer(status, body, max(delay, 0.0), hostname)
        self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
        return answer

    def _bookkeeping(self, path: str, query: str) -> _Answer:
        if path == STATS_PREFIX + "stats":
            urls = parse_qs(query).get("urls", ["0"])[0] not in ("", "0", "false")
            body = json.dumps(self.stats(urls), sort_keys=True).encode()
        elif path == STATS_PREFIX + "samples":
            body = json.dumps(self.samples).encode()
        elif path == STATS_PREFIX + "reset":
            self.reset()
            body = b'{"ok": true}'
        elif path == STATS_PREFIX + "config":
            body = self.model.config.to_json().encode()
        else:
            return _Answer(404, _status_body(404, path))
        return _Answer(200, body, content_type=_JSON)


class _Slot:
    """One pipelined request awaiting its (possibly delayed) response."""

    __slots__ = ("call", "close", "data", "host")

    def __init__(self, host: str | None, close: bool) -> None:
        self.host = host
        self.close = close
        self.data: bytes | None = None
        self.call: _DelayedCall | None = None


class FarmProtocol(protocol.Protocol):
    """Minimal HTTP/1.1 (GET/HEAD, keep-alive, pipelining) for speed.

    Responses leave in request order even when a later request's delay is
    shorter, as HTTP/1.1 pipelining demands; a request counts as in flight
    for its host until its response is written.
    """

    max_header_bytes = 65536

    def __init__(self, server: FarmServer) -> None:
        self._server = server
        self._buf = b""
        self._skip = 0
        self._queue: deque[_Slot] = deque()
        self._stop_reading = False
        self._lost = False

    def connectionMade(self) -> None:
        transport = cast(_Transport, self.transport)
        with contextlib.suppress(AttributeError, OSError):  # non-TCP transports
            transport.setTcpNoDelay(True)

    def dataReceived(self, data: bytes) -> None:
        if self._stop_reading:
            return
        buf = self._buf + data if self._buf else data
        pos = 0
        size = len(buf)
        while not self._stop_reading:
            if self._skip:
                take = min(self._skip, size - pos)
                pos += take
                self._skip -= take
                if self._skip:
                    break
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                break
            body_len = self._request(buf[pos:end])
            pos = end + 4
            if body_len:
                take = min(body_len, size - pos)
                pos += take
                self._skip = body_len - take
        self._buf = buf[pos:] if pos < size else b""
        if len(self._buf) > self.max_header_bytes and not self._stop_reading:
            self._buf = b""
            self._reply(_Answer(431, _status_body(431, "header too large")), False, False, False)

    def _request(self, head: bytes) -> int:
        """Parse one request head and queue its answer; returns the body length to skip."""
        lines = head.lstrip(b"\r\n").split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._reply(_Answer(400, _status_body(400, "bad request line")), False, False, False)
            return 0
        method, target, version = parts
        host = b""
        node: str | None = None
        connection = b""
        body_len = 0
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip().lower()
            if name == b"host":
                host = value.strip()
            elif name == _NODE_HEADER_LOWER:
                node = value.strip().decode("latin-1")
            elif name == b"connection":
                connection = value.strip().lower()
            elif name == b"content-length":
                try:
                    body_len = int(value)
                except ValueError:
                    body_len = -1
            elif name == b"transfer-encoding" and value.strip().lower() != b"identity":
                self._reply(_Answer(501, _status_body(501, "chunked bodies")), False, False, False)
                return 0
        if body_len < 0:
            self._reply(_Answer(400, _status_body(400, "bad Content-Length")), False, False, False)
            return 0
        http10 = version == b"HTTP/1.0"
        keep_alive = b"keep-alive" in connection if http10 else b"close" not in connection
        answer = self._server.handle(
            target.decode("latin-1"), host.decode("latin-1"), node, method.decode("latin-1")
        )
        self._reply(answer, keep_alive, http10, method == b"HEAD")
        return body_len

    def _reply(self, answer: _Answer, keep_alive: bool, http10: bool, head: bool) -> None:
        if not keep_alive:
            self._stop_reading = True
        slot = _Slot(answer.host, not keep_alive)
        if answer.host is not None:
            self._server.enter(answer.host)
        self._queue.append(slot)
        data = _response(answer.status, answer.body, answer.content_type, keep_alive, http10, head)
        if answer.delay > 0:
            slot.call = self._server.clock.callLater(answer.delay, self._ready, slot, data)
        else:
            self._ready(slot, data)

    def _ready(self, slot: _Slot, data: bytes) -> None:
        slot.call = None
        slot.data = data
        queue = self._queue
        transport = cast("_Transport | None", self.transport)
        if transport is None or self._lost:
            return
        while queue and queue[0].data is not None:
            done = queue.popleft()
            transport.write(cast(bytes, done.data))
            if done.host is not None:
                self._server.leave(done.host)
            if done.close:
                transport.loseConnection()
                self._abandon()
                return

    def _abandon(self) -> None:
        """Cancel queued answers; their requests are no longer in flight."""
        while self._queue:
            slot = self._queue.popleft()
            if slot.call is not None and slot.call.active():
                slot.call.cancel()
            if slot.host is not None:
                self._server.leave(slot.host)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self._lost = True
        self._stop_reading = True
        self._abandon()


class FarmFactory(protocol.Factory):
    """Builds one :class:`FarmProtocol` per connection, all sharing one server."""

    noisy = False

    def __init__(self, server: FarmServer) -> None:
        self.server = server

    def buildProtocol(self, addr: Any) -> FarmProtocol:
        return FarmProtocol(self.server)


# ---------------------------------------------------------------------- process
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the server process (``python -m scrapy_banker.testing.webfarm``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config-json", help="FarmConfig as JSON (default: FarmConfig())")
    source.add_argument("--config-file", help="file holding the FarmConfig JSON")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 = any free port)")
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s webfarm %(levelname)s %(message)s",
    )
    if args.config_file:
        config = FarmConfig.from_json(Path(args.config_file).read_text())
    elif args.config_json:
        config = FarmConfig.from_json(args.config_json)
    else:
        config = FarmConfig()
    model = FarmModel(config)
    if config.rtt_matrix is not None:
        model.rtt_matrix_ms()  # load and check the matrix now: fail before LISTENING

    from twisted.internet import reactor as _reactor

    reactor = cast(Any, _reactor)
    server = FarmServer(model, reactor)
    if config.sample_interval_s > 0:
        from twisted.internet.task import LoopingCall

        LoopingCall(server.sample).start(config.sample_interval_s, now=False)
    listening = reactor.listenTCP(
        args.port, FarmFactory(server), backlog=1024, interface=args.interface
    )
    server.port = int(listening.getHost().port)
    logger.info("serving %d hosts, %d urls on port %d", config.hosts, model.n_urls(), server.port)
    sys.stdout.write(f"LISTENING {server.port}\n")
    sys.stdout.flush()
    reactor.run()  # installs SIGINT/SIGTERM handlers that stop the reactor
    logger.info("stopped after %d requests", server.requests)
    return 0


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL: used by stop() and by the garbage-collection safety net."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        except ProcessLookupError:  # pragma: no cover - raced with its exit
            pass
    if proc.stdout is not None:
        proc.stdout.close()


class WebFarm:
    """Run a farm server in a child process for the duration of a test or benchmark.

    A separate process keeps the farm's CPU time and reactor apart from the
    crawler under test, which matters both for throughput numbers and for
    crawls that run their own reactor.  Starts immediately unless
    ``autostart=False``; usable as a context manager::

        with WebFarm(FarmConfig(hosts=5)) as farm:
            urls = farm.start_urls()
    """

    def __init__(
        self,
        config: FarmConfig | None = None,
        *,
        port: int = 0,
        startup_timeout: float = 30.0,
        autostart: bool = True,
    ) -> None:
        self.config = config if config is not None else FarmConfig()
        self.model = FarmModel(self.config)
        self._requested_port = port
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if autostart:
            self.start()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("WebFarm is not running; call start()")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> WebFarm:
        """Spawn the server and wait for its ``LISTENING`` line."""
        if self._proc is not None:
            return self
        # A file, not a pipe: nobody reads the child's stderr while it runs,
        # and a full pipe would block the server.
        self._stderr = tempfile.TemporaryFile(prefix="webfarm-stderr-")  # noqa: SIM115
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable,
            "-m",
            "scrapy_banker.testing.webfarm",
            "--config-json",
            self.config.to_json(),
            "--port",
            str(self._requested_port),
        ]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, env=env
        )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _terminate, proc)
        try:
            self._port = self._await_listening(proc)
        except BaseException:
            self.stop()
            raise
        logger.debug("web farm pid %d listening on port %d", proc.pid, self._port)
        return self

    def _await_listening(self, proc: subprocess.Popen[bytes]) -> int:
        assert proc.stdout is not None
        deadline = time.monotonic() + self._startup_timeout
        fd = proc.stdout.fileno()
        data = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"web farm did not start within {self._startup_timeout:.0f}s"
                        f"{self._child_stderr()}"
                    )
                if sel.select(timeout=min(left, 0.5)):
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        proc.wait(timeout=5)
                        raise RuntimeError(
                            f"web farm exited with code {proc.returncode} before listening"
                            f"{self._child_stderr()}"
                        )
                    data += chunk
        line = data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        word, _, port = line.partition(" ")
        if word != "LISTENING" or not port.isdigit():
            raise RuntimeError(f"unexpected web farm output {line!r}{self._child_stderr()}")
        return int(port)

    def _child_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read()[-4000:].decode("utf-8", "replace").strip()
        return f"; child stderr:\n{text}" if text else "; child stderr was empty"

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 5 s); idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _terminate once
            self._finalizer = None
        self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> WebFarm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ conveniences
    def url(self, host_index: int, path: str = "/") -> str:
        return self.model.url(host_index, path, self.port)

    def start_urls(self) -> list[str]:
        return self.model.start_urls(self.port)

    def expected_urls(self, start_urls: Iterable[str] | None = None) -> set[str]:
        return self.model.expected_urls(self.port, start_urls)

    def _get(self, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Host": f"{self.model.host_name(0)}:{self.port}"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"web farm {path} answered {resp.status}")
            return json.loads(body)
        finally:
            conn.close()

    def stats(self, urls: bool = False) -> dict[str, Any]:
        """Server counters; ``urls=True`` adds ``fetches``: absolute URL -> count."""
        return cast(dict[str, Any], self._get(STATS_PREFIX + "stats" + ("?urls=1" if urls else "")))

    def reset(self) -> None:
        """Zero the counters and forget which transient URLs already failed."""
        self._get(STATS_PREFIX + "reset")

    def samples(self) -> list[list[Any]]:
        """In-flight samples since the last reset (``FarmConfig.sample_interval_s``)."""
        return cast(list[list[Any]], self._get(STATS_PREFIX + "samples"))


if __name__ == "__main__":
    sys.exit(main())
