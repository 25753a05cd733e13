"""The queue operations of a fleet worker, as plain values: enqueues, lease tokens, revisits.

The scheduler hands them to the worker thread (:mod:`scrapy_banker.redis.worker`),
which sends them to Redis; what Redis never confirmed is written to a spill
file (:mod:`scrapy_banker.core.spill`) and replayed later, as the same
values.  One set of types for all three, so nothing is converted on the way.

Pure: no Scrapy, Twisted or Redis import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EnqueueOp", "LeaseToken", "RevisitWrite"]


@dataclass(frozen=True, slots=True)
class EnqueueOp:
    """A request to queue, handed from the reactor thread to the worker thread."""

    partition: int
    fingerprint: str
    payload: str
    priority: int = 0
    #: Queue it even if its fingerprint was seen (Scrapy's ``dont_filter``).
    dont_filter: bool = False


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """One delivery of a leased request: what acks, nacks and dead-letters it.

    The delivery number makes the ack (or nack) of a slow holder whose lease
    expired -- and went back to the queue, maybe to another node -- a no-op
    instead of cancelling the new holder's delivery.
    """

    partition: int
    id: str
    delivery: int
    #: When the pop that leased it was sent (the holder's monotonic clock):
    #: the lease is known to run at least until then plus the TTL.  Not part
    #: of the token's identity.
    leased_at: float = field(default=0.0, compare=False)
    #: The partition's epoch the holder leased it under (0: unknown).  A
    #: holder that owns the partition again under a newer epoch -- it was
    #: stopped, declared dead and joined again -- no longer holds it.
    epoch: int = field(default=0, compare=False)

    @property
    def ref(self) -> str:
        """``id#delivery``, as the ack and nack scripts take it."""
        return f"{self.id}#{self.delivery}"


@dataclass(frozen=True, slots=True)
class RevisitWrite:
    """A page's revisit state, kept in its partition (``BANKER_RECRAWL`` on a fleet).

    ``state`` is the :class:`~scrapy_banker.core.recrawl.UrlState` as JSON
    text and ``due`` its due time (POSIX seconds); ``payload`` is the
    spider's request a revisit copies, encoded as an enqueue's payload, or
    ``""`` to keep the one Redis holds (a revisit's own fetch writes none).
    """

    partition: int
    url: str
    state: str
    due: float
    payload: str = ""

    def merged(self, older: RevisitWrite) -> RevisitWrite:
        """This write, keeping ``older``'s payload when it has none of its own."""
        if self.payload or not older.payload:
            return self
        return RevisitWrite(self.partition, self.url, self.state, self.due, older.payload)
