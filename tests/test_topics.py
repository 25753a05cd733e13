"""PQ-MCSA topic control: preemption, time slices, starvation bound, adjuster."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_banker.core.topics import TopicScheduler, TopicSpec


def _run(
    ts: TopicScheduler,
    steps: int,
    dt: float,
    can_dispatch: Callable[[str, float], bool] = lambda name, now: True,
    start: float = 0.0,
) -> list[str | None]:
    """Drive the scheduler like the frontier does: first candidate that can dispatch wins."""
    out: list[str | None] = []
    now = start
    for _ in range(steps):
        chosen = None
        for name in ts.candidates(now):
            if can_dispatch(name, now):
                ts.dispatched(name, now)
                chosen = name
                break
            ts.idle(name, now)
        out.append(chosen)
        now += dt
    return out


def _loaded(specs: list[TopicSpec], n: int = 10_000, **kw: float) -> TopicScheduler:
    ts = TopicScheduler(specs, **kw)
    for spec in specs:
        ts.pushed(spec.name, 0.0, n)
    return ts


def test_higher_priority_preempts() -> None:
    ts = _loaded([TopicSpec("archive", 0), TopicSpec("news", 10)], max_wait_s=1e9)
    assert set(_run(ts, 50, 0.01)) == {"news"}
    assert ts["archive"].dispatched == 0


def test_lower_priority_runs_when_higher_has_nothing_dispatchable() -> None:
    ts = _loaded([TopicSpec("archive", 0), TopicSpec("news", 10)], max_wait_s=1e9)
    busy = lambda name, now: name != "news" or int(now * 10) % 2 == 0  # noqa: E731
    got = Counter(_run(ts, 100, 0.05, busy))
    assert got["news"] == 50 and got["archive"] == 50  # work-conserving


def test_preemption_is_counted() -> None:
    ts = _loaded([TopicSpec("archive", 0), TopicSpec("news", 10)], max_wait_s=1e9)
    ts.removed("news", 10_000)
    _run(ts, 5, 0.1)
    ts.pushed("news", 0.5)
    _run(ts, 1, 0.1, start=0.5)
    assert ts["archive"].preempted == 1


def test_equal_priorities_take_turns_by_time_slice() -> None:
    ts = _loaded([TopicSpec("a", 0, slice_s=1.0), TopicSpec("b", 0, slice_s=1.0)], max_wait_s=1e9)
    seq = _run(ts, 60, 0.1)
    # Turns of 10 dispatches (1 s at 0.1 s per dispatch), alternating.
    runs = []
    for name in seq:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    assert [r[0] for r in runs] == ["a", "b"] * 3
    assert all(9 <= r[1] <= 11 for r in runs[:-1])  # the last turn is cut by the end


def test_unequal_slices_give_proportional_shares() -> None:
    ts = _loaded([TopicSpec("a", 0, slice_s=0.3), TopicSpec("b", 0, slice_s=0.1)], max_wait_s=1e9)
    got = Counter(_run(ts, 4000, 0.01))
    assert got["a"] / got["b"] == pytest.approx(3.0, rel=0.1)


def test_turn_passes_when_holder_runs_out_of_work() -> None:
    ts = TopicScheduler([TopicSpec("a", 0, slice_s=10), TopicSpec("b", 0, slice_s=10)])
    ts.pushed("a", 0.0, 3)
    ts.pushed("b", 0.0, 100)
    assert _run(ts, 6, 0.01) == ["a", "a", "a", "b", "b", "b"]


def test_starvation_bound_holds_under_strict_preemption() -> None:
    ts = _loaded([TopicSpec("low", 0), TopicSpec("high", 100)], max_wait_s=2.0)
    seq = _run(ts, 2000, 0.01)  # 20 s of an always-busy high-priority topic
    assert seq.count("low") >= 9
    assert ts["low"].max_wait_s <= 2.0 + 0.01 + 1e-9
    assert ts["low"].starvation_rescues >= 9


@settings(max_examples=60, deadline=None)
@given(
    priorities=st.lists(st.integers(-3, 3), min_size=2, max_size=6),
    max_wait=st.floats(0.2, 3.0),
    busy_seed=st.integers(0, 10_000),
)
def test_no_topic_with_dispatchable_work_waits_longer_than_the_bound(
    priorities: list[int], max_wait: float, busy_seed: int
) -> None:
    specs = [TopicSpec(f"t{i}", p, slice_s=0.5) for i, p in enumerate(priorities)]
    ts = _loaded(specs, max_wait_s=max_wait)
    dt = 0.01
    _run(ts, 1500, dt, lambda name, now: (hash((name, int(now / dt), busy_seed)) % 4) != 0)
    # The bound, plus one dispatch for each other topic starving at the same time.
    for state in ts:
        assert state.max_wait_s <= max_wait + len(specs) * dt + 1e-9, state


def test_adjuster_shrinks_slice_of_topic_meeting_target_and_grows_it_back() -> None:
    ts = TopicScheduler(
        [TopicSpec("news", 0, slice_s=1.0, target=100), TopicSpec("archive", 0, slice_s=1.0)],
        min_slice_s=0.2,
        slice_step_s=0.3,
    )
    assert ts.adjust({"news": 150, "archive": 10}) == {"news": 0.7, "archive": 1.0}
    assert ts.adjust({"news": 150})["news"] == pytest.approx(0.4)
    assert ts.adjust({"news": 150})["news"] == pytest.approx(0.2)  # floor
    assert ts.adjust({"news": 150})["news"] == pytest.approx(0.2)
    assert ts.adjust({"news": 5})["news"] == pytest.approx(0.5)  # fell behind: grows back
    for _ in range(5):
        ts.adjust({"news": 0})
    assert ts["news"].slice_total == pytest.approx(1.0)  # never above its configured slice


def test_adjusted_slice_changes_shares() -> None:
    ts = _loaded(
        [TopicSpec("a", 0, slice_s=1.0, target=1), TopicSpec("b", 0, slice_s=1.0)],
        min_slice_s=0.25,
        slice_step_s=0.75,
        max_wait_s=1e9,
    )
    ts.adjust({"a": 10})
    got = Counter(_run(ts, 5000, 0.01))
    assert got["b"] / got["a"] == pytest.approx(4.0, rel=0.1)


def test_state_round_trip() -> None:
    ts = _loaded([TopicSpec("a", 0, target=1), TopicSpec("b", 0), TopicSpec("c", 5)])
    _run(ts, 300, 0.01)
    ts.adjust({"a": 5})
    saved = json.loads(json.dumps(ts.to_state()))
    other = TopicScheduler([TopicSpec("a", 0, target=1), TopicSpec("b", 0), TopicSpec("c", 5)])
    other.restore(saved)
    assert other["a"].slice_total == ts["a"].slice_total
    assert other["c"].dispatched == ts["c"].dispatched
    assert other.to_state()["order"] == ts.to_state()["order"]
    with pytest.raises(ValueError, match="Malformed topic state"):
        other.restore({"topics": []})


def test_unknown_topics_get_default_slice_and_priority_zero() -> None:
    ts = TopicScheduler(default_slice_s=0.7)
    ts.pushed("surprise", 0.0)
    assert ts["surprise"].spec.priority == 0
    assert ts["surprise"].slice_total == 0.7
    assert list(ts.candidates(0.0)) == ["surprise"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"default_slice_s": 0}, "default_slice_s must be > 0"),
        ({"max_wait_s": -1}, "max_wait_s must be > 0"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TopicScheduler(**kwargs)


def test_bad_specs() -> None:
    with pytest.raises(ValueError, match="slice must be > 0"):
        TopicSpec("x", slice_s=0)
    with pytest.raises(ValueError, match="target must be >= 0"):
        TopicSpec("x", target=-1)
    with pytest.raises(ValueError, match="already defined"):
        TopicScheduler([TopicSpec("x"), TopicSpec("x")])
