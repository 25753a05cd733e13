"""Calibrate the fleet-size model on this machine and check it against a real Redis.

Usage::

    python benchmarks/fleet_model.py [--quick | --tiny] [--pages 20]

(a) **Calibration.**  A real ``redis-server`` (:class:`RedisServer`) runs the
real frontier code -- :class:`RedisFrontier` ``enqueue_many`` / ``pop_many``
/ ``ack_many`` / ``renew_many`` / ``reap_all`` / ``census``, the
:class:`NodeRegistry` heartbeat, live-node reads, polls and table loads --
one operation kind at a time, with ``CONFIG RESETSTAT`` before each, and
reads ``INFO commandstats``: the ``usec_per_call`` of ``EVALSHA`` (one
script per run) or of the plain command.  Kinds whose cost grows with a
batch (ids acked, leases popped, live nodes read) are run at two sizes and
fitted as ``base + per_item * items``.  What commandstats does not count --
reading, parsing and answering each command, the wake-up per round trip --
is fitted from the main thread's CPU (``used_cpu_*_main_thread``) over
script calls sent one per round trip and 100 per pipeline.

(b) **Check.**  N simulated workers (N = 1, 2, 4, 8; more with the full run)
each run a real :class:`FrontierWorker` thread -- the worker code of a
``scrapy crawl`` node, unchanged -- fed by a driver thread standing in for
Scrapy: it fetches ``--pages`` pages per second (``CONCURRENT_REQUESTS``
in flight), and for each page finished enqueues its links (new ones, and
known ones the worker's seen cache did not drop) and acks it.  Over a
measurement window the benchmark reads Redis's CPU, ``EVALSHA`` calls and
client round trips, and compares them with
:func:`scrapy_banker.net.fleetmodel.predict` for the same configuration at the
pages/s the fleet actually reached.

Then the calibrated model predicts the 10 / 100 / 1,000-worker fleet, where
one server saturates and how many Cluster masters 1,000 workers need.  The
last line of output is one JSON object.  Run it alone (``flock -x
/tmp/bench.flock``): the CPU it measures is the machine's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common
import _harness
import redis
import redis.connection

from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.net import fleetmodel
from scrapy_banker.net.fleetmodel import CostTable, OpCost, WorkerConfig
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.leases import Leased
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker, WorkerOptions
from scrapy_banker.testing.redis_server import RedisServer

PARTITIONS = 1024
HOSTS = 10_000


def payload(host: str, i: int) -> str:
    """A request as the codec writes it (~300 bytes, like the issue's measured 313)."""
    return json.dumps(
        {
            "url": f"https://{host}/news/section-{i % 97}/article-{i}.html",
            "callback": "parse_article",
            "errback": None,
            "method": "GET",
            "headers": {"Referer": [f"https://{host}/news/"]},
            "body": "",
            "cookies": {},
            "meta": {"banker_topic": "news", "depth": 3, "download_slot": host},
            "encoding": "utf-8",
            "priority": 0,
            "flags": [],
            "cb_kwargs": {},
        },
        separators=(",", ":"),
    )


def fingerprint(tag: str) -> str:
    return hashlib.sha1(tag.encode(), usedforsecurity=False).hexdigest()


def host_of(i: int) -> str:
    return f"h{i:05d}.farm.test"


def partition_of(host: str) -> int:
    return int(hashlib.md5(host.encode(), usedforsecurity=False).hexdigest()[:8], 16) % PARTITIONS


# -- server statistics --------------------------------------------------------------------


def main_cpu(client: redis.Redis) -> float:
    """CPU seconds of Redis's command thread (whole process on older servers)."""
    return _harness.redis_cpu_s(client, main_thread=True)


def cmdstat(client: redis.Redis, command: str) -> tuple[int, float]:
    """(calls, usec) of ``command`` since the last ``CONFIG RESETSTAT``."""
    entry = client.info("commandstats").get(f"cmdstat_{command}")
    if not entry:
        return 0, 0.0
    return int(entry["calls"]), float(entry["usec"])


#: Script runs of the calibration: (command-thread CPU µs, commandstats µs,
#: calls, round trips, seconds), to size what commandstats does not count.
PHASES: list[tuple[float, float, int, int, float]] = []


def usec_per_call(client: redis.Redis, command: str, run: Any) -> float:
    """Run ``run()`` alone on the server and return ``command``'s usec per call."""
    cpu0, t0, rt0 = main_cpu(client), time.perf_counter(), TRAFFIC.round_trips
    client.config_resetstat()
    run()
    calls, usec = cmdstat(client, command)
    elapsed, rts = time.perf_counter() - t0, TRAFFIC.round_trips - rt0
    if calls == 0:
        raise RuntimeError(f"no {command} call was made")
    if command == "evalsha":
        PHASES.append(((main_cpu(client) - cpu0) * 1e6, usec, calls, rts, elapsed))
    return usec / calls


def times(n: int, call: Callable[[], object]) -> Callable[[], None]:
    """``call`` ``n`` times, as one function."""

    def run() -> None:
        for _ in range(n):
            call()

    return run


def fit(items_a: float, us_a: float, items_b: float, us_b: float) -> OpCost:
    """``base + per_item * items`` through two measurements (clamped at 0)."""
    slope = max(0.0, (us_b - us_a) / (items_b - items_a))
    return OpCost(round(max(0.0, us_a - slope * items_a), 3), round(slope, 4))


# -- (a) calibration ---------------------------------------------------------------------


def calibrate(url: str, scale: float) -> tuple[CostTable, dict[str, float]]:
    """Measure each operation kind alone; returns the cost table and the raw figures."""
    client = redis.Redis.from_url(url)
    client.flushall()
    raw: dict[str, float] = {}
    ops: dict[str, OpCost] = {}
    fr = RedisFrontier(client, prefix="cal", partitions=PARTITIONS)
    per_partition = max(4, int(24 * scale))
    enqueues = [
        EnqueueOp(p, fingerprint(f"cal-{p}-{j}"), payload(host_of(p), j))
        for j in range(per_partition)
        for p in range(PARTITIONS)
    ]

    def batched(items: list[Any], size: int = 256) -> list[list[Any]]:
        return [items[i : i + size] for i in range(0, len(items), size)]

    ops["enqueue_new"] = OpCost(
        usec_per_call(client, "evalsha", lambda: [fr.enqueue_many(b) for b in batched(enqueues)])
    )
    ops["enqueue_dup"] = OpCost(
        usec_per_call(
            client,
            "evalsha",
            lambda: [fr.enqueue_many(b) for b in batched(enqueues[: len(enqueues) // 2])],
        )
    )
    for p in range(PARTITIONS):
        fr.set_owner(p, "cal", 1)
    owned = dict.fromkeys(range(PARTITIONS), 1)
    held: list[Leased] = []

    def pop(count: int, rounds: int) -> None:
        for _ in range(rounds):
            held.extend(fr.pop_many(owned, "cal", count).leased)

    raw["pop_1"] = usec_per_call(client, "evalsha", lambda: pop(1, 2))
    leases_1 = list(held)
    held.clear()
    raw["pop_4"] = usec_per_call(client, "evalsha", lambda: pop(4, 1))
    leases_4 = list(held)
    ops["pop"] = fit(1, raw["pop_1"], 4, raw["pop_4"])

    def by_partition(leases: list[Leased], per_call: int, ref: bool) -> list[dict[int, list[str]]]:
        """Batches of ``{partition: ids}`` with ``per_call`` ids per partition."""
        groups: dict[int, list[str]] = {}
        for lease in leases:
            groups.setdefault(lease.partition, []).append(lease.token.ref if ref else lease.id)
        out: list[dict[int, list[str]]] = []
        for p, ids in groups.items():
            for k, i in enumerate(range(0, len(ids), per_call)):
                while len(out) <= k:
                    out.append({})
                out[k][p] = ids[i : i + per_call]
        return out

    raw["renew_1"] = usec_per_call(
        client, "evalsha", lambda: [fr.renew_many(b) for b in by_partition(leases_1, 1, False)]
    )
    raw["renew_4"] = usec_per_call(
        client, "evalsha", lambda: [fr.renew_many(b) for b in by_partition(leases_4, 4, False)]
    )
    ops["renew"] = fit(1, raw["renew_1"], 4, raw["renew_4"])
    raw["ack_1"] = usec_per_call(
        client, "evalsha", lambda: [fr.ack_many(b) for b in by_partition(leases_1, 1, True)]
    )
    raw["ack_4"] = usec_per_call(
        client, "evalsha", lambda: [fr.ack_many(b) for b in by_partition(leases_4, 4, True)]
    )
    ops["ack"] = fit(1, raw["ack_1"], 4, raw["ack_4"])

    empty = RedisFrontier(client, prefix="cal-empty", partitions=PARTITIONS)
    for p in range(PARTITIONS):
        empty.set_owner(p, "cal", 1)
    ops["pop_empty"] = OpCost(
        usec_per_call(
            client, "evalsha", lambda: [empty.pop_many(owned, "cal", 4) for _ in range(2)]
        )
    )
    pop(1, 1)  # some live (unexpired) leases, as in a running crawl
    ops["reap"] = OpCost(usec_per_call(client, "evalsha", lambda: fr.reap_all("cal")))
    ops["bump"] = OpCost(
        usec_per_call(
            client, "evalsha", lambda: [fr.bump_finished() for _ in range(int(1000 * scale) + 50)]
        )
    )
    rounds = max(3, int(20 * scale))
    raw["count_256"] = usec_per_call(
        client, "evalsha", lambda: [fr.census(each=True) for _ in range(rounds)]
    )
    raw["count_1"] = usec_per_call(client, "evalsha", lambda: fr.census(each=True, chunk=1))
    ops["count"] = fit(1, raw["count_1"], 256, raw["count_256"])

    reg = NodeRegistry(client, fr)
    n_small, n_large = 10, 1000
    for i in range(n_small):
        reg.register(f"node-{i}")
    n_calls = int(1000 * scale) + 50
    ops["time"] = OpCost(
        usec_per_call(client, "time", times(n_calls, lambda: reg.heartbeat("node-0")))
    )
    ops["zadd"] = OpCost(
        usec_per_call(client, "zadd", times(n_calls, lambda: reg.heartbeat("node-0")))
    )
    small = [n_calls // 2]

    def live(n: int) -> None:
        for _ in range(n):
            reg.live_nodes()

    raw["zrangebyscore_10"] = usec_per_call(client, "zrangebyscore", lambda: live(small[0]))
    raw["hgetall_10"] = usec_per_call(client, "hgetall", lambda: live(small[0]))
    pipe = client.pipeline(transaction=False)
    for i in range(n_small, n_large):
        pipe.hset(fr.keyspace.nodes, f"node-{i}", "1.0")
        pipe.zadd(fr.keyspace.heartbeats, {f"node-{i}": int(time.time() * 1000)})
    pipe.execute()
    big = max(20, n_calls // 10)
    raw["zrangebyscore_1000"] = usec_per_call(client, "zrangebyscore", lambda: live(big))
    raw["hgetall_1000"] = usec_per_call(client, "hgetall", lambda: live(big))
    ops["zrangebyscore"] = fit(n_small, raw["zrangebyscore_10"], n_large, raw["zrangebyscore_1000"])
    ops["hgetall"] = fit(n_small, raw["hgetall_10"], n_large, raw["hgetall_1000"])
    reg.rebalance("node-0")  # a table of 1,024 partitions over 1,000 nodes
    ops["getrange"] = OpCost(
        usec_per_call(client, "getrange", lambda: [reg.table_version() for _ in range(n_calls)])
    )
    ops["spop"] = OpCost(
        usec_per_call(client, "spop", lambda: [reg.poll("node-0") for _ in range(n_calls)])
    )
    raw["table_bytes"] = float(client.strlen(fr.keyspace.table))
    get_table = usec_per_call(client, "get", lambda: [reg.load_table() for _ in range(big)])
    ops["get_table"] = OpCost(0.0, round(get_table / PARTITIONS, 5))
    ops["sadd"] = OpCost(
        usec_per_call(client, "sadd", times(n_calls, lambda: reg.notify({"node-1": {1, 2}})))
    )
    ops["expire"] = OpCost(
        usec_per_call(client, "expire", times(n_calls, lambda: reg.notify({"node-1": {3}})))
    )
    blob_2k, blob_16k = "x" * 2048, "x" * 16384
    raw["set_2k"] = usec_per_call(
        client,
        "set",
        lambda: [client.set("cal:telemetry", blob_2k, px=3000) for _ in range(n_calls)],
    )
    raw["set_16k"] = usec_per_call(
        client,
        "set",
        lambda: [client.set("cal:telemetry", blob_16k, px=3000) for _ in range(n_calls)],
    )
    ops["set"] = fit(2, raw["set_2k"], 16, raw["set_16k"])

    def lock_cycle() -> None:
        for _ in range(n_calls):
            client.set("cal:lock", "node-0", nx=True, px=10_000)
            client.get("cal:lock")
            client.delete("cal:lock")

    ops["set_nx"] = OpCost(usec_per_call(client, "set", lock_cycle))
    ops["get"] = OpCost(usec_per_call(client, "get", lock_cycle))
    ops["del"] = OpCost(usec_per_call(client, "del", lock_cycle))

    # What commandstats leaves out: per round trip and per command, from the
    # command thread's CPU over bump calls one per round trip, then 100 per pipeline.
    idle_s = 1.0 if scale >= 0.5 else 0.3
    c0, t0 = main_cpu(client), time.perf_counter()
    time.sleep(idle_s)
    idle_cpu = (main_cpu(client) - c0) / (time.perf_counter() - t0)
    raw["idle_us_per_s"] = idle_cpu * 1e6
    sha = fr.scripts.sha("bump")
    fr.bump_finished()
    key = fr.keyspace.finished

    def phase(batch: int, calls: int) -> tuple[float, float]:
        client.config_resetstat()
        c0, t0 = main_cpu(client), time.perf_counter()
        for _ in range(calls // batch):
            if batch == 1:
                client.execute_command("EVALSHA", sha, 1, key)  # type: ignore[no-untyped-call]
            else:
                p = client.pipeline(transaction=False)
                for _ in range(batch):
                    p.execute_command("EVALSHA", sha, 1, key)  # type: ignore[no-untyped-call]
                p.execute()
        elapsed = time.perf_counter() - t0
        cpu_us = (main_cpu(client) - c0 - idle_cpu * elapsed) * 1e6
        n, usec = cmdstat(client, "evalsha")
        return cpu_us / n, usec / n

    singles = int(20_000 * scale) + 500
    per_single, exec_single = phase(1, singles)
    per_piped, exec_piped = phase(100, singles * 3 // 100 * 100)
    # per_single = r + c + e;  per_piped = r / 100 + c + e
    r = max(0.0, (per_single - per_piped) * 100 / 99)
    c = max(0.0, per_piped - r / 100 - exec_piped)
    # A bump call has two arguments; the frontier's scripts carry keys,
    # payloads and ids, which cost parsing and replies commandstats does not
    # see either: the CPU of the script runs above beyond their usec and
    # round trips, per call, is the per-command overhead the model uses.
    uncounted = sum(cpu - idle_cpu * 1e6 * t - rt * r - usec for cpu, usec, _, rt, t in PHASES)
    per_call_uncounted = uncounted / sum(calls for _, _, calls, _, _ in PHASES)
    raw["uncounted_per_bump_call_us"] = c
    raw["uncounted_per_script_call_us"] = per_call_uncounted
    c = max(c, per_call_uncounted)
    raw.update(
        cpu_per_call_single_us=per_single,
        cpu_per_call_pipelined_us=per_piped,
        exec_bump_single_us=exec_single,
        exec_bump_pipelined_us=exec_piped,
    )
    info = client.info("server")
    costs = CostTable(
        ops=ops,
        per_command_us=round(c, 3),
        per_round_trip_us=round(r, 3),
        idle_us_per_s=round(idle_cpu * 1e6, 1),
        source=(
            f"redis {info['redis_version']} on {os.cpu_count()} CPUs "
            f"({os.uname().machine}); python benchmarks/fleet_model.py"
        ),
    )
    client.flushall()
    client.close()
    return costs, raw


# -- (b) simulated fleet -----------------------------------------------------------------


class Traffic:
    """Client-side counts of this process's Redis round trips (every packet sent)."""

    def __init__(self) -> None:
        self.round_trips = 0
        self._lock = threading.Lock()
        original = redis.connection.AbstractConnection.send_packed_command
        traffic = self

        def send(conn: Any, command: Any, check_health: bool = True) -> None:
            with traffic._lock:
                traffic.round_trips += 1
            original(conn, command, check_health)  # type: ignore[no-untyped-call]

        redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]


class SimWorker:
    """A real :class:`FrontierWorker` and a driver thread standing in for Scrapy.

    The driver keeps ``concurrent`` requests "downloading", finishes one every
    ``1 / pages_per_s`` s, and for it: yields ``links`` links (a share
    ``dup`` already known, drawn from what this worker or the whole process
    queued; a share ``same_host`` on the page's own host), drops those the
    worker's seen cache knows -- as ``BankerRedisScheduler`` does -- enqueues
    the rest and acks the page, then asks the worker for what its buffer lacks.
    """

    def __init__(
        self,
        url: str,
        node: str,
        cfg: WorkerConfig,
        pool: list[tuple[str, int]],
        seed: int,
        same_host: float,
        own_dups: float,
    ) -> None:
        self.client = redis.Redis.from_url(url)
        self.frontier = RedisFrontier(self.client, prefix="sim", partitions=PARTITIONS)
        self.registry = NodeRegistry(self.client, self.frontier)
        self.worker = FrontierWorker(
            self.frontier,
            self.registry,
            node,
            WorkerOptions(
                heartbeat_s=cfg.heartbeat_s,
                reap_interval_s=cfg.reap_interval_s,
                pop_per_partition=cfg.pop_per_partition,
                slots=max(1, cfg.concurrent_requests // 8),
                seen_cache=100_000,
            ),
        )
        self.scripts: Counter[str] = Counter()
        runner = self.frontier.scripts
        original = runner.run_batch
        counts = self.scripts

        def run_batch(calls: Any) -> list[Any]:
            for name, _ in calls:
                counts[name] += 1
            return original(calls)

        runner.run_batch = run_batch  # type: ignore[method-assign]
        self.node = node
        self.cfg = cfg
        self.pool = pool
        self.own: list[tuple[str, int]] = []
        self.rng = random.Random(seed)
        self.same_host = same_host
        self.own_dups = own_dups
        self.pages = 0
        self.dup_links = 0
        self.dup_cached = 0
        self.stopping = False
        self.seq = itertools.count()
        self.thread = threading.Thread(target=self.drive, name=f"driver-{node}", daemon=True)

    def start(self) -> None:
        self.worker.start()
        self.thread.start()

    def children(self, parent: Leased) -> None:
        cfg, rng, worker = self.cfg, self.rng, self.worker
        parent_host = int(json.loads(parent.payload)["meta"]["download_slot"][1:6])
        for _ in range(int(cfg.links_per_page)):
            if rng.random() < cfg.duplicate_fraction and self.pool:
                source = self.own if (self.own and rng.random() < self.own_dups) else self.pool
                fp, hidx = source[rng.randrange(len(source))]
                self.dup_links += 1
                if fp in worker.seen:
                    self.dup_cached += 1
                    continue
                h = host_of(hidx)
            else:
                hidx = parent_host if rng.random() < self.same_host else rng.randrange(HOSTS)
                h = host_of(hidx)
                fp = fingerprint(f"{self.node}-{next(self.seq)}")
                self.own.append((fp, hidx))
                self.pool.append((fp, hidx))
            worker.enqueue(EnqueueOp(partition_of(h), fp, payload(h, hidx)))

    def drive(self) -> None:
        cfg, worker = self.cfg, self.worker
        buffer: deque[Leased] = deque()
        flight: deque[Leased] = deque()
        period = 1 / cfg.pages_per_s
        next_t = time.monotonic()
        while not self.stopping:
            while worker.inbound:
                buffer.append(worker.inbound.popleft())
            owned = worker.owned
            for queue in (buffer, flight):
                for leased in [x for x in queue if x.partition not in owned]:
                    queue.remove(leased)
                    if queue is buffer:
                        worker.nack(leased.token)
            now = time.monotonic()
            if now >= next_t and flight:
                done = flight.popleft()
                self.children(done)
                worker.ack(done.token)
                self.pages += 1
                next_t = max(next_t + period, now - period)
            elif now >= next_t:
                next_t = now + period
            while buffer and len(flight) < cfg.concurrent_requests:
                flight.append(buffer.popleft())
            worker.request(cfg.buffered - len(buffer))
            worker.local_idle = False
            worker.hungry = False
            time.sleep(max(0.0, min(next_t - time.monotonic(), 0.02)))

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(5)
        self.worker.stop(timeout=5)
        self.client.close()


def seed_frontier(url: str, per_partition: int) -> None:
    client = redis.Redis.from_url(url)
    client.flushall()
    fr = RedisFrontier(client, prefix="sim", partitions=PARTITIONS)
    ops = []
    for hidx in range(HOSTS):
        h = host_of(hidx)
        for j in range(max(1, per_partition * PARTITIONS // HOSTS)):
            ops.append(EnqueueOp(partition_of(h), fingerprint(f"seed-{hidx}-{j}"), payload(h, j)))
    for i in range(0, len(ops), 1000):
        fr.enqueue_many(ops[i : i + 1000])
    client.close()


def run_fleet(
    url: str,
    workers: int,
    cfg: WorkerConfig,
    costs: CostTable,
    traffic: Traffic,
    *,
    warmup_s: float,
    window_s: float,
    same_host: float,
    own_dups: float,
) -> dict[str, Any]:
    seed_frontier(url, per_partition=12)
    pool: list[tuple[str, int]] = []
    sims = [
        SimWorker(url, f"sim-{i}", cfg, pool, seed=i, same_host=same_host, own_dups=own_dups)
        for i in range(workers)
    ]
    control = redis.Redis.from_url(url)
    # Workers of a real fleet start at different moments, so their reapers
    # (every BANKER_REDIS_REAP_INTERVAL s each) are out of phase; started
    # together they would take turns on one lock and reap once per interval.
    stagger = min(cfg.reap_interval_s, max(0.0, warmup_s - 1.0))
    for sim in sims:
        sim.start()
        time.sleep(stagger / workers)
    time.sleep(warmup_s - stagger)
    pages0 = [s.pages for s in sims]
    dups0 = sum(s.dup_links for s in sims), sum(s.dup_cached for s in sims)
    scripts0 = sum((s.scripts for s in sims), Counter())
    control.config_resetstat()
    rt0 = traffic.round_trips
    cpu0, t0 = main_cpu(control), time.perf_counter()
    time.sleep(window_s)
    cpu1, t1 = main_cpu(control), time.perf_counter()
    rt1 = traffic.round_trips
    evalsha, _ = cmdstat(control, "evalsha")
    pages = sum(s.pages for s in sims) - sum(pages0)
    dup_links = sum(s.dup_links for s in sims) - dups0[0]
    dup_cached = sum(s.dup_cached for s in sims) - dups0[1]
    scripts = sum((s.scripts for s in sims), Counter())
    scripts.subtract(scripts0)
    elapsed = t1 - t0
    stats = control.info("commandstats")
    commands = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))
    for sim in sims:
        sim.stop()
    control.close()
    pps = pages / elapsed / workers
    cache_hit = dup_cached / dup_links if dup_links else 0.0
    model_cfg = replace(cfg, pages_per_s=pps, seen_cache_hit=cache_hit)
    predicted = fleetmodel.predict(model_cfg, workers, costs)
    measured_cpu = (cpu1 - cpu0) / elapsed
    return {
        "workers": workers,
        "pages_per_s_per_worker": round(pps, 2),
        "seen_cache_hit": round(cache_hit, 3),
        "measured_cpu": round(measured_cpu, 4),
        "predicted_cpu": round(predicted.cpu, 4),
        "cpu_ratio": round(predicted.cpu / measured_cpu, 3) if measured_cpu > 0 else None,
        "measured_evalsha_per_s": round(evalsha / elapsed, 1),
        "predicted_evalsha_per_s": round(predicted.script_calls_per_s, 1),
        "measured_round_trips_per_s": round((rt1 - rt0) / elapsed, 1),
        "predicted_round_trips_per_s": round(predicted.round_trips_per_s, 1),
        "server_commands_per_s_incl_lua": round(commands / elapsed, 1),
        "script_calls_per_page": {
            k: round(v / max(pages, 1), 3) for k, v in sorted(scripts.items()) if v
        },
    }


TRAFFIC = Traffic()

# -- report ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = _harness.parser(
        __doc__, quick="N = 1, 2, 4, 8; short windows", tiny="smoke test: a few seconds"
    )
    ap.add_argument("--pages", type=float, default=40.0, help="pages/s per simulated worker")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    sizes: tuple[int, ...]
    scale, sizes, warmup, window = _harness.pick(
        args,
        full=(1.0, (1, 2, 4, 8, 16, 32), 6.0, 20.0),
        quick=(0.5, (1, 2, 4, 8), 6.0, 15.0),
        tiny=(0.05, (1, 2), 1.5, 1.5),
    )
    same_host, own_dups = 0.8, 0.5
    base = WorkerConfig(pages_per_s=args.pages, same_host_fraction=same_host)
    traffic = TRAFFIC
    with RedisServer() as server:
        costs, raw = calibrate(server.url, scale)
        print(f"calibration ({costs.source}):")
        for kind, cost in costs.ops.items():
            print(f"  {kind:14s} {cost.base_us:8.2f} us + {cost.per_item_us:7.4f} us/item")
        print(f"  per command {costs.per_command_us:.2f} us, per round trip "
              f"{costs.per_round_trip_us:.2f} us, idle {costs.idle_us_per_s:.0f} us/s")  # fmt: skip
        checks = []
        for n in sizes:
            row = run_fleet(server.url, n, base, costs, traffic, warmup_s=warmup,
                            window_s=window, same_host=same_host, own_dups=own_dups)  # fmt: skip
            checks.append(row)
            print(
                f"  N={n:3d}: {row['pages_per_s_per_worker']:6.1f} pages/s/worker  "
                f"CPU predicted {row['predicted_cpu']:.2%} measured {row['measured_cpu']:.2%} "
                f"(x{row['cpu_ratio']})  EVALSHA/s {row['predicted_evalsha_per_s']:.0f} vs "
                f"{row['measured_evalsha_per_s']:.0f}  round trips/s "
                f"{row['predicted_round_trips_per_s']:.0f} vs "
                f"{row['measured_round_trips_per_s']:.0f}"
            )
            print(f"         script calls per page: {row['script_calls_per_page']}")
    out: dict[str, Any] = {
        "redis": costs.source,
        "costs": {k: asdict(v) for k, v in costs.ops.items()},
        "raw": {k: round(v, 3) for k, v in raw.items()},
        "per_command_us": costs.per_command_us,
        "per_round_trip_us": costs.per_round_trip_us,
        "idle_us_per_s": costs.idle_us_per_s,
        "checks": checks,
    }
    for kind, cost in costs.ops.items():
        out[f"usec_per_call_{kind}"] = cost.base_us
        if cost.per_item_us:
            out[f"usec_per_item_{kind}"] = cost.per_item_us
    errors = []
    for row in checks:
        n = row["workers"]
        out[f"predicted_redis_cpu_{n}w"] = row["predicted_cpu"]
        out[f"measured_redis_cpu_{n}w"] = row["measured_cpu"]
        if row["cpu_ratio"] is not None:
            errors.append(abs(row["cpu_ratio"] - 1))
    out["model_error_max"] = round(max(errors), 3) if errors else None
    # The check's worst measured/predicted ratio carries the isolated costs
    # over to a live fleet: the predictions below use it (conservative).
    ratios = [1 / row["cpu_ratio"] for row in checks if row["cpu_ratio"]]
    live = max([1.0, *ratios])
    out["live_factor"] = round(live, 3)
    costs = replace(costs, live_factor=live)
    print(f"live factor (measured / predicted CPU, worst): {live:.2f}")
    print("prediction (one server):")
    for pages in (5, 20, 50):
        cfg = replace(base, pages_per_s=pages)
        for n in (10, 100, 1000):
            load = fleetmodel.predict(cfg, n, costs)
            out[f"predicted_cpu_{n}w_at_{pages}pps"] = round(load.cpu, 4)
            out[f"predicted_commands_per_s_{n}w_at_{pages}pps"] = round(load.commands_per_s)
            print(
                f"  {n:5d} workers x {pages:2d} pages/s: CPU {load.cpu:7.1%}  "
                f"{load.commands_per_s:9.0f} commands/s  {load.cpu_per_page_us:5.1f} us/page"
            )
        sat = fleetmodel.saturation_workers(cfg, costs, 1.0)
        sat70 = fleetmodel.saturation_workers(cfg, costs, 0.7)
        out[f"saturation_workers_at_{pages}pps"] = sat
        out[f"workers_at_70pct_cpu_at_{pages}pps"] = sat70
        plan = fleetmodel.cluster_plan(cfg, 1000, costs)
        out[f"cluster_masters_for_1000w_at_{pages}pps"] = plan.masters
        print(f"  saturation at {pages} pages/s: {sat} workers (70 %: {sat70}); 1,000 workers: "
              f"{plan.reason}")  # fmt: skip
    out["cluster_masters_for_1000w"] = out["cluster_masters_for_1000w_at_20pps"]
    out["max_masters_1024_partitions_imbalance_1_25"] = fleetmodel.max_masters(PARTITIONS, 1.25)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    _common.emit_json(out)
    return out


if __name__ == "__main__":
    main()
