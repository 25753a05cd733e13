"""Scrapy's ``scheduler/*`` counters, and their per-topic twins batched.

The stats collector is the dominant cost of an enqueue when every request
updates three keys, so the per-topic counters (``banker/topic/<t>/enqueued``,
``.../dequeued``) are added at most once a second and whenever the scheduler
has nothing to hand out; Scrapy's own keys stay exact at every moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

__all__ = ["SchedulerCounters"]


class SchedulerCounters:
    def __init__(self, stats: StatsCollector, flush_every_s: float = 1.0) -> None:
        self.stats = stats
        self.flush_every_s = flush_every_s
        self._topic_counts: dict[str, int] = {}
        self._flushed_at = 0.0

    def count(self, kind: str, where: str, topic: str, now: float) -> None:
        """``scheduler/<kind>`` and ``scheduler/<kind>/<where>``, as Scrapy counts them."""
        stats = self.stats
        stats.inc_value(f"scheduler/{kind}/{where}")
        stats.inc_value(f"scheduler/{kind}")
        name = f"banker/topic/{topic}/{kind}"
        counts = self._topic_counts
        counts[name] = counts.get(name, 0) + 1
        if now - self._flushed_at >= self.flush_every_s:
            self.flush(now)

    def flush(self, now: float) -> None:
        self._flushed_at = now
        if self._topic_counts:
            counts, self._topic_counts = self._topic_counts, {}
            for name, n in counts.items():
                self.stats.inc_value(name, n)
