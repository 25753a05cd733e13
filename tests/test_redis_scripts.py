"""The one script runner against a real redis-server: batches, lost scripts, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

import scrapy_banker.redis
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.leases import NotOwner
from scrapy_banker.redis.scripts import Busy, Fenced, Refusal, ScriptCall, ScriptRunner

pytestmark = pytest.mark.slow  # a real redis-server


@pytest.fixture
def frontier(redis_client: redis.Redis) -> RedisFrontier:
    f = RedisFrontier(redis_client, prefix="s", partitions=8, lease_ttl_ms=60_000)
    for p in range(8):
        f.set_owner(p, "node-a", 1)
    return f


def _enqueue_call(frontier: RedisFrontier, partition: int, fingerprint: str) -> ScriptCall:
    k = frontier.keys(partition)
    return ScriptCall([k.levels, k.seen, k.payloads, k.meta], [fingerprint, "payload", 0, "1"])


def _pop_call(frontier: RedisFrontier, partition: int, node: str, epoch: int) -> ScriptCall:
    k = frontier.keys(partition)
    keys = [k.levels, k.leases, k.payloads, k.meta, k.owner]
    return ScriptCall(keys, [node, epoch, 60_000, 5])


def test_every_lua_file_is_runnable_by_its_sha(redis_client: redis.Redis) -> None:
    runner = ScriptRunner(redis_client)
    lua = Path(scrapy_banker.redis.__file__).parent / "lua"
    scripts = [path for path in sorted(lua.glob("*.lua")) if not path.stem.startswith("_")]
    assert len(scripts) >= 10
    for path in scripts:
        source = runner.source(path.stem)
        assert runner.sha(path.stem) == redis_client.script_load(source)
        assert "#include" not in source  # every include was pasted in
    # A shared piece is pasted, not run: the scripts that include it carry it.
    piece = (lua / "_putback.lua").read_text("utf-8")
    assert piece in runner.source("nack") and piece in runner.source("reap")
    lease = (lua / "_lease.lua").read_text("utf-8")
    for name in ("ack", "nack", "deadletter", "reap", "charge"):
        assert lease in runner.source(name)


def test_a_flushed_script_is_loaded_again_and_the_batch_runs_once(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    runner = frontier.scripts
    calls = [_enqueue_call(frontier, p, f"fp{p}") for p in range(8)]  # dont_filter: no dedup
    assert all(runner.values("enqueue", calls))
    redis_client.script_flush()
    assert redis_client.script_exists(runner.sha("enqueue")) == [False]
    assert all(runner.values("enqueue", calls))
    assert redis_client.script_exists(runner.sha("enqueue")) == [True]
    assert [frontier.queued(p) for p in range(8)] == [2] * 8  # each call ran exactly twice


def test_single_calls_take_the_same_path_and_survive_a_flush(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    rid = frontier.enqueue(3, "fp", "p")
    redis_client.script_flush()
    (leased,) = frontier.pop(3, "node-a", 1)
    assert leased.id == rid
    redis_client.script_flush()
    assert frontier.renew(3, [leased.id]) == 1
    redis_client.script_flush()
    assert frontier.ack(3, [leased.token.ref]) == 1
    redis_client.script_flush()
    assert frontier.reap(3) == (0, 0)
    redis_client.script_flush()
    with pytest.raises(NotOwner, match=r"partition 3 is not owned by node-b@1 \(NOTOWNER"):
        frontier.pop(3, "node-b", 1)


def test_refusals_come_back_typed_and_in_place(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    for p in (0, 1, 2):
        frontier.enqueue(p, f"fp{p}", f"p{p}")
    frontier.pop(2, "node-a", 1)  # in flight when partition 2 moves to epoch 2
    frontier.set_owner(2, "node-a", 2)
    calls = [
        _pop_call(frontier, 0, "node-b", 1),  # another node's
        _pop_call(frontier, 1, "node-a", 1),
        _pop_call(frontier, 2, "node-a", 2),  # the epoch-1 lease is still out
        _pop_call(frontier, 5, "node-a", 1),  # owned, empty
    ]
    fenced, leased, busy, empty = frontier.scripts.run("pop", calls)
    assert isinstance(fenced, Fenced) and fenced.reply == "NOTOWNER node-a@1"
    assert isinstance(busy, Busy) and busy.reply == "BUSY 1"
    assert isinstance(fenced, Refusal) and isinstance(busy, Refusal)
    # id, payload, deliveries; last, what is still queued in the partition.
    assert [x.decode() if isinstance(x, bytes) else x for x in leased[1:]] == ["p1", 1, 0]
    assert empty == [0]
    # A refusal where none is expected is an error, not a value.
    with pytest.raises(redis.ResponseError, match="NOTOWNER"):
        frontier.scripts.values("pop", calls[:1])


def test_a_pop_tells_what_is_still_queued_in_each_partition(frontier: RedisFrontier) -> None:
    for p, n in ((3, 5), (4, 1)):
        for i in range(n):
            frontier.enqueue(p, f"fp{p}-{i}", f"p{p}-{i}")
        frontier.set_owner(p, "node-a", 1)
    frontier.set_owner(6, "node-a", 1)
    result = frontier.pop_many({3: 1, 4: 1, 6: 1}, "node-a", 2)
    assert result.queued == {3: 3, 4: 0, 6: 0}
    assert sorted(x.payload for x in result.leased) == ["p3-0", "p3-1", "p4-0"]
    assert result.empty == [6]
    assert result.queued[3] == frontier.queued(3)


def test_other_error_replies_are_raised_after_the_whole_batch_ran(
    frontier: RedisFrontier, redis_client: redis.Redis
) -> None:
    redis_client.set(frontier.keys(4).seen, "not a set")
    calls = [_enqueue_call(frontier, p, "fp") for p in (3, 4, 5)]
    calls = [ScriptCall(c.keys, [*c.args[:3], "0"]) for c in calls]  # dedup: SADD on seen first
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        frontier.scripts.run("enqueue", calls)
    assert [frontier.queued(p) for p in (3, 4, 5)] == [1, 0, 1]


def test_an_empty_batch_sends_nothing(redis_client: redis.Redis) -> None:
    redis_client.script_flush()
    runner = ScriptRunner(redis_client)
    assert runner.run("pop", []) == []
    assert redis_client.script_exists(runner.sha("pop")) == [False]  # not even loaded
