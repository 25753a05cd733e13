"""Budgets counted with the leases, and the control document, on a real redis-server.

The scripts (``charge``, ``release``, ``purge`` and the refunds of ``ack``,
``nack``, ``reap``, ``deadletter``) are driven through the frontier and
:class:`~scrapy_banker.redis.frontier.control_channel.ControlChannel` exactly as a worker and
the ``scrapy banker`` commands drive them.
"""

from __future__ import annotations

import json
import threading

import pytest
import redis

from scrapy_banker.core.directives import Action, ControlError, ControlState
from scrapy_banker.core.ops import LeaseToken
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.control_channel import ControlChannel, check_cluster
from scrapy_banker.redis.scripts import ScriptCall
from scrapy_banker.redis.worker.control_box import CHARGED, GONE, HELD, Charge

pytestmark = pytest.mark.slow  # a real redis-server

P = 3


@pytest.fixture
def frontier(redis_client: redis.Redis) -> RedisFrontier:
    f = RedisFrontier(redis_client, prefix="c", partitions=8, lease_ttl_ms=60_000, max_deliveries=2)
    f.set_owner(P, "a", 1)
    return f


def _queue(frontier: RedisFrontier, n: int, tag: str = "r") -> None:
    for i in range(n):
        assert frontier.enqueue(P, f"{tag}{i}", f"{tag}{i}")


def _lease(frontier: RedisFrontier, n: int) -> list[LeaseToken]:
    return [leased.token for leased in frontier.pop(P, "a", 1, n)]


def _charge(
    frontier: RedisFrontier, tokens: list[LeaseToken], host: str = "h.test", *,
    topic: str = "t", host_budget: int = -1, topic_budget: int = -1, crawl_budget: int = -1,
) -> list[int]:  # fmt: skip
    k = frontier.keys(P)
    args: list[str | int] = [
        Charge(t, host, topic, host_budget, topic_budget, crawl_budget).arg() for t in tokens
    ]
    call = ScriptCall([k.leases, k.meta, k.payloads, k.over, *frontier.link.budget_keys], args)
    (answer,) = frontier.scripts.values("charge", [call])
    return [int(a) for a in answer]


def _used(frontier: RedisFrontier, host: str = "h.test") -> int:
    return int(frontier.client.hget(frontier.keys(P).meta, f"u:{host}") or 0)


def test_a_host_is_charged_up_to_its_budget_then_held_and_released(
    frontier: RedisFrontier,
) -> None:
    _queue(frontier, 5)
    tokens = _lease(frontier, 5)
    assert _charge(frontier, tokens, host_budget=3) == [CHARGED] * 3 + [HELD] * 2
    assert _used(frontier) == 3
    k, client = frontier.keys(P), frontier.client
    # Held: not leased, not queued, in the over list, counted per host; visible.
    assert frontier.leased(P) == 3 and frontier.queued(P) == 0
    assert client.llen(k.over) == 2 and client.hget(k.meta, "o:h.test") == b"2"
    channel = ControlChannel(frontier.link)
    counts = channel.counts()
    assert (counts.hosts, counts.held) == ({"h.test": 3}, {"h.test": 2})
    assert channel.held_partitions() == [P]
    # A charge resent after it landed changes nothing; a stale delivery is gone.
    assert _charge(frontier, tokens[:1], host_budget=3) == [CHARGED]
    stale = LeaseToken(P, tokens[0].id, tokens[0].delivery + 1)
    assert _charge(frontier, [stale], host_budget=3) == [GONE]
    assert _used(frontier) == 3
    # The budget is raised: the held requests go back to the queue, first.
    assert channel.release([P]) == 2
    assert client.llen(k.over) == 0 and not client.hexists(k.meta, "o:h.test")
    assert frontier.queued(P) == 2
    again = _lease(frontier, 2)
    assert [frontier.client.hget(k.payloads, t.id) for t in again] == [b"r3", b"r4"]
    assert _charge(frontier, again, host_budget=5) == [CHARGED, CHARGED]
    assert _used(frontier) == 5


def test_a_page_stays_charged_to_its_request_until_it_ends(frontier: RedisFrontier) -> None:
    _queue(frontier, 4)
    a, b, c, d = _lease(frontier, 4)
    assert _charge(frontier, [a, b, c, d], host_budget=4) == [CHARGED] * 4
    assert frontier.ack(P, [a.ref]) == 1  # fetched: the page stays charged
    assert _used(frontier) == 4
    assert frontier.ack(P, [b.ref + "r"]) == 1  # a copy was queued: given back
    assert _used(frontier) == 3
    # Given back unfetched (nack), or its holder died (reap): the charge stays
    # with the request -- the dead holder may have fetched the page -- and its
    # next lease is not charged again, so no other page takes its place.
    assert frontier.nack(P, [c.ref]) == 1
    frontier.client.zadd(frontier.keys(P).leases, {d.id: 0}, xx=True)
    assert frontier.reap(P) == (1, 0)
    assert _used(frontier) == 3
    again = _lease(frontier, 2)
    assert {t.id for t in again} == {c.id, d.id}
    assert _charge(frontier, again, host_budget=3) == [CHARGED, CHARGED]  # within budget 3
    assert _used(frontier) == 3
    # A dead letter ends it unfetched: its page is given back.
    frontier.dead_letter(P, again[0].id, "malformed: test")
    assert _used(frontier) == 2
    frontier.ack(P, [again[1].ref])
    meta = frontier.client.hgetall(frontier.keys(P).meta)
    assert not [f for f in meta if f.startswith(b"b:")]  # no charge record left behind


def _spent(frontier: RedisFrontier) -> tuple[dict[str, int], dict[str, int], int, int]:
    """Host pages, topic pages, crawl pages charged and crawl pages done."""
    counts = ControlChannel(frontier.link).counts()
    return counts.hosts, counts.topics, counts.crawl, counts.crawl_done


def test_a_dead_letter_of_the_reaper_gives_its_page_back_like_any_dead_letter(
    frontier: RedisFrontier,
) -> None:
    _queue(frontier, 3)
    explicit, reaped = _lease(frontier, 2)
    assert _charge(frontier, [explicit, reaped], crawl_budget=2) == [CHARGED, CHARGED]
    assert _spent(frontier) == ({"h.test": 2}, {"t": 2}, 2, 0)
    # A dead letter given by a worker (a payload it cannot decode) ...
    frontier.dead_letter(P, explicit.id, "malformed: test")
    assert _spent(frontier) == ({"h.test": 1}, {"t": 1}, 1, 0)
    # ... and one given by the reaper (its fetch began max_deliveries = 2
    # times, its holders died) end the request unfetched alike: the page
    # goes back to the host, the topic and the crawl.
    k = frontier.keys(P)
    for round_ in (1, 2):
        (held,) = [reaped] if round_ == 1 else _lease(frontier, 1)
        assert held.id == reaped.id
        assert frontier.start_many({P: [held.ref]}) == 1
        frontier.client.zadd(k.leases, {held.id: 0}, xx=True)
        assert frontier.reap(P) == ((1, 0) if round_ == 1 else (0, 1))
    assert [d["id"] for d in frontier.dead_letters(P)] == [explicit.id, reaped.id]
    assert _spent(frontier) == ({}, {"t": 0}, 0, 0)
    assert not [f for f in frontier.client.hgetall(k.meta) if f.startswith(b"b:")]
    # So the crawl budget's end test (done >= budget) can still be met: the
    # page charged to the dead letter is charged to another request.
    (last,) = _lease(frontier, 1)
    assert _charge(frontier, [last], crawl_budget=1) == [CHARGED]
    assert frontier.ack(P, [last.ref]) == 1
    assert _spent(frontier) == ({"h.test": 1}, {"t": 1}, 1, 1)


def test_topic_and_crawl_counts_are_crawl_wide_on_one_server(frontier: RedisFrontier) -> None:
    _queue(frontier, 6)
    tokens = _lease(frontier, 6)
    out = _charge(frontier, tokens[:3], "x.test", topic="news", topic_budget=2, crawl_budget=4)
    assert out == [CHARGED, CHARGED, HELD]
    out = _charge(frontier, tokens[3:], "y.test", topic="other", crawl_budget=4)
    assert out == [CHARGED, CHARGED, HELD]
    counts = ControlChannel(frontier.link).counts()
    # Every topic is counted, budget or not: a budget set later counts what came before.
    assert counts.topics == {"news": 2, "other": 2} and counts.crawl == 4
    assert counts.hosts == {"x.test": 2, "y.test": 2}
    assert frontier.ack(P, [tokens[0].ref + "r"]) == 1  # put back: given back
    counts = ControlChannel(frontier.link).counts()
    assert counts.topics == {"news": 1, "other": 2} and counts.crawl == 3


def test_topic_and_crawl_budgets_are_refused_on_a_cluster() -> None:
    check_cluster(True, Action("budget", "a.test", 3))  # host budgets work there
    for target in ("crawl", "topic:news"):
        with pytest.raises(ControlError, match="need a single Redis server"):
            check_cluster(True, Action("budget", target, 3))
    check_cluster(False, Action("budget", "crawl", 3))


def test_purge_dead_letters_one_hosts_queued_and_held_requests(frontier: RedisFrontier) -> None:
    def payload(host: str, i: int) -> str:
        return json.dumps({"url": f"http://{host}/{i}", "callback": None})

    for i in range(3):
        frontier.enqueue(P, f"a{i}", payload("a.test", i))
        frontier.enqueue(P, f"b{i}", payload("b.test", i))
    # One a.test request leased and held over its budget.
    (first,) = _lease(frontier, 1)
    assert _charge(frontier, [first], "a.test", host_budget=0) == [HELD]

    def url_of(text: str) -> str | None:
        return str(json.loads(text)["url"])

    channel = ControlChannel(frontier.link)
    assert channel.purge("a.test", P, url_of) == 3
    letters = frontier.dead_letters(P)
    assert {json.loads(d["payload"])["url"] for d in letters} == {
        f"http://a.test/{i}" for i in range(3)
    }
    assert {d["reason"] for d in letters} == {"purged"}
    assert frontier.queued(P) == 3  # b.test's
    assert frontier.client.llen(frontier.keys(P).over) == 0
    assert channel.purge("a.test", P, url_of) == 0


def test_the_control_document_changes_atomically_and_logs_who(frontier: RedisFrontier) -> None:
    channel = ControlChannel(frontier.link)
    assert channel.load() == ControlState()
    errors: list[BaseException] = []

    def act(i: int) -> None:
        try:
            mine = ControlChannel(frontier.link)
            for j in range(10):
                mine.act(Action("budget", f"h{i}.test", j), who=f"op{i}", now=1.0 + j)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=act, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    state = channel.load()
    # Every action landed, one after the other: none overwrote another.
    assert state.version == 40
    assert {h: c.budget for h, c in state.hosts.items()} == {f"h{i}.test": 9 for i in range(4)}
    log = channel.log(100)
    assert len(log) == 40 and log[0]["version"] == 40
    assert {e["who"] for e in log} == {f"op{i}" for i in range(4)}
    assert log[0]["verb"] == "budget" and "target" in log[0] and "at" in log[0]
    frontier.client.set(frontier.keyspace.control, b"{not json")
    with pytest.raises(ControlError, match="not JSON"):
        channel.load()
    frontier.client.set(frontier.keyspace.control, json.dumps({"hosts": {"a.test": {"x": 1}}}))
    with pytest.raises(ControlError, match="unknown fields"):
        channel.load()


def test_known_hosts(frontier: RedisFrontier) -> None:
    channel = ControlChannel(frontier.link)
    assert not channel.known("a.test")
    channel.note_hosts(["a.test", "b.test"])
    channel.note_hosts([])
    assert channel.known("a.test") and channel.known_hosts() == {"a.test", "b.test"}
