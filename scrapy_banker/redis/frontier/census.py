"""Counting the work left in a crawl: is it over, and where does work wait?

A request is *work* while it is queued or leased.  Idle workers ask whether
the crawl is over (:meth:`WorkCensus.census`, :meth:`WorkCensus.outstanding`),
hungry ones which partitions wait, the placement planner how much work each
partition would take with it (:meth:`WorkCensus.backlog`).  Partitions are
addressed by number, never found by ``KEYS``/``SCAN``.

"Over" must be exact, not a guess after a quiet period: every batch that
finishes requests (acks, dead letters, a reaper round) first bumps the
crawl's :attr:`~scrapy_banker.redis.keys.Keyspace.finished` version
(:func:`finished_bump`), and a census reads it before and after counting
(see :attr:`Census.drained`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from scrapy_banker.redis.keys import QUEUED
from scrapy_banker.redis.scripts import Refusal, ScriptCall

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy_banker.redis.frontier.link import FrontierLink
    from scrapy_banker.redis.keys import Keyspace, PartitionKeys

__all__ = ["CENSUS_CHUNK", "Census", "WorkCensus", "finished_bump"]

#: Partitions counted by one census script on one server (:meth:`WorkCensus.census`).
CENSUS_CHUNK = 256


@dataclass(frozen=True)
class Census:
    """Work left in the crawl, from one :meth:`WorkCensus.census`."""

    #: :attr:`Keyspace.finished <scrapy_banker.redis.keys.Keyspace.finished>`
    #: read before and after counting the partitions.
    before: int
    after: int
    #: Queued + leased requests found; with ``each=False`` counting stops at
    #: the first partition with work, so only ``work == 0`` is exact.
    work: int
    #: Per partition (``each=True`` only; else empty).
    queued: list[int]
    leased: list[int]

    @property
    def drained(self) -> bool:
        """Nothing queued or leased anywhere, and nothing finished while counting.

        Each partition is counted atomically; work moves from one partition
        to another only by a request's children being queued before the
        request is acked, and every ack batch bumps the version first --
        after its children were queued.  So if work moved from a partition
        not counted yet to one already counted, the version changed in
        between; if it did not, the crawl really was empty.
        """
        return self.work == 0 and self.before == self.after


def finished_bump(keyspace: Keyspace) -> ScriptCall:
    """The ``bump`` script's run that moves the crawl's ``finished`` version."""
    return ScriptCall([keyspace.finished], [])


class WorkCensus:
    """Counts queued and leased requests, per partition or crawl-wide."""

    def __init__(self, link: FrontierLink) -> None:
        self.link = link
        # Every partition's (meta, leases) keys, for census scans.
        self._count_keys: list[tuple[str, str]] | None = None

    def outstanding(self, *, any_: bool = False, chunk: int = 128) -> int:
        """Requests queued or leased in the whole crawl: 0 means the crawl is done.

        Two reads per partition (:func:`_count_into`), ``chunk`` partitions per
        pipeline (no ``SCAN``); called only by idle workers, to decide whether
        the crawl is over.  With ``any_`` the count stops at the first
        non-empty chunk, in a random chunk order: an idle worker of a busy
        fleet asks this twice a second and needs a yes/no, not 2,048 answers.
        """
        partitions = self.link.partitions
        size = max(1, chunk)
        starts = list(range(0, partitions, size))
        if any_:
            random.shuffle(starts)
        total = 0
        for start in starts:
            pipe = self.link.client.pipeline(transaction=False)
            for p in range(start, min(partitions, start + size)):
                _count_into(pipe, self.link.keys(p))
            total += sum(int(n or 0) for n in pipe.execute())
            if any_ and total:
                break
        return total

    def census(
        self,
        *,
        each: bool = False,
        chunk: int = CENSUS_CHUNK,
        between: Callable[[int], object] | None = None,
    ) -> Census:
        """Count the work left in every partition, between two readings of the version.

        ``Census.drained`` is exact (see there); called by idle workers to
        decide whether the crawl is over, and with ``each`` by hungry ones
        to see which partitions wait.  Each partition's queue and leases are counted
        in one script; on one server a script counts ``chunk`` partitions
        (one round trip for all), on a cluster one partition (its slot).
        ``between`` is called with each chunk's index after it was counted
        (the chunks then go one round trip each): a test can move work in
        the middle of a scan.
        """
        link = self.link
        if self._count_keys is None:
            self._count_keys = [(k.meta, k.leases) for k in map(link.keys, range(link.partitions))]
        size = 1 if link.cluster else max(1, chunk)
        calls = []
        for start in range(0, link.partitions, size):
            keys = [key for pair in self._count_keys[start : start + size] for key in pair]
            calls.append(("count", ScriptCall(keys, ["each" if each else "sum"])))
        before = self.finished_version()
        if between is None:
            answers = link.scripts.run_batch(calls)
        else:
            answers = []
            for i, call in enumerate(calls):
                answers += link.scripts.run_batch([call])
                between(i)
        after = self.finished_version()
        queued: list[int] = []
        leased: list[int] = []
        work = 0
        for answer in answers:
            if isinstance(answer, Refusal):
                raise redis.ResponseError(answer.reply)
            if each:
                counts = [int(n) for n in answer]
                queued += counts[0::2]
                leased += counts[1::2]
                work += sum(counts)
            else:
                work += int(answer)
        return Census(before, after, work, queued, leased)

    def finished_version(self) -> int:
        """The crawl's :attr:`~scrapy_banker.redis.keys.Keyspace.finished` counter."""
        return int(self.link.client.get(self.link.keyspace.finished) or 0)

    def bump_finished(self) -> int:
        """Move the crawl's ``finished`` version, as a batch that changed the work does."""
        (answer,) = self.link.scripts.values("bump", [finished_bump(self.link.keyspace)])
        return int(answer)

    def backlog(self, partitions: Iterable[int], *, chunk: int = 128) -> dict[int, int]:
        """Requests queued or leased per partition: the work each would take with it.

        The placement planner weighs partitions by it (:func:`_count_into`,
        ``chunk`` partitions per pipeline).
        """
        wanted = sorted({p for p in partitions if 0 <= p < self.link.partitions})
        out: dict[int, int] = {}
        for start in range(0, len(wanted), max(1, chunk)):
            part = wanted[start : start + max(1, chunk)]
            pipe = self.link.client.pipeline(transaction=False)
            for p in part:
                _count_into(pipe, self.link.keys(p))
            counts = pipe.execute()
            for i, p in enumerate(part):
                out[p] = sum(int(n or 0) for n in counts[2 * i : 2 * i + 2])
        return out

    def held(self, *, chunk: int = 128) -> int:
        """Requests held over a budget in the whole crawl (the partitions' over lists).

        Read once, when the crawl drains: a crawl that ends with requests
        held closes with the budget's reason, not ``finished``.
        """
        link, total = self.link, 0
        size = max(1, chunk)
        for start in range(0, link.partitions, size):
            pipe = link.client.pipeline(transaction=False)
            for p in range(start, min(link.partitions, start + size)):
                pipe.llen(link.keys(p).over)
            total += sum(int(n or 0) for n in pipe.execute())
        return total

    def queued(self, partition: int) -> int:
        """Requests queued in ``partition`` (leased ones not counted)."""
        pipe = self.link.client.pipeline(transaction=False)
        _count_into(pipe, self.link.keys(partition), leased=False)
        return sum(int(n or 0) for n in pipe.execute())

    def leased(self, partition: int) -> int:
        """Requests of ``partition`` leased now."""
        return int(self.link.client.zcard(self.link.keys(partition).leases))


def _count_into(pipe: Any, keys: PartitionKeys, *, leased: bool = True) -> None:
    """Queue on ``pipe`` the reads that add up to a partition's work (``int(x or 0)`` each).

    The level lists are counted by the meta's ``n`` (what the scripts keep
    in step), the leases by their sorted set's size.
    """
    pipe.hget(keys.meta, QUEUED.name)
    if leased:
        pipe.zcard(keys.leases)
