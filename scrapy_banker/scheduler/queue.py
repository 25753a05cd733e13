"""The local queue: topic scheduler + extendible-hash directory + slot lanes, as one part.

Both request stores dispatch through it: the memory store pushes every
accepted request here, the Redis lease store pushes what it leased.  It
holds no Scrapy logic of its own; the downloader view answers "is this slot
free?" and "is the downloader idle?".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from scrapy_banker.core.directory import ExtendibleDirectory
from scrapy_banker.core.frontier import Entry, Frontier
from scrapy_banker.core.topics import TopicScheduler

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.scheduler.classifier import Classified
    from scrapy_banker.settings import BankerConfig

__all__ = ["LocalQueue"]


class LocalQueue:
    """Pending requests of this process, grouped by topic and download slot."""

    def __init__(
        self,
        config: BankerConfig,
        topics: TopicScheduler,
        is_free: Callable[[str], bool],
        downloader_idle: Callable[[], bool],
        interval: Callable[[str], float] | None = None,
        refused: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        self.is_free = is_free
        self.downloader_idle = downloader_idle
        #: The topic scheduler (built beside the control gate, which pauses topics in it).
        self.topics = topics
        #: A slot's politeness interval: spaced hosts are served first (the frontier's doc).
        self.frontier: Frontier[Request] = Frontier(
            self.topics, self.new_directory(), interval=interval, refused=refused
        )

    @property
    def directory(self) -> ExtendibleDirectory[str]:
        return self.frontier.directory

    @directory.setter
    def directory(self, directory: ExtendibleDirectory[str]) -> None:
        self.frontier.directory = directory

    def __len__(self) -> int:
        return len(self.frontier)

    def push(
        self,
        request: Request,
        c: Classified,
        now: float,
        *,
        priority: int | None = None,
        seq: int | None = None,
        count_load: bool = True,
    ) -> int:
        """Queue ``request``; returns its directory bucket."""
        return self.frontier.push(
            request,
            topic=c.topic,
            slot=c.slot,
            key=c.key,
            key_hash=c.key_hash,
            priority=request.priority if priority is None else priority,
            now=now,
            seq=seq,
            count_load=count_load,
        )

    def requeue(self, entry: Entry[Request], now: float) -> None:
        """Put a popped entry back where it was (same priority and FIFO position)."""
        self.frontier.push(
            entry.item,
            topic=entry.topic,
            slot=entry.slot,
            key=entry.key,
            key_hash=entry.key_hash,
            priority=entry.priority,
            now=now,
            seq=entry.seq,
        )

    def pop(self, now: float) -> Entry[Request] | None:
        frontier = self.frontier
        entry = frontier.pop(self.is_free, now)
        # Nothing in flight can free a slot, so a wake-up was missed (e.g. a
        # middleware changed download_slot): re-check every parked lane.
        if entry is None and len(frontier) and self.downloader_idle() and frontier.unblock_all():
            entry = frontier.pop(self.is_free, now)
        return entry

    def pop_slots(self, slots: Iterable[str], now: float) -> Entry[Request] | None:
        """The next request of one of ``slots`` (the pacer's critical hosts), if it is
        the turn-holding topic's; else the next request as :meth:`pop` gives it."""
        served, entry = self.frontier.pop_slots(slots, self.is_free, now)
        return entry if served else self.pop(now)

    def slot_freed(self, slot: str) -> None:
        self.frontier.slot_freed(slot)

    def entries(self) -> Iterator[Entry[Request]]:
        return self.frontier.entries()

    def new_directory(self) -> ExtendibleDirectory[str]:
        config = self.config
        return ExtendibleDirectory(
            capacity=config.bucket_capacity,
            max_depth=config.directory_max_depth,
            cache_capacity=config.cache_bucket_size,
        )

    def rebuild_directory(self) -> None:
        """Recount every bucket's load from what is queued (after a partial restore)."""
        fresh = self.new_directory()
        for entry in self.frontier.entries():
            fresh.add(entry.key, entry.key_hash, 1)
        self.directory = fresh

    def publish_stats(self, stats: StatsCollector) -> None:
        d = self.directory
        stats.set_value("banker/queue/buckets", d.n_buckets)
        stats.set_value("banker/queue/global_depth", d.global_depth)
        stats.set_value("banker/queue/splits", d.splits)
        stats.set_value("banker/queue/merges", d.merges)
        stats.set_value("banker/queue/blocked_skips", self.frontier.blocked_skips)
        stats.set_value("banker/queue/unblock_sweeps", self.frontier.unblock_sweeps)
        for state in self.topics:
            prefix = f"banker/topic/{state.name}"
            stats.set_value(f"{prefix}/max_wait_s", round(state.max_wait_s, 3))
            stats.set_value(f"{prefix}/slice_s", round(state.slice_total, 3))
            stats.set_value(f"{prefix}/preempted", state.preempted)
            stats.set_value(f"{prefix}/starvation_rescues", state.starvation_rescues)
