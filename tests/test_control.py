"""The pure core of run-time control and budgets (scrapy_banker.core.control): plain pytest."""

from __future__ import annotations

import json

import pytest

from scrapy_banker.core.control import (
    Action,
    BudgetBook,
    BudgetRules,
    ControlError,
    ControlState,
    HostControl,
    TopicControl,
    check_host,
    parse_action,
)

TOPICS = {"news", "default"}


def _url_ok(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise ValueError("expected an absolute http(s) URL")


@pytest.mark.parametrize(
    ("verb", "args", "message"),
    [
        ("stop", ["a.test"], "unknown action 'stop'; allowed: pause, resume"),
        ("pause", [], "pause takes HOST or topic:NAME; got 0 argument(s)"),
        ("pause", ["a.test", "b.test"], "got 2 argument(s)"),
        ("pause", ["http://a.test/x"], "HOST: expected a host name such as example.com, not a URL"),
        ("pause", ["a b"], "HOST: 'a b' is not a host name"),
        ("pause", ["topic:nosuch"], "pause: no topic 'nosuch' in this crawl; its topics: default"),
        ("pause", ["topic:"], "pause: topic:NAME needs a name"),
        ("pause", ["crawl"], "pause: 'crawl' is only a target of budget"),
        ("budget", ["a.test", "-3"], "budget: N must be an integer >= 0 or 'none', got '-3'"),
        ("budget", ["a.test", "1.5"], "budget: N must be an integer >= 0 or 'none', got '1.5'"),
        ("budget", ["topic:nosuch", "3"], "no topic 'nosuch' in this crawl"),
        ("limit", ["a.test", "0"], "limit: N must be an integer >= 1 or 'none', got '0'"),
        ("limit", ["topic:news", "2"], "limit: takes a HOST, not a topic"),
        ("delay", ["a.test", "-1"], "delay: N must be a number of seconds >= 0, got '-1'"),
        ("delay", ["a.test", "inf"], "delay: N must be a number of seconds >= 0, got 'inf'"),
        ("delay", ["a.test", "none"], "delay: N must be a number of seconds >= 0, got 'none'"),
        ("purge", ["topic:news"], "purge: takes a HOST, not a topic"),
        ("inject", [], "inject takes URL...: give at least one URL"),
        ("inject", ["ftp://a.test/"], "inject: URL 'ftp://a.test/' cannot be fetched"),
    ],
)
def test_bad_input_names_the_argument_and_what_is_allowed(
    verb: str, args: list[str], message: str
) -> None:
    with pytest.raises(ControlError, match=None) as info:
        parse_action(verb, args, topics=TOPICS, check_url=_url_ok)
    assert message in str(info.value)


def test_an_inject_topic_must_exist() -> None:
    with pytest.raises(ControlError, match="no topic 'sports'"):
        parse_action("inject", ["http://a.test/"], topics=TOPICS, topic="sports")
    action = parse_action("inject", ["http://a.test/"], topics=TOPICS, topic="news")
    assert action == Action("inject", urls=("http://a.test/",), topic="news")


def test_hosts_are_lower_cased_and_ipv6_unbracketed() -> None:
    assert check_host("WWW.Example.COM") == "www.example.com"
    assert check_host("[::1]") == "::1"
    assert parse_action("pause", ["A.Test"]).target == "a.test"


def test_actions_build_the_state_and_its_version() -> None:
    state = ControlState()
    for verb, args in [
        ("pause", ["a.test"]),
        ("limit", ["a.test", "2"]),
        ("delay", ["b.test", "0.5"]),
        ("budget", ["b.test", "10"]),
        ("budget", ["topic:news", "100"]),
        ("pause", ["topic:news"]),
        ("budget", ["crawl", "1000"]),
    ]:
        state = state.apply(parse_action(verb, args, topics=TOPICS))
    assert state.version == 7
    assert state.host("a.test") == HostControl(paused=True, limit=2)
    assert state.host("b.test") == HostControl(delay=0.5, budget=10)
    assert state.topic("news") == TopicControl(paused=True, budget=100)
    assert state.crawl_budget == 1000
    assert state.paused_hosts == {"a.test"} and state.paused_topics == {"news"}
    # Back to nothing: the entries disappear, the version keeps growing.
    for verb, args in [
        ("resume", ["a.test"]),
        ("limit", ["a.test", "none"]),
        ("delay", ["b.test", "0"]),
        ("budget", ["b.test", "none"]),
        ("resume", ["topic:news"]),
        ("budget", ["topic:news", "none"]),
        ("budget", ["crawl", "none"]),
    ]:
        state = state.apply(parse_action(verb, args, topics=TOPICS))
    assert state == ControlState(version=14)
    # purge and inject change no directive, but are versions (logged actions).
    assert state.apply(Action("purge", "a.test")).version == 15


def test_the_state_round_trips_json_and_refuses_what_is_not_one() -> None:
    state = ControlState().apply(parse_action("pause", ["a.test"]))
    state = state.apply(parse_action("budget", ["topic:news", "5"], topics=TOPICS))
    state = state.apply(parse_action("budget", ["crawl", "9"]))
    text = json.dumps(state.to_json())
    assert ControlState.from_json(json.loads(text)) == state
    for bad, why in [
        ([], "must be a JSON object"),
        ({"version": -1}, "version: expected an integer >= 0"),
        ({"hosts": {"a.test": {"paused": True, "evil": 1}}}, "unknown fields ['evil']"),
        ({"hosts": {"a.test": {"limit": 0}}}, "limit: expected an integer >= 1"),
        ({"hosts": {"a.test": {"delay": "1"}}}, "delay: expected seconds >= 0"),
        ({"hosts": {"not a host": {}}}, "is not a host name"),
        ({"topics": {"news": {"budget": -2}}}, "budget: expected an integer >= 0"),
        ({"crawl_budget": True}, "crawl_budget: expected an integer >= 0"),
        ({"extra": 1}, "unknown fields ['extra']"),
    ]:
        with pytest.raises(ControlError, match=None) as info:
            ControlState.from_json(bad)
        assert why in str(info.value)


def test_budgets_resolve_operator_then_patterns_then_default() -> None:
    rules = BudgetRules(10, (("*.gov", 3), ("big.org", 100)), {"news": 7}, 50)
    state = ControlState().apply(Action("budget", "x.gov", 5))
    assert rules.host("a.gov") == 3
    assert rules.host("x.gov", state) == 5  # the operator's wins
    assert rules.host("big.org") == 100
    assert rules.host("other.net") == 10
    assert rules.topic("news") == 7 and rules.topic("default") is None
    assert rules.crawl_budget() == 50
    assert BudgetRules().any() is False
    assert BudgetRules().any(state) is True


def test_the_book_charges_until_a_budget_is_spent_and_refunds() -> None:
    book = BudgetBook(BudgetRules(None, (("a.test", 2),), {"news": 3}, 4))
    assert book.charge("a.test", "default") is None
    assert book.charge("a.test", "default") is None
    assert book.charge("a.test", "default") == "host a.test budget 2"
    assert book.charge("b.test", "news") is None
    assert book.charge("b.test", "news") is None
    assert book.charge("b.test", "news") == "crawl budget 4"
    assert book.crawl_spent
    book.refund("a.test", "default")
    assert not book.crawl_spent
    assert book.charge("c.test", "news") is None  # news: 3 of 3 now
    assert book.charge("c.test", "news") == "topic news budget 3"
    # Raised at run time: the same request goes.
    book.state = ControlState().apply(Action("budget", "topic:news", 10))
    book.state = book.state.apply(Action("budget", "crawl", 10))
    assert book.charge("c.test", "news") is None
    restored = BudgetBook(book.rules)
    restored.restore(json.loads(json.dumps(book.to_json())))
    assert (restored.hosts, restored.topics, restored.crawl) == (
        book.hosts,
        book.topics,
        book.crawl,
    )
    with pytest.raises(ValueError, match="crawl: expected an integer >= 0"):
        restored.restore({"crawl": -1})


def test_budget_changes_are_told_apart_from_other_changes() -> None:
    a = ControlState().apply(Action("pause", "a.test"))
    assert not a.budgets_differ(ControlState())
    assert a.apply(Action("budget", "a.test", 3)).budgets_differ(a)
    assert a.apply(Action("budget", "crawl", 3)).budgets_differ(a)
    assert a.apply(Action("budget", "topic:news", 3)).budgets_differ(a)
