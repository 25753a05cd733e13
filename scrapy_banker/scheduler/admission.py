"""Banker's admission control for Scrapy requests: who may take which resources, when.

The scheduler asks :class:`Admission` before handing a request to the engine.
A request names what it needs while in flight (``meta["banker_need"]``, e.g.
``{"browser_pages": 1}``) and, optionally, the *task* it belongs to
(``meta["banker_task"]``): a chain of requests -- a login session, a
scrapy-playwright page kept open by a callback -- whose maximum claim
(``meta["banker_max"]`` or ``BANKER_TASK_CLAIMS[topic]``) is declared up
front.  A request whose grant would leave the state unsafe waits in
:class:`Admission` (no polling) and is put back in the frontier when
something is released.

Grants are tracked by a token in ``meta["banker_grant"]``.  Every way a
request can end releases it -- the response or exception seen by the
downloader middleware, ``request_left_downloader``, ``request_dropped``,
the spider closing -- and releases are idempotent, so retries and redirects,
which copy meta, can never release twice or leak.  A task keeps what its
requests acquired with ``meta["banker_hold"] = True`` until it finishes
(``meta["banker_finish"] = True`` on its last request, :meth:`Admission.finish_task`,
or ``BANKER_TASK_TIMEOUT`` seconds without activity).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy_banker.core.bankers_algorithm import BankersState
from scrapy_banker.core.meta import (
    META_FINISH,
    META_GRANT,
    META_HOLD,
    META_MAX,
    META_NEED,
    META_TASK,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

__all__ = ["Admission", "InvalidClaim"]


class InvalidClaim(ValueError):
    """A request's banker_* meta is malformed or can never be satisfied."""


@dataclass
class _Task:
    pid: Hashable
    holds: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    last_active: float = 0.0
    ephemeral: bool = False  # a single request without banker_task
    finishing: bool = False


@dataclass
class _Grant:
    task: _Task
    amounts: dict[str, int]
    hold: bool
    finish: bool


class Admission:
    """Wraps :class:`~scrapy_banker.core.bankers_algorithm.BankersState` for the scheduler."""

    def __init__(
        self,
        totals: Mapping[str, int],
        *,
        stats: StatsCollector,
        topic_claims: Mapping[str, Mapping[str, int]] | None = None,
        task_timeout: float = 300.0,
        policy: str = "banker",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if policy not in ("banker", "naive"):
            raise ValueError(f"admission policy must be 'banker' or 'naive', got {policy!r}")
        self.check_safety = policy == "banker"
        self.state = BankersState(totals)
        self.stats = stats
        self.topic_claims = dict(topic_claims or {})
        self.task_timeout = task_timeout
        self.clock = clock
        self._tasks: dict[Hashable, _Task] = {}
        self._grants: dict[int, _Grant] = {}
        self._tokens = itertools.count(1)
        #: Set on every release; the scheduler re-queues parked requests when set.
        self.released_since_wait = False
        self._wait_started: dict[int, float] = {}

    # -- parsing request meta -----------------------------------------------------

    def _amounts(self, request: Request, key: str) -> dict[str, int]:
        raw = request.meta.get(key)
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            raise InvalidClaim(f"meta[{key!r}]={raw!r}: expected a dict of resource -> int")
        out: dict[str, int] = {}
        for name, amount in raw.items():
            if name not in self.state.resources:
                raise InvalidClaim(
                    f"meta[{key!r}] names unknown resource {name!r}; "
                    f"BANKER_RESOURCES has {list(self.state.resources)}"
                )
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise InvalidClaim(f"meta[{key!r}][{name!r}]={amount!r}: expected an int >= 0")
            if amount:
                out[name] = amount
        return out

    def fitting(self, requests: list[Request]) -> list[bool]:
        """Which parked requests are worth re-evaluating after a release.

        A request whose own need exceeds what is free cannot pass step b, so
        it stays parked.  Every other one goes back to the frontier: which of
        them runs is decided there, by priority and by the safety check --
        pre-selecting by park order (or reserving units for the first ones)
        would starve a started task's next step behind new tasks.
        """
        free = self.state.as_dict(self.state.available)
        out: list[bool] = []
        for request in requests:
            need = request.meta.get(META_NEED)
            if not isinstance(need, Mapping):
                out.append(True)  # no need (a task member) or malformed: try_admit decides
                continue
            try:
                out.append(all(free[r] >= n for r, n in need.items()))
            except (KeyError, TypeError):
                out.append(True)  # malformed: let try_admit report it
        return out

    def needs_admission(self, request: Request) -> bool:
        return bool(request.meta.get(META_NEED)) or META_TASK in request.meta

    # -- the scheduler's side -------------------------------------------------------------

    def try_admit(self, request: Request, topic: str) -> str:
        """Grant the request's need if safe: "granted", "unsafe" or "insufficient".

        Raises :class:`InvalidClaim` for meta that can never be satisfied.
        """
        need = self._amounts(request, META_NEED)
        task_id = request.meta.get(META_TASK)
        now = self.clock()
        if task_id is None:
            task = _Task(pid=("request", next(self._tokens)), ephemeral=True)
            claim = need
        else:
            if not isinstance(task_id, (str, int)):
                raise InvalidClaim(f"meta[{META_TASK!r}]={task_id!r}: expected a str or int")
            task = self._tasks.get(task_id)  # type: ignore[assignment]
            claim = self._amounts(request, META_MAX) or dict(self.topic_claims.get(topic, {}))
            if task is None:
                task = _Task(pid=task_id)
            elif task.finishing:
                raise InvalidClaim(f"task {task_id!r} already finished")
        if task.pid not in self.state:
            try:
                self.state.add_process(task.pid, claim or need)
            except ValueError as exc:
                raise InvalidClaim(str(exc)) from None
            if not task.ephemeral:
                self._tasks[task.pid] = task
        try:
            decision = self.state.request(task.pid, need, check_safety=self.check_safety)
        except ValueError as exc:  # above the declared need
            self._forget_if_idle(task)
            raise InvalidClaim(str(exc)) from None
        if not decision.granted:
            self._forget_if_idle(task)
            return decision.reason
        token = next(self._tokens)
        self._grants[token] = _Grant(
            task=task,
            amounts=need,
            hold=bool(request.meta.get(META_HOLD)),
            finish=bool(request.meta.get(META_FINISH)),
        )
        request.meta[META_GRANT] = token
        task.in_flight += 1
        task.last_active = now
        self.stats.inc_value("banker/admission/granted")
        for name, amount in need.items():
            self.stats.inc_value(f"banker/alloc/{name}", amount)
        started = self._wait_started.pop(id(request), None)
        if started is not None:
            waited = now - started
            key = f"banker/topic/{topic}/admission_wait_s"
            self.stats.set_value(key, round(self.stats.get_value(key, 0.0) + waited, 3))
            self.stats.max_value(f"banker/topic/{topic}/admission_max_wait_s", round(waited, 3))
        return "granted"

    def defer(self, request: Request, reason: str) -> None:
        """Account for a request the scheduler parks until something is released."""
        if id(request) not in self._wait_started:
            self._wait_started[id(request)] = self.clock()
            logger.debug(
                "%s waits for admission (%s): need %s of task %s; available %s",
                request,
                reason,
                request.meta.get(META_NEED),
                request.meta.get(META_TASK),
                self.state.as_dict(self.state.available),
            )
        self.stats.inc_value(f"banker/admission/deferred/{reason}")

    # -- releases --------------------------------------------------------------------------

    def release_request(self, request: Request, outcome: str) -> bool:
        """The request ended (``outcome`` names how); idempotent."""
        token = request.meta.get(META_GRANT)
        if token is None:
            return False
        grant = self._grants.pop(token, None)
        if grant is None:
            return False  # already released, or a copy (retry/redirect) of a released one
        del request.meta[META_GRANT]
        task = grant.task
        task.in_flight -= 1
        task.last_active = self.clock()
        if grant.hold and not task.ephemeral:
            for name, amount in grant.amounts.items():
                task.holds[name] = task.holds.get(name, 0) + amount
        else:
            self._release(task, grant.amounts)
        self.stats.inc_value(f"banker/admission/released/{outcome}")
        if grant.finish or task.ephemeral:
            task.finishing = True
        if task.finishing and task.in_flight == 0:
            self._finish(task, "finished")
        return True

    def _release(self, task: _Task, amounts: Mapping[str, int]) -> None:
        if not any(amounts.values()):
            return
        self.state.release(task.pid, amounts)
        for name, amount in amounts.items():
            self.stats.inc_value(f"banker/alloc/{name}", -amount)
        self.released_since_wait = True

    def _finish(self, task: _Task, why: str) -> None:
        held = self.state.finish(task.pid)
        for name, amount in held.items():
            if amount:
                self.stats.inc_value(f"banker/alloc/{name}", -amount)
                self.released_since_wait = True
        task.holds.clear()
        if not task.ephemeral:
            self._tasks.pop(task.pid, None)
            self.stats.inc_value(f"banker/task/{why}")

    def _forget_if_idle(self, task: _Task) -> None:
        if task.in_flight == 0 and not task.holds and task.pid in self.state:
            alloc = self.state.allocation_of(task.pid)
            if not any(alloc.values()):
                self.state.finish(task.pid)
                self._tasks.pop(task.pid, None)

    def finish_task(self, task_id: Hashable) -> bool:
        """Explicitly end a task: what it holds is released now (in-flight requests later)."""
        task = self._tasks.get(task_id)
        if task is None:
            return False
        task.finishing = True
        if task.in_flight == 0:
            self._finish(task, "finished")
        else:
            self._release(task, task.holds)
            task.holds.clear()
        return True

    def reclaim_expired(self) -> list[Hashable]:
        """Finish tasks idle for longer than the timeout; returns their ids."""
        now = self.clock()
        expired = [
            t
            for t in self._tasks.values()
            if t.in_flight == 0 and now - t.last_active >= self.task_timeout
        ]
        for task in expired:
            logger.warning(
                "Task %r idle for %.0f s: reclaiming %s (BANKER_TASK_TIMEOUT)",
                task.pid, now - task.last_active, task.holds,
            )  # fmt: skip
            self._finish(task, "reclaimed_timeout")
        return [t.pid for t in expired]

    def close(self) -> dict[str, int]:
        """Spider closed: report what was still allocated, then release everything.

        Requests still holding a grant here leaked through a path that did not
        release (should never happen); tasks still holding resources simply did
        not finish before the crawl ended and are reclaimed.
        """
        leaked: dict[str, int] = {}
        for token, grant in list(self._grants.items()):
            for name, amount in grant.amounts.items():
                leaked[name] = leaked.get(name, 0) + amount
            del self._grants[token]
        for name in self.state.resources:
            self.stats.set_value(f"banker/alloc/leaked/{name}", leaked.get(name, 0))
        if any(leaked.values()):
            logger.error("Resources still granted to requests at close (leak): %s", leaked)
        for task in list(self._tasks.values()):
            self._finish(task, "reclaimed_close")
        for pid in self.state.pids():  # single-request processes whose grant leaked
            self.state.finish(pid)
        for name, amount in self.state.as_dict(self.state.total - self.state.available).items():
            self.stats.set_value(f"banker/alloc/{name}", amount)
        self._wait_started.clear()
        return leaked

    def describe(self) -> str:
        return self.state.format()
