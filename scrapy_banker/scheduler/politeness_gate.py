"""The politeness gate: server pushback held by the frontier, not retried at once.

A server answering ``429 Too Many Requests`` or ``503`` (the codes of
:setting:`BANKER_PUSHBACK_CODES`) is asking the crawler to slow down.
Scrapy's ``RetryMiddleware`` retries such a request at once; this part of
:class:`~scrapy_banker.scheduler.BankerScheduler` keeps a per-host
:class:`~scrapy_banker.core.politeness.Politeness` instead and holds the
host's requests in the frontier until the host is ready:

* **The gate** (:meth:`PolitenessGate.is_free`) is the room check the local
  queue asks before it pops a lane: a download slot whose host is blocked
  (``Retry-After``, or the adaptive backoff) or whose minimum interval has
  not elapsed (Crawl-delay, AutoThrottle's delay) has no room, whatever the
  downloader says.  Its lanes are parked on the slot exactly like the lanes
  of a full slot, so a blocked host costs nothing per pop.
* **The wake-up**: the gate remembers when each refused slot is ready and
  keeps one reactor timer (``call_later``) for the earliest of them.  When it
  fires, :attr:`PolitenessGate.on_ready` (the scheduler) frees the slots'
  lanes and wakes the engine -- no polling, and no waiting for the engine's
  5 s heartbeat.
* **Requests already in the downloader**: a request can wait in its download
  slot's own queue (``DOWNLOAD_DELAY``, AutoThrottle, the one request the
  downloader view lets wait behind a busy slot).  When a refusal is
  downloaded -- Scrapy's ``response_downloaded`` signal, before the
  downloader starts the next request of the slot -- the host is blocked at
  once and the requests of this scheduler waiting in that queue are taken
  back out (failed with :class:`HeldBack`, which the middleware turns into
  a put-back), so none of them leaves before the host is ready.
* **The response side** (:meth:`PolitenessGate.response`, called by
  :class:`~scrapy_banker.middlewares.BankerDownloaderMiddleware` before
  ``RetryMiddleware`` sees the response): a pushback status blocks the host
  and the request is *put back* -- a copy (``dont_filter=True``, same meta,
  priority and callback) the engine schedules again -- not retried:
  ``retry_times`` is untouched.  Past
  :setting:`BANKER_PUSHBACK_MAX_REFUSALS` the host is reported once and its
  requests are dead-lettered instead (the refused one, and every queued one
  as the frontier reaches it: they are never sent), through the store's
  ``dead_letter`` (``JOBDIR/banker-deadletter.jsonl``, requeueable with
  ``scrapy banker deadletters --jobdir DIR --requeue``).

Every other response counts as a success (the refusal count decays); with
AutoThrottle on, its slot delay is recorded as the host's throttle delay, so
it can travel with the host on a fleet.

Politeness is keyed by download slot -- the key the frontier's lanes use,
the host name unless ``meta["download_slot"]`` or the downloader says
otherwise.  Times are wall-clock (``time.time()``): a ``Retry-After``
promised before a stop is still honoured after a resume (the states are in
the JOBDIR snapshot) or on another worker.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from scrapy.exceptions import IgnoreRequest

from scrapy_banker.core.meta import META_SLOT
from scrapy_banker.core.politeness import HostState, Politeness, parse_retry_after
from scrapy_banker.scheduler.engine import Timer, call_later

if TYPE_CHECKING:
    import random

    from scrapy import Request
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

__all__ = ["CONNECT_MARGIN_S", "HeldBack", "PolitenessGate"]

#: What a host's first spaced request from this process may take, past the
#: moment it is handed to the download handler, to reach the server: it
#: leaves in a burst of start-up work (robots.txt just parsed, a partition
#: just taken over) and often opens the connection, which on a busy reactor
#: costs tens of milliseconds that the next request, on the open connection,
#: does not.  The next one is spaced from its departure plus this much (at most
#: half the interval).  Measured on a fleet of five processes on two cores:
#: 0.03-0.17 s late.
CONNECT_MARGIN_S: Final = 0.25


class HeldBack(IgnoreRequest):
    """A request taken back out of its download slot's queue: its host pushed back.

    :class:`~scrapy_banker.middlewares.BankerDownloaderMiddleware` puts it
    back into the scheduler.  An ``IgnoreRequest``, so that without that
    middleware nothing retries it or logs it as a network error.
    """


def _nothing(slots: list[str]) -> None:
    pass


def _log_dead_letter(request: Request, reason: str) -> None:
    logger.warning("Dead letter (%s), not kept anywhere else: %s %s",
                   reason, request.method, request.url)  # fmt: skip


class PolitenessGate:
    """Hold hosts that pushed back; put their refused requests back; dead-letter past the cap.

    ``room`` is the downloader's own room check
    (:meth:`~scrapy_banker.scheduler.downloader.DownloaderView.is_free`);
    :meth:`is_free` is what the local queue asks instead.  ``clock`` (wall
    time) and ``schedule`` (a one-shot timer) are injectable for tests.
    """

    def __init__(
        self,
        config: BankerConfig,
        stats: StatsCollector,
        room: Callable[[str], bool],
        *,
        autothrottle: bool = False,
        clock: Callable[[], float] = time.time,
        schedule: Callable[[float, Callable[[], Any]], Timer] = call_later,
        rng: random.Random | None = None,
        on_ready: Callable[[list[str]], None] = _nothing,
        dead_letter: Callable[[Request, str], None] | None = None,
    ) -> None:
        #: The per-host states (``BankerScheduler.politeness``).
        self.politeness = Politeness(config.politeness(), rng)
        #: False (``BANKER_PUSHBACK``): responses are left alone, as with Scrapy.
        self.enabled = config.pushback
        self.codes = config.pushback_codes
        self.stats = stats
        self.room = room
        #: Record AutoThrottle's slot delay as the host's throttle delay.
        self.autothrottle = autothrottle
        self.clock = clock
        self.schedule = schedule
        #: Called with the slots whose wait is over: the scheduler frees their
        #: lanes and wakes the engine.
        self.on_ready = on_ready
        #: Keeps a request given up on (its reason): the store's ``dead_letter``.
        #: Without one the request is only logged.
        self.dead_letter: Callable[[Request, str], None] = dead_letter or _log_dead_letter
        #: Whether queued requests of a given-up host are dead-lettered as the
        #: frontier reaches them (only where a store keeps them).
        self.drain = dead_letter is not None
        #: Hosts past ``max_refusals``, reported once each.
        self.given_up: set[str] = set()
        self._hosts = self.politeness.hosts  # the same dict, mutated in place
        self._heap: list[tuple[float, str]] = []
        #: Slot -> the wall time it is to be woken at (at most one live wake per slot).
        self._armed: dict[str, float] = {}
        self._timer: Timer | None = None
        self._timer_at = math.inf
        self.wakeups = 0
        #: Refusals recorded when they were downloaded, by id of the response,
        #: until :meth:`response` sees them (so each counts once).
        self._recorded: dict[int, HostState] = {}
        #: Slot -> when its last request went to the wire (:meth:`at_wire`).
        self._wire: dict[str, float] = {}
        #: Slot -> when its last request left: handed to the download handler
        #: (:meth:`on_wire`), then moved to when its bytes left the process
        #: (:meth:`_flush`): what a server measures, even if a timer fired late.
        self._sent: dict[str, float] = {}
        #: Slots whose last request was handed to the handler this reactor turn
        #: (``_leaving``) and the turn before (``_flushing``): see :meth:`_flush`.
        self._leaving: set[str] = set()
        self._flushing: set[str] = set()
        self._flush_timer: Timer | None = None

    # -- the gate --------------------------------------------------------------------

    def is_free(self, slot: str) -> bool:
        """May a request of ``slot`` leave now?  The local queue's room check.

        False while the host is blocked or its interval has not elapsed (a
        wake-up is then armed for the moment it is ready), else the
        downloader's answer.  A host being drained is free: its requests are
        dead-lettered when popped, never sent.
        """
        given_up = self.given_up
        if given_up and self.drain and slot in given_up:
            return True
        hosts = self._hosts
        if hosts:
            state = hosts.get(slot)
            if state is not None:
                at = state.ready_at()
                if at > self.clock():
                    self._hold(slot, at)
                    return False
        return self.room(slot)

    def interval(self, slot: str) -> float:
        """The least seconds between two requests of ``slot`` now (0: none)."""
        hosts = self._hosts
        if hosts:
            state = hosts.get(slot)
            if state is not None:
                return state.interval
        return 0.0

    def refused(self, slot: str) -> bool:
        """Has ``slot``'s host refused a request in this crawl (a block on record)?"""
        hosts = self._hosts
        if hosts:
            state = hosts.get(slot)
            if state is not None:
                return state.blocked_until > 0
        return False

    def draining(self, slot: str) -> bool:
        """Is a popped request of ``slot`` to be dead-lettered instead of sent?"""
        return self.drain and slot in self.given_up

    def dispatched(self, slot: str) -> None:
        """A request of ``slot`` leaves: the start of the host's next interval."""
        hosts = self._hosts
        if hosts and slot in hosts:
            self.politeness.sent(slot, self.clock())

    def adopt(self, states: Mapping[str, HostState]) -> None:
        """Take over hosts' states (a store that became their owner); their lanes re-check.

        Merged with what this node knows of each host (:meth:`HostState.merged
        <scrapy_banker.core.politeness.HostState.merged>`): a refusal it got
        moments ago may not be in the state it reads.  Not reported back by
        ``take_changed``: the states came from where they are kept.  The
        previous owner's last request sent is this node's last at the wire
        too, so the next one here leaves an interval after it, and the one
        after keeps :data:`CONNECT_MARGIN_S` more, as a host's first here.
        """
        politeness, wire, sent = self.politeness, self._wire, self._sent
        for host, state in states.items():
            known = politeness.hosts.get(host)
            merged = state if known is None else known.merged(state)
            politeness.put(host, merged)
            last = merged.last_sent
            if last > wire.get(host, 0.0):
                wire[host] = last
            sent.pop(host, None)  # its next request here is its first since: the margin
        if states:
            self.on_ready(list(states))

    # -- wake-ups ------------------------------------------------------------------------

    def _hold(self, slot: str, at: float) -> None:
        armed = self._armed.get(slot)
        if armed is not None and armed <= at:
            return  # woken earlier anyway: it re-checks then
        self._armed[slot] = at
        heapq.heappush(self._heap, (at, slot))
        if at < self._timer_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.schedule(max(0.0, at - self.clock()), self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self.clock()
        heap, armed = self._heap, self._armed
        ready = []
        while heap and heap[0][0] <= now:
            at, slot = heapq.heappop(heap)
            if armed.get(slot) == at:
                del armed[slot]
                ready.append(slot)
        while heap and armed.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # superseded by an earlier wake of the same slot
        if heap:
            self._arm(heap[0][0])
        if ready:
            self.wakeups += len(ready)
            self.on_ready(ready)

    @property
    def next_wake(self) -> float | None:
        """Wall time of the next armed wake-up (None: none)."""
        return None if self._timer is None else self._timer_at

    # -- responses ---------------------------------------------------------------------------

    def refusal(self, response: Response) -> bool:
        """Is ``response`` a pushback this gate handles?"""
        return self.enabled and response.status in self.codes

    def downloaded(self, response: Response, slot: str) -> HostState:
        """A refusal left the network (``response_downloaded``): block its host now.

        Before the downloader starts the slot's next request; the caller
        then takes the host's waiting requests back out of the slot's queue.
        """
        state = self._record(response, slot)
        if len(self._recorded) > 10_000:  # responses that never reached the middleware
            self._recorded.clear()
        self._recorded[id(response)] = state
        return state

    def check_blocked(self, request: Request) -> HostState | None:
        """Raise :class:`HeldBack` if ``request``'s host is blocked (or paused) now;
        its state if it has one."""
        slot = request.meta.get(META_SLOT)
        if not self.enabled or slot is None:
            return None
        state = self.politeness.hosts.get(slot)
        if state is None:
            return None
        left = state.blocked_until - self.clock()
        if left > 0:
            raise HeldBack(f"{slot} is held for {left:.3f} s more")
        return state

    def last_wire(self, slot: str) -> float:
        """When ``slot``'s last spaced request went to the wire (0: none yet).

        The one record of a host's last send at the wire: the operator's
        ``delay`` (:class:`~scrapy_banker.scheduler.control_gate.ControlGate`) is
        measured from it too.
        """
        return self._wire.get(slot, 0.0)

    def _spacing(self, request: Request, floor: float) -> tuple[str, float] | None:
        """``request``'s slot and the least interval of its host now (at least
        ``floor``); None if nothing spaces it (no interval, or not the
        scheduler's request: robots.txt).  Raises :class:`HeldBack` as
        :meth:`check_blocked`."""
        state = self.check_blocked(request)
        interval = max(floor, 0.0 if state is None else state.interval)
        slot = request.meta.get(META_SLOT)
        if not interval or slot is None:
            return None
        return slot, interval

    def at_wire(self, request: Request, floor: float = 0.0) -> float:
        """The last check before ``request`` goes to the wire: seconds to wait first.

        Raises :class:`HeldBack` if its host is blocked now (a refusal
        arrived after the request was let go).  A host with an interval
        (Crawl-delay, AutoThrottle) gets its requests spaced by it *at the
        wire*, measured from the previous one sent: what waited in
        middlewares and queues can bunch up after its dispatch, never here.
        Each call reserves its moment, so the caller must wait what it is
        told and send.  ``floor``: the least interval whatever the host's
        own (the operator's ``delay``).
        """
        spaced = self._spacing(request, floor)
        if spaced is None:
            return 0.0
        slot, interval = spaced
        now = self.clock()
        at = max(now, self._wire.get(slot, 0.0) + interval)
        self._wire[slot] = at
        if at > now:
            self.stats.inc_value("banker/pushback/spaced_at_wire")
        return at - now

    def on_wire(self, request: Request, floor: float = 0.0) -> float:
        """``request`` is about to be sent, its :meth:`at_wire` wait over: seconds more to wait.

        0 when its host's previous request went out an interval ago or more
        (this one is then recorded as the host's last); else what is left
        of that interval.  A reserved moment is only a timer: when the
        reactor is busy the previous request may have left late, and the
        next one, on time, would reach the server less than an interval
        after it.  Likewise a host's first spaced request from this process
        may arrive late (:data:`CONNECT_MARGIN_S`): the next one keeps that
        much more (at most half the interval).  Call again after waiting
        what it returns.
        """
        spaced = self._spacing(request, floor)  # the caller just checked: cannot raise
        if spaced is None:
            return 0.0
        slot, interval = spaced
        now = self.clock()
        last = self._sent.get(slot)
        at = now
        if last is None:  # the host's first here: it may reach the server late
            at += min(CONNECT_MARGIN_S, interval / 2)
        elif last + interval > now:
            self.stats.inc_value("banker/pushback/respaced_at_wire")
            return last + interval - now
        self._left(slot, at)
        self._leaving.add(slot)
        if self._flush_timer is None:
            self._flush_timer = self.schedule(0.0, self._flush)
        return 0.0

    def _left(self, slot: str, at: float) -> None:
        """``slot``'s last request left at ``at``, if later than known."""
        if at > self._sent.get(slot, 0.0):
            self._sent[slot] = at
        if at > self._wire.get(slot, 0.0):
            self._wire[slot] = at
        self.politeness.sent(slot, at)  # what a new owner of the host spaces from

    def _flush(self) -> None:
        """Move the departure of requests let go two reactor turns ago to now.

        A request handed to the download handler is only *buffered*: the
        reactor writes it to the socket when it next polls, after the rest
        of the current turn's work -- responses parsed, timers run -- which
        on a busy crawler takes tens of milliseconds or more (measured: 60-120 ms
        stalls every Crawl-delay period on the 150-host push-back farm, and
        the previous request of a "too early" pair reaching the server
        86 ms after its handler call).  A zero-delay timer set in one turn
        runs in the next, after that turn's poll; a request let go during a
        poll (a response freed its slot) is written in the poll after, so
        the departure is taken at the second timer: never before the bytes
        left, at most one turn after.  One timer runs per turn while a
        spaced request is in flight to the socket.
        """
        self._flush_timer = None
        now = self.clock()
        for slot in self._flushing:
            self._left(slot, now)
        self._flushing, self._leaving = self._leaving, set()
        if self._flushing:
            self._flush_timer = self.schedule(0.0, self._flush)

    def held_back(self, request: Request) -> Request:
        """The copy to put back of a request taken out of its slot's queue (:class:`HeldBack`)."""
        self.stats.inc_value("banker/pushback/held_back")
        return request.replace(dont_filter=True)

    def _record(self, response: Response, slot: str) -> HostState:
        now = self.clock()
        retry_after = parse_retry_after(response.headers.get(b"Retry-After"), now)
        state = self.politeness.refused(
            slot, now, retry_after, coalesce=True, rate=response.status == 429
        )
        self.stats.inc_value("banker/pushback/refused")
        if retry_after is not None:
            self.stats.inc_value("banker/pushback/retry_after")
        return state

    def response(
        self, request: Request, response: Response, slot: str, throttle_delay: float | None
    ) -> Response | Request:
        """What the engine gets instead of ``response``: itself, or the request to put back.

        Raises ``IgnoreRequest`` for a request dead-lettered because its host
        gave up (its errback sees it; Scrapy does not log it as an error).
        ``throttle_delay``: AutoThrottle's delay of the slot now (None: off).
        """
        politeness = self.politeness
        if throttle_delay is not None:
            politeness.throttle(slot, throttle_delay)
        status = response.status
        if status not in self.codes:
            # Every host's answers count, from its first: see Politeness.refused.
            politeness.succeeded(slot, self.clock())
            if self.given_up and slot in self.given_up and not politeness.gave_up(slot):
                self.given_up.discard(slot)
                logger.info("Host %s answers again: its requests are sent again", slot)
            return response
        state = self._recorded.pop(id(response), None) or self._record(response, slot)
        stats = self.stats
        meta = request.meta
        if META_SLOT not in meta or meta.get("dont_retry") or _handles(meta, status):
            # Not this scheduler's (engine.download) or the spider's to handle:
            # the response goes on; the host is blocked all the same.
            stats.inc_value("banker/pushback/passed_on")
            return response
        if politeness.gave_up(slot):
            reason = f"pushback: {slot} refused {state.refusals} times"
            self._give_up(slot, state, status)
            self.dead_letter(request, reason)
            stats.inc_value("banker/pushback/dead_lettered")
            raise IgnoreRequest(reason)
        stats.inc_value("banker/pushback/requeued")
        return request.replace(dont_filter=True)

    def _give_up(self, slot: str, state: HostState, status: int) -> None:
        if slot in self.given_up:
            return
        self.given_up.add(slot)
        self.stats.inc_value("banker/pushback/hosts_given_up")
        logger.warning(
            "Host %s refused %d times in a row (last: HTTP %d); its requests are "
            "dead-lettered instead of being put back%s (BANKER_PUSHBACK_MAX_REFUSALS=%d)",
            slot, state.refusals, status,
            ", queued ones included" if self.drain else "",
            self.politeness.config.max_refusals,
        )  # fmt: skip

    # -- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel the wake-up timer; publish what is still held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        now = self.clock()
        blocked = sum(1 for s in self._hosts.values() if s.blocked_until > now)
        if blocked:
            self.stats.set_value("banker/pushback/blocked_hosts", blocked)
        if self.wakeups:
            self.stats.set_value("banker/pushback/wakeups", self.wakeups)


def _handles(meta: Mapping[str, Any], status: int) -> bool:
    """Does the request ask to receive this status itself (Scrapy's HttpError meta keys)?"""
    if meta.get("handle_httpstatus_all"):
        return True
    codes: Any = meta.get("handle_httpstatus_list")
    return bool(codes) and status in codes
