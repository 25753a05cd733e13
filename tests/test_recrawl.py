"""Per-URL revisit state, the adaptive interval and the due index (pure core)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_banker.core.change_rate import RateEstimate, frequency_at, optimal_mu
from scrapy_banker.core.recrawl import (
    DueIndex,
    LastmodTrust,
    Outcome,
    RecrawlPolicy,
    UrlState,
    apply_lastmod,
    outcome_of,
    parse_lastmod,
    signature,
)

HOUR, DAY = 3600.0, 86400.0
NOW = 1.8e9


def test_unchanged_grows_by_half_and_changed_moves_half_way_to_the_least() -> None:
    """StormCrawler's AdaptiveScheduler rule, within the bounds."""
    policy = RecrawlPolicy(interval_s=DAY, min_s=HOUR, max_s=14 * DAY)
    state = policy.observe(policy.first(NOW), NOW, Outcome.CHANGED, signature="a")
    assert state.interval == DAY and state.due == NOW + DAY  # the first fetch: the default
    t = NOW + DAY
    state = policy.observe(state, t, Outcome.UNCHANGED, signature="a")
    assert state.interval == pytest.approx(1.5 * DAY)
    assert state.due == pytest.approx(t + 1.5 * DAY, abs=1e-6)
    t += 1.5 * DAY
    state = policy.observe(state, t, Outcome.CHANGED, signature="b")
    assert state.interval == pytest.approx(1.5 * DAY - (1.5 * DAY - HOUR) / 2)
    assert (state.changes, state.unchanged, state.signature) == (2, 1, "b")
    for _ in range(40):
        t = state.due
        state = policy.observe(state, t, Outcome.UNCHANGED)
    assert state.interval == 14 * DAY  # capped
    for _ in range(40):
        t = state.due
        state = policy.observe(state, t, Outcome.CHANGED, signature=str(t))
    assert state.interval == pytest.approx(HOUR, rel=1e-6) and state.interval >= HOUR


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Outcome)), st.floats(min_value=-30 * DAY, max_value=30 * DAY)
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from(["adaptive", "poisson"]),
)
def test_the_next_due_is_never_in_the_past_and_the_interval_stays_in_bounds(
    steps: list[tuple[Outcome, float]], estimator: str
) -> None:
    """Fetches early or late (an overdue page, NUTCH-1564) never give a due time before them."""
    policy = RecrawlPolicy(min_s=HOUR, max_s=7 * DAY, interval_s=DAY, estimator=estimator)
    state, now = policy.first(NOW), NOW
    for outcome, drift in steps:
        now = max(now, state.due + drift)  # fetched early, on time or overdue
        state = policy.observe(state, now, outcome, signature=str(now), mu=1e4)
        assert state.due > now
        assert HOUR <= state.interval <= 7 * DAY


def test_a_failed_fetch_waits_the_error_interval_and_teaches_nothing() -> None:
    policy = RecrawlPolicy(interval_s=DAY, min_s=HOUR, error_s=600.0)
    state = policy.observe(policy.first(NOW), NOW, Outcome.CHANGED, signature="a")
    failed = policy.observe(state, NOW + DAY, Outcome.FAILED)
    assert failed.due == NOW + DAY + 600.0 and failed.failures == 1
    assert (failed.interval, failed.rate, failed.signature) == (state.interval, state.rate, "a")
    assert failed.succeeded == NOW  # the copy is still the first fetch's


def test_the_staleness_ceiling_caps_every_wait() -> None:
    policy = RecrawlPolicy(interval_s=DAY, min_s=HOUR, max_s=30 * DAY, error_s=2 * DAY,
                           max_stale_s=1.5 * DAY)  # fmt: skip
    state = policy.observe(policy.first(NOW), NOW, Outcome.CHANGED, signature="a")
    state = policy.observe(state, NOW + DAY, Outcome.UNCHANGED)
    assert state.interval == 1.5 * DAY and state.due == NOW + 2.5 * DAY
    state = policy.observe(state, NOW + 2.5 * DAY, Outcome.UNCHANGED)
    assert state.interval == pytest.approx(2.25 * DAY)  # the rule's interval is kept...
    assert state.due == NOW + 4 * DAY  # ...but the wait is capped
    failed = policy.observe(state, NOW + 4 * DAY, Outcome.FAILED)
    assert failed.due == NOW + 5.5 * DAY  # the error interval too


def test_a_304_or_the_same_signature_is_no_change_and_the_first_fetch_is_one() -> None:
    assert outcome_of("", "abc", not_modified=False) is Outcome.CHANGED
    assert outcome_of("abc", "abc", not_modified=False) is Outcome.UNCHANGED
    assert outcome_of("abc", "abd", not_modified=False) is Outcome.CHANGED
    assert outcome_of("abc", None, not_modified=True) is Outcome.UNCHANGED
    with pytest.raises(ValueError, match="304"):
        outcome_of("abc", None, not_modified=False)
    policy = RecrawlPolicy()
    state = policy.observe(policy.first(NOW), NOW, Outcome.CHANGED, signature="s", etag='"v1"',
                           last_modified="Wed, 21 Oct 2026 07:28:00 GMT")  # fmt: skip
    kept = policy.observe(state, NOW + DAY, Outcome.UNCHANGED)  # a 304: no body, no headers
    assert (kept.signature, kept.etag, kept.last_modified) == (
        "s",
        '"v1"',
        "Wed, 21 Oct 2026 07:28:00 GMT",
    )


def test_the_poisson_estimator_revisits_at_the_optimal_interval_for_the_estimated_rate() -> None:
    """A page changing about hourly, against a budget that makes its optimum about 2 h."""
    rate = 1 / HOUR
    rng = random.Random(5)
    policy = RecrawlPolicy(interval_s=HOUR, min_s=60.0, max_s=30 * DAY, estimator="poisson",
                           rate_decay=1.0)  # fmt: skip
    mu = optimal_mu([rate, rate / 10, rate * 10], 1 / HOUR)
    assert mu is not None
    state, t = policy.observe(policy.first(NOW), NOW, Outcome.CHANGED, signature="0"), NOW
    for _ in range(300):
        t2 = state.due
        changed = rng.random() < -math.expm1(-rate * (t2 - t))
        t = t2
        state = policy.observe(state, t, Outcome.CHANGED if changed else Outcome.UNCHANGED,
                               signature=str(t) if changed else None, mu=mu)  # fmt: skip
    assert state.interval == pytest.approx(1 / frequency_at(rate, mu), rel=0.2)
    # Without mu (the budget not solved yet) the adaptive rule applies.
    adaptive = policy.observe(state, t + HOUR, Outcome.UNCHANGED, mu=None)
    assert adaptive.interval == pytest.approx(min(state.interval * 1.5, 30 * DAY))


def test_url_state_round_trips_through_json_and_refuses_bad_fields() -> None:
    policy = RecrawlPolicy()
    state = policy.observe(policy.first(NOW), NOW, Outcome.CHANGED, signature="s", etag="e")
    state = policy.observe(state, NOW + DAY, Outcome.CHANGED, signature="t")
    assert state.rate != RateEstimate()
    assert UrlState.from_json(state.to_json()) == state
    assert UrlState().to_json() == {}
    with pytest.raises(ValueError, match="unknown URL state fields"):
        UrlState.from_json({"due": 1.0, "callback": "__init__"})
    with pytest.raises(ValueError, match="is not a string"):
        UrlState.from_json({"etag": 5})
    with pytest.raises(ValueError, match="is not a finite number"):
        UrlState.from_json({"due": -1})
    with pytest.raises(ValueError, match="rate estimate"):
        UrlState.from_json({"rate": {"changed": "x"}})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_s": 0.0}, "min_s"),
        ({"min_s": 10.0, "max_s": 5.0, "interval_s": 7.0}, "min_s <= max_s"),
        ({"interval_s": 1.0}, r"interval_s=1.0 must lie in \[min_s, max_s\]"),
        ({"error_s": 0.0}, "error_s"),
        ({"max_stale_s": 1.0}, "max_stale_s"),
        ({"grow": 1.0}, "grow"),
        ({"shrink": 0.0}, "shrink"),
        ({"estimator": "lru"}, r"estimator must be one of \['adaptive', 'poisson'\]"),
        ({"rate_decay": 1.5}, "rate_decay"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RecrawlPolicy(**kwargs)  # type: ignore[arg-type]


def test_the_due_index_hands_out_what_is_due_earliest_first_once() -> None:
    index = DueIndex()
    for key, due in [("c", 30.0), ("a", 10.0), ("b", 20.0), ("d", 40.0)]:
        index.schedule(key, due)
    index.schedule("d", 5.0)  # rescheduled earlier
    index.schedule("b", 50.0)  # and later
    assert index.next_due() == 5.0 and len(index) == 4 and "b" in index
    assert index.pop_due(25.0) == ["d", "a"]
    assert index.pop_due(35.0, limit=5) == ["c"]
    assert index.pop_due(35.0) == []
    assert index.due_of("b") == 50.0 and index.remove("b") and not index.remove("b")
    assert index.next_due() is None and index.pop_due(math.inf) == []
    with pytest.raises(ValueError, match="finite"):
        index.schedule("x", math.nan)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.floats(0, 100)), max_size=200))
def test_the_due_index_agrees_with_a_dict_after_any_reschedules(
    ops: list[tuple[int, float]],
) -> None:
    index, model = DueIndex(), dict[str, float]()
    for key, due in ops:
        index.schedule(str(key), due)
        model[str(key)] = due
    assert len(index) == len(model)
    got = index.pop_due(50.0)
    assert sorted(got) == sorted(k for k, d in model.items() if d <= 50.0)
    assert [model[k] for k in got] == sorted(model[k] for k in got)  # earliest first
    assert dict(index.items()) == {k: d for k, d in model.items() if d > 50.0}


_PAGE = b"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Release notes</title>
<script>window.session = "a1b2c3";</script><style>.x { color: red }</style></head>
<body><nav><a href="/">Home</a> | <a href="/news/">News</a></nav>
<!-- generated 2026-11-30 02:00 -->
<main><h1>Release notes</h1><p>Version 2.3 fixes   the <em>caf\xc3\xa9</em> parser.</p></main>
</body></html>"""


def test_a_text_signature_ignores_markup_scripts_and_comments_but_not_words() -> None:
    reshuffled = (
        _PAGE.replace(b'"a1b2c3"', b'"zz99"')
        .replace(b"02:00", b"03:17")
        .replace(b"<em>caf\xc3\xa9</em>", b"<strong>caf\xc3\xa9</strong>")
        .replace(b"<main>", b'<main class="v2">\n  ')
    )
    assert signature(reshuffled, "text") == signature(_PAGE, "text")
    assert signature(reshuffled) != signature(_PAGE)  # the body did change
    reworded = _PAGE.replace(b"Version 2.3", b"Version 2.4")
    assert signature(reworded, "text") != signature(_PAGE, "text")
    assert len(signature(_PAGE)) == 32
    # Not HTML, or nothing at all: hashed as text, never an error.
    assert signature(b"", "text") == signature(b"  ", "text")
    assert signature(b'{"a": 1}', "text") != signature(b'{"a": 2}', "text")
    with pytest.raises(ValueError, match=r"one of \['body', 'text'\]"):
        signature(_PAGE, "dom")


# -- sitemap lastmod --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T10:00:00+00:00", "2024-05-01T10:00:00+00:00"),
        ("2024-05-01T12:00:00+02:00", "2024-05-01T10:00:00+00:00"),
        ("2024-05-01T10:00Z", "2024-05-01T10:00:00+00:00"),
        ("2024-05-01T10:00:00.5Z", "2024-05-01T10:00:00.500000+00:00"),
        ("2024-05-01", "2024-05-01T00:00:00+00:00"),
        (" 2024-05 ", "2024-05-01T00:00:00+00:00"),
        ("2024", "2024-01-01T00:00:00+00:00"),
        ("2024-05-01T10:00:00", "2024-05-01T10:00:00+00:00"),  # no zone: UTC
    ],
)
def test_a_sitemap_lastmod_reads_as_a_posix_time(text: str, expected: str) -> None:
    from datetime import datetime

    assert parse_lastmod(text) == datetime.fromisoformat(expected).timestamp()


@pytest.mark.parametrize("text", ["", "yesterday", "2024-13-01", "01/05/2024", "2024-5"])
def test_a_lastmod_that_is_no_w3c_datetime_is_none(text: str) -> None:
    assert parse_lastmod(text) is None


def test_a_hosts_lastmod_is_trusted_once_its_claims_proved_right() -> None:
    trust = LastmodTrust()
    before = UrlState(due=200.0, succeeded=100.0, claimed=150.0)  # claims a change since
    trust.check_fetch("a", before, Outcome.CHANGED)
    assert not trust.trusted("a")  # one right claim is not enough
    trust.check_fetch("a", replace(before, claimed=90.0), Outcome.UNCHANGED)  # no change: right
    assert trust.trusted("a") and not trust.trusted("b")
    trust.check_fetch("a", before, Outcome.FAILED)  # a failed fetch checks nothing
    trust.check_fetch("a", replace(before, claimed=0.0), Outcome.UNCHANGED)  # no claim
    assert (trust.right, trust.wrong) == ({"a": 2}, {})
    trust.check_fetch("a", before, Outcome.UNCHANGED)  # claimed a change that was not
    assert not trust.trusted("a")  # 1 wrong in 3
    for _ in range(8):
        trust.check_fetch("a", before, Outcome.CHANGED)
    assert trust.trusted("a")  # 1 wrong in 11


def test_a_trusted_claim_of_a_change_makes_the_page_due_now() -> None:
    state = UrlState(due=500.0, succeeded=100.0)
    assert apply_lastmod(state, 150.0, 200.0, trusted=False) == replace(state, claimed=150.0)
    assert apply_lastmod(state, 150.0, 200.0, trusted=True).due == 200.0
    assert apply_lastmod(state, 90.0, 200.0, trusted=True).due == 500.0  # no change since
    overdue = replace(state, due=120.0)
    assert apply_lastmod(overdue, 150.0, 200.0, trusted=True).due == 120.0  # never later
    # The next successful fetch checks the claim and clears it; a failure keeps it.
    policy = RecrawlPolicy(interval_s=10.0, min_s=1.0, max_s=100.0)
    claimed = replace(state, claimed=150.0, interval=10.0)
    assert policy.observe(claimed, 200.0, Outcome.CHANGED, signature="x").claimed == 0.0
    assert policy.observe(claimed, 200.0, Outcome.FAILED).claimed == 150.0
    assert UrlState.from_json(claimed.to_json()) == claimed


def test_the_first_rule_a_page_matches_gives_its_policy() -> None:
    import re

    from scrapy_banker.core.recrawl import RecrawlRule, policy_for

    default = RecrawlPolicy()
    news = RecrawlPolicy(interval_s=2 * HOUR, min_s=HOUR)
    rules = [
        RecrawlRule(None, url=re.compile(r"/about")),
        RecrawlRule(news, url=re.compile(r"//news\."), topic="articles"),
        RecrawlRule(news, topic="live"),
    ]
    assert policy_for(rules, default, "http://a.test/about/us", "live") is None  # first wins
    assert policy_for(rules, default, "http://news.test/x", "articles") is news
    assert policy_for(rules, default, "http://news.test/x", "other") is default  # both must match
    assert policy_for(rules, default, "http://a.test/x", "live") is news
    assert policy_for(rules, default, "http://a.test/x", None) is default


def test_the_poisson_plan_spends_what_the_adaptive_pages_leave_of_the_budget() -> None:
    from scrapy_banker.core.recrawl import plan_mu

    def seen(changed: float, changed_s: float, unchanged: float, unchanged_s: float) -> UrlState:
        return UrlState(interval=10.0, rate=RateEstimate(changed, changed_s, unchanged,
                                                         unchanged_s))  # fmt: skip

    hot, warm = seen(5, 5.0, 0, 0.0), seen(2, 20.0, 6, 60.0)
    quiet = UrlState(interval=10.0)  # never seen changing: the adaptive rule, 0.1 fetch/s
    mu = plan_mu([hot, warm, quiet, quiet], budget=1.0)
    assert mu is not None
    rates = [r.rate.rate() for r in (hot, warm)]
    spent = sum(frequency_at(r, mu) for r in rates if r)
    assert spent == pytest.approx(1.0 - 0.2, rel=1e-6)  # what the two quiet pages leave
    assert plan_mu([quiet] * 20, budget=1.0) is None  # nothing estimated: nothing to plan
    assert plan_mu([hot, quiet, quiet], budget=0.2) is None  # the adaptive pages spend it all
