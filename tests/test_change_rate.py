"""The Poisson model of page change: freshness, the change-rate estimator, optimal revisits."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scrapy_banker.core.change_rate import (
    RateEstimate,
    frequency_at,
    freshness,
    mean_freshness,
    optimal_frequencies,
    optimal_mu,
)


def test_freshness_of_a_page_is_the_share_of_an_interval_before_its_first_change() -> None:
    # Fetched every hour, changing once an hour on average: (1 - e^-1) / 1.
    assert freshness(1 / 3600, 1 / 3600) == pytest.approx(1 - math.exp(-1), rel=1e-12)
    assert freshness(0.0, 0.0) == 1.0  # never changes: current once fetched
    assert freshness(1e-3, 0.0) == 0.0  # never fetched again
    assert freshness(1e-9, 1.0) == pytest.approx(1.0, abs=1e-8)
    with pytest.raises(ValueError, match=">= 0"):
        freshness(-1.0, 1.0)


def _simulate(rate: float, intervals: list[float], seed: int) -> RateEstimate:
    """Fetches ``intervals`` apart of a page changing as a Poisson process at ``rate``."""
    rng = random.Random(seed)
    estimate = RateEstimate()
    for t in intervals:
        changed = rng.random() < -math.expm1(-rate * t)
        estimate = estimate.observe(t, changed)
    return estimate


def test_the_estimator_is_cho_and_garcia_molinas_for_equal_intervals() -> None:
    """-log((n - X + 0.5) / (n + 0.5)) / I: the bias-reduced estimator of their TOIT paper."""
    estimate = RateEstimate()
    outcomes = [True, False, True, True, False, False, False, True]
    for changed in outcomes:
        estimate = estimate.observe(600.0, changed)
    n, x = len(outcomes), sum(outcomes)
    assert estimate.rate() == pytest.approx(-math.log((n - x + 0.5) / (n + 0.5)) / 600.0)
    # Every fetch changed: still finite (the naive X / (n I) would say "at most once per I").
    every = RateEstimate().observe(10.0, True).observe(10.0, True)
    assert every.rate() == pytest.approx(math.log(2.5 / 0.5) / 10.0)


@pytest.mark.parametrize("rate", [1 / 60, 1 / 3600, 1 / 86400])
def test_the_estimate_finds_the_true_rate_of_a_simulated_page(rate: float) -> None:
    # Fetched at irregular intervals around the mean time between its changes.
    rng = random.Random(7)
    intervals = [rng.uniform(0.3, 2.0) / rate for _ in range(2000)]
    estimate = _simulate(rate, intervals, seed=11)
    got = estimate.rate()
    assert got is not None and got == pytest.approx(rate, rel=0.1)
    # The naive count of changes over time errs slow: several changes between
    # two fetches are seen as one.
    naive = estimate.changed / (estimate.changed_s + estimate.unchanged_s)
    assert naive < 0.8 * rate


def test_a_page_that_never_changed_has_rate_zero_and_no_fetch_none() -> None:
    assert RateEstimate().rate() is None
    assert RateEstimate().observe(3600.0, False).observe(7200.0, False).rate() == 0.0


def test_decay_follows_a_page_whose_rate_moved() -> None:
    slow, fast = 1 / 86400, 1 / 600
    before = [3600.0] * 200
    estimate = RateEstimate()
    rng = random.Random(3)
    for t in before:
        estimate = estimate.observe(t, rng.random() < -math.expm1(-slow * t), decay=0.9)
    for t in [600.0] * 60:
        estimate = estimate.observe(t, rng.random() < -math.expm1(-fast * t), decay=0.9)
    got = estimate.rate()
    assert got is not None and got == pytest.approx(fast, rel=0.5)


def test_a_rate_estimate_round_trips_through_json_and_refuses_bad_fields() -> None:
    estimate = RateEstimate().observe(60.0, True).observe(120.0, False)
    assert RateEstimate.from_json(estimate.to_json()) == estimate
    with pytest.raises(ValueError, match="unknown rate estimate fields"):
        RateEstimate.from_json({"changes": 1})
    with pytest.raises(ValueError, match="not a finite number"):
        RateEstimate.from_json({"changed": float("nan")})
    with pytest.raises(ValueError, match="decay"):
        RateEstimate().observe(1.0, True, decay=0.0)


def test_optimal_revisits_spend_the_budget_and_skip_pages_too_fast_to_keep() -> None:
    """Cho & Garcia-Molina's example shape: the fastest page gets less than a middle one."""
    rates = [0.0, 1 / 86400, 1 / 3600, 1 / 600, 1 / 60, 1.0]
    budget = 1 / 300
    freqs = optimal_frequencies(rates, budget)
    assert sum(freqs) == pytest.approx(budget, rel=1e-9)
    assert freqs[0] == 0.0  # never changes
    assert freqs[-1] == 0.0  # changes every second: not worth a share of one fetch per 300 s
    assert freqs[2] > freqs[1] > 0
    # Not proportional to the rates: the page changing every minute gets less
    # than the one changing every 10 minutes.
    assert freqs[4] < freqs[3]
    # Every page that gets fetches gains the same from one more (the multiplier).
    mu = optimal_mu(rates, budget)
    assert mu is not None
    for rate, f in zip(rates, freqs, strict=True):
        if f > 0:
            x = rate / f
            assert (1 - (1 + x) * math.exp(-x)) / rate == pytest.approx(mu, rel=1e-6)
            assert frequency_at(rate, mu) == pytest.approx(f)


@settings(max_examples=200, deadline=None)
@example(rates=[0.09375, 1e-05], budget=0.001953125)  # found by CI: a page in the linear regime
@given(
    st.lists(st.floats(min_value=1e-7, max_value=1e-1), min_size=1, max_size=40),
    st.floats(min_value=1e-5, max_value=10.0),
)
def test_the_optimal_allocation_is_at_least_as_fresh_as_any_uniform_one(
    rates: list[float], budget: float
) -> None:
    best = optimal_frequencies(rates, budget)
    assert sum(best) == pytest.approx(budget, rel=1e-6)
    uniform = [budget / len(rates)] * len(rates)
    proportional = [budget * r / sum(rates) for r in rates]
    top = mean_freshness(rates, best)
    assert top >= mean_freshness(rates, uniform) - 1e-9
    assert top >= mean_freshness(rates, proportional) - 1e-9


def test_no_budget_or_no_change_allocates_nothing_and_bad_input_is_refused() -> None:
    assert optimal_frequencies([1e-3, 1e-4], 0.0) == [0.0, 0.0]
    assert optimal_frequencies([0.0, 0.0], 1.0) == [0.0, 0.0]
    assert optimal_mu([0.0], 1.0) is None
    with pytest.raises(ValueError, match="budget"):
        optimal_frequencies([1e-3], -1.0)
    with pytest.raises(ValueError, match="rates"):
        optimal_frequencies([float("inf")], 1.0)
