"""Every BANKER_* setting is validated at start-up with a message naming it."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from typing import Any

import pytest
from conftest import ROOT

from scrapy_banker.errors import BankerConfigError
from scrapy_banker.settings import (
    DEFAULTS,
    SETTINGS,
    BankerConfig,
    OpsConfig,
    PlacementConfig,
    RedisConfig,
    core_config,
    load_config,
    load_ops_config,
    load_placement_config,
    load_redis_config,
    ops_config,
    placement_config,
    redis_config,
)


def test_defaults_load() -> None:
    config = load_config({})
    assert config.enabled is True
    assert config.default_topic == "default"
    assert config.topic_rules == ()
    assert config.topic_priority("anything") == 0


def test_topics_accept_int_and_dict_forms() -> None:
    config = load_config(
        {
            "BANKER_TOPICS": {
                "news": 10,
                "archive": {"priority": -5, "slice": 2.5, "target": 100},
            },
            "BANKER_TOPIC_SLICE": 0.5,
        }
    )
    assert config.topic_priority("news") == 10
    assert config.topic_priority("archive") == -5
    assert config.topic_priority("products") == 0
    assert config.topics["news"].slice_s == 0.5  # the default slice
    assert config.topics["archive"].slice_s == 2.5
    assert config.topics["archive"].target == 100


def test_topics_accept_json_from_command_line() -> None:
    config = load_config({"BANKER_TOPICS": '{"news": 3}', "BANKER_ENABLED": "false"})
    assert config.topic_priority("news") == 3
    assert config.enabled is False


def test_slots_resource_defaults_to_scrapys_concurrency() -> None:
    config = load_config(
        {"BANKER_RESOURCES": {"slots": None, "pages": 2}, "CONCURRENT_REQUESTS": 24}
    )
    assert config.resources == {"slots": 24, "pages": 2}


def test_rules_first_match_wins_and_fall_back_to_default() -> None:
    config = load_config(
        {
            "BANKER_TOPIC_RULES": [
                {"url": r"/news/", "topic": "news"},
                {"callback": "parse_product", "topic": "products"},
                {"url": r"/archive/", "callback": "parse", "topic": "archive"},
            ],
            "BANKER_DEFAULT_TOPIC": "misc",
        }
    )
    assert config.topic_for("http://a/news/1.html", "parse_product") == "news"
    assert config.topic_for("http://a/x", "parse_product") == "products"
    assert config.topic_for("http://a/archive/2", "parse") == "archive"
    assert config.topic_for("http://a/archive/2", "other") == "misc"


@pytest.mark.parametrize(
    ("settings", "pattern"),
    [
        ({"BANKER_ENABLED": "maybe"}, r"BANKER_ENABLED='maybe'.*boolean"),
        ({"BANKER_TOPICS": ["news"]}, r"BANKER_TOPICS=\['news'\].*dict of topic"),
        ({"BANKER_TOPICS": "{not json"}, r"BANKER_TOPICS=.*not valid JSON"),
        ({"BANKER_TOPICS": {"news": "high"}}, r"BANKER_TOPICS\['news'\]='high'.*integer"),
        ({"BANKER_TOPICS": {"news": True}}, r"BANKER_TOPICS\['news'\]=True.*integer"),
        # Both forms are said (#31): an integer priority or a dict of the keys.
        (
            {"BANKER_TOPICS": {"a": "x"}},
            r"BANKER_TOPICS\['a'\]='x': expected an integer priority, or a dict with keys "
            r"from \['budget', 'priority', 'slice', 'target'\]$",
        ),
        (
            {"BANKER_TOPICS": '{"a": "x"}'},
            r"BANKER_TOPICS\['a'\]='x': expected an integer priority, or a dict",
        ),
        (
            {"BANKER_TOPICS": {"a": {"priority": "x"}}},
            r"BANKER_TOPICS\['a'\]\['priority'\]='x': expected an integer$",
        ),
        ({"BANKER_TOPICS": {"bad name": 1}}, r"BANKER_TOPICS\['bad name'\].*topic name"),
        ({"BANKER_TOPICS": {"news": {"prio": 1}}}, r"unknown key\(s\) \['prio'\]"),
        ({"BANKER_TOPIC_RULES": {"url": "x"}}, r"BANKER_TOPIC_RULES=.*list"),
        ({"BANKER_TOPIC_RULES": ["x"]}, r"BANKER_TOPIC_RULES\[0\]='x'"),
        ({"BANKER_TOPIC_RULES": [{"url": "x"}]}, r"BANKER_TOPIC_RULES\[0\].*missing 'topic'"),
        ({"BANKER_TOPIC_RULES": [{"topic": "t"}]}, r"needs 'url'"),
        ({"BANKER_TOPIC_RULES": [{"url": "(", "topic": "t"}]}, r"not a valid regular expr"),
        ({"BANKER_TOPIC_RULES": [{"url": "x", "topic": "t", "x": 1}]}, r"unknown key"),
        ({"BANKER_TOPIC_RULES": [{"callback": "a b", "topic": "t"}]}, r"method name"),
        ({"BANKER_DEFAULT_TOPIC": ""}, r"BANKER_DEFAULT_TOPIC=''.*topic name"),
        ({"BANKER_STATS_FILE": 3}, r"BANKER_STATS_FILE=3.*path"),
        ({"BANKER_TOPICS": {"n": {"slice": 0}}}, r"BANKER_TOPICS\['n'\]\['slice'\]=0.*> 0"),
        ({"BANKER_TOPICS": {"n": {"slice": "x"}}}, r"\['slice'\]='x'.*number"),
        ({"BANKER_TOPICS": {"n": {"slice": 0.05}}}, r"must be >= BANKER_TOPIC_MIN_SLICE"),
        ({"BANKER_TOPICS": {"n": {"target": -1}}}, r"\['target'\]=-1.*>= 0"),
        ({"BANKER_TOPIC_SLICE": -1}, r"BANKER_TOPIC_SLICE=-1.*> 0"),
        ({"BANKER_TOPIC_SLICE": 0.01}, r"BANKER_TOPIC_SLICE=0.01.*BANKER_TOPIC_MIN_SLICE"),
        ({"BANKER_TOPIC_MIN_SLICE": "nan"}, r"BANKER_TOPIC_MIN_SLICE='nan'"),
        ({"BANKER_TOPIC_SLICE_STEP": 0}, r"BANKER_TOPIC_SLICE_STEP=0"),
        ({"BANKER_TOPIC_ADJUST_INTERVAL": -5}, r"BANKER_TOPIC_ADJUST_INTERVAL=-5.*>= 0"),
        ({"BANKER_TOPIC_MAX_WAIT": 0}, r"BANKER_TOPIC_MAX_WAIT=0.*> 0"),
        ({"BANKER_QUEUE_KEY": "ip"}, r"BANKER_QUEUE_KEY='ip'.*allowed: \['domain', 'host'"),
        ({"BANKER_QUEUE_HASH": "md5"}, r"BANKER_QUEUE_HASH='md5'.*'bkdr', 'mmh3'"),
        ({"BANKER_BUCKET_CAPACITY": 0}, r"BANKER_BUCKET_CAPACITY=0.*>= 1"),
        ({"BANKER_DIRECTORY_MAX_DEPTH": 30}, r"BANKER_DIRECTORY_MAX_DEPTH=30.*0 to 24"),
        ({"BANKER_CACHE_BUCKET_SIZE": -1}, r"BANKER_CACHE_BUCKET_SIZE=-1"),
        ({"BANKER_SERIALIZE_ALLOWED_CLASSES": [1]}, r"BANKER_SERIALIZE_ALLOWED_CLASSES=\[1\]"),
        ({"BANKER_RESOURCES": ["pages"]}, r"BANKER_RESOURCES=\['pages'\].*dict of resource"),
        ({"BANKER_RESOURCES": {"pages": -1}}, r"BANKER_RESOURCES\['pages'\]=-1.*>= 0"),
        ({"BANKER_RESOURCES": {"a b": 1}}, r"BANKER_RESOURCES\['a b'\].*resource name"),
        ({"BANKER_RESOURCES": "{bad"}, r"BANKER_RESOURCES=.*not valid JSON"),
        (
            {"BANKER_RESOURCES": {"pages": 2}, "BANKER_TASK_CLAIMS": {"shop": {"gpus": 1}}},
            r"BANKER_TASK_CLAIMS\['shop'\]\['gpus'\].*unknown resource",
        ),
        (
            {"BANKER_RESOURCES": {"pages": 2}, "BANKER_TASK_CLAIMS": {"shop": {"pages": 3}}},
            r"BANKER_TASK_CLAIMS\['shop'\]\['pages'\]=3.*above the total",
        ),
        ({"BANKER_TASK_CLAIMS": ["x"]}, r"BANKER_TASK_CLAIMS=\['x'\].*topic ->"),
        ({"BANKER_TASK_TIMEOUT": 0}, r"BANKER_TASK_TIMEOUT=0.*> 0"),
        (
            {"BANKER_ADMISSION_POLICY": "random"},
            r"BANKER_ADMISSION_POLICY='random'.*'banker', 'naive'",
        ),
        ({"BANKER_FARM_DOMAIN": "Farm Test"}, r"BANKER_FARM_DOMAIN='Farm Test'.*DNS suffix"),
        ({"BANKER_HOST_BUDGET": -1}, r"BANKER_HOST_BUDGET=-1.*pages >= 0"),
        ({"BANKER_HOST_BUDGET": "many"}, r"BANKER_HOST_BUDGET='many'.*pages >= 0"),
        ({"BANKER_CRAWL_BUDGET": -5}, r"BANKER_CRAWL_BUDGET=-5.*pages >= 0"),
        ({"BANKER_HOST_BUDGETS": [1]}, r"BANKER_HOST_BUDGETS=\[1\].*host pattern -> pages"),
        ({"BANKER_HOST_BUDGETS": {"http://a.test/": 3}}, r"no scheme, no path"),
        ({"BANKER_HOST_BUDGETS": {"A.test": 3}}, r"lower-case host name"),
        ({"BANKER_HOST_BUDGETS": {"a.test": -3}}, r"BANKER_HOST_BUDGETS\['a.test'\]=-3.*>= 0"),
        ({"BANKER_TOPICS": {"n": {"budget": -1}}}, r"\['budget'\]=-1.*>= 0"),
    ],
)
def test_invalid_values_name_setting_value_and_allowed(
    settings: dict[str, Any], pattern: str
) -> None:
    # A BankerConfigError (a ValueError): a crawl reports it as one line (test_errors.py).
    with pytest.raises(BankerConfigError, match=pattern):
        load_config(settings)


def _documented() -> dict[str, tuple[str, str]]:
    """Setting -> (heading of the group it is documented under, its section)."""
    doc = (ROOT / "docs" / "settings.rst").read_text(encoding="utf-8")
    out: dict[str, tuple[str, str]] = {}
    group = ""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line and lines[i + 1 : i + 2] == ["-" * len(line)]:
            group = line
        found = re.fullmatch(r"\.\. setting:: (BANKER_\w+)", line)
        if found:
            section = doc.split(f"{line}\n", 1)[1].split(".. setting::", 1)[0]
            out[found[1]] = (group, section)
    return out


def test_every_setting_is_documented_with_its_default_under_its_group() -> None:
    documented = _documented()
    assert set(documented) == set(DEFAULTS)
    for name, spec in SETTINGS.items():
        group, section = documented[name]
        assert group.lower() == spec.group, f"{name} is documented under {group!r}"
        default = re.search(r"^Default: ``(.+?)``", section, flags=re.M)
        assert default is not None, f"{name} has no documented default"
        assert ast.literal_eval(default[1]) == spec.default, f"{name}: documented {default[1]}"


def test_each_setting_is_declared_once_and_the_config_defaults_are_its_defaults() -> None:
    sections = (BankerConfig, RedisConfig, PlacementConfig, OpsConfig)
    declared = [f.name for c in sections for f in fields(c)]
    assert len(SETTINGS) == len(declared) == len(DEFAULTS)
    assert all(name.startswith("BANKER_") for name in SETTINGS)
    assert BankerConfig() == load_config({})
    assert RedisConfig() == load_redis_config({})
    assert PlacementConfig() == load_placement_config({})
    assert OpsConfig() == load_ops_config({})


class _Crawler:
    def __init__(self, settings: dict[str, Any], spider_name: str | None = None) -> None:
        self.settings = settings
        self.spidercls = type("S", (), {"name": spider_name})


def test_configs_are_parsed_once_per_crawler() -> None:
    first = _Crawler({"BANKER_QUEUE_KEY": "domain", "BANKER_PLACEMENT": "top1"}, "shop")
    second = _Crawler({})
    for get in (core_config, redis_config, placement_config, ops_config):
        assert get(first) is get(first)
        assert get(second) is not get(first)
    assert core_config(first).queue_key == "domain"
    assert core_config(second).queue_key == "host"
    assert placement_config(first).mode == "top1"
    assert redis_config(first).prefix == "banker:shop"
    assert redis_config(second).prefix == "banker:spider"  # a spider class with no name


def test_a_bad_value_fails_its_crawler_only() -> None:
    with pytest.raises(ValueError, match="BANKER_TOPIC_SLICE"):
        core_config(_Crawler({"BANKER_TOPIC_SLICE": -1}))
    assert core_config(_Crawler({})).topic_slice == 1.0


def test_redis_settings_defaults_and_interpolation() -> None:
    cfg = load_redis_config({"CONCURRENT_REQUESTS": 8}, "shop")
    assert cfg.prefix == "banker:shop"
    assert cfg.partitions == 1024
    assert cfg.buffer == 16  # 2 x CONCURRENT_REQUESTS
    assert cfg.node_id is None
    assert load_redis_config({"BANKER_REDIS_BUFFER": 5}).buffer == 5


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("BANKER_REDIS_PREFIX", "a{b}", "braces are reserved"),
        ("BANKER_REDIS_PREFIX", "%(other)s", "only %(spider)s"),
        ("BANKER_REDIS_PARTITIONS", 0, "integer >= 1"),
        ("BANKER_REDIS_NODE_ID", "a@b", "without '@'"),
        ("BANKER_REDIS_HEARTBEAT", 40.0, "at most half of BANKER_REDIS_LEASE_TTL"),
        ("BANKER_REDIS_LEASE_TTL", -1, "expected a finite number > 0"),
        ("BANKER_REDIS_LEASE_TTL", float("inf"), "expected a finite number > 0"),
        ("BANKER_REDIS_REAP_INTERVAL", "nan", "expected a finite number > 0"),
        ("BANKER_REDIS_CLUSTER", "maybe", "BANKER_REDIS_CLUSTER"),
        ("BANKER_REDIS_IDLE_BEFORE_CLOSE", -0.5, "expected a finite number >= 0"),
        ("BANKER_REDIS_BUFFER", 0, "integer >= 1"),
    ],
)
def test_bad_redis_settings_name_the_setting(name: str, value: object, message: str) -> None:
    with pytest.raises(BankerConfigError, match=re.escape(message)) as info:
        load_redis_config({name: value}, "shop")
    assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("BANKER_METRICS_PORT", 70000, "TCP port 0-65535"),
        ("BANKER_METRICS_PORT", "70000", "TCP port 0-65535"),
        ("BANKER_METRICS_PORT", "port 80", "TCP port 0-65535"),
        ("BANKER_METRICS_BIND", "localhost:80", "IP address"),
        ("BANKER_METRICS_TOP_SLOTS", -1, ">= 0"),
        ("BANKER_TIMESERIES_INTERVAL", 0, "> 0"),
        ("BANKER_DASHBOARD_TOKEN", "short", "16+ characters"),
    ],
)
def test_bad_operations_settings_fail_naming_the_setting(
    name: str, value: Any, allowed: str
) -> None:
    with pytest.raises(BankerConfigError, match=name) as info:
        load_ops_config({name: value})
    assert allowed in str(info.value)


def test_operations_settings_parse() -> None:
    config = load_ops_config(
        {"BANKER_METRICS_PORT": 0, "BANKER_METRICS_BIND": "0.0.0.0",
         "BANKER_DASHBOARD_TOKEN": "s3cret-token-0123456789", "BANKER_PROGRESS": "true"}
    )  # fmt: skip
    assert (config.metrics_port, config.metrics_bind, config.progress) == (0, "0.0.0.0", True)
    # From the command line (-s BANKER_METRICS_PORT=9100, as docs/tutorial.rst says) a string.
    assert load_ops_config({"BANKER_METRICS_PORT": "9100"}).metrics_port == 9100
    assert config.dashboard_token == "s3cret-token-0123456789"
    assert OpsConfig().metrics_port is None and OpsConfig().dashboard_token is None


def test_a_bad_dashboard_token_is_not_echoed() -> None:
    with pytest.raises(BankerConfigError, match="BANKER_DASHBOARD_TOKEN=<str of length 9>") as info:
        load_ops_config({"BANKER_DASHBOARD_TOKEN": "hunter2!!"})
    assert "hunter2" not in str(info.value)
