"""Run-time control and budgets: what an operator asked of a running crawl.

An operator steering a crawl for days needs to act on one site without
stopping everything -- pause it, slow it, cap its concurrency, cap how many
pages it gets -- and to cap a topic or the whole crawl.  This module is the
value those requests build: a :class:`ControlState` (per host, per topic and
crawl-wide directives, with a version), the :class:`Action` that changes it,
and the parsing of an operator's words into an action, with an error that
names the argument and what is allowed (:class:`ControlError`).

It is kept apart from *where* the state lives -- a Redis key for a fleet
(:mod:`scrapy_banker.redis.control`), a file in a JOBDIR for a single
process -- so that every channel stores the same JSON and applies the same
rules.  Budgets are resolved here too (:class:`BudgetRules`): an operator's
per-host budget, else the first ``BANKER_HOST_BUDGETS`` pattern that
matches, else ``BANKER_HOST_BUDGET``.

Pure: no Scrapy, Twisted, Redis or clock reads; callers pass ``now``.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from scrapy_banker.core.journal import PageCounts

__all__ = [
    "CRAWL",
    "VERBS",
    "Action",
    "BudgetBook",
    "BudgetRules",
    "ControlError",
    "ControlState",
    "HostControl",
    "TopicControl",
    "check_host",
    "parse_action",
]

#: The target of a crawl-wide budget (``budget crawl N``).
CRAWL = "crawl"
#: What an operator may do, and the targets each takes.
VERBS: Mapping[str, str] = {
    "pause": "HOST or topic:NAME",
    "resume": "HOST or topic:NAME",
    "limit": "HOST N (N >= 1), or HOST none",
    "delay": "HOST SECONDS (>= 0; 0 removes it)",
    "budget": "HOST, topic:NAME or crawl, then N (>= 0) or none",
    "purge": "HOST",
    "inject": "URL...",
}

_HOST = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?$")
_IPV6 = re.compile(r"^[0-9a-f:.]+$")


class ControlError(ValueError):
    """Bad operator input: the message names the argument and what is allowed."""


def check_host(value: str, argument: str = "HOST") -> str:
    """``value`` as the host name the crawl keys hosts by (lower-cased), or ControlError."""
    if not isinstance(value, str) or not value:
        raise ControlError(f"{argument}: expected a host name such as example.com, got {value!r}")
    host = value.strip().lower()
    if "://" in host or "/" in host:
        raise ControlError(
            f"{argument}: expected a host name such as example.com, not a URL: {value!r}"
        )
    if host.startswith("[") and host.endswith("]") and _IPV6.match(host[1:-1]):
        return host[1:-1]
    if ":" in host and _IPV6.match(host):
        return host
    if not _HOST.match(host):
        raise ControlError(
            f"{argument}: {value!r} is not a host name (letters, digits, '-', '_' and dots)"
        )
    return host


@dataclass(frozen=True)
class HostControl:
    """What an operator set for one host; the defaults mean "nothing set"."""

    paused: bool = False
    #: Least seconds between two requests to the host (on top of its own politeness).
    delay: float = 0.0
    #: Requests the host may have in flight at once (None: the crawl's own limit).
    limit: int | None = None
    #: Pages the host may be fetched (None: the settings' budget, if any).
    budget: int | None = None

    @property
    def idle(self) -> bool:
        return self == HostControl()


@dataclass(frozen=True)
class TopicControl:
    paused: bool = False
    budget: int | None = None

    @property
    def idle(self) -> bool:
        return self == TopicControl()


@dataclass(frozen=True)
class Action:
    """One operator request: ``verb`` on ``target`` (a host, ``topic:NAME``, ``crawl``)."""

    verb: str
    target: str = ""
    #: The number of ``limit``, ``delay``, ``budget`` (None: remove it).
    value: float | None = None
    #: The URLs of ``inject``, and its topic.
    urls: tuple[str, ...] = ()
    topic: str | None = None

    @property
    def topic_target(self) -> str | None:
        return self.target[6:] if self.target.startswith("topic:") else None

    def describe(self) -> str:
        if self.verb == "inject":
            topic = f" (topic {self.topic})" if self.topic else ""
            return f"inject {len(self.urls)} URL(s){topic}"
        value = (
            ""
            if self.verb in ("pause", "resume", "purge")
            else (" none" if self.value is None else f" {_shown(self.value)}")
        )
        return f"{self.verb} {self.target}{value}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verb": self.verb}
        if self.target:
            out["target"] = self.target
        if self.value is not None:
            out["value"] = self.value
        if self.urls:
            out["urls"] = list(self.urls)
        if self.topic is not None:
            out["topic"] = self.topic
        return out


@dataclass(frozen=True)
class ControlState:
    """Every directive in force, and a version that grows with each change."""

    hosts: Mapping[str, HostControl] = field(default_factory=dict)
    topics: Mapping[str, TopicControl] = field(default_factory=dict)
    crawl_budget: int | None = None
    version: int = 0

    # -- reading ------------------------------------------------------------------

    def host(self, host: str) -> HostControl:
        return self.hosts.get(host) or _NO_HOST

    def topic(self, topic: str) -> TopicControl:
        return self.topics.get(topic) or _NO_TOPIC

    @cached_property
    def paused_hosts(self) -> frozenset[str]:
        return frozenset(h for h, c in self.hosts.items() if c.paused)

    @cached_property
    def paused_topics(self) -> frozenset[str]:
        return frozenset(t for t, c in self.topics.items() if c.paused)

    def budgets_differ(self, other: ControlState) -> bool:
        """Did any budget change between ``other`` and this state (held requests to re-check)?"""
        mine = {h: c.budget for h, c in self.hosts.items() if c.budget is not None}
        theirs = {h: c.budget for h, c in other.hosts.items() if c.budget is not None}
        tmine = {t: c.budget for t, c in self.topics.items() if c.budget is not None}
        ttheirs = {t: c.budget for t, c in other.topics.items() if c.budget is not None}
        return (mine, tmine, self.crawl_budget) != (theirs, ttheirs, other.crawl_budget)

    # -- changing -----------------------------------------------------------------

    def apply(self, action: Action) -> ControlState:
        """The state after ``action`` (``purge`` and ``inject`` change no directive)."""
        verb, target, value = action.verb, action.target, action.value
        if verb in ("purge", "inject"):
            return replace(self, version=self.version + 1)
        if target == CRAWL:
            budget = None if value is None else int(value)
            return replace(self, crawl_budget=budget, version=self.version + 1)
        topic = action.topic_target
        if topic is not None:
            tc = self.topic(topic)
            if verb in ("pause", "resume"):
                tc = replace(tc, paused=verb == "pause")
            else:  # budget
                tc = replace(tc, budget=None if value is None else int(value))
            topics = dict(self.topics)
            if tc.idle:
                topics.pop(topic, None)
            else:
                topics[topic] = tc
            return replace(self, topics=topics, version=self.version + 1)
        hc = self.host(target)
        if verb in ("pause", "resume"):
            hc = replace(hc, paused=verb == "pause")
        elif verb == "limit":
            hc = replace(hc, limit=None if value is None else int(value))
        elif verb == "delay":
            hc = replace(hc, delay=0.0 if value is None else float(value))
        elif verb == "budget":
            hc = replace(hc, budget=None if value is None else int(value))
        hosts = dict(self.hosts)
        if hc.idle:
            hosts.pop(target, None)
        else:
            hosts[target] = hc
        return replace(self, hosts=hosts, version=self.version + 1)

    # -- JSON ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version}
        if self.hosts:
            out["hosts"] = {h: _nondefault(c, _NO_HOST) for h, c in sorted(self.hosts.items())}
        if self.topics:
            out["topics"] = {t: _nondefault(c, _NO_TOPIC) for t, c in sorted(self.topics.items())}
        if self.crawl_budget is not None:
            out["crawl_budget"] = self.crawl_budget
        return out

    @classmethod
    def from_json(cls, data: object) -> ControlState:
        """Inverse of :meth:`to_json`; :class:`ControlError` says what is wrong."""
        if not isinstance(data, Mapping):
            raise ControlError(f"control state must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"version", "hosts", "topics", "crawl_budget"})
        if unknown:
            raise ControlError(f"control state has unknown fields {unknown}")
        version = _count("version", data.get("version", 0))
        crawl = data.get("crawl_budget")
        hosts = {
            check_host(h, f"hosts[{h!r}]"): _host_control(h, v)
            for h, v in _mapping("hosts", data.get("hosts", {})).items()
        }
        topics = {
            str(t): _topic_control(t, v)
            for t, v in _mapping("topics", data.get("topics", {})).items()
        }
        return cls(hosts, topics, None if crawl is None else _count("crawl_budget", crawl), version)


_NO_HOST = HostControl()
_NO_TOPIC = TopicControl()


def _nondefault(value: HostControl | TopicControl, default: object) -> dict[str, Any]:
    return {k: v for k, v in vars(value).items() if v != getattr(default, k)}


def _mapping(name: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ControlError(f"control state {name} must be an object, got {value!r}")
    return value


def _count(name: str, value: object, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ControlError(f"{name}: expected an integer >= {least}, got {value!r}")
    return value


def _host_control(host: str, value: object) -> HostControl:
    data = _mapping(f"hosts[{host!r}]", value)
    unknown = sorted(set(data) - set(vars(_NO_HOST)))
    if unknown:
        raise ControlError(f"hosts[{host!r}] has unknown fields {unknown}")
    delay = data.get("delay", 0.0)
    if (
        isinstance(delay, bool)
        or not isinstance(delay, (int, float))
        or not (math.isfinite(delay) and delay >= 0)
    ):
        raise ControlError(f"hosts[{host!r}].delay: expected seconds >= 0, got {delay!r}")
    limit, budget = data.get("limit"), data.get("budget")
    return HostControl(
        paused=bool(data.get("paused", False)),
        delay=float(delay),
        limit=None if limit is None else _count(f"hosts[{host!r}].limit", limit, 1),
        budget=None if budget is None else _count(f"hosts[{host!r}].budget", budget),
    )


def _topic_control(topic: str, value: object) -> TopicControl:
    data = _mapping(f"topics[{topic!r}]", value)
    unknown = sorted(set(data) - set(vars(_NO_TOPIC)))
    if unknown:
        raise ControlError(f"topics[{topic!r}] has unknown fields {unknown}")
    budget = data.get("budget")
    return TopicControl(
        paused=bool(data.get("paused", False)),
        budget=None if budget is None else _count(f"topics[{topic!r}].budget", budget),
    )


# -- parsing an operator's words ------------------------------------------------------


#: The most an operator may give each number: beyond it the value is a typo, not a wish
#: (a day between two requests is a pause; a trillion pages is no budget at all).
_MOST = {"limit": 10_000, "budget": 10**12, "delay": 86_400}
#: Plain ASCII decimals only: Python's int() and float() also take '1_000', ' ٣ ',
#: 'nan', 'infinity' and '0x10'-like spellings an operator never means.
_INTEGER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number(verb: str, text: str, *, integer: bool, least: float) -> float | None:
    """The ``N`` of ``limit`` / ``budget`` (an integer) or ``delay`` (seconds, finite), in range."""
    if text.lower() == "none" and verb != "delay":
        return None
    most = _MOST[verb]
    allowed = f"an integer >= {int(least)}" if integer else f"a number of seconds >= {least:g}"
    if verb != "delay":
        allowed += " or 'none'"
    error = ControlError(
        f"{verb}: N must be {allowed}, got {text!r} (at most {most:,}{'' if integer else ' s'})"
    )
    digits = text.strip()
    if not (_INTEGER if integer else _DECIMAL).fullmatch(digits):
        raise error
    value = int(digits) if integer else float(digits)
    if not math.isfinite(value) or not least <= value <= most:
        raise error
    return value


def _topic(verb: str, name: str, topics: Collection[str] | None) -> str:
    if not name:
        raise ControlError(f"{verb}: topic:NAME needs a name")
    if topics is not None and name not in topics:
        known = ", ".join(sorted(topics)) or "none (BANKER_TOPICS is empty)"
        raise ControlError(f"{verb}: no topic {name!r} in this crawl; its topics: {known}")
    return name


def _host_argument(value: str) -> str:
    """:func:`check_host` for an operator's HOST, which never carries a port.

    The crawl keys a host by its download slot: the URL's host name, without
    port.  ``127.0.0.1:8731`` is refused naming ``127.0.0.1`` (not taken
    for an IPv6 address), and a bare IPv6 address must be a valid one.
    """
    import ipaddress

    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and ":" in text and "://" not in text and "/" not in text:
        head, _, port = text.rpartition(":")
        bare = head[1:-1] if head.startswith("[") and head.endswith("]") else head
        if port.isascii() and port.isdigit() and bare and (bare != head or ":" not in bare):
            raise ControlError(
                f"HOST: {value!r} names a port; the crawl keys hosts by name, without port: "
                f"give {check_host(bare)!r}"
            )
        try:
            ipaddress.IPv6Address(text[1:-1] if text.startswith("[") else text)
        except ValueError:
            raise ControlError(f"HOST: {value!r} is not a host name nor an IPv6 address") from None
    return check_host(value)


def parse_action(
    verb: str,
    args: Sequence[str],
    *,
    topics: Collection[str] | None = None,
    topic: str | None = None,
    check_url: Any = None,
) -> Action:
    """An :class:`Action` from an operator's words, or :class:`ControlError`.

    ``topics``: the crawl's topic names (None: not checked).  ``topic``:
    the topic of ``inject``.  ``check_url(url)`` raises ``ValueError`` for
    a URL the crawl cannot fetch (``inject``).
    """
    if verb not in VERBS:
        raise ControlError(f"unknown action {verb!r}; allowed: {', '.join(VERBS)}")
    usage = f"{verb} takes {VERBS[verb]}"
    if verb == "inject":
        if not args:
            raise ControlError(f"{usage}: give at least one URL")
        if topic is not None:
            _topic(verb, topic, topics)
        for url in args:
            if check_url is not None:
                try:
                    check_url(url)
                except ValueError as exc:
                    raise ControlError(f"inject: URL {url!r} cannot be fetched: {exc}") from None
        return Action(verb, urls=tuple(args), topic=topic)
    want = 1 if verb in ("pause", "resume", "purge") else 2
    if len(args) != want:
        raise ControlError(f"{usage}; got {len(args)} argument(s): {' '.join(args)!r}")
    target = args[0]
    if target == CRAWL:
        if verb != "budget":
            raise ControlError(f"{verb}: 'crawl' is only a target of budget")
    elif target.startswith("topic:"):
        if verb not in ("pause", "resume", "budget"):
            raise ControlError(f"{verb}: takes a HOST, not a topic ({usage})")
        target = "topic:" + _topic(verb, target[6:], topics)
    else:
        target = _host_argument(target)
    if want == 1:
        return Action(verb, target)
    if verb == "delay":
        return Action(verb, target, _number(verb, args[1], integer=False, least=0.0))
    least = 1 if verb == "limit" else 0
    return Action(verb, target, _number(verb, args[1], integer=True, least=least))


# -- budgets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetRules:
    """Pages per host from the settings: a default and per-pattern overrides.

    ``patterns`` are ``fnmatch`` patterns on the host name
    (``*.example.com``), tried in order; an exact host name is a pattern
    too.  An operator's ``budget HOST N`` outranks them all.
    """

    default: int | None = None
    patterns: tuple[tuple[str, int], ...] = ()
    #: Budget per topic (``BANKER_TOPICS[name]["budget"]``).
    topics: Mapping[str, int] = field(default_factory=dict)
    #: Pages the whole crawl may fetch (``BANKER_CRAWL_BUDGET``).
    crawl: int | None = None

    def host(self, host: str, state: ControlState | None = None) -> int | None:
        if state is not None:
            budget = state.host(host).budget
            if budget is not None:
                return budget
        for pattern, budget in self.patterns:
            if pattern == host or fnmatch.fnmatchcase(host, pattern):
                return budget
        return self.default

    def topic(self, topic: str, state: ControlState | None = None) -> int | None:
        if state is not None:
            budget = state.topic(topic).budget
            if budget is not None:
                return budget
        return self.topics.get(topic)

    def crawl_budget(self, state: ControlState | None = None) -> int | None:
        if state is not None and state.crawl_budget is not None:
            return state.crawl_budget
        return self.crawl

    def any(self, state: ControlState | None = None) -> bool:
        """Is any budget in force (else nothing need be counted)?"""
        if self.default is not None or self.patterns or self.topics or self.crawl is not None:
            return True
        return state is not None and (
            state.crawl_budget is not None
            or any(c.budget is not None for c in state.hosts.values())
            or any(c.budget is not None for c in state.topics.values())
        )


class BudgetBook(PageCounts):
    """Pages charged per host, per topic and crawl-wide on one node (a fleet counts in Redis).

    The counts are a :class:`~scrapy_banker.core.journal.PageCounts` (what a
    JOBDIR's files count too).  A request is charged when it leaves for the
    downloader and refunded if it comes back unfetched (put back by
    pushback, held back at the wire).  :meth:`charge` refuses a request whose
    host, topic or crawl is spent: the caller keeps it aside, visible, until
    a budget is raised; with no budget in force pages are counted with
    :meth:`~scrapy_banker.core.journal.PageCounts.add`.
    """

    def __init__(self, rules: BudgetRules) -> None:
        super().__init__()
        self.rules = rules
        self.state: ControlState | None = None

    def over(self, host: str, topic: str) -> str | None:
        """Which budget a request of ``host``/``topic`` would exceed (None: none)."""
        rules, state = self.rules, self.state
        budget = rules.host(host, state)
        if budget is not None and self.hosts.get(host, 0) >= budget:
            return f"host {host} budget {budget}"
        budget = rules.topic(topic, state)
        if budget is not None and self.topics.get(topic, 0) >= budget:
            return f"topic {topic} budget {budget}"
        budget = rules.crawl_budget(state)
        if budget is not None and self.crawl >= budget:
            return f"crawl budget {budget}"
        return None

    def charge(self, host: str, topic: str) -> str | None:
        """Charge one page, or say which budget is spent (nothing charged then)."""
        reason = self.over(host, topic)
        if reason is None:
            self.add(host, topic)
        return reason

    def refund(self, host: str, topic: str) -> None:
        if self.hosts.get(host, 0) > 0:
            self.hosts[host] -= 1
        if self.topics.get(topic, 0) > 0:
            self.topics[topic] -= 1
        self.crawl = max(0, self.crawl - 1)

    @property
    def crawl_spent(self) -> bool:
        budget = self.rules.crawl_budget(self.state)
        return budget is not None and self.crawl >= budget


def _shown(value: float) -> str:
    """A whole number as digits (``budget crawl 1000000``), seconds as ``%g``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
