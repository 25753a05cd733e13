"""The web farm pushes back like real servers: 429 + Retry-After, 503 bursts, Crawl-delay.

The decisions are pure (:mod:`scrapy_banker.testing.farm.pushback`, built by
the model), so most tests drive a :class:`PushbackTracker` with a fake
clock; one slow test checks that the real server applies them at receipt
time and counts what the fleet under test does.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest

from scrapy_banker.core.politeness import parse_retry_after
from scrapy_banker.testing.farm import (
    Burst,
    FarmConfig,
    FarmModel,
    HostPushback,
    PushbackTracker,
    RateLimit,
    WebFarm,
)
from scrapy_banker.testing.farm.pushback import CRAWL_DELAY_TOLERANCE, REACTION_S, robots_txt

#: A wall-clock epoch for the fake clock: 2026-11-27 12:00:00 UTC, plus a fraction.
WALL0 = 1795780800.25


def _tracker(**fields: Any) -> tuple[FarmModel, PushbackTracker]:
    model = FarmModel(FarmConfig(seed=3, hosts=6, total_pages=60, **fields))
    return model, model.pushback_tracker()


def _statuses(tracker: PushbackTracker, host: str, times: list[float]) -> list[int]:
    out = []
    for now in times:
        refusal = tracker.receive(host, "/", now, WALL0 + now)
        out.append(200 if refusal is None else refusal.status)
    return out


# ---------------------------------------------------------------------- config
def test_pushback_is_off_by_default() -> None:
    cfg = FarmConfig()
    assert not cfg.has_pushback
    model = FarmModel(cfg)
    assert model.pushback_hosts() == {}
    assert model.pushback(0) is None
    assert model.robots_txt(0) is None
    tracker = model.pushback_tracker()
    assert not tracker.active
    assert all(tracker.receive(model.host_name(0), "/", t) is None for t in range(50))
    assert tracker.receive(model.host_name(0), "/robots.txt", 51.0) is None
    stats = tracker.stats()
    assert stats["refused"] == stats["retry_after_violations"] == 0
    assert stats["robots_fetches_per_host"] == {model.host_name(0): 1}


def test_config_round_trips_and_normalises_pushback() -> None:
    cfg = FarmConfig(
        hosts=8,
        static_sites={"Docs.Example.": "/tmp"},
        rate_limits={1: RateLimit(requests=2, window_s=3, retry_after="date"), 2: {"requests": 1}},
        static_rate_limits={"docs.example": {"window_s": 0.5, "retry_after": "none"}},
        bursts={3: Burst(period_s=10, duration_s=2), 4: {"every": 5, "first": 2}},
        static_bursts={"DOCS.example": {"every": 3, "first": 1}},
        crawl_delays={5: 1.5, 6: 0.25},
    )
    back = FarmConfig.from_json(cfg.to_json())
    assert back == cfg and hash(back) == hash(cfg)
    assert back.rate_limits[1] == RateLimit(requests=2, window_s=3.0, retry_after="date")
    assert back.rate_limits[2] == RateLimit()
    assert back.static_rate_limits == {"docs.example": RateLimit(window_s=0.5, retry_after="none")}
    assert back.bursts[4] == Burst(every=5, first=2)
    assert back.static_bursts == {"docs.example": Burst(every=3, first=1)}
    assert back.crawl_delays == {5: 1.5, 6: 0.25}
    data = json.loads(cfg.to_json())
    assert data["rate_limits"]["1"]["retry_after"] == "date"
    # An int and a float window are one config, hashed alike.
    a = FarmConfig(rate_limits={0: RateLimit(window_s=2)})
    b = FarmConfig(rate_limits={0: RateLimit(window_s=2.0)})
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rate_limits": {0: {"requests": 0}}}, r"requests must be an integer >= 1"),
        ({"rate_limits": {0: {"window_s": 0}}}, r"window_s must be > 0"),
        ({"rate_limits": {0: {"retry_after": "never"}}}, r"retry_after must be one of"),
        ({"rate_limits": {0: {"retry_after_s": 0}}}, r"retry_after_s must be None or"),
        ({"rate_limits": {0: {"burst": 1}}}, r"rate_limits\[0\]: unknown RateLimit keys"),
        ({"rate_limits": {0: 5}}, r"expected a RateLimit"),
        ({"rate_limits": {"x": {}}}, r"'x' is not a host index"),
        ({"rate_limits": {20: {}}}, r"rate_limits names hosts \[20\] outside range"),
        ({"bursts": {0: {}}}, r"exactly one mode"),
        ({"bursts": {0: {"period_s": 5, "every": 3, "first": 1}}}, r"exactly one mode"),
        ({"bursts": {0: {"period_s": 5, "duration_s": 5}}}, r"0 < duration_s < period_s"),
        ({"bursts": {0: {"every": 3, "first": 3}}}, r"1 <= first < every"),
        ({"bursts": {0: {"period_s": -1}}}, r"finite number >= 0"),
        ({"crawl_delays": {0: 0}}, r"crawl_delays\[0\] must be a finite number"),
        ({"crawl_delays": {0: "soon"}}, r"not a number of seconds"),
        ({"crawl_delays": {-1: 1.0}}, r"outside range"),
        ({"static_rate_limits": {"nowhere.test": {}}}, r"'nowhere.test', which is no static"),
        ({"static_bursts": {"nowhere.test": {"every": 2, "first": 1}}}, r"no static site"),
    ],
)
def test_bad_pushback_config_is_refused_clearly(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FarmConfig(**fields)
    with pytest.raises(ValueError, match=message):
        FarmConfig.from_json(json.dumps(fields))


def test_with_pushback_draws_disjoint_shares_from_the_seed() -> None:
    base = FarmConfig(seed=9, hosts=100, total_pages=500, latency_ms=3.0)
    cfg = base.with_pushback()
    assert cfg.with_pushback() == cfg  # deterministic
    assert cfg.latency_ms == 3.0 and cfg.total_pages == 500
    model = FarmModel(cfg)
    hosts = model.pushback_hosts()
    kinds = [k for spec in hosts.values() for k in spec.kinds]
    assert len(hosts) == len(kinds) == 40  # one kind each: the sets are disjoint
    count = {k: kinds.count(k) for k in set(kinds)}
    assert count["retry_after"] + count["retry_after_date"] == 20
    assert count["retry_after_date"] == 10
    assert count["headerless_429"] + count["burst_503"] == 10
    assert count["headerless_429"] == count["burst_503"] == 5
    assert count["crawl_delay"] == 10
    assert all(isinstance(spec, HostPushback) for spec in hosts.values())
    assert [spec.index for spec in hosts.values()] == sorted(
        spec.index for spec in hosts.values() if spec.index is not None
    )
    other = FarmConfig(seed=10, hosts=100, total_pages=500).with_pushback()
    assert set(other.rate_limits) != set(cfg.rate_limits)
    # Shares and parameters are the caller's to choose.
    mild = base.with_pushback(
        0.5, 0.0, 0.5, rate_limit=RateLimit(requests=9, window_s=2.0), date_share=0.0,
        crawl_delay_s=2.0,
    )  # fmt: skip
    assert len(mild.rate_limits) == 50 and not mild.bursts and len(mild.crawl_delays) == 50
    assert {r.retry_after for r in mild.rate_limits.values()} == {"seconds"}
    assert {r.requests for r in mild.rate_limits.values()} == {9}
    assert set(mild.crawl_delays.values()) == {2.0}
    assert not set(mild.rate_limits) & set(mild.crawl_delays)
    with pytest.raises(ValueError, match="shares"):
        base.with_pushback(0.6, 0.3, 0.2)
    described = hosts[model.host_name(next(iter(cfg.crawl_delays)))].to_dict()
    assert described["kinds"] == ["crawl_delay"] and described["crawl_delay_s"] == 0.5
    json.dumps([spec.to_dict() for spec in hosts.values()])


# ----------------------------------------------------------------- rate limits
def test_rate_limit_with_retry_after_seconds_and_violations() -> None:
    model, tracker = _tracker(rate_limits={1: RateLimit(requests=2, window_s=3.0)})
    host = model.host_name(1)
    assert _statuses(tracker, host, [0.0, 0.5]) == [200, 200]
    refusal = tracker.receive(host, "/news/", 1.2)
    assert refusal is not None
    assert (refusal.status, refusal.reason) == (429, "rate_limit")
    # Room again when the first request leaves the window: 3.0 - 1.2 -> 2 s.
    assert (refusal.retry_after, refusal.retry_after_s) == ("2", 2)
    again = tracker.receive(host, "/", 2.5)  # inside the announced period
    assert again is not None and again.reason == "retry_after_period"
    assert (again.status, again.retry_after) == (429, "1")  # what is left, rounded up
    assert tracker.retry_after_violations == {host: 1}
    # The period ends at 3.2: served, and refusals did not fill the window.
    assert _statuses(tracker, host, [3.2, 3.3, 3.4]) == [200, 429, 429]
    assert tracker.retry_after_violations == {host: 2}
    assert tracker.refused == {host: 4}
    # Other hosts are never limited.
    assert _statuses(tracker, model.host_name(0), [3.4] * 10) == [200] * 10
    stats = tracker.stats()
    assert (stats["refused"], stats["retry_after_violations"]) == (4, 2)
    assert stats["refused_per_host"] == {host: 4}
    tracker.reset()
    assert tracker.stats()["refused"] == 0
    assert _statuses(tracker, host, [10.0, 10.0]) == [200, 200]


def test_a_request_received_before_the_429_left_is_refused_but_no_violation() -> None:
    model, tracker = _tracker(rate_limits={1: RateLimit(requests=1, window_s=3.0)})
    host = model.host_name(1)
    assert tracker.receive(host, "/", 0.0, reply_s=0.02) is None
    refusal = tracker.receive(host, "/a", 1.0, reply_s=0.02)  # its 429 leaves at 1.02
    assert refusal is not None and refusal.retry_after == "2"
    in_flight = tracker.receive(host, "/b", 1.01, reply_s=0.02)  # sent in ignorance
    assert in_flight is not None and in_flight.reason == "retry_after_period"
    assert tracker.retry_after_violations == {}
    race = tracker.receive(host, "/c", 1.03, reply_s=0.02)  # on its way as the 429 was read
    assert race is not None and tracker.retry_after_races == {host: 1}
    assert tracker.retry_after_violations == {}
    late = tracker.receive(host, "/d", 1.02 + REACTION_S, reply_s=0.02)  # a violation
    assert late is not None and tracker.retry_after_violations == {host: 1}
    retried = tracker.receive(host, "/a", 1.025, reply_s=0.02)  # the refused page at once
    assert retried is not None and tracker.retry_after_violations == {host: 2}
    assert tracker.refused == {host: 5}


def test_a_retry_after_violation_names_who_was_told_when_and_who_sent_it() -> None:
    model, tracker = _tracker(rate_limits={1: RateLimit(requests=1, window_s=3.0)})
    host = model.host_name(1)
    assert tracker.receive(host, "/", 0.0, wall=100.0, node="w0") is None
    refusal = tracker.receive(host, "/a", 1.0, wall=101.0, reply_s=0.02, node="w0")
    assert refusal is not None and refusal.retry_after == "2"
    assert tracker.receive(host, "/b", 2.0, wall=102.0, node="w1") is not None
    (event,) = tracker.stats()["violations"]
    assert event["kind"] == "retry_after" and event["node"] == "w1"
    assert event["announced_to"] == "w0"
    assert event["announced_wall"] == pytest.approx(101.02)
    assert event["early_s"] == pytest.approx(1.0)
    # The period over, the next one is announced afresh.
    assert tracker.receive(host, "/c", 3.5, wall=103.5, node="w1") is None
    assert tracker.receive(host, "/d", 3.6, wall=103.6, node="w1") is not None
    tracker.receive(host, "/e", 4.0, wall=104.0, node="w2")
    assert tracker.stats()["violations"][-1]["announced_to"] == "w1"


def test_minimum_gap_and_a_fixed_announced_period() -> None:
    model, tracker = _tracker(rate_limits={2: RateLimit(window_s=0.5, retry_after_s=5)})
    host = model.host_name(2)
    assert _statuses(tracker, host, [0.0, 0.5, 1.0]) == [200, 200, 200]  # one per 0.5 s
    refusal = tracker.receive(host, "/", 1.2)
    assert refusal is not None and refusal.retry_after == "5"  # fixed, not the window's 0.3 s
    assert _statuses(tracker, host, [2.0, 6.1, 6.2]) == [429, 429, 200]
    assert tracker.retry_after_violations == {host: 2}


def test_retry_after_as_an_http_date() -> None:
    model, tracker = _tracker(rate_limits={3: RateLimit(window_s=10.0, retry_after="date")})
    host = model.host_name(3)
    assert tracker.receive(host, "/", 0.0, WALL0) is None
    refusal = tracker.receive(host, "/", 4.0, WALL0 + 4.0)
    assert refusal is not None and refusal.retry_after_s == 6
    assert refusal.retry_after is not None and refusal.retry_after.endswith(" GMT")
    when = email.utils.parsedate_to_datetime(refusal.retry_after).timestamp()
    # Rounded up to the whole second, so waiting until the date waits long enough.
    assert when == 1795780811.0 >= WALL0 + 10.0
    assert parse_retry_after(refusal.retry_after, WALL0 + 4.0) == pytest.approx(6.75)
    again = tracker.receive(host, "/", 9.0, WALL0 + 9.0)
    assert again is not None and again.retry_after == refusal.retry_after  # the same date
    assert tracker.receive(host, "/", 10.0, WALL0 + 10.0) is None
    assert tracker.retry_after_violations == {host: 1}


def test_headerless_429_announces_nothing_and_counts_no_violations() -> None:
    model, tracker = _tracker(rate_limits={4: RateLimit(requests=1, retry_after="none")})
    host = model.host_name(4)
    refusals = [tracker.receive(host, "/", t / 10) for t in range(10)]
    assert refusals[0] is None
    assert all(r is not None and (r.status, r.retry_after) == (429, None) for r in refusals[1:])
    assert tracker.refused == {host: 9} and tracker.retry_after_violations == {}
    assert tracker.receive(host, "/", 1.0) is None
    assert model.pushback(4) is not None and not model.pushback(4).announces_retry_after


# ---------------------------------------------------------------------- bursts
def test_time_bursts_follow_the_seeded_phase() -> None:
    burst = Burst(period_s=10.0, duration_s=2.0)
    model, tracker = _tracker(bursts={1: burst, 2: burst})
    phase = model.burst_phase_s(1)
    assert 0.0 <= phase < 10.0
    assert phase != model.burst_phase_s(2)  # hosts burst at different times
    assert phase == FarmModel(model.config).burst_phase_s(model.host_name(1))  # deterministic
    host = model.host_name(1)
    assert tracker.receive(model.host_name(0), "/", 100.0) is None  # time zero of the bursts
    times = [100.0 + k * 0.25 for k in range(80)]  # two whole periods
    statuses = _statuses(tracker, host, times)
    expected = [503 if (t - 100.0 + phase) % 10.0 < 2.0 else 200 for t in times]
    assert statuses == expected
    assert statuses.count(503) == 16  # 2 s of every 10 s, sampled every 0.25 s
    assert tracker.refused[host] == 16 and tracker.retry_after_violations == {}
    assert burst.refuses(0.0, 0, phase_s=1.0) and not burst.refuses(1.0, 0, phase_s=1.0)


def test_count_bursts_refuse_the_first_k_of_every_n() -> None:
    model, tracker = _tracker(bursts={5: Burst(every=4, first=2)})
    host = model.host_name(5)
    assert _statuses(tracker, host, [0.0] * 11) == [503, 503, 200, 200] * 2 + [503, 503, 200]
    assert tracker.receive(host, "/robots.txt", 0.0) is None  # neither refused nor counted
    assert tracker.receive(host, "/", 0.0) is None
    refusal = tracker.receive(host, "/", 0.0)
    assert refusal is not None and refusal.retry_after is None  # never announces
    assert tracker.refused == {host: 7}
    assert model.pushback(5) is not None and model.pushback(5).burst_phase_s == 0.0


# ------------------------------------------------------------------ robots.txt
def test_robots_txt_body() -> None:
    model, _ = _tracker(crawl_delays={1: 2, 2: 0.25, 3: 0.1234})
    assert model.robots_txt(1) == b"User-agent: *\nCrawl-delay: 2\nDisallow:\n"
    assert model.robots_txt(2) == b"User-agent: *\nCrawl-delay: 0.25\nDisallow:\n"
    assert model.config.crawl_delays[3] == 0.123  # what the robots.txt can say
    assert model.robots_txt(3) == robots_txt(0.123)
    assert model.robots_txt(0) is None
    assert model.fault(1, "/robots.txt") == "missing"  # not a page: no crawl expects it
    assert model.url(1, "/robots.txt", 80) not in model.expected_urls(80)


def test_crawl_delay_violations_are_counted_never_refused() -> None:
    assert CRAWL_DELAY_TOLERANCE == 0.95
    model, tracker = _tracker(crawl_delays={1: 2.0})
    host = model.host_name(1)
    assert tracker.receive(host, "/robots.txt", 0.0) is None
    assert tracker.receive(host, "/", 0.5) is None  # robots.txt is no previous request
    assert tracker.receive(host, "/robots.txt", 1.0) is None  # nor is it a request too soon
    assert tracker.crawl_delay_violations == {}
    for now in (3.0, 4.0, 4.5, 7.0):  # gaps 2.5, 1.0 (too soon), 0.5 (too soon), 2.5
        assert tracker.receive(host, "/", now) is None  # counted, never refused
    assert tracker.crawl_delay_violations == {host: 2}
    assert _statuses(tracker, model.host_name(2), [7.0] * 5) == [200] * 5  # no Crawl-delay
    stats = tracker.stats()
    assert stats["robots_fetches"] == 2 and stats["robots_fetches_per_host"] == {host: 2}
    assert stats["crawl_delay_violations"] == 2 and stats["refused"] == 0


def test_crawl_delay_gaps_just_under_95_percent_are_violations() -> None:
    model, tracker = _tracker(crawl_delays={1: 2.0})
    host = model.host_name(1)
    tracker.receive(host, "/", 0.0)
    tracker.receive(host, "/", 1.9)  # exactly 95 %: fine
    tracker.receive(host, "/", 3.79)  # 1.89 s: too soon
    tracker.receive(host, "/", 3.8)  # 0.01 s after the previous *start*: too soon
    tracker.receive(host, "/", 10.0)
    assert tracker.crawl_delay_violations == {host: 2}
    assert tracker.stats()["crawl_delay_violations"] == 2


def test_a_crawl_delay_violation_says_when_the_request_before_it_arrived() -> None:
    model, tracker = _tracker(crawl_delays={1: 2.0})
    host = model.host_name(1)
    tracker.receive(host, "/a", 0.0, wall=100.0, node="w0")
    tracker.receive(host, "/b", 1.5, wall=101.5, node="w1")  # 0.5 s too early
    (event,) = tracker.stats()["violations"]
    assert (event["path"], event["wall"], event["early_s"]) == ("/b", 101.5, 0.5)
    assert (event["previous_wall"], event["previous_node"], event["node"]) == (100.0, "w0", "w1")


# ------------------------------------------------------------------ the server
def _server_config(tmp: Path) -> FarmConfig:
    site = tmp / "site"
    site.mkdir()
    (site / "index.html").write_text("<html><body>static</body></html>")
    return FarmConfig(
        seed=4,
        hosts=6,
        total_pages=60,
        latency_ms=150.0,
        static_sites={"static.example": str(site)},
        rate_limits={1: RateLimit(requests=1, window_s=30.0), 2: RateLimit(window_s=30.0,
                     retry_after="date"), 3: RateLimit(window_s=30.0, retry_after="none")},
        static_rate_limits={"static.example": RateLimit(window_s=30.0)},
        bursts={4: Burst(every=3, first=1)},
        crawl_delays={5: 5.0},
    )  # fmt: skip


def _get(farm: WebFarm, host: str, path: str) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", farm.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": f"{host}:{farm.port}"})
        resp = conn.getresponse()
        return resp.status, resp.read(), resp
    finally:
        conn.close()


@pytest.mark.slow
def test_server_refuses_announces_and_counts(tmp_path: Path) -> None:
    with WebFarm(_server_config(tmp_path)) as farm:
        name = farm.model.host_name
        assert set(farm.pushback_hosts()) == {*(name(i) for i in range(1, 6)), "static.example"}
        # Retry-After in seconds: served once, then refused with the period.
        assert _get(farm, name(1), "/")[0] == 200
        start = time.perf_counter()
        status, body, resp = _get(farm, name(1), "/news/")
        assert time.perf_counter() - start >= 0.8 * 0.150  # the base latency still applies
        assert status == 429 and b"429 Too Many Requests" in body
        seconds = int(resp.getheader("Retry-After", "0"))
        assert 1 <= seconds <= 30
        time.sleep(REACTION_S)  # sooner, it would be a race, not a violation
        status, _, resp = _get(farm, name(1), "/news/")  # a Retry-After violation
        assert status == 429 and 1 <= int(resp.getheader("Retry-After", "0")) <= seconds
        # Retry-After as an HTTP date.
        assert _get(farm, name(2), "/")[0] == 200
        status, _, resp = _get(farm, name(2), "/")
        date = resp.getheader("Retry-After")
        assert status == 429 and date is not None and date.endswith(" GMT")
        assert 0 < (parse_retry_after(date, time.time()) or 0) <= 31
        # A headerless 429, and a static site's limit.
        assert _get(farm, name(3), "/")[0] == 200
        status, _, resp = _get(farm, name(3), "/")
        assert status == 429 and resp.getheader("Retry-After") is None
        assert [_get(farm, "static.example", "/")[0] for _ in range(2)] == [200, 429]
        # 503 bursts: the first of every three requests, headerless.
        results = [_get(farm, name(4), "/") for _ in range(4)]
        assert [r[0] for r in results] == [503, 200, 200, 503]
        assert results[0][2].getheader("Retry-After") is None
        # robots.txt with a Crawl-delay, then two requests too close together.
        status, body, resp = _get(farm, name(5), "/robots.txt")
        assert (status, body) == (200, b"User-agent: *\nCrawl-delay: 5\nDisallow:\n")
        assert resp.getheader("Content-Type", "").startswith("text/plain")
        assert [_get(farm, name(5), "/")[0] for _ in range(2)] == [200, 200]
        assert _get(farm, name(0), "/robots.txt")[0] == 404  # no Crawl-delay, no robots.txt

        stats = farm.stats(urls=True)
        assert stats["refused_per_host"] == {
            name(1): 2, name(2): 1, name(3): 1, name(4): 2, "static.example": 1
        }  # fmt: skip
        assert stats["refused"] == 7
        assert stats["retry_after_violations_per_host"] == {name(1): 1}
        assert stats["retry_after_violations"] == 1
        assert stats["crawl_delay_violations_per_host"] == {name(5): 1}
        assert stats["robots_fetches_per_host"] == {name(5): 1, name(0): 1}
        assert stats["robots_fetches"] == 2
        assert stats["statuses"]["429"] == 5 and stats["statuses"]["503"] == 2
        # A page only ever refused: every fetch of it was a refusal.
        news = farm.url(1, "/news/")
        assert stats["fetches"][news] == stats["refused_urls"][news] == 2
        assert stats["per_host"][name(1)] == 3  # refusals are requests too

        farm.reset()
        stats = farm.stats(urls=True)
        assert stats["refused"] == stats["robots_fetches"] == 0
        assert stats["refused_urls"] == {} and stats["refused_per_host"] == {}
        assert _get(farm, name(1), "/news/")[0] == 200  # the window starts afresh
