"""A fleet's revisit states in Redis: the save and pop scripts, dead letters, the worker
thread's op and its spill -- against a real redis-server."""

from __future__ import annotations

import json

import pytest
import redis

from scrapy_banker.core.ops import RevisitWrite
from scrapy_banker.core.spill import SpillHeader, SpillOps, format_spill, merge, parse_spill
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker
from scrapy_banker.redis.worker.jobs import REVISIT_FULL_SCAN_S

pytestmark = pytest.mark.slow  # a real redis-server

NOW = 1_800_000_000.0


@pytest.fixture
def frontier(redis_client: redis.Redis) -> RedisFrontier:
    f = RedisFrontier(redis_client, prefix="t", partitions=4, lease_ttl_ms=10_000)
    f.set_owner(1, "node-a", 1)
    f.set_owner(2, "node-a", 1)
    return f


def _due_counts(frontier: RedisFrontier, partitions: list[int], now: float) -> tuple[int, int]:
    """(pages in the partitions' due indexes, pages due by ``now``), read off Redis."""
    client = frontier.client
    keys = [frontier.keys(p).revisit_due for p in partitions]
    return (
        sum(int(client.zcard(k)) for k in keys),
        sum(int(client.zcount(k, "-inf", now)) for k in keys),
    )


def _state(fetched: float, interval: float = 30.0) -> str:
    return json.dumps({"due": fetched + interval, "interval": interval, "fetched": fetched})


def test_a_saved_state_comes_due_once_and_is_held_for_the_longer_of_hold_and_interval(
    frontier: RedisFrontier,
) -> None:
    revisits = frontier.revisits
    saved = revisits.save_many([
        RevisitWrite(1, "http://a/1", _state(NOW - 100, 30.0), NOW - 70, '{"url":"http://a/1"}'),
        RevisitWrite(1, "http://a/2", _state(NOW - 10, 300.0), NOW + 290, '{"url":"http://a/2"}'),
        RevisitWrite(2, "http://b/1", _state(NOW - 100, 5.0), NOW - 95, '{"url":"http://b/1"}'),
    ])  # fmt: skip
    assert saved == 3
    popped = revisits.pop_many("node-a", {1: 1, 2: 1}, NOW, hold_s=10.0, count=10)
    assert sorted(d.url for d in popped.due) == ["http://a/1", "http://b/1"]
    page = next(d for d in popped.due if d.url == "http://a/1")
    assert page.partition == 1 and json.loads(page.state)["fetched"] == NOW - 100
    assert json.loads(page.payload) == {"url": "http://a/1"}
    # Handed out: due again after its interval (30 s > the 10 s hold) or the hold (5 s < 10 s).
    assert revisits.read(1, "http://a/1") == (page.state, pytest.approx(NOW + 30.0))
    assert revisits.read(2, "http://b/1")[1] == pytest.approx(NOW + 10.0)  # type: ignore[index]
    assert popped.next_due == pytest.approx(NOW + 10.0)
    # Nothing is handed out twice while held.
    again = revisits.pop_many("node-a", {1: 1, 2: 1}, NOW + 1, hold_s=10.0, count=10)
    assert again.due == [] and again.fenced == 0
    assert _due_counts(frontier, [1, 2], NOW + 1) == (3, 0)
    assert _due_counts(frontier, [1, 2], NOW + 31) == (3, 2)


def test_the_pop_is_fenced_to_the_owner_at_its_epoch(frontier: RedisFrontier) -> None:
    frontier.revisits.save_many([RevisitWrite(1, "http://a/1", _state(NOW - 100), NOW - 70, "{}")])
    for node, epoch in (("node-b", 1), ("node-a", 2)):
        popped = frontier.revisits.pop_many(node, {1: epoch}, NOW, hold_s=10.0, count=10)
        assert popped.due == [] and popped.fenced == 1
    assert frontier.revisits.read(1, "http://a/1")[1] == NOW - 70  # type: ignore[index]
    assert len(frontier.revisits.pop_many("node-a", {1: 1}, NOW, 10.0, 10).due) == 1


def test_an_older_state_changes_nothing_and_an_empty_payload_keeps_the_request(
    frontier: RedisFrontier,
) -> None:
    revisits = frontier.revisits
    newer = _state(NOW, 60.0)
    assert revisits.save_many([RevisitWrite(1, "http://a/1", newer, NOW + 60, '{"r":1}')]) == 1
    # A spill replayed late: its state is of an earlier fetch.
    assert revisits.save_many([RevisitWrite(1, "http://a/1", _state(NOW - 50), NOW - 20, "")]) == 0
    assert revisits.read(1, "http://a/1") == (newer, NOW + 60)
    # A later fetch (a revisit: no payload of its own) keeps the request kept before.
    later = _state(NOW + 70, 120.0)
    assert revisits.save_many([RevisitWrite(1, "http://a/1", later, NOW + 190, "")]) == 1
    k = frontier.keys(1)
    assert frontier.client.hget(k.revisit_requests, "http://a/1") == b'{"r":1}'
    assert revisits.read(1, "http://a/1") == (later, NOW + 190)


def test_a_state_that_does_not_read_goes_to_the_dead_letters(frontier: RedisFrontier) -> None:
    frontier.revisits.save_many([RevisitWrite(1, "http://a/1", "{}", NOW - 1, '{"_class":"x"}')])
    assert frontier.revisits.dead_many([(1, "http://a/1", "malformed: not allowed")]) == 1
    assert frontier.revisits.dead_many([(1, "http://a/1", "again")]) == 0  # gone: nothing
    (letter,) = frontier.dead_letters(1)
    assert letter["id"] == "revisit:http://a/1" and letter["reason"] == "malformed: not allowed"
    assert letter["payload"] == '{"_class":"x"}' and letter["state"] == "{}"
    assert frontier.revisits.read(1, "http://a/1") is None
    assert _due_counts(frontier, [1], NOW) == (0, 0)


def test_the_keys_are_cleared_with_the_crawl(frontier: RedisFrontier) -> None:
    frontier.revisits.save_many([RevisitWrite(1, "http://a/1", _state(NOW), NOW, "{}")])
    frontier.clear()
    assert frontier.revisits.read(1, "http://a/1") is None
    assert not frontier.client.exists(frontier.keys(1).revisit_requests)


def test_the_worker_thread_writes_the_latest_state_with_its_batch_and_spills_the_rest(
    frontier: RedisFrontier,
) -> None:
    worker = FrontierWorker(frontier, NodeRegistry(frontier.client, frontier), "node-a")
    worker.save_revisit(RevisitWrite(1, "http://a/1", _state(NOW - 5), NOW + 25, '{"r":1}'))
    worker.save_revisit(RevisitWrite(1, "http://a/1", _state(NOW), NOW + 30, ""))
    assert worker.pending_ops() == 1  # the newer state replaced the unsent one
    assert worker.flusher.run_once()
    assert frontier.revisits.read(1, "http://a/1") == (_state(NOW), NOW + 30)
    assert frontier.client.hget(frontier.keys(1).revisit_requests, "http://a/1") == b'{"r":1}'
    assert worker.take_counters()["banker/redis/revisits_saved"] == 1
    # Redis never got it: spilled with the rest, and replayed by the next worker.
    worker.save_revisit(RevisitWrite(2, "http://b/1", _state(NOW), NOW + 30, '{"r":2}'))
    unsent = worker.take_unsent()
    assert [r.url for r in unsent.revisits] == ["http://b/1"]
    header = SpillHeader("t", 4, "node-a")
    parsed = parse_spill(format_spill(header, unsent), 4)
    assert parsed.bad == [] and parsed.ops.revisits == unsent.revisits
    nxt = FrontierWorker(frontier, NodeRegistry(frontier.client, frontier), "node-b")
    done: list[bool] = []
    nxt.replay(parsed.ops, lambda: done.append(True))
    assert nxt.replayer.run_once() and done == [True]
    assert frontier.revisits.read(2, "http://b/1") == (_state(NOW), NOW + 30)


def test_the_spill_format_reads_back_revisits_and_refuses_bad_ones() -> None:
    ops = SpillOps(revisits=[RevisitWrite(3, "http://a/é", '{"x":1}', NOW, "")])
    text = format_spill(SpillHeader("t", 4), ops)
    assert parse_spill(text, 4).ops.revisits == ops.revisits
    bad = [
        '{"v":1,"op":"revisit","p":9,"url":"u","s":"{}","due":1.0,"r":""}',  # partition
        '{"v":1,"op":"revisit","p":1,"url":"","s":"{}","due":1.0,"r":""}',  # url
        '{"v":1,"op":"revisit","p":1,"url":"u","s":"{}","due":"soon","r":""}',  # due
        '{"v":1,"op":"revisit","p":1,"url":"u","s":"{}","due":1.0,"r":7}',  # payload
    ]
    parsed = parse_spill("\n".join(bad), 4)
    assert parsed.ops.revisits == [] and len(parsed.bad) == 4
    assert "'due' must be a number" in parsed.bad[2].reason


def test_merging_spills_keeps_each_pages_latest_state_and_its_request() -> None:
    first = SpillOps(
        revisits=[RevisitWrite(1, "u", "old", 1.0, "req"), RevisitWrite(1, "v", "s", 2.0)]
    )
    second = SpillOps(revisits=[RevisitWrite(1, "u", "new", 3.0, "")])
    merged = merge([first, second])
    assert merged.revisits == [
        RevisitWrite(1, "v", "s", 2.0),
        RevisitWrite(1, "u", "new", 3.0, "req"),
    ]
    assert "2 revisit states" in merged.describe()


def test_the_take_asks_the_partitions_known_to_hold_states_and_all_of_them_now_and_then(
    frontier: RedisFrontier,
) -> None:
    frontier.set_owner(3, "node-a", 1)
    worker = FrontierWorker(frontier, NodeRegistry(frontier.client, frontier), "node-a")
    worker.state.ownership.owned = {1: 1, 2: 1, 3: 1}
    popper = worker.revisits
    popper.wall = lambda: NOW
    due = NOW - 1

    def urls(n: int) -> list[str]:
        out = []
        while worker.revisits_due:
            out.append(worker.revisits_due.popleft().url)
        assert len(out) == n, out
        return sorted(out)

    # Written by this node (a hint) and by another one (none): the first take asks all.
    worker.save_revisit(RevisitWrite(1, "http://a/1", _state(due - 30), due, "{}"))
    assert worker.flusher.run_once()
    frontier.revisits.save_many([RevisitWrite(2, "http://b/1", _state(due - 30), due, "{}")])
    assert popper.take(0.0) == 2 and urls(2) == ["http://a/1", "http://b/1"]
    # Between full scans only the partitions known to hold states are asked: a page
    # another worker wrote to partition 3 waits for the next full scan.
    frontier.revisits.save_many([
        RevisitWrite(1, "http://a/2", _state(due - 30), due, "{}"),
        RevisitWrite(2, "http://b/2", _state(due - 30), due, "{}"),
        RevisitWrite(3, "http://c/1", _state(due - 30), due, "{}"),
    ])  # fmt: skip
    assert popper.take(1.0) == 2 and urls(2) == ["http://a/2", "http://b/2"]
    assert popper.take(REVISIT_FULL_SCAN_S) == 1 and urls(1) == ["http://c/1"]
    assert popper.held == {1, 2, 3}
