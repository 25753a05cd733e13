"""The operator's view of a JOBDIR's revisits (``scrapy banker status`` / ``explain --jobdir``).

A crawl with :setting:`BANKER_RECRAWL` and ``JOBDIR`` keeps every page's
revisit state in ``JOBDIR/banker/revisits.jsonl``
(:mod:`scrapy_banker.scheduler.revisit_log`).  This module reads it -- never
writes, never rebuilds a request -- into what an operator asks: how many
pages are tracked, how many are due now and how late, when the next one is
due, what the fetches found, and how fresh the copies are estimated to be
(each page's estimated change rate at its current interval,
:func:`~scrapy_banker.core.change_rate.freshness`; a page that has shown no
change counts as fresh).  :func:`describe` says one page's state in words:
"due in 3 h 12 min, unchanged 4 times".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.change_rate import freshness
from scrapy_banker.scheduler.revisit_log import read_states

if TYPE_CHECKING:
    from scrapy_banker.core.recrawl import UrlState

__all__ = ["RevisitsView", "describe", "duration", "read_revisits"]


@dataclass(frozen=True)
class RevisitsView:
    """The revisits a JOBDIR keeps, as of ``now``."""

    pages: int
    #: Pages due at ``now``, and how late the latest of them is (s).
    due_now: int
    most_overdue_s: float | None
    #: Seconds until the next page not yet due comes due (None: none).
    next_due_s: float | None
    changes: int
    unchanged: int
    failures: int
    #: Estimated share of pages whose copy is current (None: no page).
    freshness: float | None
    #: Lines of the file that did not read.
    malformed: int

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    def summary(self) -> str:
        if not self.pages:
            return "Revisits: none kept"
        due = f"{self.due_now} due now"
        if self.most_overdue_s:
            due += f" (the latest {duration(self.most_overdue_s)} late)"
        soon = "" if self.next_due_s is None else f", the next in {duration(self.next_due_s)}"
        fresh = "" if self.freshness is None else f"; estimated freshness {self.freshness:.2f}"
        return (
            f"Revisits: {self.pages} pages, {due}{soon}; fetches found {self.changes} changed, "
            f"{self.unchanged} unchanged, {self.failures} failed{fresh}"
        )


def read_revisits(jobdir: str, now: float) -> RevisitsView | None:
    """The revisits ``jobdir`` keeps (None: it keeps none, or has no revisits file)."""
    states, malformed = read_states(jobdir)
    if not states and not malformed:
        return None
    dues = [s.due for s in states.values()]
    late = [now - d for d in dues if d <= now]
    ahead = [d - now for d in dues if d > now]
    return RevisitsView(
        pages=len(states),
        due_now=len(late),
        most_overdue_s=max(late) if late else None,
        next_due_s=min(ahead) if ahead else None,
        changes=sum(s.changes for s in states.values()),
        unchanged=sum(s.unchanged for s in states.values()),
        failures=sum(s.failures for s in states.values()),
        freshness=(sum(_fresh(s) for s in states.values()) / len(states)) if states else None,
        malformed=malformed,
    )


def _fresh(state: UrlState) -> float:
    rate = state.rate.rate() if state.rate.changed > 0 else None
    if not rate or state.interval <= 0:
        return 1.0
    return freshness(rate, 1.0 / state.interval)


def describe(state: UrlState, now: float) -> str:
    """One page's revisit state in words: "due in 3 h 12 min, unchanged 4 times"."""
    when = (
        f"due in {duration(state.due - now)}"
        if state.due > now
        else f"due now ({duration(now - state.due)} late)"
    )
    parts = [when, f"every {duration(state.interval)}"]
    for count, what in ((state.unchanged, "unchanged"), (state.changes, "changed"),
                        (state.failures, "failed")):  # fmt: skip
        if count:
            parts.append(f"{what} {'once' if count == 1 else f'{count} times'}")
    return ", ".join(parts)


def duration(seconds: float) -> str:
    """``3 h 12 min``, ``4 min 5 s``, ``12 s``, ``0.4 s``: two units at most."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f} s"
    whole = round(s)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    units = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    first = next(i for i, (n, _) in enumerate(units) if n)
    return " ".join(f"{n} {u}" for n, u in units[first : first + 2] if n)
