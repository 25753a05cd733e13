"""Long-pole pacing: when parsing is the bottleneck, keep the host that decides the end busy.

A crawl ends when both of its limits are spent: the CPU that parses pages,
and, for each host, its pages x latency / per-host concurrency (politeness).
On real sites -- 10 to 20 ms of parsing per page -- one crawler process is
often CPU-bound: responses wait for the reactor, so a host's slot is held
for its latency *plus* the time its response waits behind other hosts'
pages.  That wait costs nothing for a small host, which has time; for the
largest host (the long pole: most pages x latency) it stretches the crawl,
which then ends with the CPU idle while that host is still fetched at its
limit.

The pacer estimates, every ``refresh_s``:

* the time the rest of the crawl needs at best: pending requests x CPU per
  response (the process's CPU time over the responses received, smoothed),
  or, if longer, the pending requests x their hosts' latency over the
  downloader's ``CONCURRENT_REQUESTS`` (a crawl of many slow hosts is
  bound by its downloader, not its CPU: there every host with a few dozen
  pages would otherwise look like a long pole);
* each host's remaining politeness time: its pending requests x its latency
  (Scrapy's ``download_latency``, smoothed) / its concurrency, or x its
  interval where the host spaces its requests (Crawl-delay, a learned rate)
  and that is longer;
* whether the CPU is saturated: the process used at least ``saturation``
  (half) of a CPU since the last estimate, or the machine's CPUs were at
  least that busy (the process then waits for a core: workers of a fleet
  sharing a machine each get less than a CPU and are all behind);

and calls *critical* the hosts whose remaining politeness time is at least
``theta`` x the time the rest needs: hosts that will decide the end unless
they are served at their limit from now on.  While the CPU is saturated, a
critical host exists and the scraper already holds ``backlog`` or more
responses (more downloads would only wait), the scheduler dispatches only
critical hosts' requests; other hosts wait for the backlog to drain, which
keeps the reactor's queue short so the long pole's responses are read and
its slots refilled at once.  Nothing changes while the CPU keeps up, when
no host is critical, or when the downloader's concurrency, not the CPU, is
what the rest needs most time for: holding hosts back there only leaves
its places empty (on the 150-host push-back farm, 10.5-11 requests in flight
instead of 13.5-14 at 4-8 s).

Saturation is measured, not inferred from the scraper's backlog alone: a
crawl of many slow or rate-limited hosts keeps a few responses in the
scraper at all times with the CPU a third busy, and holding its ordinary
hosts there only delays the ones whose limits are not known yet.  Half a
CPU is the threshold: a discovery-heavy crawl on real sites runs its
first seconds at 0.6-1.0 of a CPU, the pushback farm at 0.3-0.45.

Pure: no Scrapy, Twisted or clock reads; the adapter passes times, CPU
seconds and the frontier's backlog in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Pacer", "PacerConfig"]


@dataclass(frozen=True)
class PacerConfig:
    """Constants of the pacer (``backlog`` is :setting:`BANKER_PACING_BACKLOG`)."""

    #: Responses in the scraper from which the CPU counts as saturated.
    backlog: int = 2
    #: A host is critical from ``theta`` x the CPU still to be spent.
    theta: float = 0.5
    #: Seconds between two estimates.
    refresh_s: float = 0.5
    #: Weight of a new latency sample in a host's smoothed latency.
    latency_alpha: float = 0.2
    #: Latency assumed for a host not measured yet.
    default_latency_s: float = 0.1
    #: Responses between two estimates of the CPU per response.
    cpu_window: int = 20
    #: Share of one CPU used since the last estimate from which the CPU counts as saturated.
    saturation: float = 0.5

    def __post_init__(self) -> None:
        if self.backlog < 1:
            raise ValueError(f"backlog must be >= 1, got {self.backlog!r}")
        if not self.theta > 0:
            raise ValueError(f"theta must be > 0, got {self.theta!r}")
        if not 0 < self.saturation <= 1:
            raise ValueError(f"saturation must be in (0, 1], got {self.saturation!r}")


def _unspaced(slot: str) -> float:
    return 0.0


class Pacer:
    """Which hosts are critical now, and whether to hold everything else back."""

    def __init__(self, config: PacerConfig | None = None) -> None:
        self.config = config or PacerConfig()
        self.latency: dict[str, float] = {}
        self.critical: frozenset[str] = frozenset()
        self.responses = 0
        #: Smoothed CPU seconds per response (None until measured).
        self.cpu_per_response: float | None = None
        self._cpu_mark: tuple[float, int] | None = None
        self._next_refresh = 0.0
        #: (time, CPU seconds) of the last estimate, for the CPU's share since.
        self._last: tuple[float, float] | None = None
        #: Share of one CPU the process used between the last two estimates.
        self.cpu_share = 0.0
        #: Share of the machine's CPUs busy between them (0 when not known).
        self.machine_busy = 0.0
        #: The last estimates, for telemetry: CPU still to spend, the longest pole.
        self.cpu_left_s = 0.0
        self.pole_s = 0.0
        #: Whether the CPU, rather than the downloader's concurrency, bounds the rest.
        self.cpu_bound = True

    def response(self, slot: str, latency_s: float | None) -> None:
        """A response (or an error) came back from ``slot`` after ``latency_s``."""
        self.responses += 1
        if latency_s is None or latency_s < 0:
            return
        old = self.latency.get(slot)
        alpha = self.config.latency_alpha
        self.latency[slot] = latency_s if old is None else old + alpha * (latency_s - old)

    def due(self, now: float) -> bool:
        return now >= self._next_refresh

    def refresh(
        self,
        now: float,
        cpu_s: float,
        backlog: Mapping[str, int],
        pending: int,
        concurrency: Callable[[str], int],
        interval: Callable[[str], float] | None = None,
        machine_busy: float | None = None,
        total_concurrency: int = 0,
    ) -> frozenset[str]:
        """Re-estimate; ``backlog``: requests queued per slot, ``pending``: all of them;
        ``interval``: the least seconds between two requests of a slot (0: none);
        ``machine_busy``: the share of the machine's CPUs busy since the last
        estimate (None: not known); ``total_concurrency``: the requests the
        downloader transfers at once (``CONCURRENT_REQUESTS``; 0: no limit).

        Returns the critical slots while the CPU is saturated, else nothing
        (what the downloader should favour now)."""
        cfg = self.config
        self._next_refresh = now + cfg.refresh_s
        last, self._last = self._last, (now, cpu_s)
        if last is not None and now > last[0]:
            self.cpu_share = (cpu_s - last[1]) / (now - last[0])
        self.machine_busy = machine_busy or 0.0
        self._measure_cpu(cpu_s)
        per = self.cpu_per_response
        if per is None or not backlog:
            self.critical = frozenset()
            return self.critical
        cpu_left = pending * per
        latency, default = self.latency, cfg.default_latency_s
        spacing = interval or _unspaced
        poles = {
            slot: n * max(latency.get(slot, default) / max(1, concurrency(slot)), spacing(slot))
            for slot, n in backlog.items()
        }
        self.cpu_bound = True
        if total_concurrency > 0:
            # The downloader's own limit: every pending request holds one of
            # its places for its host's latency, whatever the CPU does.
            wire_left = sum(n * latency.get(s, default) for s, n in backlog.items())
            wire_left /= total_concurrency
            self.cpu_bound = cpu_left >= wire_left
            cpu_left = max(cpu_left, wire_left)
        self.cpu_left_s = cpu_left
        self.pole_s = max(poles.values())
        floor = cfg.theta * cpu_left
        self.critical = frozenset(s for s, left in poles.items() if left >= floor)
        return self.critical if self.saturated else frozenset()

    @property
    def saturated(self) -> bool:
        """Was the process, or the machine, ``saturation`` busy or more since the last estimate?"""
        return max(self.cpu_share, self.machine_busy) >= self.config.saturation

    def _measure_cpu(self, cpu_s: float) -> None:
        mark = self._cpu_mark
        if mark is None:
            self._cpu_mark = (cpu_s, self.responses)
            return
        cpu0, n0 = mark
        n = self.responses - n0
        if n < self.config.cpu_window:
            return
        sample = (cpu_s - cpu0) / n
        old = self.cpu_per_response
        self.cpu_per_response = sample if old is None else (old + sample) / 2
        self._cpu_mark = (cpu_s, self.responses)

    def hold(self, scraper_backlog: int) -> bool:
        """Dispatch only critical hosts now?

        Only while the CPU, not the downloader's concurrency, is what the rest
        of the crawl waits on: holding ordinary hosts shortens the reactor's
        queue, but where the downloader is the bound it only leaves its places
        empty (critical hosts are still favoured: :attr:`critical`)."""
        return (
            bool(self.critical)
            and self.cpu_bound
            and self.saturated
            and scraper_backlog >= self.config.backlog
        )
