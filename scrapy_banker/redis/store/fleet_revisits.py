"""A fleet worker's side of the revisits: states to Redis, due pages back as requests.

:class:`~scrapy_banker.middlewares.RecrawlMiddleware` keeps a page's state
and due time itself in one process; on a fleet it hands them to this
:class:`FleetRevisits` (the store's ``features.revisits``), which queues
each state for the worker thread to write into the page's partition
(:mod:`scrapy_banker.redis.frontier.revisit_states`) -- the partition its
requests go to, by the scheduler's classifier -- and turns the due pages
the worker thread took from the partitions this node owns back into the
spider's requests.  The request a revisit copies is kept encoded as an
enqueue's payload (JSON, allow-listed, never pickled) and decoded as a
leased one is; one that does not read is logged, counted in
``banker/recrawl/malformed`` and moved to the partition's dead letters.
A revisit whose lease was reaped from a dead worker is dropped when it is
delivered again (:meth:`FleetRevisits.redelivered`): that worker may have
fetched it and written the page's new state, which the new holder cannot
see without a Redis read, and if it did not, the page's due time in Redis
sends the revisit again after its hold.
Nothing here waits for Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import Request

from scrapy_banker.core.meta import META_LEASE
from scrapy_banker.core.ops import LeaseToken, RevisitWrite
from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.scheduler.classifier import UnparsableURL
from scrapy_banker.scheduler.serialize import MalformedPayload, UnserializableRequest

if TYPE_CHECKING:
    from scrapy import Spider

    from scrapy_banker.redis.worker import FrontierWorker
    from scrapy_banker.scheduler.seams import SchedulerParts

logger = logging.getLogger(__name__)

__all__ = ["FleetRevisits"]


class FleetRevisits:
    """The pages' revisit states, kept in their partitions in Redis."""

    def __init__(self, parts: SchedulerParts, worker: FrontierWorker, *, partitions: int) -> None:
        self.parts = parts
        self.worker = worker
        self.partitions = partitions
        self._unsaved_logged = False
        #: Set when the store closes: a page taken but not queued by then comes due
        #: again after its hold, rather than be queued into a stopped worker (a spill).
        self.closed = False

    def start(self) -> None:
        self.worker.enable_revisits()

    def close(self) -> None:
        self.closed = True

    def save(
        self, url: str, state: UrlState, request: Request | None, spider: Spider | None
    ) -> None:
        try:
            partition = self._partition(request if request is not None else Request(url))
        except (UnparsableURL, ValueError) as exc:
            self._unsaved(url, f"its URL does not parse ({exc})")
            return
        payload = ""
        if request is not None:
            try:
                payload = self.parts.codec.encode_compact(request, spider)
            except UnserializableRequest as exc:
                self._unsaved(url, str(exc))
                return
        self.worker.save_revisit(RevisitWrite(partition, url, state.to_text(), state.due, payload))

    def take_due(self, spider: Spider) -> list[tuple[str, UrlState, Request]]:
        out: list[tuple[str, UrlState, Request]] = []
        if self.closed:
            return out
        due = self.worker.revisits_due
        codec, stats = self.parts.codec, self.parts.stats
        while due:
            page = due.popleft()
            try:
                state = UrlState.from_text(page.state)
                if not page.payload:
                    raise MalformedPayload("no request was kept for it")
                request = codec.decode(page.payload, spider)
            except (ValueError, MalformedPayload) as exc:
                # Garbage, a planted pickle, a class not allowed, a callback that
                # is no method of the spider: never run, kept with the reason.
                logger.error("Dead-lettering the malformed revisit state of %s (partition %d): "
                             "%s", page.url, page.partition, exc)  # fmt: skip
                stats.inc_value("banker/recrawl/malformed")
                self.worker.dead_revisit(page.partition, page.url, f"malformed: {exc}")
                continue
            out.append((page.url, state, request))
        return out

    def next_due(self) -> float | None:
        return self.worker.revisit_next_due

    def redelivered(self, request: Request) -> bool:
        # A lease reaped from a dead (or stalled) holder comes back with a higher
        # delivery; a nack (a clean stop, a partition that moved) takes its own back.
        token = request.meta.get(META_LEASE)
        return isinstance(token, LeaseToken) and token.delivery > 1

    def _partition(self, request: Request) -> int:
        """The partition ``request``'s queue goes to: where its page's state is kept."""
        return self.parts.classifier.classify(request).key_hash % self.partitions

    def _unsaved(self, url: str, why: str) -> None:
        """A page whose revisits cannot be kept in Redis: not revisited, said once, counted."""
        if not self._unsaved_logged:
            self._unsaved_logged = True
            logger.error(
                "Unable to keep the revisits of %s in Redis: %s - it is not revisited; "
                "no more such pages will be logged (stats being collected)", url, why,
            )  # fmt: skip
        self.parts.stats.inc_value("banker/recrawl/unsaved")
