"""Tests for the pure measurement core: denoised mean, windows, link stats, BS, rate limit."""

from __future__ import annotations

import io
import json
import math
import random
import threading
import zlib
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_banker.net.netstats import (
    FENCE_MADS,
    LinkStats,
    RateLimiter,
    SampleWindow,
    Summary,
    choose_modulus,
    denoised_mean,
    median,
    storage_bandwidth,
)

# Latency around 50 ms with Gaussian jitter, fixed seed so the test is deterministic.
_RNG = random.Random(20240501)
AROUND_50 = [50.0 + _RNG.gauss(0.0, 3.0) for _ in range(20)]

# The worked example of docs/reference/netstats.rst.
DOC_EXAMPLE = [48.0, 49.0, 50.0, 50.0, 51.0, 52.0, 55.0, 61.0, 950.0]


def fake_clock(*times: float) -> Callable[[], float]:
    it: Iterator[float] = iter(times)
    return lambda: next(it)


class Ticker:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- denoised_mean -----------------------------------------------------------------------


def test_clean_data_equals_mean() -> None:
    data = [48.0, 49.0, 50.0, 51.0, 52.0]
    assert denoised_mean(data) == pytest.approx(sum(data) / len(data))
    # Everything inside three bins of an explicit modulus: the plain mean, exactly.
    assert denoised_mean([10.0, 12.0, 25.0, 31.0], modulus=10.0) == pytest.approx(19.5)


def test_identical_samples() -> None:
    assert denoised_mean([0.2] * 7) == pytest.approx(0.2)
    assert denoised_mean([0.0, 0.0, 0.0]) == 0.0
    assert denoised_mean([42.0]) == 42.0


@pytest.mark.parametrize(
    "spikes",
    [
        [3000.0] * 4,  # four identical timeouts: one tight, frequent bin
        [3000.0, 3120.0, 2890.0, 3400.0],  # scattered spikes
    ],
)
def test_spikes_barely_move_it_but_wreck_the_plain_mean(spikes: list[float]) -> None:
    data = AROUND_50 + spikes
    true = sum(AROUND_50) / len(AROUND_50)
    plain = sum(data) / len(data)
    assert abs(denoised_mean(data) - true) < 3.0
    assert abs(plain - true) > 400.0


def test_identical_latencies_with_identical_spikes() -> None:
    # The paper's rule alone would average the spike bin in (640 ms): the fence stops it.
    assert denoised_mean([50.0] * 20 + [3000.0] * 4) == 50.0


def test_survives_a_third_of_the_window_being_spikes() -> None:
    data = AROUND_50[:16] + [1050.0, 2050.0, 3050.0] * 3
    assert abs(denoised_mean(data) - 50.0) < 4.0


def test_worked_example_from_the_docs() -> None:
    assert sum(DOC_EXAMPLE) / len(DOC_EXAMPLE) == pytest.approx(151.78, abs=0.01)
    assert median(DOC_EXAMPLE) == 51.0
    # modulus 5: bins 9 (48, 49), 10 (50, 50, 51, 52), 11 (55), 12 (61), 190 (950);
    # top three: 10, 9 and -- a three-way tie at one sample -- the lowest, 11.
    assert denoised_mean(DOC_EXAMPLE, modulus=5.0) == pytest.approx(355.0 / 7.0)
    assert denoised_mean(DOC_EXAMPLE, modulus=5.0, bins=1) == pytest.approx(50.75)
    assert abs(denoised_mean(DOC_EXAMPLE) - 51.0) < 2.0


def test_ties_go_to_the_lower_latency_bin() -> None:
    assert denoised_mean([1.0, 11.0, 21.0, 31.0], modulus=10.0, bins=1) == 1.0
    assert denoised_mean([31.0, 21.0, 11.0, 1.0], modulus=10.0, bins=2) == 6.0


def test_more_bins_than_exist_takes_everything_inside_the_fence() -> None:
    assert denoised_mean([1.0, 2.0, 3.0], modulus=0.5, bins=10) == pytest.approx(2.0)


def test_fence_width() -> None:
    # median 10, MAD 1: values beyond 10 +/- FENCE_MADS are out even with one huge bin.
    data = [9.0, 10.0, 10.0, 11.0, 10.0 + FENCE_MADS + 0.5]
    assert denoised_mean(data, modulus=1000.0) == pytest.approx(10.0)
    data = [9.0, 10.0, 10.0, 11.0, 10.0 + FENCE_MADS - 0.5]
    assert denoised_mean(data, modulus=1000.0) == pytest.approx(sum(data) / 5)


def test_choose_modulus() -> None:
    # median 50, absolute deviations 2,1,0,1,2 -> MAD 1; 2 * (2 * MAD) / cbrt(5)
    assert choose_modulus([48.0, 49.0, 50.0, 51.0, 52.0]) == pytest.approx(4.0 / 5 ** (1 / 3))
    # More samples -> finer bins, like any histogram rule.
    assert choose_modulus(list(range(100))) < choose_modulus(list(range(0, 100, 10))) * 10
    # Identical samples: the floor, positive and relative to the data.
    assert 0.0 < choose_modulus([3.0] * 5) < 1e-9
    assert choose_modulus([0.0, 0.0]) == 1.0
    # Spikes hardly widen it: the MAD ignores them.
    clean = choose_modulus(AROUND_50)
    assert choose_modulus(AROUND_50 + [3000.0] * 8) < 2 * clean


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"samples": []}, "non-empty"),
        ({"samples": [1.0, math.nan]}, "finite"),
        ({"samples": [1.0, math.inf]}, "finite"),
        ({"samples": [1.0, -0.5]}, "non-negative"),
        ({"samples": [1.0], "modulus": 0.0}, "modulus"),
        ({"samples": [1.0], "modulus": -1.0}, "modulus"),
        ({"samples": [1.0], "modulus": math.nan}, "modulus"),
        ({"samples": [1.0], "bins": 0}, "bins"),
        ({"samples": [1.0], "bins": 1.5}, "bins"),
    ],
)
def test_denoised_mean_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        denoised_mean(**kwargs)  # type: ignore[arg-type]


def test_choose_modulus_errors() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        choose_modulus([])
    with pytest.raises(ValueError, match="non-negative"):
        choose_modulus([-1.0])


# Bounded to normal floats so scaling by a power of two is exact (no subnormals, no overflow).
latencies = st.lists(
    st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=40,
)


@given(latencies, st.integers(min_value=-20, max_value=20))
def test_scale_equivariance(samples: list[float], k: int) -> None:
    # Binning is discontinuous, so only a power-of-two scale -- exact in floating point --
    # keeps every sample in the same bin; then the result scales exactly.
    c = 2.0**k
    scaled = denoised_mean([c * x for x in samples])
    assert scaled == pytest.approx(c * denoised_mean(samples), rel=1e-12)
    assert choose_modulus([c * x for x in samples]) == pytest.approx(
        c * choose_modulus(samples), rel=1e-12
    )


@given(latencies, st.integers(min_value=1, max_value=10))
def test_monotone_in_scale(samples: list[float], k: int) -> None:
    assert denoised_mean([2.0**k * x for x in samples]) >= denoised_mean(samples)


@given(latencies, st.integers(min_value=1, max_value=5))
def test_result_within_sample_range(samples: list[float], bins: int) -> None:
    result = denoised_mean(samples, bins=bins)
    assert min(samples) <= result <= max(samples)


@given(latencies, st.floats(min_value=1e-3, max_value=1e4), st.integers(1, 5))
def test_result_within_range_for_any_modulus(samples: list[float], m: float, bins: int) -> None:
    result = denoised_mean(samples, modulus=m, bins=bins)
    assert min(samples) <= result <= max(samples)


@given(latencies, st.randoms(use_true_random=False))
def test_order_does_not_matter(samples: list[float], rnd: random.Random) -> None:
    shuffled = samples[:]
    rnd.shuffle(shuffled)
    assert denoised_mean(shuffled) == denoised_mean(samples)


# --- median ------------------------------------------------------------------------------


def test_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([-1.0, -3.0]) == -2.0
    with pytest.raises(ValueError, match="non-empty"):
        median([])
    with pytest.raises(ValueError, match="finite"):
        median([1.0, math.nan])


# --- SampleWindow --------------------------------------------------------------------------


def test_sample_window_keeps_the_most_recent() -> None:
    window = SampleWindow(3)
    assert window.summary() is None
    assert window.values() == []
    for v in [1.0, 2.0, 3.0, 4.0, 5.0]:
        window.add(v)
    assert window.values() == [3.0, 4.0, 5.0]
    assert len(window) == 3
    assert window.size == 3
    assert window.summary() == Summary(n=3, denoised=4.0, median=4.0, mean=4.0, last=5.0)


def test_sample_window_summary_fields() -> None:
    window = SampleWindow()
    for v in AROUND_50 + [3000.0] * 4:
        window.add(v)
    s = window.summary()
    assert s is not None
    assert s.n == 24
    assert s.last == 3000.0
    assert abs(s.denoised - 50.0) < 3.0
    assert s.mean > 500.0
    assert abs(s.median - 50.0) < 5.0


def test_sample_window_rejects_bad_values() -> None:
    window = SampleWindow(4)
    window.add(1.0)
    for bad in [math.nan, math.inf, -1.0]:
        with pytest.raises(ValueError, match="value"):
            window.add(bad)
    with pytest.raises(ValueError, match="number"):
        window.add("1.0")  # type: ignore[arg-type]
    assert window.values() == [1.0]
    for size in [0, -1, 2.5, True]:
        with pytest.raises(ValueError, match="size"):
            SampleWindow(size)  # type: ignore[arg-type]


# --- LinkStats ---------------------------------------------------------------------------


def test_link_stats_record_and_snapshot() -> None:
    stats = LinkStats(window=8)
    assert stats.sites() == []
    assert stats.latency("a.example") is None
    assert stats.bandwidth("a.example") is None
    assert stats.samples("a.example") == 0
    assert stats.snapshot() == {}

    stats.record("a.example", 0.050, 100_000, 0.5)
    stats.record("a.example", 0.052, 0, 0.1)  # empty body: latency only
    stats.record("a.example", 0.054, 5_000, 0.0)  # zero duration: latency only
    stats.record("b.example", 0.200, 0, 0.0)
    assert stats.sites() == ["a.example", "b.example"]
    assert stats.samples("a.example") == 3

    lat = stats.latency("a.example")
    assert lat is not None
    assert lat.n == 3
    assert lat.last == 0.054
    bw = stats.bandwidth("a.example")
    assert bw is not None
    assert bw.n == 1
    assert bw.denoised == pytest.approx(200_000.0)
    assert stats.bandwidth("b.example") is None

    snap = stats.snapshot()
    assert set(snap) == {"a.example", "b.example"}
    assert snap["a.example"]["rtt_ms"] == pytest.approx(52.0)
    assert snap["a.example"]["rtt_median_ms"] == pytest.approx(52.0)
    assert snap["a.example"]["bw_Bps"] == pytest.approx(200_000.0)
    assert snap["a.example"]["n"] == 3
    assert snap["b.example"] == {
        "rtt_ms": pytest.approx(200.0),
        "rtt_median_ms": pytest.approx(200.0),
        "bw_Bps": 0.0,
        "n": 1,
    }
    assert json.loads(json.dumps(snap)) == snap


def test_link_stats_window_is_bounded() -> None:
    stats = LinkStats(window=4)
    for i in range(10):
        stats.record("s", 0.01 * (i + 1), 1000, 0.1)
    assert stats.samples("s") == 4
    lat = stats.latency("s")
    assert lat is not None
    assert lat.last == pytest.approx(0.1)


def test_link_stats_denoises_latency() -> None:
    stats = LinkStats()
    for ms in AROUND_50 + [3000.0] * 4:
        stats.record("slow.example", ms / 1000.0, 10_000, ms / 1000.0 + 0.1)
    assert abs(stats.snapshot()["slow.example"]["rtt_ms"] - 50.0) < 3.0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", 0.1, 10, 0.1), "site"),
        ((None, 0.1, 10, 0.1), "site"),
        (("s", -0.1, 10, 0.1), "latency_s"),
        (("s", math.nan, 10, 0.1), "latency_s"),
        (("s", 0.1, -1, 0.1), "nbytes"),
        (("s", 0.1, 1.5, 0.1), "nbytes"),
        (("s", 0.1, 10, -0.1), "elapsed_s"),
        (("s", 0.1, 10, math.nan), "elapsed_s"),
        (("s", 0.1, 10, math.inf), "elapsed_s"),
    ],
)
def test_link_stats_rejects_bad_records(args: tuple[object, ...], match: str) -> None:
    stats = LinkStats()
    with pytest.raises(ValueError, match=match):
        stats.record(*args)  # type: ignore[arg-type]
    assert stats.sites() == []


def test_link_stats_max_sites_forgets_the_least_recent() -> None:
    stats = LinkStats(max_sites=2)
    stats.record("a", 0.1, 1, 0.1)
    stats.record("b", 0.1, 1, 0.1)
    stats.record("a", 0.1, 1, 0.1)  # a is now the most recent
    stats.record("c", 0.1, 1, 0.1)
    assert stats.sites() == ["a", "c"]
    assert stats.samples("a") == 2
    with pytest.raises(ValueError, match="max_sites"):
        LinkStats(max_sites=0)
    with pytest.raises(ValueError, match="window"):
        LinkStats(window=0)


def test_link_stats_from_two_threads() -> None:
    stats = LinkStats(window=10_000)
    n = 2_000
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def writer(name: str) -> None:
        start.wait()
        for i in range(n):
            stats.record("shared", 0.05, 1000, 0.01)
            stats.record(f"{name}-{i % 50}", 0.05, 1000, 0.01)

    def reader() -> None:
        start.wait()
        try:
            for _ in range(50):
                json.dumps(stats.snapshot())
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=("t1",)),
        threading.Thread(target=writer, args=("t2",)),
        threading.Thread(target=reader),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert stats.samples("shared") == 2 * n
    assert len(stats.sites()) == 101
    assert sum(stats.samples(s) for s in stats.sites()) == 4 * n
    assert stats.snapshot()["shared"]["bw_Bps"] == pytest.approx(100_000.0)


# --- storage_bandwidth -------------------------------------------------------------------


def test_storage_bandwidth_fake_clock_uses_the_median_duration() -> None:
    written: list[bytes] = []
    # durations 2.0 (a cold first write), 0.5 and 1.0: median 1.0 s -> 100 000 B/s
    clock = fake_clock(0.0, 2.0, 10.0, 10.5, 20.0, 21.0)
    assert storage_bandwidth(written.append, clock=clock) == pytest.approx(100_000.0)
    assert len(written) == 3
    assert all(len(obj) == 100_000 for obj in written)
    assert written[0] == written[1] == written[2]
    # Incompressible, so compressing storage cannot flatter the figure; the same on every
    # call, so every node writes the same standard object.
    assert len(zlib.compress(written[0])) > 0.99 * len(written[0])
    again: list[bytes] = []
    storage_bandwidth(again.append, size=100_000, repeats=1, clock=fake_clock(0.0, 1.0))
    assert again[0] == written[0]


def test_storage_bandwidth_custom_size_and_repeats() -> None:
    sizes: list[int] = []
    clock = fake_clock(0.0, 0.25, 1.0, 1.25)
    bw = storage_bandwidth(lambda b: sizes.append(len(b)), size=1000, repeats=2, clock=clock)
    assert bw == pytest.approx(4000.0)
    assert sizes == [1000, 1000]


def test_storage_bandwidth_real_write() -> None:
    buf = io.BytesIO()
    assert storage_bandwidth(buf.write) > 0
    assert buf.tell() == 300_000


def test_storage_bandwidth_write_errors_propagate() -> None:
    def broken(_: bytes) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        storage_bandwidth(broken)


def test_storage_bandwidth_rejects_bad_arguments_and_clocks() -> None:
    with pytest.raises(ValueError, match="did not advance"):
        storage_bandwidth(lambda b: None, clock=lambda: 5.0)
    with pytest.raises(ValueError, match="backwards"):
        storage_bandwidth(lambda b: None, repeats=1, clock=fake_clock(5.0, 4.0))
    with pytest.raises(ValueError, match="size"):
        storage_bandwidth(lambda b: None, size=0)
    with pytest.raises(ValueError, match="repeats"):
        storage_bandwidth(lambda b: None, repeats=0)


# --- RateLimiter -------------------------------------------------------------------------


def test_rate_limiter_burst_then_rate() -> None:
    clock = Ticker()
    limiter = RateLimiter(rate_per_s=1.0, burst=2, clock=clock)
    assert limiter.try_acquire()
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    clock.now = 0.5
    assert not limiter.try_acquire()
    clock.now = 1.0
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    clock.now = 100.0  # a long idle period refills only up to the burst
    assert [limiter.try_acquire() for _ in range(3)] == [True, True, False]


def test_rate_limiter_does_not_lose_tokens_to_rounding() -> None:
    clock = Ticker()
    limiter = RateLimiter(rate_per_s=10.0, clock=clock)
    assert limiter.try_acquire()
    for _ in range(50):
        clock.now += 0.1  # accumulates rounding error
        assert limiter.try_acquire()
        assert not limiter.try_acquire()


def test_rate_limiter_clock_stepping_back_refills_nothing() -> None:
    clock = Ticker(10.0)
    limiter = RateLimiter(rate_per_s=1.0, clock=clock)
    assert limiter.try_acquire()
    clock.now = 5.0
    assert not limiter.try_acquire()
    clock.now = 6.0
    assert limiter.try_acquire()


@pytest.mark.parametrize(
    ("rate", "burst", "match"),
    [
        (0.0, 1, "rate_per_s"),
        (-1.0, 1, "rate_per_s"),
        (math.nan, 1, "rate_per_s"),
        (1.0, 0, "burst"),
        (1.0, 1.5, "burst"),
    ],
)
def test_rate_limiter_rejects_bad_arguments(rate: float, burst: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RateLimiter(rate, burst)
