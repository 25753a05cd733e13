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
        #: ``banker/topic/<topic>/<kind>`` -> count not yet added to the stats.
        self._topic_counts: dict[str, int] = {}
        self._flushed_at = 0.0
        #: (kind, where) -> Scrapy's two keys, (topic, kind) -> the topic's key:
        #: made once, not per request.
        self._keys: dict[tuple[str, str], tuple[str, str]] = {}
        self._topic_keys: dict[tuple[str, str], str] = {}
        # Bound once: each attribute read on Scrapy's StatsCollector goes
        # through its __getattribute__ (a deprecation shim), twice a request.
        self._inc = stats.inc_value

    def count(self, kind: str, where: str, topic: str, now: float) -> None:
        """``scheduler/<kind>`` and ``scheduler/<kind>/<where>``, as Scrapy counts them."""
        keys = self._keys.get((kind, where))
        if keys is None:
            keys = (f"scheduler/{kind}/{where}", f"scheduler/{kind}")
            self._keys[(kind, where)] = keys
        inc = self._inc
        inc(keys[0])
        inc(keys[1])
        name = self._topic_keys.get((topic, kind))
        if name is None:
            name = f"banker/topic/{topic}/{kind}"
            self._topic_keys[(topic, kind)] = name
        counts = self._topic_counts
        counts[name] = counts.get(name, 0) + 1
        if now - self._flushed_at >= self.flush_every_s:
            self.flush(now)

    def flush(self, now: float) -> None:
        self._flushed_at = now
        if self._topic_counts:
            counts, self._topic_counts = self._topic_counts, {}
            for name, n in counts.items():
                self._inc(name, n)
