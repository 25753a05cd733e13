"""The admission gate between the local queue and the engine (Banker's algorithm).

A popped request that declares resources (``banker_need`` / ``banker_task``)
leaves only with a grant that keeps the state safe; otherwise it is *parked*
here -- not polled -- and goes back to the local queue when something is
released.  Everything that decides safety lives in
:class:`~scrapy_banker.scheduler.admission.Admission`; this part only moves requests
between "parked" and "queued" and says so when the crawl stalls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy_banker.scheduler.admission import Admission, InvalidClaim

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.core.frontier import Entry
    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

__all__ = ["AdmissionGate"]

#: Seconds a stall must last before the warning (a callback may be about to
#: yield the task's next step) and between two warnings.
STALL_GRACE_S = 5.0
STALL_REPEAT_S = 30.0


class AdmissionGate:
    """Admit, park, requeue on release, warn on a stall."""

    def __init__(
        self,
        config: BankerConfig,
        stats: StatsCollector,
        requeue: Callable[[Entry[Request], float], None],
    ) -> None:
        self.admission = Admission(
            config.resources,
            stats=stats,
            topic_claims=config.task_claims,
            task_timeout=config.task_timeout,
            policy=config.admission_policy,
        )
        self.stats = stats
        self.task_timeout = config.task_timeout
        self.requeue = requeue
        self.parked: list[Entry[Request]] = []
        self._reclaimed_at = 0.0
        self._stall_warned_at = -1e9
        self._stalled_since: float | None = None

    def __len__(self) -> int:
        return len(self.parked)

    def before_pop(self, now: float) -> None:
        admission = self.admission
        if now - self._reclaimed_at >= 1.0:
            self._reclaimed_at = now
            admission.reclaim_expired()  # first, so what it frees is retried now
        if admission.released_since_wait:
            self._requeue_parked(now)

    def admit(self, entry: Entry[Request]) -> bool:
        """True if the request may leave now; False if it was parked or dropped."""
        request = entry.item
        admission = self.admission
        if not admission.needs_admission(request):
            self._stalled_since = None
            return True
        try:
            verdict = admission.try_admit(request, entry.topic)
        except InvalidClaim as exc:
            logger.error("Dropping %s: invalid resource claim: %s", request, exc)
            self.stats.inc_value("banker/admission/invalid")
            return False
        if verdict == "granted":
            self._stalled_since = None
            return True
        admission.defer(request, verdict)
        self.parked.append(entry)
        return False

    def nothing_to_dispatch(self, now: float, downloader_idle: Callable[[], bool]) -> None:
        """The local queue gave nothing: if only parked requests remain, maybe warn."""
        if self.parked and downloader_idle():
            self._warn_stalled(now)
        else:
            self._stalled_since = None

    def release(self, request: Request, outcome: str) -> bool:
        return self.admission.release_request(request, outcome)

    def close(self, now: float) -> None:
        """Put every parked request back in the queue (a JOBDIR saves them), then release all."""
        self._requeue_parked(now, everything=True)
        self.admission.close()

    def _warn_stalled(self, now: float) -> None:
        """Everything left waits for resources that only a task finishing can free."""
        if self._stalled_since is None:
            self._stalled_since = now
        if now - self._stalled_since < STALL_GRACE_S:
            return
        if now - self._stall_warned_at < STALL_REPEAT_S:
            return
        self._stall_warned_at = now
        logger.warning(
            "%d requests wait for resources held by tasks with no request in flight; "
            "they run when those tasks finish (banker_finish / finish_task) or are "
            "reclaimed after BANKER_TASK_TIMEOUT=%gs. State:\n%s",
            len(self.parked),
            self.task_timeout,
            self.admission.describe(),
        )

    def _requeue_parked(self, now: float, everything: bool = False) -> None:
        """Something was released: parked requests that could fit compete again, in order."""
        admission = self.admission
        admission.released_since_wait = False
        parked, self.parked = self.parked, []
        fits = [True] * len(parked) if everything else admission.fitting([e.item for e in parked])
        for entry, fit in zip(parked, fits, strict=True):
            if fit:
                self.requeue(entry, now)
            else:
                self.parked.append(entry)  # free units are spoken for: stay parked
