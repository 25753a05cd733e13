"""The in-memory frontier's lanes: pops restricted to given slots (the pacer's critical hosts)."""

from __future__ import annotations

from scrapy_banker.core.directory import ExtendibleDirectory
from scrapy_banker.core.frontier import EXPLORE_FIRST, Frontier
from scrapy_banker.core.topics import TopicScheduler, TopicSpec


def _frontier() -> Frontier[str]:
    topics = TopicScheduler([TopicSpec("a"), TopicSpec("b", priority=1)])
    return Frontier(topics, ExtendibleDirectory(capacity=4))


def _push(f: Frontier[str], item: str, slot: str, topic: str = "a", priority: int = 0) -> None:
    f.push(item, topic=topic, slot=slot, key=slot, key_hash=hash(slot) & 0xFFFF,
           priority=priority, now=0.0)  # fmt: skip


def test_pop_slots_serves_only_the_given_slots_in_topic_order() -> None:
    f = _frontier()
    for i in range(3):
        _push(f, f"big{i}", "big.test")
        _push(f, f"small{i}", "small.test")
    _push(f, "urgent", "big.test", topic="b", priority=5)
    got = [f.pop_slots(["big.test"], lambda s: True, 0.0) for _ in range(5)]
    # Topic b (priority 1) first, then a's lane on the slot; then a has none there:
    # (False, None) tells the caller to pop as usual, never to skip a's turn.
    assert [(ok, e.item if e else None) for ok, e in got] == [
        (True, "urgent"),
        (True, "big0"),
        (True, "big1"),
        (True, "big2"),
        (False, None),
    ]
    assert f.backlogs == {"small.test": 3} and len(f) == 3
    # The ordinary pop still sees the rest, and nothing twice.
    rest = [f.pop(lambda s: True, 0.0) for _ in range(4)]
    assert [e.item if e else None for e in rest] == ["small0", "small1", "small2", None]


def test_pop_slots_respects_full_slots_and_lanes_parked_on_them() -> None:
    f = _frontier()
    for i in range(2):
        _push(f, f"x{i}", "x.test")
    assert f.pop(lambda s: False, 0.0) is None  # the lane is parked on its full slot
    assert f.pop_slots(["x.test"], lambda s: False, 0.0) == (True, None)  # held, not skipped
    assert f.pop_slots(["x.test"], lambda s: True, 0.0)[1].item == "x0"  # type: ignore[union-attr]
    # The lane left the parked list: freeing the slot later queues nothing twice.
    f.slot_freed("x.test")
    assert f.pop(lambda s: True, 0.0).item == "x1"  # type: ignore[union-attr]
    f.slot_freed("x.test")
    assert f.pop(lambda s: True, 0.0) is None and len(f) == 0


def test_an_emptied_lane_is_gone_from_the_ring() -> None:
    f = _frontier()
    _push(f, "only", "o.test")
    _push(f, "other", "p.test")
    assert f.pop_slots(["o.test", "missing.test"], lambda s: True, 0.0)[1].item == "only"  # type: ignore[union-attr]
    assert [f.pop(lambda s: True, 0.0).item, f.pop(lambda s: True, 0.0)] == ["other", None]  # type: ignore[union-attr]
    assert f.lanes == 0


def test_a_young_slot_goes_before_any_backlog() -> None:
    """What a host holds is known once its first pages are fetched; ranked by the
    few URLs known for it, it would wait behind the known large sites until they
    were done (and start last if it is the long pole)."""
    f = _frontier()
    for i in range(3 * EXPLORE_FIRST):
        _push(f, f"big{i}", "big.test")
    for i in range(EXPLORE_FIRST):  # big.test is explored now: ranked by its backlog
        assert f.pop(lambda s: True, 0.0).item == f"big{i}"  # type: ignore[union-attr]
    for i in range(EXPLORE_FIRST + 1):  # found later, few URLs known at a time
        _push(f, f"new{i}", "new.test")
    got = [f.pop(lambda s: True, 0.0) for _ in range(EXPLORE_FIRST + 1)]
    # Its first EXPLORE_FIRST requests first; then the larger backlog (LPT) leads again.
    want = [f"new{i}" for i in range(EXPLORE_FIRST)] + [f"big{EXPLORE_FIRST}"]
    assert [e.item if e else None for e in got] == want


def test_a_spaced_slot_goes_first_ranked_by_the_time_its_backlog_takes() -> None:
    """A Crawl-delay or rate-limited host is free once per interval: served whenever it
    is, it costs the others one slot at a time, and it is usually the long pole."""
    intervals = {"slow.test": 0.5, "slower.test": 2.0}
    topics = TopicScheduler([TopicSpec("a")])
    f: Frontier[str] = Frontier(topics, ExtendibleDirectory(capacity=4),
                                interval=lambda s: intervals.get(s, 0.0))  # fmt: skip
    for i in range(40):
        _push(f, f"big{i}", "big.test")
    for _ in range(EXPLORE_FIRST):  # big.test is known now: ranked by its backlog
        f.pop(lambda s: True, 0.0)
    for i in range(EXPLORE_FIRST):
        _push(f, f"young{i}", "young.test")
    for i in range(3):
        _push(f, f"slow{i}", "slow.test")  # 1.5 s of work
        _push(f, f"slower{i}", "slower.test")  # 6 s of work
    waiting: set[str] = set()  # a spaced slot, once served, waits for its interval
    got = []
    for _ in range(4):
        entry = f.pop(lambda s: s not in waiting, 0.0)
        assert entry is not None
        got.append(entry.item)
        if entry.slot in intervals:
            waiting.add(entry.slot)
    # Both spaced slots first, the longer first; then the young one before big.test.
    assert got == ["slower0", "slow0", "young0", "young1"]


def test_a_slot_whose_host_refused_is_finished_early_while_others_fill_its_blocks() -> None:
    """A host that refused once (a 503 burst, an outage) may block again at any time:
    drained last, its next block decides the crawl's end; drained first, its blocks
    overlap the other hosts' work."""
    refused: set[str] = set()
    topics = TopicScheduler([TopicSpec("a")])
    f: Frontier[str] = Frontier(topics, ExtendibleDirectory(capacity=4),
                                refused=lambda s: s in refused)  # fmt: skip
    for i in range(EXPLORE_FIRST + 32):
        _push(f, f"big{i}", "big.test")
    for i in range(EXPLORE_FIRST + 4):
        _push(f, f"flaky{i}", "flaky.test")
    for _ in range(2 * EXPLORE_FIRST):  # both explored: ranked by their backlogs now
        f.pop(lambda s: True, 0.0)
    refused.add("flaky.test")  # its host answered 503 to one of them,
    _push(f, "flaky-again", "flaky.test")  # which is queued again
    got = [f.pop(lambda s: True, 0.0) for _ in range(6)]
    assert [e.item if e else None for e in got] == [
        "flaky8", "flaky9", "flaky10", "flaky11", "flaky-again", f"big{EXPLORE_FIRST}"
    ]
    # Without the refusal, the larger backlog leads (the order above is the refusal's).
    refused.clear()
    for i in range(4):
        _push(f, f"again{i}", "flaky.test")
    assert f.pop(lambda s: True, 0.0).slot == "big.test"  # type: ignore[union-attr]
