"""Per-host politeness a server asks for: Retry-After, backoff on refusals, Crawl-delay.

A server that answers ``429 Too Many Requests`` or ``503 Service
Unavailable`` is asking the crawler to slow down; ``Retry-After`` says until
when, and robots.txt's ``Crawl-delay`` says how far apart requests must be.
Scrapy's ``RetryMiddleware`` retries such a request at once, from whichever
process holds it; this module is what scrapy-banker keeps instead, per host:

* ``blocked_until`` -- no request to the host before then.  Set from
  ``Retry-After`` (seconds or an HTTP date), or, for a refusal without it,
  from an adaptive backoff: ``base x 2**(refusals-1)``, capped, with
  +/- ``jitter`` so that hosts blocked together do not all wake together.
  Each success after a refusal halves the refusal count (the backoff decays
  instead of dropping at once: a server that refused under load is likely
  to refuse again if it is hit at full rate straight away).
* ``interval`` -- the least time between two requests to the host: the
  larger of its Crawl-delay (capped) and of the adaptive delay a throttle
  (AutoThrottle) settled on.  ``last_sent`` + ``interval`` is the next time
  a request may leave.
* ``refusals`` -- consecutive refusals; past ``max_refusals`` the host is
  reported as refusing and its requests go to the dead letters (requeueable)
  instead of waiting forever.

State is a small value type that serialises to JSON, so it travels: in a
JOBDIR snapshot on one node, and with the host's partition in Redis on a
fleet, where a new owner continues where the old one stopped.  Times are
wall-clock seconds (``time.time()``): they must mean the same thing in
another process on another machine.

Pure: no Scrapy, Twisted, Redis or clock reads; callers pass ``now``.
"""

from __future__ import annotations

import email.utils
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from scrapy_banker.core.json_fields import fields_from_json

__all__ = [
    "FLOOR_DECAY",
    "RATE_ANSWERS",
    "RATE_DECAY",
    "RATE_MARGIN",
    "RATE_SLACK",
    "RATE_WINDOW_S",
    "HostState",
    "Politeness",
    "PolitenessConfig",
    "parse_retry_after",
]


@dataclass(frozen=True)
class PolitenessConfig:
    """The constants (each is a ``BANKER_*`` setting; see ``docs/settings.rst``)."""

    #: HTTP statuses that mean "slow down" (``BANKER_PUSHBACK_CODES``).
    codes: frozenset[int] = frozenset({429, 503})
    #: First backoff after a refusal without ``Retry-After``, seconds.
    backoff_base_s: float = 2.0
    #: Longest backoff, and the longest ``Retry-After`` honoured as such.
    backoff_max_s: float = 600.0
    #: Relative spread of a backoff (0.25: +/- 25 %).
    jitter: float = 0.25
    #: Consecutive refusals after which the host's requests are dead-lettered.
    max_refusals: int = 20
    #: Longest robots.txt Crawl-delay applied.
    crawl_delay_max_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.codes or any(not 100 <= c <= 599 for c in self.codes):
            raise ValueError(f"codes must be HTTP statuses, got {sorted(self.codes)!r}")
        if not 0 < self.backoff_base_s <= self.backoff_max_s:
            raise ValueError("need 0 < backoff_base_s <= backoff_max_s")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")
        if self.max_refusals < 1:
            raise ValueError(f"max_refusals must be >= 1, got {self.max_refusals!r}")
        if self.crawl_delay_max_s < 0:
            raise ValueError("crawl_delay_max_s must be >= 0")


@dataclass(frozen=True)
class HostState:
    """What the crawl keeps about one host's requests to slow down (all times wall clock)."""

    blocked_until: float = 0.0
    refusals: int = 0
    #: robots.txt Crawl-delay (already capped), seconds; 0 when none.
    crawl_delay: float = 0.0
    #: Delay a throttle settled on for the host (AutoThrottle's slot delay), seconds.
    throttle_delay: float = 0.0
    last_sent: float = 0.0
    #: The host's rate as its 429s showed it: least seconds between two requests.
    learned_interval: float = 0.0
    #: Answers served since the host's last refusal, and when the first of them came.
    served: int = 0
    served_since: float = 0.0
    #: The spacing the host last refused a 429 at (0: none): too fast, so the
    #: learned interval does not shrink below it again (see ``RATE_MARGIN``).
    refused_interval: float = 0.0

    @property
    def interval(self) -> float:
        """Least time between two requests to the host."""
        return max(self.crawl_delay, self.throttle_delay, self.learned_interval)

    def ready_at(self) -> float:
        """When the next request to the host may leave."""
        interval = self.interval
        return max(self.blocked_until, self.last_sent + interval if interval else 0.0)

    @property
    def idle(self) -> bool:
        """Nothing worth keeping: the default state."""
        return self == _DEFAULT

    def merged(self, other: HostState) -> HostState:
        """The stricter of two views of one host, field by field (the larger of each).

        A node taking a host over merges what Redis kept with what it knows
        itself: its own refusal may be newer than the state it reads (its
        write still queued), and the other node's newer than its own.  The
        larger block, last request, delay and refusal count are each safe to
        keep; a stale one costs at most one longer wait.
        """
        mine, theirs = vars(self), vars(other)
        return HostState(**{k: max(v, theirs[k]) for k, v in mine.items()})

    def to_json(self) -> dict[str, float | int]:
        return {k: v for k, v in vars(self).items() if v != getattr(_DEFAULT, k)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostState:
        """Inverse of :meth:`to_json`; ``ValueError`` names what is wrong."""
        out = fields_from_json(data, "host state", vars(_DEFAULT), ints=("refusals", "served"))
        return cls(**out)


_DEFAULT = HostState()

#: Each answer served shrinks a learned interval by this factor (see
#: :meth:`Politeness.succeeded`): ~14 answers halve it.
RATE_DECAY = 0.95

#: A learned interval stays this much above the spacing the host last
#: refused at; that floor itself shrinks by :data:`FLOOR_DECAY` per answer,
#: so a host that raises its limit is found out, slowly.
RATE_MARGIN = 1.1
FLOOR_DECAY = 0.9995

#: The fastest a 429's estimate of a host's interval is taken to be wrong by:
#: the learned interval never shrinks below this share of it.
RATE_SLACK = 0.85

#: Each host's last answers are remembered, at most this many, none older
#: than :data:`RATE_WINDOW_S`: what a 429 measures the host's rate with.
RATE_ANSWERS = 16
RATE_WINDOW_S = 60.0


def _rate_interval(answers: tuple[float, ...], until: float) -> float:
    """A host's least interval as a 429 shows it, from the times of its last ``answers``.

    A host allowing ``r`` requests per ``w`` seconds refuses once ``r`` were
    answered within ``w``, until the first of them leaves the window: the
    ``r`` answers before a refusal blocked ``until`` span ``w``.  Not knowing
    ``r``, each count ``k`` of latest answers gives ``(until - t_k) / k``;
    the least of them is the fastest rate every window seen allowed.  Older
    answers, spread by the crawl's own waits, only give slower rates.
    """
    n = len(answers)
    return min((until - answers[n - k]) / k for k in range(1, n + 1))


def parse_retry_after(value: str | bytes | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), or None.

    None for a missing or unreadable header; a date in the past gives 0.
    """
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT; a bare one is read as such
        return None
    return max(0.0, when.timestamp() - now)


class Politeness:
    """The per-host states of one crawl (or of the hosts one worker owns)."""

    def __init__(
        self, config: PolitenessConfig | None = None, rng: random.Random | None = None
    ) -> None:
        self.config = config or PolitenessConfig()
        #: Host -> state, idle hosts absent.  Mutated in place, never replaced: a
        #: caller may keep a reference to it for a cheap "any state here?" test.
        self.hosts: dict[str, HostState] = {}
        self._rng = rng or random.Random()
        #: Hosts whose state changed since :meth:`take_changed` (to persist or publish).
        self._changed: set[str] = set()
        #: Hosts whose last request sent moved since :meth:`take_sent` (a fleet
        #: publishes it with the host; not a change to persist by itself).
        self._sent: set[str] = set()
        #: Host -> the times of its last answers (:data:`RATE_ANSWERS`, within
        #: :data:`RATE_WINDOW_S`), so that a host's *first* 429 already tells
        #: its rate.  Local to this process (not in the states that travel),
        #: and swept of quiet hosts once per window.
        self._answers: dict[str, tuple[float, ...]] = {}
        self._sweep_at = 0.0

    def get(self, host: str) -> HostState:
        return self.hosts.get(host, _DEFAULT)

    def put(self, host: str, state: HostState) -> None:
        """Adopt a state (restored from a JOBDIR, or from Redis by a new owner)."""
        if state.idle:
            self.hosts.pop(host, None)
        else:
            self.hosts[host] = state

    def _set(self, host: str, state: HostState) -> HostState:
        self.put(host, state)
        self._changed.add(host)
        return state

    def ready_at(self, host: str) -> float:
        state = self.hosts.get(host)
        return 0.0 if state is None else state.ready_at()

    def refused(
        self,
        host: str,
        now: float,
        retry_after_s: float | None,
        *,
        coalesce: bool = False,
        rate: bool = False,
    ) -> HostState:
        """The host answered with a pushback status; ``retry_after_s`` from its header.

        ``coalesce=True``: a refusal that arrives while the host is still
        blocked -- the answer to a request that was already in flight when
        the block began -- does not count as one more refusal, so a host
        refusing ``N`` parallel requests at once backs off once, not ``N``
        times; only its ``Retry-After``, if longer, extends the block.  A
        crawler that holds a blocked host's requests (as the scheduler does)
        passes it; without it every refusal counts.

        ``rate=True`` (a ``429 Too Many Requests``): the host limits a rate,
        and the refusal says which.  Its last answers (:data:`RATE_ANSWERS`
        within :data:`RATE_WINDOW_S`, see :func:`_rate_interval`) and the end
        of this block are its rate: ``learned_interval`` becomes the least
        interval they allow (capped by ``backoff_max_s``), and the host's
        requests are spaced by it from then on -- its first 429 teaches the
        crawl not to be refused again at that rate, rather than one 429 per
        window.  A state adopted from another process, without those answers,
        uses the count it carries (answers since its previous refusal).  A
        ``503`` teaches nothing (the host is down for a while, not rationed).

        A ``429`` without ``Retry-After`` ends at a blind backoff, so its
        estimate errs slow by an unknown amount: the interval may shrink back
        (:meth:`succeeded`) to just above the spacing its answers were refused
        at.  Refused again while spaced by that rate, after answers served,
        is a near miss: the host is held one new interval (a sliding window
        frees within about one spacing), not a blind backoff, and
        :data:`RATE_MARGIN` x its spacing becomes the floor -- the rate is
        searched up from below, a refusal or two more per host rather than a
        rate too slow for the rest of the crawl.
        """
        cfg = self.config
        state = self.get(host)
        echo = coalesce and state.blocked_until > now and state.refusals > 0
        if echo and retry_after_s is None:
            return state
        refusals = state.refusals if echo else state.refusals + 1
        if rate and retry_after_s is None and state.learned_interval and not state.refusals:
            # A headerless 429 while spaced by a learned rate, served since the
            # last refusal: a near miss.  The interval was shrinking, and a
            # window of r answers fills only r answers after it became too
            # fast, so the spacing is already below the host's: both it and
            # RATE_MARGIN x it are taken as too fast.  A sliding window frees
            # within about one spacing, so the host is held one new interval,
            # not a blind backoff.
            floor = min(state.interval * RATE_MARGIN, cfg.backoff_max_s)
            learned = min(floor * RATE_MARGIN, cfg.backoff_max_s)
            return self._set(host, replace(
                state, blocked_until=max(state.blocked_until, now + learned), refusals=1,
                learned_interval=learned, served=0, served_since=0.0, refused_interval=floor,
            ))  # fmt: skip
        if retry_after_s is not None:
            wait = min(max(0.0, retry_after_s), cfg.backoff_max_s)
        else:
            wait = min(cfg.backoff_base_s * 2 ** (refusals - 1), cfg.backoff_max_s)
            if cfg.jitter:
                wait *= 1 + self._rng.uniform(-cfg.jitter, cfg.jitter)
        until = max(state.blocked_until, now + wait)
        learned = state.learned_interval
        floor = state.refused_interval
        answers = self._answers.get(host)
        if rate and answers:
            learned = min(_rate_interval(answers, until), cfg.backoff_max_s)
        elif rate and state.served:  # a state adopted from elsewhere: its own count
            learned = min((until - state.served_since) / state.served, cfg.backoff_max_s)
        if rate and not echo and learned:
            # Refused while spaced: that spacing is too fast for this host.  A
            # Retry-After's estimate errs slow by less than RATE_SLACK (it is
            # whole seconds), so no faster than that is tried again either.  A
            # headerless 429's ends at a blind backoff, which can be far slower
            # than the host: only the rate the refused answers already went at
            # is known to be too fast.
            if retry_after_s is not None:
                least = learned * RATE_SLACK / RATE_MARGIN
            elif answers:
                least = _rate_interval(answers, now)
            else:
                least = 0.0
            floor = max(state.interval, least)
            learned = max(learned, min(floor * RATE_MARGIN, cfg.backoff_max_s))
        return self._set(host, replace(
            state, blocked_until=until, refusals=refusals, learned_interval=learned,
            served=0, served_since=0.0, refused_interval=floor,
        ))  # fmt: skip

    def blocked(self, host: str, now: float) -> bool:
        """Is the host blocked (Retry-After or backoff) at ``now``? (An interval is no block.)"""
        state = self.hosts.get(host)
        return state is not None and state.blocked_until > now

    def succeeded(self, host: str, now: float) -> None:
        """A response that was not a pushback: the refusal count decays (halves).

        Its time is remembered toward the host's rate (see :meth:`refused`),
        for every host, so that its first ``429`` already spaces its
        requests; and a learned interval shrinks by :data:`RATE_DECAY`: one
        cycle's estimate errs slow (a ``Retry-After`` is whole seconds), so
        the crawl speeds up again until the next 429 measures the rate anew
        -- but not below :data:`RATE_MARGIN` x the spacing the host last
        refused at, where it would only be refused again, nor below
        :data:`RATE_SLACK` x the last estimate.
        """
        answers = self._answers.get(host, ())
        if answers and now - answers[0] > RATE_WINDOW_S:
            answers = tuple(t for t in answers if now - t <= RATE_WINDOW_S)
        self._answers[host] = (*answers[1 - RATE_ANSWERS :], now)
        if now >= self._sweep_at:
            self._sweep(now)
        state = self.hosts.get(host)
        if state is None or not (state.refusals or state.served or state.learned_interval):
            return
        served_since = state.served_since if state.served else now
        floor = state.refused_interval * FLOOR_DECAY
        learned = state.learned_interval
        if learned:
            learned = max(learned * RATE_DECAY, floor * RATE_MARGIN)
        self._set(host, replace(
            state, refusals=state.refusals // 2, served=state.served + 1,
            served_since=served_since, learned_interval=learned, refused_interval=floor,
        ))  # fmt: skip

    def _sweep(self, now: float) -> None:
        """Forget the answers of hosts quiet for a whole window (memory: active hosts only)."""
        self._sweep_at = now + RATE_WINDOW_S
        self._answers = {h: a for h, a in self._answers.items() if now - a[-1] <= RATE_WINDOW_S}

    def gave_up(self, host: str) -> bool:
        """Has the host refused ``max_refusals`` times in a row?"""
        return self.get(host).refusals >= self.config.max_refusals

    def sent(self, host: str, now: float) -> None:
        """A request to the host left (only tracked for hosts with an interval).

        Called when it is let go and again when it reaches the wire (later, if
        it waited in a queue or a timer fired late): the last is what a server
        measures the next interval from.  Never moves back.
        """
        state = self.hosts.get(host)
        if state is not None and state.interval and now > state.last_sent:
            self.hosts[host] = replace(state, last_sent=now)
            self._sent.add(host)

    def take_sent(self) -> dict[str, HostState]:
        """States of the hosts a request was sent to since the last call, and forget them."""
        sent, self._sent = self._sent, set()
        return {h: self.get(h) for h in sent}

    def crawl_delay(self, host: str, seconds: float | None) -> None:
        """robots.txt's Crawl-delay for the host (None or 0: none), capped."""
        delay = min(max(0.0, seconds or 0.0), self.config.crawl_delay_max_s)
        state = self.get(host)
        if delay != state.crawl_delay:
            self._set(host, replace(state, crawl_delay=delay))

    def throttle(self, host: str, delay_s: float) -> None:
        """The delay a throttle (AutoThrottle) uses for the host now."""
        state = self.get(host)
        delay = max(0.0, delay_s)
        if abs(delay - state.throttle_delay) > 1e-3:
            self._set(host, replace(state, throttle_delay=delay))

    def take_changed(self) -> dict[str, HostState]:
        """States changed since the last call (to persist or publish), and forget them."""
        changed, self._changed = self._changed, set()
        return {h: self.get(h) for h in changed}

    def to_json(self) -> dict[str, dict[str, float | int]]:
        return {h: s.to_json() for h, s in sorted(self.hosts.items())}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Adopt :meth:`to_json` output; a malformed entry raises ``ValueError``."""
        for host, raw in data.items():
            self.put(str(host), HostState.from_json(raw))
