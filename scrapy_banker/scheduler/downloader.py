"""The scheduler's view of Scrapy's downloader: slot keys, room per slot, idleness.

Modelled on Scrapy's own ``DownloaderInterface`` (``scrapy/pqueues.py``),
which hides the downloader from ``DownloaderAwarePriorityQueue``: one place
knows how Scrapy names a slot and how full it is, so the scheduler and the
stores never probe the downloader's attributes themselves.

It counts what occupies each slot itself instead of trusting Scrapy's
``slot.active``, which is wrong in both directions at the moments that
matter: a request enters it only once it has passed the downloader
middlewares, a loop tick after ``next_request`` (under the asyncio reactor a
burst of ``next_request`` calls would see every slot empty and put far more
than ``CONCURRENT_REQUESTS_PER_DOMAIN`` requests on one host), and it leaves
it only after the response went back through the middlewares, *after*
``request_left_downloader`` -- a lane re-checked on that signal would find
the slot still full and stay parked with nothing left to wake it.  So a slot
holds the requests this scheduler handed out until they end; ``slot.active``
is only read to find *foreign* requests in it (``engine.download`` from an
extension, a placement probe): those without a ``banker_slot`` meta key.  A
request that ended keeps the key, set to ``None``, so it no longer counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.core.downloader import Downloader

from scrapy_banker.core.hashing import host_of
from scrapy_banker.core.meta import META_SLOT

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = ["DownloaderView"]


class DownloaderView:
    """Slot keys and free room, as the running downloader sees them."""

    def __init__(self, default_concurrency: int = 8) -> None:
        self.default_concurrency = max(1, default_concurrency)
        self.downloader: Any = None
        # True when the slot key is Scrapy's rule (meta download_slot, else the
        # host name), which we compute without urlparse_cached.
        self.scrapy_slots = False
        self._total = 0
        #: Requests handed to the engine and not ended yet, per slot.
        self.inflight: dict[str, int] = {}
        #: Slots that may keep one request waiting in their queue even when the
        #: downloader has no spare capacity (the pacer's critical hosts).
        self.priority_slots: frozenset[str] = frozenset()

    def attach(self, crawler: Crawler) -> None:
        """Find the engine's downloader (none in unit tests and tools: nothing to protect)."""
        try:
            engine = crawler.engine
        except RuntimeError:  # Scrapy >= 2.14 raises when there is no engine yet
            engine = None
        dl = self.downloader = getattr(engine, "downloader", None)
        self._total = int(getattr(dl, "total_concurrency", 0) or 0)
        self.scrapy_slots = dl is not None and (
            getattr(type(dl), "get_slot_key", None) is Downloader.get_slot_key
            and not getattr(dl, "ip_concurrency", 0)
        )

    # -- slot keys -------------------------------------------------------------------

    def slot_key(self, request: Request) -> str:
        """The downloader's slot for ``request`` (its politeness unit).

        Like Scrapy's ``Downloader.get_slot_key``, a URL without a host name
        (``data:``, ``file:``) gets the empty slot rather than an error.
        """
        if self.scrapy_slots or self.downloader is None:
            slot = request.meta.get("download_slot")
            return host_of(request.url) if slot is None else str(slot)
        return str(self.downloader.get_slot_key(request))

    def slot_is_host(self, request: Request) -> bool:
        """Whether :meth:`slot_key` is the request's host name (so it can double as the key)."""
        return "download_slot" not in request.meta and (
            self.scrapy_slots or self.downloader is None
        )

    # -- room ------------------------------------------------------------------------

    def is_free(self, slot_key: str) -> bool:
        dl = self.downloader
        if dl is None:
            return True
        used = self.inflight.get(slot_key, 0)
        slot = dl.slots.get(slot_key)
        if slot is None:
            return used < self._slot_concurrency(slot_key)
        active = slot.active
        if len(active) > used:  # perhaps requests this scheduler did not hand out
            used += sum(1 for r in active if META_SLOT not in r.meta)
        concurrency = int(slot.concurrency)
        if used < concurrency:
            return True
        # One request more may wait in the slot's own queue while every
        # transfer of the slot is verifiably under way: Scrapy's downloader
        # starts it the moment a transfer ends, without a round trip through
        # the engine (a few ms per request of the busiest host, which decides
        # when a crawl ends).  Only with spare downloader capacity -- otherwise
        # the waiting request would hold a place another host could use --
        # or for a critical host of the pacer, whose place that is.  Never
        # more than one: under the asyncio reactor Scrapy's _process_queue
        # starts each queued request as a task, so the slot's free transfer
        # count does not drop until the tasks run and one pass starts every
        # request queued (a queue as deep as the concurrency put 7 requests
        # at once on a host limited to 4 on the real-sites farm).
        return (
            used == concurrency
            and (2 * len(dl.active) < self._total or slot_key in self.priority_slots)
            and len(slot.transferring) >= concurrency
            and not slot.queue
        )

    @property
    def total_concurrency(self) -> int:
        """Requests the downloader transfers at once (``CONCURRENT_REQUESTS``; 0 without one)."""
        return self._total

    def concurrency(self, slot_key: str) -> int:
        """Requests the slot may transfer at once (its own, or what it will get)."""
        dl = self.downloader
        slot = None if dl is None else dl.slots.get(slot_key)
        if slot is None:
            return (
                self._slot_concurrency(slot_key) if dl is not None else (self.default_concurrency)
            )
        return int(slot.concurrency)

    def _slot_concurrency(self, slot_key: str) -> int:
        """Concurrency the downloader will give a slot it has not created yet."""
        dl = self.downloader
        per_slot = getattr(dl, "per_slot_settings", {}).get(slot_key, {})
        default = getattr(dl, "ip_concurrency", 0) or getattr(
            dl, "domain_concurrency", self.default_concurrency
        )
        return max(1, int(per_slot.get("concurrency", default)))

    def slot_load(self, slot_key: str) -> tuple[int, int]:
        """``(transferring, concurrency)`` of a slot, for telemetry.

        Transfers under way, not :attr:`inflight`: a request handed out may
        still pass the middlewares or wait in the slot's own queue (see
        :meth:`is_free`), so only transfers are bounded by the slot's limit.
        """
        dl = self.downloader
        if dl is None:
            return min(self.inflight.get(slot_key, 0), self.default_concurrency), (
                self.default_concurrency
            )
        slot = dl.slots.get(slot_key)
        if slot is None:
            return 0, self._slot_concurrency(slot_key)
        return len(slot.transferring), int(slot.concurrency)

    def slot_delay(self, slot_key: str) -> float | None:
        """The slot's current download delay (AutoThrottle's), None without such a slot."""
        dl = self.downloader
        slot = None if dl is None else dl.slots.get(slot_key)
        delay = getattr(slot, "delay", None)
        return None if delay is None else float(delay)

    def take_queued(self, slot_key: str) -> list[tuple[Request, Any]]:
        """Take this scheduler's requests out of the slot's own queue (not yet sent).

        Returns ``(request, deferred)`` pairs, as Scrapy's downloader queued
        them; the caller fails each deferred so the request goes back
        through the middlewares' ``process_exception``.  Foreign requests
        (``engine.download``) stay.
        """
        dl = self.downloader
        slot = None if dl is None else dl.slots.get(slot_key)
        queue = getattr(slot, "queue", None)
        if not queue:
            return []
        mine: list[tuple[Request, Any]] = []
        others: list[tuple[Request, Any]] = []
        for item in queue:
            (mine if META_SLOT in item[0].meta else others).append(item)
        if mine:
            queue.clear()
            queue.extend(others)
        return mine

    def dispatched(self, request: Request, slot: str) -> None:
        request.meta[META_SLOT] = slot
        self.inflight[slot] = self.inflight.get(slot, 0) + 1

    def ended(self, request: Request) -> str | None:
        """A request ended (any path): the slot that has room again; idempotent.

        The meta key stays, set to ``None``: Scrapy keeps the request in
        ``slot.active`` a while longer, and it must not count as foreign there.
        """
        meta = request.meta
        slot: str | None = meta.get(META_SLOT)
        meta[META_SLOT] = None
        if slot is None:
            return None
        left = self.inflight.get(slot, 0) - 1
        if left > 0:
            self.inflight[slot] = left
        else:
            self.inflight.pop(slot, None)
        return slot

    # -- the downloader as a whole ---------------------------------------------------

    @property
    def active(self) -> int:
        """Requests in the downloader now (0 without one)."""
        return len(getattr(self.downloader, "active", ()) or ())

    def idle(self) -> bool:
        """Nothing in the downloader; forgets what we still counted as in flight."""
        if self.downloader is None:
            return True
        active = getattr(self.downloader, "active", None)
        if active is None or active:
            return False
        # Whatever we still count as in flight ended on a path we did not see
        # (e.g. the engine dropped it).
        self.inflight.clear()
        return True
