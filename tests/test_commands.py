"""``scrapy banker status / explain / assign / deadletters`` as real subprocesses.

The fleet state is made by real workers (two ``FleetWorker`` processes, one
real redis-server, the web farm): a crawl in which one host answers only
after 60 s, so the workers stay alive and busy while the commands look at
them; then the workers are killed (``SIGKILL``) and the commands see dead
owners, an expired lease, and what a producer queues meanwhile.  A single
node's JOBDIR comes from a real ``scrapy crawl`` of example_project stopped
with SIGINT.  A fleet's revisit states are written as its workers write them
(``RevisitStates.save_many``) in the partitions the crawl's classifier
gives their URLs.  Every read-only command is checked to write nothing: the
persistent keys are dumped before and after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import PROJECT, TESTS, run_scrapy
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.request import RequestFingerprinter

from scrapy_banker.core.change_rate import RateEstimate, freshness
from scrapy_banker.core.hashing import bkdr
from scrapy_banker.core.journal import parse_enqueue
from scrapy_banker.core.ops import RevisitWrite
from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.ops.fleet_view import read_fleet
from scrapy_banker.ops.jobdir_view import jobdir_directory
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.keys import Keyspace
from scrapy_banker.scheduler.classifier import Classifier
from scrapy_banker.scheduler.downloader import DownloaderView
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.settings import load_config
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer

PARTITIONS = 64
PREFIX = "banker:fleet"
SLOW_HOST = 0
NODE_TIMEOUT = 3.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _banker(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``scrapy banker ...`` to completion, whatever its exit code (:func:`_ok`, :func:`_error`)."""
    return run_scrapy("banker", *args, cwd=cwd or TESTS, timeout=timeout, expect=None)


def _ok(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _error(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit code 2 and exactly one line on stderr, nothing on stdout."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert not proc.stdout.strip()
    return lines[0]


def _dump(client: redis.Redis) -> dict[bytes, Any]:
    """Every key without an expiry, with its type and content.

    By content, not ``DUMP``: a read may advance Redis's incremental rehash
    of a set or hash, which changes ``DUMP``'s order but not the data.
    """
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(count=1000):
        if client.ttl(key) != -1:
            continue
        kind = client.type(key)
        if kind == b"string":
            value: Any = client.get(key)
        elif kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"set":
            value = sorted(client.smembers(key))
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            value = client.lrange(key, 0, -1)
        else:
            value = client.dump(key)
        out[key] = (kind, value)
    return out


@dataclass
class Fleet:
    server: RedisServer
    farm: WebFarm
    client: redis.Redis
    workers: list[FleetWorker]
    #: The planted malformed payload's partition.
    planted: int

    def args(self, *extra: str) -> list[str]:
        return [
            "fleet", "-s", f"REDIS_URL={self.server.url}",
            "-s", f"BANKER_REDIS_PARTITIONS={PARTITIONS}",
            "-s", f"BANKER_REDIS_NODE_TIMEOUT={NODE_TIMEOUT}",
            "-s", "BANKER_REDIS_HEARTBEAT=0.5", "-s", "BANKER_REDIS_LEASE_TTL=3",
            *extra,
        ]  # fmt: skip

    def keyspace(self) -> Keyspace:
        return Keyspace(PREFIX, PARTITIONS)


def _worker_settings(server: RedisServer, node: str) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler",
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server.url,
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": PARTITIONS,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_REDIS_NODE_TIMEOUT": NODE_TIMEOUT,
        "BANKER_REDIS_LEASE_TTL": 3.0,
        "BANKER_REDIS_REAP_INTERVAL": 1.0,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "BANKER_TOPIC_RULES": [{"url": r"/news/", "topic": "news"}],
        "DOWNLOAD_TIMEOUT": 120,
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two workers crawl the farm; host 0 answers after 60 s, so they stay busy with it."""
    tmp = tmp_path_factory.mktemp("fleet")
    # No cross-host links: nothing but the slow host's root leads to its pages.
    config = FarmConfig(seed=5, hosts=8, total_pages=120, latency_ms=5.0,
                        cross_host_link_prob=0.0,
                        host_latency_ms={SLOW_HOST: 60_000.0})  # fmt: skip
    with RedisServer() as server, WebFarm(config) as farm:
        client = redis.Redis.from_url(server.url)
        # A payload no worker may run: dead-lettered with the codec's reason.
        frontier = RedisFrontier(client, prefix=PREFIX, partitions=PARTITIONS)
        planted = 5
        frontier.enqueue(planted, "f" * 40, "cos\nsystem\n(S'true'\ntR.", priority=100)
        seeds = farm.start_urls()
        workers = [
            FleetWorker(f"w{i}", tmp, {"settings": _worker_settings(server, f"w{i}"),
                                       "seeds": seeds})
            for i in range(2)
        ]  # fmt: skip
        try:
            yield Fleet(server, farm, client, workers, planted)
        finally:
            for w in workers:
                if w.proc.poll() is None:
                    w.kill()
            client.close()


def _settled(fleet: Fleet) -> dict[str, Any]:
    """Wait until every page but the slow host's root is fetched and acked."""
    expected = {u for u in fleet.farm.expected_urls() if f"h{SLOW_HOST:04d}." not in u}
    deadline = time.monotonic() + 90
    while True:
        fetched = set(fleet.farm.stats(urls=True)["fetches"])
        view = read_fleet(fleet.client, fleet.keyspace(), node_timeout_s=NODE_TIMEOUT)
        done = expected <= fetched and view.queued == 0 and view.leased == 1 and view.dead == 1
        if done and len(view.live_nodes) == 2:
            return view.to_json()
        assert time.monotonic() < deadline, (
            len(expected - fetched),
            view.to_json()["totals"],
            [w.log_tail(1500) for w in fleet.workers],
        )
        assert all(w.proc.poll() is None for w in fleet.workers), "a worker ended early"
        time.sleep(0.2)


def _fingerprint(url: str) -> str:
    return RequestFingerprinter().fingerprint(Request(url)).hex()


def test_live_fleet_status_explain_and_assign_dry_run(fleet: Fleet) -> None:
    _settled(fleet)
    started = time.monotonic()
    status = _ok(_banker("status", *fleet.args("--json")))
    assert status["schema"] == 1 and status["kind"] == "fleet"
    assert status["prefix"] == PREFIX and status["partitions"] == PARTITIONS
    nodes = {n["name"]: n for n in status["nodes"]}
    assert set(nodes) == {"w0", "w1"}
    assert all(n["alive"] and n["heartbeat_age_s"] < NODE_TIMEOUT for n in nodes.values())
    assert sum(n["partitions_owned"] for n in nodes.values()) == PARTITIONS
    assert status["table"]["owned"] == PARTITIONS and status["table"]["unowned"] == 0
    # What the crawl did: everything fetched and acked but the slow host's root
    # (leased, in flight), the planted payload dead-lettered.
    totals = status["totals"]
    assert (totals["queued"], totals["leased"], totals["dead"]) == (0, 1, 1)
    assert totals["live_nodes"] == 2 and totals["finished"] > 0
    assert sum(n["dead"] for n in nodes.values()) == 1
    assert sum(n["leased"] for n in nodes.values()) == 1

    # The slow host's root: leased to its partition's owner, being fetched.
    slow = fleet.farm.url(SLOW_HOST, "/")
    explain = _ok(_banker("explain", slow, *fleet.args("--json")))
    assert explain["state"] == "leased" and explain["seen"] is True
    assert explain["fingerprint"] == _fingerprint(slow)
    assert explain["queue_key"] == explain["slot"] == f"h{SLOW_HOST:04d}.farm.test"
    assert explain["key_hash"] == bkdr(explain["queue_key"])
    assert explain["partition"] == explain["key_hash"] % PARTITIONS
    assert explain["owner"] in nodes and explain["owner_alive"] is True
    assert explain["topic"] == "default" and explain["topic_source"] == "stored request"
    (copy,) = explain["copies"]
    if copy["epoch"] == explain["owner_epoch"]:
        assert explain["waiting"].startswith(f"it is leased to {explain['owner']}")
    else:  # leased before its partition moved: the new owner waits (BUSY)
        assert explain["waiting"].startswith(f"it was leased at epoch {copy['epoch']}")
        assert status["table"]["handover"] == 1
    # A fetched page: seen, nothing left of it.
    fetched = fleet.farm.url(1, "/")
    done = _ok(_banker("explain", fetched, *fleet.args("--json")))
    assert done["state"] == "done" and done["seen"] is True and done["waiting"] is None
    # The plan for the live nodes, not written.
    plan = _ok(_banker("assign", *fleet.args("--json")))
    assert plan["kind"] == "assign" and plan["mode"] == "hash" and plan["applied"] is None
    assert {n["name"] for n in plan["nodes"]} == {"w0", "w1"}
    assert sum(n["partitions_after"] for n in plan["nodes"]) == PARTITIONS
    assert plan["table_version"] == status["table"]["version"]
    text = _banker("status", *fleet.args())
    assert text.returncode == 0 and "w0" in text.stdout and "Nodes" in text.stdout
    assert "\x1b[" not in text.stdout  # a pipe gets plain text
    # No BANKER_RECRAWL: no revisits to speak of.
    assert "revisits" not in status and "Revisits" not in text.stdout
    assert done["revisit"] is None
    assert time.monotonic() - started < 60


def test_dead_fleet_explain_deadletters_requeue_and_assign(fleet: Fleet) -> None:
    _settled(fleet)
    for w in fleet.workers:
        w.kill()
    time.sleep(NODE_TIMEOUT + 0.5)
    ks = fleet.keyspace()
    # A producer queues one more page while no worker runs.
    extra = fleet.farm.url(2, "/extra.html")
    frontier = RedisFrontier(fleet.client, prefix=PREFIX, partitions=PARTITIONS)
    partition = bkdr("h0002.farm.test") % PARTITIONS
    assert frontier.enqueue(partition, _fingerprint(extra), RequestCodec().encode(Request(extra)))
    before = _dump(fleet.client)

    status = _ok(_banker("status", *fleet.args("--json")))
    assert status["totals"]["live_nodes"] == 0
    assert status["table"]["owned_by_dead"] == PARTITIONS
    assert (status["totals"]["queued"], status["totals"]["leased"]) == (1, 1)
    assert status["reaper"]["expired_leases"] == 1  # nobody left to reap it
    queued = _ok(_banker("explain", extra, *fleet.args("--json")))
    assert queued["state"] == "queued" and queued["copies"][0]["ahead"] == 0
    assert queued["owner_alive"] is False
    assert queued["waiting"].startswith(f"its owner {queued['owner']} is not live")
    slow = _ok(_banker("explain", fleet.farm.url(SLOW_HOST, "/"), *fleet.args("--json")))
    assert slow["state"] == "leased" and slow["waiting"].startswith("its lease expired")

    letters = _ok(_banker("deadletters", *fleet.args("--json")))
    assert letters["count"] == 1
    (letter,) = letters["letters"]
    assert letter["partition"] == fleet.planted and letter["id"] == "1"
    assert letter["reason"].startswith("malformed") and letter["payload_error"]
    listing = _banker("deadletters", *fleet.args())
    assert listing.returncode == 0 and "malformed" in listing.stdout

    # Errors: one line, exit 2, within seconds.
    t0 = time.monotonic()
    unreachable = _error(
        _banker("status", "fleet", "-s", "REDIS_URL=redis://:s3cret@127.0.0.1:1/0")
    )
    assert "unreachable" in unreachable and "s3cret" not in unreachable
    assert time.monotonic() - t0 < 10
    assert "not in this crawl" in _error(
        _banker("explain", fleet.farm.url(3, "/never.html"), *fleet.args())
    )
    assert "no crawl under prefix" in _error(_banker("status", *fleet.args("--prefix", "nope")))
    assert "no live node" in _error(_banker("assign", *fleet.args()))
    assert "--requeue" in _error(_banker("deadletters", *fleet.args("--requeue", "0")))
    assert _dump(fleet.client) == before, "a read-only command wrote to Redis"

    # Requeue on purpose: the letter goes back to its partition's queue, once.
    requeued = _ok(_banker("deadletters", *fleet.args("--requeue", "all", "--json")))
    assert [r["id"] for r in requeued["requeued"]] == [letter["id"]]
    assert requeued["requeued"][0]["new_id"] == "2"
    k = ks.partition(fleet.planted)
    assert fleet.client.llen(k.dead) == 0
    (entry,) = fleet.client.lrange(k.level(0), 0, -1)
    assert entry.startswith(b"2 ")  # queued under its new id, its payload as it was
    assert fleet.client.sismember(k.seen, "f" * 40)
    again = _ok(_banker("deadletters", *fleet.args("--requeue", "all", "--json")))
    assert again["requeued"] == [] and again["skipped"] == []

    # A worker joins: the plan gives it every partition of the dead ones;
    # shown without writing, then written with --apply (new epochs, owner keys).
    registry = NodeRegistry(fleet.client, frontier, node_timeout_ms=int(NODE_TIMEOUT * 1000))
    registry.register("w2")
    version = registry.table_version()
    registry.heartbeat("w2")  # live for NODE_TIMEOUT s from here
    before = _dump(fleet.client)
    plan = _ok(_banker("assign", *fleet.args("--json")))
    assert _dump(fleet.client) == before, "assign without --apply wrote to Redis"
    assert plan["moves"] == PARTITIONS and plan["applied"] is None
    assert plan["moved_work"] == 3  # the extra page, the slow root, the requeued letter
    assert plan["handover_waits"] == 1  # the slow root's partition waits for its lease
    assert registry.table_version() == version
    registry.heartbeat("w2")
    applied = _ok(_banker("assign", *fleet.args("--apply", "--json")))
    assert applied["applied"] == PARTITIONS and applied["table_version_after"] == version + 1
    table = registry.load_table()
    assert set(table.owners) == {"w2"}
    assert frontier.owner(partition) == f"w2@{table.epochs[partition]}"


def test_fleet_status_and_explain_show_the_revisit_states_kept_in_redis(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    prefix, partitions = "banker:revisits", 16
    args = ["--prefix", prefix, "-s", f"REDIS_URL={redis_server.url}",
            "-s", f"BANKER_REDIS_PARTITIONS={partitions}"]  # fmt: skip
    classifier = Classifier(load_config(Settings()), DownloaderView(), None)

    def partition(url: str) -> int:  # as explain (and the crawl's FleetRevisits) computes it
        return classifier.classify(Request(url)).key_hash % partitions

    now = time.time()
    rate = RateEstimate(changed=2, changed_s=7200.0, unchanged_n=1, unchanged_s=3600.0)
    states = {
        "http://a.test/changing": UrlState(due=now - 600, interval=3600.0, fetched=now - 4200,
                                           changes=2, unchanged=1, rate=rate),
        # 30 s of slack: the commands run a few seconds after "now".
        "http://a.test/quiet": UrlState(due=now + 3 * 3600 + 12 * 60 + 30, interval=4 * 3600.0,
                                        fetched=now - 3000, unchanged=4),
        "http://b.test/failing": UrlState(due=now - 65, interval=30.0, fetched=now - 95,
                                          failures=1),
    }  # fmt: skip
    writes = [
        RevisitWrite(partition(url), url, json.dumps(state.to_json()), state.due, "")
        for url, state in states.items()
    ]
    broken = "http://c.test/broken"
    writes.append(RevisitWrite(partition(broken), broken, "{not json", now - 5, ""))
    assert len({w.partition for w in writes}) > 1  # spread over partitions
    frontier = RedisFrontier(redis_client, prefix=prefix, partitions=partitions)
    assert frontier.revisits.save_many(writes) == 4
    before = _dump(redis_client)

    # status: the fleet's states summed as a JOBDIR's are (the crawl is nothing else yet).
    status = _ok(_banker("status", *args, "--json"))
    assert status["kind"] == "fleet" and status["totals"]["queued"] == 0
    revisits = status["revisits"]
    assert (revisits["pages"], revisits["due_now"], revisits["malformed"]) == (3, 2, 1)
    assert (revisits["changes"], revisits["unchanged"], revisits["failures"]) == (2, 5, 1)
    assert revisits["most_overdue_s"] == pytest.approx(600, abs=30)
    assert revisits["next_due_s"] == pytest.approx(3 * 3600 + 12 * 60 + 30, abs=30)
    estimated = rate.rate()
    assert estimated is not None
    assert revisits["freshness"] == pytest.approx((freshness(estimated, 1 / 3600) + 2.0) / 3)
    text = _banker("status", *args)
    assert text.returncode == 0, text.stderr[-3000:]
    (line,) = [x for x in text.stdout.splitlines() if x.startswith("Revisits:")]
    assert line.startswith("Revisits: 3 pages, 2 due now (the latest 10 min ")
    assert line.endswith(
        f", the next in 3 h 12 min; fetches found 2 changed, 5 unchanged, 1 failed; "
        f"estimated freshness {revisits['freshness']:.2f}"
    )

    # explain: a page known only by its revisit state, in words; its partition's.
    quiet = _ok(_banker("explain", "http://a.test/quiet", *args, "--json"))
    assert quiet["partition"] == partition("http://a.test/quiet")
    assert quiet["state"] == "unknown" and quiet["seen"] is False
    assert quiet["revisit"] == "due in 3 h 12 min, every 4 h, unchanged 4 times"
    failing = _ok(_banker("explain", "http://b.test/failing", *args, "--json"))
    assert failing["revisit"].startswith("due now (1 min ")
    assert failing["revisit"].endswith(" late), every 30 s, failed once")
    printed = _banker("explain", "http://a.test/changing", *args)
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert "Revisit: due now (10 min " in printed.stdout
    assert "every 1 h, unchanged once, changed 2 times" in printed.stdout
    unreadable = _ok(_banker("explain", broken, *args, "--json"))
    assert unreadable["revisit"] is None
    assert any("revisit state" in n and "does not read" in n for n in unreadable["notes"])
    assert "not in this crawl" in _error(_banker("explain", "http://a.test/never", *args))
    assert _dump(redis_client) == before, "a read-only command wrote to Redis"


def test_unknown_spider_in_a_project_is_one_line() -> None:
    line = _error(_banker("status", "nosuch", cwd=PROJECT))
    assert line == "scrapy banker status: unknown spider 'nosuch' (this project has: farm)"
    assert "no JOBDIR" in _error(_banker("status", "--jobdir", "/nonexistent/job", cwd=PROJECT))


def test_single_node_jobdir_status_after_sigint(tmp_path: Path) -> None:
    config = FarmConfig(seed=3, hosts=4, total_pages=400, latency_ms=150.0)
    jobdir = tmp_path / "job"
    with WebFarm(config) as farm:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy.cmdline", "crawl", "farm", "-a", f"port={farm.port}",
             "-a", "hosts=4", "-s", f"JOBDIR={jobdir}", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1",
             "-s", "LOG_LEVEL=WARNING"],
            cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(PROJECT)},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while farm.stats()["requests"] < 30:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    status = _ok(_banker("status", "--jobdir", str(jobdir), "--json", cwd=PROJECT))
    assert status["kind"] == "jobdir" and status["queued"] > 0
    assert status["queued"] == status["pending"]
    assert sum(t["queued"] for t in status["topics"]) == status["queued"]
    assert sum(b["queued"] for b in status["buckets"]) == status["queued"]
    assert {t["name"] for t in status["topics"]} <= {"news", "products", "archive", "index"}
    assert status["seen"] is not None and status["seen"] >= status["queued"]
    # A saved URL, explained against the JOBDIR: its bucket and topic.
    snapshot = (jobdir / "banker" / "snapshot.jsonl").read_text().splitlines(keepends=True)
    saved = parse_enqueue(next(line for line in snapshot if line.startswith('{"e":')))
    explain = _ok(_banker("explain", json.loads(saved.payload)["url"], "--jobdir", str(jobdir),
                          "--json", cwd=PROJECT))  # fmt: skip
    assert explain["state"] == "queued" and explain["topic"] == saved.topic
    assert explain["key_hash"] == saved.key_hash and explain["seen"] is True
    directory = jobdir_directory(str(jobdir))
    assert directory is not None and explain["bucket"] == directory.lookup(saved.key_hash)
    text = _banker("status", "--jobdir", str(jobdir), cwd=PROJECT)
    assert text.returncode == 0 and "Buckets" in text.stdout


def test_control_actions_on_a_jobdir_from_the_command_line(tmp_path: Path) -> None:
    """``pause|limit|delay|control --jobdir DIR`` outside a project (issue #31 item 7).

    The JOBDIR's pending requests name the hosts the command knows (what a
    crawl of ``http://127.0.0.1:8731/`` would have saved: slot ``127.0.0.1``).
    """
    from test_ops_control import make_jobdir

    jobdir = str(make_jobdir(tmp_path / "job"))
    paused = _banker("pause", "127.0.0.1:8731", "--jobdir", jobdir, cwd=tmp_path)
    assert paused.returncode == 0, paused.stderr
    note, line = paused.stdout.strip().splitlines()
    assert note.startswith("Note: '127.0.0.1:8731' taken as host '127.0.0.1'")
    assert line.startswith("pause 127.0.0.1: in force in the crawl on this JOBDIR")
    control = json.loads((tmp_path / "job" / "banker" / "control.json").read_text())
    assert control["hosts"] == {"127.0.0.1": {"paused": True}}

    # Bad input: one line naming the argument, the value and what is allowed; nothing changed.
    assert _error(
        _banker("limit", "127.0.0.1", "99999999999999999999", "--jobdir", jobdir, cwd=tmp_path)
    ) == (
        "scrapy banker limit: limit: N must be an integer >= 1 or 'none', "
        "got '99999999999999999999' (at most 10,000)"
    )
    assert "got 'nan'" in _error(_banker("delay", "a.test", "nan", "--jobdir", jobdir,
                                         cwd=tmp_path))  # fmt: skip
    typo = _error(_banker("pause", "http://shop.example.co:8731/", "--jobdir", jobdir,
                          cwd=tmp_path))  # fmt: skip
    assert "no pending request of 'shop.example.co'" in typo
    assert "did you mean shop.example.com?" in typo
    assert json.loads((tmp_path / "job" / "banker" / "control.json").read_text()) == control

    delayed = _ok(_banker("delay", "a.test", "0.5", "--jobdir", jobdir, "--json", cwd=tmp_path))
    assert (delayed["schema"], delayed["kind"], delayed["done"]) == (
        1, "action-jobdir", "delay a.test 0.5",
    )  # fmt: skip
    shown = _ok(_banker("control", "--jobdir", jobdir, "--json", cwd=tmp_path))
    assert (shown["schema"], shown["kind"]) == (1, "control-jobdir")
    assert [e["verb"] for e in shown["log"]] == ["delay", "pause"]
    text = _banker("control", "--jobdir", jobdir, cwd=tmp_path)
    assert text.returncode == 0 and "{" not in text.stdout and "\x1b[" not in text.stdout
    assert "pause 127.0.0.1" in text.stdout and "delay a.test 0.5" in text.stdout
