"""How often a page changes, and how often to revisit it: the Poisson model of page change.

A page that changes as a Poisson process with rate ``lambda`` (changes per
second) and is fetched every ``1/f`` seconds is current, averaged over time,
a share ``F(lambda, f) = (f / lambda) (1 - exp(-lambda / f))`` of the time
(Cho & Garcia-Molina, "Effective page refresh policies for Web crawlers",
ACM TODS 2003).  Two things follow, and this module holds both:

* **Estimating the rate** from what a crawler sees: at each fetch, only
  whether the page changed since the previous one -- not how many times.
  For fetches ``t_i`` seconds apart the likelihood is
  ``prod_changed (1 - exp(-lambda t_i)) x prod_unchanged exp(-lambda t_j)``;
  its maximum solves ``sum_changed t_i / (exp(lambda t_i) - 1) =
  sum_unchanged t_j`` (Cho & Garcia-Molina, "Estimating frequency of
  change", ACM TOIT 2003).  Their bias-reduced estimator for equal
  intervals, ``-log((n - X + 0.5) / (n + 0.5)) / I``, is exactly that
  maximum with half an unchanged observation added, which also keeps the
  estimate finite when every fetch found a change; :class:`RateEstimate`
  adds the half observation the same way for unequal intervals.  It keeps
  three decayed sums instead of a history (a few bytes per URL, which a
  frontier of millions of URLs in Redis can afford), treating the changed
  fetches as if they were all of their mean interval -- exact when the
  intervals are equal, and the decay lets a page whose rate moves be
  followed.

* **Allocating revisits**: with a fixed budget of fetches per second and
  rates known, the revisit frequencies that maximise the mean freshness
  are *not* proportional to the rates.  Each page gets the frequency at
  which one more fetch per second gains the same freshness (a Lagrange
  multiplier ``mu``): ``g(lambda / f) = mu lambda`` with ``g(x) = 1 - (1 + x)
  exp(-x)``; a page that changes faster than ``1 / mu`` gets none (it
  would be stale again before it pays).  :func:`optimal_frequencies` finds
  ``mu`` for the budget.  This is the limit the freshness benchmark
  measures every peer against.

Pure: no Scrapy, Twisted, Redis or clock reads; scipy finds the roots (imported
on first use: the settings name this module's neighbours, and a worker that
never revisits should not pay scipy's import).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scrapy_banker.core.json_fields import fields_from_json

__all__ = [
    "RateEstimate",
    "frequency_at",
    "freshness",
    "mean_freshness",
    "optimal_frequencies",
    "optimal_mu",
]


def brentq(f: Callable[[float], float], lo: float, hi: float, **kwargs: float) -> float:
    """:func:`scipy.optimize.brentq`, imported when first needed."""
    from scipy.optimize import brentq as scipy_brentq

    return float(scipy_brentq(f, lo, hi, **kwargs))


#: The half observation of the bias-reduced estimator (see the module's doc).
_PRIOR_WEIGHT = 0.5

#: Rates are searched between these, changes per second (a millennium to a millisecond).
_RATE_LO = 1e-11
_RATE_HI = 1e3


def freshness(rate: float, frequency: float) -> float:
    """The share of time a copy is current: changing at ``rate``, fetched ``frequency`` a second.

    A page that never changes is always current once fetched; one never
    fetched again is current for no share of an infinite horizon.
    """
    if rate < 0 or frequency < 0:
        raise ValueError("rate and frequency must be >= 0")
    if rate == 0:
        return 1.0
    if frequency == 0:
        return 0.0
    x = rate / frequency
    return -math.expm1(-x) / x


def mean_freshness(rates: Sequence[float], frequencies: Sequence[float]) -> float:
    """The time-averaged share of ``rates``' pages that are current at ``frequencies``."""
    if len(rates) != len(frequencies):
        raise ValueError("one frequency per rate")
    if not rates:
        return 1.0
    return sum(freshness(r, f) for r, f in zip(rates, frequencies, strict=True)) / len(rates)


def _g(x: float) -> float:
    """``1 - (1 + x) e^-x``: lambda x the gain in freshness of one more fetch per second."""
    if x < 0.01:  # e^x - 1 - x by its series: the subtraction would cancel
        return math.exp(-x) * x * x * (0.5 + x * (1 / 6 + x * (1 / 24 + x / 120)))
    return -math.expm1(-x) - x * math.exp(-x)


def _g_inverse(mu_rate: float) -> float:
    """The ``x`` with ``_g(x) = mu_rate``, for ``0 < mu_rate < 1``.

    Near 1 (a page changing many times per revisit) it is solved as
    ``log(1 + x) - x = log(1 - mu_rate)``, where ``_g`` itself would round
    away what decides ``x``; near 0, on ``_g`` with a relative tolerance.
    """
    if mu_rate < 1e-12:  # g(x) = x^2/2 - x^3/3 + ...: its inverse by the series
        x = math.sqrt(2 * mu_rate)
        return x * (1 + x / 3)
    if mu_rate < 0.5:
        hi = min(2.0, 4 * math.sqrt(mu_rate))  # g(4 sqrt(y)) > y for such y
        return float(brentq(lambda x: _g(x) - mu_rate, 0.0, hi, xtol=1e-300, rtol=1e-11))
    target = math.log1p(-mu_rate)
    hi = 2.0
    while math.log1p(hi) - hi > target:
        hi *= 2
    return float(brentq(lambda x: math.log1p(x) - x - target, 0.0, hi, xtol=1e-14, rtol=1e-12))


def frequency_at(rate: float, mu: float) -> float:
    """The optimal revisit frequency of a page changing at ``rate`` for the multiplier ``mu``.

    ``mu`` is the freshness one more fetch per second must gain, the same for
    every page of an optimal allocation (:func:`optimal_mu` finds it for a
    budget).  ``0`` for a page that never changes or changes faster than
    ``1 / mu``.
    """
    if rate <= 0 or mu * rate >= 1:
        return 0.0
    return rate / _g_inverse(mu * rate)


def optimal_mu(rates: Sequence[float], budget: float) -> float | None:
    """The multiplier at which :func:`frequency_at` spends ``budget`` over ``rates``.

    ``None`` when nothing is to be spent: no budget, or no page changes.
    """
    if budget < 0 or not math.isfinite(budget):
        raise ValueError(f"budget must be a finite number >= 0, got {budget!r}")
    if any(r < 0 or not math.isfinite(r) for r in rates):
        raise ValueError("rates must be finite numbers >= 0")
    changing = [r for r in rates if r > 0]
    if budget == 0 or not changing:
        return None

    def excess(log_mu: float) -> float:
        mu = math.exp(log_mu)
        return sum(frequency_at(r, mu) for r in changing) - budget

    # Spent frequency falls as mu rises: it grows without bound as mu -> 0
    # and is nothing from mu = 1 / (the slowest rate) on.
    hi = math.log(1.0 / min(changing))
    if excess(hi) >= 0:  # a budget too small to resolve: mu is at its bound
        return math.exp(hi)
    lo = hi - 1.0
    while excess(lo) < 0:
        lo -= 2 * (hi - lo)
    return math.exp(brentq(excess, lo, hi, xtol=1e-12, rtol=1e-12))


def optimal_frequencies(rates: Sequence[float], budget: float) -> list[float]:
    """Revisit frequencies (fetches per second, summing to ``budget``) that maximise mean freshness.

    ``rates``: each page's change rate, changes per second.  Pages that never
    change get ``0`` (one fetch keeps them current for ever), and so do pages
    that change too fast to be worth a share of this budget.  All-zero rates
    give all zeros whatever the budget.
    """
    mu = optimal_mu(rates, budget)
    if mu is None:
        return [0.0] * len(rates)
    out = [frequency_at(r, mu) for r in rates]
    spent = sum(out)
    if abs(spent - budget) <= 1e-9 * budget:
        return out
    # A page whose one-more-fetch gain is nearly its 1 / rate (a page that
    # changes many times per revisit) takes whatever budget the others leave
    # at mu: its frequency there is steeper in mu than a float resolves
    # (mu x rate = 1 - 1e-30, say), the others' are exact.
    sinks = [i for i, r in enumerate(rates) if r > 0 and abs(1.0 - mu * r) < 1e-9]
    others = sum(f for i, f in enumerate(out) if i not in sinks)
    if sinks and others <= budget:
        share = (budget - others) / len(sinks)
        return [share if i in sinks else f for i, f in enumerate(out)]
    # Otherwise spend exactly the budget all the same; a budget too small to
    # resolve at all goes to the slowest-changing pages, which gain most from
    # their first fetches.
    if spent > 0:
        return [f * budget / spent for f in out]
    slowest = min(r for r in rates if r > 0)
    share = budget / sum(1 for r in rates if r == slowest)
    return [share if r == slowest else 0.0 for r in rates]


@dataclass(frozen=True)
class RateEstimate:
    """A page's change rate as its fetches showed it: four decayed sums, JSON-sized.

    ``changed`` / ``unchanged_n``: fetches that found a change / none
    (decayed counts); ``changed_s`` / ``unchanged_s``: the decayed sums of
    their intervals since the fetch before.  ``decay`` (0-1] weighs down every
    earlier observation at each new one: 1 keeps all history (a stationary
    page), lower values follow a page whose rate moves.
    """

    changed: float = 0.0
    changed_s: float = 0.0
    unchanged_n: float = 0.0
    unchanged_s: float = 0.0

    def observe(self, interval_s: float, changed: bool, decay: float = 1.0) -> RateEstimate:
        """This estimate after a fetch ``interval_s`` after the previous one."""
        if not interval_s >= 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a finite number >= 0, got {interval_s!r}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        kept = replace(
            self,
            changed=self.changed * decay,
            changed_s=self.changed_s * decay,
            unchanged_n=self.unchanged_n * decay,
            unchanged_s=self.unchanged_s * decay,
        )
        if changed:
            return replace(kept, changed=kept.changed + 1, changed_s=kept.changed_s + interval_s)
        return replace(
            kept, unchanged_n=kept.unchanged_n + 1, unchanged_s=kept.unchanged_s + interval_s
        )

    @property
    def observations(self) -> float:
        return self.changed + self.unchanged_n

    def rate(self) -> float | None:
        """Changes per second, or ``None`` before the first observation.

        The maximum-likelihood rate with half an unchanged observation of the
        mean interval added (the bias-reduced estimator of the module's doc).
        """
        n = self.observations
        if n <= 0:
            return None
        if self.changed <= 0:
            return 0.0
        mean_s = (self.changed_s + self.unchanged_s) / n
        changed_mean = self.changed_s / self.changed
        unchanged_s = self.unchanged_s + _PRIOR_WEIGHT * mean_s
        if changed_mean <= 0 or unchanged_s <= 0:
            return _RATE_HI

        def score(rate: float) -> float:
            # d log L / d rate, decreasing in rate: its root is the estimate.
            return self.changed * changed_mean / math.expm1(rate * changed_mean) - unchanged_s

        # exp(700) is near the largest float: beyond, the changed term is 0.
        lo, hi = _RATE_LO / changed_mean, min(_RATE_HI, 700.0 / changed_mean)
        if score(hi) >= 0:
            return hi
        if score(lo) <= 0:
            return 0.0
        return float(brentq(score, lo, hi, xtol=1e-15, rtol=1e-10))

    def to_json(self) -> dict[str, float]:
        return {k: v for k, v in vars(self).items() if v}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RateEstimate:
        """Read what :meth:`to_json` wrote; ``ValueError`` naming a bad field."""
        out = fields_from_json(data, "rate estimate", vars(cls()))
        return cls(**out)
