"""Per-host politeness state: Retry-After, adaptive backoff, Crawl-delay, its JSON."""

from __future__ import annotations

import email.utils
import random

import pytest

from scrapy_banker.core.politeness import (
    FLOOR_DECAY,
    RATE_DECAY,
    RATE_MARGIN,
    RATE_SLACK,
    RATE_WINDOW_S,
    HostState,
    Politeness,
    PolitenessConfig,
    parse_retry_after,
)

NOW = 1_800_000_000.0


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after("120", NOW) == 120.0
    assert parse_retry_after(b" 5 ", NOW) == 5.0
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert parse_retry_after(date, NOW) == pytest.approx(30.0, abs=1.0)
    assert parse_retry_after(email.utils.formatdate(NOW - 30, usegmt=True), NOW) == 0.0
    for bad in (None, "", "soon", "-5", "1.5e3", "Mon, 99 Foo 2026"):
        assert parse_retry_after(bad, NOW) is None, bad


def test_retry_after_blocks_the_host_until_then() -> None:
    p = Politeness(PolitenessConfig(jitter=0))
    state = p.refused("a.test", NOW, 90.0)
    assert state.blocked_until == NOW + 90 and state.refusals == 1
    assert p.ready_at("a.test") == NOW + 90
    assert p.ready_at("b.test") == 0.0
    # A shorter Retry-After later never shortens a block already promised.
    assert p.refused("a.test", NOW + 1, 5.0).blocked_until == NOW + 90
    # Capped: a server asking for a day is honoured for backoff_max_s.
    assert p.refused("c.test", NOW, 86400.0).blocked_until == NOW + 600


def test_headerless_refusals_back_off_exponentially_with_jitter_and_decay() -> None:
    p = Politeness(PolitenessConfig(backoff_base_s=2, backoff_max_s=60, jitter=0.25),
                   rng=random.Random(1))  # fmt: skip
    waits = []
    for i in range(6):
        waits.append(p.refused("a.test", NOW + i, None).blocked_until - (NOW + i))
    for i, wait in enumerate(waits):
        nominal = min(2 * 2**i, 60)
        assert nominal * 0.75 <= wait <= nominal * 1.25, (i, wait)
    assert p.get("a.test").refusals == 6
    p.succeeded("a.test", NOW + 10)
    assert p.get("a.test").refusals == 3
    p.succeeded("a.test", NOW + 10)
    p.succeeded("a.test", NOW + 10)
    assert p.get("a.test").refusals == 0


def test_a_host_refusing_past_the_cap_is_given_up() -> None:
    p = Politeness(PolitenessConfig(max_refusals=3, jitter=0))
    for i in range(2):
        p.refused("a.test", NOW + i, 1.0)
    assert not p.gave_up("a.test")
    p.refused("a.test", NOW + 5, 1.0)
    assert p.gave_up("a.test")


def test_crawl_delay_and_throttle_delay_space_requests() -> None:
    p = Politeness(PolitenessConfig(crawl_delay_max_s=10))
    p.crawl_delay("a.test", 3.0)
    p.sent("a.test", NOW)
    assert p.ready_at("a.test") == NOW + 3
    p.throttle("a.test", 5.0)  # the larger of the two
    assert p.ready_at("a.test") == NOW + 5
    p.crawl_delay("b.test", 3600.0)
    assert p.get("b.test").crawl_delay == 10.0  # capped
    p.sent("c.test", NOW)  # no interval: nothing to remember
    assert "c.test" not in p.hosts


def test_state_round_trips_through_json_and_changes_are_reported() -> None:
    p = Politeness(PolitenessConfig(jitter=0))
    p.refused("a.test", NOW, 30.0)
    p.crawl_delay("b.test", 2.0)
    assert set(p.take_changed()) == {"a.test", "b.test"}
    assert p.take_changed() == {}
    q = Politeness()
    q.restore(p.to_json())
    assert q.hosts == p.hosts
    assert HostState().to_json() == {}
    for bad in ({"refusals": "x"}, {"blocked_until": -1}, {"nope": 1}, {"last_sent": float("inf")}):
        with pytest.raises(ValueError):
            HostState.from_json(bad)


def test_bad_constants_are_refused() -> None:
    for kwargs in ({"codes": frozenset()}, {"codes": frozenset({42})}, {"backoff_base_s": 0},
                   {"jitter": 1.0}, {"max_refusals": 0}, {"crawl_delay_max_s": -1}):  # fmt: skip
        with pytest.raises(ValueError):
            PolitenessConfig(**kwargs)  # type: ignore[arg-type]


def test_refusals_of_requests_in_flight_when_the_block_began_count_once() -> None:
    p = Politeness(PolitenessConfig(backoff_base_s=2, backoff_max_s=60, jitter=0))
    p.refused("a.test", NOW, None, coalesce=True)
    # Three more answers of requests sent before the block: one backoff, not four.
    for dt in (0.1, 0.2, 0.3):
        state = p.refused("a.test", NOW + dt, None, coalesce=True)
    assert state.refusals == 1 and state.blocked_until == NOW + 2  # not extended either
    assert p.blocked("a.test", NOW + 1) and not p.blocked("a.test", NOW + 2)
    # An echo still carries its Retry-After: the longer promise wins.
    assert p.refused("a.test", NOW + 0.5, 30.0, coalesce=True).blocked_until == NOW + 30.5
    assert p.get("a.test").refusals == 1
    # Once the block is over, the next refusal counts (and doubles the backoff).
    state = p.refused("a.test", NOW + 31, None, coalesce=True)
    assert state.refusals == 2 and state.blocked_until == NOW + 31 + 4
    # Without coalescing every refusal counts, as before.
    assert p.refused("a.test", NOW + 32, None).refusals == 3
    assert not p.blocked("b.test", NOW)


def test_merged_keeps_the_stricter_of_two_views_field_by_field() -> None:
    mine = HostState(blocked_until=200.0, refusals=1, last_sent=150.0)
    theirs = HostState(blocked_until=100.0, refusals=3, crawl_delay=2.0, last_sent=160.0)
    merged = mine.merged(theirs)
    assert merged == HostState(blocked_until=200.0, refusals=3, crawl_delay=2.0, last_sent=160.0)
    assert merged.ready_at() == 200.0
    assert theirs.merged(mine) == merged
    assert HostState().merged(mine) == mine


def test_a_429_teaches_the_hosts_rate_and_a_503_does_not() -> None:
    p = Politeness(PolitenessConfig(jitter=0))
    p.refused("a.test", NOW, 3.0, rate=True)  # nothing served before: nothing to learn from
    assert p.get("a.test").learned_interval == 0.0
    for i in range(6):  # 6 answers from NOW + 3 on, 0.1 s apart...
        p.succeeded("a.test", NOW + 3 + 0.1 * i)
    # ...then refused until NOW + 3.6 + 2.4 = NOW + 6: 6 requests per 3 s.
    state = p.refused("a.test", NOW + 3.6, 2.4, rate=True)
    assert state.learned_interval == pytest.approx(0.5)
    assert state.interval == pytest.approx(0.5) and state.served == 0
    p.sent("a.test", NOW + 6.0)
    assert p.ready_at("a.test") == pytest.approx(NOW + 6.5, abs=1e-6)  # spaced from now on
    p.succeeded("a.test", NOW + 6.1)  # each answer served speeds it up a little
    assert p.get("a.test").learned_interval == pytest.approx(0.5 * RATE_DECAY)
    # A 503 (rate=False) blocks, and teaches nothing.
    p.succeeded("b.test", NOW)
    assert "b.test" not in p.hosts  # a host never refused is not tracked
    p.refused("b.test", NOW, 1.0)
    for i in range(3):
        p.succeeded("b.test", NOW + 1 + i)
    assert p.refused("b.test", NOW + 4, 1.0).learned_interval == 0.0
    # It travels with the host's state.
    assert HostState.from_json(p.get("a.test").to_json()) == p.get("a.test")


def test_the_first_429_already_teaches_the_rate_from_the_answers_before_it() -> None:
    p = Politeness(PolitenessConfig(jitter=0))
    for i in range(6):  # a host never refused: 6 answers 0.1 s apart...
        p.succeeded("a.test", NOW + 0.1 * i)
    assert "a.test" not in p.hosts  # remembered aside, not as a state to keep or send
    # ...then refused until NOW + 0.6 + 2.4 = NOW + 3: 6 requests per 3 s.
    state = p.refused("a.test", NOW + 0.6, 2.4, rate=True)
    assert state.learned_interval == pytest.approx(0.5)
    # Answers older than the window are not held against a later first refusal.
    for i in range(3):
        p.succeeded("b.test", NOW + i)
    p.succeeded("b.test", NOW + RATE_WINDOW_S + 10)  # a new window: 1 answer
    state = p.refused("b.test", NOW + RATE_WINDOW_S + 10.5, 1.5, rate=True)
    assert state.learned_interval == pytest.approx(2.0)
    # An early answer, then a wait of the crawl's own, then a burst: the burst tells.
    p.succeeded("d.test", NOW)
    for i in range(6):
        p.succeeded("d.test", NOW + 20 + 0.1 * i)
    state = p.refused("d.test", NOW + 20.6, 2.4, rate=True)
    assert state.learned_interval == pytest.approx(0.5)
    # A later 429 measures the rate anew from the answers, those before the first too.
    for i in range(4):
        p.succeeded("d.test", NOW + 23 + 0.1 * i)
    state = p.refused("d.test", NOW + 23.4, 2.0, rate=True)
    # The 10 answers from NOW + 20 to the end of the block at NOW + 25.4.
    assert state.learned_interval == pytest.approx(5.4 / 10)
    # A quiet host's answers are forgotten after a window (memory: active hosts only).
    p.succeeded("e.test", NOW + 100 + RATE_WINDOW_S)
    assert set(p._answers) == {"e.test"}
    # A 503 teaches nothing, first refusal or not.
    p.succeeded("c.test", NOW)
    assert p.refused("c.test", NOW + 1, 1.0).learned_interval == 0.0


def test_a_learned_interval_shrinks_to_its_floor_and_no_further() -> None:
    p = Politeness(PolitenessConfig(jitter=0))
    for i in range(6):
        p.succeeded("a.test", NOW + 0.1 * i)
    state = p.refused("a.test", NOW + 0.6, 2.4, rate=True)
    assert state.learned_interval == pytest.approx(0.5)
    # An estimate errs slow by less than RATE_SLACK: it is not tried faster than that.
    assert state.refused_interval * RATE_MARGIN == pytest.approx(0.5 * RATE_SLACK)
    for i in range(30):  # served at its interval, which shrinks by RATE_DECAY each time...
        p.succeeded("a.test", NOW + 3 + 0.5 * i)
    floor = 0.5 * RATE_SLACK / RATE_MARGIN * FLOOR_DECAY**30
    assert floor * RATE_MARGIN > 0.5 * RATE_DECAY**30  # ...down to the floor, no lower
    assert p.get("a.test").learned_interval == pytest.approx(floor * RATE_MARGIN)
    # Refused at that spacing anyway: never that fast again (nor faster than the new
    # estimate allows).
    spacing = p.get("a.test").interval
    state = p.refused("a.test", NOW + 20, 1.0, rate=True)
    assert state.refused_interval >= spacing
    assert state.learned_interval >= state.refused_interval * RATE_MARGIN
    floor = state.refused_interval
    for i in range(200):
        p.succeeded("a.test", NOW + 21 + i)
    state = p.get("a.test")
    assert state.refused_interval == pytest.approx(floor * FLOOR_DECAY**200)
    assert state.learned_interval == pytest.approx(state.refused_interval * RATE_MARGIN)
    assert HostState.from_json(state.to_json()) == state  # the floor travels with the host


def test_a_headerless_429_searches_the_rate_up_from_what_it_proved_too_fast() -> None:
    p = Politeness(PolitenessConfig(backoff_base_s=2.0, jitter=0))
    for i in range(6):  # a host never refused, answered 0.4 s apart...
        p.succeeded("a.test", NOW + 0.4 * i)
    # ...then a 429 with no Retry-After: blocked a blind 2 s.  Its estimate from
    # that blind end is slow (2.4 + 2 - 0 over 6 answers); only 0.4 s is
    # proved too fast, so the interval may shrink back to just above it.
    state = p.refused("a.test", NOW + 2.4, None, rate=True)
    assert state.blocked_until == pytest.approx(NOW + 4.4, abs=1e-6)
    assert state.learned_interval == pytest.approx(4.4 / 6)
    assert state.refused_interval == pytest.approx(0.4)
    for i in range(52):  # answered up to NOW + 29.9
        p.succeeded("a.test", NOW + 4.4 + 0.5 * i)
    assert p.get("a.test").learned_interval == pytest.approx(0.4 * RATE_MARGIN * FLOOR_DECAY**52)
    # Refused again while spaced by it, after answers: a near miss -- the spacing
    # was shrinking, so it and RATE_MARGIN x it are too fast.  A sliding window
    # frees within about one spacing: held one new interval, not a blind backoff.
    spacing = p.get("a.test").interval
    state = p.refused("a.test", NOW + 30.0, None, rate=True)
    assert state.refused_interval == pytest.approx(spacing * RATE_MARGIN)
    assert state.learned_interval == pytest.approx(spacing * RATE_MARGIN**2)
    assert state.blocked_until == pytest.approx(NOW + 30.0 + state.learned_interval, abs=1e-6)
    assert state.refusals == 1
    # Refused again before anything was served: no near miss -- the blind
    # backoff, doubled (the second refusal in a row).
    state = p.refused("a.test", NOW + 31.0, None, rate=True)
    assert state.refusals == 2
    assert state.blocked_until == pytest.approx(NOW + 35.0, abs=1e-6)
    assert state.refused_interval >= spacing * RATE_MARGIN  # a floor never drops at a refusal
