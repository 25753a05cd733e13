"""The pop loop: which queued request leaves next, past every check in order.

:class:`Dispatcher` pops the local queue (its room checks already asked the
control gate, the politeness gate and the downloader) and then asks, per
entry: may the store still send it (a fleet's lease), was its host given
up on (dead-lettered, never sent), does a budget hold it, does the Banker's
algorithm admit it.  Long-pole pacing (:mod:`scrapy_banker.core.pacing`)
narrows the pop to the critical hosts' slots while the scraper is behind.

It is the scheduler's ``next_request`` without the Scrapy contract around
it, so the order of the checks is read in one place.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from scrapy_banker.core.pacing import Pacer, PacerConfig
from scrapy_banker.scheduler.engine import scraper_backlog

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.scheduler.seams import RequestStore, SchedulerParts

__all__ = ["Dispatcher", "MachineLoad"]


class MachineLoad:
    """How busy the machine's CPUs were between two reads (``/proc/stat``; None elsewhere).

    A process that gets less than a CPU because every core is taken is as
    far behind as one that uses a whole CPU: the pacer counts both as
    saturated.  Read where it exists (Linux); on other systems the pacer
    goes by its own process's CPU alone.
    """

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._last: tuple[int, int] | None = None
        self.available = True

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self.path, "rb") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 5 or fields[0] != b"cpu":
            return None
        # user nice system idle iowait irq softirq steal (guest is within user)
        ticks = [int(x) for x in fields[1:9]]
        return sum(ticks), ticks[3] + ticks[4]

    def busy(self) -> float | None:
        """Share of all CPUs busy since the previous call; None on the first or if unknown."""
        if not self.available:
            return None
        now = self._read()
        if now is None:
            self.available = False
            return None
        last, self._last = self._last, now
        if last is None or now[0] <= last[0]:
            return None
        total, idle = now[0] - last[0], now[1] - last[1]
        return max(0.0, min(1.0, (total - idle) / total))


class Dispatcher:
    """Pops the next request that may leave now (reactor thread)."""

    def __init__(self, parts: SchedulerParts, store: RequestStore) -> None:
        self.parts = parts
        self.store = store
        #: Long-pole pacing, None with ``BANKER_PACING`` off.
        self.pacer = (
            Pacer(PacerConfig(backlog=parts.config.pacing_backlog)) if parts.config.pacing else None
        )
        #: Pops narrowed to the critical slots by the pacer.
        self.paced = 0
        self.load = MachineLoad()

    def pop(self, now: float) -> Entry[Request] | None:
        parts, store = self.parts, self.store
        queue, gate, control = parts.queue, parts.gate, parts.control
        if gate is not None:
            gate.before_pop(now)
        pop = queue.pop
        pacer = self.pacer
        if pacer is not None:
            downloader = parts.downloader
            if pacer.due(now):
                backlog, pending = queue.frontier.backlogs, len(queue)
                if elsewhere := store.queued_elsewhere():
                    backlog = {**backlog}
                    for slot, n in elsewhere.items():
                        backlog[slot] = backlog.get(slot, 0) + n
                    pending += sum(elsewhere.values())
                downloader.priority_slots = pacer.refresh(
                    now, time.process_time(), backlog, pending,
                    downloader.concurrency, parts.politeness.interval, self.load.busy(),
                    downloader.total_concurrency,
                )  # fmt: skip
            if pacer.hold(scraper_backlog(parts.crawler)):
                critical = pacer.critical
                self.paced += 1

                def pop(now: float) -> Entry[Request] | None:
                    return queue.pop_slots(critical, now)

        polite = parts.politeness
        budgets = control.counting
        while (entry := pop(now)) is not None:
            if not store.keep(entry):
                continue
            if polite.given_up and polite.draining(entry.slot):
                self._dead_letter(entry)
                continue
            if budgets and not control.charge(entry):
                continue
            if gate is None or gate.admit(entry):
                return entry
        if gate is not None:
            gate.nothing_to_dispatch(now, parts.downloader.idle)
        return None

    def _dead_letter(self, entry: Entry[Request]) -> None:
        """A queued request of a host given up on: dead-lettered, never sent."""
        refusals = self.parts.politeness.politeness.get(entry.slot).refusals
        reason = f"pushback: {entry.slot} refused {refusals} times (not sent)"
        self.store.dead_letter(entry.item, reason, entry)
        self.parts.stats.inc_value("banker/pushback/dead_lettered")

    def response(self, slot: str, latency_s: float | None) -> None:
        """A response of ``slot`` arrived after ``latency_s`` seconds (the pacer's measure)."""
        if self.pacer is not None:
            self.pacer.response(slot, latency_s)

    def close(self) -> None:
        if self.pacer is not None:
            self.parts.stats.set_value("banker/pacing/held", self.paced)
