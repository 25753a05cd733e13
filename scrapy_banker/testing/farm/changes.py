"""Pages that change over time, and how fresh a crawler's copies of them were.

A crawl that keeps a site fresh is measured against pages whose changes are
known exactly.  :class:`ChangeModel` gives every page a change rate (a few
hot pages, many cold ones, a share that never changes: rates log-uniform
over several orders of magnitude) and, deterministically from the seed, the
times of its changes as a Poisson process -- what the farm serves (a body
version, an ``ETag``, a ``Last-Modified``) and what the judge knows.

:func:`judge` takes the times each page was fetched and returns what the
revisit literature measures (Cho & Garcia-Molina, "Effective page refresh
policies", 2003): *freshness*, the time-averaged share of pages whose copy
is current, and *age*, how long a stale copy has been stale, averaged over
the time copies are stale.  A page counts from its first fetch: before it,
the crawl had not found it yet.

Times are the farm's own seconds (a benchmark compresses a day into a minute
or less by scaling the rates).  Pure: no Twisted, no sockets.
"""

from __future__ import annotations

import bisect
import itertools
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ChangeModel", "Judgement", "judge"]


@dataclass(frozen=True)
class ChangeModel:
    """Every page's change rate and change times, from ``seed``.

    ``rate_min`` / ``rate_max``: changes per second, the range rates are
    drawn from, uniformly in their logarithm; ``static_share``: the share of
    pages that never change.  Keys are whatever names a page (its path).
    ``lying_share``: the share of hosts whose sitemap ``lastmod`` is wrong
    (:meth:`lies`).
    """

    seed: int = 7
    rate_min: float = 1e-3
    rate_max: float = 1.0
    static_share: float = 0.1
    lying_share: float = 0.0
    _times: dict[str, list[float]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _streams: dict[str, np.random.Generator] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _rates: dict[str, float] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.rate_min <= self.rate_max < math.inf:
            raise ValueError(
                f"need 0 < rate_min <= rate_max < inf, got {self.rate_min!r}, {self.rate_max!r}"
            )
        if not 0 <= self.static_share <= 1:
            raise ValueError(f"static_share must be in [0, 1], got {self.static_share!r}")
        if not 0 <= self.lying_share <= 1:
            raise ValueError(f"lying_share must be in [0, 1], got {self.lying_share!r}")

    def lies(self, host: str) -> bool:
        """Whether ``host``'s sitemap stamps every page with the time it is served
        (a ``lastmod`` that claims a change at every read) instead of its last change."""
        return float(self._rng(host, 2).random()) < self.lying_share

    def _rng(self, key: str, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, stream, zlib.crc32(key.encode("utf-8"))])

    def rate(self, key: str) -> float:
        """The page's change rate, changes per second (0: it never changes)."""
        rate = self._rates.get(key)
        if rate is None:
            draw = self._rng(key, 0).random(2)
            lo, hi = math.log(self.rate_min), math.log(self.rate_max)
            rate = 0.0 if draw[0] < self.static_share else math.exp(lo + (hi - lo) * float(draw[1]))
            self._rates[key] = rate
        return rate

    def _drawn(self, key: str, until: float) -> list[float]:
        """The page's change times, ascending, drawn past ``until`` (none if it never changes).

        One stream per page, continued: the same times whatever the order of
        the questions (the farm and the judge ask differently).
        """
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = []
        if not times or times[-1] <= until:
            rate = self.rate(key)
            if rate > 0:
                rng = self._streams.get(key)
                if rng is None:
                    rng = self._streams[key] = self._rng(key, 1)
                t = times[-1] if times else 0.0
                while t <= until:
                    t += float(rng.exponential(1.0 / rate))
                    times.append(t)
        return times

    def changes(self, key: str, until: float) -> list[float]:
        """The page's change times in ``(0, until]``, ascending."""
        times = self._drawn(key, until)
        return times[: bisect.bisect_right(times, until)]

    def version(self, key: str, t: float) -> int:
        """How many times the page changed by ``t``: its body's version then."""
        return bisect.bisect_right(self._drawn(key, t), t)

    def changed_at(self, key: str, t: float) -> float:
        """When the version current at ``t`` appeared (0: the page's start)."""
        times = self._drawn(key, t)
        i = bisect.bisect_right(times, t)
        return times[i - 1] if i else 0.0

    def next_change(self, key: str, t: float) -> float:
        """The first change after ``t`` (``inf`` for a page that never changes)."""
        times = self._drawn(key, t)  # drawn past t: the next one is there
        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) else math.inf

    def etag(self, key: str, t: float) -> str:
        """The ``ETag`` the page carries at ``t`` (a strong validator of its version)."""
        return f'"{zlib.crc32(key.encode("utf-8")):08x}-{self.version(key, t)}"'


@dataclass(frozen=True)
class Judgement:
    """How fresh a crawl kept its copies over a span (see :func:`judge`)."""

    #: Time-averaged share of the pages (from their first fetch) whose copy was current.
    freshness: float
    #: Mean age of stale copies, seconds: time since the copy went stale, over stale time.
    age_s: float
    #: Pages never fetched in the span (not counted in the averages).
    never_fetched: int
    #: Fetches in the span.
    fetches: int


def judge(
    model: ChangeModel, fetches: Mapping[str, Iterable[float]], start: float, end: float
) -> Judgement:
    """Freshness and age of copies fetched at ``fetches`` (page -> times), over ``[start, end]``.

    A copy fetched at ``f`` is current until the page's next change after
    ``f``, or until the next fetch, whichever is first; after that change it
    is stale, its age growing from 0, until the next fetch.  A fetch's copy
    is taken as of the fetch time (the farm serves the version current when
    it answers).
    """
    if not end > start:
        raise ValueError(f"need end > start, got {start!r}, {end!r}")
    fresh_time = stale_time = age_area = 0.0
    never, n_fetches = 0, 0
    for key, times in fetches.items():
        got = sorted(t for t in times if t <= end)
        n_fetches += sum(1 for t in got if t >= start)
        if not got:
            never += 1
            continue
        span_from = max(start, got[0])
        if span_from >= end:
            continue
        bounds = [*got, end]
        for fetched, until in itertools.pairwise(bounds):
            lo, hi = max(fetched, span_from), min(until, end)
            if hi <= lo:
                continue
            stale_from = model.next_change(key, fetched)
            fresh_hi = min(hi, max(lo, stale_from))
            fresh_time += fresh_hi - lo
            if stale_from < hi:
                s_lo = max(lo, stale_from)
                stale_time += hi - s_lo
                # Age at t is t - stale_from: its integral over [s_lo, hi].
                age_area += ((hi - stale_from) ** 2 - (s_lo - stale_from) ** 2) / 2
    # Pages found late are counted from their first fetch only.
    observed = fresh_time + stale_time
    return Judgement(
        freshness=fresh_time / observed if observed > 0 else 0.0,
        age_s=age_area / stale_time if stale_time > 0 else 0.0,
        never_fetched=never,
        fetches=n_fetches,
    )
