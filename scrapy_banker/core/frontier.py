"""The in-memory frontier: topic → download-slot lanes, dispatched without head-of-line blocking.

Scrapy's ``ScrapyPriorityQueue`` pops the globally best request even when its
domain's download slot is full, so one big domain fills the downloader while
others wait; ``DownloaderAwarePriorityQueue`` fixes that by scanning every
slot on every pop, which costs O(domains).  Here each (topic, slot) pair is a
*lane*; lanes with work sit in a per-topic ring ordered by the priority of
their head request, and a lane whose slot turns out to be full is parked on
that slot until the downloader reports the slot freed.  A lane is therefore
inspected once per "slot freed" event, which makes a pop O(log) amortized
whatever the number of domains.

Among lanes of equal priority the ring serves first the lane whose slot has
the most requests queued (in power-of-two classes, FIFO within a class):
longest-processing-time-first list scheduling.  With a per-slot concurrency
limit, a crawl cannot end before its largest site has been fetched at that
limit; serving that site whenever its slot has room -- rather than in turn
with hundreds of small sites that have plenty of time -- is what lets a
crawl finish close to that bound.  Small sites lose nothing overall: the
largest sites' lanes leave the ring as soon as their slots are full, and the
rest of the downloader's capacity goes to the others.

Two kinds of slot rank above every backlog class:

* a slot its host spaces (a Crawl-delay, a rate learned from its 429s, a
  throttle's delay: ``interval(slot)`` > 0) ranks by the *time* its
  backlog takes at that interval, in classes above all the others: it is
  free only once per interval, so serving it whenever it is costs the
  others one download slot at a time, and such a host is the long pole
  far more often than its backlog says.  A slot whose host has refused a
  request (``refused(slot)``: a 503, an outage) ranks with them by its
  backlog: it may block again at any time, and drained last, its next
  block is what the crawl waits for at its end; drained early, its blocks
  overlap the other hosts' work;
* a slot served fewer than :data:`EXPLORE_FIRST` times ranks next: what
  its host holds is not known until its first pages are fetched (a site's
  links are found on its root and index pages), so every host gets its
  first few requests before any host is drained.  Ranked by the few URLs
  known for it, a young host would wait behind the known large sites
  until they were done -- and start last if it turns out to be the long
  pole.

Which topic is served is decided by :class:`~scrapy_banker.core.topics.TopicScheduler`;
which *bucket* (persisted queue) a queue key belongs to by
:class:`~scrapy_banker.core.directory.ExtendibleDirectory`.  Items are opaque: this
module never imports Scrapy.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from scrapy_banker.core.directory import ExtendibleDirectory
from scrapy_banker.core.topics import TopicScheduler

__all__ = ["EXPLORE_FIRST", "NOMINAL_REQUEST_S", "Entry", "Frontier"]

T = TypeVar("T")

_IDLE, _READY, _BLOCKED = 0, 1, 2

#: Requests a slot is served before its backlog ranks it (see the module's doc).
EXPLORE_FIRST = 8

#: The rank of a slot served fewer times: above the backlog class of any count.
_UNEXPLORED = 64

#: Ranks of spaced slots start here: their backlog's time class is added.
_SPACED = 65

#: What one request of a slot without an interval is taken to cost, seconds:
#: the unit a spaced slot's interval is counted in.
NOMINAL_REQUEST_S = 0.1


class Entry(Generic[T]):
    """A queued item with what the frontier needs to re-queue it after a restart."""

    __slots__ = ("item", "key", "key_hash", "priority", "seq", "slot", "topic")

    def __init__(
        self, item: T, topic: str, slot: str, key: str, key_hash: int, priority: int, seq: int
    ) -> None:
        self.item = item
        self.topic = topic
        self.slot = slot
        self.key = key
        self.key_hash = key_hash
        self.priority = priority
        self.seq = seq

    def __repr__(self) -> str:
        return f"Entry({self.item!r}, topic={self.topic!r}, slot={self.slot!r}, seq={self.seq})"


def _seq_of(queued: tuple[int, int, object, str, int]) -> int:
    return queued[1]


class _Lane(Generic[T]):
    __slots__ = ("heap", "rank", "slot", "state", "ticket", "topic")

    def __init__(self, topic: str, slot: str) -> None:
        self.topic = topic
        self.slot = slot
        self.state = _IDLE
        # (-priority, seq, item, key, key_hash): highest priority first, FIFO
        # among equals.  One tuple per queued item and no Entry: every object
        # queued is scanned by each full garbage collection while it waits, so
        # the Entry is made when the item leaves (:meth:`Frontier._take`).
        self.heap: list[tuple[int, int, T, str, int]] = []
        #: The slot's backlog class and the ring ticket of the lane's live ring entry.
        self.rank = 0
        self.ticket = -1

    def head_priority(self) -> int:
        return -self.heap[0][0]


class _Ring(Generic[T]):
    """Lanes of one topic that may dispatch.

    Highest head priority first, then the largest backlog class, then FIFO.
    A lane re-ranked while waiting gets a new entry; the old one is skipped
    when it surfaces (its ticket no longer matches), which keeps every
    operation a heap push or pop.
    """

    __slots__ = ("heap", "tickets")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, int, _Lane[T]]] = []
        self.tickets = itertools.count()

    def add(self, lane: _Lane[T], priority: int, rank: int) -> None:
        lane.rank = rank
        ticket = lane.ticket = next(self.tickets)
        heapq.heappush(self.heap, (-priority, -rank, ticket, lane))

    def pop(self) -> _Lane[T] | None:
        heap = self.heap
        while heap:
            _, _, ticket, lane = heapq.heappop(heap)
            if lane.ticket == ticket:
                lane.ticket = -1
                return lane
        return None

    def __bool__(self) -> bool:
        return bool(self.heap)


class Frontier(Generic[T]):
    """Pending items grouped by topic and download slot.

    ``is_free(slot)`` is asked at pop time (it is the downloader's view);
    ``slot_freed(slot)`` must be called whenever a download on that slot ends,
    so lanes parked on it become eligible again.
    """

    def __init__(
        self,
        topics: TopicScheduler,
        directory: ExtendibleDirectory[str],
        interval: Callable[[str], float] | None = None,
        refused: Callable[[str], bool] | None = None,
    ) -> None:
        self.topics = topics
        self.directory = directory
        #: The least seconds between two requests of a slot (0: none), if known.
        self.interval = interval
        #: Has the slot's host ever refused a request (it may block again)?
        self.refused = refused
        self._lanes: dict[tuple[str, str], _Lane[T]] = {}
        self._rings: dict[str, _Ring[T]] = {}
        self._blocked: dict[str, list[_Lane[T]]] = {}
        #: Items queued per slot, all topics: the slot's backlog.
        self._pending: dict[str, int] = {}
        #: Slot -> times served, counted up to EXPLORE_FIRST (then ranked by its backlog).
        self._served: dict[str, int] = {}
        self._seq = itertools.count()
        self._len = 0
        self.blocked_skips = 0  # lanes found full at pop time and parked
        self.unblock_sweeps = 0

    def __len__(self) -> int:
        return self._len

    def push(
        self,
        item: T,
        *,
        topic: str,
        slot: str,
        key: str,
        key_hash: int,
        priority: int,
        now: float,
        seq: int | None = None,
        count_load: bool = True,
    ) -> int:
        """Queue ``item``; returns the directory bucket of its queue key.

        ``count_load=False`` is for re-queuing entries whose load a restored
        directory already accounts for.
        """
        bucket = (
            self.directory.add(key, key_hash, 1) if count_load else self.directory.bucket_of(key)
        )
        if seq is None:
            seq = next(self._seq)
        lane = self._lanes.get((topic, slot))
        if lane is None:
            lane = self._lanes[(topic, slot)] = _Lane(topic, slot)
        heapq.heappush(lane.heap, (-priority, seq, item, key, key_hash))
        pending = self._pending[slot] = self._pending.get(slot, 0) + 1
        rank = self._rank(slot, pending)
        if lane.state == _IDLE:
            lane.state = _READY
            ring = self._rings.get(topic)
            if ring is None:
                ring = self._rings[topic] = _Ring()
            ring.add(lane, priority, rank)
        elif lane.state == _READY and rank > lane.rank:
            # Its slot's backlog doubled while it waited: move it up.
            self._rings[topic].add(lane, lane.head_priority(), rank)
        # Otherwise a READY lane keeps its place even if this item has a higher
        # priority than its head (re-sorting would cost a search); the item
        # still comes first *within* the lane.
        self.topics.pushed(topic, now)
        self._len += 1
        return bucket

    def pop(self, is_free: Callable[[str], bool], now: float) -> Entry[T] | None:
        """The next entry to download, or ``None`` if nothing can go right now."""
        for topic in self.topics.candidates(now):
            ring = self._rings.get(topic)
            while ring:
                lane = ring.pop()
                if lane is None:
                    break
                if not is_free(lane.slot):
                    lane.state = _BLOCKED
                    self._blocked.setdefault(lane.slot, []).append(lane)
                    self.blocked_skips += 1
                    continue
                return self._take(lane, ring, now)
            self.topics.idle(topic, now)
        return None

    def pop_slots(
        self, slots: Iterable[str], is_free: Callable[[str], bool], now: float
    ) -> tuple[bool, Entry[T] | None]:
        """Serve only ``slots`` (the pacer's critical hosts), without overriding topics.

        Returns ``(False, None)`` when the topic whose turn it is (the first
        of the topic scheduler's order) has no request on these slots: the
        caller then pops as usual, so pacing never takes a turn from a
        topic.  Otherwise ``(True, entry)``: that topic's best head on a
        slot with room (priority, then FIFO), or ``None`` if those slots are
        full.  Costs O(slots).
        """
        topic = next(iter(self.topics.candidates(now)), None)
        if topic is None:
            return False, None
        lanes = self._lanes
        mine = [lane for s in slots if (lane := lanes.get((topic, s))) is not None]
        if not mine:
            return False, None
        best: _Lane[T] | None = None
        for lane in mine:
            if is_free(lane.slot) and (best is None or lane.heap[0] < best.heap[0]):
                best = lane
        if best is None:
            return True, None
        if best.state == _BLOCKED:
            self._blocked[best.slot].remove(best)
            if not self._blocked[best.slot]:
                del self._blocked[best.slot]
        best.state = _READY
        best.ticket = -1  # its ring entry, if any, is skipped when it surfaces
        return True, self._take(best, self._rings[best.topic], now)

    def _take(self, lane: _Lane[T], ring: _Ring[T], now: float) -> Entry[T]:
        """Pop ``lane``'s head (the lane is off the ring) and put the lane back if not empty."""
        negative_priority, seq, item, key, key_hash = heapq.heappop(lane.heap)
        slot = lane.slot
        entry = Entry(item, lane.topic, slot, key, key_hash, -negative_priority, seq)
        served = self._served.get(slot, 0)
        if served < EXPLORE_FIRST:
            self._served[slot] = served + 1
        left = self._pending[slot] - 1
        if left:
            self._pending[slot] = left
        else:
            del self._pending[slot]
        if lane.heap:
            ring.add(lane, lane.head_priority(), self._rank(slot, left))
        else:
            lane.state = _IDLE
            del self._lanes[(lane.topic, lane.slot)]
        self.directory.remove_load(entry.key, 1)
        self.topics.dispatched(lane.topic, now)
        self._len -= 1
        return entry

    def _rank(self, slot: str, pending: int) -> int:
        """A lane's place among equal priorities (see the module's doc)."""
        if self.interval is not None:
            spacing = self.interval(slot)
            if spacing > 0:
                return _SPACED + math.ceil(pending * spacing / NOMINAL_REQUEST_S).bit_length()
        if self.refused is not None and self.refused(slot):
            return _SPACED + pending.bit_length()
        if self._served.get(slot, 0) < EXPLORE_FIRST:
            return _UNEXPLORED
        return pending.bit_length()

    def slot_freed(self, slot: str) -> None:
        lanes = self._blocked.pop(slot, None)
        if not lanes:
            return
        rank = self._rank(slot, self._pending.get(slot, 0))
        for lane in lanes:
            lane.state = _READY
            self._rings[lane.topic].add(lane, lane.head_priority(), rank)

    def unblock_all(self) -> int:
        """Make every parked lane eligible again; a safety net, O(parked lanes).

        Used when the downloader is idle but lanes are parked -- a slot-freed
        notification was missed (e.g. a slot key changed by a middleware).
        """
        slots = list(self._blocked)
        for slot in slots:
            self.slot_freed(slot)
        self.unblock_sweeps += 1
        return len(slots)

    def slot_backlog(self, slot: str) -> int:
        """Items queued for ``slot``, all topics (what telemetry shows per host)."""
        return self._pending.get(slot, 0)

    @property
    def backlogs(self) -> Mapping[str, int]:
        """Items queued per slot (slots with none are absent); a read-only view."""
        return MappingProxyType(self._pending)

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    def entries(self) -> Iterator[Entry[T]]:
        """Every queued entry, lanes in no particular order, FIFO order within a lane."""
        for lane in self._lanes.values():
            for negative_priority, seq, item, key, key_hash in sorted(lane.heap, key=_seq_of):
                yield Entry(item, lane.topic, lane.slot, key, key_hash, -negative_priority, seq)
