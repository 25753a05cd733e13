"""Topic scheduling of PQ-MCSA: priority preemption, round-robin time slices, yield adjuster.

The paper (§1.3) runs each crawl topic as a task with a queue control block:
ST (slice total) and SR (slice remaining).  Topics of higher priority preempt
lower ones; topics of equal priority take turns, each holding the turn for its
time slice; a background daemon counts each topic's yield per period and
shrinks the slice of a topic that met its target, so the others get more
turns.  This module is that control logic and nothing else: the frontier asks
it which topic to serve next and reports what it dispatched.  No Scrapy, no
I/O; time is passed in, so tests drive it with a fake clock.

Two additions the paper leaves implicit and a production crawler needs:

* work conservation -- a topic whose turn it is but which has nothing
  dispatchable right now (all its hosts are busy) does not idle the crawler:
  the next topic is tried for that one call, without losing the turn;
* a starvation bound -- strict preemption lets a busy high-priority topic
  starve the rest forever, so a topic that has waited ``max_wait_s`` while
  having pending work is served before anyone else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TopicScheduler", "TopicSpec", "TopicState"]


@dataclass(frozen=True)
class TopicSpec:
    """Configuration of one topic (one ``BANKER_TOPICS`` entry)."""

    name: str
    priority: int = 0
    slice_s: float = 1.0
    #: Responses + items per adjuster period that count as "met its target";
    #: ``None`` keeps the slice fixed.
    target: int | None = None
    #: Pages the topic may be fetched in all (None: no budget); see
    #: :mod:`scrapy_banker.core.directives`.
    budget: int | None = None

    def __post_init__(self) -> None:
        if not self.slice_s > 0:
            raise ValueError(
                f"Topic {self.name!r}: slice must be > 0 seconds, got {self.slice_s!r}"
            )
        if self.target is not None and self.target < 0:
            raise ValueError(
                f"Topic {self.name!r}: target must be >= 0 or None, got {self.target!r}"
            )


@dataclass
class TopicState:
    """The paper's queue control block (QUEUE_MCB) for one topic."""

    spec: TopicSpec
    slice_total: float  # ST: current slice length, moved by the adjuster
    slice_remain: float = 0.0  # SR: what is left of the current turn
    pending: int = 0  # requests queued for the topic
    waiting_since: float | None = None  # when it last got work or a dispatch
    dispatched: int = 0
    preempted: int = 0
    max_wait_s: float = 0.0
    starvation_rescues: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name


class TopicScheduler:
    """Decides the order in which topics are offered the next dispatch."""

    def __init__(
        self,
        specs: Iterable[TopicSpec] = (),
        *,
        default_slice_s: float = 1.0,
        min_slice_s: float = 0.1,
        slice_step_s: float = 0.1,
        max_wait_s: float = 30.0,
    ) -> None:
        for name, value in (
            ("default_slice_s", default_slice_s),
            ("min_slice_s", min_slice_s),
            ("slice_step_s", slice_step_s),
            ("max_wait_s", max_wait_s),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.default_slice_s = default_slice_s
        self.min_slice_s = min_slice_s
        self.slice_step_s = slice_step_s
        self.max_wait_s = max_wait_s
        #: Topics an operator paused: never offered, their requests stay queued.
        self.paused: frozenset[str] = frozenset()
        self._topics: dict[str, TopicState] = {}
        # priority -> topic names in round-robin order; the head holds the turn.
        self._classes: dict[int, list[str]] = {}
        self._priorities: list[int] = []  # descending
        self._turn_started: dict[int, float | None] = {}
        self._last_class: int | None = None
        for spec in specs:
            self.add(spec)

    # -- configuration -------------------------------------------------------

    def add(self, spec: TopicSpec) -> TopicState:
        if spec.name in self._topics:
            raise ValueError(f"Topic {spec.name!r} is already defined")
        state = TopicState(spec=spec, slice_total=spec.slice_s, slice_remain=spec.slice_s)
        self._topics[spec.name] = state
        if spec.priority not in self._classes:
            self._classes[spec.priority] = []
            self._turn_started[spec.priority] = None
            self._priorities = sorted(self._classes, reverse=True)
        self._classes[spec.priority].append(spec.name)
        return state

    def ensure(self, name: str) -> TopicState:
        """State of ``name``, creating an unconfigured topic (priority 0) on first use."""
        state = self._topics.get(name)
        if state is None:
            state = self.add(TopicSpec(name=name, slice_s=self.default_slice_s))
        return state

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __iter__(self) -> Iterator[TopicState]:
        return iter(self._topics.values())

    def __getitem__(self, name: str) -> TopicState:
        return self._topics[name]

    # -- bookkeeping from the frontier -----------------------------------------

    def pushed(self, name: str, now: float, n: int = 1) -> None:
        state = self.ensure(name)
        if state.pending == 0:
            state.waiting_since = now
        state.pending += n

    def removed(self, name: str, n: int = 1) -> None:
        """Requests left the topic without a dispatch (e.g. dropped on load)."""
        state = self._topics[name]
        state.pending = max(0, state.pending - n)
        if state.pending == 0:
            state.waiting_since = None

    def dispatched(self, name: str, now: float) -> None:
        state = self._topics[name]
        if state.waiting_since is not None:
            waited = now - state.waiting_since
            state.max_wait_s = max(state.max_wait_s, waited)
            if waited >= self.max_wait_s:
                state.starvation_rescues += 1
        state.pending = max(0, state.pending - 1)
        state.dispatched += 1
        state.waiting_since = now if state.pending else None
        priority = state.spec.priority
        if self._last_class is not None and priority > self._last_class:
            holder = self._holder(self._last_class)
            if holder is not None and self._topics[holder].pending:
                self._topics[holder].preempted += 1
        self._last_class = priority

    def idle(self, name: str, now: float) -> None:
        """The topic was offered the dispatch but had nothing dispatchable.

        Its wait clock restarts: waiting for busy hosts is the downloader's
        politeness, not starvation by the scheduler.
        """
        state = self._topics[name]
        if state.pending:
            state.waiting_since = now

    # -- the decision ------------------------------------------------------------

    def candidates(self, now: float) -> Iterator[str]:
        """Topics with pending work, in the order they should be offered the dispatch.

        The frontier takes the first one that can actually dispatch; the
        generator is lazy so the usual case (the first candidate dispatches)
        costs O(1) beyond the number of priority classes.
        """
        if self.paused:
            yield from (name for name in self._candidates(now) if name not in self.paused)
            return
        yield from self._candidates(now)

    def _candidates(self, now: float) -> Iterator[str]:
        deadline = now - self.max_wait_s
        starving = [
            state
            for state in self._topics.values()
            if state.pending and state.waiting_since is not None and state.waiting_since <= deadline
        ]
        if not starving:  # the usual case: no bookkeeping of what was offered
            for priority in self._priorities:
                yield from self._class_order(priority, now)
            return
        # 1. starvation rescue: whoever waited too long goes first, longest wait
        #    first.  With k topics starving at once the last of them is served
        #    k-1 dispatches after the bound: the guarantee is max_wait_s plus one
        #    dispatch per other starving topic.
        starving.sort(key=lambda state: state.waiting_since or 0.0)
        offered: set[str] = set()
        for state in starving:
            offered.add(state.name)
            yield state.name
        # 2. strict priority between classes, round-robin slices inside one.
        for priority in self._priorities:
            for name in self._class_order(priority, now):
                if name not in offered:
                    offered.add(name)
                    yield name

    def _holder(self, priority: int) -> str | None:
        names = self._classes[priority]
        return names[0] if names else None

    def _class_order(self, priority: int, now: float) -> list[str]:
        """Topics of one class with pending work, the turn holder first.

        The head of the class list holds the turn.  Its slice is consumed by
        wall time since the turn started; when it is used up (or the holder has
        no pending work) the turn passes to the next topic with work, whose SR
        is reset to its ST.
        """
        names = self._classes[priority]
        if not names:
            return []
        started = self._turn_started[priority]
        head = self._topics[names[0]]
        if started is None:
            started = self._turn_started[priority] = now
        head.slice_remain = max(0.0, head.slice_total - (now - started))
        if head.pending == 0 or head.slice_remain <= 0.0:
            for _ in range(len(names)):
                names.append(names.pop(0))
                if self._topics[names[0]].pending:
                    break
            head = self._topics[names[0]]
            head.slice_remain = head.slice_total
            self._turn_started[priority] = now
        return [n for n in names if self._topics[n].pending]

    # -- the background adjuster ------------------------------------------------------

    def adjust(self, yields: Mapping[str, int]) -> dict[str, float]:
        """Apply one adjuster period: ``yields`` is topic -> responses+items in the period.

        A topic that met its target gives up ``slice_step_s`` (down to
        ``min_slice_s``) so the others get more turns; one that fell behind
        gets it back, up to its configured slice.  Returns the new slices.
        """
        for state in self._topics.values():
            target = state.spec.target
            if target is None:
                continue
            got = yields.get(state.name, 0)
            if got >= target:
                state.slice_total = max(self.min_slice_s, state.slice_total - self.slice_step_s)
            else:
                state.slice_total = min(state.spec.slice_s, state.slice_total + self.slice_step_s)
            state.slice_remain = min(state.slice_remain, state.slice_total)
        return {s.name: s.slice_total for s in self._topics.values()}

    # -- persistence -------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "topics": {
                s.name: {
                    "slice_total": s.slice_total,
                    "dispatched": s.dispatched,
                    "max_wait_s": s.max_wait_s,
                }
                for s in self._topics.values()
            },
            "order": {str(p): list(names) for p, names in self._classes.items()},
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Restore slices and round-robin order saved by :meth:`to_state`.

        Topic definitions come from the settings of the new run; saved values
        of topics no longer configured still restore (as unconfigured topics),
        so a resumed job never loses a topic's requests.
        """
        topics = state.get("topics")
        order = state.get("order")
        if not isinstance(topics, Mapping) or not isinstance(order, Mapping):
            raise ValueError("Malformed topic state: expected 'topics' and 'order' mappings")
        for name, saved in topics.items():
            topic = self.ensure(str(name))
            slice_total = float(saved["slice_total"])
            topic.slice_total = min(max(slice_total, self.min_slice_s), topic.spec.slice_s)
            topic.dispatched = int(saved.get("dispatched", 0))
            topic.max_wait_s = float(saved.get("max_wait_s", 0.0))
        for priority, names in self._classes.items():
            saved_order = [n for n in order.get(str(priority), []) if n in names]
            names[:] = saved_order + [n for n in names if n not in saved_order]
