"""Two-level URL mapping of PQ-MCSA §1.2.2: key → logical partition → node.

The paper maps a URL first onto one of M logical nodes (``hash mod M``, with
M much larger than the number of crawlers) and then maps logical nodes onto
the physical ones.  Only the second level changes when crawlers join or
leave, so a membership change moves whole partitions -- never re-hashes URLs
-- and, done carefully, moves as few partitions as possible.  Because a
partition belongs to exactly one node at a time and all URLs of a queue key
(a host) share a partition, one node at a time fetches a host: cluster-wide
politeness without a global lock.

This module is the table and its rebalancing rule.  Where the table lives
(Redis) and how ownership is fenced (an epoch per partition checked in the
Lua pop) is the distributed frontier's business; :attr:`PartitionTable.epochs`
is what it fences with.  Pure Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Move", "PartitionTable", "target_counts"]


@dataclass(frozen=True)
class Move:
    partition: int
    old: str | None  # None: the partition had no live owner
    new: str


def target_counts(partitions: int, capacities: Mapping[str, float]) -> dict[str, int]:
    """Partitions each node should own: proportional to capacity, summing to ``partitions``.

    Largest-remainder rounding, ties broken by node name, so every node of
    the cluster computes the same targets from the same registry.
    """
    if not capacities:
        return {}
    for node, cap in capacities.items():
        if not cap > 0:
            raise ValueError(f"capacity of node {node!r} must be > 0, got {cap!r}")
    total = float(sum(capacities.values()))
    quotas = {node: partitions * cap / total for node, cap in capacities.items()}
    counts = {node: int(q) for node, q in quotas.items()}
    left = partitions - sum(counts.values())
    by_remainder = sorted(quotas, key=lambda n: (-(quotas[n] - counts[n]), n))
    for node in by_remainder[:left]:
        counts[node] += 1
    return counts


class PartitionTable:
    """Owner and epoch of each of M logical partitions."""

    def __init__(self, partitions: int = 1024) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
        self.size = partitions
        self.owners: list[str | None] = [None] * partitions
        #: Bumped each time a partition changes owner: a node that still thinks
        #: it owns an older epoch is fenced off by the frontier.
        self.epochs: list[int] = [0] * partitions
        #: Bumped by whoever stores a changed table; first in its JSON form, so
        #: workers notice a change by reading a few bytes instead of the table.
        self.version = 0

    def partition_of(self, key_hash: int) -> int:
        """First level: the logical partition of a queue key's hash."""
        return key_hash % self.size

    def owner_of(self, key_hash: int) -> str | None:
        return self.owners[self.partition_of(key_hash)]

    def owned_by(self, node: str) -> list[int]:
        return [p for p, owner in enumerate(self.owners) if owner == node]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for owner in self.owners:
            if owner is not None:
                out[owner] = out.get(owner, 0) + 1
        return out

    def rebalance(
        self, capacities: Mapping[str, float], *, work: Sequence[int] | None = None
    ) -> list[Move]:
        """Second level: assign partitions to the live ``capacities`` nodes, moving the fewest.

        A node keeps every partition it owns up to its target; partitions of
        departed nodes and each node's surplus over its target go to the
        nodes under target.  The number of moves is therefore
        ``orphans + sum(max(0, owned - target))``, the minimum for these
        targets.

        Which partitions move is chosen by ``work`` (requests queued or
        leased in each): what a node keeps and what it gives up interleave
        its partitions in order of work, and the partitions handed out are
        dealt like cards, so every node ends up with its share of the work
        there is now, not only of the partitions.  (Keeping the partitions a
        node holds leases in would be cheaper -- the new owner of one waits
        until its requests in flight are acked -- but the first worker of a
        fleet holds leases in nearly every partition with work, and would
        keep the whole crawl.)  Every choice is deterministic.
        """
        targets = target_counts(self.size, capacities)
        if not targets:
            # No live node: nothing owns anything; epochs move so old owners are fenced.
            for p, owner in enumerate(self.owners):
                if owner is not None:
                    self.owners[p] = None
                    self.epochs[p] += 1
            return []
        weight = [0] * self.size if work is None else list(work)
        owned: dict[str, list[int]] = {node: [] for node in targets}
        free: list[int] = []
        for p, owner in enumerate(self.owners):
            if owner in owned:
                owned[owner].append(p)
            else:
                free.append(p)
        kept: dict[str, int] = {}
        for node, parts in owned.items():
            target = targets[node]
            kept[node] = min(target, len(parts))
            if len(parts) <= target:
                continue
            parts.sort(key=lambda p: (-weight[p], p))
            for i, p in enumerate(parts):
                # Keep ``target`` of ``parts``, spread evenly over its work order.
                if (i + 1) * target // len(parts) == i * target // len(parts):
                    free.append(p)
        need = {node: targets[node] - kept[node] for node in sorted(targets)}
        left = dict(need)
        moves: list[Move] = []
        for p in sorted(free, key=lambda p: (-weight[p], p)):
            # The node furthest from its target gets the next partition, so the
            # work is dealt out like cards rather than in blocks.
            node = max((n for n in left if left[n]), key=lambda n: (left[n] / need[n], n))
            left[node] -= 1
            moves.append(Move(p, self.owners[p], node))
            self.owners[p] = node
            self.epochs[p] += 1
        return moves

    def steal(
        self,
        thief: str,
        capacities: Mapping[str, float],
        queued: Sequence[int],
        leased: Sequence[int],
        *,
        slots: int,
        limit: int,
    ) -> list[Move]:
        """Give ``thief`` partitions whose work waits for a saturated node (work stealing).

        A node holding leases in at least ``slots`` partitions (a worker's
        ``CONCURRENT_REQUESTS / CONCURRENT_REQUESTS_PER_DOMAIN``: hosts it can
        fetch at once) is working at its concurrency.  It keeps ``slots`` of
        its leased partitions (the most leased: the likeliest in flight);
        the rest of its partitions with work wait until one of those hosts
        runs dry.  The thief takes up to ``limit`` of these, at most half
        (rounded up) of each such node's waiting partitions so the node
        still has work to turn to: first those without a lease (nothing in
        flight anywhere, so the thief pops them at once), the most queued
        first (the longest jobs start first, which shortens the tail); then
        leased ones -- a node leases ahead what it buffers, and a partition
        it merely buffers is handed back within a tenth of a second of the
        table change, while the ``BUSY`` fence keeps the thief off the host
        until every old lease is released, so politeness holds either way.
        Partitions of nodes not in ``capacities`` (not live) are left to
        :meth:`rebalance`.
        """
        if thief not in capacities or limit < 1:
            return []
        mine: dict[str, list[int]] = {}
        for p, owner in enumerate(self.owners):
            if owner is None or owner == thief or owner not in capacities:
                continue
            if leased[p] > 0 or queued[p] > 0:
                mine.setdefault(owner, []).append(p)
        moves: list[Move] = []
        candidates: dict[str, list[int]] = {}
        for donor, parts in mine.items():
            working = sorted((p for p in parts if leased[p] > 0), key=lambda p: (-leased[p], p))
            if len(working) < slots:
                continue  # it has room for its waiting hosts itself
            kept = set(working[:slots])
            waiting = [p for p in parts if p not in kept and queued[p] > 0]
            waiting.sort(key=lambda p: (leased[p] > 0, -queued[p], p))
            candidates[donor] = waiting[: (len(waiting) + 1) // 2]
        for donor in sorted(candidates, key=lambda n: (-len(candidates[n]), n)):
            for p in candidates[donor]:
                if len(moves) >= limit:
                    return moves
                moves.append(Move(p, donor, thief))
                self.owners[p] = thief
                self.epochs[p] += 1
        return moves

    def assign(self, changes: Mapping[int, str]) -> list[Move]:
        """Give each partition in ``changes`` to its new node (a placement decision).

        Each change bumps the partition's epoch, which fences the old owner
        exactly as a rebalance does.  Assigning a partition to its current
        owner is a no-op.
        """
        moves: list[Move] = []
        for p in sorted(changes):
            node = changes[p]
            if not 0 <= p < self.size:
                raise ValueError(f"partition {p} outside 0..{self.size - 1}")
            if self.owners[p] == node:
                continue
            moves.append(Move(p, self.owners[p], node))
            self.owners[p] = node
            self.epochs[p] += 1
        return moves

    # -- persistence (the table is stored in Redis as JSON) -------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "size": self.size,
            "owners": list(self.owners),
            "epochs": list(self.epochs),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PartitionTable:
        try:
            size = state["size"]
            owners = state["owners"]
            epochs = state["epochs"]
        except (KeyError, TypeError):
            raise ValueError("malformed partition table: needs size, owners, epochs") from None
        table = cls(size)
        if not isinstance(owners, list) or len(owners) != size:
            raise ValueError(f"malformed partition table: owners must be a list of {size}")
        if not isinstance(epochs, list) or len(epochs) != size:
            raise ValueError(f"malformed partition table: epochs must be a list of {size}")
        for p, (owner, epoch) in enumerate(zip(owners, epochs, strict=True)):
            if owner is not None and not isinstance(owner, str):
                raise ValueError(f"malformed partition table: owner of {p} is {owner!r}")
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"malformed partition table: epoch of {p} is {epoch!r}")
        version = state.get("version", 0)  # tables written before versions had none
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"malformed partition table: version is {version!r}")
        table.owners = list(owners)
        table.epochs = list(epochs)
        table.version = version
        return table
