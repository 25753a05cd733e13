"""Helpers shared by the scheduler benchmarks (not a public API).

Both benchmarks compare the same three schedulers, print the issue's targets
next to the measured ratios and end with one JSON line; keeping those pieces
here guarantees the two scripts name, configure and report the peers the same
way.  The module is imported as a sibling (``import _common``) because the
benchmarks are run as scripts (``python benchmarks/<name>.py``), which puts
``benchmarks/`` first on ``sys.path``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

#: Scheduler name -> the settings that select it.  The banker run sets only
#: ``SCHEDULER``: which internal queues BankerScheduler uses is its own
#: business (today it inherits Scrapy's default, DownloaderAwarePriorityQueue),
#: and the benchmarks must keep working when those internals change.
SCHEDULERS: dict[str, dict[str, str]] = {
    "banker": {"SCHEDULER": "scrapy_banker.scheduler.BankerScheduler"},
    "scrapy_pq": {
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
    },
    "dapq": {
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
    },
}

#: Topics of the web farm's paths (``/news/3.html`` ...), all of equal
#: priority so that a fair scheduler should give each the same share.
TOPICS: tuple[str, ...] = ("news", "archive", "products")

#: Topic settings given to *every* scheduler: the peers ignore them, but the
#: add-on's middlewares use them to count ``banker/topic/<t>/responses`` for
#: all three runs, which is what makes the fairness figures comparable.
TOPIC_SETTINGS: dict[str, Any] = {
    "BANKER_TOPICS": dict.fromkeys(TOPICS, 0),
    "BANKER_TOPIC_RULES": [{"url": f"/{t}/", "topic": t} for t in TOPICS],
}

#: Scrapy's default dupefilter, named explicitly so every scheduler pays the
#: same fingerprinting cost whatever a project or add-on might configure.
DUPEFILTER: dict[str, str] = {"DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter"}


def jain_index(shares: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 = equal, 1/n = one takes all.

    Returns ``nan`` when nothing was shared (all zero), because "fair" and
    "unfair" are both meaningless then.
    """
    n = len(shares)
    square_sum = sum(x * x for x in shares)
    if n == 0 or square_sum == 0:
        return math.nan
    return sum(shares) ** 2 / (n * square_sum)


def ratio(a: float, b: float) -> float:
    """``a / b``, ``nan`` when ``b`` is zero (a peer that did nothing)."""
    return a / b if b else math.nan


def target_line(label: str, value: float, target: float, unit: str = "x") -> str:
    """``label: 1.23x (target >= 2x: MISSED)`` -- targets are reported, never asserted."""
    verdict = "met" if value >= target else "MISSED"
    return f"{label}: {value:.3g}{unit} (target >= {target:g}{unit}: {verdict})"


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN/inf: report them as ``null`` rather than emitting invalid JSON."""
    return value if math.isfinite(value) else None


def emit_json(result: Mapping[str, Any]) -> None:
    """Print ``result`` as the last stdout line, the contract the tests and CI parse."""
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True, allow_nan=False), flush=True)
