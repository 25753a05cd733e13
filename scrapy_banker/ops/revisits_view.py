"""The operator's view of a crawl's revisits (``scrapy banker status`` / ``explain``).

A crawl with :setting:`BANKER_RECRAWL` keeps every page's revisit state: with
``JOBDIR``, in ``JOBDIR/banker/revisits.jsonl``
(:mod:`scrapy_banker.scheduler.revisit_log`, read by :func:`read_revisits`);
on a fleet, in the pages' partitions in Redis
(:mod:`scrapy_banker.redis.frontier.revisit_states`, read by
:func:`scrapy_banker.ops.fleet_view.read_fleet_revisits`).  Both are summed
up here, by :func:`summarise` (a :class:`RevisitTally` fed one state at a
time), never writing, never rebuilding a request, into what an operator
asks: how many pages are tracked, how many are due now and how late, when
the next one is due, what the fetches found, and how fresh the copies are
estimated to be (each page's estimated change rate at its current interval,
:func:`~scrapy_banker.core.change_rate.freshness`; a page that has shown no
change counts as fresh).  :func:`describe` says one page's state in words:
"due in 3 h 12 min, unchanged 4 times".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.change_rate import freshness
from scrapy_banker.core.recrawl import UrlState

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "RevisitTally",
    "RevisitsView",
    "describe",
    "duration",
    "read_revisits",
    "summarise",
]


@dataclass(frozen=True)
class RevisitsView:
    """The revisits a crawl keeps (a JOBDIR's or a fleet's), as of ``now``."""

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
    #: States that did not read (a JOBDIR: lines of its file).
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


@dataclass
class RevisitTally:
    """Running sums over pages' states as of ``now``: a :class:`RevisitsView` when done.

    Fed one state at a time (:meth:`add`), so a fleet's states are summed as
    they stream out of Redis, never all held at once.
    """

    now: float
    malformed: int = 0
    pages: int = 0
    due_now: int = 0
    most_overdue_s: float | None = None
    next_due_s: float | None = None
    changes: int = 0
    unchanged: int = 0
    failures: int = 0
    fresh: float = 0.0

    def add(self, state: UrlState) -> None:
        self.pages += 1
        if state.due <= self.now:
            self.due_now += 1
            late = self.now - state.due
            if self.most_overdue_s is None or late > self.most_overdue_s:
                self.most_overdue_s = late
        else:
            ahead = state.due - self.now
            if self.next_due_s is None or ahead < self.next_due_s:
                self.next_due_s = ahead
        self.changes += state.changes
        self.unchanged += state.unchanged
        self.failures += state.failures
        self.fresh += _fresh(state)

    def view(self) -> RevisitsView | None:
        """What was added (None: no state, readable or not)."""
        if not self.pages and not self.malformed:
            return None
        return RevisitsView(
            pages=self.pages,
            due_now=self.due_now,
            most_overdue_s=self.most_overdue_s,
            next_due_s=self.next_due_s,
            changes=self.changes,
            unchanged=self.unchanged,
            failures=self.failures,
            freshness=(self.fresh / self.pages) if self.pages else None,
            malformed=self.malformed,
        )


def summarise(states: Iterable[UrlState], malformed: int, now: float) -> RevisitsView | None:
    """The view of ``states`` (and ``malformed`` ones that did not read) as of ``now``
    (None: neither)."""
    tally = RevisitTally(now, malformed=malformed)
    for state in states:
        tally.add(state)
    return tally.view()


def read_revisits(jobdir: str, now: float) -> RevisitsView | None:
    """The revisits ``jobdir`` keeps (None: it keeps none, or has no revisits file)."""
    # Imported here: the file's reader pulls in Scrapy, which a fleet's view does not need.
    from scrapy_banker.scheduler.revisit_log import read_states

    states, malformed = read_states(jobdir)
    return summarise(states.values(), malformed, now)


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
