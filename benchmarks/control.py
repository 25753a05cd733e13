"""Budgets and run-time control of a fleet: budgets, pause, limit, purge, inject (issue #27).

Exact budgets through a kill and a join, and an operator's ``pause``,
``limit``, ``delay``, ``purge`` and ``inject`` from the command line.

Why
    An operator running a broad crawl needs limits that hold across the
    whole fleet (a per-host, a per-topic and a crawl-wide page budget) and
    a way to act on one site without stopping everything.  This benchmark
    runs a real fleet against the web farm, loses a worker to ``SIGKILL``
    and gains one mid-crawl, acts on it through the real ``scrapy banker``
    command line, and lets the farm say what happened: which pages each
    host served and when each of its requests arrived and left
    (``farm.stats(urls=True)``: ``fetches`` and ``host_events``).  Nothing
    is taken from the workers' own word but their exit codes and stats,
    reported beside the figures.

The farm and the fleet
    ``scrapy_banker.testing.farm`` (``--seed``) with hosts of one size
    (``zipf_s=0``: the crawl progresses evenly and every host stays busy
    until near its end, so an action always meets a busy host), links
    inside a host and across hosts, and a long latency (800 ms,
    ``--latency-ms``) that stretches the crawl rather than many pages: this
    is a 2-core machine.  ``--quick``: 24 hosts of 25 content pages (~700
    URLs); the full run: 32 hosts of 50 (~1,730); ``--tiny`` (the smoke
    test's): 12 hosts of 25 at 600 ms.  Four worker processes
    (``scrapy_banker.testing.fleet``: the plain farm spider, every host root
    a seed) of ``BankerRedisScheduler`` with the add-on on one
    redis-server, ``CONCURRENT_REQUESTS=16`` (every host can have its 2 in
    flight), ``CONCURRENT_REQUESTS_PER_DOMAIN=2``, Twisted's epoll reactor
    (see ``distributed.py``), ``BANKER_REDIS_HEARTBEAT`` = ``--heartbeat``
    (1 s); the lease TTL is 4 heartbeats, the node timeout 3, the reaper 1,
    so a kill is recovered from within seconds.

The hosts' roles (disjoint, from the farm's model, so every figure is exact)
    * the paused host (``pause`` / ``resume``): ``h0000``;
    * the limited host (``limit HOST 1``, lifted with ``limit HOST none``
      when the paused host is resumed): ``h0001``;
    * the purged host (``purge HOST``): ``h0002``;
    * the delayed host (``delay HOST 0.5``, for good): ``h0003``;
    * budgeted hosts: 20 % of the hosts, every fifth of the others, with
      ``BANKER_HOST_BUDGETS`` of 30 %, 50 % or 70 % of their pages in turn;
      the last one by an ``fnmatch`` pattern (``h0029.*`` in the full run),
      the others by name;
    * topic hosts: 10 % of the hosts; their content pages under
      ``/products/`` are topic ``shop`` (``BANKER_TOPIC_RULES``: one URL
      regex; every other request has the default topic), whose budget
      (``BANKER_TOPICS = {"shop": {"budget": N}}``) is half of them.  Their
      ``/products/`` index stays in the default topic, so every shop page is
      found whatever the budget lets through;
    * the injected URLs (``--inject``, 40 / 20 / 10): URLs no link leads to,
      a content page of a host without a role plus ``?injected=K`` (the farm
      answers 200 whatever the query), spread over those hosts.

Phase 1: budgets and control (4 workers, one killed, one added)
    Progress is the farm's request counter over the pages the budgets
    allow; each step waits for the one before it (a command takes about a
    second, so the shares are the earliest a step runs; ``events`` in
    ``runs`` says when each ran).  At 20 % the operator runs ``pause``, then
    ``limit`` and ``delay``; at 30 % worker ``w1`` is killed (``SIGKILL``);
    at 35 % ``purge``, then ``deadletters --json`` (which requests were
    purged) and ``inject`` (after the kill, so the dead worker's partitions
    are in play); at 50 % (at the latest 8 s after the kill) worker ``w4``
    joins; once the host has been paused ``--pause-s`` (8 / 5 / 4 s) and
    the joiner has had 3 s, ``resume`` and ``limit HOST none``.  The pause
    and the limit are thus in force through the kill and the rebalance of
    the join.  Each command is ``python -m scrapy.cmdline banker VERB ...
    --prefix banker:fleet --json`` with the workers' ``BANKER_*`` and
    ``REDIS_URL`` settings as ``-s``, as an operator in the project runs
    it; a command's time is when it returned.  After the crawl ``control
    --json`` shows the document, the budget counts and the action log.

Phase 2: the crawl budget (a fresh crawl of the same farm)
    ``BANKER_CRAWL_BUDGET`` closes the whole crawl once it is spent, which
    would cut phase 1's measurements short and leave its host and topic
    budgets unreached (no underrun could be judged): it gets a short crawl
    of its own.  Redis flushed, the farm's counters reset, the same
    settings plus ``BANKER_CRAWL_BUDGET`` = 60 % of the pages the other
    budgets allow, ``w1`` killed at 30 % of it and ``w4`` added at 55 %, no
    operator action.  Only the crawl budget's underrun is judged here (the
    other budgets are cut short by it); every budget's overrun is.

What is measured (the last stdout line is one JSON object)
    * ``budget_overrun``: pages fetched beyond any budget, fleet-wide: for
      each budgeted host, distinct pages the farm served minus its budget
      (when positive), summed, plus the same for the topic (distinct shop
      pages served minus its budget), in both phases, plus phase 2's crawl
      overrun (distinct pages served minus the crawl budget);
    * ``budget_underrun``: budgets that stopped short while work remained:
      budgeted hosts of phase 1 with fewer distinct pages served than
      ``min(budget, pages)``, plus 1 if the topic did (shop pages served <
      ``min(budget, shop pages)``), plus 1 if phase 2 served fewer pages
      than its crawl budget (the crawl had more than that);
    * ``control_latency_s``: the larger of ``control_latency_pause_s``
      (from the ``pause`` command's return to the last request the paused
      host received before the ``resume`` started; 0 if none) and
      ``control_latency_limit_s`` (from the ``limit`` command's return to
      the moment the limited host's requests in flight, replayed from the
      farm's ``host_events``, are at or below the limit for good, i.e.
      until the limit is lifted; 0 if they already were);
    * ``paused_fetches``: requests the paused host received from 2
      heartbeats after the ``pause`` command's return to the start of the
      ``resume``;
    * ``injected_fetched``: the share of the injected URLs the farm served;
    * ``heartbeat_s``: ``BANKER_REDIS_HEARTBEAT`` of the workers;
    * beside them: ``budget_overrun_hosts`` / ``_topic`` / ``_crawl`` and
      ``budget_underrun_hosts`` / ``_topic`` / ``_crawl``; ``crawl_budget``,
      ``crawl_served`` and ``crawl_budget_finish_reasons`` (how phase 2's
      surviving workers closed: ``banker_crawl_budget`` is documented);
      ``limit_excess`` (requests that put the limited host over its limit
      later than 2 heartbeats after the command); ``delay_violations`` /
      ``delay_min_gap_s`` (gaps between the delayed host's requests shorter
      than 95 % of the delay, from 2 heartbeats after the command);
      ``purged`` (requests the purge dead-lettered) and ``purged_fetched``
      (fetches of those after the purge); ``pages_missing`` (phase 1 pages
      no budget held back and the purge did not take that were never
      served: the paused host's pages waited, nothing else was lost);
      ``duplicates`` (fetches beyond the first of a URL, both phases: the
      killed worker's leases are fetched again); ``wall_s_phase1`` /
      ``wall_s_phase2`` (first request received to last answer sent, as the
      farm saw it), ``process_wall_s_phase1`` / ``_phase2`` (first worker
      start to last exit); and ``runs``: every repetition's details (when
      each step ran, each command and how long it took, how busy the hosts
      were when acted on, the latencies counted from a command's start
      too, per-budgeted-host ``[served, budget, pages]``, the workers' exit
      codes, finish reasons and budget/control stats, the control
      document's state, held counts and action log).

Targets (``target_*``, all of them in ``targets_met``)
    ``budget_overrun == 0`` and ``budget_underrun == 0`` through the kill
    and the join, ``control_latency_s <= 2 * heartbeat_s``,
    ``paused_fetches == 0``, ``injected_fetched == 1.0``, and beside the
    issue's, ``purged_fetched == 0`` and ``pages_missing == 0``.  With
    ``--repeats`` > 1 the count keys (overruns, underruns, paused fetches,
    limit excess, delay violations, purged fetched, pages missing,
    duplicates) are the worst repetition, ``injected_fetched`` the least,
    the times the median (``worst_control_latency_s`` beside it), and the
    targets are judged on the worst repetition.

Usage::

    python benchmarks/control.py --quick        # 24 hosts, ~45 s
    python benchmarks/control.py                # 32 hosts, ~65 s
    python benchmarks/control.py --repeats 3    # worst counts, median times of 3

``--seed``, ``--hosts``, ``--pages``, ``--latency-ms``, ``--heartbeat``,
``--pause-s``, ``--inject N`` and ``--set KEY=JSON`` (a worker setting,
repeatable) override the mode; ``--keep`` keeps the workers' logs and stats
(the path is on stderr).  Progress goes to stderr, a summary to stdout;
``targets_met`` false is reported, never an exit status.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import _common
import _fleet
import _harness
from _common import log

from scrapy_banker.testing.farm import FarmConfig, FarmModel, WebFarm
from scrapy_banker.testing.redis_server import RedisServer

PREFIX = "banker:fleet"  # BANKER_REDIS_PREFIX "banker:%(spider)s" of the spider "fleet"
TOPIC = "shop"
VICTIM, JOINER = "w1", "w4"
#: The joiner starts at the latest this long (s) after the kill.
JOIN_AFTER_KILL_S = 8.0
#: The resume waits this long (s) after the joiner started.
RESUME_AFTER_JOIN_S = 3.0
DELAY_S = 0.5
LIMIT = 1
#: Gaps shorter than this share of the delay count as violations (clock and network jitter).
DELAY_TOLERANCE = 0.95
SAMPLE_S = 0.1
#: Budgets of the budgeted hosts, as shares of their pages, in turn.
BUDGET_SHARES = (0.3, 0.5, 0.7)
#: Worker stats summed per phase.
WORKER_STATS = (
    "banker/budget/held", "banker/budget/released", "banker/control/updates",
    "banker/redis/redelivered", "downloader/response_status_count/200",
)  # fmt: skip
#: Count keys judged on the worst repetition (their targets are zero).
ZERO_KEYS = (
    "budget_overrun", "budget_underrun", "paused_fetches", "purged_fetched", "pages_missing",
)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """Size of one benchmark mode."""

    hosts: int
    total_pages: int
    latency_ms: float
    #: How long (s) the paused host stays paused at least.
    pause_s: float
    injected: int
    repeats: int = 1
    timeout_s: float = 240.0
    #: Zipf exponent of the hosts' sizes: 0, every host the same size, so the crawl
    #: progresses evenly and every host is busy until near its end.
    zipf_s: float = 0.0
    workers: int = 4
    concurrent: int = 16
    per_host: int = 2
    heartbeat_s: float = 1.0
    #: Shares of the allowed pages served when each step of phase 1 runs.
    pause_at: float = 0.2
    kill_at: float = 0.3
    purge_at: float = 0.35
    join_at: float = 0.5
    #: Phase 2: the crawl budget as a share of the allowed pages; kill and join shares of it.
    crawl_budget_share: float = 0.6
    kill_at_2: float = 0.3
    join_at_2: float = 0.55
    host_budget_share: float = 0.2
    topic_host_share: float = 0.1

    def farm_config(self, seed: int) -> FarmConfig:
        return FarmConfig(seed=seed, hosts=self.hosts, total_pages=self.total_pages,
                          zipf_s=self.zipf_s, latency_ms=self.latency_ms)  # fmt: skip


FULL = Workload(hosts=32, total_pages=1600, latency_ms=800.0, pause_s=8.0, injected=40)
QUICK = Workload(hosts=24, total_pages=600, latency_ms=800.0, pause_s=5.0, injected=20)
TINY = Workload(hosts=12, total_pages=300, latency_ms=600.0, pause_s=3.0, injected=10,
                timeout_s=120.0)  # fmt: skip


# -- the plan: roles, budgets, topic, injected URLs ------------------------------------------


@dataclass
class Plan:
    """Who is what, every budget, and the pages each budget allows (from the farm's model)."""

    model: FarmModel
    port: int
    paused: str
    limited: str
    purged: str
    delayed: str
    budgets: dict[str, int]
    budget_patterns: dict[str, int]
    topic_hosts: list[str]
    topic_regex: str
    topic_budget: int
    topic_pages: set[str]
    injected: list[str]
    expected: dict[str, set[str]]
    #: Pages phase 1 may serve: every expected page, budgeted hosts and the topic capped.
    allowed: int

    def host_of(self, url: str) -> str:
        return urlsplit(url).hostname or ""

    def in_topic(self, url: str) -> bool:
        return re.search(self.topic_regex, url) is not None


def plan(farm: WebFarm, config: FarmConfig, workload: Workload) -> Plan:
    model = FarmModel(config)
    port = farm.port
    names = [model.host_name(i) for i in range(model.hosts)]
    # Hosts are numbered by size, largest first (FarmModel keeps Zipf counts non-increasing).
    paused, limited, purged, delayed = names[:4]
    rest = names[4:]
    n_budgeted = max(1, round(workload.host_budget_share * model.hosts))
    n_topic = max(1, round(workload.topic_host_share * model.hosts))
    budgeted = rest[0::5][:n_budgeted]
    others = [h for h in rest if h not in budgeted]
    topic_hosts = others[1::4][:n_topic]
    free = [h for h in others if h not in topic_hosts]
    expected: dict[str, set[str]] = {}
    for url in model.expected_urls(port):
        expected.setdefault(urlsplit(url).hostname or "", set()).add(url)
    budgets = {
        h: max(2, round(BUDGET_SHARES[k % len(BUDGET_SHARES)] * len(expected[h])))
        for k, h in enumerate(budgeted)
    }
    # The last budgeted host by an fnmatch pattern, the others by name.
    last = budgeted[-1]
    patterns = {h: b for h, b in budgets.items() if h != last}
    patterns[last.split(".", 1)[0] + ".*"] = budgets[last]
    alternatives = "|".join(re.escape(h) for h in topic_hosts)
    topic_regex = rf"//(?:{alternatives}):\d+/products/\d+\.html$"
    topic_pages = {
        u for h in topic_hosts for u in expected[h] if re.search(topic_regex, u) is not None
    }
    topic_budget = max(1, len(topic_pages) // 2)
    injected = []
    for k in range(workload.injected):
        host = free[k % len(free)]
        i = model.host_index(host)
        assert i is not None
        leaves = [p for p in model.paths(i) if p.endswith(".html")]
        path = leaves[(k // len(free)) % len(leaves)]
        injected.append(f"{model.url(i, path, port)}?injected={k}")
    allowed = sum(min(b, len(expected[h])) for h, b in budgets.items())
    allowed += sum(len(p) for h, p in expected.items() if h not in budgets)
    allowed -= len(topic_pages) - min(topic_budget, len(topic_pages))
    return Plan(model, port, paused, limited, purged, delayed, budgets, patterns, topic_hosts,
                topic_regex, topic_budget, topic_pages, injected, expected, allowed)  # fmt: skip


def worker_settings(
    workload: Workload, p: Plan, redis_url: str, reactor: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """Every worker's settings but its node id (the CLI gets the ``BANKER_*`` ones too)."""
    hb = workload.heartbeat_s
    return {
        **_common.BANKER_REDIS,
        "REDIS_URL": redis_url,
        "TWISTED_REACTOR": reactor,
        "CONCURRENT_REQUESTS": workload.concurrent,
        "CONCURRENT_REQUESTS_PER_DOMAIN": workload.per_host,
        "DOWNLOAD_DELAY": 0,
        "LOG_LEVEL": "INFO",
        "BANKER_REDIS_HEARTBEAT": hb,
        "BANKER_REDIS_LEASE_TTL": 4 * hb,
        "BANKER_REDIS_NODE_TIMEOUT": 3 * hb,
        "BANKER_REDIS_REAP_INTERVAL": hb,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 2.0,
        "BANKER_HOST_BUDGETS": p.budget_patterns,
        "BANKER_TOPICS": {TOPIC: {"budget": p.topic_budget}},
        "BANKER_TOPIC_RULES": [{"url": p.topic_regex, "topic": TOPIC}],
        **extra,
    }


# -- the operator ----------------------------------------------------------------------------


@dataclass
class Operator:
    """``scrapy banker VERB ...`` against the fleet, as an operator runs it; every call logged."""

    settings: dict[str, Any]
    t0: float
    calls: list[dict[str, Any]] = field(default_factory=list)
    #: When the last command started (wall clock).
    started: float = 0.0

    def __call__(
        self, *args: str, json_out: bool = True, required: bool = True
    ) -> tuple[dict[str, Any], float]:
        """Run the command; its JSON answer and the wall-clock time it returned.

        A failure ends the benchmark, unless not ``required``: then it is logged and
        the answer is ``{"error": ...}``.
        """
        opts = [arg for k, v in self.settings.items() if k.startswith(("BANKER_", "REDIS_"))
                and k != "BANKER_REDIS_NODE_ID"
                for arg in ("-s", f"{k}={v if isinstance(v, str) else json.dumps(v)}")]  # fmt: skip
        cmd = [sys.executable, "-m", "scrapy.cmdline", "banker", *args, "--prefix", PREFIX, *opts]
        if json_out:
            cmd.append("--json")
        started = self.started = time.time()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, check=False,
            cwd=_harness.ROOT, env={**os.environ, "PYTHONPATH": str(_harness.ROOT)},
        )  # fmt: skip
        returned = time.time()
        verb = args[0]
        shown = list(args[1:3]) if verb != "inject" else [f"{len(args) - 1} URLs"]
        self.calls.append({
            "verb": verb, "args": shown, "t": round(started - self.t0, 2),
            "took_s": round(returned - started, 2), "code": proc.returncode,
        })  # fmt: skip
        if proc.returncode != 0 and not required:
            log(f"!! `scrapy banker {verb}` failed (exit code {proc.returncode}): "
                f"{proc.stderr.strip().splitlines()[-1:]}")  # fmt: skip
            return {"error": proc.stderr[-2000:]}, returned
        if proc.returncode != 0:
            raise SystemExit(f"control: `scrapy banker {verb}` failed "
                             f"(exit code {proc.returncode}): {proc.stderr[-2000:]}")  # fmt: skip
        out: dict[str, Any] = json.loads(proc.stdout) if json_out else {}  # indented JSON
        log(f"    t={started - self.t0:6.1f} banker {' '.join(args[:3])}"
            f"{' ...' if len(args) > 3 else ''} ({returned - started:.1f} s)")  # fmt: skip
        return out, returned


# -- one phase ---------------------------------------------------------------------------


@dataclass
class Step:
    """One scheduled step: runs once ``due(progress, now)`` holds."""

    name: str
    due: Callable[[float, float], bool]
    act: Callable[[float], None]
    done: bool = False


class Phase:
    """A fleet crawl of the farm with a schedule of steps keyed on the farm's progress."""

    def __init__(self, name: str, farm: WebFarm, workdir: Path, settings: dict[str, Any],
                 seeds: list[str], workload: Workload, total: int) -> None:  # fmt: skip
        self.name = name
        self.farm = farm
        self.settings = settings
        self.seeds = seeds
        self.workload = workload
        self.total = total
        self.fleet = _fleet.Fleet(workdir, timeout_s=workload.timeout_s)
        self.t0_wall = time.time()
        self.events: list[dict[str, Any]] = []
        self.requests = 0
        self.steps: list[Step] = []

    def start(self, node: str) -> None:
        self.fleet.start(node, {**self.settings, "BANKER_REDIS_NODE_ID": node},
                         spider="farm", seeds=self.seeds)  # fmt: skip

    def event(self, kind: str, what: str) -> None:
        t = round(time.time() - self.t0_wall, 2)
        self.events.append({"kind": kind, "what": what, "t": t, "requests": self.requests})
        log(f"    t={t:6.1f} {kind} {what} ({self.requests:,}/{self.total:,} pages)")

    def kill(self, node: str) -> None:
        if self.fleet.running(node):
            self.fleet.kill(node)
            self.event("kill", node)

    def join(self, node: str) -> None:
        self.start(node)
        self.event("join", node)

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.fleet.stop_all()  # nothing left behind, whatever went wrong

    def _run(self) -> None:
        for i in range(self.workload.workers):
            self.start(f"w{i}")
        while True:
            now = time.monotonic()
            try:
                self.requests = int(self.farm.stats()["requests"])
            except (OSError, RuntimeError, ValueError) as exc:
                log(f"    (farm not read: {exc!r})")
            progress = self.requests / max(1, self.total)
            if not self.fleet.all_exited():
                for step in self.steps:
                    if not step.done and step.due(progress, now):
                        step.done = True
                        step.act(now)
            if self.fleet.poll(time.monotonic()):
                break
            time.sleep(SAMPLE_S)
        self.fleet.wait(30)
        undone = [s.name for s in self.steps if not s.done]
        if undone:
            log(f"!! {self.name}: steps never due: {undone}")

    def result(self) -> dict[str, Any]:
        stats = self.fleet.stats()
        names = list(self.fleet.workers)
        codes = dict(zip(names, self.fleet.exit_codes(), strict=True))
        bad = [n for n, c in codes.items() if c != 0 and n != VICTIM]
        if bad or self.fleet.timed_out:
            self.fleet.log_tails(self.name, bad or None)
        return {
            "exit_codes": codes,
            "timed_out": self.fleet.timed_out,
            "finish_reasons": {
                n: s.get("finish_reason") for n, s in zip(names, stats, strict=True)
            },
            "worker_stats": {k: _fleet.sum_stat(stats, k) for k in WORKER_STATS},
            "process_wall_s": round(self.fleet.end - self.fleet.t0, 2),
            "events": self.events,
        }


# -- measuring from the farm's bookkeeping ---------------------------------------------------


def pages_by_host(fetches: dict[str, int]) -> dict[str, set[str]]:
    """Distinct pages each host served (any answer: a page fetched is a page fetched)."""
    out: dict[str, set[str]] = {}
    for url in fetches:
        if not url.endswith("/robots.txt"):
            out.setdefault(urlsplit(url).hostname or "", set()).add(url)
    return out


def budget_figures(p: Plan, served: dict[str, set[str]]) -> dict[str, Any]:
    """Overruns and underruns of the host and topic budgets, and their per-host detail."""
    per_host: dict[str, list[int]] = {}
    over = under = 0
    for host, budget in p.budgets.items():
        n = len(served.get(host, set()))
        per_host[host] = [n, budget, len(p.expected[host])]
        over += max(0, n - budget)
        under += n < min(budget, len(p.expected[host]))
    shop = sum(1 for pages in served.values() for u in pages if p.in_topic(u))
    return {
        "overrun_hosts": over,
        "underrun_hosts": under,
        "overrun_topic": max(0, shop - p.topic_budget),
        "underrun_topic": int(shop < min(p.topic_budget, len(p.topic_pages))),
        "topic_served": shop,
        "per_budgeted_host": per_host,  # host -> [served, budget, pages]
    }


def arrivals(events: list[list[float]]) -> list[float]:
    return [t for t, kind in events if kind == 1]


def limit_latency(
    events: list[list[float]], since: float, until: float, limit: int, grace: float
) -> tuple[float, int]:
    """From ``since`` to when the host's in-flight count (replayed from its ``host_events``)
    is at or below ``limit`` for good, up to ``until``; and how many arrivals later than
    ``since + grace`` put it over."""
    n = 0
    ok_at = since
    excess = 0
    for t, kind in events:
        if t >= until:
            break
        before = n
        n += int(kind)
        if t < since:
            continue
        if before > limit >= n:
            ok_at = max(ok_at, t)  # the end of an over-limit stretch
        if kind == 1 and n > limit:
            ok_at = max(ok_at, t)
            excess += t > since + grace
    if n > limit:  # still over at the end of the window: never in force
        ok_at = until
    return ok_at - since, excess


def inflight_at(events: list[list[float]], t: float) -> int:
    return sum(int(k) for at, k in events if at <= t)


# -- the phases ----------------------------------------------------------------------------


def phase1(p: Plan, farm: WebFarm, redis_url: str, settings: dict[str, Any],
           workload: Workload, workdir: Path) -> dict[str, Any]:  # fmt: skip
    seeds = _fleet.fresh(farm, redis_url)
    ph = Phase("phase1", farm, workdir, settings, seeds, workload, p.allowed)
    op = Operator(settings, ph.t0_wall)
    hb = workload.heartbeat_s
    marks: dict[str, Any] = {}

    def busy(host: str) -> int:
        return int(farm.stats()["inflight"].get(host, 0))

    def controls(now: float) -> None:
        marks["pause_inflight"] = busy(p.paused)
        _, marks["pause_t"] = op("pause", p.paused)
        marks["pause_started"] = op.started
        ph.event("pause", p.paused)
        marks["pause_mono"] = time.monotonic()
        marks["limit_inflight"] = busy(p.limited)
        _, marks["limit_t"] = op("limit", p.limited, str(LIMIT))
        marks["limit_started"] = op.started
        ph.event("limit", p.limited)
        _, marks["delay_t"] = op("delay", p.delayed, f"{DELAY_S:g}")
        ph.event("delay", p.delayed)

    def purge_inject(now: float) -> None:
        marks["purge_inflight"] = busy(p.purged)
        out, marks["purge_t"] = op("purge", p.purged)
        marks["purged_reported"] = int(out.get("purged", 0))
        marks["fetches_at_purge"] = farm.stats(urls=True)["fetches"]
        ph.event("purge", f"{p.purged} ({marks['purged_reported']} requests)")
        letters, _ = op("deadletters")
        marks["purged_urls"] = sorted(
            d["url"] for d in letters.get("letters", [])
            if d.get("reason") == "purged" and d.get("url")
        )  # fmt: skip
        out, marks["inject_t"] = op("inject", *p.injected)
        marks["injected_reported"] = [out.get("injected"), out.get("duplicates")]
        ph.event("inject", f"{len(p.injected)} URLs")

    def kill(now: float) -> None:
        ph.kill(VICTIM)
        marks["killed_mono"] = now

    def join(now: float) -> None:
        ph.join(JOINER)
        marks["joined_mono"] = time.monotonic()

    def resume(now: float) -> None:
        marks["resume_start"] = time.time()
        op("resume", p.paused)
        ph.event("resume", p.paused)
        marks["lift_start"] = time.time()
        op("limit", p.limited, "none")
        ph.event("limit none", p.limited)

    def join_due(progress: float, now: float) -> bool:
        killed = marks.get("killed_mono")
        return killed is not None and (progress >= workload.join_at
                                       or now - killed >= JOIN_AFTER_KILL_S)  # fmt: skip

    def resume_due(progress: float, now: float) -> bool:
        joined = marks.get("joined_mono")
        return (joined is not None and now - joined >= RESUME_AFTER_JOIN_S
                and now - marks["pause_mono"] >= workload.pause_s)  # fmt: skip

    ph.steps = [
        Step("controls", lambda pr, now: pr >= workload.pause_at, controls),
        Step("kill", lambda pr, now: "pause_t" in marks and pr >= workload.kill_at, kill),
        Step(
            "purge+inject",
            lambda pr, now: "killed_mono" in marks and pr >= workload.purge_at,
            purge_inject,
        ),
        Step("join", join_due, join),
        Step("resume", resume_due, resume),
    ]
    ph.run()
    shown, _ = op(
        "control", required=False
    )  # the last 20 actions (``--log N`` cannot be given: see report)
    farm_stats = farm.stats(urls=True)
    fetches: dict[str, int] = farm_stats["fetches"]
    events: dict[str, list[list[float]]] = farm_stats["host_events"]
    served = pages_by_host(fetches)
    out = ph.result()
    out.update(budget_figures(p, served))
    # The pause.
    pause_t, resume_t = marks.get("pause_t"), marks.get("resume_start", float("inf"))
    if pause_t is not None:
        during = [t for t in arrivals(events.get(p.paused, [])) if pause_t <= t < resume_t]
        out["control_latency_pause_s"] = round(max(during) - pause_t, 3) if during else 0.0
        out["paused_fetches"] = sum(1 for t in during if t > pause_t + 2 * hb)
        # From the command's start: when the directive really took hold.
        start = marks["pause_started"]
        since_start = [t for t in arrivals(events.get(p.paused, [])) if start <= t < resume_t]
        out["pause_last_arrival_from_start_s"] = (
            round(max(since_start) - start, 3) if since_start else 0.0
        )
        out["pause_command_s"] = round(pause_t - start, 3)
        # How busy the host was: its requests in the 2 s before the command.
        out["paused_arrivals_2s_before"] = sum(
            1 for t in arrivals(events.get(p.paused, [])) if start - 2.0 <= t < start
        )
        out["pause_held_s"] = round(resume_t - pause_t, 2)
    # The limit.
    limit_t = marks.get("limit_t")
    if limit_t is not None:
        ev = events.get(p.limited, [])
        lifted = marks.get("lift_start", float("inf"))
        end = min(lifted, time.time())
        latency, excess = limit_latency(ev, limit_t, end, LIMIT, 2 * hb)
        out["control_latency_limit_s"] = round(latency, 3)
        out["limit_excess"] = excess
        out["limit_inflight_at_return"] = inflight_at(ev, limit_t)
        from_start, _ = limit_latency(ev, marks["limit_started"], end, LIMIT, 2 * hb)
        out["limit_in_force_from_start_s"] = round(from_start, 3)
        before = [t for t in arrivals(ev) if t < limit_t]
        out["limit_max_inflight_before"] = max(
            (inflight_at(ev, t) for t in before[-20:]), default=0
        )
    # The delay.
    delay_t = marks.get("delay_t")
    if delay_t is not None:
        late = [t for t in arrivals(events.get(p.delayed, [])) if t > delay_t + 2 * hb]
        gaps = [b - a for a, b in itertools.pairwise(late)]
        out["delay_violations"] = sum(1 for g in gaps if g < DELAY_TOLERANCE * DELAY_S)
        out["delay_min_gap_s"] = round(min(gaps), 3) if gaps else None
        out["delay_requests_after"] = len(late)
    # The purge.
    purged_urls: list[str] = marks.get("purged_urls", [])
    at_purge: dict[str, int] = marks.get("fetches_at_purge", {})
    out["purged"] = marks.get("purged_reported", 0)
    out["purged_listed"] = len(purged_urls)
    out["purged_fetched"] = sum(fetches.get(u, 0) - at_purge.get(u, 0) for u in purged_urls)
    # The inject.
    injected_served = sum(1 for u in p.injected if fetches.get(u))
    out["injected_fetched"] = injected_served / len(p.injected) if p.injected else 1.0
    out["injected_reported"] = marks.get("injected_reported")
    # Nothing else lost: every page no budget held back nor the purge took was served.
    missing: list[str] = []
    purged_set = set(purged_urls)
    for host, pages in p.expected.items():
        if host in p.budgets:
            continue
        want = pages - p.topic_pages - (purged_set if host == p.purged else set())
        missing.extend(sorted(want - served.get(host, set())))
    out["pages_missing"] = len(missing)
    out["missing_sample"] = missing[:10]
    out["duplicates"] = sum(n - 1 for u, n in fetches.items() if n > 1)
    out["served"] = sum(len(s) for s in served.values())
    out["wall_s"] = farm_stats["span_s"]
    out["max_inflight_per_host"] = max(
        (int(n) for n in farm_stats["max_inflight_per_host"].values()), default=0
    )
    out["operator_calls"] = op.calls
    out["busy_at_command"] = {
        "paused_inflight": marks.get("pause_inflight"),
        "limited_inflight": marks.get("limit_inflight"),
        "purged_inflight": marks.get("purge_inflight"),
    }
    out["control_document"] = {
        "error": shown.get("error"),
        "state": shown.get("state"),
        "counts_crawl": (shown.get("counts") or {}).get("crawl"),
        "held": (shown.get("counts") or {}).get("held"),
        "log_entries": len(shown.get("log") or []),
        "log_verbs": [e.get("verb") for e in reversed(shown.get("log") or [])],
    }
    return out


def phase2(p: Plan, farm: WebFarm, redis_url: str, settings: dict[str, Any],
           workload: Workload, workdir: Path) -> dict[str, Any]:  # fmt: skip
    budget = max(1, round(workload.crawl_budget_share * p.allowed))
    seeds = _fleet.fresh(farm, redis_url)
    ph = Phase("phase2", farm, workdir, {**settings, "BANKER_CRAWL_BUDGET": budget}, seeds,
               workload, budget)  # fmt: skip
    ph.steps = [
        Step("kill", lambda pr, now: pr >= workload.kill_at_2, lambda now: ph.kill(VICTIM)),
        Step("join", lambda pr, now: pr >= workload.join_at_2, lambda now: ph.join(JOINER)),
    ]
    ph.run()
    farm_stats = farm.stats(urls=True)
    fetches: dict[str, int] = farm_stats["fetches"]
    served = pages_by_host(fetches)
    n = sum(len(s) for s in served.values())
    out = ph.result()
    figures = budget_figures(p, served)
    # The crawl budget cut the crawl short: host and topic underruns mean nothing here.
    figures.pop("underrun_hosts")
    figures.pop("underrun_topic")
    out.update(figures)
    out.update({
        "crawl_budget": budget,
        "crawl_served": n,
        "overrun_crawl": max(0, n - budget),
        "underrun_crawl": int(n < min(budget, p.allowed)),
        "duplicates": sum(c - 1 for c in fetches.values() if c > 1),
        "wall_s": farm_stats["span_s"],
        "closed_by_budget": sorted(
            w for w, r in out["finish_reasons"].items() if r == "banker_crawl_budget"
        ),
    })  # fmt: skip
    return out


def _reasons(phase: dict[str, Any]) -> dict[str, int]:
    """How the workers that were not killed closed, counted by reason."""
    out: dict[str, int] = {}
    for worker, reason in phase["finish_reasons"].items():
        if worker != VICTIM:
            out[str(reason)] = out.get(str(reason), 0) + 1
    return out


def one_run(p: Plan, farm: WebFarm, redis_url: str, settings: dict[str, Any],
            workload: Workload, workdir: Path) -> dict[str, Any]:  # fmt: skip
    log("  phase 1: budgets and control")
    one = phase1(p, farm, redis_url, settings, workload, workdir / "phase1")
    log(f"    served {one['served']:,} pages in {one['wall_s']} s; host overrun "
        f"{one['overrun_hosts']}, underrun {one['underrun_hosts']}; topic {one['topic_served']}"
        f"/{p.topic_budget}; pause latency {one.get('control_latency_pause_s')} s, "
        f"{one.get('paused_fetches')} paused fetches; limit latency "
        f"{one.get('control_latency_limit_s')} s; purged {one['purged']}; injected "
        f"{one['injected_fetched']:.0%}")  # fmt: skip
    log("  phase 2: the crawl budget")
    two = phase2(p, farm, redis_url, settings, workload, workdir / "phase2")
    log(f"    served {two['crawl_served']:,} of a crawl budget of {two['crawl_budget']:,} in "
        f"{two['wall_s']} s; closed by the budget: {two['closed_by_budget']}")  # fmt: skip
    hb = workload.heartbeat_s
    latencies = [one.get("control_latency_pause_s"), one.get("control_latency_limit_s")]
    overrun = {
        "hosts": one["overrun_hosts"] + two["overrun_hosts"],
        "topic": one["overrun_topic"] + two["overrun_topic"],
        "crawl": two["overrun_crawl"],
    }
    underrun = {
        "hosts": one["underrun_hosts"],
        "topic": one["underrun_topic"],
        "crawl": two["underrun_crawl"],
    }
    return {
        "budget_overrun": sum(overrun.values()),
        "budget_underrun": sum(underrun.values()),
        **{f"budget_overrun_{k}": v for k, v in overrun.items()},
        **{f"budget_underrun_{k}": v for k, v in underrun.items()},
        "control_latency_s": max((x for x in latencies if x is not None), default=float("nan")),
        "control_latency_pause_s": one.get("control_latency_pause_s"),
        "control_latency_limit_s": one.get("control_latency_limit_s"),
        "paused_fetches": one.get("paused_fetches", -1),
        "limit_excess": one.get("limit_excess", -1),
        "delay_violations": one.get("delay_violations", -1),
        "delay_min_gap_s": one.get("delay_min_gap_s"),
        "injected_fetched": one["injected_fetched"],
        "purged": one["purged"],
        "purged_fetched": one["purged_fetched"],
        "pages_missing": one["pages_missing"],
        "duplicates": one["duplicates"] + two["duplicates"],
        "crawl_budget": two["crawl_budget"],
        "crawl_served": two["crawl_served"],
        "crawl_budget_finish_reasons": _reasons(two),
        "heartbeat_s": hb,
        "wall_s_phase1": one["wall_s"],
        "wall_s_phase2": two["wall_s"],
        "process_wall_s_phase1": one["process_wall_s"],
        "process_wall_s_phase2": two["process_wall_s"],
        "phase1": one,
        "phase2": two,
    }


# -- the report ------------------------------------------------------------------------------


def report(runs: list[dict[str, Any]], p: Plan, workload: Workload, config: FarmConfig,
           args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    def median(key: str) -> Any:
        values = [r[key] for r in runs if isinstance(r[key], (int, float))]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {
        "mode": _harness.mode(args),
        "seed": args.seed,
        "repeats": len(runs),
        "hosts": config.hosts,
        "expected_pages": sum(len(s) for s in p.expected.values()),
        "allowed_pages": p.allowed,
        "latency_ms": config.latency_ms,
        "workers": workload.workers,
        "concurrent_requests": workload.concurrent,
        "per_host_limit": workload.per_host,
        "heartbeat_s": workload.heartbeat_s,
        "extra_settings": extra,
        "roles": {
            "paused": p.paused,
            "limited": p.limited,
            "purged": p.purged,
            "delayed": p.delayed,
            "budgets": p.budget_patterns,
            "topic_hosts": p.topic_hosts,
            "topic_regex": p.topic_regex,
            "topic_budget": p.topic_budget,
            "topic_pages": len(p.topic_pages),
            "injected": len(p.injected),
        },
    }
    for key in ("budget_overrun", "budget_underrun", "budget_overrun_hosts",
                "budget_overrun_topic", "budget_overrun_crawl", "budget_underrun_hosts",
                "budget_underrun_topic", "budget_underrun_crawl", "paused_fetches",
                "limit_excess", "delay_violations", "purged_fetched", "pages_missing",
                "duplicates"):  # fmt: skip
        out[key] = max(r[key] for r in runs)
    out["injected_fetched"] = min(r["injected_fetched"] for r in runs)
    reasons: dict[str, int] = {}
    for r in runs:
        for reason, n in r["crawl_budget_finish_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    out["crawl_budget_finish_reasons"] = reasons
    for key in ("control_latency_s", "control_latency_pause_s", "control_latency_limit_s",
                "delay_min_gap_s", "purged", "crawl_budget", "crawl_served", "wall_s_phase1",
                "wall_s_phase2", "process_wall_s_phase1", "process_wall_s_phase2"):  # fmt: skip
        out[key] = median(key)
    out["worst_control_latency_s"] = max(
        (r["control_latency_s"] for r in runs if r["control_latency_s"] is not None),
        default=None,
    )
    worst_latency = out["worst_control_latency_s"]
    targets = {
        "target_budget_overrun_zero": out["budget_overrun"] == 0,
        "target_budget_underrun_zero": out["budget_underrun"] == 0,
        "target_control_latency_le_2_heartbeats": worst_latency is not None
        and worst_latency <= 2 * workload.heartbeat_s,
        "target_paused_fetches_zero": out["paused_fetches"] == 0,
        "target_injected_all_fetched": out["injected_fetched"] == 1.0,
        "target_purged_fetched_zero": out["purged_fetched"] == 0,
        "target_pages_missing_zero": out["pages_missing"] == 0,
    }
    out.update(targets)
    out["targets_met"] = all(targets.values())
    out["runs"] = runs if len(runs) > 1 else runs[0]
    return out


def _summary(out: dict[str, Any]) -> None:
    print(f"{out['hosts']} hosts, {out['expected_pages']:,} pages ({out['allowed_pages']:,} "
          f"within the budgets) at {out['latency_ms']:g} ms, {out['workers']} workers, "
          f"heartbeat {out['heartbeat_s']:g} s; {out['repeats']} run(s)")  # fmt: skip
    for key in ("budget_overrun", "budget_underrun", "control_latency_s",
                "control_latency_pause_s", "control_latency_limit_s", "paused_fetches",
                "limit_excess", "delay_violations", "injected_fetched", "purged",
                "purged_fetched", "pages_missing", "crawl_budget", "crawl_served",
                "wall_s_phase1", "wall_s_phase2"):  # fmt: skip
        print(f"  {key}: {out[key]}")
    for key in sorted(k for k in out if k.startswith("target_")):
        print(f"  {key}: {'met' if out[key] else 'MISSED'}")
    print(f"targets met: {out['targets_met']}")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="24 hosts, ~45 s", tiny="")
    _harness.add_repeats(parser, "runs (worst counts, median times); default 1")
    parser.add_argument("--seed", type=int, default=27, help="farm layout seed")
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts (>= 12)")
    parser.add_argument("--pages", type=int, default=None, help="farm content pages")
    parser.add_argument("--latency-ms", type=float, default=None, help="farm latency")
    parser.add_argument("--heartbeat", type=float, default=None,
                        help="BANKER_REDIS_HEARTBEAT of the workers (default 1 s)")  # fmt: skip
    parser.add_argument("--pause-s", type=float, default=None,
                        help="least seconds the paused host stays paused")  # fmt: skip
    parser.add_argument("--inject", type=_harness.positive, default=None,
                        help="URLs injected mid-crawl")  # fmt: skip
    parser.add_argument(
        "--reactor", default="epoll", help="TWISTED_REACTOR: epoll (default), asyncio or a path"
    )
    parser.add_argument("--keep", action="store_true", help="keep the workers' logs and stats")
    _harness.add_settings(parser, "a setting of every worker (repeatable)")
    args = parser.parse_args(argv)
    if args.hosts is not None and args.hosts < 12:
        parser.error("--hosts: at least 12 (four roles, budgeted, topic and free hosts)")
    if args.heartbeat is not None and not args.heartbeat > 0:
        parser.error("--heartbeat: a number of seconds > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    workload = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        repeats="repeats", hosts="hosts", total_pages="pages", latency_ms="latency_ms",
        heartbeat_s="heartbeat", pause_s="pause_s", injected="inject",
    )  # fmt: skip
    extra = _harness.settings(args.set)
    config = workload.farm_config(args.seed)
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        farm = stack.enter_context(WebFarm(config))
        server = stack.enter_context(RedisServer())
        tmp = Path(tempfile.mkdtemp(prefix="control-"))
        if not args.keep:
            stack.callback(shutil.rmtree, tmp, True)
        p = plan(farm, config, workload)
        settings = worker_settings(workload, p, server.url, _common.reactor(args.reactor), extra)
        log(f"control: {config.hosts} hosts, {sum(len(s) for s in p.expected.values()):,} "
            f"pages ({p.allowed:,} within the budgets) at {config.latency_ms:g} ms; paused "
            f"{p.paused}, limited {p.limited}, purged {p.purged}, delayed {p.delayed}; "
            f"{len(p.budgets)} budgeted hosts, topic {TOPIC!r} on {len(p.topic_hosts)} hosts "
            f"(budget {p.topic_budget} of {len(p.topic_pages)}); {workload.repeats} run(s)"
            + (f"; logs kept in {tmp}" if args.keep else ""))  # fmt: skip
        for rep in range(workload.repeats):
            log(f"[{rep + 1}/{workload.repeats}]")
            runs.append(one_run(p, farm, server.url, settings, workload, tmp / f"run{rep}"))
    out = report(runs, p, workload, config, args, extra)
    out["total_s"] = round(time.perf_counter() - started, 1)
    _summary(out)
    _common.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
