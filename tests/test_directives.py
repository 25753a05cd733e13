"""The pure core of run-time control and budgets (scrapy_banker.core.directives): plain pytest."""

from __future__ import annotations

import json

import pytest

from scrapy_banker.core import directives as control
from scrapy_banker.core.directives import (
    FLEET,
    HOST,
    JOBDIR,
    TOPIC,
    VERBS,
    Action,
    BudgetBook,
    BudgetRules,
    ControlError,
    ControlState,
    HostControl,
    TopicControl,
    Value,
    Verb,
    check_host,
    get_verb,
    parse_action,
    verbs_in,
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


# -- the verb table ---------------------------------------------------------------------


def test_the_verb_table_says_what_each_verb_takes_and_where() -> None:
    # The verbs of this version and their words (a verb added later adds to them).
    usages = {
        "pause": "HOST or topic:NAME",
        "resume": "HOST or topic:NAME",
        "limit": "HOST, then N (>= 1) or none",
        "delay": "HOST, then SECONDS (>= 0; 0 removes it)",
        "budget": "HOST, topic:NAME or crawl, then N (>= 0) or none",
        "purge": "HOST",
        "inject": "URL...",
    }
    assert {name: VERBS[name].usage for name in usages} == usages
    synopses = {
        "pause": "HOST|topic:NAME",
        "resume": "HOST|topic:NAME",
        "limit": "HOST N|none",
        "delay": "HOST SECONDS",
        "budget": "HOST|topic:NAME|crawl N|none",
        "purge": "HOST",
        "inject": "URL... [--topic NAME]",
    }
    assert {name: VERBS[name].synopsis for name in synopses} == synopses
    assert [n for n in usages if VERBS[n].takes_value] == ["limit", "delay", "budget"]
    assert [n for n in usages if VERBS[n].takes_urls] == ["inject"]
    assert all(v.takes_host for v in VERBS.values() if not v.takes_urls)
    assert all(v.help and "\n" not in v.help for v in VERBS.values())
    # A single process (its JOBDIR) has no queue outside itself: no purge, no inject.
    assert [n for n in usages if JOBDIR in VERBS[n].where] == [
        "pause", "resume", "limit", "delay", "budget",
    ]  # fmt: skip
    assert [v.name for v in verbs_in(JOBDIR)] == [
        v.name for v in VERBS.values() if v.available(JOBDIR)
    ]
    assert verbs_in(FLEET) == verbs_in() == tuple(VERBS.values())


def test_what_a_form_needs_of_a_verb() -> None:
    assert VERBS["limit"].to_json(JOBDIR) == {
        "name": "limit",
        "usage": "HOST, then N (>= 1) or none",
        "help": "Set how many requests a host may have in flight (N, or none)",
        "takes_value": True,
        "takes_urls": False,
        "takes_host": True,
        "target_hint": "host",
        "value_hint": "N (>= 1) or none",
        "where": ["fleet", "jobdir"],
        "available": True,
    }
    inject = VERBS["inject"].to_json(JOBDIR)
    assert (inject["available"], inject["takes_urls"], inject["value_hint"]) == (
        False, True, "topic (optional)",
    )  # fmt: skip
    assert VERBS["inject"].to_json(FLEET)["available"] is True
    assert VERBS["pause"].to_json()["target_hint"] == "host or topic:NAME"


@pytest.mark.parametrize(
    ("verb", "where", "message"),
    [
        ("zap", None, f"unknown action 'zap'; allowed: {', '.join(VERBS)}"),
        ("zap", JOBDIR, "unknown action 'zap'; allowed: "
                        + ", ".join(v.name for v in VERBS.values() if JOBDIR in v.where)),
        ("purge", JOBDIR, "purge: a single process's queue is its own memory; purge needs a "
                          "crawl that runs on Redis (the BankerRedisScheduler)"),
        ("inject", JOBDIR, "inject: a single process's queue is its own memory"),
    ],
)  # fmt: skip
def test_a_verb_unknown_or_not_carried_out_here_is_refused_in_one_line(
    verb: str, where: str | None, message: str
) -> None:
    with pytest.raises(ControlError) as info:
        get_verb(verb, where)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    # parse_action refuses the same way, whatever the arguments.
    with pytest.raises(ControlError) as info:
        parse_action(verb, ["a.test"], where=where)
    assert str(info.value).startswith(message)
    assert get_verb("pause", JOBDIR) is VERBS["pause"]
    assert parse_action("purge", ["a.test"], where=FLEET) == Action("purge", "a.test")


def test_the_log_of_another_version_is_described_from_what_it_holds() -> None:
    assert Action("zap", "a.test").describe() == "zap a.test"
    assert Action("zap", "a.test", 3).describe() == "zap a.test 3"
    assert Action("zap", urls=("http://a.test/",)).describe() == "zap 1 URL(s)"
    assert Action("limit", "a.test").describe() == "limit a.test none"
    assert Action("purge", "a.test").describe() == "purge a.test"


def test_a_verb_added_to_the_table_is_parsed_and_described_with_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nudge = Verb("nudge", (HOST, TOPIC), Value("N", integer=True, least=1, most=9, none=False),
                 where=frozenset({FLEET}), help="Nudge a host")  # fmt: skip
    monkeypatch.setitem(control.VERBS, "nudge", nudge)  # type: ignore[arg-type]
    assert nudge.usage == "HOST or topic:NAME, then N (>= 1; 1 removes it)"
    assert nudge.synopsis == "HOST|topic:NAME N"
    action = parse_action("nudge", ["A.test", "3"], topics=TOPICS)
    assert action == Action("nudge", "a.test", 3) and action.describe() == "nudge a.test 3"
    assert parse_action("nudge", ["topic:news", "1"], topics=TOPICS).target == "topic:news"
    with pytest.raises(ControlError, match=r"nudge: N must be an integer >= 1, got '10'"):
        parse_action("nudge", ["a.test", "10"])
    with pytest.raises(ControlError, match="nudge: 'crawl' is only a target of budget"):
        parse_action("nudge", ["crawl", "1"])
    with pytest.raises(ControlError, match="nudge takes HOST or topic:NAME, then N"):
        parse_action("nudge", ["a.test"])
    with pytest.raises(ControlError, match="nudge: a single process's queue"):
        parse_action("nudge", ["a.test", "1"], where=JOBDIR)
    assert "nudge" not in [v.name for v in verbs_in(JOBDIR)]
