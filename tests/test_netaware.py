"""Measurement middleware and landmark prober of network-aware placement."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from scrapy_banker.core.meta import META_PROBE as PROBE_META
from scrapy_banker.net.netstats import LinkStats
from scrapy_banker.scheduler.netaware import (
    NetworkMeasureMiddleware,
    Prober,
    link_stats,
    site_of,
)
from scrapy_banker.settings import load_placement_config

PLACED: dict[str, Any] = {"BANKER_PLACEMENT": "top1"}


class NetSpider(Spider):
    name = "net"


def _crawler(settings: dict[str, Any] | None = None) -> Any:
    crawler = get_crawler(NetSpider, {**PLACED, **(settings or {})})
    crawler.spider = NetSpider()
    return crawler


def _fetch(
    mw: NetworkMeasureMiddleware,
    url: str,
    body: bytes = b"<html></html>",
    latency: Any = 0.25,
    meta: dict[str, Any] | None = None,
    *,
    stamp: bool = True,
) -> HtmlResponse:
    request = Request(url, meta=dict(meta or {}))
    if stamp:
        mw.process_request(request)
    if latency is not None:
        request.meta["download_latency"] = latency
    response = HtmlResponse(url, body=body, request=request)
    out = mw.process_response(request, response)
    assert out is response  # the middleware only observes
    return response


def _stats(crawler: Any) -> dict[str, Any]:
    return crawler.stats.get_stats()


# -- NetworkMeasureMiddleware ---------------------------------------------------------------


def test_records_latency_and_bandwidth_per_netloc() -> None:
    crawler = _crawler()
    mw = NetworkMeasureMiddleware.from_crawler(crawler)
    assert mw.links is link_stats(crawler)
    _fetch(mw, "http://A.test/1", body=b"x" * 1000, latency=0.5)
    _fetch(mw, "http://a.test/2", body=b"x" * 3000, latency=0.5)
    _fetch(mw, "https://a.test:8443/x", body=b"y" * 200, latency=0.1)
    links = mw.links
    assert sorted(links.sites()) == ["a.test", "a.test:8443"]
    assert links.samples("a.test") == 2 and links.samples("a.test:8443") == 1
    lat = links.latency("a.test")
    assert lat is not None and lat.median == pytest.approx(0.5)
    # elapsed = max(time since process_request, download_latency): the latency here.
    bw = links.bandwidth("a.test")
    assert bw is not None and sorted(links._link("a.test").bandwidth.values()) == pytest.approx(
        [2000.0, 6000.0], rel=1e-3
    )
    other = links.latency("a.test:8443")
    assert other is not None and other.last == pytest.approx(0.1)
    assert _stats(crawler)["banker/net/samples"] == 3
    assert "banker/net/probe_responses" not in _stats(crawler)


def test_bandwidth_uses_whole_download_time_when_longer_than_latency() -> None:
    crawler = _crawler()
    mw = NetworkMeasureMiddleware.from_crawler(crawler)
    request = Request("http://slow.test/big")
    mw.process_request(request)
    request.meta["banker_net_t0"] = time.monotonic() - 2.0  # started 2 s ago
    request.meta["download_latency"] = 0.1
    mw.process_response(request, HtmlResponse(request.url, body=b"z" * 4000, request=request))
    bw = mw.links.bandwidth("slow.test")
    assert bw is not None and bw.last == pytest.approx(2000.0, rel=0.05)
    lat = mw.links.latency("slow.test")
    assert lat is not None and lat.last == pytest.approx(0.1)


def test_responses_without_download_latency_are_skipped() -> None:
    crawler = _crawler()
    mw = NetworkMeasureMiddleware.from_crawler(crawler)
    _fetch(mw, "http://cached.test/", latency=None)  # e.g. HTTP cache hit
    _fetch(mw, "http://cached.test/", latency="0.2")  # not a number
    _fetch(mw, "http://nostamp.test/", latency=0.2, stamp=False)  # never saw the request
    assert mw.links.sites() == []
    assert "banker/net/samples" not in _stats(crawler)
    assert "banker/net/rejected_samples" not in _stats(crawler)


@pytest.mark.parametrize("latency", [float("nan"), -0.5, float("inf")])
def test_invalid_latency_is_rejected_not_raised(latency: float) -> None:
    crawler = _crawler()
    mw = NetworkMeasureMiddleware.from_crawler(crawler)
    _fetch(mw, "http://odd.test/", latency=latency, meta={PROBE_META: "odd.test"})
    assert mw.links.sites() == []
    stats = _stats(crawler)
    assert stats["banker/net/rejected_samples"] == 1
    assert "banker/net/samples" not in stats
    assert "banker/net/probe_responses" not in stats


def test_probe_responses_are_counted() -> None:
    crawler = _crawler()
    mw = NetworkMeasureMiddleware.from_crawler(crawler)
    _fetch(mw, "http://p.test/robots.txt", latency=0.05, meta={PROBE_META: "p.test"})
    _fetch(mw, "http://p.test/robots.txt", latency=0.06, meta={PROBE_META: "p.test"})
    _fetch(mw, "http://p.test/page", latency=0.07)
    stats = _stats(crawler)
    assert stats["banker/net/samples"] == 3
    assert stats["banker/net/probe_responses"] == 2
    assert mw.links.samples("p.test") == 3  # probes feed the same statistics


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"BANKER_NET_MEASURE": False}, "BANKER_NET_MEASURE"),
        ({"BANKER_NET_MEASURE": "false"}, "BANKER_NET_MEASURE"),
        ({"BANKER_PLACEMENT": "hash"}, "BANKER_PLACEMENT is 'hash'"),
    ],
)
def test_not_configured(
    settings: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = _crawler(settings)
    with caplog.at_level(logging.DEBUG, "scrapy_banker"), pytest.raises(NotConfigured) as info:
        NetworkMeasureMiddleware.from_crawler(crawler)
    assert not info.value.args  # Scrapy logs a NotConfigured message as a warning
    assert message in caplog.text


def test_default_settings_disable_the_middleware() -> None:
    crawler = get_crawler(NetSpider, {})  # BANKER_PLACEMENT defaults to "hash"
    with pytest.raises(NotConfigured):
        NetworkMeasureMiddleware.from_crawler(crawler)


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"BANKER_PLACEMENT": "nearest"}, "BANKER_PLACEMENT"),
        ({"BANKER_PLACEMENT": "top1", "BANKER_PLACEMENT_COST": "cheap"}, "BANKER_PLACEMENT_COST"),
        ({"BANKER_PROBE_PATH": "robots.txt"}, "BANKER_PROBE_PATH"),
        ({"BANKER_NET_WINDOW": 1}, "BANKER_NET_WINDOW"),
        ({"BANKER_NET_MEASURE": "maybe"}, "BANKER_NET_MEASURE"),
    ],
)
def test_bad_placement_settings_name_the_setting(settings: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"Invalid {name}="):
        NetworkMeasureMiddleware.from_crawler(_crawler(settings))


def test_bad_placement_fails_even_with_measurement_off() -> None:
    crawler = _crawler({"BANKER_PLACEMENT": "bogus", "BANKER_NET_MEASURE": False})
    with pytest.raises(ValueError, match="Invalid BANKER_PLACEMENT='bogus'"):
        NetworkMeasureMiddleware.from_crawler(crawler)


def test_link_stats_is_one_per_crawler() -> None:
    first, second = _crawler(), _crawler()
    links = link_stats(first)
    assert isinstance(links, LinkStats)
    assert link_stats(first) is links
    assert link_stats(second) is not links
    assert NetworkMeasureMiddleware.from_crawler(first).links is links
    assert NetworkMeasureMiddleware.from_crawler(second).links is link_stats(second)


def test_site_of_is_lower_case_netloc() -> None:
    assert site_of(Request("https://WWW.Example.TEST:8443/a?b")) == "www.example.test:8443"
    assert site_of(Request("http://example.test/")) == "example.test"


# -- Prober ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Sender:
    """The prober's ``send``: collects requests, hands back a Deferred per request."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.deferreds: list[Deferred[Any]] = []

    def __call__(self, request: Request) -> Deferred[Any]:
        self.requests.append(request)
        d: Deferred[Any] = Deferred()
        self.deferreds.append(d)
        return d

    def sites(self) -> list[str]:
        return [r.meta[PROBE_META] for r in self.requests]


def _prober(
    settings: dict[str, Any] | None = None,
    known: dict[str, str] | None = None,
) -> tuple[Prober, Sender, FakeClock, Any]:
    crawler = _crawler({"BANKER_PROBE_RATE": 1000.0, **(settings or {})})
    config = load_placement_config(crawler.settings)
    clock = FakeClock()
    sender = Sender()
    prober = Prober(config, sender, crawler.stats, clock=clock)
    if known:
        prober.update(known.items())
    return prober, sender, clock, crawler


SITES = {f"s{i:02d}.test": "http" for i in range(12)}


def test_landmark_probes_every_known_site() -> None:
    prober, sender, _, crawler = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 2}, SITES
    )
    assert prober.tick() == 24
    assert sorted(set(sender.sites())) == sorted(SITES)
    assert all(sender.sites().count(s) == 2 for s in SITES)
    assert _stats(crawler)["banker/net/probes"] == 24
    assert prober.targets() == []


def test_non_landmark_probes_only_first_reference_sites_by_name() -> None:
    prober, sender, _, _ = _prober({"BANKER_GNP_REFERENCE_SITES": 3, "BANKER_PROBE_SAMPLES": 1})
    prober.update([("zeta.test", "http"), ("alpha.test", "http"), ("mid.test", "https")])
    prober.update([("beta.test", "http"), ("omega.test", "http")])
    assert prober.tick() == 3
    assert sorted(sender.sites()) == ["alpha.test", "beta.test", "mid.test"]
    assert prober.tick() == 0


def test_never_more_than_probe_samples_per_site() -> None:
    prober, sender, clock, _ = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 3, "BANKER_PROBE_RATE": 2.0},
        {"a.test": "http", "b.test": "http"},
    )
    for step in range(40):
        clock.now = step * 0.5
        prober.tick()
    assert sorted(sender.sites()) == ["a.test"] * 3 + ["b.test"] * 3
    assert prober.sent == {"a.test": 3, "b.test": 3}
    prober.update([("c.test", "https")])  # a site discovered later still gets its probes
    clock.now += 10
    assert prober.tick() == 2  # the burst of a 2/s bucket
    clock.now += 10
    assert prober.tick() == 1
    assert sender.sites().count("c.test") == 3


def test_rate_limit_with_fake_clock() -> None:
    prober, sender, clock, _ = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 3, "BANKER_PROBE_RATE": 2.0},
        SITES,
    )
    assert prober.tick() == 2  # burst = int(rate)
    assert prober.tick() == 0  # no time passed: no token
    clock.now = 0.25
    assert prober.tick() == 0  # half a token
    clock.now = 0.5
    assert prober.tick() == 1
    clock.now = 1.5
    assert prober.tick() == 2
    clock.now = 100.0  # a long pause refills only up to the burst
    assert prober.tick() == 2
    # Over any run: burst + rate * elapsed at most.
    for step in range(1, 21):
        clock.now = 100.0 + step * 0.1
        prober.tick()
    assert len(sender.requests) <= 2 + 1 + 2 + 2 + 2 * 2.0 + 1e-9
    assert len(sender.requests) == 11
    # Breadth-first: every site once (in name order) before any site twice.
    assert sender.sites() == sorted(SITES)[:11]


def test_nodes_start_their_probe_rounds_at_different_sites() -> None:
    crawler = _crawler(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 1, "BANKER_PROBE_RATE": 1000.0}
    )
    config = load_placement_config(crawler.settings)
    firsts = set()
    for node in ("n0", "n1", "n2", "n3"):
        sender = Sender()
        prober = Prober(config, sender, crawler.stats, clock=FakeClock(), node=node)
        prober.update(SITES.items())
        assert prober.tick() == len(SITES)
        assert sorted(sender.sites()) == sorted(SITES)  # every site, once
        firsts.add(sender.sites()[0])
    assert len(firsts) > 1


def test_sites_already_measured_by_crawl_traffic_are_not_probed_again() -> None:
    crawled = {"s00.test": 5, "s01.test": 1}
    prober, sender, _, _ = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 3},
        {"s00.test": "http", "s01.test": "http", "s02.test": "http"},
    )
    prober.measured = lambda site: crawled.get(site, 0)
    # s00 has enough samples from its crawl; s01 too few, and the samples of probes
    # still in flight are not known yet, so it is probed like an unmeasured site.
    assert prober.tick() == 6
    assert sorted(sender.sites()) == ["s01.test"] * 3 + ["s02.test"] * 3
    assert prober.targets() == []
    crawled["s03.test"] = 3
    prober.update([("s03.test", "http")])
    assert prober.tick() == 0
    prober.update([("s04.test", "http")])  # a new site: probed although the others were done
    assert prober.tick() == 3
    assert prober.tick() == 0


def test_heaviest_sites_are_probed_first_and_rounds_stay_breadth_first() -> None:
    prober, sender, clock, _ = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 2, "BANKER_PROBE_RATE": 3.0},
        SITES,
    )
    weights = {"s07.test": 200.0, "s03.test": 50.0, "s10.test": 50.0, "s01.test": 0.0}
    prober.update([], weights)
    assert prober.weights is weights
    assert prober.tick() == 3  # the burst: the heaviest three (ties in name order)
    assert sender.sites() == ["s07.test", "s03.test", "s10.test"]
    for step in range(1, 40):
        clock.now = step
        prober.tick()
    sites = sender.sites()
    assert len(sites) == 24
    # Every site once before any twice, and each round heaviest first.
    first, second = sites[:12], sites[12:]
    assert sorted(first) == sorted(SITES) == sorted(second)
    assert first[:3] == second[:3] == ["s07.test", "s03.test", "s10.test"]


def test_rate_zero_sends_nothing() -> None:
    prober, sender, clock, crawler = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_RATE": 0}, SITES
    )
    assert prober.limiter is None
    for step in range(5):
        clock.now = step * 10.0
        assert prober.tick() == 0
    assert sender.requests == []
    assert "banker/net/probes" not in _stats(crawler)


def test_hash_mode_sends_nothing() -> None:
    prober, sender, clock, crawler = _prober(
        {"BANKER_PLACEMENT": "hash", "BANKER_GNP_LANDMARK": True}, SITES
    )
    clock.now = 5.0
    assert prober.tick() == 0
    assert sender.requests == []
    assert "banker/net/probes" not in _stats(crawler)


def test_probe_request_uses_known_scheme_and_path() -> None:
    prober, sender, _, _ = _prober(
        {"BANKER_PROBE_PATH": "/ping?x=1", "BANKER_PROBE_SAMPLES": 1, "BANKER_GNP_LANDMARK": True},
        {"secure.test:8443": "https", "plain.test": "http"},
    )
    prober.update([("plain.test", "https")])  # first scheme learned wins
    assert prober.tick() == 2
    by_site = {r.meta[PROBE_META]: r for r in sender.requests}
    assert by_site["plain.test"].url == "http://plain.test/ping?x=1"
    assert by_site["secure.test:8443"].url == "https://secure.test:8443/ping?x=1"
    for request in sender.requests:
        assert request.dont_filter
        assert request.meta["dont_retry"] is True
        assert request.meta["handle_httpstatus_all"] is True
        assert request.meta["dont_redirect"] is True
        assert site_of(request) == request.meta[PROBE_META]


def test_default_probe_path_is_robots_txt() -> None:
    prober, sender, _, _ = _prober({"BANKER_PROBE_SAMPLES": 1}, {"r.test": "http"})
    prober.tick()
    assert [r.url for r in sender.requests] == ["http://r.test/robots.txt"]


def test_errback_counts_probe_errors() -> None:
    prober, sender, _, crawler = _prober(
        {"BANKER_GNP_LANDMARK": True, "BANKER_PROBE_SAMPLES": 1},
        {"a.test": "http", "b.test": "http", "c.test": "http"},
    )
    assert prober.tick() == 3
    failed_a, ok_b, failed_c = sender.deferreds
    failed_a.errback(Failure(ConnectionRefusedError("refused")))
    ok_b.callback(HtmlResponse("http://b.test/robots.txt", body=b""))
    failed_c.errback(Failure(TimeoutError("slow")))
    stats = _stats(crawler)
    assert stats["banker/net/probes"] == 3
    assert stats["banker/net/probe_errors"] == 2
    # The errback consumed the failures: nothing is left unhandled.
    results: list[Any] = []
    for d in (failed_a, failed_c):
        d.addBoth(results.append)
    assert results == [None, None]


@pytest.mark.parametrize("rate", [float("inf"), "inf", "-inf", float("nan")])
def test_non_finite_probe_rate_is_refused_at_start_up_by_name(rate: Any) -> None:
    """Regression: inf used to pass validation and crash Prober with OverflowError."""
    crawler = _crawler({"BANKER_PROBE_RATE": rate, "BANKER_PROBE_SAMPLES": 1})
    with pytest.raises(ValueError, match=r"BANKER_PROBE_RATE.*finite"):
        load_placement_config(crawler.settings)


def test_send_returning_none_is_fine() -> None:
    crawler = _crawler({"BANKER_PROBE_SAMPLES": 1})
    config = load_placement_config(crawler.settings)
    seen: list[Request] = []
    prober = Prober(config, seen.append, crawler.stats, clock=FakeClock())
    prober.update([("x.test", "http")])
    assert prober.tick() == 1
    assert len(seen) == 1 and "banker/net/probe_errors" not in _stats(crawler)
