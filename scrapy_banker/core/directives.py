"""Run-time control and budgets: what an operator asked of a running crawl.

An operator steering a crawl for days needs to act on one site without
stopping everything -- pause it, slow it, cap its concurrency, cap how many
pages it gets -- and to cap a topic or the whole crawl.  This module is the
value those requests build: a :class:`ControlState` (per host, per topic and
crawl-wide directives, with a version), the :class:`Action` that changes it,
the verbs an operator may use (:data:`VERBS`: what each takes, where it can
be carried out, its help -- the one table the command line, the dashboard
and the docs read), and the parsing of an operator's words into an action,
with an error that names the argument and what is allowed
(:class:`ControlError`).

It is kept apart from *where* the state lives -- a Redis key for a fleet
(:mod:`scrapy_banker.redis.frontier.control_channel`), a file in a JOBDIR for a single
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
    "FLEET",
    "HOST",
    "JOBDIR",
    "TOPIC",
    "URL",
    "VERBS",
    "WHERE",
    "Action",
    "BudgetBook",
    "BudgetRules",
    "ControlError",
    "ControlState",
    "HostControl",
    "TopicControl",
    "Value",
    "Verb",
    "check_host",
    "get_verb",
    "parse_action",
    "verbs_in",
]

#: The target of a crawl-wide budget (``budget crawl N``).
CRAWL = "crawl"

# -- the operator's verbs --------------------------------------------------------------
#
# One table says what each verb takes, where it can be carried out and what it is
# for; the parser below, the command line (its subcommands and their help), the
# dashboard's form and the docs all read it.

#: Kinds of target a verb takes: a host name, ``topic:NAME``, the word ``crawl``,
#: or one or more URLs (:data:`URL`: the verb's arguments are URLs, with an
#: optional topic).
HOST = "host"
TOPIC = "topic"
URL = "url"
#: Where a verb can be carried out: on a fleet's Redis (:data:`FLEET`), or on a
#: single process through the control file in its JOBDIR (:data:`JOBDIR`).
FLEET = "fleet"
JOBDIR = "jobdir"
#: How each mode is named in a refusal and in the docs.
WHERE: Mapping[str, str] = {FLEET: "a fleet on Redis", JOBDIR: "a single process's JOBDIR"}

#: How each kind of target is written in a usage line, a synopsis and a form's placeholder.
_TARGET_WORDS: Mapping[str, tuple[str, str, str]] = {
    HOST: ("HOST", "HOST", "host"),
    TOPIC: ("topic:NAME", "topic:NAME", "topic:NAME"),
    CRAWL: ("crawl", "crawl", "crawl"),
    URL: ("URL...", "URL... [--topic NAME]", "URLs, space-separated"),
}


@dataclass(frozen=True)
class Value:
    """The number a verb sets after its target: its kind, its range, and how it is removed.

    A value that takes no ``none`` is removed by its least (``delay HOST 0``).
    """

    #: How it is written in a usage line: ``N`` or ``SECONDS``.
    metavar: str
    #: An integer (``limit``, ``budget``), else seconds (finite, decimals allowed).
    integer: bool
    least: float
    #: The most an operator may give: beyond it the value is a typo, not a wish
    #: (a day between two requests is a pause; a trillion pages is no budget at all).
    most: float
    #: ``none`` removes what was set.
    none: bool = True

    @property
    def usage(self) -> str:
        """``N (>= 1) or none``, ``SECONDS (>= 0; 0 removes it)``."""
        if self.none:
            return f"{self.metavar} (>= {self.least:g}) or none"
        return f"{self.metavar} (>= {self.least:g}; {self.least:g} removes it)"

    @property
    def synopsis(self) -> str:
        return f"{self.metavar}|none" if self.none else self.metavar


@dataclass(frozen=True)
class Verb:
    """One operator verb: what it takes, where it can be carried out, what it is for.

    ``targets`` are kinds of target (:data:`HOST`, :data:`TOPIC`,
    :data:`CRAWL`), or ``(URL,)`` for a verb whose arguments are URLs (with an
    optional topic); ``value`` is the number that follows the target, if
    any; ``where`` the modes (:data:`FLEET`, :data:`JOBDIR`) that can carry
    it out; ``help`` one line for ``scrapy banker VERB -h`` and the docs.
    """

    name: str
    targets: tuple[str, ...]
    value: Value | None = None
    where: frozenset[str] = frozenset({FLEET, JOBDIR})
    help: str = ""

    @property
    def takes_value(self) -> bool:
        return self.value is not None

    @property
    def takes_urls(self) -> bool:
        """Its arguments are URLs (one or more), with an optional topic."""
        return URL in self.targets

    @property
    def takes_host(self) -> bool:
        """A HOST is one of its targets (``--force`` acts on one the crawl does not know)."""
        return HOST in self.targets

    def available(self, where: str | None) -> bool:
        """Can ``where`` (None: anywhere) carry it out?"""
        return where is None or where in self.where

    @property
    def target_usage(self) -> str:
        """``HOST or topic:NAME``, ``HOST, topic:NAME or crawl``, ``URL...``."""
        return _either([_TARGET_WORDS[k][0] for k in self.targets])

    @property
    def usage(self) -> str:
        """What it takes, in words: ``HOST, topic:NAME or crawl, then N (>= 0) or none``."""
        if self.value is None:
            return self.target_usage
        return f"{self.target_usage}, then {self.value.usage}"

    @property
    def synopsis(self) -> str:
        """Its arguments on a command line: ``HOST|topic:NAME|crawl N|none``."""
        targets = "|".join(_TARGET_WORDS[k][1] for k in self.targets)
        return targets if self.value is None else f"{targets} {self.value.synopsis}"

    def to_json(self, where: str | None = None) -> dict[str, Any]:
        """What a form needs to offer it: words, placeholders, and whether ``where`` has it."""
        return {
            "name": self.name,
            "usage": self.usage,
            "help": self.help,
            "takes_value": self.takes_value,
            "takes_urls": self.takes_urls,
            "takes_host": self.takes_host,
            "target_hint": _either([_TARGET_WORDS[k][2] for k in self.targets]),
            "value_hint": (
                self.value.usage if self.value else "topic (optional)" if self.takes_urls else ""
            ),
            "where": sorted(self.where),
            "available": self.available(where),
        }


def _either(words: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


#: What an operator may do: each verb by name, in the order the command line,
#: the dashboard and the docs list them.  A verb's effect on the directives is
#: :meth:`ControlState.apply`'s.
VERBS: Mapping[str, Verb] = {
    verb.name: verb
    for verb in (
        Verb("pause", (HOST, TOPIC),
             help="Pause a host or topic:NAME (its requests stay queued)"),
        Verb("resume", (HOST, TOPIC),
             help="Resume a paused host or topic:NAME"),
        Verb("limit", (HOST,), Value("N", integer=True, least=1, most=10_000),
             help="Set how many requests a host may have in flight (N, or none)"),
        Verb("delay", (HOST,), Value("SECONDS", integer=False, least=0, most=86_400, none=False),
             help="Set the least seconds between two requests to a host (0 removes it)"),
        Verb("budget", (HOST, TOPIC, CRAWL), Value("N", integer=True, least=0, most=10**12),
             help="Set the pages a HOST, topic:NAME or the crawl may be fetched (N, or none)"),
        Verb("purge", (HOST,), where=frozenset({FLEET}),
             help="Move a host's queued requests to the dead letters (reason 'purged')"),
        Verb("inject", (URL,), where=frozenset({FLEET}),
             help="Queue seed URLs in the running fleet (deduplicated), optionally with --topic"),
    )
}  # fmt: skip


def verbs_in(where: str | None = None) -> tuple[Verb, ...]:
    """The verbs ``where`` (:data:`FLEET`, :data:`JOBDIR`; None: any) can carry out."""
    return tuple(v for v in VERBS.values() if v.available(where))


def get_verb(name: str, where: str | None = None) -> Verb:
    """The verb ``name``, if ``where`` can carry it out; else :class:`ControlError` saying why."""
    verb = VERBS.get(name)
    if verb is None:
        allowed = ", ".join(v.name for v in verbs_in(where))
        raise ControlError(f"unknown action {name!r}; allowed: {allowed}")
    if not verb.available(where):
        assert where is not None
        raise ControlError(_unavailable(verb, where))
    return verb


def _unavailable(verb: Verb, where: str) -> str:
    """Why ``where`` cannot carry ``verb`` out, in one line."""
    if where == JOBDIR:
        return (
            f"{verb.name}: a single process's queue is its own memory; {verb.name} needs a "
            "crawl that runs on Redis (the BankerRedisScheduler)"
        )
    modes = " or ".join(WHERE.get(w, w) for w in sorted(verb.where))
    return f"{verb.name}: not available on {WHERE.get(where, where)}; it needs {modes}"


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
        """The action in words, as the log and the command's answer show it."""
        verb = VERBS.get(self.verb)
        # A verb this version does not know (read from another one's log): what it holds.
        if verb.takes_urls if verb is not None else bool(self.urls):
            topic = f" (topic {self.topic})" if self.topic else ""
            return f"{self.verb} {len(self.urls)} URL(s){topic}"
        takes_value = verb.takes_value if verb is not None else self.value is not None
        value = (" none" if self.value is None else f" {_shown(self.value)}") if takes_value else ""
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


#: Plain ASCII decimals only: Python's int() and float() also take '1_000', ' ٣ ',
#: 'nan', 'infinity' and '0x10'-like spellings an operator never means.
_INTEGER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number(verb: str, text: str, kind: Value) -> float | None:
    """The value of ``verb``: an integer or finite seconds in ``kind``'s range (None: removed)."""
    if kind.none and text.lower() == "none":
        return None
    integer, least, most = kind.integer, kind.least, kind.most
    allowed = f"an integer >= {int(least)}" if integer else f"a number of seconds >= {least:g}"
    if kind.none:
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
    where: str | None = None,
) -> Action:
    """An :class:`Action` from an operator's words, or :class:`ControlError`.

    ``topics``: the crawl's topic names (None: not checked).  ``topic``:
    the topic of a verb that takes URLs (``inject``).  ``check_url(url)``
    raises ``ValueError`` for a URL the crawl cannot fetch.  ``where``
    (:data:`FLEET`, :data:`JOBDIR`; None: not checked) refuses a verb that
    mode cannot carry out.  What each verb takes is its :data:`VERBS` entry.
    """
    spec = get_verb(verb, where)
    usage = f"{verb} takes {spec.usage}"
    if spec.takes_urls:
        if not args:
            raise ControlError(f"{usage}: give at least one URL")
        if topic is not None:
            _topic(verb, topic, topics)
        for url in args:
            if check_url is not None:
                try:
                    check_url(url)
                except ValueError as exc:
                    raise ControlError(f"{verb}: URL {url!r} cannot be fetched: {exc}") from None
        return Action(verb, urls=tuple(args), topic=topic)
    want = 1 if spec.value is None else 2
    if len(args) != want:
        raise ControlError(f"{usage}; got {len(args)} argument(s): {' '.join(args)!r}")
    target = args[0]
    if target == CRAWL:
        if CRAWL not in spec.targets:
            of = " and ".join(v.name for v in VERBS.values() if CRAWL in v.targets)
            raise ControlError(f"{verb}: 'crawl' is only a target of {of}")
    elif target.startswith("topic:"):
        if TOPIC not in spec.targets:
            raise ControlError(f"{verb}: takes a {spec.target_usage}, not a topic ({usage})")
        target = "topic:" + _topic(verb, target[6:], topics)
    elif HOST not in spec.targets:
        raise ControlError(f"{verb}: takes {spec.target_usage}, not a HOST ({usage})")
    else:
        target = _host_argument(target)
    if spec.value is None:
        return Action(verb, target)
    return Action(verb, target, _number(verb, args[1], spec.value))


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
