"""Network measurements a crawler node takes by itself: latency, crawl and storage bandwidth.

Network-aware scheduling (GNP coordinates, bandwidth-weighted task assignment) is only as
good as its inputs, and raw latency samples are noisy: a lost packet turns a 50 ms
round trip into a retransmission timeout of a second or more.  This module turns samples
into numbers a scheduler can trust, and is kept free of Scrapy, Twisted and Redis so the
same code runs in a downloader middleware, a background publisher thread, a benchmark or
a notebook, and can be tested without a reactor.

Units: latencies are seconds (``*_ms`` keys of :meth:`LinkStats.snapshot` excepted),
bandwidths are bytes per second.

numpy is imported by the functions that compute, not with the module: the
add-on's middlewares import this module in every crawl, network-aware or not,
and a crawl that never measures a link should not carry numpy's objects,
which every full collection of Python's cyclic garbage collector scans.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = [  # noqa: RUF022 - source order, which is also the reading order of the docs
    "FENCE_MADS",
    "choose_modulus",
    "denoised_mean",
    "median",
    "Summary",
    "SampleWindow",
    "LinkStats",
    "storage_bandwidth",
    "RateLimiter",
]

#: Samples farther than this many MADs from the median can never be averaged in.  For
#: Gaussian jitter 6 MAD is about 4 standard deviations, so real jitter is never cut, while
#: a timeout-sized spike on a link whose jitter is a few ms is far outside.
FENCE_MADS = 6.0

#: Relative floor of the automatic modulus (times the largest sample).  It only matters
#: when half or more of the samples are identical (MAD = 0), where any positive modulus
#: gives the same answer; relative, so that scaling the data scales the modulus exactly.
_MODULUS_FLOOR = 2.0**-40


def _as_array(samples: Iterable[float], what: str = "samples") -> np.ndarray:
    """Validate once, here, so every caller reports bad input the same way.

    Latencies and bandwidths are non-negative and finite; a NaN would silently poison
    the median and the binning instead of failing where it was produced.
    """
    import numpy as np

    arr = np.asarray(list(samples), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty sequence of numbers")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} must be finite (no NaN or infinity)")
    if np.any(arr < 0):
        raise ValueError(f"{what} must be non-negative")
    return arr


def _centre_and_mad(arr: np.ndarray) -> tuple[float, float]:
    """Median and MAD: a centre and a spread that survive up to half the samples being spikes.

    The IQR, the usual Freedman-Diaconis input, breaks down once a quarter of the samples
    are spikes, which a burst of packet loss inside a 64-sample window can reach.  Twice
    the MAD equals the IQR for symmetric data, so it is a drop-in replacement.
    """
    import numpy as np

    centre = float(np.median(arr))
    return centre, float(np.median(np.abs(arr - centre)))


def _modulus(arr: np.ndarray) -> float:
    import numpy as np

    _, mad = _centre_and_mad(arr)
    width = 2.0 * (2.0 * mad) / float(np.cbrt(arr.size))
    if width > 0.0:
        return width
    top = float(arr.max())
    return top * _MODULUS_FLOOR if top > 0.0 else 1.0


def choose_modulus(samples: Sequence[float]) -> float:
    """The bin width :func:`denoised_mean` uses when none is given.

    Freedman-Diaconis: ``2 * spread / cbrt(n)`` with ``spread = 2 * MAD`` (the IQR of
    well-behaved jitter, but robust to spikes).  It adapts to the link: a 1 ms-jitter LAN
    and a 40 ms-jitter intercontinental path both get a few bins across their jitter.
    When half or more of the samples are identical the spread is 0 and a tiny positive
    floor relative to the largest sample is used instead, so the result is always > 0 and
    scales with the data.
    """
    return _modulus(_as_array(samples))


def denoised_mean(samples: Sequence[float], modulus: float | None = None, bins: int = 3) -> float:
    """The paper's *statistically weighted mean* of latency samples.

    A plain mean is dragged far off by the few samples that paid a retransmission
    timeout; a median ignores how the bulk is spread.  The GNP crawler paper (section
    2.2.1 (2)) bins samples by a common modulus (bin = ``floor(value / modulus)``), keeps
    the ``bins`` most frequent bins and averages every sample in them.  Ties between
    equally frequent bins go to the lower-latency bin, since spikes only ever add delay.

    One deliberate addition: samples more than :data:`FENCE_MADS` MADs from the median are
    never candidates.  Without it a tight cluster of spikes (identical timeouts, or
    millisecond-quantised latencies whose real values fill fewer than ``bins`` bins) is
    itself one of the most frequent bins and gets averaged in: 20 samples of 50 ms and 4 of
    3000 ms would give 640 ms.

    :param modulus: bin width, in the samples' unit; ``None`` -> :func:`choose_modulus`.
    :param bins: how many of the most frequent bins to average (the paper uses 3).
    :raises ValueError: empty input, NaN/infinite/negative samples, ``modulus <= 0`` or
        ``bins < 1``.
    """
    import numpy as np

    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
    if modulus is not None and not (math.isfinite(modulus) and modulus > 0):
        raise ValueError(f"modulus must be a finite number > 0, got {modulus!r}")
    arr = _as_array(samples)
    width = _modulus(arr) if modulus is None else float(modulus)
    centre, mad = _centre_and_mad(arr)
    reach = FENCE_MADS * mad
    kept = arr[(arr >= centre - reach) & (arr <= centre + reach)]
    # `kept` is never empty: at least half the samples lie within one MAD of the median.
    index = np.floor(kept / width)
    labels, counts = np.unique(index, return_counts=True)  # labels ascend: lower bins first
    # Stable sort on -count keeps ascending labels within a tie: lower latency wins.
    chosen = labels[np.argsort(-counts, kind="stable")[:bins]]
    selected = kept[np.isin(index, chosen)]
    result = math.fsum(selected.tolist()) / selected.size
    # fsum/size can round one ulp past the extremes; keep the result within the samples.
    return min(max(result, float(selected.min())), float(selected.max()))


def median(samples: Sequence[float]) -> float:
    """Median of finite samples, reported next to the denoised mean as a cross-check.

    Unlike :func:`denoised_mean` it accepts negative values: it is a general statistic.
    """
    import numpy as np

    arr = np.asarray(list(samples), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("samples must be a non-empty sequence of numbers")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples must be finite (no NaN or infinity)")
    return float(np.median(arr))


@dataclass(frozen=True)
class Summary:
    """Several views of one window so consumers can judge how noisy it is.

    ``denoised`` is the value to schedule on; ``median`` and ``mean`` differing much from
    it says the window holds spikes; ``last`` is the freshest sample; ``n`` says how much
    evidence there is.
    """

    n: int
    denoised: float
    median: float
    mean: float
    last: float


def _check_sample(value: float, what: str) -> float:
    """Reject a bad sample where it is recorded, not later when a summary is computed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {value!r}")
    return value


class SampleWindow:
    """The most recent ``size`` samples of one quantity.

    Bounded because links change: an hour-old latency says little about now, and a
    long crawl must not grow memory per site.  Locked because the writer (the reactor
    thread) and the reader (a publisher thread) differ.
    """

    def __init__(self, size: int = 64) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """Capacity of the window."""
        maxlen = self._values.maxlen
        assert maxlen is not None
        return maxlen

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def add(self, value: float) -> None:
        """Append a sample, dropping the oldest when full.

        :raises ValueError: NaN, infinite or negative value.
        """
        checked = _check_sample(value, "value")
        with self._lock:
            self._values.append(checked)

    def values(self) -> list[float]:
        """A copy, oldest first, so callers never iterate a deque being appended to."""
        with self._lock:
            return list(self._values)

    def summary(self) -> Summary | None:
        """``None`` when empty: no measurement is different from a measurement of 0."""
        values = self.values()  # statistics run outside the lock: add() never waits on them
        if not values:
            return None
        return Summary(
            n=len(values),
            denoised=denoised_mean(values),
            median=median(values),
            mean=math.fsum(values) / len(values),
            last=values[-1],
        )


class _Link:
    __slots__ = ("bandwidth", "latency")

    def __init__(self, window: int) -> None:
        self.latency = SampleWindow(window)
        self.bandwidth = SampleWindow(window)


class LinkStats:
    """Per-site latency ("httpping") and crawl bandwidth as seen from this node.

    Latency is the time to the response headers -- Scrapy's ``download_latency`` meta --
    which the GNP paper (section 2.2.2) uses instead of ICMP ping: every live web site
    answers HTTP, many drop pings, and it is the delay the crawler actually pays.
    Bandwidth (the bandwidth paper's BC) is bytes over the whole download time.

    Written by a downloader middleware on the reactor thread and read by a background
    thread publishing to Redis, hence the locks.  ``max_sites`` bounds memory on broad
    crawls by forgetting the site recorded least recently; ``None`` keeps every site.
    """

    def __init__(self, window: int = 64, *, max_sites: int | None = None) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if max_sites is not None and (
            isinstance(max_sites, bool) or not isinstance(max_sites, int) or max_sites < 1
        ):
            raise ValueError(f"max_sites must be None or an integer >= 1, got {max_sites!r}")
        self._window = window
        self._max_sites = max_sites
        self._links: OrderedDict[str, _Link] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, site: str, latency_s: float, nbytes: int, elapsed_s: float) -> None:
        """Record one response: latency always, bandwidth only when it is measurable.

        A bandwidth sample needs bytes and time: an empty body or a zero duration (a cached
        or instantaneous response) carries no information about the link, so it is skipped
        rather than recorded as 0 or infinity.  Everything is validated before anything is
        stored, so a bad call leaves the statistics untouched.

        :param latency_s: seconds to the response headers (``download_latency``).
        :param nbytes: size of the whole response.
        :param elapsed_s: seconds the whole download took.
        :raises ValueError: empty site, negative / NaN / infinite values.
        """
        if not isinstance(site, str) or not site:
            raise ValueError(f"site must be a non-empty string, got {site!r}")
        latency = _check_sample(latency_s, "latency_s")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
        elapsed = _check_sample(elapsed_s, "elapsed_s")
        with self._lock:
            link = self._links.get(site)
            if link is None:
                link = self._links[site] = _Link(self._window)
                if self._max_sites is not None and len(self._links) > self._max_sites:
                    self._links.popitem(last=False)
            else:
                self._links.move_to_end(site)
        link.latency.add(latency)
        if nbytes > 0 and elapsed > 0:
            link.bandwidth.add(nbytes / elapsed)

    def _link(self, site: str) -> _Link | None:
        with self._lock:
            return self._links.get(site)

    def sites(self) -> list[str]:
        """Sites with at least one sample, least recently recorded first."""
        with self._lock:
            return list(self._links)

    def latency(self, site: str) -> Summary | None:
        """Latency summary in seconds, ``None`` for a site never recorded."""
        link = self._link(site)
        return None if link is None else link.latency.summary()

    def bandwidth(self, site: str) -> Summary | None:
        """Bandwidth summary in bytes/s, ``None`` when no response was measurable."""
        link = self._link(site)
        return None if link is None else link.bandwidth.summary()

    def samples(self, site: str) -> int:
        """Latency samples in the window (how much evidence the summary rests on); 0 if none."""
        link = self._link(site)
        return 0 if link is None else len(link.latency)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Everything, JSON-ready, for publishing.

        ``{site: {"rtt_ms", "rtt_median_ms", "bw_Bps", "n"}}``: milliseconds because that
        is how latencies are read and compared; ``bw_Bps`` is 0.0 when no response was
        measurable, so consumers need no special case; ``n`` is the number of latency
        samples.
        """
        with self._lock:
            links = list(self._links.items())
        out: dict[str, dict[str, float]] = {}
        for site, link in links:
            lat = link.latency.summary()
            if lat is None:  # pragma: no cover - record() always adds a latency
                continue
            bw = link.bandwidth.summary()
            out[site] = {
                "rtt_ms": lat.denoised * 1000.0,
                "rtt_median_ms": lat.median * 1000.0,
                "bw_Bps": 0.0 if bw is None else bw.denoised,
                "n": lat.n,
            }
        return out


def storage_bandwidth(
    write: Callable[[bytes], object],
    size: int = 100_000,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The bandwidth paper's BS: bytes/s this node achieves writing to its storage.

    Writes one standard ``size``-byte object (100 KB in the paper) ``repeats`` times (3 in
    the paper) and divides ``size`` by the *median* write duration.  The median rather
    than the paper's total-bytes-over-total-time (a mean): the first write often pays
    connection setup or a cold cache and any write can hit a GC pause, and with three
    writes one such hiccup would dominate a mean but is simply outvoted by the median.

    The payload is pseudo-random but fixed: incompressible, so compressing or
    deduplicating storage cannot flatter the figure, and identical on every node, so
    nodes are compared on the same object.

    :param write: stores one object; called ``repeats`` times. Its exceptions propagate:
        whether a failing store means "no bandwidth" or "retry later" is the caller's call.
    :param clock: seconds, monotonic; injectable for deterministic tests.
    :raises ValueError: ``size`` or ``repeats`` < 1, or a clock that did not advance.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    payload = random.Random(0x42535F).randbytes(size)
    durations: list[float] = []
    for _ in range(repeats):
        start = clock()
        write(payload)
        durations.append(clock() - start)
    if min(durations) < 0:
        raise ValueError("clock went backwards; use a monotonic clock")
    typical = median(durations)
    if typical <= 0:
        raise ValueError("clock did not advance during the writes; use a finer clock")
    return size / typical


class RateLimiter:
    """Token bucket for landmark probes.

    GNP keeps probes "few and rate-limited": probing a site costs the site a request and
    this node a download slot, so a burst of ``burst`` probes is allowed and after that
    one per ``1 / rate_per_s`` seconds.  Non-blocking on purpose: a caller on the reactor
    thread must never sleep, it just skips the probe.  The bucket starts full.
    """

    def __init__(
        self, rate_per_s: float, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be an integer >= 1, got {burst!r}")
        self._rate = float(rate_per_s)
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        """Take one token if there is one; never waits."""
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._last)  # a clock stepping back refills nothing
            self._last = now
            self._tokens = min(float(self._burst), self._tokens + elapsed * self._rate)
            # Tolerance: 0.3 - 0.2 is not quite 0.1, and a token owed must not be lost to it.
            if self._tokens >= 1.0 - 1e-9:
                self._tokens = max(0.0, self._tokens - 1.0)
                return True
            return False
