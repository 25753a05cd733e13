"""``BANKER_*`` settings: defaults, documentation and start-up validation.

Every component reads its configuration through :func:`load_config`, so a bad
value is reported once, at start-up, with the setting's name, the value it got
and what is allowed -- instead of surfacing as an obscure failure hours into a
crawl.  This module deliberately imports nothing from Scrapy: it only needs an
object with ``get()``, which both :class:`scrapy.settings.Settings` and a plain
``dict`` provide, so the validation is testable without a crawler.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from scrapy_banker.hashing import KEY_POLICIES
from scrapy_banker.topics import TopicSpec

__all__ = [
    "DEFAULTS",
    "BankerConfig",
    "RedisConfig",
    "SettingsLike",
    "TopicRule",
    "load_config",
    "load_redis_config",
]


class SettingsLike(Protocol):
    def get(self, name: str, default: Any = None) -> Any: ...


#: Default value of every ``BANKER_*`` setting.  Documented one by one in
#: ``docs/settings.rst``; a test keeps the two in sync.
DEFAULTS: dict[str, Any] = {
    # Master switch: every scrapy-banker component raises NotConfigured when False.
    "BANKER_ENABLED": True,
    # Topic name -> priority (int) or {"priority": int, "slice": s, "target": n}.
    "BANKER_TOPICS": {},
    # Ordered rules tagging requests with a topic: {"url": regex, "topic": name}
    # or {"callback": method name, "topic": name}; the first match wins.
    "BANKER_TOPIC_RULES": [],
    # Topic of a request that has no banker_topic meta and matches no rule.
    "BANKER_DEFAULT_TOPIC": "default",
    # Default time slice (seconds) of a topic's turn among equal priorities (ST).
    "BANKER_TOPIC_SLICE": 1.0,
    # Floor and step of the slice adjuster.
    "BANKER_TOPIC_MIN_SLICE": 0.1,
    "BANKER_TOPIC_SLICE_STEP": 0.1,
    # Seconds between two runs of the slice adjuster; 0 disables it.
    "BANKER_TOPIC_ADJUST_INTERVAL": 10.0,
    # Starvation bound: a topic with pending work waits at most this many seconds.
    "BANKER_TOPIC_MAX_WAIT": 30.0,
    # What part of the URL is a request's queue key: host, surt, domain or url.
    "BANKER_QUEUE_KEY": "host",
    # Hash of the queue key: bkdr (the paper's, seed 131) or mmh3.
    "BANKER_QUEUE_HASH": "bkdr",
    # Extendible-hash directory: bucket load that triggers a split, depth cap,
    # and size of the in-memory cache bucket for overflow records.
    "BANKER_BUCKET_CAPACITY": 1024,
    "BANKER_DIRECTORY_MAX_DEPTH": 16,
    "BANKER_CACHE_BUCKET_SIZE": 4096,
    # Banker's admission: resource -> total units ({} disables admission).
    "BANKER_RESOURCES": {},
    # Topic -> maximum claim of a task of that topic, e.g. {"shop": {"sessions": 1}}.
    "BANKER_TASK_CLAIMS": {},
    # Seconds a task may hold resources with no request in flight before reclaim.
    "BANKER_TASK_TIMEOUT": 300.0,
    # "banker" (safe states only) or "naive" (first come, first served; for comparison).
    "BANKER_ADMISSION_POLICY": "banker",
    # Redis commands are retried this many times, with jittered exponential backoff
    # capped at BANKER_REDIS_BACKOFF_CAP seconds, before an error reaches the caller.
    "BANKER_REDIS_RETRIES": 5,
    "BANKER_REDIS_BACKOFF_CAP": 2.0,
    # Distributed frontier (scrapy_banker.redis.scheduler.BankerRedisScheduler).
    # Key prefix of the crawl in Redis; %(spider)s is the spider name.  Braces
    # are not allowed (the partition hash tags use them).
    "BANKER_REDIS_PREFIX": "banker:%(spider)s",
    # Logical partitions M of the two-level mapping; the same on every worker.
    "BANKER_REDIS_PARTITIONS": 1024,
    # Connect to a Redis Cluster (REDIS_URL / REDIS_HOST+REDIS_PORT of one node).
    "BANKER_REDIS_CLUSTER": False,
    # Seconds a popped request stays leased without a heartbeat renewing it.
    "BANKER_REDIS_LEASE_TTL": 60.0,
    # Deliveries after which an expired request is dead-lettered.
    "BANKER_REDIS_MAX_DELIVERIES": 3,
    # This worker's id (default: host-pid-random) and share of partitions.
    "BANKER_REDIS_NODE_ID": None,
    "BANKER_REDIS_NODE_CAPACITY": 1.0,
    # Seconds without a heartbeat after which a node's partitions are reassigned.
    "BANKER_REDIS_NODE_TIMEOUT": 30.0,
    # Seconds between heartbeats (registry, lease renewal, partition table reload).
    "BANKER_REDIS_HEARTBEAT": 2.0,
    # Seconds between two runs of the expired-lease reaper (single-flight).
    "BANKER_REDIS_REAP_INTERVAL": 5.0,
    # Leased requests kept in memory (None: 2 x CONCURRENT_REQUESTS).
    "BANKER_REDIS_BUFFER": None,
    # Requests popped from one partition per round trip.
    "BANKER_REDIS_POP_PER_PARTITION": 4,
    # Longest pause (seconds) between two polls of an idle worker.
    "BANKER_REDIS_IDLE_BACKOFF_MAX": 2.0,
    # Seconds the whole crawl must stay empty before this worker reports idle
    # (then a plain spider closes; a RedisSpider asks its start-URL key).
    "BANKER_REDIS_IDLE_BEFORE_CLOSE": 5.0,
    # Delete this crawl's keys (queues, seen sets, table) when the spider opens.
    "BANKER_REDIS_FLUSH_ON_START": False,
    # Network-aware placement (GNP coordinates, httpping, Hungarian assignment).
    "BANKER_PLACEMENT": "hash",
    "BANKER_PLACEMENT_TOPK": 3,
    "BANKER_PLACEMENT_TOPK_CHOICE": "least_loaded",
    "BANKER_PLACEMENT_COST": "latency",
    "BANKER_PLACEMENT_INTERVAL": 10.0,
    "BANKER_PLACEMENT_TOLERANCE": 0.1,
    "BANKER_GNP_DIMS": 3,
    "BANKER_GNP_LANDMARK": False,
    "BANKER_GNP_REFERENCE_SITES": 8,
    "BANKER_NET_MEASURE": True,
    "BANKER_NET_WINDOW": 64,
    "BANKER_PROBE_RATE": 5.0,
    "BANKER_PROBE_SAMPLES": 3,
    "BANKER_PROBE_PATH": "/robots.txt",
    "BANKER_STORAGE_PROBE_BYTES": 100_000,
    # Request classes (import paths) allowed back from JOBDIR besides Scrapy's own.
    "BANKER_SERIALIZE_ALLOWED_CLASSES": [],
    # Path of a JSON file the stats exporter writes when the spider closes.
    "BANKER_STATS_FILE": None,
    # Domain suffix that scrapy_banker.testing.resolver.FarmResolver maps to 127.0.0.1.
    "BANKER_FARM_DOMAIN": "farm.test",
}

_TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TOPIC_KEYS = frozenset({"priority", "slice", "target"})
_RULE_KEYS = frozenset({"url", "callback", "topic"})


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


@dataclass(frozen=True)
class BankerConfig:
    """Validated view of the ``BANKER_*`` settings."""

    enabled: bool = True
    topics: Mapping[str, TopicSpec] = field(default_factory=dict)
    topic_rules: tuple[TopicRule, ...] = ()
    default_topic: str = "default"
    topic_slice: float = 1.0
    topic_min_slice: float = 0.1
    topic_slice_step: float = 0.1
    topic_adjust_interval: float = 10.0
    topic_max_wait: float = 30.0
    queue_key: str = "host"
    queue_hash: str = "bkdr"
    bucket_capacity: int = 1024
    directory_max_depth: int = 16
    cache_bucket_size: int = 4096
    serialize_allowed_classes: tuple[str, ...] = ()
    resources: Mapping[str, int] = field(default_factory=dict)
    task_claims: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    task_timeout: float = 300.0
    admission_policy: str = "banker"
    redis_retries: int = 5
    redis_backoff_cap: float = 2.0
    stats_file: str | None = None
    farm_domain: str = "farm.test"

    def topic_priority(self, topic: str) -> int:
        spec = self.topics.get(topic)
        return spec.priority if spec is not None else 0

    def topic_for(self, url: str, callback_name: str | None) -> str:
        """Topic of a request with no explicit ``banker_topic`` meta."""
        for rule in self.topic_rules:
            if rule.matches(url, callback_name):
                return rule.topic
        return self.default_topic


def _bad(name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"Invalid {name}={value!r}: {allowed}")


def _get(settings: SettingsLike, name: str) -> Any:
    value = settings.get(name, None)
    return DEFAULTS[name] if value is None else value


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"1", "0", "true", "false"}:
        return value.strip().lower() in {"1", "true"}
    raise _bad(name, value, "expected a boolean (True/False, 1/0, 'true'/'false')")


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


def _parse_topics(value: Any, default_slice: float) -> dict[str, TopicSpec]:
    name = "BANKER_TOPICS"
    value = _json_if_str(name, value)  # -s BANKER_TOPICS='{"news": 10}'
    if not isinstance(value, Mapping):
        raise _bad(name, value, 'expected a dict of topic -> priority, e.g. {"news": 10}')
    out: dict[str, TopicSpec] = {}
    for topic, spec in value.items():
        where = f"{name}[{topic!r}]"
        _as_topic_name(where, topic)
        if not isinstance(spec, Mapping):
            spec = {"priority": spec}
        unknown = set(spec) - _TOPIC_KEYS
        if unknown:
            raise _bad(
                where, spec, f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOPIC_KEYS)}"
            )
        target = spec.get("target")
        out[topic] = TopicSpec(
            name=topic,
            priority=_as_int(where, spec.get("priority", 0)),
            slice_s=_as_float(f"{where}['slice']", spec.get("slice", default_slice), 0.0),
            target=None if target is None else _as_positive_int(f"{where}['target']", target, 0),
        )
    return out


def _parse_rules(value: Any) -> tuple[TopicRule, ...]:
    name = "BANKER_TOPIC_RULES"
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
        pattern: re.Pattern[str] | None = None
        if "url" in raw:
            if not isinstance(raw["url"], str):
                raise _bad(where, raw, "'url' must be a regular expression string")
            try:
                pattern = re.compile(raw["url"])
            except re.error as exc:
                raise _bad(where, raw, f"'url' is not a valid regular expression ({exc})") from None
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


def load_config(settings: SettingsLike) -> BankerConfig:
    """Validate every ``BANKER_*`` setting; raise ``ValueError`` naming the culprit."""
    stats_file = _get(settings, "BANKER_STATS_FILE")
    if stats_file is not None and (not isinstance(stats_file, str) or not stats_file):
        raise _bad("BANKER_STATS_FILE", stats_file, "expected a file path string or None")
    domain = _get(settings, "BANKER_FARM_DOMAIN")
    if not isinstance(domain, str) or not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*", domain):
        raise _bad(
            "BANKER_FARM_DOMAIN", domain, "expected a lower-case DNS suffix like 'farm.test'"
        )
    queue_key = _get(settings, "BANKER_QUEUE_KEY")
    if queue_key not in KEY_POLICIES:
        raise _bad("BANKER_QUEUE_KEY", queue_key, f"allowed: {sorted(KEY_POLICIES)}")
    queue_hash = _get(settings, "BANKER_QUEUE_HASH")
    if queue_hash not in ("bkdr", "mmh3"):
        raise _bad("BANKER_QUEUE_HASH", queue_hash, "allowed: ['bkdr', 'mmh3']")
    allowed = _get(settings, "BANKER_SERIALIZE_ALLOWED_CLASSES")
    if isinstance(allowed, str):
        allowed = [c for c in allowed.split(",") if c.strip()]
    if not isinstance(allowed, (list, tuple)) or not all(isinstance(c, str) for c in allowed):
        raise _bad(
            "BANKER_SERIALIZE_ALLOWED_CLASSES", allowed, "expected a list of import path strings"
        )
    topic_slice = _as_float("BANKER_TOPIC_SLICE", _get(settings, "BANKER_TOPIC_SLICE"), 0.0)
    min_slice = _as_float("BANKER_TOPIC_MIN_SLICE", _get(settings, "BANKER_TOPIC_MIN_SLICE"), 0.0)
    if topic_slice < min_slice:
        raise _bad(
            "BANKER_TOPIC_SLICE", topic_slice, f"must be >= BANKER_TOPIC_MIN_SLICE ({min_slice})"
        )
    max_depth = _as_positive_int(
        "BANKER_DIRECTORY_MAX_DEPTH", _get(settings, "BANKER_DIRECTORY_MAX_DEPTH"), 0
    )
    if max_depth > 24:
        raise _bad("BANKER_DIRECTORY_MAX_DEPTH", max_depth, "expected an integer from 0 to 24")
    topics = _parse_topics(_get(settings, "BANKER_TOPICS"), topic_slice)
    for spec in topics.values():
        if spec.slice_s < min_slice:
            raise _bad(
                f"BANKER_TOPICS[{spec.name!r}]['slice']",
                spec.slice_s,
                f"must be >= BANKER_TOPIC_MIN_SLICE ({min_slice})",
            )
    raw_resources = _json_if_str("BANKER_RESOURCES", _get(settings, "BANKER_RESOURCES"))
    if isinstance(raw_resources, Mapping) and raw_resources.get("slots", 0) is None:
        # "slots": None -> as many as Scrapy may download at once.
        concurrent = settings.get("CONCURRENT_REQUESTS", None)
        raw_resources = {**raw_resources, "slots": 16 if concurrent is None else concurrent}
    resources = _parse_vector("BANKER_RESOURCES", raw_resources, None)
    raw_claims = _json_if_str("BANKER_TASK_CLAIMS", _get(settings, "BANKER_TASK_CLAIMS"))
    if not isinstance(raw_claims, Mapping):
        raise _bad(
            "BANKER_TASK_CLAIMS",
            raw_claims,
            'expected topic -> {resource: int}, e.g. {"shop": {"sessions": 1}}',
        )
    task_claims = {
        _as_topic_name(f"BANKER_TASK_CLAIMS[{t!r}]", t): _parse_vector(
            f"BANKER_TASK_CLAIMS[{t!r}]", c, resources
        )
        for t, c in raw_claims.items()
    }
    policy = _get(settings, "BANKER_ADMISSION_POLICY")
    if policy not in ("banker", "naive"):
        raise _bad("BANKER_ADMISSION_POLICY", policy, "allowed: ['banker', 'naive']")
    return BankerConfig(
        enabled=_as_bool("BANKER_ENABLED", _get(settings, "BANKER_ENABLED")),
        resources=resources,
        task_claims=task_claims,
        task_timeout=_as_float("BANKER_TASK_TIMEOUT", _get(settings, "BANKER_TASK_TIMEOUT"), 0.0),
        admission_policy=policy,
        redis_retries=_as_positive_int(
            "BANKER_REDIS_RETRIES", _get(settings, "BANKER_REDIS_RETRIES"), 0
        ),
        redis_backoff_cap=_as_float(
            "BANKER_REDIS_BACKOFF_CAP", _get(settings, "BANKER_REDIS_BACKOFF_CAP"), 0.0
        ),
        topics=topics,
        topic_slice=topic_slice,
        topic_min_slice=min_slice,
        topic_slice_step=_as_float(
            "BANKER_TOPIC_SLICE_STEP", _get(settings, "BANKER_TOPIC_SLICE_STEP"), 0.0
        ),
        topic_adjust_interval=_as_float(
            "BANKER_TOPIC_ADJUST_INTERVAL",
            _get(settings, "BANKER_TOPIC_ADJUST_INTERVAL"),
            0.0,
            strict=False,
        ),
        topic_max_wait=_as_float(
            "BANKER_TOPIC_MAX_WAIT", _get(settings, "BANKER_TOPIC_MAX_WAIT"), 0.0
        ),
        queue_key=queue_key,
        queue_hash=queue_hash,
        bucket_capacity=_as_positive_int(
            "BANKER_BUCKET_CAPACITY", _get(settings, "BANKER_BUCKET_CAPACITY")
        ),
        directory_max_depth=max_depth,
        cache_bucket_size=_as_positive_int(
            "BANKER_CACHE_BUCKET_SIZE", _get(settings, "BANKER_CACHE_BUCKET_SIZE"), 0
        ),
        serialize_allowed_classes=tuple(c.strip() for c in allowed),
        topic_rules=_parse_rules(_get(settings, "BANKER_TOPIC_RULES")),
        default_topic=_as_topic_name(
            "BANKER_DEFAULT_TOPIC", _get(settings, "BANKER_DEFAULT_TOPIC")
        ),
        stats_file=stats_file,
        farm_domain=domain,
    )


@dataclass(frozen=True)
class RedisConfig:
    """Validated view of the distributed-frontier settings (``BANKER_REDIS_*``)."""

    prefix: str
    partitions: int
    cluster: bool
    lease_ttl: float
    max_deliveries: int
    node_id: str | None
    node_capacity: float
    node_timeout: float
    heartbeat: float
    reap_interval: float
    buffer: int
    pop_per_partition: int
    idle_backoff_max: float
    idle_before_close: float
    flush_on_start: bool


def load_redis_config(settings: SettingsLike, spider_name: str = "spider") -> RedisConfig:
    """Validate the ``BANKER_REDIS_*`` settings; ``ValueError`` naming the culprit."""
    raw_prefix = _get(settings, "BANKER_REDIS_PREFIX")
    if not isinstance(raw_prefix, str) or not raw_prefix:
        raise _bad("BANKER_REDIS_PREFIX", raw_prefix, "expected a non-empty string")
    try:
        prefix = raw_prefix % {"spider": spider_name}
    except (KeyError, ValueError, TypeError) as exc:
        raise _bad(
            "BANKER_REDIS_PREFIX", raw_prefix, f"only %(spider)s may be interpolated ({exc})"
        ) from None
    if "{" in prefix or "}" in prefix:
        raise _bad("BANKER_REDIS_PREFIX", raw_prefix, "braces are reserved for hash tags")
    node_id = settings.get("BANKER_REDIS_NODE_ID", None)
    if node_id is not None and (not isinstance(node_id, str) or not node_id or "@" in node_id):
        raise _bad("BANKER_REDIS_NODE_ID", node_id, "expected a non-empty string without '@'")
    lease_ttl = _as_float("BANKER_REDIS_LEASE_TTL", _get(settings, "BANKER_REDIS_LEASE_TTL"), 0.0)
    node_timeout = _as_float(
        "BANKER_REDIS_NODE_TIMEOUT", _get(settings, "BANKER_REDIS_NODE_TIMEOUT"), 0.0
    )
    heartbeat = _as_float("BANKER_REDIS_HEARTBEAT", _get(settings, "BANKER_REDIS_HEARTBEAT"), 0.0)
    if heartbeat * 2 > min(lease_ttl, node_timeout):
        raise _bad(
            "BANKER_REDIS_HEARTBEAT",
            heartbeat,
            f"must be at most half of BANKER_REDIS_LEASE_TTL ({lease_ttl}) and of "
            f"BANKER_REDIS_NODE_TIMEOUT ({node_timeout}), or leases and nodes expire "
            "between two heartbeats",
        )
    raw_buffer = settings.get("BANKER_REDIS_BUFFER", None)
    if raw_buffer is None:
        concurrent = settings.get("CONCURRENT_REQUESTS", None)
        buffer = 2 * (16 if concurrent is None else _as_positive_int("CONCURRENT_REQUESTS",
                                                                     concurrent))  # fmt: skip
    else:
        buffer = _as_positive_int("BANKER_REDIS_BUFFER", raw_buffer)
    return RedisConfig(
        prefix=prefix,
        partitions=_as_positive_int(
            "BANKER_REDIS_PARTITIONS", _get(settings, "BANKER_REDIS_PARTITIONS")
        ),
        cluster=_as_bool("BANKER_REDIS_CLUSTER", _get(settings, "BANKER_REDIS_CLUSTER")),
        lease_ttl=lease_ttl,
        max_deliveries=_as_positive_int(
            "BANKER_REDIS_MAX_DELIVERIES", _get(settings, "BANKER_REDIS_MAX_DELIVERIES")
        ),
        node_id=node_id,
        node_capacity=_as_float(
            "BANKER_REDIS_NODE_CAPACITY", _get(settings, "BANKER_REDIS_NODE_CAPACITY"), 0.0
        ),
        node_timeout=node_timeout,
        heartbeat=heartbeat,
        reap_interval=_as_float(
            "BANKER_REDIS_REAP_INTERVAL", _get(settings, "BANKER_REDIS_REAP_INTERVAL"), 0.0
        ),
        buffer=buffer,
        pop_per_partition=_as_positive_int(
            "BANKER_REDIS_POP_PER_PARTITION", _get(settings, "BANKER_REDIS_POP_PER_PARTITION")
        ),
        idle_backoff_max=_as_float(
            "BANKER_REDIS_IDLE_BACKOFF_MAX", _get(settings, "BANKER_REDIS_IDLE_BACKOFF_MAX"), 0.0
        ),
        idle_before_close=_as_float(
            "BANKER_REDIS_IDLE_BEFORE_CLOSE",
            _get(settings, "BANKER_REDIS_IDLE_BEFORE_CLOSE"),
            0.0,
            strict=False,
        ),
        flush_on_start=_as_bool(
            "BANKER_REDIS_FLUSH_ON_START", _get(settings, "BANKER_REDIS_FLUSH_ON_START")
        ),
    )


@dataclass(frozen=True)
class PlacementConfig:
    """Validated view of the network-aware placement settings."""

    mode: str
    topk: int
    topk_choice: str
    cost: str
    interval: float
    tolerance: float
    dims: int
    landmark: bool
    reference_sites: int
    measure: bool
    window: int
    probe_rate: float
    probe_samples: int
    probe_path: str
    storage_probe_bytes: int


def load_placement_config(settings: SettingsLike) -> PlacementConfig:
    """Validate ``BANKER_PLACEMENT*``, ``BANKER_GNP_*`` and ``BANKER_PROBE_*``."""
    from scrapy_banker.placement import CHOICES, COSTS, MODES

    mode = _get(settings, "BANKER_PLACEMENT")
    if mode not in MODES:
        raise _bad("BANKER_PLACEMENT", mode, f"expected one of {', '.join(MODES)}")
    choice = _get(settings, "BANKER_PLACEMENT_TOPK_CHOICE")
    if choice not in CHOICES:
        raise _bad("BANKER_PLACEMENT_TOPK_CHOICE", choice, f"expected one of {', '.join(CHOICES)}")
    cost = _get(settings, "BANKER_PLACEMENT_COST")
    if cost not in COSTS:
        raise _bad("BANKER_PLACEMENT_COST", cost, f"expected one of {', '.join(COSTS)}")
    path = _get(settings, "BANKER_PROBE_PATH")
    if not isinstance(path, str) or not path.startswith("/"):
        raise _bad("BANKER_PROBE_PATH", path, "expected a path starting with '/'")
    return PlacementConfig(
        mode=mode,
        topk=_as_positive_int("BANKER_PLACEMENT_TOPK", _get(settings, "BANKER_PLACEMENT_TOPK")),
        topk_choice=choice,
        cost=cost,
        interval=_as_float(
            "BANKER_PLACEMENT_INTERVAL", _get(settings, "BANKER_PLACEMENT_INTERVAL"), 0.0
        ),
        tolerance=_as_float(
            "BANKER_PLACEMENT_TOLERANCE",
            _get(settings, "BANKER_PLACEMENT_TOLERANCE"),
            0.0,
            strict=False,
        ),
        dims=_as_positive_int("BANKER_GNP_DIMS", _get(settings, "BANKER_GNP_DIMS")),
        landmark=_as_bool("BANKER_GNP_LANDMARK", _get(settings, "BANKER_GNP_LANDMARK")),
        reference_sites=_as_positive_int(
            "BANKER_GNP_REFERENCE_SITES", _get(settings, "BANKER_GNP_REFERENCE_SITES")
        ),
        measure=_as_bool("BANKER_NET_MEASURE", _get(settings, "BANKER_NET_MEASURE")),
        window=_as_positive_int("BANKER_NET_WINDOW", _get(settings, "BANKER_NET_WINDOW"), 3),
        probe_rate=_as_float(
            "BANKER_PROBE_RATE", _get(settings, "BANKER_PROBE_RATE"), 0.0, strict=False
        ),
        probe_samples=_as_positive_int(
            "BANKER_PROBE_SAMPLES", _get(settings, "BANKER_PROBE_SAMPLES")
        ),
        probe_path=path,
        storage_probe_bytes=_as_positive_int(
            "BANKER_STORAGE_PROBE_BYTES", _get(settings, "BANKER_STORAGE_PROBE_BYTES")
        ),
    )
