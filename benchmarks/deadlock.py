"""Deadlocks of hold-and-wait crawl tasks: Banker's admission vs first come, first served.

The paper (王庆红 et al., 2015, "A web crawler resource allocation strategy
based on the Banker's algorithm") runs 100 crawl requests with a 2-minute
timeout each; a task that times out is logged *Locked* (deadlocked) and
restarted after the others, otherwise *Completed* with its waiting time.  Its
Table 3: urllib2 (naive) total wait 2:09:07, 30 deadlocks (30 %); Banker's
1:38:28, 2 deadlocks (2 %).  This script is that experiment scaled down to
seconds and run as real Scrapy crawls of the local web farm, each in its own
process (``_runner.py``: ``_crawler.DeadlockSpider`` and the ``TaskLog``
extension, which records when each step was dispatched and answered) with
``BankerScheduler`` and the add-on.

Hold-and-wait workload
    ``--tasks`` (100) task chains, ``BANKER_RESOURCES = {"pages": --pages}``
    (4 emulated browser pages).  Task ``t`` fetches three pages of farm host
    ``t % --hosts``: step 1 acquires one page and *holds* it, its callback
    yields step 2, which acquires a second page (hold), whose callback yields
    step 3 (``banker_finish``), which releases both.  Every task declares
    ``banker_max={"pages": 2}``.  All step-1 requests are start requests, so
    every task tries to start at once.  Host latencies are spread evenly over
    50-100 ms, so tasks overlap and finish at different times.  Later steps
    have a higher ``request.priority`` (``STEP_PRIORITY``): a spider should
    finish what it started, and it is the naive allocator's best case -- with
    equal priorities the freed pages always go to new tasks' first steps and
    nearly every task locks.

    With ``BANKER_ADMISSION_POLICY = "naive"`` (grant whatever is free) the
    first ``pages`` step-1 requests take every page before any response is
    back; then each of those tasks waits for a second page that only another
    waiting task could release: a deadlock, with nothing in flight.  The
    Banker's policy refuses the step-1 grant that would leave no safe sequence
    (with 4 pages at most 3 tasks may hold one page each), so some task can
    always finish.  A Locked task under the Banker's policy is therefore not a
    deadlock of the algorithm but a task the *scheduler* left waiting past the
    watchdog (starvation); ``banker/task/reclaimed_timeout`` tells whether the
    admission had to reclaim it.

Watchdog, reclaim and restart (the paper's 2 minutes scaled to ``--watchdog``)
    *Verdict*: a task not finished within ``watchdog`` seconds of the dispatch
    of its first request is **Locked**, otherwise **Completed**.  It is decided
    from the per-task dispatch/response times the crawler logs, after the
    crawl.  *Reclaim*: ``BANKER_TASK_TIMEOUT = watchdog``, so the admission
    reclaims the page of a task idle that long (a task waiting for its second
    page has no request in flight: it is idle) and the crawl goes on.
    *Restart*: the reclaimed task's step-2 request stays parked in the
    scheduler; ``Admission.try_admit`` no longer knows the task id (``_finish``
    forgot it), so when a page is free again it admits that request as a
    *new* task under the same id, which then completes its chain.  That is the
    paper's "restart after the others", done by the scheduler itself; the
    benchmark keeps such a task Locked, counts the watchdog timeout as its
    wait (as the paper does) and reports how many Locked tasks completed
    after their restart (``*_restarted_completed``; a Locked task that
    completed without being reclaimed -- it merely waited too long -- is
    counted in ``*_completed_late``).  Tasks whose first request was never
    dispatched before the crawl budget (``CLOSESPIDER_TIMEOUT``) ran out are
    reported as ``*_unstarted`` (0 unless the budget is too short), not as
    Locked.

Why the engine heartbeat is scaled too (``--heartbeat``)
    ``Admission.reclaim_expired`` runs inside ``BankerScheduler.next_request``,
    and in a full deadlock (nothing in flight, every request parked) Scrapy
    calls ``next_request`` only on its engine heartbeat, every 5 s; the
    requests a reclaim frees are retried only at the following call, so a
    deadlock lasts up to two heartbeats.  The paper's timeout (120 s) dwarfs
    that; a scaled-down 1.5 s watchdog does not, and every deadlock would last
    5-10 s whatever the watchdog.  The crawler therefore sets Scrapy's
    (private) ``ExecutionEngine._SLOT_HEARTBEAT_INTERVAL`` to ``watchdog / 10``
    for *both* policies (``_crawler.EngineHeartbeat``); ``--heartbeat 5``
    reproduces stock Scrapy (naive crawls several times slower, same verdicts).

No-deadlock workload (the cost of the safety check)
    The same chains, but tasks do not hold (``banker_hold`` off): a page is
    taken only while a request is in flight, so no allocator can deadlock.
    Such a task never has more than one page at a time, so it declares
    ``banker_max={"pages": 1}`` -- declaring 2 would make the Banker keep a
    page in reserve for a claim that never comes (3 requests in flight instead
    of 4), which is the price of an over-declared claim, not of the check.
    Both policies then grant exactly the same requests and the throughput
    difference is what the safety check costs; each policy crawls
    ``nodeadlock_repeats`` times (2 in --quick), in alternating order, and
    pages/s is the median.  Target (reported, not asserted): Banker's pages/s
    >= naive's; the pages are the bottleneck, so expect a ratio of 1 within
    run-to-run noise (about 1-2 %).  The same
    watchdog verdict is applied, but nothing can deadlock here: a Locked task
    is one whose later steps waited past the watchdog behind other tasks'
    first steps (starvation by the scheduler's ordering).

Safety check micro-benchmark
    ``BankersState.is_safe()`` on a random safe state of 1,000 processes x 4
    resource types built with ``add_process`` / ``request``: median of many
    calls, in microseconds, next to the paper's O(m*n^2) rescanning algorithm
    (``naive_safe_sequence``) on the same state.

Usage::

    python benchmarks/deadlock.py --quick   # 100 tasks, 1.5 s watchdog (~1.5-2 min)
    python benchmarks/deadlock.py           # 100 tasks, 5 s watchdog (~4 min); paper's tables

``--tasks``, ``--pages``, ``--hosts``, ``--watchdog`` and ``--heartbeat``
override the mode's values.

The last stdout line is a JSON object: ``naive_deadlock_rate``,
``banker_deadlock_rate`` (Locked / tasks), ``naive_total_wait_s``,
``banker_total_wait_s`` (sum over tasks of finish - first dispatch; a Locked
task counts the watchdog), ``naive_pages_per_s``, ``banker_pages_per_s``
(``response_received_count / elapsed_time_seconds``),
``naive_pages_per_s_nodeadlock``, ``banker_pages_per_s_nodeadlock``,
``naive_deadlock_rate_nodeadlock``, ``banker_deadlock_rate_nodeadlock``,
``safety_check_us_1000x4``, ``naive_safety_check_us_1000x4``,
``leaked_naive`` / ``leaked_banker`` (``banker/alloc/leaked/pages`` +
``banker/alloc/pages`` at close: must be 0), ``*_deferred_unsafe`` /
``*_deferred_insufficient``, ``*_reclaimed_timeout``,
``*_restarted_completed``, ``*_completed_late``, ``*_unstarted`` (the
no-hold run's keys end in ``_nodeadlock``), the workload parameters and
``runs`` with the details of each crawl (``active_pages_per_s`` among them:
responses per second from the first dispatch to the last response).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import _common
import _harness
import numpy as np
from _crawler import STEPS

from scrapy_banker.core.bankers_algorithm import BankersState, naive_safe_sequence
from scrapy_banker.testing.farm import FarmConfig, WebFarm

POLICIES: tuple[str, ...] = ("naive", "banker")
#: Latency range of the farm hosts (ms): spread evenly, host 0 fastest.
LATENCY_MS = (50.0, 100.0)
#: ``request.priority`` added per step: a task's later steps go before new tasks'
#: first steps.  A sensible spider finishes what it started; it is also the
#: naive allocator's best case (equal priorities lock nearly every task).
STEP_PRIORITY = 1
#: Final stats that must be 0: grants never released, units still allocated.
LEAK_KEYS = ("banker/alloc/leaked/pages", "banker/alloc/pages")


@dataclass(frozen=True)
class Workload:
    """Size of one benchmark mode."""

    tasks: int
    pages: int
    hosts: int
    watchdog_s: float
    heartbeat_s: float
    #: Safety-check micro-benchmark: timed calls of is_safe / naive_safe_sequence.
    check_repeats: int
    #: No-hold crawls per policy, in alternating order; pages/s is their median
    #: (the two policies' difference there is of the order of the noise).
    nodeadlock_repeats: int

    def budget_s(self) -> float:
        """CLOSESPIDER_TIMEOUT: room for every naive round to lock and be reclaimed.

        The worst case locks ``pages`` tasks per round; each round lasts the
        watchdog, up to two heartbeats (one to reclaim, one to retry what the
        reclaim freed), up to 1 s (the scheduler reclaims at most once a
        second) and the restarted tasks' steps.  Crawls normally end long
        before, when every task is done (the spider goes idle).
        """
        rounds = math.ceil(self.tasks / self.pages) + 2
        return round(rounds * (self.watchdog_s + 3 * self.heartbeat_s + 1.5) + 20.0, 1)

    def farm_config(self) -> FarmConfig:
        per_host = math.ceil(self.tasks / self.hosts) * STEPS
        low, high = LATENCY_MS
        spread = {i: low + (high - low) * i / max(1, self.hosts - 1) for i in range(self.hosts)}
        return FarmConfig(
            seed=11,
            hosts=self.hosts,
            total_pages=per_host * self.hosts,
            min_pages_per_host=per_host,
            zipf_s=0.0,
            links_per_page=0,
            cross_host_link_prob=0.0,
            latency_ms=high,
            host_latency_ms=spread,
        )


FULL = Workload(tasks=100, pages=4, hosts=8, watchdog_s=5.0, heartbeat_s=0.5,
                check_repeats=301, nodeadlock_repeats=3)  # fmt: skip
QUICK = replace(FULL, watchdog_s=1.5, heartbeat_s=0.15, check_repeats=101, nodeadlock_repeats=2)
#: Smoke tests: 12 tasks on 2 pages, deterministic enough to assert on.  The
#: 12 start requests are enqueued within milliseconds and the naive policy
#: grants the first two at once, long before the first response (>= 50 ms)
#: can come back; both pages are then held by step-1 tasks whose step 2 can
#: never be granted, so the first round always deadlocks (rate >= 2/12).
#: With 2 pages the Banker's policy lets only one task hold a page at a time
#: (two holders each needing one more with none free has no safe sequence),
#: and that task's step 2 always finds the other page free: no step-2
#: request ever waits, so none can be Locked whatever the timing.
TINY = replace(QUICK, tasks=12, pages=2, hosts=4, check_repeats=11, nodeadlock_repeats=1)


def chains(farm: WebFarm, workload: Workload) -> list[list[str]]:
    """Three distinct content-page URLs of host ``t % hosts`` for every task ``t``."""
    leaves = [
        [p for p in farm.model.paths(i) if p.endswith(".html")] for i in range(workload.hosts)
    ]
    out = []
    for t in range(workload.tasks):
        host, k = t % workload.hosts, t // workload.hosts
        out.append([farm.url(host, leaves[host][STEPS * k + s]) for s in range(STEPS)])
    return out


def crawl_settings(policy: str, workload: Workload, log_file: Path) -> dict[str, Any]:
    """Settings of one run: identical for both policies except the policy itself."""
    return {
        **_harness.farm_crawl_settings(),
        "SCHEDULER": "scrapy_banker.scheduler.BankerScheduler",
        "ADDONS": {"scrapy_banker.Addon": 500},
        "BANKER_RESOURCES": {"pages": workload.pages},
        "BANKER_ADMISSION_POLICY": policy,
        "BANKER_TASK_TIMEOUT": workload.watchdog_s,
        "BENCH_TASKS": workload.tasks,
        "BENCH_TASK_LOG": str(log_file),
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "CLOSESPIDER_TIMEOUT": workload.budget_s(),
    }


def classify(log: dict[str, Any], watchdog: float) -> list[dict[str, Any]]:
    """The paper's per-task log rows from the runner's dispatch/response times.

    ``start`` is the dispatch of step 1, ``finish`` the response of step 3.
    Completed: finished within ``watchdog`` of its start; its wait is
    ``finish - start``.  Locked: not finished by then (never, or only after
    the scheduler reclaimed and restarted it); its wait is the watchdog.
    Unstarted: step 1 never dispatched (the crawl budget ran out); no wait.
    """
    rows = []
    for t, (dispatch, response) in enumerate(zip(log["dispatch"], log["response"], strict=True)):
        start, finish = dispatch[0], response[STEPS - 1]
        if start is None:
            status, wait = "Unstarted", 0.0
        elif finish is not None and finish - start <= watchdog:
            status, wait = "Completed", finish - start
        else:
            status, wait = "Locked", watchdog
        rows.append(
            {
                "task": t,
                "status": status,
                "start": start,
                "finish": finish,
                "wait": wait,
                "restarted": bool(log["restarted"][t]),
            }
        )
    return rows


def _active_window(log: dict[str, Any]) -> float:
    """Seconds from the first dispatch to the last response: the crawl minus start-up and close."""
    dispatched = [t for steps in log["dispatch"] for t in steps if t is not None]
    answered = [t for steps in log["response"] for t in steps if t is not None]
    return max(answered) - min(dispatched) if dispatched and answered else math.nan


def run_crawl(
    policy: str, workload: Workload, hold: bool, workdir: Path, repeat: int = 0
) -> dict[str, Any]:
    """One crawl of a fresh farm with ``policy``; returns its figures and per-task rows."""
    tag = f"{policy}-{'hold' if hold else 'nohold'}-{repeat}"
    log_file = workdir / f"{tag}-tasks.json"
    with WebFarm(workload.farm_config()) as farm:
        spec = _harness.crawl_spec(
            "_crawler:DeadlockSpider",
            crawl_settings(policy, workload, log_file),
            spider_kwargs={
                "chains": chains(farm, workload),
                "hold": hold,
                "max_pages": 2 if hold else 1,
                "step_priority": STEP_PRIORITY,
            },
            extensions=["_crawler.TaskLog"],
            heartbeat_s=workload.heartbeat_s,
        )
        crawl = _harness.crawl(
            spec, workdir, tag, timeout=workload.budget_s() + 120, outputs=[log_file]
        )
        server = farm.stats()
    stats = crawl.stats
    log = json.loads(log_file.read_text(encoding="utf-8"))
    rows = classify(log, workload.watchdog_s)
    active = _active_window(log)
    locked = [r for r in rows if r["status"] == "Locked"]
    responses = int(stats.get("response_received_count", 0))
    elapsed = float(stats.get("elapsed_time_seconds") or math.nan)
    return {
        "deadlock_rate": len(locked) / workload.tasks,
        "locked": len(locked),
        "completed": sum(r["status"] == "Completed" for r in rows),
        "unstarted": sum(r["status"] == "Unstarted" for r in rows),
        # Locked tasks that still completed: re-admitted as a new task after the
        # admission reclaimed them (the paper's restart), or merely late.
        "restarted_completed": sum(r["finish"] is not None and r["restarted"] for r in locked),
        "completed_late": sum(r["finish"] is not None and not r["restarted"] for r in locked),
        "total_wait_s": sum(r["wait"] for r in rows),
        "pages_per_s": responses / elapsed if elapsed > 0 else math.nan,
        "active_pages_per_s": responses / active if active > 0 else math.nan,
        "responses": responses,
        "elapsed_s": elapsed,
        "active_s": active,
        "wall_s": crawl.wall_s,
        "finish_reason": stats.get("finish_reason"),
        "leaked": sum(int(stats.get(k, 0) or 0) for k in LEAK_KEYS),
        "alloc_leaked_pages": int(stats.get(LEAK_KEYS[0], 0) or 0),
        "alloc_pages_at_close": int(stats.get(LEAK_KEYS[1], 0) or 0),
        "deferred_unsafe": int(stats.get("banker/admission/deferred/unsafe", 0) or 0),
        "deferred_insufficient": int(stats.get("banker/admission/deferred/insufficient", 0) or 0),
        "granted": int(stats.get("banker/admission/granted", 0) or 0),
        "tasks_finished": int(stats.get("banker/task/finished", 0) or 0),
        "reclaimed_timeout": int(stats.get("banker/task/reclaimed_timeout", 0) or 0),
        "reclaimed_close": int(stats.get("banker/task/reclaimed_close", 0) or 0),
        "invalid": int(stats.get("banker/admission/invalid", 0) or 0),
        "server_requests": server.get("requests"),
        "rows": rows,
    }


# -- the safety check micro-benchmark ---------------------------------------------------


def random_safe_state(n: int, m: int, seed: int = 1) -> BankersState:
    """A random safe state of ``n`` processes x ``m`` resources, via the public API.

    Maximum claims are 1-40 units per resource, allocations a random part of
    them and the free pool only 20 units per resource, so most processes
    cannot finish from the free pool alone: the check has to retire processes
    and reuse their allocations, several sweeps deep.  Built with
    ``check_safety=False`` (1,000 checks of a growing state would only slow
    the set-up); the result is verified safe with both algorithms.
    """
    rng = np.random.default_rng(seed)
    claims = rng.integers(1, 41, size=(n, m))
    alloc = (claims * rng.random((n, m))).astype(np.int64)
    names = [f"r{j}" for j in range(m)]
    totals = alloc.sum(axis=0) + 20
    state = BankersState({r: int(v) for r, v in zip(names, totals, strict=True)})
    for i in range(n):
        state.add_process(i, {r: int(v) for r, v in zip(names, claims[i], strict=True)})
        granted = state.request(
            i, {r: int(v) for r, v in zip(names, alloc[i], strict=True)}, check_safety=False
        )
        assert granted, "the pool covers every allocation"
    return state


def _median_us(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def safety_check_us(workload: Workload, n: int = 1000, m: int = 4) -> dict[str, float]:
    """Median µs of ``is_safe()`` and of ``naive_safe_sequence`` on one random safe state."""
    state = random_safe_state(n, m)
    snap = state.snapshot()
    procs = snap["processes"].values()
    resources = list(snap["total"])
    available = [snap["available"][r] for r in resources]
    allocation = [[p["allocation"][r] for r in resources] for p in procs]
    need = [[p["need"][r] for r in resources] for p in procs]
    if not state.is_safe() or naive_safe_sequence(available, allocation, need) is None:
        raise SystemExit("deadlock: the random state for the safety check is not safe")
    fast = _median_us(state.is_safe, workload.check_repeats)
    slow = _median_us(
        lambda: naive_safe_sequence(available, allocation, need),
        max(5, workload.check_repeats // 10),
    )
    return {"fast_us": fast, "naive_us": slow}


# -- reporting ------------------------------------------------------------------------------


def hms(seconds: float) -> str:
    """``h:mm:ss.s`` like the paper's tables (which have whole seconds)."""
    minutes, sec = divmod(seconds, 60.0)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{sec:04.1f}"


def sample_rows(rows: Sequence[dict[str, Any]], head: int = 5) -> list[dict[str, Any]]:
    """A few rows as in the paper's Tables 1/2: the first tasks, the first later
    Locked and Completed ones, and the last task; in task order."""
    picked = {r["task"] for r in rows[:head]}
    for status in ("Locked", "Completed"):
        later = next((r for r in rows[head:] if r["status"] == status), None)
        if later is not None:
            picked.add(later["task"])
    if rows:
        picked.add(rows[-1]["task"])
    return [r for r in rows if r["task"] in picked]


def print_tables(runs: dict[str, dict[str, Any]], workload: Workload) -> None:
    """The paper's Tables 1/2: a few rows of each algorithm's per-task log."""
    for number, policy in ((1, "naive"), (2, "banker")):
        print(f"\nTable {number}: {policy} crawl log (start: s since the crawl opened)")
        print(f"  {'event':<20} {'start':>9} {'wait':>9} {'timeout':>9}  after the watchdog")
        previous = -1
        for row in sample_rows(runs[policy]["rows"]):
            if row["task"] != previous + 1:
                print(f"  {'...':<20}")
            previous = row["task"]
            start = "-" if row["start"] is None else hms(row["start"])
            note = ""
            if row["status"] == "Locked":
                if row["finish"] is None:
                    note = "never finished"
                elif row["restarted"]:
                    note = "reclaimed; restarted by the scheduler, completed"
                else:
                    note = "completed late"
            print(
                f"  {row['status'] + ':Task' + str(row['task'] + 1):<20} {start:>9} "
                f"{hms(row['wait']):>9} {hms(workload.watchdog_s):>9}  {note}"
            )


def print_table3(runs: dict[str, dict[str, Any]]) -> None:
    """The paper's Table 3: total wait, deadlocks and deadlock rate per algorithm."""
    print("\nTable 3: comparison (hold-and-wait workload)")
    print(f"  {'algorithm':<10} {'total wait':>11} {'deadlocks':>10} {'deadlock rate':>14}")
    for policy in POLICIES:
        run = runs[policy]
        print(
            f"  {policy:<10} {hms(run['total_wait_s']):>11} {run['locked']:>10} "
            f"{run['deadlock_rate']:>13.0%}"
        )
    print(
        "  (paper, 100 tasks, 2-minute timeout: urllib2 2:09:07, 30 deadlocks, 30 %; "
        "Banker's 1:38:28, 2 deadlocks, 2 %)"
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="1.5 s watchdog (~1.5-2 min)", tiny="")
    parser.add_argument("--tasks", type=int, default=None, help="task chains per crawl")
    parser.add_argument("--pages", type=int, default=None, help="BANKER_RESOURCES pages")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts the tasks use")
    parser.add_argument("--watchdog", type=float, default=None, help="timeout per task (s)")
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=None,
        help="Scrapy engine heartbeat (s); default watchdog / 10, stock Scrapy 5",
    )
    return parser.parse_args(argv)


def _workload(args: argparse.Namespace) -> Workload:
    base = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        tasks="tasks", pages="pages", hosts="hosts", watchdog_s="watchdog",
    )  # fmt: skip
    heartbeat = args.heartbeat if args.heartbeat is not None else base.watchdog_s / 10
    return replace(base, heartbeat_s=heartbeat)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    workload = _workload(args)
    if workload.pages < 2:
        raise SystemExit("deadlock: --pages must be >= 2 (a task's claim is 2 pages)")
    started = time.perf_counter()
    print(
        f"{workload.tasks} tasks x {STEPS} requests on {workload.hosts} hosts "
        f"({LATENCY_MS[0]:g}-{LATENCY_MS[1]:g} ms), {workload.pages} pages, claim 2 pages/task; "
        f"watchdog {workload.watchdog_s:g} s, engine heartbeat {workload.heartbeat_s:g} s, "
        f"budget {workload.budget_s():g} s per crawl",
        flush=True,
    )
    jobs = [(policy, True, 0) for policy in POLICIES]
    for repeat in range(workload.nodeadlock_repeats):
        order = POLICIES if repeat % 2 == 0 else POLICIES[::-1]
        jobs += [(policy, False, repeat) for policy in order]
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="deadlock-") as tmp:
        for policy, hold, repeat in jobs:
            run = run_crawl(policy, workload, hold, Path(tmp), repeat)
            print(
                f"  {policy:<6} {'hold-and-wait' if hold else f'no-hold #{repeat + 1}':<13} "
                f"{run['locked']:>3} Locked / {run['completed']} Completed; "
                f"total wait {run['total_wait_s']:.1f} s; {run['pages_per_s']:.1f} pages/s "
                f"({run['responses']} in {run['elapsed_s']:.1f} s); deferred "
                f"unsafe {run['deferred_unsafe']} insufficient {run['deferred_insufficient']}; "
                f"reclaimed {run['reclaimed_timeout']}; Locked then completed: "
                f"{run['restarted_completed']} restarted, {run['completed_late']} late; "
                f"leaked {run['leaked']}",
                flush=True,
            )
            if run["unstarted"]:
                print(f"  warning: {run['unstarted']} tasks never started: budget too short")
            # A repeated no-hold crawl contributes its pages/s (and any leak);
            # the other figures are the first crawl's.
            name = policy + ("" if hold else "_nodeadlock")
            first = runs.setdefault(name, run)
            first.setdefault("pages_per_s_samples", []).append(run["pages_per_s"])
            first["leaked"] = max(first["leaked"], run["leaked"])
    for run in runs.values():
        run["pages_per_s"] = statistics.median(run["pages_per_s_samples"])
    check = safety_check_us(workload)
    print(
        f"safety check, 1,000 processes x 4 resources: is_safe {check['fast_us']:.0f} us, "
        f"naive_safe_sequence {check['naive_us']:.0f} us "
        f"({_common.ratio(check['naive_us'], check['fast_us']):.1f}x)"
    )
    naive, banker = runs["naive"], runs["banker"]
    naive_nd, banker_nd = runs["naive_nodeadlock"], runs["banker_nodeadlock"]
    if _harness.mode(args) == "full":
        print_tables(runs, workload)
    print_table3(runs)
    met = banker["locked"] == 0 and naive["deadlock_rate"] >= 0.2
    print(
        f"\nbanker deadlock rate {banker['deadlock_rate']:.0%} vs naive "
        f"{naive['deadlock_rate']:.0%} (target: banker 0 where naive >= 20%: "
        f"{'met' if met else 'MISSED'})"
    )
    nd_ratio = _common.ratio(banker_nd["pages_per_s"], naive_nd["pages_per_s"])
    print(
        _common.target_line("banker vs naive pages/s without deadlocks", nd_ratio, 1.0)
        + f"; {banker_nd['pages_per_s']:.1f} vs {naive_nd['pages_per_s']:.1f} pages/s, "
        "same grants, run-to-run noise ~1-2%"
    )
    print(f"total time {time.perf_counter() - started:.1f} s")

    out: dict[str, Any] = {
        "tasks": workload.tasks,
        "pages": workload.pages,
        "hosts": workload.hosts,
        "watchdog_s": workload.watchdog_s,
        "heartbeat_s": workload.heartbeat_s,
        "budget_s": workload.budget_s(),
        "safety_check_us_1000x4": _common.rounded(check["fast_us"], 1),
        "naive_safety_check_us_1000x4": _common.rounded(check["naive_us"], 1),
        "runs": {name: {k: v for k, v in run.items() if k != "rows"} for name, run in runs.items()},
    }
    for name, run in runs.items():
        policy, _, suffix = name.partition("_")
        suffix = f"_{suffix}" if suffix else ""
        out[f"{policy}_deadlock_rate{suffix}"] = _common.rounded(run["deadlock_rate"])
        out[f"{policy}_pages_per_s{suffix}"] = _common.rounded(run["pages_per_s"], 2)
        out[f"{policy}_total_wait_s{suffix}"] = _common.rounded(run["total_wait_s"], 3)
        out[f"{policy}_deferred_unsafe{suffix}"] = run["deferred_unsafe"]
        out[f"{policy}_deferred_insufficient{suffix}"] = run["deferred_insufficient"]
        out[f"{policy}_reclaimed_timeout{suffix}"] = run["reclaimed_timeout"]
        out[f"{policy}_restarted_completed{suffix}"] = run["restarted_completed"]
        out[f"{policy}_completed_late{suffix}"] = run["completed_late"]
        out[f"{policy}_unstarted{suffix}"] = run["unstarted"]
        out[f"leaked_{policy}{suffix}"] = run["leaked"]
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
