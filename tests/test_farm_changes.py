"""The farm's changing pages, the freshness judge (pure), and the server serving them."""

from __future__ import annotations

import http.client
import math
import time

import pytest

from scrapy_banker.core.change_rate import freshness
from scrapy_banker.testing.farm import FarmConfig, FarmModel, WebFarm
from scrapy_banker.testing.farm.changes import ChangeModel, judge

KEYS = [f"/archive/{i}.html" for i in range(2000)]


def _changing(model: ChangeModel, least: float = 0.0) -> str:
    return next(k for k in KEYS if model.rate(k) > least)


def test_rates_are_drawn_from_the_seed_log_uniform_with_a_static_share() -> None:
    model = ChangeModel(seed=3, rate_min=1e-4, rate_max=1.0, static_share=0.2)
    rates = [model.rate(k) for k in KEYS]
    assert rates == [ChangeModel(seed=3, rate_min=1e-4, rate_max=1.0, static_share=0.2).rate(k)
                     for k in KEYS]  # fmt: skip
    assert rates != [ChangeModel(seed=4).rate(k) for k in KEYS]
    static = sum(1 for r in rates if r == 0) / len(rates)
    assert 0.17 < static < 0.23
    logs = [math.log10(r) for r in rates if r > 0]
    assert min(logs) >= -4 and max(logs) <= 0
    # Log-uniform: about a quarter in each decade of the four.
    for decade in range(-4, 0):
        share = sum(1 for v in logs if decade <= v < decade + 1) / len(logs)
        assert 0.2 < share < 0.3


def test_change_times_do_not_depend_on_the_order_of_the_questions() -> None:
    key = _changing(ChangeModel(seed=5, rate_min=0.1, rate_max=0.1, static_share=0))
    one = ChangeModel(seed=5, rate_min=0.1, rate_max=0.1, static_share=0)
    other = ChangeModel(seed=5, rate_min=0.1, rate_max=0.1, static_share=0)
    asked = [one.version(key, t) for t in (5.0, 50.0, 500.0, 20.0)]
    assert other.changes(key, 500.0)[: asked[2]] == one.changes(key, 500.0)
    assert asked == [other.version(key, t) for t in (5.0, 50.0, 500.0, 20.0)]
    # A Poisson process at 0.1 per second: about 100 changes in 1000 s.
    assert 75 <= one.version(key, 1000.0) <= 125


def test_a_pages_version_validators_and_next_change_agree() -> None:
    model = ChangeModel(seed=9, rate_min=0.5, rate_max=0.5, static_share=0)
    key = _changing(model)
    c1, c2 = model.changes(key, 100.0)[:2]
    assert model.version(key, c1 - 1e-9) == 0 and model.version(key, c1) == 1
    assert model.changed_at(key, (c1 + c2) / 2) == c1 and model.changed_at(key, c1 / 2) == 0.0
    assert model.next_change(key, 0.0) == c1 and model.next_change(key, c1) == c2
    assert model.etag(key, c1 / 2) != model.etag(key, c1) == model.etag(key, (c1 + c2) / 2)
    never = ChangeModel(seed=9, static_share=1.0)
    assert never.rate(key) == 0 and never.next_change(key, 10.0) == math.inf
    assert never.version(key, 1e9) == 0


def test_the_judge_counts_fresh_and_stale_time_and_the_age_of_stale_copies() -> None:
    model = ChangeModel(seed=2, rate_min=0.05, rate_max=0.05, static_share=0)
    key = _changing(model)
    c1, c2 = model.changes(key, 1000.0)[:2]
    late = c1 + (c2 - c1) / 2  # fetched again half-way to its second change
    end = c2  # judged until the second change
    got = judge(model, {key: [0.0, late], "/never.html": []}, 0.0, end)
    stale = late - c1
    assert got.freshness == pytest.approx((end - stale) / end)
    assert got.age_s == pytest.approx(stale / 2)  # the age grows 0 -> stale, linearly
    assert (got.never_fetched, got.fetches) == (1, 2)
    # A page found late counts from its first fetch only.
    found_late = judge(model, {key: [late]}, 0.0, end)
    assert found_late.freshness == 1.0 and found_late.age_s == 0.0
    with pytest.raises(ValueError, match="end > start"):
        judge(model, {}, 5.0, 5.0)


@pytest.mark.parametrize("ratio", [0.25, 1.0, 4.0])
def test_the_judge_agrees_with_the_poisson_model_for_regular_revisits(ratio: float) -> None:
    """Fetched every ``I`` s, a page changing at ``rate`` is current (1 - e^-x) / x of
    the time, x = rate I (core.change_rate.freshness): the farm and the core agree."""
    model = ChangeModel(seed=11, rate_min=0.02, rate_max=0.02, static_share=0)
    interval = ratio / 0.02
    keys = KEYS[:200]
    end = 40 * interval
    fetches = {k: [i * interval for i in range(40)] for k in keys}
    got = judge(model, fetches, 0.0, end)
    assert got.freshness == pytest.approx(freshness(0.02, 1 / interval), abs=0.03)


def test_a_bad_change_model_is_refused() -> None:
    with pytest.raises(ValueError, match="rate_min <= rate_max"):
        ChangeModel(rate_min=1.0, rate_max=0.1)
    with pytest.raises(ValueError, match="static_share"):
        ChangeModel(static_share=1.5)


def _get(
    farm: WebFarm, host: str, path: str, etag: str | None = None
) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", farm.port, timeout=30)
    headers = {"Host": f"{host}:{farm.port}"}
    if etag is not None:
        headers["If-None-Match"] = etag
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp
    finally:
        conn.close()


def test_a_bad_page_changes_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"page_changes has unknown keys \['rate'\]"):
        FarmConfig(page_changes={"rate": 1.0})
    with pytest.raises(ValueError, match="rate_min <= rate_max"):
        FarmConfig(page_changes={"rate_min": 2.0, "rate_max": 1.0})
    config = FarmConfig(page_changes={"rate_min": 0.01, "rate_max": 1, "static_share": 0.5})
    assert FarmConfig.from_json(config.to_json()) == config
    assert FarmModel(config).changes == ChangeModel(0, 0.01, 1.0, 0.5)
    assert FarmModel(FarmConfig()).changes is None


@pytest.mark.slow
def test_the_farm_serves_each_pages_version_its_etag_and_304s() -> None:
    rates = {"rate_min": 1e-6, "rate_max": 50.0, "static_share": 0.0}
    config = FarmConfig(seed=4, hosts=2, total_pages=80, page_changes=rates)
    model = FarmModel(config)
    changes = model.changes
    assert changes is not None
    pages = [(model.host_name(i), p) for i in range(2) for p in model.paths(i)]
    slow = next((h, p) for h, p in pages if changes.rate(f"{h}{p}") < 1e-4)
    fast = next((h, p) for h, p in pages if changes.rate(f"{h}{p}") > 20.0)
    with WebFarm(config) as farm:
        status, body, resp = _get(farm, *slow)
        etag = resp.getheader("ETag")
        assert status == 200 and etag is not None and b"<p>Revision 0</p>" in body
        full = farm.stats()["bytes_sent"]
        assert full > len(body)  # the body, its status line and headers
        status, body, resp = _get(farm, *slow, etag=etag)  # unchanged since
        assert (status, body, resp.getheader("ETag")) == (304, b"", etag)
        assert 0 < farm.stats()["bytes_sent"] - full < full / 4  # a 304 is headers only
        assert _get(farm, *slow, etag='"other"')[0] == 200
        first = _get(farm, *fast)
        time.sleep(0.5)  # 10+ changes on average at more than 20 a second
        status, body, resp = _get(farm, *fast, etag=first[2].getheader("ETag"))
        assert status == 200 and resp.getheader("ETag") != first[2].getheader("ETag")
        assert body != first[1] and b"<p>Revision " in body
        stats = farm.stats()
        slow_url = f"http://{slow[0]}:{farm.port}{slow[1]}"
        assert len(stats["page_fetches"][slow_url]) == 3  # 200, 304 and 200: all copies
        assert stats["statuses"]["304"] == 1
        # The changes' clock reads later than every copy it stamped (no wall-clock bound).
        last = max(t for times in stats["page_fetches"].values() for t in times)
        assert stats["changes_clock_s"] >= last > 0
    # Without page_changes, no validators and no revision (what every other test sees).
    with WebFarm(FarmConfig(seed=4, hosts=2, total_pages=80)) as plain:
        status, body, resp = _get(plain, *slow)
        assert status == 200 and resp.getheader("ETag") is None and b"Revision" not in body
        assert "page_fetches" not in plain.stats()


@pytest.mark.slow
def test_each_host_serves_a_sitemap_with_its_pages_lastmod_and_a_liar_stamps_now() -> None:
    from scrapy.utils.sitemap import Sitemap

    from scrapy_banker.core.recrawl import parse_lastmod

    rates = {"rate_min": 0.5, "rate_max": 5.0, "static_share": 0.5, "lying_share": 0.5}
    config = FarmConfig(seed=4, hosts=6, total_pages=60, page_changes=rates)
    model = FarmModel(config)
    changes = model.changes
    assert changes is not None
    hosts = [model.host_name(i) for i in range(6)]
    honest = next(i for i, h in enumerate(hosts) if not changes.lies(h))
    liar = next(i for i, h in enumerate(hosts) if changes.lies(h))
    with WebFarm(config) as farm:
        time.sleep(1.0)  # let the changing pages change
        started = time.time() - farm.stats()["changes_clock_s"]
        for i in (honest, liar):
            status, body, resp = _get(farm, hosts[i], "/sitemap.xml")
            served_at = time.time()
            assert status == 200 and resp.getheader("Content-Type") == "application/xml"
            dates = {e["loc"]: parse_lastmod(e["lastmod"]) for e in Sitemap(body)}
            assert set(dates) == {f"http://{hosts[i]}:{farm.port}{p}" for p in model.paths(i)}
            for path in model.paths(i):
                at = dates[f"http://{hosts[i]}:{farm.port}{path}"]
                assert at is not None
                if i == liar:  # every page "changed" as the sitemap was served
                    assert served_at - 1.0 < at <= served_at + 0.01
                elif changes.rate(f"{hosts[i]}{path}") == 0:  # never changed: the start
                    assert at == pytest.approx(started, abs=0.05)
                else:  # one of the page's change times, on the changes' clock
                    times = changes.changes(f"{hosts[i]}{path}", served_at - started + 1)
                    assert min(abs(t - (at - started)) for t in [0.0, *times]) < 0.02
        assert "/sitemap.xml" not in str(farm.stats()["page_fetches"])  # not a page
