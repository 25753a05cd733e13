"""Pages per second per topic, from successive readings of cumulative counters.

Each fleet node publishes how many pages it fetched per topic *since it
started*; nobody publishes a rate.  The dashboard reads the fleet once per
refresh interval and keeps the last few minutes of readings here, so a rate
is a difference of two readings of the same counters, over a window long
enough (a few seconds) that the nodes' own publishing interval does not
make it jitter between zero and twice the truth.

The counters are made monotone per (node, topic) before they are summed: a
node that leaves keeps its last count (the fleet did fetch those pages), and
a node that restarts under the same name, whose count starts again from
zero, adds to what it had instead of making the fleet's total go backwards.

Pure: no Twisted, no Redis; the clock is the caller's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RateHistory"]

#: Key of the all-topics series in :meth:`RateHistory.to_json`.
ALL = "*"


@dataclass
class _Counter:
    """One (node, topic) counter made monotone across restarts of the node."""

    last: int = 0
    offset: int = 0

    def update(self, value: int) -> int:
        if value < self.last:  # the node restarted: its count began again at 0
            self.offset += self.last
        self.last = value
        return self.offset + value


class RateHistory:
    """A ring of (time, cumulative pages per topic) readings and the rates between them.

    ``span_s`` is how much history is kept (10 minutes by default: what fits
    on the chart at one point per refresh); ``window_s`` is the interval a
    rate is averaged over.
    """

    def __init__(self, span_s: float = 600.0, window_s: float = 5.0) -> None:
        if span_s <= 0 or window_s <= 0:
            raise ValueError(f"span_s and window_s must be > 0, got {span_s!r}, {window_s!r}")
        self.span_s = span_s
        self.window_s = window_s
        self._counters: dict[tuple[str, str], _Counter] = {}
        # (t, cumulative pages per topic, all topics under ALL)
        self._readings: deque[tuple[float, dict[str, int]]] = deque()
        # (t, pages/s per topic, all topics under ALL)
        self._rates: deque[tuple[float, dict[str, float]]] = deque()

    def observe(self, t: float, pages: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
        """Record ``pages[node][topic]`` (cumulative) read at ``t``; returns the rates now.

        A reading no later than the previous one is ignored (a clock that
        stepped back): rates over a negative interval mean nothing.
        """
        if self._readings and t <= self._readings[-1][0]:
            return dict(self._rates[-1][1]) if self._rates else {}
        for node, topics in pages.items():
            for topic, value in topics.items():
                counter = self._counters.setdefault((node, topic), _Counter())
                counter.update(max(0, int(value)))
        totals: dict[str, int] = {}
        for (_node, topic), counter in self._counters.items():
            value = counter.offset + counter.last
            totals[topic] = totals.get(topic, 0) + value
            totals[ALL] = totals.get(ALL, 0) + value
        self._readings.append((t, totals))
        # The reading the rate is taken against: the newest at least a
        # window old, else the oldest there is (the first seconds).
        base_t, base = self._readings[0]
        for rt, rv in reversed(self._readings):
            if t - rt >= self.window_s:
                base_t, base = rt, rv
                break
        rates: dict[str, float] = {}
        if t > base_t:
            for topic, value in totals.items():
                rates[topic] = max(0.0, (value - base.get(topic, 0)) / (t - base_t))
        else:
            rates = {topic: 0.0 for topic in totals}
        self._rates.append((t, rates))
        horizon = t - self.span_s
        # Keep one reading older than a window for the next rate.
        while len(self._readings) > 2 and self._readings[1][0] < horizon - self.window_s:
            self._readings.popleft()
        while self._rates and self._rates[0][0] < horizon:
            self._rates.popleft()
        return rates

    def to_json(self) -> dict[str, Any]:
        """Column form for the page: ``{"t": [...], "series": {topic: [...]}}``.

        Every series has one value per time (0.0 before a topic first
        appeared), all topics together under ``"*"``; times are Unix seconds.
        """
        topics = sorted({topic for _t, rates in self._rates for topic in rates})
        return {
            "window_s": self.window_s,
            "t": [round(t, 3) for t, _rates in self._rates],
            "series": {
                topic: [round(rates.get(topic, 0.0), 3) for _t, rates in self._rates]
                for topic in topics
            },
        }
