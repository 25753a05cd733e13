"""Redis gone when a worker stops (spill and replay) and Redis unreachable at start.

Real processes only: a real ``redis-server`` killed with SIGKILL, a real
``scrapy crawl`` worker stopped with SIGINT while Redis is gone, a second
worker started after Redis came back, the web farm counting what it served.
The spill format itself is tested in ``tests/test_spill.py``.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import redis
from conftest import run_scrapy

from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.core.spill import SpillOps
from scrapy_banker.redis.connection import redacted_url
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.worker import FrontierWorker
from scrapy_banker.settings import load_redis_config
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer, free_port

PER_HOST = 2
PARTITIONS = 64
SCHEDULER = "scrapy_banker.redis.scheduler.BankerRedisScheduler"

pytestmark = pytest.mark.timeout(180)


def _worker(client: redis.Redis, node: str, lease_ttl_ms: int = 60_000) -> FrontierWorker:
    frontier = RedisFrontier(client, prefix="sp", partitions=8, lease_ttl_ms=lease_ttl_ms)
    return FrontierWorker(frontier, NodeRegistry(client, frontier), node)


def _replay(worker: FrontierWorker, ops: SpillOps) -> dict[str, int]:
    """Drive one replay as the worker thread's first step does; its counters."""
    done: list[bool] = []
    worker.replay(ops, lambda: done.append(True))
    assert worker.pending_ops() == len(ops)
    assert worker.replayer.run_once()
    assert done == [True] and worker.pending_ops() == 0
    return worker.take_counters()


@pytest.mark.slow  # a real redis-server
def test_a_replay_is_idempotent_and_a_stale_ack_changes_nothing(
    redis_client: redis.Redis,
) -> None:
    frontier = RedisFrontier(redis_client, prefix="sp", partitions=8, lease_ttl_ms=1)
    for p in (1, 2):
        frontier.set_owner(p, "n", 1)
    frontier.enqueue(1, "fp-old", "old")
    frontier.enqueue(2, "fp-stale", "stale")
    (old,) = frontier.pop(1, "n", 1)
    (stale,) = frontier.pop(2, "n", 1)
    time.sleep(0.01)
    assert frontier.reap(2) == (1, 0)  # its lease expired: back in the queue ...
    (again,) = frontier.pop(2, "n", 1)  # ... and delivered again, to a new holder
    assert again.deliveries == stale.deliveries + 1
    ops = SpillOps(
        enqueues=[EnqueueOp(1, "fp-old", "old"), EnqueueOp(3, "fp-new", "new")],
        acks=[LeaseToken(1, old.id, old.deliveries), LeaseToken(2, stale.id, 1)],
    )
    counters = _replay(_worker(redis_client, "r1"), ops)
    assert counters["banker/redis/spill/replayed"] == 4
    assert counters["banker/redis/spill/enqueued"] == 1  # fp-old was seen already
    assert counters["banker/redis/acked"] == 1  # the stale ack did nothing ...
    assert frontier.leased(2) == 1  # ... the new holder keeps its lease
    assert frontier.leased(1) == 0 and frontier.queued(3) == 1
    # The same spill again (a replay cut short and repeated): nothing changes.
    counters = _replay(_worker(redis_client, "r2"), ops)
    assert counters["banker/redis/spill/replayed"] == 4
    assert counters.get("banker/redis/spill/enqueued", 0) == 0
    assert counters.get("banker/redis/acked", 0) == 0
    assert frontier.queued(3) == 1 and frontier.leased(2) == 1


def test_what_a_stopping_worker_could_not_send_is_handed_out_in_order() -> None:
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    worker = _worker(client, "gone")
    worker.replay(SpillOps(enqueues=[EnqueueOp(0, "fp-0", "older")]), lambda: None)
    worker.enqueue(EnqueueOp(5, "fp-5", "child", 2))
    worker.ack(LeaseToken(4, "id-4", 1))
    worker.nack(LeaseToken(6, "id-6", 2))
    worker.dead_letter(LeaseToken(7, "id-7", 3), "malformed: x")
    assert worker.stop(timeout=0.3) == 5
    unsent = worker.take_unsent()
    assert unsent == SpillOps(
        enqueues=[EnqueueOp(0, "fp-0", "older"), EnqueueOp(5, "fp-5", "child", 2)],
        dead=[(LeaseToken(7, "id-7", 3), "malformed: x")],
        acks=[LeaseToken(4, "id-4", 1)],
        nacks=[LeaseToken(6, "id-6", 2)],
    )
    assert worker.pending_ops() == 0
    client.close()


def _settings(server: RedisServer, node: str, jobdir: Path) -> dict[str, object]:
    return {
        "SCHEDULER": SCHEDULER,
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server.url,
        "REDIS_PARAMS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        "JOBDIR": str(jobdir),  # the spill goes to JOBDIR/banker-redis-spill
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": PARTITIONS,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_REDIS_NODE_TIMEOUT": 3.0,
        "BANKER_REDIS_LEASE_TTL": 3.0,
        "BANKER_REDIS_REAP_INTERVAL": 1.0,
        "BANKER_REDIS_RETRIES": 1,
        "BANKER_REDIS_BACKOFF_CAP": 0.2,
        "BANKER_REDIS_CONNECT_TIMEOUT": 10,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": PER_HOST,
    }


def _served(farm: WebFarm) -> int:
    return int(farm.stats()["requests"])


def _wait_served(farm: WebFarm, n: int, worker: FleetWorker) -> None:
    deadline = time.monotonic() + 60
    while _served(farm) < n:
        assert time.monotonic() < deadline, "the crawl made no progress"
        assert worker.proc.poll() is None, f"worker ended early:\n{worker.log_tail()}"
        time.sleep(0.02)


def _wait_quiet(farm: WebFarm, quiet_s: float = 1.0, timeout: float = 30.0) -> None:
    """Until the farm served nothing for ``quiet_s``: the worker used up its buffer."""
    deadline = time.monotonic() + timeout
    last, since = _served(farm), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the worker kept fetching with Redis gone"
        time.sleep(0.05)
        n = _served(farm)
        if n != last:
            last, since = n, time.monotonic()


@pytest.mark.slow  # a redis-server, the farm, two worker processes
def test_redis_gone_at_stop_spills_and_the_next_worker_replays_it(tmp_path: Path) -> None:
    jobdir = tmp_path / "job"
    spill = jobdir / "banker-redis-spill"
    # Durable Redis (AOF, fsync always): what it acknowledged survives its kill.
    durable = ["--appendonly", "yes", "--appendfsync", "always"]
    config = FarmConfig(seed=3, hosts=20, total_pages=700, latency_ms=40.0)
    with WebFarm(config) as farm, RedisServer(extra_args=durable) as server:
        seeds = farm.start_urls()
        first = FleetWorker(
            "w0", tmp_path, {"settings": _settings(server, "w0", jobdir), "seeds": seeds}
        )
        # Early, while most links a page yields are new: they are the
        # requests only the spill will know about.
        _wait_served(farm, len(farm.expected_urls()) // 15, first)
        server.kill()  # for good: it only comes back after the worker stopped
        _wait_quiet(farm)  # the buffered and in-flight requests are done
        first.proc.send_signal(signal.SIGINT)  # a clean stop, Redis still gone
        assert first.wait(60) == 0, first.log_tail()
        stopped = first.stats()
        written = stopped["banker/redis/spill/written"]
        # A link found twice while Redis was away is written once.
        assert 0 < written <= stopped["banker/redis/unsent_at_close"]
        files = sorted(spill.glob("spill-*.jsonl"))
        assert len(files) == 1, files
        log = first.log_path.read_text("utf-8")
        assert str(files[0]) in log and "enqueue" in log  # the log names file and kinds
        lines = [json.loads(line) for line in files[0].read_text("utf-8").splitlines()]
        assert lines[0]["kind"] == "header" and all(line["v"] == 1 for line in lines)
        kinds = {line.get("op") for line in lines[1:]}
        assert {"enqueue", "ack"} <= kinds  # children never sent, parents never acked
        served_before = _served(farm)
        assert served_before < len(farm.expected_urls())
        with files[0].open("a", encoding="utf-8") as f:
            f.write('{"v": 1, "op": "ack", "p": "torn\n')  # a damaged line: never fatal

        server.start()  # same port, same AOF: the crawl as Redis last confirmed it
        second = FleetWorker(
            "w1", tmp_path, {"settings": _settings(server, "w1", jobdir), "seeds": seeds}
        )
        assert second.wait(120) == 0, second.log_tail()
        stats = second.stats()

        fetches: dict[str, int] = farm.stats(urls=True)["fetches"]
        expected = farm.expected_urls()
        assert set(fetches) == expected, f"lost {len(expected - set(fetches))} pages"
        # The replay acked what the first worker fetched before the reaper
        # could requeue it: nothing fetched twice.
        assert sum(n - 1 for n in fetches.values()) == 0
        assert max(farm.stats(urls=True)["max_inflight_per_host"].values()) <= PER_HOST
        assert stats["finish_reason"] == "finished"
        assert stats["banker/redis/spill/replayed"] == written
        # Requests only the spill knew about: without it they were lost.
        assert stats["banker/redis/spill/enqueued"] > 0
        assert stats["banker/redis/spill/malformed"] == 1
        assert files[0].with_name(files[0].name + ".bad").read_text("utf-8").startswith('{"v": 1')
        assert not list(spill.glob("spill-*.jsonl"))  # removed once Redis confirmed
        client = redis.Redis.from_url(server.url)
        assert RedisFrontier(client, prefix="banker:fleet", partitions=PARTITIONS).census().drained
        client.close()


@pytest.mark.slow  # a scrapy crawl process
def test_redis_unreachable_at_start_fails_scrapy_crawl_with_a_masked_url(
    tmp_path: Path,
) -> None:
    port = free_port()  # nobody listens there
    secret = "hunter2-not-for-logs"
    url = f"redis://:{secret}@127.0.0.1:{port}/3"
    args = [
        "crawl", "farm", "-a", "port=1",
        "-s", f"SCHEDULER={SCHEDULER}", "-s", f"REDIS_URL={url}",
        "-s", "BANKER_REDIS_CONNECT_TIMEOUT=1", "-s", "TELNETCONSOLE_ENABLED=False",
        "-s", f"JOBDIR={tmp_path / 'job'}",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = run_scrapy(*args, timeout=60, expect=None)
    elapsed = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert f"redis://:***@127.0.0.1:{port}/3" in output
    assert "BANKER_REDIS_CONNECT_TIMEOUT" in output
    assert secret not in output
    assert elapsed < 30, elapsed  # the timeout, not redis-py's retries forever


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@h:6379/2", "redis://:***@h:6379/2"),
        ("rediss://user:s3cret@h:6380/0", "rediss://user:***@h:6380/0"),
        ("redis://s3cret@h:6379", "redis://:***@h:6379"),
        ("redis://h:6379/0?password=s3cret&db=1", "redis://h:6379/0?password=***&db=1"),
        ("unix:///run/redis.sock?password=s3cret", "unix:///run/redis.sock?password=***"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_the_url_in_errors_never_shows_the_password(url: str, shown: str) -> None:
    assert redacted_url({"REDIS_URL": url}) == shown


def test_without_redis_url_the_address_is_built_from_host_port_and_db() -> None:
    settings = {"REDIS_HOST": "r1", "REDIS_PORT": 7000, "REDIS_PARAMS": {"password": "s3cret"}}
    assert redacted_url(settings) == "redis://:***@r1:7000/0"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("BANKER_REDIS_CONNECT_TIMEOUT", -1, r"BANKER_REDIS_CONNECT_TIMEOUT=-1: expected seconds"),
        ("BANKER_REDIS_CONNECT_TIMEOUT", "soon", r"0: wait forever"),
        ("BANKER_REDIS_SPILL_DIR", "", r"BANKER_REDIS_SPILL_DIR='': expected a file path"),
        ("BANKER_REDIS_SPILL_DIR", 3, r"BANKER_REDIS_SPILL_DIR=3"),
    ],
)
def test_bad_values_fail_at_start_up_naming_the_setting(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_redis_config({name: value})
    assert load_redis_config({"BANKER_REDIS_CONNECT_TIMEOUT": "0"}).connect_timeout == 0.0


def test_the_spill_directory_is_the_setting_else_jobdir_else_the_project_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_banker.redis.store.spill_keeper import spill_dir

    monkeypatch.chdir(tmp_path)  # no scrapy.cfg here: data_path is ./.scrapy
    explicit = get_crawler(settings_dict={"BANKER_REDIS_SPILL_DIR": str(tmp_path / "s")})
    assert spill_dir(explicit, "x") == str(tmp_path / "s")
    jobdir = get_crawler(settings_dict={"JOBDIR": str(tmp_path / "job")})
    assert spill_dir(jobdir, "x") == str(tmp_path / "job" / "banker-redis-spill")
    assert spill_dir(get_crawler(), "my/spider") == str(
        Path(".scrapy") / "banker-spill" / "my_spider"
    )
