"""What the benchmarks compare and how they report it (not a public API).

The peers -- the schedulers and reactors a benchmark runs side by side --
and the arithmetic and reporting every benchmark shares: ratios, Jain's
index, targets printed next to the measured figures, progress on stderr and
the one JSON line that ends stdout.  Keeping them here guarantees that every
benchmark names, configures and reports the peers the same way.  Imported
as a sibling (``import _common``) because the benchmarks run as scripts
(``python benchmarks/<name>.py``), which puts ``benchmarks/`` first on
``sys.path``; see ``_harness.py`` for how a benchmark runs.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

# -- the peers ---------------------------------------------------------------------------

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

#: The distributed peers: scrapy-redis's shared queue and dupefilter
#: (``SCHEDULER_PERSIST``: with ``False`` the first worker to close deletes
#: the shared queue under the others' feet) and scrapy-banker's partitioned,
#: leased frontier through the add-on.
SCRAPY_REDIS: dict[str, Any] = {
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    "SCHEDULER_PERSIST": True,
}
BANKER_REDIS: dict[str, Any] = {
    "SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler",
    "ADDONS": {"scrapy_banker.Addon": 500},
}

#: Twisted reactors, and the ``--reactor`` shorthands for them.
EPOLL = "twisted.internet.epollreactor.EPollReactor"
ASYNCIO = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
REACTORS: dict[str, str] = {"epoll": EPOLL, "asyncio": ASYNCIO}


def reactor(name: str) -> str:
    """A ``--reactor`` value as an import path (``epoll``, ``asyncio`` or a path as is)."""
    return REACTORS.get(name, name)


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

# -- arithmetic --------------------------------------------------------------------------


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


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN/inf: report them as ``null`` rather than emitting invalid JSON."""
    return value if math.isfinite(value) else None


def rounded(value: Any, digits: int = 4) -> float | None:
    """A figure for the JSON line: rounded, ``null`` when missing, NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(float(value), digits) if isinstance(value, float) else value


def round_floats(row: Mapping[str, Any], digits: int = 4) -> dict[str, Any]:
    """``row`` with every float rounded (:func:`rounded`), other values as they are."""
    return {k: rounded(v, digits) if isinstance(v, float) else v for k, v in row.items()}


# -- reporting ---------------------------------------------------------------------------


def target_line(label: str, value: float, target: float, unit: str = "x") -> str:
    """``label: 1.23x (target >= 2x: MISSED)`` -- targets are reported, never asserted."""
    verdict = "met" if value >= target else "MISSED"
    return f"{label}: {value:.3g}{unit} (target >= {target:g}{unit}: {verdict})"


def log(message: str) -> None:
    """Progress goes to stderr, so that stdout ends with the JSON line."""
    print(message, file=sys.stderr, flush=True)


def jsonable(value: Any) -> Any:
    """``value`` with every NaN/inf float, however deep, as ``None`` (JSON's ``null``)."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, Mapping):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def emit_json(result: Mapping[str, Any]) -> None:
    """Print ``result`` as the last stdout line, the contract the tests and CI parse.

    Keys are sorted; a figure that could not be measured (NaN) is ``null``.
    """
    sys.stdout.flush()
    print(json.dumps(jsonable(result), sort_keys=True, allow_nan=False), flush=True)
