"""When to fetch a page again: per-URL revisit state, the adaptive interval, the due index.

A crawl that keeps its copy fresh fetches each page again when it is *due*.
What is kept per URL (:class:`UrlState`) is small and JSON-shaped, because it
travels like a host's politeness state: in a JOBDIR, and in Redis on a fleet.
It holds the next due time and the interval it came from, what the last
fetch showed (a content :func:`signature`, the ``ETag`` and ``Last-Modified``
validators for a conditional request), counts of changed, unchanged and
failed fetches, and the page's change rate as estimated so far
(:class:`~scrapy_banker.core.change_rate.RateEstimate`).

:meth:`RecrawlPolicy.observe` turns one fetch into the next state.  Two
estimators are offered, because which keeps a crawl fresher is measured,
not assumed:

* ``adaptive`` -- the rule of StormCrawler's AdaptiveScheduler and
  Heritrix's WaitEvaluator: unchanged, the interval grows by ``grow``
  (x1.5); changed, it moves ``shrink`` (half) of the way down to the
  least interval.  Simple, and blind to how often a page really changes.
* ``poisson`` -- the interval of the freshness-optimal allocation
  (:func:`~scrapy_banker.core.change_rate.frequency_at`) for the page's
  estimated rate, at the multiplier ``mu`` the crawl's revisit budget sets
  (the adapter re-solves it from all estimates now and then); before a
  page has shown a change, or without ``mu``, the adaptive rule.

Either way the interval stays within ``[min_s, max_s]``, a failed fetch is
retried after ``error_s`` (not counted as a change or its absence), and the
next due time is counted from the fetch itself, so it is never in the past
(Nutch's adaptive schedule counted from the *previous due time*, and an
overdue page got a due time before "now", NUTCH-1564).  ``max_stale_s``
caps the wait before the next fetch, whatever the estimator, the rule or a
failing URL's retries say.

:class:`DueIndex` orders URLs by due time: "what is due now" costs a heap
pop per URL, not a scan of every URL known.

Pure: no Scrapy, Twisted, Redis or clock reads; callers pass ``now``.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import lxml.etree
import lxml.html
import mmh3

from scrapy_banker.core.change_rate import RateEstimate, frequency_at, optimal_mu
from scrapy_banker.core.json_fields import fields_from_json

__all__ = [
    "ESTIMATORS",
    "SIGNATURES",
    "TRUST_AFTER",
    "DueIndex",
    "LastmodTrust",
    "Outcome",
    "RecrawlPolicy",
    "RecrawlRule",
    "UrlState",
    "apply_lastmod",
    "outcome_of",
    "parse_lastmod",
    "plan_mu",
    "policy_for",
    "signature",
]

#: The interval estimators :class:`RecrawlPolicy` offers (``BANKER_RECRAWL_ESTIMATOR``).
ESTIMATORS = ("adaptive", "poisson")

#: What a content signature is taken over (``BANKER_RECRAWL_SIGNATURE``).
SIGNATURES = ("body", "text")

#: Elements whose text a reader never sees: a changed script is no changed page.
_INVISIBLE = ("script", "style", "noscript", "template")


def signature(body: bytes, mode: str = "body") -> str:
    """A content signature: 128-bit MurmurHash3 of the body, or of its visible text.

    ``"text"`` hashes the text a reader sees, whitespace collapsed: markup,
    scripts, styles and comments may change (a rotated ad slot, a session
    token in a script, a re-indented template) without the page counting as
    changed.  A body that is not HTML is hashed as text with its whitespace
    collapsed.
    """
    if mode == "body":
        data = body
    elif mode == "text":
        data = " ".join(_visible_text(body).split()).encode("utf-8")
    else:
        raise ValueError(f"signature mode must be one of {list(SIGNATURES)}, got {mode!r}")
    return f"{mmh3.hash128(data, signed=False):032x}"


def _visible_text(body: bytes) -> str:
    try:
        root = lxml.html.fromstring(body)
    except (lxml.etree.ParserError, ValueError):  # empty, or not a document
        return body.decode("utf-8", "replace")
    for element in list(root.iter(lxml.etree.Comment, *_INVISIBLE)):
        if element.getparent() is not None:  # drop_tree keeps the text after it
            element.drop_tree()
    return str(root.text_content())


class Outcome(enum.Enum):
    """What a fetch showed about its page."""

    CHANGED = "changed"
    UNCHANGED = "unchanged"
    FAILED = "failed"


def outcome_of(old_signature: str, new_signature: str | None, *, not_modified: bool) -> Outcome:
    """A fetch's outcome: a ``304`` or the same signature is no change.

    The first fetch of a page (no ``old_signature``) counts as a change:
    there was nothing current before it.
    """
    if not_modified:
        return Outcome.UNCHANGED
    if new_signature is None:
        raise ValueError("a fetch that is not a 304 needs the new signature")
    return (
        Outcome.UNCHANGED if old_signature and new_signature == old_signature else Outcome.CHANGED
    )


@dataclass(frozen=True)
class UrlState:
    """What the crawl keeps about one URL it revisits (times are wall clock, seconds)."""

    #: When the URL is next to be fetched.
    due: float = 0.0
    #: The interval ``due`` was counted with.
    interval: float = 0.0
    #: The last fetch, whatever its outcome; and the last one that succeeded.
    fetched: float = 0.0
    succeeded: float = 0.0
    #: The last fetch that found a change (the first fetch counts as one).
    changed_at: float = 0.0
    #: The content signature and validators of the last successful fetch.
    signature: str = ""
    etag: str = ""
    last_modified: str = ""
    changes: int = 0
    unchanged: int = 0
    failures: int = 0
    rate: RateEstimate = field(default_factory=RateEstimate)
    #: The ``lastmod`` a sitemap gave since the last successful fetch (0: none),
    #: which the next fetch checks (:class:`LastmodTrust`).
    claimed: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in vars(self).items():
            if key == "rate":
                if value != RateEstimate():
                    out[key] = value.to_json()
            elif value != getattr(_DEFAULT, key):
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UrlState:
        """Read what :meth:`to_json` wrote; ``ValueError`` naming a bad field."""
        out = fields_from_json(
            data, "URL state", vars(_DEFAULT), ints=_COUNTS, texts=_TEXT,
            nested={"rate": RateEstimate.from_json},
        )  # fmt: skip
        return cls(**out)

    def to_text(self) -> str:
        """:meth:`to_json` as compact JSON text (how a fleet keeps it in Redis)."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> UrlState:
        """Read what :meth:`to_text` wrote; ``ValueError`` if it does not read."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"URL state: expected an object, got {type(data).__name__}")
        return cls.from_json(data)


_DEFAULT = UrlState()
_TEXT = frozenset({"signature", "etag", "last_modified"})
_COUNTS = frozenset({"changes", "unchanged", "failures"})


@dataclass(frozen=True)
class RecrawlPolicy:
    """How one group of URLs is revisited (each value a ``BANKER_RECRAWL_*`` setting or rule)."""

    #: The first revisit after a page is first fetched, seconds.
    interval_s: float = 86_400.0
    #: The bounds of the adaptive interval.
    min_s: float = 3_600.0
    max_s: float = 14 * 86_400.0
    #: The wait before fetching again a URL whose fetch failed.
    error_s: float = 3_600.0
    #: The longest wait before a URL is fetched again, whatever else says (None: none).
    max_stale_s: float | None = None
    #: Unchanged: interval x grow.  Changed: moved ``shrink`` of the way to ``min_s``.
    grow: float = 1.5
    shrink: float = 0.5
    estimator: str = "adaptive"
    #: Each fetch weighs earlier ones in the rate estimate down by this (1: never).
    rate_decay: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.min_s <= self.max_s or not math.isfinite(self.max_s):
            raise ValueError(f"need 0 < min_s <= max_s < inf, got {self.min_s!r}, {self.max_s!r}")
        if not self.min_s <= self.interval_s <= self.max_s:
            raise ValueError(
                f"interval_s={self.interval_s!r} must lie in [min_s, max_s] = "
                f"[{self.min_s!r}, {self.max_s!r}]"
            )
        if not 0 < self.error_s < math.inf:
            raise ValueError(f"error_s must be a finite number > 0, got {self.error_s!r}")
        if self.max_stale_s is not None and not self.min_s <= self.max_stale_s < math.inf:
            raise ValueError(
                f"max_stale_s={self.max_stale_s!r} must be finite and >= min_s={self.min_s!r}"
            )
        if not self.grow > 1:
            raise ValueError(f"grow must be > 1, got {self.grow!r}")
        if not 0 < self.shrink <= 1:
            raise ValueError(f"shrink must be in (0, 1], got {self.shrink!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {self.estimator!r}")
        if not 0 < self.rate_decay <= 1:
            raise ValueError(f"rate_decay must be in (0, 1], got {self.rate_decay!r}")

    def first(self, now: float) -> UrlState:
        """The state of a URL seen for the first time: due at once."""
        return UrlState(due=now, interval=self.interval_s)

    def observe(
        self,
        state: UrlState,
        now: float,
        outcome: Outcome,
        *,
        signature: str | None = None,
        etag: str | None = None,
        last_modified: str | None = None,
        mu: float | None = None,
    ) -> UrlState:
        """The state after a fetch at ``now`` that showed ``outcome``.

        ``signature`` / ``etag`` / ``last_modified``: what the response
        carried (``None`` keeps the stored value: a ``304`` carries no body).
        ``mu``: the multiplier of the crawl's revisit budget, for the
        ``poisson`` estimator (None: not known yet).
        """
        if outcome is Outcome.FAILED:
            return replace(
                state, fetched=now, failures=state.failures + 1, due=self._due(now, self.error_s)
            )
        changed = outcome is Outcome.CHANGED
        rate = state.rate
        if state.succeeded > 0:
            rate = rate.observe(now - state.succeeded, changed, self.rate_decay)
            interval = self._interval(state.interval or self.interval_s, changed, rate, mu)
        else:  # the first fetch: no interval to learn from yet
            interval = self.interval_s
        next_state = replace(
            state,
            interval=interval,
            fetched=now,
            succeeded=now,
            changed_at=now if changed else state.changed_at,
            signature=state.signature if signature is None else signature,
            etag=state.etag if etag is None else etag,
            last_modified=state.last_modified if last_modified is None else last_modified,
            changes=state.changes + changed,
            unchanged=state.unchanged + (not changed),
            rate=rate,
            claimed=0.0,
        )
        return replace(next_state, due=self._due(now, interval))

    def _interval(
        self, interval: float, changed: bool, rate: RateEstimate, mu: float | None
    ) -> float:
        if self.estimator == "poisson" and mu is not None and rate.changed > 0:
            estimate = rate.rate()
            if estimate is not None and estimate > 0:
                frequency = frequency_at(estimate, mu)
                target = self.max_s if frequency <= 0 else 1.0 / frequency
                return min(max(target, self.min_s), self.max_s)
        if changed:
            interval -= (interval - self.min_s) * self.shrink
        else:
            interval *= self.grow
        return min(max(interval, self.min_s), self.max_s)

    def _due(self, now: float, interval: float) -> float:
        """``interval`` after the fetch at ``now``, and no later than ``max_stale_s`` after it."""
        if self.max_stale_s is not None:
            interval = min(interval, self.max_stale_s)
        return now + interval


@dataclass(frozen=True)
class RecrawlRule:
    """One ``BANKER_RECRAWL_RULES`` entry: which pages, and how they are revisited.

    A page matches when its URL matches ``url`` (a regular expression,
    searched) and its topic is ``topic``, each where given.  ``policy`` None:
    the page is never revisited.
    """

    policy: RecrawlPolicy | None
    url: re.Pattern[str] | None = None
    topic: str | None = None

    def matches(self, url: str, topic: str | None) -> bool:
        if self.url is not None and self.url.search(url) is None:
            return False
        return self.topic is None or self.topic == topic


def policy_for(
    rules: Sequence[RecrawlRule], default: RecrawlPolicy, url: str, topic: str | None
) -> RecrawlPolicy | None:
    """The policy of the first rule a page matches, else ``default`` (None: not revisited)."""
    for rule in rules:
        if rule.matches(url, topic):
            return rule.policy
    return default


def plan_mu(states: Iterable[UrlState], budget: float) -> float | None:
    """The multiplier at which the ``poisson`` estimator spends ``budget`` (revisits per
    second) on one host's pages, or None when there is nothing to plan.

    Pages that have shown a change are planned by their estimated rate
    (:func:`~scrapy_banker.core.change_rate.optimal_mu`); the others follow
    the adaptive rule, and what their intervals spend comes off the budget
    first.
    """
    rates: list[float] = []
    fixed = 0.0
    for state in states:
        rate = state.rate.rate() if state.rate.changed > 0 else None
        if rate:
            rates.append(rate)
        elif state.interval > 0:
            fixed += 1.0 / state.interval
    left = budget - fixed
    if not rates or left <= 0:
        return None
    return optimal_mu(rates, left)


#: Claims of a host's sitemap ``lastmod`` that must prove right before it moves due times.
TRUST_AFTER = 2


class LastmodTrust:
    """Whether a host's sitemap ``lastmod`` may move its pages' due times.

    A sitemap's ``lastmod`` says when a page last changed; many are wrong (a
    build time, the time the sitemap was generated).  Each claim is checked
    by the page's next fetch: a claim of a change since the last copy is
    right if the fetch finds the page changed, a claim of none if it finds
    it unchanged.  A host is trusted once :data:`TRUST_AFTER` claims proved
    right and while at most one in ten checked was wrong.
    """

    def __init__(self) -> None:
        self.right: dict[str, int] = {}
        self.wrong: dict[str, int] = {}

    def check(self, host: str, claimed_change: bool, changed: bool) -> None:
        """A fetch of one of ``host``'s pages checked a claim."""
        book = self.right if claimed_change == changed else self.wrong
        book[host] = book.get(host, 0) + 1

    def trusted(self, host: str) -> bool:
        right, wrong = self.right.get(host, 0), self.wrong.get(host, 0)
        return right >= TRUST_AFTER and 10 * wrong <= right

    def check_fetch(self, host: str, before: UrlState, outcome: Outcome) -> None:
        """A fetch that showed ``outcome`` checks the claim ``before`` held, if any."""
        if before.claimed > 0 and outcome is not Outcome.FAILED:
            self.check(host, before.claimed > before.succeeded, outcome is Outcome.CHANGED)


def parse_lastmod(text: str) -> float | None:
    """A sitemap ``lastmod`` (W3C datetime: ``2024``, ``2024-05``, ``2024-05-01``,
    ``2024-05-01T10:00Z``, ``2024-05-01T10:00:00.5+02:00``) as a POSIX time; a
    time without a zone is taken as UTC; ``None`` if it is none of these."""
    text = text.strip()
    if len(text) == 4 and text.isdigit():
        text += "-01-01"
    elif len(text) == 7 and text[4] == "-":
        text += "-01"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def apply_lastmod(state: UrlState, lastmod: float, now: float, trusted: bool) -> UrlState:
    """``state`` after a sitemap gave its page ``lastmod``.

    The claim is kept for the next fetch to check; a trusted claim of a
    change since the last copy makes the page due now.
    """
    out = replace(state, claimed=lastmod)
    if trusted and lastmod > state.succeeded and state.due > now:
        out = replace(out, due=now)
    return out


class DueIndex:
    """URLs by due time: the next due, and every URL due by a time, in heap pops.

    Rescheduling a URL leaves its old heap entry behind; it is skipped when it
    surfaces (its due time no longer matches), which keeps each operation a
    heap push or pop.  Compacted when the stale entries outnumber the live.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._due: dict[str, float] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def due_of(self, key: str) -> float | None:
        return self._due.get(key)

    def schedule(self, key: str, due: float) -> None:
        """``key`` is due at ``due`` (replacing any earlier schedule)."""
        if not math.isfinite(due):
            raise ValueError(f"due must be a finite time, got {due!r}")
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        if len(self._heap) > 2 * len(self._due) + 64:
            self._compact()

    def remove(self, key: str) -> bool:
        """Forget ``key``; whether it was scheduled."""
        return self._due.pop(key, None) is not None

    def next_due(self) -> float | None:
        """The earliest due time, or ``None`` when nothing is scheduled."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[str]:
        """The URLs due at or before ``now``, earliest first (at most ``limit``), unscheduled."""
        out: list[str] = []
        while limit is None or len(out) < limit:
            self._skip_stale()
            if not self._heap or self._heap[0][0] > now:
                break
            _, _, key = heapq.heappop(self._heap)
            del self._due[key]
            out.append(key)
        return out

    def items(self) -> Iterator[tuple[str, float]]:
        """Every scheduled URL and its due time, in no order."""
        return iter(self._due.items())

    def _skip_stale(self) -> None:
        heap, due = self._heap, self._due
        while heap and due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)

    def _compact(self) -> None:
        self._heap = [(d, next(self._seq), k) for k, d in self._due.items()]
        heapq.heapify(self._heap)
