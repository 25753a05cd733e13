"""The pacer: which hosts decide the end of a CPU-bound crawl, and when to hold the others."""

from __future__ import annotations

import pytest

from scrapy_banker.core.pacing import Pacer, PacerConfig


def _warm(pacer: Pacer, cpu_per_response: float, slot: str = "x", latency: float = 0.1) -> float:
    """Feed one window of responses costing ``cpu_per_response`` each; returns the CPU clock.

    Refreshing at that clock's value as the time means one CPU fully used since.
    """
    pacer.refresh(0.0, 0.0, {}, 0, lambda s: 4)  # the CPU mark
    for _ in range(pacer.config.cpu_window):
        pacer.response(slot, latency)
    return pacer.config.cpu_window * cpu_per_response


def test_the_long_pole_is_critical_when_it_outlasts_the_cpu_work() -> None:
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.02, "pole", 0.125)
    # 800 pending in all at 20 ms: 16 s of CPU.  The pole: 700 x 125 ms / 4 = 21.9 s.
    backlog = {"pole": 700, "mid": 80, "small": 20}
    critical = pacer.refresh(cpu, cpu, backlog, 800, lambda s: 4)
    assert critical == {"pole"} and pacer.saturated
    assert pacer.cpu_left_s == pytest.approx(16.0)
    assert pacer.pole_s == pytest.approx(21.875)
    # Held only while the scraper is saturated.
    assert pacer.hold(1) is False and pacer.hold(2) is True


def test_a_spaced_host_is_timed_by_its_interval() -> None:
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.02)
    # 800 pending: 16 s of CPU.  "slow" has 40 at a Crawl-delay of 0.5 s: 20 s;
    # by its latency alone (40 x 0.1 / 4 = 1 s) it would not be critical.
    backlog = {"big": 300, "slow": 40, "small": 60}  # big: 300 x 0.1 / 4 = 7.5 s
    intervals = {"slow": 0.5}
    critical = pacer.refresh(cpu, cpu, backlog, 800, lambda s: 4, lambda s: intervals.get(s, 0.0))
    assert critical == {"slow"}
    assert pacer.pole_s == pytest.approx(20.0)
    assert pacer.refresh(2 * cpu, 2 * cpu, backlog, 800, lambda s: 4) == frozenset()


def test_no_host_is_critical_when_cpu_decides_the_end() -> None:
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.02)
    backlog = {f"h{i}": 30 for i in range(100)}  # 3,000 pending: 60 s of CPU, poles 0.75 s
    assert pacer.refresh(cpu, cpu, backlog, 3000, lambda s: 4) == frozenset()
    assert pacer.hold(100) is False


def test_nothing_is_held_while_the_cpu_keeps_up() -> None:
    # The pole of the first test, but the process used 40 % of a CPU over the
    # window (a crawl of slow or rate-limited hosts): a busy scraper is not a
    # saturated CPU, so no host is favoured and none held.
    pacer = Pacer(PacerConfig(theta=0.5, saturation=0.8))
    cpu = _warm(pacer, 0.02, "pole", 0.125)
    backlog = {"pole": 700, "mid": 80, "small": 20}
    assert pacer.refresh(cpu / 0.4, cpu, backlog, 800, lambda s: 4) == frozenset()
    assert pacer.critical == {"pole"} and pacer.cpu_share == pytest.approx(0.4)
    assert not pacer.saturated and pacer.hold(100) is False
    # Saturated over the next window (0.45 s of CPU in 0.5 s): held again.
    now = cpu / 0.4 + 0.5
    assert pacer.refresh(now, cpu + 0.45, backlog, 800, lambda s: 4) == {"pole"}
    assert pacer.cpu_share == pytest.approx(0.9) and pacer.hold(2) is True


def test_nothing_is_critical_before_the_cpu_cost_is_measured() -> None:
    pacer = Pacer()
    pacer.refresh(0.0, 0.0, {"a": 1000}, 1000, lambda s: 1)
    assert pacer.critical == frozenset() and pacer.cpu_per_response is None
    pacer.response("a", None)  # a response without a latency counts, adds no latency
    assert pacer.latency == {} and pacer.responses == 1


def test_latency_is_smoothed_per_host_and_estimates_refresh_on_schedule() -> None:
    pacer = Pacer(PacerConfig(latency_alpha=0.5, refresh_s=0.5))
    pacer.response("a", 0.2)
    pacer.response("a", 0.4)
    assert pacer.latency["a"] == pytest.approx(0.3)
    assert pacer.due(0.0)
    pacer.refresh(10.0, 0.0, {}, 0, lambda s: 1)
    assert not pacer.due(10.4) and pacer.due(10.5)


def test_bad_constants_are_refused() -> None:
    with pytest.raises(ValueError, match="backlog"):
        PacerConfig(backlog=0)
    with pytest.raises(ValueError, match="theta"):
        PacerConfig(theta=0)
    with pytest.raises(ValueError, match="saturation"):
        PacerConfig(saturation=1.5)


def test_a_crawl_bound_by_its_downloader_counts_the_downloaders_time_left() -> None:
    # 60 hosts of 30 pages at 100 ms, one request each at a time, 16 at once in
    # all: the downloader needs 1,800 x 0.1 / 16 = 11.25 s, the CPU (at 3 ms a
    # page) only 5.4 s.  A host's 3 s is not a long pole then.
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.003, "h0", 0.1)
    backlog = {f"h{i}": 30 for i in range(60)}
    assert pacer.refresh(cpu, cpu, backlog, 1800, lambda s: 1) == {f"h{i}" for i in range(60)}
    assert pacer.cpu_left_s == pytest.approx(5.4)
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.003, "h0", 0.1)
    critical = pacer.refresh(cpu, cpu, backlog, 1800, lambda s: 1, total_concurrency=16)
    assert critical == frozenset() and pacer.cpu_left_s == pytest.approx(11.25)
    # A host spaced by a Crawl-delay of 0.5 s is still one: 15 s.
    critical = pacer.refresh(
        2 * cpu, 2 * cpu, backlog, 1800, lambda s: 1,
        lambda s: 0.5 if s == "h7" else 0.0, total_concurrency=16,
    )  # fmt: skip
    assert critical == {"h7"}


def test_a_crawl_bound_by_its_downloader_is_never_held_back() -> None:
    # The same farm: h7's Crawl-delay makes it critical (favoured by the
    # downloader), but holding the other hosts would only leave places empty.
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.003, "h0", 0.1)
    backlog = {f"h{i}": 30 for i in range(60)}
    spaced = lambda s: 0.5 if s == "h7" else 0.0  # noqa: E731
    pacer.refresh(cpu, cpu, backlog, 1800, lambda s: 1, spaced, total_concurrency=16)
    assert pacer.saturated and pacer.critical == {"h7"} and not pacer.cpu_bound
    assert pacer.hold(100) is False
    # Pages of 10 ms: the CPU needs 18 s, more than the downloader's 11.25 s.
    pacer = Pacer(PacerConfig(theta=0.5))
    cpu = _warm(pacer, 0.010, "h0", 0.1)
    pacer.refresh(cpu, cpu, backlog, 1800, lambda s: 1, spaced, total_concurrency=16)
    assert pacer.cpu_bound and pacer.critical == {"h7"} and pacer.hold(2) is True
