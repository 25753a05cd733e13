"""Child process of ``deadlock.py``: one real crawl of hold-and-wait task chains.

Every crawl runs in its own process (``python benchmarks/_deadlock_runner.py
SPEC.json``) because a Twisted reactor cannot be restarted and because the two
admission policies must not share an interpreter.  The spec file holds the
Scrapy settings, the task chains (three farm URLs each), whether a task holds
its pages, its declared maximum claim, the engine heartbeat and the path of
the per-task log this process writes when the spider closes.

Task ``t`` is the paper's "crawl request", made of three Scrapy requests::

    step 1: banker_need={"pages": 1}, banker_hold=<hold>   (acquire page 1)
    step 2: banker_need={"pages": 1}, banker_hold=<hold>   (acquire page 2)
    step 3: banker_finish=True                              (release both)

each yielded by the previous one's callback, every one carrying
``banker_task`` and ``banker_max``.  All step-1 requests are start requests,
so every task tries to start at once.

The :class:`TaskLog` extension is the benchmark's watchdog bookkeeping: it
records, per task and step, when the request reached the downloader (its
*dispatch*: the scheduler admitted it) and when its response came back.  The
Completed / Locked verdict is computed afterwards by ``deadlock.py`` from
these times, so the spider never has to guess what the scheduler did.  At
the dispatch of step 2 it also reads (read-only) the task's allocation in the
scheduler's ``BankersState``: a task that still holds its first page has 2
units allocated then; a task whose hold was reclaimed by
``BANKER_TASK_TIMEOUT`` and whose parked step-2 request was admitted later
as a *fresh* task under the same id has only 1.  That is the "restarted"
flag of the log -- evidence of what the scheduler actually did, not an input
of the verdict.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy import signals
from scrapy.core.engine import ExecutionEngine
from scrapy.crawler import CrawlerProcess

from scrapy_banker.scheduler.engine import running_scheduler

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from typing_extensions import Self

#: Meta keys of the benchmark's own bookkeeping (not read by scrapy-banker).
META_T = "bench_task"
META_STEP = "bench_step"
STEPS = 3


def task_id(t: int) -> str:
    return f"task-{t:03d}"


class DeadlockSpider(scrapy.Spider):
    """Yields every task's first request at start; each callback yields the next step."""

    name = "deadlock"

    def __init__(
        self,
        chains: list[list[str]] | None = None,
        hold: bool = True,
        max_pages: int = 2,
        step_priority: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.chains = [list(c) for c in chains or []]
        self.hold = hold
        self.max_pages = max_pages
        self.step_priority = step_priority

    def step_request(self, t: int, step: int) -> scrapy.Request:
        meta: dict[str, Any] = {
            "banker_task": task_id(t),
            # On every step, not only the first: a step admitted after its task
            # was reclaimed starts a new process, which needs the claim again.
            "banker_max": {"pages": self.max_pages},
            META_T: t,
            META_STEP: step,
        }
        if step < STEPS:
            meta["banker_need"] = {"pages": 1}
            if self.hold:
                meta["banker_hold"] = True
        else:
            meta["banker_finish"] = True
        return scrapy.Request(
            self.chains[t][step - 1],
            callback=self.parse_step,
            meta=meta,
            priority=(step - 1) * self.step_priority,
            dont_filter=True,
        )

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for t in range(len(self.chains)):
            yield self.step_request(t, 1)

    def parse_step(self, response: Response) -> Iterator[scrapy.Request]:
        step = int(response.meta[META_STEP])
        if step < STEPS:
            yield self.step_request(int(response.meta[META_T]), step + 1)


class TaskLog:
    """Per task and step: dispatch and response times (s since the spider opened).

    Dispatch is ``request_reached_downloader``: the scheduler handed the
    request to the engine, i.e. admission granted it.  Responses are taken
    from ``response_received``.  Written as JSON to ``BENCH_TASK_LOG`` when
    the spider closes.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.path = crawler.settings.get("BENCH_TASK_LOG")
        n = crawler.settings.getint("BENCH_TASKS")
        self.dispatch: list[list[float | None]] = [[None] * STEPS for _ in range(n)]
        self.response: list[list[float | None]] = [[None] * STEPS for _ in range(n)]
        self.restarted = [False] * n
        self.t0 = time.monotonic()
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.reached, signal=signals.request_reached_downloader)
        crawler.signals.connect(self.received, signal=signals.response_received)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def spider_opened(self, spider: scrapy.Spider) -> None:
        self.t0 = time.monotonic()

    def reached(self, request: scrapy.Request, **kwargs: Any) -> None:
        t, step = request.meta.get(META_T), request.meta.get(META_STEP)
        if t is None or step is None or self.dispatch[t][step - 1] is not None:
            return  # not a task request, or a retry of one already dispatched
        self.dispatch[t][step - 1] = self._now()
        if step == 2 and request.meta.get("banker_hold"):
            admission = getattr(running_scheduler(self.crawler), "admission", None)
            state = getattr(admission, "state", None)
            if state is not None and task_id(t) in state:
                self.restarted[t] = state.allocation_of(task_id(t)).get("pages", 0) < 2

    def received(self, response: Any, request: scrapy.Request, **kwargs: Any) -> None:
        t, step = request.meta.get(META_T), request.meta.get(META_STEP)
        if t is not None and step is not None and self.response[t][step - 1] is None:
            self.response[t][step - 1] = self._now()

    def spider_closed(self, spider: scrapy.Spider, reason: str) -> None:
        if self.path:
            data = {
                "dispatch": self.dispatch,
                "response": self.response,
                "restarted": self.restarted,
                "closed_at": self._now(),
            }
            Path(self.path).write_text(json.dumps(data), encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: _deadlock_runner.py SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    heartbeat = spec.get("heartbeat_s")
    if heartbeat:
        # Scrapy polls a scheduler that has pending but unadmittable requests
        # only on its engine heartbeat (5 s); see deadlock.py's docstring.
        if not hasattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL"):
            print("warning: this Scrapy has no engine heartbeat knob", file=sys.stderr)
        ExecutionEngine._SLOT_HEARTBEAT_INTERVAL = float(heartbeat)  # type: ignore[misc]
    settings: dict[str, Any] = dict(spec["settings"])
    extensions = dict(settings.get("EXTENSIONS") or {})
    extensions[TaskLog] = 100
    settings["EXTENSIONS"] = extensions
    settings["BENCH_TASKS"] = len(spec["chains"])
    process = CrawlerProcess(settings)
    process.crawl(
        DeadlockSpider,
        chains=spec["chains"],
        hold=spec["hold"],
        max_pages=spec["max_pages"],
        step_priority=spec.get("step_priority", 0),
    )
    process.start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
