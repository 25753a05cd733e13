"""The farm's changing pages and the freshness judge (pure: no server)."""

from __future__ import annotations

import math

import pytest

from scrapy_banker.core.change_rate import freshness
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
