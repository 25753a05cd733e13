"""``BANKER_*`` settings: the one table of names, defaults and parsers.

Each setting is declared exactly once, as a field of the frozen dataclass of
the component that reads it (:class:`BankerConfig`, :class:`RedisConfig`,
:class:`PlacementConfig`): name, default, parser and documentation group.
:data:`DEFAULTS`, the loaders and the documentation test all walk those
fields, so adding a setting means one line here and one section in
``docs/settings.rst`` -- defaults and checks cannot drift apart.

A bad value is reported at start-up with the setting's name, the value it got
and what is allowed, instead of surfacing as an obscure failure hours into a
crawl: a :class:`~scrapy_banker.errors.BankerConfigError` (a ``ValueError``),
which a crawl reports as one line (:mod:`scrapy_banker.errors`).  Components
go through :func:`core_config`, :func:`redis_config` and
:func:`placement_config`, which parse once per crawler, so a crawl validates
its settings once however many components read them.  This module
deliberately imports nothing from Scrapy: it only needs an object with
``get()``, which both :class:`scrapy.settings.Settings` and a plain ``dict``
provide, so the validation is testable without a crawler.
"""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from scrapy_banker.core.directives import BudgetRules
from scrapy_banker.core.hashing import KEY_POLICIES
from scrapy_banker.core.politeness import PolitenessConfig
from scrapy_banker.core.recrawl import ESTIMATORS, SIGNATURES, RecrawlPolicy, RecrawlRule
from scrapy_banker.core.topics import TopicSpec
from scrapy_banker.errors import BankerConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "DEFAULTS",
    "SETTINGS",
    "BankerConfig",
    "OpsConfig",
    "PlacementConfig",
    "RedisConfig",
    "Setting",
    "SettingsLike",
    "TopicRule",
    "core_config",
    "load_config",
    "load_ops_config",
    "load_placement_config",
    "load_redis_config",
    "ops_config",
    "placement_config",
    "redis_config",
]

_T = TypeVar("_T")


class SettingsLike(Protocol):
    def get(self, name: str, default: Any = None) -> Any: ...


class CrawlerLike(Protocol):
    """What the per-crawler loaders read of a crawler: only its settings.

    :class:`~scrapy_banker.testing.resolver.FarmResolver` hands in Scrapy's
    ``CrawlerProcess`` as its "crawler", so nothing more may be assumed.
    """

    @property
    def settings(self) -> SettingsLike: ...


#: Section of ``docs/settings.rst`` a setting is documented in (a test checks it).
Group = Literal[
    "general",
    "topics",
    "queue",
    "politeness",
    "budgets",
    "recrawl",
    "admission",
    "redis",
    "placement",
    "operations",
    "testing",
]


@dataclass(frozen=True)
class Context:
    """What a parser may read besides its own value.

    A few settings only make sense relative to others: a topic's default slice
    is ``BANKER_TOPIC_SLICE``, task claims are bounded by ``BANKER_RESOURCES``,
    two defaults follow Scrapy's ``CONCURRENT_REQUESTS``, and the Redis key
    prefix names the spider.
    """

    settings: SettingsLike
    spider: str = "spider"

    def raw(self, name: str) -> Any:
        """The value as given; unset (or ``None``) means the table's default."""
        value = self.settings.get(name, None)
        return DEFAULTS[name] if value is None else value

    def parsed(self, name: str) -> Any:
        """Another setting, through its own parser, so its errors name it."""
        return SETTINGS[name].parse(name, self.raw(name), self)

    def concurrent_requests(self) -> Any:
        """Scrapy's ``CONCURRENT_REQUESTS`` (its default, 16, when read from a dict)."""
        value = self.settings.get("CONCURRENT_REQUESTS", None)
        return 16 if value is None else value


Parser = Callable[[str, Any, Context], _T]


@dataclass(frozen=True)
class Setting:
    """One row of the table; stored in the metadata of its config field."""

    name: str
    default: Any
    parse: Parser[Any]
    group: Group


_META = "banker_setting"


def setting(name: str, default: Any, parse: Parser[_T], *, group: Group) -> _T:
    """Declare a config field as the setting ``name``.

    The field's own default is ``default`` parsed, so ``BankerConfig()`` is the
    configuration of an empty settings object and the default is written once.
    """
    return field(
        default_factory=lambda: parse(name, default, Context({})),
        metadata={_META: Setting(name, default, parse, group)},
    )


_TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TOPIC_KEYS = frozenset({"priority", "slice", "target", "budget"})
_RULE_KEYS = frozenset({"url", "callback", "topic"})


def _bad(name: str, value: Any, allowed: str) -> BankerConfigError:
    return BankerConfigError(f"Invalid {name}={value!r}: {allowed}")


def _as_topic_name(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _TOPIC_NAME_RE.match(value):
        raise _bad(name, value, "a topic name is 1-64 characters of letters, digits, '_', '.', '-'")
    return value


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise _bad(name, value, "expected an integer")
    return value


def _as_float(name: str, value: Any, minimum: float, *, strict: bool = True) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise _bad(name, value, "expected a number") from None
    if not math.isfinite(number) or (number <= minimum if strict else number < minimum):
        # Infinity is refused too: every float setting is a rate, a duration or a
        # fraction that later becomes an int or a timer, where inf would crash mid-crawl.
        raise _bad(name, value, f"expected a finite number {'>' if strict else '>='} {minimum}")
    return number


def _as_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    number = _as_int(name, value)
    if number < minimum:
        raise _bad(name, value, f"expected an integer >= {minimum}")
    return number


def _json_if_str(name: str, value: Any) -> Any:
    """Values given on the command line (-s NAME=...) arrive as JSON strings."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise _bad(name, value, f"not valid JSON ({exc})") from None
    return value


# -- parsers of the table: (name, raw value, context) -> validated value ---------------


def boolean(name: str, value: Any, ctx: Context) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"1", "0", "true", "false"}:
        return value.strip().lower() in {"1", "true"}
    raise _bad(name, value, "expected a boolean (True/False, 1/0, 'true'/'false')")


def positive_float(name: str, value: Any, ctx: Context) -> float:
    return _as_float(name, value, 0.0)


def non_negative_float(name: str, value: Any, ctx: Context) -> float:
    return _as_float(name, value, 0.0, strict=False)


def int_at_least(minimum: int) -> Parser[int]:
    def parse(name: str, value: Any, ctx: Context) -> int:
        return _as_positive_int(name, value, minimum)

    return parse


def one_of(*allowed: str) -> Parser[str]:
    def parse(name: str, value: Any, ctx: Context) -> str:
        if value not in allowed:
            raise _bad(name, value, f"allowed: {sorted(allowed)}")
        return str(value)

    return parse


def placement_choice(attr: Literal["MODES", "CHOICES", "COSTS"]) -> Parser[str]:
    """Allowed values are read from :mod:`scrapy_banker.net.placement` when parsing.

    Its registry of strategies is the one list of modes; it (and numpy) is
    imported only to check a value other than the default, so a crawl that
    leaves placement alone never carries numpy's objects (every full garbage
    collection of the crawl would scan them).
    """

    def parse(name: str, value: Any, ctx: Context) -> str:
        if value == DEFAULTS[name]:
            return str(value)
        from scrapy_banker.net import placement

        allowed: tuple[str, ...] = getattr(placement, attr)
        if value not in allowed:
            raise _bad(name, value, f"expected one of {', '.join(allowed)}")
        return str(value)

    return parse


def topic_name(name: str, value: Any, ctx: Context) -> str:
    return _as_topic_name(name, value)


def _optional_path(name: str, value: Any, ctx: Context) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _bad(name, value, "expected a file path string or None")
    return value


def _optional_port(name: str, value: Any, ctx: Context) -> int | None:
    if value is None:
        return None
    # -s BANKER_METRICS_PORT=0: the command line gives strings.
    port = int(value) if isinstance(value, str) and value.strip().isdecimal() else value
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise _bad(name, value, "expected a TCP port 0-65535 (0: any free port) or None (off)")
    return port


def _bind_address(name: str, value: Any, ctx: Context) -> str:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except (TypeError, ValueError):
        raise _bad(name, value, "expected an IP address such as '127.0.0.1' or '0.0.0.0'") from None
    return str(value)


def _optional_token(name: str, value: Any, ctx: Context) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) < 16 or not value.isprintable():
        # Never echo a secret (even a bad one) into a log or a terminal.
        shown = (
            f"<{type(value).__name__} of length {len(value)}>"
            if isinstance(value, str)
            else (f"<{type(value).__name__}>")
        )
        raise BankerConfigError(
            f"Invalid {name}={shown}: expected None (no actions) or a printable string "
            "of 16+ characters"
        )
    return value


def _dns_suffix(name: str, value: Any, ctx: Context) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*", value):
        raise _bad(name, value, "expected a lower-case DNS suffix like 'farm.test'")
    return value


def _class_paths(name: str, value: Any, ctx: Context) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [c for c in value.split(",") if c.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) for c in value):
        raise _bad(name, value, "expected a list of import path strings")
    return tuple(c.strip() for c in value)


def _http_codes(name: str, value: Any, ctx: Context) -> frozenset[int]:
    """A non-empty list of HTTP statuses; ``-s NAME=429,503`` or JSON on the command line."""
    if isinstance(value, str):
        text = value.strip()
        value = _json_if_str(name, text) if text.startswith("[") else text.split(",")
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise _bad(name, value, "expected a list of HTTP status codes, e.g. [429, 503]")
    codes = set()
    for code in value:
        try:
            number = _as_int(name, code.strip() if isinstance(code, str) else code)
        except ValueError:
            raise _bad(name, value, f"{code!r} is not an HTTP status code (100-599)") from None
        if not 100 <= number <= 599:
            raise _bad(name, value, f"{number} is not an HTTP status code (100-599)")
        codes.add(number)
    if not codes:
        raise _bad(name, value, "expected at least one status code (BANKER_PUSHBACK=False: none)")
    return frozenset(codes)


def _directory_depth(name: str, value: Any, ctx: Context) -> int:
    depth = _as_positive_int(name, value, 0)
    if depth > 24:
        raise _bad(name, depth, "expected an integer from 0 to 24")
    return depth


@dataclass(frozen=True)
class TopicRule:
    """One ``BANKER_TOPIC_RULES`` entry, compiled once at start-up."""

    topic: str
    url: re.Pattern[str] | None = None
    callback: str | None = None

    def matches(self, url: str, callback_name: str | None) -> bool:
        if self.url is not None and self.url.search(url) is None:
            return False
        return not (self.callback is not None and self.callback != callback_name)


def _topics(name: str, value: Any, ctx: Context) -> dict[str, TopicSpec]:
    default_slice: float = ctx.parsed("BANKER_TOPIC_SLICE")
    value = _json_if_str(name, value)  # -s BANKER_TOPICS='{"news": 10}'
    if not isinstance(value, Mapping):
        raise _bad(name, value, 'expected a dict of topic -> priority, e.g. {"news": 10}')
    out: dict[str, TopicSpec] = {}
    for topic, spec in value.items():
        where = f"{name}[{topic!r}]"
        _as_topic_name(where, topic)
        if not isinstance(spec, Mapping):
            try:
                spec = {"priority": _as_int(where, spec)}
            except ValueError:
                keys = sorted(_TOPIC_KEYS)
                allowed = f"expected an integer priority, or a dict with keys from {keys}"
                raise _bad(where, spec, allowed) from None
        unknown = set(spec) - _TOPIC_KEYS
        if unknown:
            raise _bad(
                where, spec, f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOPIC_KEYS)}"
            )
        target = spec.get("target")
        budget = spec.get("budget")
        if budget is not None:
            _as_positive_int(f"{where}['budget']", budget, 0)
        out[topic] = TopicSpec(
            name=topic,
            priority=_as_int(f"{where}['priority']", spec.get("priority", 0)),
            slice_s=_as_float(f"{where}['slice']", spec.get("slice", default_slice), 0.0),
            target=None if target is None else _as_positive_int(f"{where}['target']", target, 0),
            budget=None if budget is None else _as_positive_int(f"{where}['budget']", budget, 0),
        )
    return out


def _rule_url(where: str, raw: Mapping[str, Any]) -> re.Pattern[str] | None:
    """A rule's ``"url"``, compiled (None: the rule has none)."""
    if "url" not in raw:
        return None
    if not isinstance(raw["url"], str):
        raise _bad(where, raw, "'url' must be a regular expression string")
    try:
        return re.compile(raw["url"])
    except re.error as exc:
        raise _bad(where, raw, f"'url' is not a valid regular expression ({exc})") from None


def _topic_rules(name: str, value: Any, ctx: Context) -> tuple[TopicRule, ...]:
    value = _json_if_str(name, value)
    if not isinstance(value, (list, tuple)):
        raise _bad(name, value, 'expected a list of {"url": regex, "topic": name} dicts')
    rules: list[TopicRule] = []
    for i, raw in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(raw, Mapping):
            raise _bad(where, raw, 'expected a dict like {"url": "/news/", "topic": "news"}')
        unknown = set(raw) - _RULE_KEYS
        if unknown:
            raise _bad(
                where, raw, f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_RULE_KEYS)}"
            )
        if "topic" not in raw:
            raise _bad(where, raw, "missing 'topic'")
        if "url" not in raw and "callback" not in raw:
            raise _bad(where, raw, "needs 'url' (a regex) and/or 'callback' (a method name)")
        pattern = _rule_url(where, raw)
        callback = raw.get("callback")
        if callback is not None and (not isinstance(callback, str) or not callback.isidentifier()):
            raise _bad(where, raw, "'callback' must be a spider method name")
        rules.append(
            TopicRule(topic=_as_topic_name(where, raw["topic"]), url=pattern, callback=callback)
        )
    return tuple(rules)


def _parse_vector(name: str, value: Any, known: Mapping[str, int] | None) -> dict[str, int]:
    value = _json_if_str(name, value)
    if not isinstance(value, Mapping):
        raise _bad(name, value, 'expected a dict of resource -> int, e.g. {"browser_pages": 4}')
    out: dict[str, int] = {}
    for res, amount in value.items():
        where = f"{name}[{res!r}]"
        if not isinstance(res, str) or not _TOPIC_NAME_RE.match(res):
            raise _bad(where, res, "a resource name is 1-64 letters, digits, '_', '.', '-'")
        if known is not None and res not in known:
            raise _bad(where, amount, f"unknown resource; BANKER_RESOURCES has {sorted(known)}")
        out[res] = _as_positive_int(where, amount, 0)
        if known is not None and out[res] > known[res]:
            raise _bad(
                where, amount, f"above the total of {res!r} ({known[res]}): never admissible"
            )
    return out


def _resources(name: str, value: Any, ctx: Context) -> dict[str, int]:
    value = _json_if_str(name, value)
    if isinstance(value, Mapping) and value.get("slots", 0) is None:
        # "slots": None -> as many as Scrapy may download at once.
        value = {**value, "slots": ctx.concurrent_requests()}
    return _parse_vector(name, value, None)


def _task_claims(name: str, value: Any, ctx: Context) -> dict[str, dict[str, int]]:
    resources: dict[str, int] = ctx.parsed("BANKER_RESOURCES")
    value = _json_if_str(name, value)
    if not isinstance(value, Mapping):
        raise _bad(name, value, 'expected topic -> {resource: int}, e.g. {"shop": {"sessions": 1}}')
    return {
        _as_topic_name(f"{name}[{t!r}]", t): _parse_vector(f"{name}[{t!r}]", c, resources)
        for t, c in value.items()
    }


def _redis_prefix(name: str, value: Any, ctx: Context) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(name, value, "expected a non-empty string")
    try:
        prefix = value % {"spider": ctx.spider}
    except (KeyError, ValueError, TypeError) as exc:
        raise _bad(name, value, f"only %(spider)s may be interpolated ({exc})") from None
    if "{" in prefix or "}" in prefix:
        raise _bad(name, value, "braces are reserved for hash tags")
    return prefix


def _node_id(name: str, value: Any, ctx: Context) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or "@" in value):
        raise _bad(name, value, "expected a non-empty string without '@'")
    return value


def _redis_buffer(name: str, value: Any, ctx: Context) -> int:
    if value is None:  # twice as many as Scrapy may download at once
        return 2 * _as_positive_int("CONCURRENT_REQUESTS", ctx.concurrent_requests())
    return _as_positive_int(name, value)


def _dedup_error(name: str, value: Any, ctx: Context) -> float:
    """A Bloom filter's target false-positive rate: above 0.5 it filters nothing useful."""
    number = _as_float(name, value, 0.0)
    if number >= 0.5:
        raise _bad(name, value, "expected a false-positive rate in (0, 0.5), e.g. 0.001")
    return number


def _connect_timeout(name: str, value: Any, ctx: Context) -> float:
    """Seconds a worker waits for Redis at start-up; 0 waits forever (its thread retries)."""
    try:
        return _as_float(name, value, 0.0, strict=False)
    except ValueError:
        raise _bad(name, value, "expected seconds >= 0 (0: wait forever), e.g. 30") from None


def _optional_budget(name: str, value: Any, ctx: Context) -> int | None:
    """Pages: None (no budget) or an integer >= 0."""
    if value is None:
        return None
    try:
        return _as_positive_int(name, value, 0)
    except ValueError:
        raise _bad(name, value, "expected None (no budget) or a number of pages >= 0") from None


def _optional_seconds(name: str, value: Any, ctx: Context) -> float | None:
    if value is None:
        return None
    return _as_float(name, value, 0.0)


_RECRAWL_RULE_KEYS = frozenset({
    "url", "topic", "recrawl", "interval", "min_interval", "max_interval", "error_interval",
    "max_stale",
})  # fmt: skip
#: A rule's key -> the :class:`RecrawlPolicy` field it sets (the policy's errors are
#: worded with the fields, and read back in the rule's words).
_RECRAWL_RULE_FIELDS = {
    "max_stale": "max_stale_s", "interval": "interval_s", "error_interval": "error_s",
    "min_interval": "min_s", "max_interval": "max_s",
}  # fmt: skip


def _recrawl_host_rate(name: str, value: Any, ctx: Context) -> float | None:
    """Fetches per second per host; None: ``1 / DOWNLOAD_DELAY`` where that is set."""
    if value is not None:
        return _as_float(name, value, 0.0)
    delay = ctx.settings.get("DOWNLOAD_DELAY", None)
    try:
        delay = float(delay) if delay is not None else 0.0
    except (TypeError, ValueError):
        return None  # Scrapy reports its own setting
    return 1.0 / delay if delay > 0 and math.isfinite(delay) else None


def _recrawl_rules(name: str, value: Any, ctx: Context) -> tuple[RecrawlRule, ...]:
    """``[{"url": regex, "topic": name, "interval": s, ..., "recrawl": bool}]``: per-page
    revisit intervals; what a rule leaves out is the ``BANKER_RECRAWL_*`` setting's."""
    value = _json_if_str(name, value)
    if not isinstance(value, (list, tuple)):
        raise _bad(name, value, 'expected a list of dicts like {"url": "/news/", "interval": 600}')
    base: dict[str, Any] = {
        "interval_s": ctx.parsed("BANKER_RECRAWL_INTERVAL"),
        "min_s": ctx.parsed("BANKER_RECRAWL_MIN_INTERVAL"),
        "max_s": ctx.parsed("BANKER_RECRAWL_MAX_INTERVAL"),
        "error_s": ctx.parsed("BANKER_RECRAWL_ERROR_INTERVAL"),
        "max_stale_s": ctx.parsed("BANKER_RECRAWL_MAX_STALE"),
        "estimator": ctx.parsed("BANKER_RECRAWL_ESTIMATOR"),
    }
    rules = []
    for i, raw in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(raw, Mapping):
            raise _bad(where, raw, 'expected a dict like {"url": "/news/", "interval": 600}')
        unknown = set(raw) - _RECRAWL_RULE_KEYS
        if unknown:
            allowed = sorted(_RECRAWL_RULE_KEYS)
            raise _bad(where, raw, f"unknown key(s) {sorted(unknown)}; allowed: {allowed}")
        if "url" not in raw and "topic" not in raw:
            raise _bad(where, raw, "needs 'url' (a regex) and/or 'topic' (a topic name)")
        pattern = _rule_url(where, raw)
        topic = _as_topic_name(f"{where}['topic']", raw["topic"]) if "topic" in raw else None
        recrawl = boolean(f"{where}['recrawl']", raw.get("recrawl", True), ctx)
        fields = dict(base)
        for key, field_name in _RECRAWL_RULE_FIELDS.items():
            if key in raw:
                parse = _optional_seconds if key == "max_stale" else positive_float
                fields[field_name] = parse(f"{where}[{key!r}]", raw[key], ctx)
        try:
            policy = RecrawlPolicy(**fields)
        except ValueError as exc:
            words = str(exc)
            for key, field_name in _RECRAWL_RULE_FIELDS.items():
                words = re.sub(rf"\b{field_name}\b", key, words)
            raise _bad(where, raw, words) from None
        rules.append(RecrawlRule(policy if recrawl else None, pattern, topic))
    return tuple(rules)


def _host_budgets(name: str, value: Any, ctx: Context) -> tuple[tuple[str, int], ...]:
    """``{pattern: pages}``: host names or ``fnmatch`` patterns such as ``*.example.com``."""
    value = _json_if_str(name, value)
    if not isinstance(value, Mapping):
        raise _bad(name, value, 'expected a dict of host pattern -> pages, e.g. {"*.gov": 100}')
    out = []
    for pattern, pages in value.items():
        if (
            not isinstance(pattern, str)
            or not pattern
            or "/" in pattern
            or pattern != pattern.strip().lower()
        ):
            raise _bad(
                name, pattern,
                "a key is a lower-case host name or pattern such as 'example.com' or "
                "'*.example.com' (no scheme, no path)",
            )  # fmt: skip
        try:
            out.append((pattern, _as_positive_int(f"{name}[{pattern!r}]", pages, 0)))
        except ValueError:
            raise _bad(f"{name}[{pattern!r}]", pages, "expected a number of pages >= 0") from None
    return tuple(out)


def _probe_path(name: str, value: Any, ctx: Context) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise _bad(name, value, "expected a path starting with '/'")
    return value


# -- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BankerConfig:
    """Validated view of the ``BANKER_*`` settings the single-process suite reads."""

    enabled: bool = setting("BANKER_ENABLED", True, boolean, group="general")
    topics: Mapping[str, TopicSpec] = setting("BANKER_TOPICS", {}, _topics, group="topics")
    topic_rules: tuple[TopicRule, ...] = setting(
        "BANKER_TOPIC_RULES", [], _topic_rules, group="topics"
    )
    default_topic: str = setting("BANKER_DEFAULT_TOPIC", "default", topic_name, group="topics")
    topic_slice: float = setting("BANKER_TOPIC_SLICE", 1.0, positive_float, group="topics")
    topic_min_slice: float = setting("BANKER_TOPIC_MIN_SLICE", 0.1, positive_float, group="topics")
    topic_slice_step: float = setting(
        "BANKER_TOPIC_SLICE_STEP", 0.1, positive_float, group="topics"
    )
    topic_adjust_interval: float = setting(
        "BANKER_TOPIC_ADJUST_INTERVAL", 10.0, non_negative_float, group="topics"
    )
    topic_max_wait: float = setting("BANKER_TOPIC_MAX_WAIT", 30.0, positive_float, group="topics")
    queue_key: str = setting("BANKER_QUEUE_KEY", "host", one_of(*KEY_POLICIES), group="queue")
    queue_hash: str = setting("BANKER_QUEUE_HASH", "bkdr", one_of("bkdr", "mmh3"), group="queue")
    bucket_capacity: int = setting("BANKER_BUCKET_CAPACITY", 1024, int_at_least(1), group="queue")
    directory_max_depth: int = setting(
        "BANKER_DIRECTORY_MAX_DEPTH", 16, _directory_depth, group="queue"
    )
    cache_bucket_size: int = setting(
        "BANKER_CACHE_BUCKET_SIZE", 4096, int_at_least(0), group="queue"
    )
    serialize_allowed_classes: tuple[str, ...] = setting(
        "BANKER_SERIALIZE_ALLOWED_CLASSES", [], _class_paths, group="queue"
    )
    pacing: bool = setting("BANKER_PACING", True, boolean, group="queue")
    pacing_backlog: int = setting("BANKER_PACING_BACKLOG", 2, int_at_least(1), group="queue")
    pushback: bool = setting("BANKER_PUSHBACK", True, boolean, group="politeness")
    pushback_codes: frozenset[int] = setting(
        "BANKER_PUSHBACK_CODES", [429, 503], _http_codes, group="politeness"
    )
    pushback_backoff: float = setting(
        "BANKER_PUSHBACK_BACKOFF", 2.0, positive_float, group="politeness"
    )
    pushback_backoff_max: float = setting(
        "BANKER_PUSHBACK_BACKOFF_MAX", 600.0, positive_float, group="politeness"
    )
    pushback_max_refusals: int = setting(
        "BANKER_PUSHBACK_MAX_REFUSALS", 20, int_at_least(1), group="politeness"
    )
    crawl_delay_max: float = setting(
        "BANKER_CRAWL_DELAY_MAX", 60.0, non_negative_float, group="politeness"
    )
    host_budget: int | None = setting("BANKER_HOST_BUDGET", None, _optional_budget, group="budgets")
    host_budgets: tuple[tuple[str, int], ...] = setting(
        "BANKER_HOST_BUDGETS", {}, _host_budgets, group="budgets"
    )
    crawl_budget: int | None = setting(
        "BANKER_CRAWL_BUDGET", None, _optional_budget, group="budgets"
    )
    recrawl: bool = setting("BANKER_RECRAWL", False, boolean, group="recrawl")
    recrawl_interval: float = setting(
        "BANKER_RECRAWL_INTERVAL", 86_400.0, positive_float, group="recrawl"
    )
    recrawl_min_interval: float = setting(
        "BANKER_RECRAWL_MIN_INTERVAL", 3_600.0, positive_float, group="recrawl"
    )
    recrawl_max_interval: float = setting(
        "BANKER_RECRAWL_MAX_INTERVAL", 1_209_600.0, positive_float, group="recrawl"
    )
    recrawl_error_interval: float = setting(
        "BANKER_RECRAWL_ERROR_INTERVAL", 3_600.0, positive_float, group="recrawl"
    )
    recrawl_max_stale: float | None = setting(
        "BANKER_RECRAWL_MAX_STALE", None, _optional_seconds, group="recrawl"
    )
    recrawl_signature: str = setting(
        "BANKER_RECRAWL_SIGNATURE", "body", one_of(*SIGNATURES), group="recrawl"
    )
    recrawl_not_modified: str = setting(
        "BANKER_RECRAWL_NOT_MODIFIED", "skip", one_of("skip", "callback"), group="recrawl"
    )
    recrawl_stay_open: bool = setting("BANKER_RECRAWL_STAY_OPEN", False, boolean, group="recrawl")
    recrawl_rules: tuple[RecrawlRule, ...] = setting(
        "BANKER_RECRAWL_RULES", [], _recrawl_rules, group="recrawl"
    )
    recrawl_estimator: str = setting(
        "BANKER_RECRAWL_ESTIMATOR", "adaptive", one_of(*ESTIMATORS), group="recrawl"
    )
    recrawl_host_rate: float | None = setting(
        "BANKER_RECRAWL_HOST_RATE", None, _recrawl_host_rate, group="recrawl"
    )
    resources: Mapping[str, int] = setting("BANKER_RESOURCES", {}, _resources, group="admission")
    task_claims: Mapping[str, Mapping[str, int]] = setting(
        "BANKER_TASK_CLAIMS", {}, _task_claims, group="admission"
    )
    task_timeout: float = setting("BANKER_TASK_TIMEOUT", 300.0, positive_float, group="admission")
    admission_policy: str = setting(
        "BANKER_ADMISSION_POLICY", "banker", one_of("banker", "naive"), group="admission"
    )
    redis_retries: int = setting("BANKER_REDIS_RETRIES", 5, int_at_least(0), group="redis")
    redis_backoff_cap: float = setting(
        "BANKER_REDIS_BACKOFF_CAP", 2.0, positive_float, group="redis"
    )
    stats_file: str | None = setting("BANKER_STATS_FILE", None, _optional_path, group="general")
    farm_domain: str = setting("BANKER_FARM_DOMAIN", "farm.test", _dns_suffix, group="testing")

    def _check(self) -> None:
        """Rules between settings, once each is valid on its own."""
        floor = self.topic_min_slice
        if self.topic_slice < floor:
            raise _bad(
                "BANKER_TOPIC_SLICE",
                self.topic_slice,
                f"must be >= BANKER_TOPIC_MIN_SLICE ({floor})",
            )
        if self.pushback_backoff_max < self.pushback_backoff:
            raise _bad(
                "BANKER_PUSHBACK_BACKOFF_MAX",
                self.pushback_backoff_max,
                f"must be >= BANKER_PUSHBACK_BACKOFF ({self.pushback_backoff})",
            )
        if not self.recrawl_min_interval <= self.recrawl_interval <= self.recrawl_max_interval:
            raise _bad(
                "BANKER_RECRAWL_INTERVAL",
                self.recrawl_interval,
                f"must lie between BANKER_RECRAWL_MIN_INTERVAL ({self.recrawl_min_interval}) "
                f"and BANKER_RECRAWL_MAX_INTERVAL ({self.recrawl_max_interval})",
            )
        if self.recrawl_estimator == "poisson" and self.recrawl_host_rate is None:
            raise _bad(
                "BANKER_RECRAWL_ESTIMATOR",
                self.recrawl_estimator,
                "plans revisits for a fetch rate: set BANKER_RECRAWL_HOST_RATE (fetches per "
                "second per host) or DOWNLOAD_DELAY",
            )
        stale = self.recrawl_max_stale
        if stale is not None and stale < self.recrawl_min_interval:
            raise _bad(
                "BANKER_RECRAWL_MAX_STALE",
                stale,
                f"must be None or >= BANKER_RECRAWL_MIN_INTERVAL ({self.recrawl_min_interval})",
            )
        for spec in self.topics.values():
            if spec.slice_s < floor:
                raise _bad(
                    f"BANKER_TOPICS[{spec.name!r}]['slice']",
                    spec.slice_s,
                    f"must be >= BANKER_TOPIC_MIN_SLICE ({floor})",
                )

    def politeness(self) -> PolitenessConfig:
        """The :class:`~scrapy_banker.core.politeness.Politeness` constants these settings give."""
        return PolitenessConfig(
            codes=self.pushback_codes,
            backoff_base_s=self.pushback_backoff,
            backoff_max_s=self.pushback_backoff_max,
            max_refusals=self.pushback_max_refusals,
            crawl_delay_max_s=self.crawl_delay_max,
        )

    def recrawl_policy(self) -> RecrawlPolicy:
        """The :class:`~scrapy_banker.core.recrawl.RecrawlPolicy` these settings give."""
        return RecrawlPolicy(
            interval_s=self.recrawl_interval,
            min_s=self.recrawl_min_interval,
            max_s=self.recrawl_max_interval,
            error_s=self.recrawl_error_interval,
            max_stale_s=self.recrawl_max_stale,
            estimator=self.recrawl_estimator,
        )

    def budgets(self) -> BudgetRules:
        """The :class:`~scrapy_banker.core.directives.BudgetRules` these settings give."""
        topics = {}
        raw = self.topics
        for name, spec in raw.items():
            if spec.budget is not None:
                topics[name] = spec.budget
        return BudgetRules(self.host_budget, self.host_budgets, topics, self.crawl_budget)

    def topic_names(self) -> frozenset[str]:
        """Every topic a request can get: the declared ones, the rules' and the default."""
        return frozenset(
            {*self.topics, *(rule.topic for rule in self.topic_rules), self.default_topic}
        )

    def topic_priority(self, topic: str) -> int:
        spec = self.topics.get(topic)
        return spec.priority if spec is not None else 0

    def topic_for(self, url: str, callback_name: str | None) -> str:
        """Topic of a request with no explicit ``banker_topic`` meta."""
        for rule in self.topic_rules:
            if rule.matches(url, callback_name):
                return rule.topic
        return self.default_topic


@dataclass(frozen=True)
class RedisConfig:
    """Validated view of the distributed-frontier settings (``BANKER_REDIS_*``)."""

    prefix: str = setting("BANKER_REDIS_PREFIX", "banker:%(spider)s", _redis_prefix, group="redis")
    partitions: int = setting("BANKER_REDIS_PARTITIONS", 1024, int_at_least(1), group="redis")
    cluster: bool = setting("BANKER_REDIS_CLUSTER", False, boolean, group="redis")
    lease_ttl: float = setting("BANKER_REDIS_LEASE_TTL", 60.0, positive_float, group="redis")
    max_deliveries: int = setting("BANKER_REDIS_MAX_DELIVERIES", 3, int_at_least(1), group="redis")
    node_id: str | None = setting("BANKER_REDIS_NODE_ID", None, _node_id, group="redis")
    node_capacity: float = setting("BANKER_REDIS_NODE_CAPACITY", 1.0, positive_float, group="redis")
    node_timeout: float = setting("BANKER_REDIS_NODE_TIMEOUT", 30.0, positive_float, group="redis")
    heartbeat: float = setting("BANKER_REDIS_HEARTBEAT", 2.0, positive_float, group="redis")
    reap_interval: float = setting("BANKER_REDIS_REAP_INTERVAL", 5.0, positive_float, group="redis")
    buffer: int = setting("BANKER_REDIS_BUFFER", None, _redis_buffer, group="redis")
    pop_per_partition: int = setting(
        "BANKER_REDIS_POP_PER_PARTITION", 4, int_at_least(1), group="redis"
    )
    idle_backoff_max: float = setting(
        "BANKER_REDIS_IDLE_BACKOFF_MAX", 2.0, positive_float, group="redis"
    )
    idle_before_close: float = setting(
        "BANKER_REDIS_IDLE_BEFORE_CLOSE", 0.0, non_negative_float, group="redis"
    )
    flush_on_start: bool = setting("BANKER_REDIS_FLUSH_ON_START", False, boolean, group="redis")
    steal: bool = setting("BANKER_REDIS_STEAL", True, boolean, group="redis")
    seen_cache: int = setting("BANKER_REDIS_SEEN_CACHE", 100_000, int_at_least(0), group="redis")
    connect_timeout: float = setting(
        "BANKER_REDIS_CONNECT_TIMEOUT", 30.0, _connect_timeout, group="redis"
    )
    spill_dir: str | None = setting("BANKER_REDIS_SPILL_DIR", None, _optional_path, group="redis")
    dedup: str = setting("BANKER_DEDUP", "set", one_of("set", "bloom"), group="redis")
    dedup_capacity: int = setting(
        "BANKER_DEDUP_CAPACITY", 100_000_000, int_at_least(1), group="redis"
    )
    dedup_error: float = setting("BANKER_DEDUP_ERROR", 0.001, _dedup_error, group="redis")
    robots_ttl: float = setting("BANKER_ROBOTS_TTL", 86400.0, positive_float, group="redis")

    def _check(self) -> None:
        """Rules between settings, once each is valid on its own."""
        if self.heartbeat * 2 > min(self.lease_ttl, self.node_timeout):
            raise _bad(
                "BANKER_REDIS_HEARTBEAT",
                self.heartbeat,
                f"must be at most half of BANKER_REDIS_LEASE_TTL ({self.lease_ttl}) and of "
                f"BANKER_REDIS_NODE_TIMEOUT ({self.node_timeout}), or leases and nodes expire "
                "between two heartbeats",
            )
        if self.dedup == "bloom":
            from scrapy_banker.core.bloom import MAX_BLOOM_BITS, bloom_geometry

            per_partition = -(-self.dedup_capacity // self.partitions)
            bits, _ = bloom_geometry(per_partition, self.dedup_error)
            if bits > MAX_BLOOM_BITS:
                raise _bad(
                    "BANKER_DEDUP_CAPACITY",
                    self.dedup_capacity,
                    f"needs {bits} bits per partition at BANKER_DEDUP_ERROR={self.dedup_error} "
                    f"with {self.partitions} partitions, more than a Redis string holds "
                    f"({MAX_BLOOM_BITS}): raise BANKER_REDIS_PARTITIONS",
                )


@dataclass(frozen=True)
class PlacementConfig:
    """Validated view of ``BANKER_PLACEMENT*``, ``BANKER_GNP_*`` and ``BANKER_PROBE_*``."""

    mode: str = setting("BANKER_PLACEMENT", "hash", placement_choice("MODES"), group="placement")
    topk: int = setting("BANKER_PLACEMENT_TOPK", 3, int_at_least(1), group="placement")
    topk_choice: str = setting(
        "BANKER_PLACEMENT_TOPK_CHOICE",
        "least_loaded",
        placement_choice("CHOICES"),
        group="placement",
    )
    cost: str = setting(
        "BANKER_PLACEMENT_COST", "latency", placement_choice("COSTS"), group="placement"
    )
    interval: float = setting("BANKER_PLACEMENT_INTERVAL", 10.0, positive_float, group="placement")
    tolerance: float = setting(
        "BANKER_PLACEMENT_TOLERANCE", 0.1, non_negative_float, group="placement"
    )
    dims: int = setting("BANKER_GNP_DIMS", 3, int_at_least(1), group="placement")
    landmark: bool = setting("BANKER_GNP_LANDMARK", False, boolean, group="placement")
    reference_sites: int = setting(
        "BANKER_GNP_REFERENCE_SITES", 8, int_at_least(1), group="placement"
    )
    measure: bool = setting("BANKER_NET_MEASURE", True, boolean, group="placement")
    window: int = setting("BANKER_NET_WINDOW", 64, int_at_least(3), group="placement")
    probe_rate: float = setting("BANKER_PROBE_RATE", 5.0, non_negative_float, group="placement")
    probe_samples: int = setting("BANKER_PROBE_SAMPLES", 3, int_at_least(1), group="placement")
    probe_path: str = setting("BANKER_PROBE_PATH", "/robots.txt", _probe_path, group="placement")
    storage_probe_bytes: int = setting(
        "BANKER_STORAGE_PROBE_BYTES", 100_000, int_at_least(1), group="placement"
    )

    def _check(self) -> None:
        """No rule between these settings."""


@dataclass(frozen=True)
class OpsConfig:
    """The operator's view: metrics, progress, the time-series record, the dashboard."""

    metrics_port: int | None = setting(
        "BANKER_METRICS_PORT", None, _optional_port, group="operations"
    )
    metrics_bind: str = setting(
        "BANKER_METRICS_BIND", "127.0.0.1", _bind_address, group="operations"
    )
    metrics_top_slots: int = setting(
        "BANKER_METRICS_TOP_SLOTS", 20, int_at_least(0), group="operations"
    )
    progress: bool = setting("BANKER_PROGRESS", False, boolean, group="operations")
    timeseries_file: str | None = setting(
        "BANKER_TIMESERIES_FILE", None, _optional_path, group="operations"
    )
    timeseries_interval: float = setting(
        "BANKER_TIMESERIES_INTERVAL", 1.0, positive_float, group="operations"
    )
    dashboard_token: str | None = setting(
        "BANKER_DASHBOARD_TOKEN", None, _optional_token, group="operations"
    )

    def _check(self) -> None:
        """No rule between these settings."""


# -- derived from the table --------------------------------------------------------------

_SECTIONS: tuple[type[DataclassInstance], ...] = (
    BankerConfig,
    RedisConfig,
    PlacementConfig,
    OpsConfig,
)

#: Every setting by name, in declaration order.
SETTINGS: dict[str, Setting] = {
    spec.name: spec
    for section in _SECTIONS
    for spec in (f.metadata[_META] for f in fields(section))
}
#: Default value of every ``BANKER_*`` setting.  Documented one by one in
#: ``docs/settings.rst``; a test keeps the two in sync.
DEFAULTS: dict[str, Any] = {name: spec.default for name, spec in SETTINGS.items()}


_S = TypeVar("_S", BankerConfig, RedisConfig, PlacementConfig, OpsConfig)


def _load(section: type[_S], ctx: Context) -> _S:
    """Parse each field's setting, in declaration order, then the section's cross rules."""
    values: dict[str, Any] = {}
    for f in fields(section):
        spec: Setting = f.metadata[_META]
        values[f.name] = spec.parse(spec.name, ctx.raw(spec.name), ctx)
    config = section(**values)
    config._check()
    return config


def load_config(settings: SettingsLike) -> BankerConfig:
    """Validate every ``BANKER_*`` setting; :class:`BankerConfigError` naming the culprit."""
    return _load(BankerConfig, Context(settings))


def load_redis_config(settings: SettingsLike, spider_name: str = "spider") -> RedisConfig:
    """Validate the ``BANKER_REDIS_*`` settings; :class:`BankerConfigError` naming the culprit."""
    return _load(RedisConfig, Context(settings, spider_name))


def load_placement_config(settings: SettingsLike) -> PlacementConfig:
    """Validate ``BANKER_PLACEMENT*``, ``BANKER_GNP_*`` and ``BANKER_PROBE_*``."""
    return _load(PlacementConfig, Context(settings))


def load_ops_config(settings: SettingsLike) -> OpsConfig:
    """Validate the operator's settings (metrics, progress, time series, dashboard)."""
    return _load(OpsConfig, Context(settings))


# -- once per crawler --------------------------------------------------------------------
# Scrapy's Settings is not hashable, the crawler is; weak keys let a finished
# crawler (and its configs) be collected.  Components are built after the
# add-ons changed the settings, and Scrapy freezes them right after.

_CORE: weakref.WeakKeyDictionary[CrawlerLike, BankerConfig] = weakref.WeakKeyDictionary()
_REDIS: weakref.WeakKeyDictionary[CrawlerLike, RedisConfig] = weakref.WeakKeyDictionary()
_PLACEMENT: weakref.WeakKeyDictionary[CrawlerLike, PlacementConfig] = weakref.WeakKeyDictionary()
_OPS: weakref.WeakKeyDictionary[CrawlerLike, OpsConfig] = weakref.WeakKeyDictionary()


def _once(
    cache: weakref.WeakKeyDictionary[CrawlerLike, _T], crawler: CrawlerLike, load: Callable[[], _T]
) -> _T:
    config = cache.get(crawler)
    if config is None:
        config = cache[crawler] = load()
    return config


def core_config(crawler: CrawlerLike) -> BankerConfig:
    """The crawler's :class:`BankerConfig`, parsed on first use and shared by its components."""
    return _once(_CORE, crawler, lambda: load_config(crawler.settings))


def redis_config(crawler: CrawlerLike) -> RedisConfig:
    """The crawler's :class:`RedisConfig`; ``%(spider)s`` is its spider class's name."""
    spider = getattr(getattr(crawler, "spidercls", None), "name", None) or "spider"
    return _once(_REDIS, crawler, lambda: load_redis_config(crawler.settings, spider))


def placement_config(crawler: CrawlerLike) -> PlacementConfig:
    """The crawler's :class:`PlacementConfig`, parsed on first use."""
    return _once(_PLACEMENT, crawler, lambda: load_placement_config(crawler.settings))


def ops_config(crawler: CrawlerLike) -> OpsConfig:
    """The crawler's :class:`OpsConfig`, parsed on first use."""
    return _once(_OPS, crawler, lambda: load_ops_config(crawler.settings))
