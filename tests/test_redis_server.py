"""The Redis harness is a real server, not an emulation."""

from __future__ import annotations

import os

import pytest
import redis

from scrapy_banker.testing.redis_server import (
    RedisServer,
    RedisServerError,
    find_redis_server,
)


@pytest.mark.slow
def test_info_reports_a_real_server_on_our_port(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    info = redis_client.info("server")
    assert info["tcp_port"] == redis_server.port
    major = int(str(info["redis_version"]).split(".")[0])
    assert major >= 6
    assert int(info["process_id"]) == redis_server.proc.pid  # type: ignore[union-attr]
    # Persistence is off: tests never write dump files into the tree.
    assert redis_client.config_get("save")["save"] == ""
    assert redis_client.config_get("appendonly")["appendonly"] == "no"


@pytest.mark.slow
def test_lua_runs_atomically_on_the_server(redis_client: redis.Redis) -> None:
    script = """
    local v = redis.call('INCRBY', KEYS[1], ARGV[1])
    redis.call('RPUSH', KEYS[2], v)
    return {v, redis.call('LLEN', KEYS[2])}
    """
    assert redis_client.eval(script, 2, "{p}:n", "{p}:log", 5) == [5, 1]
    assert redis_client.eval(script, 2, "{p}:n", "{p}:log", 7) == [12, 2]
    assert redis_client.lrange("{p}:log", 0, -1) == [b"5", b"12"]


@pytest.mark.slow
def test_xautoclaim_reclaims_a_stale_pending_entry(redis_client: redis.Redis) -> None:
    redis_client.xgroup_create("s", "g", id="0", mkstream=True)
    entry = redis_client.xadd("s", {"url": "http://h0000.farm.test/"})
    got = redis_client.xreadgroup("g", "dead-worker", {"s": ">"}, count=1)
    assert got[0][1][0][0] == entry
    _next, claimed, *_ = redis_client.xautoclaim("s", "g", "live-worker", min_idle_time=0)
    assert [e[0] for e in claimed] == [entry]
    pending = redis_client.xpending_range("s", "g", min="-", max="+", count=10)
    assert pending[0]["consumer"] == b"live-worker"
    assert pending[0]["times_delivered"] == 2


@pytest.mark.slow
def test_server_time_is_the_servers_clock(redis_client: redis.Redis) -> None:
    seconds, micros = redis_client.time()
    assert seconds > 1_600_000_000 and 0 <= micros < 1_000_000


@pytest.mark.slow
def test_restart_keeps_port_and_loses_data() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        old_pid = server.proc.pid  # type: ignore[union-attr]
        server.restart()
        assert server.proc.pid != old_pid  # type: ignore[union-attr]
        assert client.get("k") is None  # persistence off: a restart is a cold start
        client.close()
    assert server.proc is None


@pytest.mark.slow
def test_kill_makes_clients_fail_until_restart() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=1)
        assert client.ping()
        server.kill()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        server.start()
        assert client.ping()
        client.close()


def test_bad_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BANKER_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(RedisServerError, match="BANKER_REDIS_SERVER"):
        find_redis_server()


def test_binary_is_found_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BANKER_REDIS_SERVER", raising=False)
    path = find_redis_server()
    assert os.access(path, os.X_OK)
    assert os.path.basename(path) == "redis-server"
