"""Politeness on a fleet (issue #26): host states that move with their partition,
robots.txt fetched once per fleet, and the last-moment lease fence.

The first tests drive the worker's jobs step by step against a real
redis-server, as ``tests/test_redis_worker.py`` does; the crawls at the end
run real worker processes against the farm, with faults (a worker joining
mid-block, ``kill -9``, SIGSTOP past the lease TTL) and assert on what the
farm saw.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.hosts import HostWrite
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.scripts import Fenced
from scrapy_banker.redis.worker import FrontierWorker, WorkerOptions

PARTITIONS = 8

pytestmark = pytest.mark.slow  # a real redis-server, and crawls


def _worker(client: redis.Redis, node: str, **options: Any) -> FrontierWorker:
    frontier = RedisFrontier(client, prefix="pf", partitions=PARTITIONS, lease_ttl_ms=60_000)
    registry = NodeRegistry(client, frontier)
    worker = FrontierWorker(frontier, registry, node, WorkerOptions(**options))
    worker.membership.beat()
    return worker


def _move(worker: FrontierWorker, partition: int, node: str) -> None:
    """Hand ``partition`` to ``node`` (a new epoch), as a rebalance or a steal would."""
    moves = worker.link.registry.update("test", lambda table, live: table.assign({partition: node}))
    assert moves is not None


def _state(**fields: float) -> str:
    return json.dumps(fields, separators=(",", ":"))


# -- the hosts hash: written by the owner, read by the next one ------------------------


def test_only_the_owner_or_a_previous_owner_with_leases_out_writes_host_states(
    redis_client: redis.Redis,
) -> None:
    a = _worker(redis_client, "a", pop_per_partition=1)
    frontier = a.link.frontier
    epoch = a.owned[3]
    key = frontier.keys(3).hosts
    assert frontier.hosts.write_many("a", [HostWrite(3, epoch, {"h.test": _state(refusals=1)})])
    assert redis_client.hget(key, "h.test") == b'{"refusals":1}'
    # A stranger, or the owner under another epoch, writes nothing.
    (refused,) = frontier.hosts.write_many("z", [HostWrite(3, epoch, {"h.test": "{}"})])
    assert isinstance(refused, Fenced)
    (refused,) = frontier.hosts.write_many("a", [HostWrite(3, epoch + 1, {"h.test": "{}"})])
    assert isinstance(refused, Fenced)
    # "" deletes the field: a host back to the default state takes no room.
    assert frontier.hosts.write_many("a", [HostWrite(3, epoch, {"h.test": ""})]) == [1]
    assert not redis_client.exists(key)

    # a holds a lease of partition 3 when b joins and takes it over: until
    # that lease is released a may still write (the answer to its last
    # request), and b's pops wait (BUSY) for it.
    a.enqueue(EnqueueOp(3, "fp1", "r1"))
    a.enqueue(EnqueueOp(3, "fp2", "r2"))
    a.flusher.run_once()
    a.request(1)
    assert a.popper.pop() == 1
    (leased,) = a.inbound
    b = _worker(redis_client, "b")
    a.sync.sync()
    if 3 not in b.owned:
        _move(b, 3, "b")
        b.sync.sync()
        a.sync.sync()
    assert 3 in b.owned and 3 not in a.owned
    a.host_state("h.test", 3, leased.epoch, _state(blocked_until=2e9, refusals=1))
    a.ack(leased.token)
    b.request(10)
    b.state.hints.nonempty.add(3)
    # Sent in one ordered batch: the state first, then the ack that lets b pop.
    assert a.flusher.run_once()
    assert a.take_counters()["banker/redis/host_states_written"] == 1
    assert b.popper.pop() == 1
    # b read the states of each partition it popped in the pipeline of its
    # first pop there, and hands them to its scheduler before their leases.
    adopted = {p: states for p, _, states in b.adopted}
    assert adopted[3] == {"h.test": '{"blocked_until":2000000000.0,"refusals":1}'}
    assert set(adopted) == set(b.owned)  # empty ones too: read once per epoch
    assert b.take_counters()["banker/redis/host_states_adopted"] == 1
    # Now a's leases there are gone: a writes nothing more.
    a.host_state("h.test", 3, leased.epoch, "")
    assert a.flusher.run_once()
    assert a.take_counters()["banker/redis/host_states_fenced"] == 1
    assert redis_client.hexists(frontier.keys(3).hosts, "h.test")
    # Popping the same partition again at the same epoch reads nothing more.
    b.adopted.clear()
    b.enqueue(EnqueueOp(3, "fp3", "r3"))
    b.flusher.run_once()
    assert b.popper.pop() == 1
    assert not b.adopted


def test_a_newer_state_of_a_host_replaces_an_unsent_one(redis_client: redis.Redis) -> None:
    a = _worker(redis_client, "a")
    a.host_state("h.test", 1, 0, _state(refusals=1))
    a.host_state("h.test", 1, 0, _state(refusals=2))
    a.host_state("other.test", 2, 0, _state(crawl_delay=3))
    a.host_state("gone.test", 5, 0, "")
    batch = a.state.outbox.take()
    assert set(batch.hosts) == {"h.test", "other.test", "gone.test"}
    # Not confirmed: put back behind anything newer.
    a.host_state("h.test", 1, 0, _state(refusals=3))
    a.state.outbox.put_back(batch)
    assert a.flusher.run_once()
    assert redis_client.hget(a.link.frontier.keys(1).hosts, "h.test") == b'{"refusals":3}'
    assert redis_client.hget(a.link.frontier.keys(2).hosts, "other.test") == b'{"crawl_delay":3}'
    # Not spilled: a state is a hint for the next owner, not work.
    a.host_state("h.test", 1, 0, "")
    assert len(a.state.outbox.take_unsent()) == 0
    assert not a.state.outbox.take().hosts


def test_a_partition_owned_again_under_a_new_epoch_is_read_again(
    redis_client: redis.Redis,
) -> None:
    a = _worker(redis_client, "a")
    a.enqueue(EnqueueOp(2, "fp1", "r1"))
    a.flusher.run_once()
    a.request(10)
    a.popper.pop()
    assert {p: states for p, _, states in a.adopted}[2] == {}
    a.adopted.clear()
    (leased,) = a.inbound
    a.host_state("h.test", 2, 0, _state(crawl_delay=5, last_sent=1e9))
    a.ack(leased.token)
    a.flusher.run_once()
    # Declared dead and joined again: a new epoch, whose first pop reads again.
    _move(a, 2, "b")
    _move(a, 2, "a")
    a.sync.sync()
    a.enqueue(EnqueueOp(2, "fp2", "r2"))
    a.flusher.run_once()
    a.state.hints.nonempty.add(2)
    a.popper.pop()
    assert list(a.adopted) == [
        (2, a.owned[2], {"h.test": '{"crawl_delay":5,"last_sent":1000000000.0}'})
    ]
