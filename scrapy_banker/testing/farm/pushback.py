"""Sites that push back: 429 rate limits with or without Retry-After, 503 bursts, Crawl-delay.

Real servers ask crawlers to slow down, and a scheduler is judged on whether
it listens.  This module is the pure part of the farm's push-back (no
Twisted, no sockets, no clock reads: callers pass the time):

* :class:`RateLimit` -- at most ``requests`` served per sliding
  ``window_s`` seconds (``requests=1``: a minimum gap); a request above the
  rate is answered ``429``, with a ``Retry-After`` header in delta-seconds,
  as an HTTP date, or without one.  While an announced Retry-After period
  runs, every request the host receives is refused again with the
  remaining period, and is a *Retry-After violation* if it arrived more
  than :data:`REACTION_S` after the 429 announcing the period left the
  host.  One received before the 429 left was sent before the crawler
  could know (the second of two in flight): not counted.  One received
  within :data:`REACTION_S` after it was already on its way when the
  crawler read the 429: a *race*, counted apart (``retry_after_races``) --
  unless it asks again for a path refused in the period: that crawler
  retried what it was refused, a violation however soon.
* :class:`Burst` -- ``503`` without Retry-After for every request inside
  periodic windows (``period_s``/``duration_s``, phase per host from the
  farm's seed) or for the first ``first`` of every ``every`` requests.
* a ``Crawl-delay`` -- the host serves ``/robots.txt`` (:func:`robots_txt`)
  and a request that starts less than :data:`CRAWL_DELAY_TOLERANCE` x
  the delay after the previous one to that host is a *Crawl-delay
  violation* (it is still answered).

:class:`HostPushback` is what one host does (built by
:meth:`~scrapy_banker.testing.farm.model.FarmModel.pushback`, which owns the
config and the seed); :class:`PushbackTracker` applies it request by
request and keeps the counters (``refused``, ``retry_after_violations``,
``crawl_delay_violations``, ``robots_fetches``, per host and in total).
``/robots.txt`` is exempt from every refusal and from both kinds of
violation: it is only counted, so a crawler can always learn its
Crawl-delay and a test can check it was fetched once per host.
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

__all__ = [
    "CRAWL_DELAY_TOLERANCE",
    "REACTION_S",
    "ROBOTS_PATH",
    "Burst",
    "HostPushback",
    "PushbackTracker",
    "RateLimit",
    "Refusal",
    "RetryAfterFormat",
    "robots_txt",
]

#: The one path exempt from push-back (counted in ``robots_fetches``).
ROBOTS_PATH: Final = "/robots.txt"
#: A request starting sooner than this share of the Crawl-delay after the
#: previous one to the same host is a Crawl-delay violation.
CRAWL_DELAY_TOLERANCE: Final = 0.95

#: How a 429 announces its period: delta-seconds, an HTTP date, or not at all.
RetryAfterFormat = Literal["seconds", "date", "none"]
_FORMATS: Final = ("seconds", "date", "none")
#: A client's reaction time (s): a request received less than this after the
#: 429 left was already on its way (written to the socket in the event-loop
#: turn that read the 429, or before): a *race*, counted apart.
REACTION_S: Final = 0.05
#: Violations described one by one in :meth:`PushbackTracker.stats` (the rest are counted).
MAX_EVENTS: Final = 100
#: Float noise tolerated when rounding a wait up to whole seconds.
_EPS: Final = 1e-9


_Spec = TypeVar("_Spec")


def _fields(cls: type[Any], value: object, what: str) -> dict[str, Any]:
    """The keyword arguments of a spec given as a mapping (JSON), with clear errors."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what}: expected a {cls.__name__} or a JSON object, got {value!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in value if k not in names)
    if unknown:
        raise ValueError(f"{what}: unknown {cls.__name__} keys {unknown}")
    return {str(k): v for k, v in value.items()}


def _build(cls: type[_Spec], value: object, what: str) -> _Spec:
    """``cls`` built from a spec given as a mapping (JSON), with clear errors."""
    try:
        return cls(**_fields(cls, value, what))
    except TypeError as exc:  # pragma: no cover - _fields checks the names
        raise ValueError(f"{what}: {exc}") from exc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return out


def _ceil_s(seconds: float) -> int:
    """Whole seconds covering ``seconds`` (at least 1): what a Retry-After may say."""
    return max(1, math.ceil(seconds - _EPS))


@dataclass(frozen=True)
class RateLimit:
    """At most ``requests`` requests served per sliding ``window_s`` seconds; above, ``429``.

    ``requests=1`` makes ``window_s`` a minimum gap between two served
    requests.  Only served requests fill the window; refusals do not.

    ``retry_after`` says how a 429 tells when to come back: ``"seconds"``
    (``Retry-After: 3``), ``"date"`` (``Retry-After: Fri, 27 Nov 2026
    12:00:03 GMT``, rounded up to the whole second) or ``"none"`` (no
    header, no announced period, hence no Retry-After violations).
    ``retry_after_s`` is the period announced; ``None`` announces the time
    until the window has room again, rounded up to whole seconds (at least
    1), so a crawler that waits as told is served.
    """

    requests: int = 1
    window_s: float = 1.0
    retry_after: RetryAfterFormat = "seconds"
    retry_after_s: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.requests) or self.requests < 1:
            raise ValueError(f"RateLimit.requests must be an integer >= 1, got {self.requests!r}")
        window = _seconds(self.window_s, "RateLimit.window_s")
        if window <= 0:
            raise ValueError(f"RateLimit.window_s must be > 0, got {self.window_s!r}")
        object.__setattr__(self, "window_s", window)
        if self.retry_after not in _FORMATS:
            raise ValueError(
                f"RateLimit.retry_after must be one of {list(_FORMATS)}, got {self.retry_after!r}"
            )
        if self.retry_after_s is not None and (
            not _is_int(self.retry_after_s) or self.retry_after_s < 1
        ):
            raise ValueError(
                f"RateLimit.retry_after_s must be None or an integer >= 1, "
                f"got {self.retry_after_s!r}"
            )

    @classmethod
    def coerce(cls, value: RateLimit | Mapping[str, Any], what: str = "rate limit") -> RateLimit:
        """A :class:`RateLimit` from itself or from its JSON object."""
        return value if isinstance(value, cls) else _build(cls, value, what)


@dataclass(frozen=True)
class Burst:
    """``503`` (no Retry-After) for every request inside bursts; exactly one mode is set.

    *Time mode* (``period_s`` and ``duration_s``, ``0 < duration_s <
    period_s``): the host refuses while ``(t + phase) % period_s <
    duration_s``, ``t`` being the seconds since the farm's first request
    (after start or reset) and ``phase`` drawn for the host from the seed
    in ``[0, period_s)``.

    *Count mode* (``every`` and ``first``, ``1 <= first < every``): the
    host's requests are numbered from 0 (since start or reset, robots.txt
    not counted) and request ``n`` is refused when ``n % every < first``:
    the very first request of the host is refused.
    """

    period_s: float = 0.0
    duration_s: float = 0.0
    every: int = 0
    first: int = 0

    def __post_init__(self) -> None:
        period = _seconds(self.period_s, "Burst.period_s")
        duration = _seconds(self.duration_s, "Burst.duration_s")
        object.__setattr__(self, "period_s", period)
        object.__setattr__(self, "duration_s", duration)
        if not _is_int(self.every) or not _is_int(self.first):
            raise ValueError("Burst.every and Burst.first must be integers")
        timed = period > 0 or duration > 0
        counted = self.every != 0 or self.first != 0
        if timed == counted:
            raise ValueError(
                "a Burst needs exactly one mode: period_s and duration_s, or every and first"
            )
        if timed and not 0 < duration < period:
            raise ValueError(
                f"Burst needs 0 < duration_s < period_s, got {duration!r} and {period!r}"
            )
        if counted and not 1 <= self.first < self.every:
            raise ValueError(
                f"Burst needs 1 <= first < every, got first={self.first!r}, every={self.every!r}"
            )

    @property
    def mode(self) -> Literal["time", "count"]:
        return "time" if self.period_s > 0 else "count"

    def refuses(self, t: float, n: int, phase_s: float = 0.0) -> bool:
        """Whether request number ``n``, received ``t`` seconds after the origin, gets a 503."""
        if self.period_s > 0:
            return (t + phase_s) % self.period_s < self.duration_s
        return n % self.every < self.first

    @classmethod
    def coerce(cls, value: Burst | Mapping[str, Any], what: str = "burst") -> Burst:
        """A :class:`Burst` from itself or from its JSON object."""
        return value if isinstance(value, cls) else _build(cls, value, what)


def _format_seconds(seconds: float) -> str:
    """``2``, ``0.5``, ``0.125``: at most millisecond precision, no exponent."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def robots_txt(crawl_delay_s: float) -> bytes:
    """The robots.txt of a host with a Crawl-delay: everything allowed, for every agent."""
    return f"User-agent: *\nCrawl-delay: {_format_seconds(crawl_delay_s)}\nDisallow:\n".encode()


@dataclass(frozen=True)
class HostPushback:
    """What one host does to push back (see :meth:`FarmModel.pushback_hosts`).

    ``index`` is the generated host's index, None for a static site.
    ``burst_phase_s`` is the host's offset into a time-mode burst cycle.
    """

    host: str
    index: int | None
    rate_limit: RateLimit | None = None
    burst: Burst | None = None
    burst_phase_s: float = 0.0
    crawl_delay_s: float | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """Tags for reports: ``retry_after``, ``retry_after_date``, ``headerless_429``,
        ``burst_503`` and ``crawl_delay``, in that order."""
        out: list[str] = []
        if self.rate_limit is not None:
            out.append(
                {"seconds": "retry_after", "date": "retry_after_date", "none": "headerless_429"}[
                    self.rate_limit.retry_after
                ]
            )
        if self.burst is not None:
            out.append("burst_503")
        if self.crawl_delay_s is not None:
            out.append("crawl_delay")
        return tuple(out)

    @property
    def announces_retry_after(self) -> bool:
        """Whether the host's 429s carry a Retry-After (so violations can be counted)."""
        return self.rate_limit is not None and self.rate_limit.retry_after != "none"

    def robots_txt(self) -> bytes | None:
        """The host's robots.txt if it has a Crawl-delay, else None (404)."""
        return None if self.crawl_delay_s is None else robots_txt(self.crawl_delay_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (benchmark reports)."""
        return {
            "host": self.host,
            "index": self.index,
            "kinds": list(self.kinds),
            "rate_limit": None if self.rate_limit is None else dataclasses.asdict(self.rate_limit),
            "burst": None if self.burst is None else dataclasses.asdict(self.burst),
            "burst_phase_s": self.burst_phase_s,
            "crawl_delay_s": self.crawl_delay_s,
        }


@dataclass(frozen=True)
class Refusal:
    """A request pushed back: ``429`` or ``503``, and the ``Retry-After`` value if any.

    ``reason`` is ``"rate_limit"`` (a new refusal above the rate),
    ``"retry_after_period"`` (a Retry-After violation) or ``"burst"``.
    ``retry_after_s`` is the period the header announces, rounded up to
    whole seconds (None without the header).
    """

    status: int
    reason: Literal["rate_limit", "retry_after_period", "burst"]
    retry_after: str | None = None
    retry_after_s: int | None = None


class _State:
    __slots__ = (
        "announced", "announced_to", "announced_wall", "count", "last_node", "last_start",
        "last_wall", "refused", "until", "until_date", "window",
    )  # fmt: skip

    def __init__(self) -> None:
        #: Requests received (robots.txt excluded), for count-mode bursts.
        self.count = 0
        #: Start of the previous request (robots.txt excluded), for Crawl-delay.
        self.last_start: float | None = None
        #: The node that sent it (None: not told).
        self.last_node: str | None = None
        #: Its wall time (``time.time()``), named in a violation's report.
        self.last_wall: float | None = None
        #: End of the announced Retry-After period (``now`` units) and its date.
        self.until: float | None = None
        self.until_date: int | None = None
        #: When the 429 announcing it left the host (``now`` units): requests
        #: received before were sent before the crawler could know.
        self.announced: float | None = None
        #: The same moment in wall-clock time, and the node the 429 went to
        #: (None: not told): a report can then say which crawler was told.
        self.announced_wall: float | None = None
        self.announced_to: str | None = None
        #: Paths refused during the period: one sent again inside it is the
        #: crawler retrying what it was refused -- never a race.
        self.refused: set[str] = set()
        #: Start times of the served requests inside the rate-limit window.
        self.window: deque[float] = deque()


class PushbackTracker:
    """Receipt-time push-back decisions and their counters; pure (callers pass the clock).

    ``lookup`` maps a host name to its :class:`HostPushback` (None: the
    host never pushes back); the farm's server uses
    :meth:`FarmModel.pushback_tracker`.  ``now`` is a monotonic time in
    seconds; ``wall`` the matching wall-clock epoch time, used only for
    Retry-After dates (default: ``now`` itself).
    """

    def __init__(self, lookup: Callable[[str], HostPushback | None], active: bool = True) -> None:
        self._lookup = lookup
        #: False when no host pushes back: only robots.txt fetches are counted.
        self.active = active
        self._specs: dict[str, HostPushback | None] = {}
        self.reset()

    def reset(self) -> None:
        """Forget counters, windows, announced periods and the burst origin."""
        self._states: dict[str, _State] = {}
        self._origin: float | None = None
        self.refused: dict[str, int] = {}
        self.retry_after_violations: dict[str, int] = {}
        self.retry_after_races: dict[str, int] = {}
        self.crawl_delay_violations: dict[str, int] = {}
        self.robots_fetches: dict[str, int] = {}
        #: The first :data:`MAX_EVENTS` violations, for a report that says
        #: which host, which path, when (``wall`` time) and by how much.
        self.violations: list[dict[str, Any]] = []

    @property
    def origin(self) -> float | None:
        """``now`` of the first request since start or reset: time zero of the bursts."""
        return self._origin

    def spec(self, host: str) -> HostPushback | None:
        if host not in self._specs:
            self._specs[host] = self._lookup(host)
        return self._specs[host]

    def receive(
        self,
        host: str,
        path: str,
        now: float,
        wall: float | None = None,
        reply_s: float = 0.0,
        node: str | None = None,
    ) -> Refusal | None:
        """Account one request received at ``now``; a :class:`Refusal` or None (serve it).

        ``reply_s`` is how long the host takes to answer it: a ``429`` that
        announces a Retry-After period is known to the crawler only once it
        left, so a request received before then -- sent while the crawler
        could not know, e.g. the second of two in flight -- is refused with
        the rest of the period but is no Retry-After violation.  ``node`` is
        the crawler node that sent it, when it says (``X-Banker-Node``): a
        Retry-After violation's report names the node that sent it and the
        node the period was announced to, and when.
        """
        if self._origin is None:
            self._origin = now
        if path == ROBOTS_PATH:
            self.robots_fetches[host] = self.robots_fetches.get(host, 0) + 1
            return None
        if not self.active:
            return None
        spec = self.spec(host)
        if spec is None:
            return None
        state = self._states.get(host)
        if state is None:
            state = self._states[host] = _State()
        if spec.crawl_delay_s is not None:
            last = state.last_start
            if last is not None and now - last < CRAWL_DELAY_TOLERANCE * spec.crawl_delay_s:
                self.crawl_delay_violations[host] = self.crawl_delay_violations.get(host, 0) + 1
                self._event(
                    "crawl_delay", host, path, now, wall, spec.crawl_delay_s - (now - last), node,
                    previous_node=state.last_node, previous_wall=state.last_wall,
                )  # fmt: skip
            state.last_wall = wall
            state.last_start = now
            state.last_node = node
        n = state.count
        state.count += 1
        if state.until is not None:
            if now < state.until:
                announced = state.announced
                again = path in state.refused
                state.refused.add(path)
                if again or announced is None or now >= announced + REACTION_S:
                    self.retry_after_violations[host] = self.retry_after_violations.get(host, 0) + 1
                    self._event(
                        "retry_after", host, path, now, wall, state.until - now, node,
                        announced_wall=state.announced_wall, announced_to=state.announced_to,
                    )  # fmt: skip
                elif now >= announced:
                    self.retry_after_races[host] = self.retry_after_races.get(host, 0) + 1
                left = _ceil_s(state.until - now)
                header = (
                    str(left)
                    if state.until_date is None
                    else email.utils.formatdate(state.until_date, usegmt=True)
                )
                return self._refuse(host, Refusal(429, "retry_after_period", header, left))
            state.until = state.until_date = state.announced = state.announced_wall = None
            state.announced_to = None
            state.refused.clear()
        if spec.burst is not None and spec.burst.refuses(now - self._origin, n, spec.burst_phase_s):
            return self._refuse(host, Refusal(503, "burst"))
        limit = spec.rate_limit
        if limit is None:
            return None
        window = state.window
        while window and window[0] + limit.window_s <= now:
            window.popleft()
        if len(window) < limit.requests:
            window.append(now)
            return None
        if limit.retry_after == "none":
            return self._refuse(host, Refusal(429, "rate_limit"))
        delta = (
            limit.retry_after_s
            if limit.retry_after_s is not None
            else _ceil_s(window[0] + limit.window_s - now)
        )
        state.until = now + delta
        state.announced = now + reply_s
        state.announced_wall = (now if wall is None else wall) + reply_s
        state.announced_to = node
        state.refused.add(path)
        if limit.retry_after == "seconds":
            return self._refuse(host, Refusal(429, "rate_limit", str(delta), delta))
        date = math.ceil((now if wall is None else wall) + delta)
        state.until_date = date
        header = email.utils.formatdate(date, usegmt=True)
        return self._refuse(host, Refusal(429, "rate_limit", header, delta))

    def _refuse(self, host: str, refusal: Refusal) -> Refusal:
        self.refused[host] = self.refused.get(host, 0) + 1
        return refusal

    def _event(
        self,
        kind: str,
        host: str,
        path: str,
        now: float,
        wall: float | None,
        early_s: float,
        node: str | None,
        **more: Any,
    ) -> None:
        if len(self.violations) < MAX_EVENTS:
            self.violations.append({
                "kind": kind, "host": host, "path": path, "node": node,
                "wall": now if wall is None else wall, "early_s": round(early_s, 4), **more,
            })  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Totals and per-host counts (hosts with a zero count are left out), and
        ``violations``: the first of them, each with its host, path, time, how
        early and the node that sent it; a Crawl-delay violation also with
        the node that sent the request before (``previous_node``) and when it was
        received (``previous_wall``); a Retry-After violation also with
        when (``announced_wall``) and to which node (``announced_to``) the
        429 announcing the period left the host."""
        out: dict[str, Any] = {"violations": list(self.violations)}
        for name in ("refused", "retry_after_violations", "retry_after_races",
                     "crawl_delay_violations", "robots_fetches"):  # fmt: skip
            counts: dict[str, int] = getattr(self, name)
            out[name] = sum(counts.values())
            out[f"{name}_per_host"] = dict(counts)
        return out
