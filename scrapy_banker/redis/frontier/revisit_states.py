"""Revisit states kept with their partition: a fleet's due index (``BANKER_RECRAWL``).

One process keeps each page's :class:`~scrapy_banker.core.recrawl.UrlState`
and due time in memory (and its JOBDIR); a fleet keeps them in the page's
partition -- the partition its requests go to, by its queue key -- so they
outlive any worker and move with the host:

* :attr:`PartitionKeys.revisits <scrapy_banker.redis.keys.PartitionKeys.revisits>`,
  URL -> state JSON, and :attr:`~scrapy_banker.redis.keys.PartitionKeys.revisit_requests`,
  URL -> the spider's request a revisit copies;
* :attr:`~scrapy_banker.redis.keys.PartitionKeys.revisit_due`, URL -> due
  time: the due index, read by score, never scanned.

A state is written after each fetch (``lua/revisit_save.lua``, with the
worker's enqueues: before the ack of the request that fetched it, so a
worker killed in between fetches the page again rather than forget it); a
state older than the one kept changes nothing.  The partition's owner takes
the pages due (``lua/revisit_pop.lua``, fenced like a pop) and queues their
revisits as ordinary requests; each page handed out is due again after the
longer of a hold (the lease TTL) and its interval, so a revisit lost with
its worker comes due again -- a lease by postponement.  A state or a request
that does not read is moved to the partition's dead letters with the reason
(``lua/revisit_dead.lua``).

The operator's commands read the states back (:meth:`RevisitStates.read`,
:meth:`RevisitStates.iter_states`): plain reads, never in a crawl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy_banker.redis.keys import decode
from scrapy_banker.redis.scripts import Refusal, ScriptCall

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from scrapy_banker.core.ops import RevisitWrite
    from scrapy_banker.redis.frontier.link import FrontierLink

__all__ = ["DueRevisit", "RevisitPop", "RevisitStates"]

#: Partitions whose states one round trip of :meth:`RevisitStates.iter_states` reads.
STATES_CHUNK = 64


@dataclass(frozen=True, slots=True)
class DueRevisit:
    """A page due for a revisit, as its partition keeps it (texts, not decoded)."""

    partition: int
    url: str
    #: The page's state as JSON.
    state: str
    #: The spider's request a revisit copies ("" when none was kept).
    payload: str


@dataclass
class RevisitPop:
    """What one :meth:`RevisitStates.pop_many` took."""

    due: list[DueRevisit] = field(default_factory=list)
    #: The earliest due time left in the partitions popped (None: none left).
    next_due: float | None = None
    #: Partitions the node no longer owns at the epoch it asked with.
    fenced: int = 0
    #: Partitions that still hold revisit states after the pop.
    held: set[int] = field(default_factory=set)


class RevisitStates:
    """Writes pages' revisit states and takes the due ones, per partition."""

    def __init__(self, link: FrontierLink) -> None:
        self.link = link

    def call(self, write: RevisitWrite) -> ScriptCall:
        """The ``revisit_save`` script's run for one write (a batch may mix it with others)."""
        k = self.link.keys(write.partition)
        return ScriptCall(
            [k.revisits, k.revisit_requests, k.revisit_due],
            [write.url, write.state, repr(float(write.due)), write.payload],
        )

    def save_many(self, writes: list[RevisitWrite]) -> int:
        """Send the writes now; how many changed a state (older ones change nothing)."""
        answers = self.link.scripts.values("revisit_save", [self.call(w) for w in writes])
        return sum(int(a) for a in answers)

    def pop_many(
        self, node: str, owned: Mapping[int, int], now: float, hold_s: float, count: int
    ) -> RevisitPop:
        """Up to ``count`` due pages of each partition ``node`` owns (partition -> epoch)."""
        order = sorted(owned)
        out = RevisitPop()
        if not order:
            return out
        calls = []
        for p in order:
            k = self.link.keys(p)
            calls.append(ScriptCall(
                [k.owner, k.revisit_due, k.revisits, k.revisit_requests],
                [node, int(owned[p]), repr(float(now)), repr(float(hold_s)), int(count)],
            ))  # fmt: skip
        for p, answer in zip(order, self.link.scripts.run("revisit_pop", calls), strict=True):
            if isinstance(answer, Refusal):
                out.fenced += 1
                continue
            *flat, first = answer
            for i in range(0, len(flat), 3):
                out.due.append(DueRevisit(
                    p, decode(flat[i], lossy=True), decode(flat[i + 1], lossy=True),
                    decode(flat[i + 2], lossy=True),
                ))  # fmt: skip
            text = decode(first)
            if text:
                out.held.add(p)
                left = float(text)
                out.next_due = left if out.next_due is None else min(out.next_due, left)
        return out

    def dead_many(self, letters: list[tuple[int, str, str]]) -> int:
        """Move the states of (partition, URL, reason) that do not read to the partition's
        dead letters (``lua/revisit_dead.lua``); how many were still there."""
        calls = []
        for p, url, reason in letters:
            k = self.link.keys(p)
            calls.append(ScriptCall(
                [k.revisits, k.revisit_requests, k.revisit_due, k.dead], [url, reason, p]
            ))  # fmt: skip
        return sum(int(a) for a in self.link.scripts.values("revisit_dead", calls))

    def read(self, partition: int, url: str) -> tuple[str, float] | None:
        """``url``'s state JSON and due time in ``partition`` (None: not kept)."""
        k = self.link.keys(partition)
        pipe = self.link.client.pipeline(transaction=False)
        pipe.hget(k.revisits, url)
        pipe.zscore(k.revisit_due, url)
        state, due = pipe.execute()
        if state is None:
            return None
        return decode(state, lossy=True), float(due) if due is not None else 0.0

    def iter_states(
        self, partitions: Iterable[int], chunk: int = STATES_CHUNK
    ) -> Iterator[tuple[int, str, str]]:
        """Every page kept in ``partitions``: (partition, URL, state JSON), as it comes.

        One ``HGETALL`` of each partition's states, ``chunk`` partitions per
        pipelined round trip; nothing is held beyond one chunk's answers.  Not
        atomic across partitions (a page may move with its state while read),
        which is fine for an operator's view.
        """
        order = list(partitions)
        size = max(1, chunk)
        for start in range(0, len(order), size):
            part = order[start : start + size]
            pipe = self.link.client.pipeline(transaction=False)
            for p in part:
                pipe.hgetall(self.link.keys(p).revisits)
            for p, kept in zip(part, pipe.execute(), strict=True):
                for url, state in kept.items():
                    yield p, decode(url, lossy=True), decode(state, lossy=True)
