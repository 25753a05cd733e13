"""Per-host politeness state kept with its partition, so it moves with the host.

A host's :class:`~scrapy_banker.core.politeness.HostState` -- a Retry-After
block, the backoff after refusals, robots.txt's Crawl-delay and the last
request sent, the delay a throttle settled on -- lives in the memory of the
worker that fetches the host.  On a fleet that worker changes: a rebalance,
a steal, a worker killed.  So the owner of a partition also writes the
states of the partition's hosts to the partition's ``hosts`` hash
(:attr:`PartitionKeys.hosts <scrapy_banker.redis.keys.PartitionKeys.hosts>`,
in its cluster slot), in batches with its other operations, only those that
changed, and deletes a host's field when its state is back to the default.
A node that takes a partition over reads the hash before it dispatches any
of the partition's requests (:meth:`HostStates.read_many`, right after its
first pop that leased something under the new epoch).

The write (``lua/hosts.lua``) is fenced like a pop: only the owner at its
epoch writes, or a previous owner while leases of its epoch are still out
-- the answers to its last requests may change a host's state, and they
reach Redis before the acks that release those leases, which the new
owner's pops wait for.  A node stopped past its leases writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_banker.redis.keys import decode
from scrapy_banker.redis.scripts import ScriptCall

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from scrapy_banker.redis.frontier.link import FrontierLink

__all__ = ["HostStates", "HostWrite"]


@dataclass(frozen=True)
class HostWrite:
    """The states of some of one partition's hosts, written by ``node`` at ``epoch``.

    ``states`` maps a host to its state as JSON, or to ``""`` to delete it
    (the host is back to the default state).
    """

    partition: int
    epoch: int
    states: Mapping[str, str]


class HostStates:
    """Writes and reads the ``hosts`` hash of partitions."""

    def __init__(self, link: FrontierLink) -> None:
        self.link = link

    def call(self, node: str, write: HostWrite) -> ScriptCall:
        """The ``hosts`` script's run for one write (a batch may mix it with others)."""
        k = self.link.keys(write.partition)
        args: list[str | int] = [node, int(write.epoch)]
        for host, state in write.states.items():
            args += [host, state]
        return ScriptCall([k.owner, k.hosts, k.meta], args)

    def write_many(self, node: str, writes: Iterable[HostWrite]) -> list[object]:
        """Send the writes now; per write the fields changed, or a
        :class:`~scrapy_banker.redis.scripts.Fenced` refusal."""
        return self.link.scripts.run("hosts", [self.call(node, w) for w in writes if w.states])

    def read_many(self, partitions: Iterable[int]) -> dict[int, dict[str, str]]:
        """Partition -> host -> state JSON, for each of ``partitions`` (one round trip)."""
        order = list(partitions)
        if not order:
            return {}
        pipe = self.link.client.pipeline(transaction=False)
        for p in order:
            pipe.hgetall(self.link.keys(p).hosts)
        return {
            p: {decode(h, lossy=True): decode(v, lossy=True) for h, v in raw.items()}
            for p, raw in zip(order, pipe.execute(), strict=True)
        }
