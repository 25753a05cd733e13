"""HostSync: a host's politeness state follows the host's partition across a fleet.

What :mod:`scrapy_banker.redis.store.host_sync` promises, through
:class:`HostSync`'s public methods:

* **published** -- every state that changed since the last publish, and the
  ``last_sent`` of a host with an interval a request was dispatched to, is
  handed to the worker thread with the partition and the epoch the host's
  requests were leased under; a state with nothing left to enforce goes as
  ``""`` (deleted there); a host this node never leased a request of stays
  in memory only;
* **adopted** -- the states the worker read for a partition taken over are
  merged into the scheduler's politeness (the stricter of the two, field
  by field), are not reported back as changes, and tie their host to that
  partition; an unreadable state is skipped with one warning.

In process, not slow: a real :class:`PolitenessGate` (whose politeness is
the scheduler's), a fake worker recording ``host_state`` calls and holding
the ``adopted`` queue, and an injected wall clock.  Writing and reading the
states in Redis is :mod:`scrapy_banker.redis.frontier.hosts`'s, tested with it.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from types import SimpleNamespace

import pytest
from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_banker.core.ops import LeaseToken
from scrapy_banker.core.politeness import HostState
from scrapy_banker.redis.store.host_sync import HostSync, stored
from scrapy_banker.scheduler.politeness_gate import PolitenessGate
from scrapy_banker.settings import load_config

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class FakeWorker:
    """What HostSync asks of a ``FrontierWorker``: ``host_state`` and ``adopted``."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int, int, str]] = []
        self.adopted: deque[tuple[int, int, dict[str, str]]] = deque()

    def host_state(self, host: str, partition: int, epoch: int, state: str) -> None:
        self.written.append((host, partition, epoch, state))


class Spidey(Spider):
    name = "hosts"


def _sync() -> tuple[HostSync, FakeWorker, PolitenessGate, Clock]:
    crawler = get_crawler(Spidey)
    assert crawler.stats is not None
    clock = Clock()
    gate = PolitenessGate(
        load_config(crawler.settings), crawler.stats, lambda slot: True, clock=clock
    )
    worker = FakeWorker()
    parts = SimpleNamespace(politeness=gate, stats=crawler.stats)
    sync = HostSync(parts, worker, clock=clock)  # type: ignore[arg-type]
    return sync, worker, gate, clock


def _token(partition: int, epoch: int) -> LeaseToken:
    return LeaseToken(partition=partition, id=f"r{partition}", delivery=1, epoch=epoch)


def _decoded(written: list[tuple[str, int, int, str]]) -> dict[str, tuple[int, int, HostState]]:
    """host -> (partition, epoch, the state the JSON written holds)."""
    out = {}
    for host, partition, epoch, text in written:
        state = HostState.from_json(json.loads(text)) if text else HostState()
        out[host] = (partition, epoch, state)
    return out


# -- published ---------------------------------------------------------------------------


def test_a_changed_state_goes_to_the_partition_and_epoch_its_host_was_leased_under() -> None:
    sync, worker, gate, clock = _sync()
    sync.leased("a.test", _token(5, 3))
    gate.politeness.refused("a.test", clock.now, 30.0)  # a 429 with Retry-After: 30
    assert sync.publish() == 1
    assert len(worker.written) == 1
    host, partition, epoch, text = worker.written[0]
    assert (host, partition, epoch) == ("a.test", 5, 3)
    assert text == stored(gate.politeness.get("a.test"), clock.now)
    state = HostState.from_json(json.loads(text))
    assert state.blocked_until == T0 + 30.0 and state.refusals == 1


def test_a_state_is_published_once_per_change() -> None:
    sync, worker, gate, _ = _sync()
    sync.leased("a.test", _token(5, 3))
    gate.politeness.crawl_delay("a.test", 2.0)
    assert sync.publish() == 1
    assert sync.publish() == 0  # nothing changed since
    gate.politeness.crawl_delay("a.test", 4.0)
    assert sync.publish() == 1
    assert [_decoded([w])["a.test"][2].crawl_delay for w in worker.written] == [2.0, 4.0]


def test_a_host_never_leased_here_is_kept_in_memory_only() -> None:
    sync, worker, gate, clock = _sync()
    sync.leased("a.test", _token(1, 1))
    gate.politeness.refused("a.test", clock.now, 10.0)
    gate.politeness.refused("elsewhere.test", clock.now, 10.0)
    assert sync.publish() == 1
    assert [w[0] for w in worker.written] == ["a.test"]
    assert gate.politeness.blocked("elsewhere.test", clock.now)  # still enforced here


def test_the_states_the_scheduler_hands_over_are_published_with_the_changed_ones() -> None:
    sync, worker, gate, clock = _sync()
    sync.leased("a.test", _token(1, 1))
    sync.leased("b.test", _token(2, 1))
    gate.politeness.refused("a.test", clock.now, 10.0)
    handed = HostState(throttle_delay=1.5)
    assert sync.publish({"b.test": handed}) == 2
    written = _decoded(worker.written)
    assert written["b.test"] == (2, 1, handed)
    assert written["a.test"][2].blocked_until == T0 + 10.0


def test_the_last_request_sent_to_a_host_with_an_interval_travels_with_it() -> None:
    sync, worker, gate, clock = _sync()
    sync.leased("slow.test", _token(4, 2))
    sync.leased("fast.test", _token(6, 2))
    gate.politeness.crawl_delay("slow.test", 5.0)
    assert sync.publish() == 1  # the Crawl-delay itself
    # A request of each host is let go: the scheduler notes it in its
    # politeness (not a change to persist by itself, but one to publish).
    clock.now = T0 + 7.0
    gate.dispatched("slow.test")
    gate.dispatched("fast.test")  # no interval: nothing to carry
    # The wire gate notes when it actually left: later, a timer fired late.
    clock.now = T0 + 7.2
    gate.politeness.sent("slow.test", clock.now)
    gate.politeness.sent("slow.test", T0 + 7.0)  # never moves back
    assert gate.politeness.take_changed() == {}
    assert sync.publish() == 1
    assert _decoded(worker.written[1:]) == {
        "slow.test": (4, 2, HostState(crawl_delay=5.0, last_sent=T0 + 7.2))
    }
    assert sync.publish() == 0  # sent once


def test_a_state_with_nothing_left_to_enforce_is_published_empty_to_be_deleted() -> None:
    sync, worker, gate, clock = _sync()
    sync.leased("a.test", _token(3, 1))
    sync.leased("b.test", _token(3, 1))
    gate.politeness.crawl_delay("a.test", 2.0)
    gate.politeness.refused("b.test", clock.now, 10.0)
    sync.publish()
    gate.politeness.crawl_delay("a.test", 0)  # robots.txt dropped its Crawl-delay
    clock.now = T0 + 60.0  # b.test's block is over...
    gate.politeness.succeeded("b.test", clock.now)  # ...and it answered: no refusal left
    assert sync.publish() == 2
    assert sorted((h, s) for h, _, _, s in worker.written[2:]) == [("a.test", ""), ("b.test", "")]


def test_a_host_that_moved_partition_is_published_to_its_new_one() -> None:
    sync, worker, gate, _ = _sync()
    sync.leased("a.test", _token(1, 1))
    sync.leased("a.test", _token(1, 2))  # the same partition under a newer epoch
    gate.politeness.crawl_delay("a.test", 1.0)
    sync.publish()
    sync.leased("a.test", _token(7, 4))  # its requests now come from partition 7
    gate.politeness.crawl_delay("a.test", 3.0)
    sync.publish()
    assert [(p, e) for _, p, e, _ in worker.written] == [(1, 2), (7, 4)]
    assert sync.where == {"a.test": (7, 4)}
    assert "a.test" not in sync.hosts_of.get(1, set())
    assert sync.hosts_of[7] == {"a.test"}


# -- adopted -------------------------------------------------------------------------------


def test_states_of_a_partition_taken_over_are_adopted_and_not_published_back() -> None:
    sync, worker, gate, clock = _sync()
    woken: list[list[str]] = []
    gate.on_ready = woken.append
    theirs = HostState(blocked_until=T0 + 20.0, refusals=2, crawl_delay=4.0)
    worker.adopted.append((9, 5, {"a.test": json.dumps(theirs.to_json())}))
    sync.adopt()
    assert not worker.adopted  # consumed
    assert gate.politeness.get("a.test") == theirs
    assert gate.politeness.blocked("a.test", clock.now)
    assert woken == [["a.test"]]  # its lanes re-check
    assert sync.where == {"a.test": (9, 5)}
    assert sync.publish() == 0  # it came from where it is kept
    # ...and the host's next change goes back to that partition and epoch.
    gate.politeness.crawl_delay("a.test", 6.0)
    assert sync.publish() == 1
    assert worker.written[0][:3] == ("a.test", 9, 5)


def test_an_adopted_state_is_merged_with_what_this_node_knows_field_by_field() -> None:
    sync, worker, gate, clock = _sync()
    # This node got a refusal moments ago (its write may still be queued)...
    gate.politeness.refused("a.test", clock.now, 60.0)
    gate.politeness.take_changed()
    # ...and Redis kept the old owner's Crawl-delay and last request.
    theirs = HostState(blocked_until=T0 + 5.0, crawl_delay=3.0, last_sent=T0 - 1.0)
    worker.adopted.append((2, 1, {"a.test": json.dumps(theirs.to_json())}))
    sync.adopt()
    assert gate.politeness.get("a.test") == HostState(
        blocked_until=T0 + 60.0, refusals=1, crawl_delay=3.0, last_sent=T0 - 1.0
    )


def test_every_partition_waiting_is_adopted_in_order() -> None:
    sync, worker, gate, _ = _sync()
    worker.adopted.extend(
        [
            (1, 1, {"a.test": json.dumps({"crawl_delay": 1.0})}),
            (2, 3, {"b.test": json.dumps({"crawl_delay": 2.0})}),
            (1, 2, {}),  # a partition with no states: nothing to adopt
        ]
    )
    sync.adopt()
    assert not worker.adopted
    assert sync.where == {"a.test": (1, 1), "b.test": (2, 3)}
    assert sync.hosts_of == {1: {"a.test"}, 2: {"b.test"}}
    assert gate.politeness.get("b.test").crawl_delay == 2.0


def test_an_unreadable_adopted_state_is_skipped_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sync, worker, gate, _ = _sync()
    good = json.dumps({"crawl_delay": 2.0})
    worker.adopted.append(
        (
            4,
            1,
            {
                "garbage.test": "{not json",
                "a.test": good,
                "negative.test": json.dumps({"crawl_delay": -1}),
                "unknown.test": json.dumps({"color": 1}),
                "list.test": "[1, 2]",
            },
        )
    )
    with caplog.at_level(logging.WARNING, "scrapy_banker.redis.store.host_sync"):
        sync.adopt()
        worker.adopted.append((5, 1, {"later.test": "null"}))
        sync.adopt()
    assert gate.politeness.hosts == {"a.test": HostState(crawl_delay=2.0)}
    assert sync.where == {"a.test": (4, 1)}  # the unreadable ones are not tied to it
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "garbage.test" in warnings[0].getMessage() and "partition 4" in warnings[0].getMessage()
