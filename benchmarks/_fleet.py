"""Fleets of crawler processes against one web farm and one redis-server (not a public API).

``distributed.py``, ``placement.py`` and ``chaos.py`` start N real worker
processes -- ``scrapy_banker.testing.fleet``, one ``CrawlerProcess`` each,
its log and final stats in a work folder, the extensions of ``_crawler.py``
on its import path -- against one farm and one Redis, watch the farm while
they crawl, and collect what the farm served and what each worker reported
(``real_sites.py``'s fleets, of ``_runner.py`` crawlers, share
:func:`fresh`).  The pieces:

* :func:`fresh` -- a clean start: Redis flushed, the farm's counters reset,
  the seeds pushed to a start-URL list when the spiders read one;
* :class:`Fleet` -- the workers of one crawl by name: :meth:`~Fleet.start`,
  :meth:`~Fleet.poll` (exit codes, the run's time limit), the fault hooks
  :meth:`~Fleet.kill` / :meth:`~Fleet.freeze` / :meth:`~Fleet.thaw`
  (a restart is a :meth:`~Fleet.start` under a new name),
  :meth:`~Fleet.stop_all`, :meth:`~Fleet.stats`, :meth:`~Fleet.report`
  (log tails of a run that went wrong);
* :class:`FarmWatch` -- the farm's request counter sampled over a run (first
  and last change, a per-second timeline, the busy span) and the most
  requests a host had in flight, hosts over a limit with when; polled by
  the caller or on a thread of its own;
* :func:`watch` -- poll several runs together until each is done;
* :func:`served` -- what the farm served: fetches per URL, lost pages,
  duplicates, the per-host maximum;
* :func:`merge_repeats` -- one run's details from several repetitions.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from _common import log

from scrapy_banker.testing.fleet import FleetWorker


def fresh(
    farm: Any,
    redis_url: str | None = None,
    start_urls_key: str | None = None,
    seeds: Sequence[str] | None = None,
) -> list[str]:
    """Flush Redis, reset the farm's counters, push the seeds to ``start_urls_key``; the seeds.

    ``seeds`` default to the farm's host roots; they are pushed as
    scrapy-redis reads them (JSON ``{"url": ...}``) when a key is given.
    """
    seeds = list(farm.start_urls() if seeds is None else seeds)
    if redis_url is not None:
        client = redis.Redis.from_url(redis_url)
        client.flushall()
        if start_urls_key:
            client.rpush(start_urls_key, *(json.dumps({"url": u}) for u in seeds))
        client.close()
    farm.reset()
    return seeds


class Fleet:
    """The worker processes of one crawl, by name, and how each ended.

    Times are ``clock()`` seconds (monotonic by default); ``timeout_s``
    bounds the run: :meth:`poll` kills what still runs after it.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        timeout_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.clock = clock
        self.t0 = clock()
        self.end = self.t0
        self.timed_out = False
        #: Every worker ever started, in start order.
        self.workers: dict[str, FleetWorker] = {}
        #: Exit codes of the workers that have exited (``None``: unknown).
        self.codes: dict[str, int | None] = {}

    def start(
        self,
        name: str,
        settings: Mapping[str, Any],
        *,
        spider: str = "farm",
        seeds: Sequence[str] = (),
    ) -> FleetWorker:
        """Start worker ``name`` (spider ``"farm"`` or ``"redis"``) with these settings."""
        spec = {"spider": spider, "seeds": list(seeds), "settings": dict(settings)}
        worker = FleetWorker(name, self.workdir, spec)
        self.workers[name] = worker
        return worker

    def running(self, name: str) -> bool:
        return self.workers[name].proc.poll() is None

    def all_exited(self) -> bool:
        return all(w.proc.poll() is not None for w in self.workers.values())

    def poll(self, now: float | None = None) -> bool:
        """Record exits; True once every worker has exited or the time limit killed them."""
        now = self.clock() if now is None else now
        for name, w in self.workers.items():
            if name not in self.codes and w.proc.poll() is not None:
                self.codes[name] = w.proc.returncode
        if len(self.codes) == len(self.workers):
            self.end = now
            return True
        if now - self.t0 > self.timeout_s:
            self.timed_out = True
            self.stop_all()
            self.end = now
            return True
        return False

    # -- faults --------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL: no clean-up of any kind, as in a crash or an OOM kill."""
        worker = self.workers[name]
        worker.kill()
        self.codes[name] = worker.proc.returncode

    def freeze(self, name: str) -> None:
        """SIGSTOP: the process stops where it is, its connections and leases held."""
        os.kill(self.workers[name].proc.pid, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        """SIGCONT, if it still runs."""
        if self.running(name):
            os.kill(self.workers[name].proc.pid, signal.SIGCONT)

    def stop_all(self) -> None:
        """Kill every worker still running (thawed first: a stopped process is killed too)."""
        for name, w in self.workers.items():
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.kill()
            self.codes.setdefault(name, w.proc.returncode)

    # -- results -------------------------------------------------------------------------

    def wait(self, timeout: float = 30.0) -> None:
        """Reap every worker (``RUSAGE_CHILDREN`` counts them from then on)."""
        for w in self.workers.values():
            w.wait(timeout)

    def stats(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Each worker's final stats (``{}`` for one that wrote none: killed, crashed)."""
        out = []
        for name in self.workers if names is None else names:
            try:
                out.append(self.workers[name].stats())
            except AssertionError:
                out.append({})
        return out

    def exit_codes(self, names: Iterable[str] | None = None) -> list[int | None]:
        return [self.codes.get(n) for n in (self.workers if names is None else names)]

    def log_tails(self, label: str, names: Iterable[str] | None = None) -> None:
        for name in self.workers if names is None else names:
            log(f"---- log tail of {label} worker {name} ----\n{self.workers[name].log_tail()}")

    def report(self, label: str, lost: int) -> None:
        """Say what went wrong, with every worker's log tail, if anything did."""
        codes = self.exit_codes()
        if lost or self.timed_out or any(c != 0 for c in codes):
            log(f"!! {label}: lost {lost}, exit codes {codes}"
                f"{', timed out' if self.timed_out else ''}")  # fmt: skip
            self.log_tails(label)


def sum_stat(stats: Iterable[Mapping[str, Any]], key: str, kind: type = int) -> Any:
    """``key`` summed over workers' stats (missing counts as 0)."""
    return sum(kind(s.get(key, 0)) for s in stats)


@dataclass
class FarmWatch:
    """The farm's counters, sampled: progress of the crawl and politeness.

    ``sample(now)`` reads ``farm.stats()`` at most every ``interval`` s.
    ``limit``: hosts that go over it are recorded in ``over`` (host -> (the
    sample that first saw it, the sample before, the most in flight then)).
    Farm errors are counted, not raised.
    """

    farm: Any
    t0: float
    interval: float = 0.0
    limit: int | None = None
    requests: int = 0
    #: (time, the farm's request counter) of every sample.
    samples: list[tuple[float, int]] = field(default_factory=list)
    first_t: float | None = None
    first_n: int = 0
    last_t: float = 0.0
    last_n: int = 0
    max_inflight: int = 0
    over: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    errors: int = 0
    _due: float = -math.inf
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.last_t = self.t0
        self._previous = self.t0

    def sample(self, now: float) -> bool:
        """Read the farm if a sample is due; whether one was taken."""
        if now < self._due:
            return False
        self._due = now + self.interval
        try:
            stats = self.farm.stats()
        except (OSError, RuntimeError, ValueError):
            self.errors += 1
            return False
        n = self.requests = int(stats["requests"])
        self.samples.append((now, n))
        if n and self.first_t is None:
            self.first_t, self.first_n = now, n
        if n != self.last_n:
            self.last_t, self.last_n = now, n
        for host, inflight in stats.get("max_inflight_per_host", {}).items():
            self.max_inflight = max(self.max_inflight, int(inflight))
            if self.limit is not None and inflight > self.limit and host not in self.over:
                self.over[host] = (now, self._previous, int(inflight))
        self._previous = now
        return True

    @property
    def busy_s(self) -> float:
        """From the first sample that saw a request to the last that saw the counter change."""
        return (self.last_t - self.first_t) if self.first_t is not None else 0.0

    @property
    def first_response_s(self) -> float:
        return self.first_t - self.t0 if self.first_t is not None else math.nan

    def tail_start(self, share: float) -> float:
        """When the counter first reached ``share`` of its last value."""
        return next((t for t, n in self.samples if n >= share * self.last_n), self.last_t)

    def timeline(self) -> list[int]:
        """The counter at the end of each second since ``t0``."""
        out: list[int] = []
        for t, n in self.samples:
            while self.t0 + len(out) <= t:
                out.append(n)
        return out

    def start_thread(self, clock: Callable[[], float] = time.time) -> None:
        """Sample every ``interval`` s on a thread of its own until :meth:`stop_thread`."""

        def run() -> None:
            while not self._stop.wait(self.interval):
                self._due = -math.inf
                self.sample(clock())

        self._thread = threading.Thread(target=run, name="farm-watch", daemon=True)
        self._thread.start()

    def stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def watch(polls: Sequence[Callable[[float], bool]], interval: float | Callable[[], float]) -> None:
    """Call every ``poll(now)`` until each has returned True, sleeping ``interval`` between."""
    active = list(polls)
    while active:
        now = time.monotonic()
        active = [poll for poll in active if not poll(now)]
        if active:
            time.sleep(interval() if callable(interval) else interval)


@dataclass
class Served:
    """What the farm served over a run, as its own bookkeeping says."""

    #: Fetches per URL, left-out URLs (probes) excluded.
    fetches: dict[str, int]
    #: Fetches of the left-out URLs.
    left_out: int
    #: Expected URLs never served, sorted.
    lost: list[str]
    #: Fetches beyond the first of a URL.
    duplicates: int
    #: The most requests one host ever had in flight.
    max_per_host: int
    #: The farm's request counter (everything it served).
    requests: int

    @property
    def pages(self) -> int:
        return sum(self.fetches.values())


def served(farm: Any, expected: set[str], leave_out: Callable[[str], bool] | None = None) -> Served:
    """The farm's per-URL counts against ``expected`` (``leave_out(url)``: not a page)."""
    stats = farm.stats(urls=True)
    fetches: dict[str, int] = stats["fetches"]
    left_out = 0
    if leave_out is not None:
        left_out = sum(c for u, c in fetches.items() if leave_out(u))
        fetches = {u: c for u, c in fetches.items() if not leave_out(u)}
    return Served(
        fetches=fetches,
        left_out=left_out,
        lost=sorted(expected - set(fetches)),
        duplicates=sum(c - 1 for c in fetches.values() if c > 1),
        max_per_host=max((int(n) for n in stats["max_inflight_per_host"].values()), default=0),
        requests=int(stats["requests"]),
    )


def merge_repeats(
    runs: Sequence[dict[str, Any]],
    median: Sequence[str] = (),
    worst: Sequence[str] = (),
    samples: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The first run's details, with the median of ``median`` keys (finite values) and the
    max of ``worst`` keys over all runs; ``samples`` maps a new key to the key whose
    value of every run it lists."""
    out = dict(runs[0])
    for key in median:
        values = [v for r in runs if isinstance(v := r[key], (int, float)) and math.isfinite(v)]
        out[key] = statistics.median(values) if values else math.nan
    for key in worst:
        out[key] = max(r[key] for r in runs)
    for new, key in (samples or {}).items():
        out[new] = [r[key] for r in runs]
    return out
