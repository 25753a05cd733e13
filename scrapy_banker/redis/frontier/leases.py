"""Leasing queued requests: pop, ack, nack, start, renew -- at-least-once delivery.

scrapy-redis pops requests destructively: a worker that dies loses everything
it popped.  Here a pop (``lua/pop.lua``) moves each request into the
partition's *lease* set, scored by the Redis server's clock plus a TTL, and
counts its deliveries; the worker acknowledges a request once its response
(and the requests it yielded) are processed, and renews its leases with its
heartbeat.  Leases nobody renewed go back to the queue through the reaper
(:mod:`scrapy_banker.redis.frontier.reaper`).

A partition is popped only by its owner at its epoch (:meth:`Leases.set_owner`):
the pop script fences off any other node (``NOTOWNER``) and makes a new owner
wait while the previous owner's leases are out (``BUSY``), so one host is
fetched by one worker at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.ops import LeaseToken
from scrapy_banker.redis.keys import decode
from scrapy_banker.redis.scripts import Busy, Fenced, ScriptCall

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence

    from scrapy_banker.redis.frontier.link import FrontierLink
    from scrapy_banker.redis.keys import PartitionKeys

__all__ = ["Leased", "Leases", "NotOwner", "PopResult"]


class NotOwner(RuntimeError):
    """The partition is owned by another node or epoch: this node is fenced off."""


@dataclass(frozen=True)
class Leased:
    partition: int
    id: str
    payload: str
    deliveries: int
    #: See :attr:`LeaseToken.leased_at` and :attr:`LeaseToken.epoch`.
    leased_at: float = field(default=0.0, compare=False)
    epoch: int = field(default=0, compare=False)

    @property
    def token(self) -> LeaseToken:
        return LeaseToken(self.partition, self.id, self.deliveries, self.leased_at, self.epoch)


@dataclass
class PopResult:
    """What one pipelined pop over many partitions found."""

    leased: list[Leased]
    #: Partitions this node was fenced off from (another node or epoch owns them).
    not_owned: list[int]
    #: Partitions handed over to this node whose previous owner still has
    #: requests in flight: popping waits until they are acked or expire.
    busy: list[int]
    #: Partitions that had nothing queued.
    empty: list[int]
    #: Partition -> host -> state JSON, for the partitions asked to be read
    #: (``read_hosts``) whose pop was neither fenced nor ``BUSY``.
    hosts: dict[int, dict[str, str]] = field(default_factory=dict)
    #: Partition -> requests still queued there after the pop (its meta ``n``),
    #: for every partition popped that was neither fenced nor ``BUSY``.
    queued: dict[int, int] = field(default_factory=dict)


#: The keys of the scripts that act on leases by ``partition -> ids``.
_LEASE_KEYS: dict[str, Callable[[PartitionKeys], list[str]]] = {
    "ack": lambda k: [k.leases, k.payloads, k.meta],
    "nack": lambda k: [k.levels, k.leases, k.meta, k.payloads],
    "start": lambda k: [k.meta],
    "renew": lambda k: [k.leases],
}


class Leases:
    """Pops requests as leases of ``lease_ttl_ms`` and settles them by id."""

    def __init__(self, link: FrontierLink, lease_ttl_ms: int) -> None:
        self.link = link
        self.lease_ttl_ms = lease_ttl_ms

    # -- ownership --------------------------------------------------------------------

    def set_owner(self, partition: int, node: str, epoch: int) -> None:
        """Record ``node@epoch`` as the owner the pop script fences on."""
        self.link.client.set(self.link.keys(partition).owner, f"{node}@{epoch}")

    def owner(self, partition: int) -> str | None:
        value = self.link.client.get(self.link.keys(partition).owner)
        return None if value is None else decode(value)

    # -- popping ----------------------------------------------------------------------

    def pop(self, partition: int, node: str, epoch: int, count: int = 1) -> list[Leased]:
        """Lease up to ``count`` requests of a partition this node owns at ``epoch``."""
        (answer,) = self._pop({partition: epoch}, node, count)
        if isinstance(answer, Fenced):
            raise NotOwner(f"partition {partition} is not owned by {node}@{epoch} ({answer.reply})")
        if isinstance(answer, Busy):
            return []  # the previous owner's requests are still in flight
        return _leased(partition, answer[:-1])

    def pop_many(
        self,
        owned: Mapping[int, int],
        node: str,
        count_per_partition: int = 1,
        *,
        counts: Mapping[int, int] | None = None,
        read_hosts: Collection[int] = (),
    ) -> PopResult:
        """:meth:`pop` on many partitions in one round trip; ``owned``: partition -> epoch.

        ``counts`` (partition -> how many) overrides ``count_per_partition``.
        For the partitions in ``read_hosts`` the hosts' politeness states
        are read right after the pop, in the same pipeline
        (``lua/hosts_read.lua``; see :mod:`scrapy_banker.redis.frontier.hosts`).
        """
        result = PopResult([], [], [], [])
        answers = iter(self._pop(owned, node, count_per_partition, counts, read_hosts))
        for p in owned:
            answer = next(answers)
            states = next(answers) if p in read_hosts else None
            if isinstance(answer, Fenced):
                result.not_owned.append(p)
                continue
            if isinstance(answer, Busy):
                result.busy.append(p)
                continue
            *flat, queued = answer
            result.queued[p] = int(queued)
            if flat:
                result.leased.extend(_leased(p, flat))
            else:
                result.empty.append(p)
            if states is not None:
                result.hosts[p] = {
                    decode(states[i], lossy=True): decode(states[i + 1], lossy=True)
                    for i in range(0, len(states), 2)
                }
        return result

    def _pop(
        self,
        owned: Mapping[int, int],
        node: str,
        count: int,
        counts: Mapping[int, int] | None = None,
        read_hosts: Collection[int] = (),
    ) -> list[Any]:
        calls: list[tuple[str, ScriptCall]] = []
        for p, epoch in owned.items():
            k = self.link.keys(p)
            n = count if counts is None else counts.get(p, count)
            calls.append(("pop", ScriptCall(
                [k.levels, k.leases, k.payloads, k.meta, k.owner],
                [node, int(epoch), self.lease_ttl_ms, int(n)],
            )))  # fmt: skip
            if p in read_hosts:
                calls.append(("hosts_read", ScriptCall([k.hosts], [])))
        return self.link.scripts.run_batch(calls)

    # -- settling ---------------------------------------------------------------------

    def ack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        """Forget processed requests (partition -> ids, or ``id#delivery``,
        :attr:`LeaseToken.ref`)."""
        return self._run("ack", ids)

    def nack_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        """Give leased requests back unprocessed; the delivery does not count."""
        return self._run("nack", ids)

    def start_many(self, refs: Mapping[int, Sequence[str]]) -> int:
        """Mark deliveries whose fetch began (``partition -> id#delivery refs``).

        Only such a delivery counts towards the frontier's ``max_deliveries``
        when its lease expires: a request that sat in the buffer of a worker
        that died or froze goes back to the queue with no mark against it,
        so a run of faults cannot dead-letter a request that was never
        fetched.  A request that kills its worker as it is fetched still
        reaches the dead letters -- if the mark left the worker first (its
        thread sends it within milliseconds).
        """
        return self._run("start", refs)

    def renew_many(self, ids: Mapping[int, Sequence[str]]) -> int:
        """Extend leases by the TTL from now (the server's clock)."""
        return self._run("renew", ids)

    def calls(self, name: str, ids: Mapping[int, Sequence[str]]) -> list[ScriptCall]:
        """The runs of ``ack``, ``nack``, ``start`` or ``renew`` for ``partition -> ids``.

        One per partition with ids; a batch may mix them with other scripts
        (:meth:`RedisFrontier.flush <scrapy_banker.redis.frontier.RedisFrontier.flush>`).
        """
        keys_of = _LEASE_KEYS[name]
        head: list[str | int] = [self.lease_ttl_ms] if name == "renew" else []
        tail = self.link.budget_keys if name in ("ack", "nack") else []
        return [
            ScriptCall([*keys_of(self.link.keys(p)), *tail], [*head, *batch])
            for p, batch in ids.items()
            if batch
        ]

    def _run(self, name: str, ids: Mapping[int, Sequence[str]]) -> int:
        return sum(int(answer) for answer in self.link.scripts.values(name, self.calls(name, ids)))


def _leased(partition: int, flat: Sequence[Any]) -> list[Leased]:
    # A payload that is not UTF-8 (garbage, a planted pickle) must not crash
    # the worker here: decoded lossily, the codec refuses it and the caller
    # dead-letters it.
    return [
        Leased(partition, decode(flat[i]), decode(flat[i + 1], lossy=True), int(flat[i + 2]))
        for i in range(0, len(flat), 3)
    ]
