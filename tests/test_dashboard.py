"""The live dashboard: its HTTP API, and the page in a real browser on a live fleet.

The browser test runs three real worker processes on the web farm and one
real redis-server, starts ``scrapy banker dashboard`` as its own process and
drives Debian's headless Chromium with Playwright: the page must list the
live nodes, show a page count that moves while the crawl runs, requeue dead
letters with the token, and refuse an unauthenticated POST.  The screenshots
are kept in the test's temporary folder (their paths are printed) so a human
can look at them.

Run-time control (issue #27): ``POST /api/control`` over real HTTP against a
real redis-server -- refused (403, 401, 400 with the reason, 413) without
changing the control document, carried out and logged with the right token --
and the page's control form driven in headless Chromium.

A single process (issue #31): ``scrapy banker dashboard --jobdir DIR`` on the
JOBDIR of a real crawl of ``example_project`` (stopped with SIGINT, and one
still running): the state JSON is the JOBDIR's read model, nothing changes
without the token, and ``pause HOST`` lands in ``JOBDIR/banker/control.json``
and its log through the same code as ``scrapy banker pause HOST --jobdir``,
which the running crawl follows; the page in headless Chromium.  Without
``--jobdir`` and ``REDIS_URL`` the command says what every command says and
exits 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import PROJECT, ROOT, child_env, run

from scrapy_banker.core.directives import FLEET, JOBDIR, VERBS, ControlState
from scrapy_banker.core.hashing import bkdr
from scrapy_banker.core.journal import enqueue_line
from scrapy_banker.ops.dashboard.history import RateHistory
from scrapy_banker.ops.jobdir_view import read_jobdir
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.control_channel import ControlChannel
from scrapy_banker.scheduler.control_file import CONTROL_FILE, CONTROL_LOG, ControlFile
from scrapy_banker.scheduler.jobdir import JobdirLock
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker
from scrapy_banker.testing.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(180)

SCRAPY = str(Path(sys.executable).with_name("scrapy"))
#: The command under test.
COMMAND = [SCRAPY, "banker", "dashboard"]
CHROMIUM = "/usr/bin/chromium"
PARTITIONS = 64
PREFIX = "banker:fleet"  # BANKER_REDIS_PREFIX's default for the fleet spider ("fleet")
TOKEN = "s3cret-dashboard-token"
#: The flags Chromium needs on a machine with no display and no internet.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


# -- helpers ----------------------------------------------------------------------------


class Dashboard:
    """``scrapy banker dashboard`` as a real process; its URL read from what it prints.

    On the fleet at ``redis_url``, or with ``jobdir`` on a single process's JOBDIR.
    """

    def __init__(
        self,
        redis_url: str | None,
        *extra: str,
        bind: str | None = None,
        jobdir: str | Path | None = None,
    ) -> None:
        self.port = free_port()
        args = [*COMMAND, "fleet" if jobdir is None else f"--jobdir={jobdir}"]
        args += ["--port", str(self.port)]
        if bind is not None:
            args += ["--bind", bind]
        args += ["--refresh", "0.5"]
        if redis_url is not None:
            args += ["-s", f"REDIS_URL={redis_url}", "-s", f"BANKER_REDIS_PARTITIONS={PARTITIONS}"]
        args += extra
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.banner = self.proc.stdout.readline()
        if not self.banner:
            _out, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"the dashboard did not start:\n{err}")
        host = "127.0.0.1" if bind in (None, "0.0.0.0") else bind
        self.url = f"http://{host}:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return _http("GET", f"{self.url}{path}", headers=headers)

    def post(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        return _http("POST", f"{self.url}{path}", body, headers)

    def state(self) -> dict[str, Any]:
        status, data = self.get("/api/state")
        assert status == 200, data
        assert isinstance(data, dict)
        return data

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        _out, err = self.proc.communicate()
        return err


def _http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


@pytest.fixture
def dashboards() -> Iterator[list[Dashboard]]:
    started: list[Dashboard] = []
    yield started
    for d in started:
        d.close()


def _worker_settings(server: RedisServer, node: str) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_banker.redis.scheduler.BankerRedisScheduler",
        "ADDONS": {"scrapy_banker.Addon": 500},
        "REDIS_URL": server.url,
        "REDIS_PARAMS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        "BANKER_REDIS_NODE_ID": node,
        "BANKER_REDIS_PARTITIONS": PARTITIONS,
        "BANKER_REDIS_HEARTBEAT": 0.5,
        "BANKER_REDIS_NODE_TIMEOUT": 3.0,
        "BANKER_REDIS_LEASE_TTL": 3.0,
        "BANKER_REDIS_IDLE_BEFORE_CLOSE": 1.0,
        "BANKER_TIMESERIES_INTERVAL": 0.5,
        "BANKER_TOPICS": {
            "news": {"priority": 0},
            "products": {"priority": 0},
            "archive": {"priority": 0},
        },
        "BANKER_TOPIC_RULES": [
            {"url": r"/news/", "topic": "news"},
            {"url": r"/products/", "topic": "products"},
            {"url": r"/archive/", "topic": "archive"},
        ],
        "BANKER_RESOURCES": {"sessions": 4, "browser_pages": 2},
        # Network-aware placement, so the page has a GNP map to draw.
        "BANKER_PLACEMENT": "top1",
        "BANKER_PLACEMENT_INTERVAL": 2.0,
        "BANKER_GNP_LANDMARK": node in ("w0", "w1"),
        "BANKER_GNP_DIMS": 2,
        "BANKER_PROBE_RATE": 20,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
    }


# -- the pure part: rates from cumulative counters --------------------------------------


def test_rates_come_from_differences_over_a_window_and_survive_restarts() -> None:
    history = RateHistory(span_s=60.0, window_s=2.0)
    assert history.observe(100.0, {"w0": {"news": 0}}) == {"news": 0.0, "*": 0.0}
    history.observe(101.0, {"w0": {"news": 10}})
    # Two seconds after the first reading: (20 - 0) / 2.
    assert history.observe(102.0, {"w0": {"news": 20}, "w1": {"shop": 0}})["news"] == 10.0
    # w0 restarts (its count starts again from 0): the fleet's total does not
    # go backwards; w1 leaves (absent): its pages stay counted.
    rates = history.observe(104.0, {"w0": {"news": 4}, "w1": {"shop": 6}})
    assert rates["news"] == pytest.approx(2.0)  # (24 - 20) / 2
    assert rates["shop"] == pytest.approx(3.0)
    assert rates["*"] == pytest.approx(5.0)
    rates = history.observe(106.0, {"w0": {"news": 8}})
    assert rates == {"news": 2.0, "shop": 0.0, "*": 2.0}
    # A clock that steps back changes nothing.
    assert history.observe(105.0, {"w0": {"news": 1000}}) == rates
    data = history.to_json()
    assert data["t"] == [100.0, 101.0, 102.0, 104.0, 106.0]
    assert data["series"]["news"] == [0.0, 10.0, 10.0, 2.0, 2.0]
    assert data["series"]["shop"] == [0.0, 0.0, 0.0, 3.0, 0.0]
    # Only span_s of history is kept.
    history.observe(200.0, {"w0": {"news": 8}})
    assert history.to_json()["t"] == [200.0]


def test_the_page_names_no_verb_and_the_server_sends_the_verb_table() -> None:
    """The form's verbs, placeholders and value field come from core.control.VERBS."""
    from scrapy_banker.ops.commands.dashboard import verb_info

    static = ROOT / "scrapy_banker" / "ops" / "dashboard" / "static"
    page = (static / "index.html").read_text(encoding="utf-8")
    script = (static / "dashboard.js").read_text(encoding="utf-8")
    assert "<option" not in page
    for verb in VERBS:
        assert f'"{verb}"' not in script and f"'{verb}'" not in script, verb
    for where in (FLEET, JOBDIR):
        info = verb_info(where)
        assert info["verbs"] == {v.name: v.usage for v in VERBS.values() if where in v.where}
        assert info["control_verbs"] == [v.to_json(where) for v in VERBS.values()]
    assert [v["name"] for v in verb_info(JOBDIR)["control_verbs"] if not v["available"]] == [
        "purge", "inject",
    ]  # fmt: skip


# -- the HTTP API, without a browser ------------------------------------------------------


@pytest.mark.slow
def test_api_is_read_only_without_a_token_and_local_by_default(
    redis_server: RedisServer, redis_client: redis.Redis, dashboards: list[Dashboard]
) -> None:
    dash = Dashboard(redis_server.url)
    dashboards.append(dash)
    assert "http://127.0.0.1:" in dash.banner and "read-only" in dash.banner
    state = dash.state()
    assert state["version"] == 1
    assert state["error"] is None
    assert state["server"]["prefix"] == PREFIX
    assert state["server"]["actions"] == {
        "enabled": False, "requeue": False, "pause": False, "control": False,
    }  # fmt: skip
    assert list(state["server"]["verbs"]) == list(VERBS)
    # The verb table, for the page's form: every verb, each one a fleet can carry out.
    assert state["server"]["control_verbs"] == [v.to_json(FLEET) for v in VERBS.values()]
    assert all(v["available"] for v in state["server"]["control_verbs"])
    # The control section: nothing set, nothing logged, nothing charged.
    control = state["control"]
    assert control["state"] == {"version": 0} and control["error"] is None
    assert control["log"] == [] and control["counts"]["crawl"] == 0
    fleet = state["fleet"]
    assert fleet["prefix"] == PREFIX and fleet["partitions"] == PARTITIONS
    assert fleet["nodes"] == [] and fleet["totals"]["dead"] == 0
    assert state["dead_letters"] == []
    assert set(state["rates"]) == {"window_s", "t", "series"}
    # The page and its assets come from the package, with a strict CSP.
    status, page = dash.get("/")
    assert status == 200 and "/static/dashboard.js" in page
    for asset in ("/static/dashboard.js", "/static/dashboard.css", "/static/favicon.svg"):
        assert dash.get(asset)[0] == 200, asset
    assert dash.get("/static/../server.py")[0] == 404
    assert dash.get("/nothing")[0] == 404
    # No token configured: every POST is refused, whatever it carries.
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        status, data = dash.post("/api/deadletters/requeue", {"count": "all"}, headers)
        assert status == 403 and data == {"error": "actions disabled: set BANKER_DASHBOARD_TOKEN"}
    assert dash.post("/api/topics/news/pause", {}, {})[0] == 403
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        status, data = dash.post("/api/control", {"verb": "pause", "args": ["a.example"]}, headers)
        assert status == 403 and data == {"error": "actions disabled: set BANKER_DASHBOARD_TOKEN"}
    assert redis_client.get(f"{PREFIX}:control") is None
    # Another Host than this machine (a DNS-rebinding page) reads nothing.
    status, data = dash.get("/api/state", {"Host": f"evil.example:{dash.port}"})
    assert status == 403 and "Host" in data["error"]
    # Bound to loopback only: another address of this machine is refused.
    for address in _non_loopback_addresses():
        with pytest.raises(OSError):
            socket.create_connection((address, dash.port), timeout=2).close()
    # Reads happen once per refresh, however many requests come in.
    before = dash.state()["reads"]
    for _ in range(30):
        dash.state()
    assert dash.state()["reads"] - before <= 3


def _non_loopback_addresses() -> list[str]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({str(i[4][0]) for i in infos if not str(i[4][0]).startswith("127.")})


@pytest.mark.slow
def test_api_actions_need_the_right_token(
    redis_server: RedisServer, redis_client: redis.Redis, dashboards: list[Dashboard]
) -> None:
    dash = Dashboard(redis_server.url, "-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}")
    dashboards.append(dash)
    assert "actions enabled" in dash.banner
    assert dash.state()["server"]["actions"]["enabled"] is True
    path = "/api/deadletters/requeue"
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
    ):
        status, data = dash.post(path, {"count": "all"}, headers)
        assert status == 401, (headers, data)
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert dash.post(path, {"count": 0}, good)[0] == 400
    assert dash.post(path, [1], good)[0] == 400
    assert dash.post("/api/topics/news/pause", {}, good)[0] == 404  # pausing is /api/control
    status, data = dash.post(path, {"count": "all"}, good)
    assert (status, data) == (200, {"requeued": 0})
    # GET never acts, token or not.
    assert dash.get(path, good)[0] == 404


def _channel(client: redis.Redis) -> ControlChannel:
    return ControlChannel(RedisFrontier(client, prefix=PREFIX, partitions=PARTITIONS).link)


@pytest.mark.slow
def test_api_control_checks_then_acts_and_logs_who(
    redis_server: RedisServer, redis_client: redis.Redis, dashboards: list[Dashboard]
) -> None:
    channel = _channel(redis_client)
    channel.note_hosts(["a.example"])  # a host the crawl queued requests of
    dash = Dashboard(
        redis_server.url,
        *("-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}"),
        *("-s", 'BANKER_TOPICS={"news": {"priority": 0}}'),
    )
    dashboards.append(dash)
    assert dash.state()["server"]["actions"]["control"] is True
    pause = {"verb": "pause", "args": ["a.example"]}
    # The token rules of every action.
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"}):
        status, data = dash.post("/api/control", pause, headers)
        assert status == 401 and "token" in data["error"], (headers, data)
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert dash.get("/api/control", good)[0] == 404  # GET never acts

    # Bad input: 400 with the reason, and nothing changed, nothing logged.
    refused: list[tuple[Any, int, str]] = [
        ({"verb": "budget", "args": ["a.example", "-1"]}, 400,
         "budget: N must be an integer >= 0 or 'none', got '-1'"),
        ({"verb": "zap", "args": ["a.example"]}, 400, "unknown action 'zap'; allowed: pause,"),
        ({"verb": "pause", "args": ["unknown.example"]}, 400,
         "this crawl has queued no request of 'unknown.example' (its hosts include a.example)"),
        ({"verb": "pause", "args": ["topic:nope"]}, 400, "no topic 'nope' in this crawl"),
        ({"verb": "limit", "args": ["a.example", "0"]}, 400, "limit: N must be an integer >= 1"),
        ({"verb": "inject", "args": ["ftp://a.example/x"]}, 400, "cannot be fetched"),
        ({"verb": "inject", "args": ["http://a.example/"], "topic": "nope"}, 400,
         "no topic 'nope' in this crawl"),
        ({"verb": "pause", "args": "a.example"}, 400, '"args" must be a list of strings'),
        ({"verb": "pause", "args": ["a.example"], "force": "yes"}, 400, '"force" must be true'),
        ({"verb": "pause", "args": ["a.example"], "who": "me"}, 400, "unknown fields ['who']"),
        ({"args": ["a.example"]}, 400, '"verb" must be a non-empty string'),
        ([1], 400, "body must be a JSON object"),
        ({"verb": "inject", "args": ["http://a.example/" + "x" * 70_000]}, 413, "body too large"),
    ]  # fmt: skip
    for body, want, message in refused:
        status, data = dash.post("/api/control", body, good)
        assert status == want and message in data["error"], (body, status, data)
        assert set(data) == {"error"}
        assert channel.load() == ControlState(), body
        assert channel.log() == [], body

    # The right token and good input: done, in the document, logged with who.
    status, data = dash.post("/api/control", pause, good)
    assert (status, data) == (
        200, {"action": {"verb": "pause", "target": "a.example"}, "done": "pause a.example",
              "version": 1},
    )  # fmt: skip
    state = channel.load()
    assert state.host("a.example").paused and state.paused_hosts == {"a.example"}
    [entry] = channel.log()
    assert entry["who"] == "dashboard 127.0.0.1"
    assert (entry["verb"], entry["target"], entry["version"]) == ("pause", "a.example", 1)
    # --force: a host the crawl has not queued yet.
    status, data = dash.post(
        "/api/control", {"verb": "delay", "args": ["new.example", "2.5"], "force": True}, good
    )
    assert status == 200 and data["done"] == "delay new.example 2.5", data
    assert channel.load().host("new.example").delay == 2.5
    status, data = dash.post("/api/control", {"verb": "budget", "args": ["crawl", "100"]}, good)
    assert status == 200 and channel.load().crawl_budget == 100
    # inject queues (deduplicated fleet-wide); purge dead-letters the host's queued requests.
    inject = {"verb": "inject", "args": ["http://a.example/1", "http://a.example/2"],
              "topic": "news"}  # fmt: skip
    status, data = dash.post("/api/control", inject, good)
    assert status == 200 and (data["injected"], data["duplicates"]) == (2, 0), data
    assert dash.post("/api/control", inject, good)[1]["duplicates"] == 2
    status, data = dash.post("/api/control", {"verb": "purge", "args": ["a.example"]}, good)
    assert status == 200 and data["purged"] == 2, data
    assert [e["verb"] for e in channel.log()] == [
        "purge", "inject", "inject", "budget", "delay", "pause",
    ]  # fmt: skip

    # /api/state shows the directives, the budgets and the log, read with the fleet.
    def shown() -> bool:
        control = dash.state()["control"]
        return bool(control["state"]) and control["state"]["version"] == 6

    _until("the new control document in /api/state", shown)
    control = dash.state()["control"]
    assert control["error"] is None
    assert control["state"]["hosts"] == {
        "a.example": {"paused": True}, "new.example": {"delay": 2.5},
    }  # fmt: skip
    assert control["state"]["crawl_budget"] == 100
    assert control["budgets"]["crawl"] == 100
    assert [e["verb"] for e in control["log"]][:2] == ["purge", "inject"]
    assert all(e["who"] == "dashboard 127.0.0.1" for e in control["log"])

    # A control document that is not JSON: shown as an error, and every action
    # refused (400) without touching it.
    redis_client.set(f"{PREFIX}:control", "not json")
    _until("the error in /api/state", lambda: dash.state()["control"]["error"] is not None)
    control = dash.state()["control"]
    assert "not JSON" in control["error"] and control["state"] is None
    assert dash.state()["error"] is None  # the rest of the fleet is read as usual
    status, data = dash.post("/api/control", {"verb": "resume", "args": ["a.example"]}, good)
    assert status == 400 and "not JSON" in data["error"], data
    assert redis_client.get(f"{PREFIX}:control") == b"not json"


@pytest.mark.slow
def test_redis_unreachable_at_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    # It gives up at once rather than retrying: the timeout only guards a hang.
    done = run(
        [*COMMAND, "fleet", "--port", str(free_port()),
         "-s", f"REDIS_URL=redis://127.0.0.1:{port}/0"],
        cwd=tmp_path, timeout=60, expect=2,
    )  # fmt: skip
    assert done.stderr.startswith("scrapy banker dashboard: Redis unreachable")
    assert len(done.stderr.strip().splitlines()) == 1


# -- a single process: --jobdir DIR ---------------------------------------------------------

#: ``scrapy banker`` as an operator types it.
BANKER = [SCRAPY, "banker"]
ACTIONS_DISABLED = {"error": "actions disabled: set BANKER_DASHBOARD_TOKEN"}
#: Four hosts, one request at a time each, 150 ms a page: ~15 s for the whole farm.
JOBDIR_FARM = FarmConfig(seed=3, hosts=4, total_pages=400, latency_ms=150.0)


def _crawl(farm: WebFarm, jobdir: Path) -> subprocess.Popen[str]:
    """``scrapy crawl farm`` of example_project with ``JOBDIR``: one process, no Redis."""
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join((str(PROJECT), env["PYTHONPATH"]))
    return subprocess.Popen(
        [SCRAPY, "crawl", "farm", "-a", f"port={farm.port}", "-a", "hosts=4",
         "-s", f"JOBDIR={jobdir}", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1",
         "-s", "LOG_LEVEL=WARNING"],
        cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _stop(crawl: subprocess.Popen[str]) -> int:
    """SIGINT (a clean stop: the JOBDIR is compacted), then wait."""
    if crawl.poll() is None:
        crawl.send_signal(signal.SIGINT)
        try:
            return crawl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            crawl.kill()
    return crawl.wait(timeout=10)


@pytest.fixture(scope="module")
def crawled_jobdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JOBDIR of a real crawl stopped after 30 pages: requests of 4 hosts pending."""
    jobdir = tmp_path_factory.mktemp("crawled") / "job"
    with WebFarm(JOBDIR_FARM) as farm:
        crawl = _crawl(farm, jobdir)
        try:
            deadline = time.monotonic() + 60
            while farm.stats()["requests"] < 30:
                assert crawl.poll() is None, crawl.communicate()[1]
                assert time.monotonic() < deadline, "the crawl made no progress"
                time.sleep(0.1)
        finally:
            code = _stop(crawl)
    assert code == 0, crawl.communicate()[1]
    return jobdir


@pytest.fixture
def jobdir(crawled_jobdir: Path, tmp_path: Path) -> Path:
    """A copy of the crawled JOBDIR for the test alone (its actions write to it)."""
    copy = tmp_path / "job"
    shutil.copytree(crawled_jobdir, copy)
    return copy


def _plant_dead_letters(jobdir: Path, host: str) -> str:
    """Two letters, as a resume and a clean stop write them: one requeueable, one not.

    The first carries the journal ``E`` record of a request nothing else
    holds (what a resume could not read back); the second is a request only
    memory held at a clean stop.  Returns the first one's URL.
    """
    from scrapy import Request
    from scrapy.utils.request import RequestFingerprinter

    url = f"http://{host}/planted-dead-letter"
    request = Request(url)
    line = enqueue_line(
        9_999_999, RequestFingerprinter().fingerprint(request).hex(), "news", host, host,
        bkdr(host), 0, RequestCodec().encode(request),
    )  # fmt: skip
    restore = {"when": "restore", "file": "journal-0.jsonl", "line": 1,
               "error": "callback 'parse_later' is missing",
               "payload": line.rstrip("\n")}  # fmt: skip
    save = {"when": "save", "url": f"http://{host}/memory-only", "method": "POST",
            "error": "not serializable"}  # fmt: skip
    with open(jobdir / "banker-deadletter.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(restore) + "\n" + json.dumps(save) + "\n")
    return url


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with a digest of its content."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_jobdir_mode_shows_the_jobdir_and_changes_nothing_without_a_token(
    jobdir: Path, dashboards: list[Dashboard]
) -> None:
    before = _files(jobdir)
    dash = Dashboard(None, jobdir=jobdir)
    dashboards.append(dash)
    assert f"dashboard for JOBDIR {jobdir}: http://127.0.0.1:" in dash.banner
    assert "read-only" in dash.banner
    state = dash.state()
    assert state["error"] is None and state["fleet"] is None
    server = state["server"]
    assert (server["mode"], server["jobdir"]) == ("jobdir", str(jobdir))
    assert server["actions"] == {
        "enabled": False, "requeue": False, "pause": False, "control": False,
    }  # fmt: skip
    # purge and inject need a crawl on Redis: the page does not offer them.
    assert set(server["verbs"]) == {v.name for v in VERBS.values() if v.available(JOBDIR)}
    assert not {"purge", "inject"} & set(server["verbs"])
    offered = {v["name"]: v["available"] for v in server["control_verbs"]}
    assert list(offered) == list(VERBS)
    assert [name for name, available in offered.items() if not available] == ["purge", "inject"]
    # The JOBDIR's read model, as scrapy banker status --jobdir reads it.
    shown = state["jobdir"]
    view = read_jobdir(str(jobdir), top=20).to_json()
    assert {k: shown[k] for k in view} == view
    assert shown["queued"] > 0 and shown["pending"] == shown["queued"]
    hosts = [s["slot"] for s in shown["top_slots"]]
    assert hosts and all(h.endswith(".farm.test") for h in hosts), hosts
    assert sum(s["queued"] for s in shown["top_slots"]) == shown["queued"]  # 4 hosts: all shown
    assert shown["done"] == shown["seen"] - shown["pending"] > 0
    written = max(p.stat().st_mtime for p in (jobdir / "banker").glob("*.jsonl"))
    assert shown["written_at"] == pytest.approx(written)
    assert state["dead_letters"] == [] and shown["dead_letters"] == 0
    control = state["control"]
    assert control["state"] == {"version": 0} and control["error"] is None
    assert control["log"] == []
    # The pages fetched, exact from the JOBDIR's files, as `control --jobdir` counts them
    # (a seed fetched with dont_filter has no fingerprint in "done" but is a page).
    counts = control["counts"]
    assert counts["crawl"] >= shown["done"] and sum(counts["hosts"].values()) == counts["crawl"]
    assert counts["held"] == {}
    # No token configured: every POST is refused, whatever it carries.
    pause = {"verb": "pause", "args": [hosts[0]]}
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        for path, body in (("/api/control", pause), ("/api/deadletters/requeue", {"count": "all"})):
            status, data = dash.post(path, body, headers)
            assert (status, data) == (403, ACTIONS_DISABLED), (path, headers)
    # Another Host than this machine reads nothing.
    assert dash.get("/api/state", {"Host": f"evil.example:{dash.port}"})[0] == 403
    # Read at every refresh: the rates come from the requests done.
    _until("three reads", lambda: dash.state()["reads"] >= 3)
    assert set(dash.state()["rates"]["series"]) == {"done", "*"}
    # Nothing written: no control file, no log, the journal as it was.
    assert _files(jobdir) == before
    assert not (jobdir / "banker" / CONTROL_FILE).exists()


@pytest.mark.slow
def test_jobdir_mode_acts_through_the_control_file_with_the_token(
    jobdir: Path, dashboards: list[Dashboard]
) -> None:
    host = read_jobdir(str(jobdir)).top_slots[0][0]
    planted = _plant_dead_letters(jobdir, host)
    dash = Dashboard(None, "-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}", jobdir=jobdir)
    dashboards.append(dash)
    assert "actions enabled" in dash.banner
    state = dash.state()
    assert state["server"]["actions"]["control"] is True
    assert state["jobdir"]["top_slots"][0]["slot"] == host
    pending = state["jobdir"]["pending"]
    # The dead letters, as scrapy banker deadletters --jobdir lists them.
    assert state["jobdir"]["dead_letters"] == 2
    restore, save = state["dead_letters"]
    assert (restore["line"], restore["when"], restore["url"]) == (1, "restore", planted)
    assert restore["requeueable"] is True and save["requeueable"] is False
    control_file = jobdir / "banker" / CONTROL_FILE
    log_file = jobdir / "banker" / CONTROL_LOG
    pause = {"verb": "pause", "args": [host]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        status, data = dash.post("/api/control", pause, headers)
        assert status == 401 and "token" in data["error"], (headers, data)
    assert not control_file.exists() and not log_file.exists()
    good = {"Authorization": f"Bearer {TOKEN}"}

    # Refused as the command line refuses, in its words; nothing written.
    said = run([*BANKER, "purge", host, "--jobdir", str(jobdir)], expect=2).stderr.strip()
    assert said.startswith("scrapy banker purge: "), said
    refused: list[tuple[dict[str, Any], str]] = [
        ({"verb": "purge", "args": [host]}, said.removeprefix("scrapy banker purge: ")),
        ({"verb": "inject", "args": [f"http://{host}/x"]}, "inject needs a crawl that runs on"),
        ({"verb": "pause", "args": ["nowhere.example"]}, "no pending request of 'nowhere.example'"),
        ({"verb": "budget", "args": [host, "-1"]}, "N must be an integer >= 0"),
        ({"verb": "pause", "args": ["topic:nope"]}, "no topic 'nope'"),
    ]  # fmt: skip
    for body, message in refused:
        status, data = dash.post("/api/control", body, good)
        assert status == 400 and message in data["error"], (body, data)
    status, data = dash.post("/api/control", refused[0][0], good)
    assert data == {"error": refused[0][1]}  # purge: exactly the command's sentence
    assert not control_file.exists() and not log_file.exists()

    # With the token: in JOBDIR/banker/control.json, logged with who.
    status, data = dash.post("/api/control", pause, good)
    assert (status, data) == (
        200, {"action": {"verb": "pause", "target": host}, "done": f"pause {host}", "version": 1},
    )  # fmt: skip
    assert ControlFile(str(jobdir)).load().host(host).paused
    [entry] = ControlFile(str(jobdir)).log()
    assert (entry["verb"], entry["target"], entry["version"]) == ("pause", host, 1)
    assert entry["who"] == "dashboard 127.0.0.1"
    status, data = dash.post(
        "/api/control", {"verb": "delay", "args": ["new.example", "2.5"], "force": True}, good
    )
    assert status == 200 and data["done"] == "delay new.example 2.5", data
    # One control channel: the command line reads what the page wrote ...
    shown = json.loads(run([*BANKER, "control", "--jobdir", str(jobdir), "--json"]).stdout)
    assert shown["state"]["hosts"] == {host: {"paused": True}, "new.example": {"delay": 2.5}}
    assert [e["who"] for e in shown["log"]] == ["dashboard 127.0.0.1"] * 2
    # ... and the page shows it at its next read.
    _until("version 2 in /api/state", lambda: dash.state()["control"]["state"]["version"] == 2)
    control = dash.state()["control"]
    assert control["state"]["hosts"][host] == {"paused": True}
    assert [e["verb"] for e in control["log"]] == ["delay", "pause"]

    # Dead letters are requeued as scrapy banker deadletters --jobdir --requeue
    # does it: never beside a crawl holding the JOBDIR (409, nothing changed).
    letters = (jobdir / "banker-deadletter.jsonl").read_text()
    lock = JobdirLock(str(jobdir))
    lock.acquire()
    try:
        status, data = dash.post("/api/deadletters/requeue", {"count": "all"}, good)
    finally:
        lock.release()
    assert status == 409 and "nothing requeued" in data["error"], data
    assert (jobdir / "banker-deadletter.jsonl").read_text() == letters
    # No crawl holds it: the restore letter goes back into the journal, the
    # other stays listed; the next resume fetches it.
    assert dash.post("/api/deadletters/requeue", {"count": "all"}, good) == (200, {"requeued": 1})
    view = read_jobdir(str(jobdir))
    assert (view.pending, view.dead_letters) == (pending + 1, 1)
    _until("the requeue in /api/state", lambda: dash.state()["jobdir"]["dead_letters"] == 1)
    [left] = dash.state()["dead_letters"]
    assert left["when"] == "save"


@pytest.mark.slow
def test_without_jobdir_or_redis_url_it_says_what_every_command_says(tmp_path: Path) -> None:
    said: dict[str, str] = {}
    for command in ("dashboard", "status"):
        done = run([*BANKER, command], cwd=tmp_path, timeout=60, expect=2)
        assert not done.stdout
        [said[command]] = done.stderr.strip().splitlines()
    assert said["dashboard"] == (
        "scrapy banker dashboard: nothing to show: give --jobdir DIR for a single node, or "
        "REDIS_URL (-s REDIS_URL=redis://...) for a fleet"
    )
    assert said["status"].endswith(said["dashboard"].split(": ", 2)[2])
    # A JOBDIR that is not one: what scrapy banker status --jobdir says.
    nowhere = tmp_path / "nowhere"
    done = run([*COMMAND, "--jobdir", str(nowhere)], cwd=tmp_path, timeout=60, expect=2)
    assert done.stderr.strip() == f"scrapy banker dashboard: no JOBDIR at {nowhere}"


@pytest.mark.slow
def test_jobdir_mode_on_a_running_crawl_reads_it_live_and_pauses_a_host(
    tmp_path: Path, dashboards: list[Dashboard]
) -> None:
    jobdir = tmp_path / "job"
    with WebFarm(JOBDIR_FARM) as farm:
        crawl = _crawl(farm, jobdir)
        try:
            started = lambda: (jobdir / "banker" / "snapshot.jsonl").exists()  # noqa: E731
            _until("the crawl's JOBDIR", lambda: started() and farm.stats()["requests"] >= 8)
            dash = Dashboard(None, "-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}", jobdir=jobdir)
            dashboards.append(dash)
            first = dash.state()["jobdir"]["done"]
            _until("the done count to move", lambda: dash.state()["jobdir"]["done"] > first)
            state = dash.state()
            assert state["error"] is None and crawl.poll() is None
            assert max(state["rates"]["series"]["*"]) > 0
            # The host with the most requests pending, paused from the dashboard:
            # the crawl reads control.json once a second.
            host = state["jobdir"]["top_slots"][0]["slot"]
            good = {"Authorization": f"Bearer {TOKEN}"}
            status, data = dash.post("/api/control", {"verb": "pause", "args": [host]}, good)
            assert status == 200, data
            paused_at = time.time()
            time.sleep(3.0)
            events = farm.stats(urls=True)["host_events"][host]
            late = [t for t, step in events if step == 1 and t > paused_at + 1.5]
            assert not late, f"{len(late)} requests reached {host} after the pause was read"
            assert crawl.poll() is None, "the crawl ended before the pause was checked"
            assert any(s["slot"] == host for s in dash.state()["jobdir"]["top_slots"])
            assert dash.state()["error"] is None  # read all along while the crawl wrote
        finally:
            _stop(crawl)


# -- the page in a real browser on a live fleet ---------------------------------------------


def _chromium() -> str:
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"{CHROMIUM} is missing: install Debian's chromium package "
            "(scripts/test does it when run as root with apt-get)"
        )
    pytest.importorskip("playwright.sync_api", reason="playwright (the test extra) is missing")
    return CHROMIUM


def _until(what: str, check: Any, timeout: float = 20.0) -> None:
    """Poll ``check()`` from Python: the page's CSP (no eval) rules out wait_for_function."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _pages_shown(page: Any) -> int:
    text = page.locator("#k-pages").inner_text()
    digits = "".join(c for c in text if c.isdigit())
    return int(digits) if digits else -1


@pytest.mark.slow
def test_dashboard_in_a_real_browser_on_a_live_fleet(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    dashboards: list[Dashboard],
) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    # Equal-sized hosts, 250 ms a page: three workers need ~15 s for the farm.
    config = FarmConfig(
        seed=7, hosts=36, total_pages=2200, zipf_s=0.3, latency_ms=200.0,
        host_latency_ms={i: 150.0 + 30.0 * (i % 7) for i in range(36)},
    )  # fmt: skip
    with WebFarm(config) as farm:
        # Dead letters to requeue: payloads the workers' codec refuses.
        frontier = RedisFrontier(redis_client, prefix=PREFIX, partitions=PARTITIONS)
        for p in (3, 5):
            frontier.enqueue(
                p, f"bad-{p}", json.dumps({"url": farm.url(p, "/"), "callback": "_private"}), 100
            )
        seeds = farm.start_urls()
        specs = [{"settings": _worker_settings(redis_server, f"w{i}"), "seeds": seeds}
                 for i in range(3)]  # fmt: skip
        workers = [FleetWorker(f"w{i}", tmp_path, spec) for i, spec in enumerate(specs)]
        try:
            dash = Dashboard(
                redis_server.url,
                *("-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}"),
                # The fleet's own timeouts, as a shared settings.py would give them.
                *("-s", "BANKER_REDIS_NODE_TIMEOUT=3", "-s", "BANKER_REDIS_HEARTBEAT=0.5"),
            )
            dashboards.append(dash)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1440, "height": 1000})
                    errors: list[str] = []
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    page.on(
                        "console",
                        lambda m: errors.append(m.text) if m.type == "error" else None,
                    )
                    page.goto(dash.url + "/")
                    # The live nodes, by name.
                    for name in ("w0", "w1", "w2"):
                        page.wait_for_selector(f'#nodes tr[data-node="{name}"]', timeout=20_000)
                    _until("a page count", lambda: _pages_shown(page) > 0)
                    first = _pages_shown(page)
                    # The count moves while the crawl runs: the next count the page
                    # shows is larger, and a worker was still crawling when it did.
                    seen: list[tuple[int, list[str]]] = []

                    def moved() -> bool:
                        running = [w.name for w in workers if w.proc.poll() is None]
                        seen.append((_pages_shown(page), running))
                        return seen[-1][0] != first

                    _until("the page count to move", moved, timeout=60.0)
                    second, running = seen[-1]
                    print(f"\npages shown: {first} then {second}; running: {running}")
                    assert second > first > 0
                    assert running, "the crawl ended before the page showed a second count"
                    assert page.locator("#status-pill").inner_text() == "live"
                    # Dead letters are listed and the token requeues them.
                    page.wait_for_selector("#dead tbody tr td.bad", timeout=20_000)
                    # Let the rate chart gather a few seconds before the picture.
                    _until("three topics", lambda: page.locator("#topics tbody tr").count() >= 3)
                    # The placement panel names the fleet's mode; the GNP map (the
                    # nodes' squares) appears once a plan with coordinates is out,
                    # which takes the landmarks' probes some seconds: waited for a
                    # while, for the picture, but how soon is not the page's doing.
                    _until("the placement mode", lambda: "top1" in page.inner_text("#gnp-hint"))
                    started = time.monotonic()
                    drawn = lambda: page.locator("#gnp rect").count() >= 2  # noqa: E731
                    while not drawn() and time.monotonic() - started < 10:
                        time.sleep(0.2)
                    print(f"GNP map drawn: {drawn()} ({time.monotonic() - started:.1f} s waited)")
                    time.sleep(1.0)
                    shot = tmp_path / "dashboard.png"
                    page.screenshot(path=str(shot), full_page=True)
                    print(f"dashboard screenshot: {shot}")
                    assert shot.stat().st_size > 30_000
                    page.emulate_media(color_scheme="dark")
                    page.reload()
                    page.wait_for_selector('#nodes tr[data-node="w0"]', timeout=10_000)
                    time.sleep(1.0)
                    dark = tmp_path / "dashboard-dark.png"
                    page.screenshot(path=str(dark), full_page=True)
                    print(f"dark theme: {dark}")
                    # An unauthenticated POST from the page's origin is refused.
                    refused = page.request.post(
                        dash.url + "/api/deadletters/requeue", data={"count": "all"}
                    )
                    assert refused.status == 401
                    page.fill("#token", TOKEN)
                    page.click("#requeue")
                    hint = page.locator("#action-hint")
                    _until("the requeue", lambda: hint.inner_text().startswith("Requeued "))
                    assert re.fullmatch(r"Requeued [1-9]\d* dead letters", hint.inner_text())
                    assert not errors, errors
                finally:
                    browser.close()
        finally:
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.terminate()
            for w in workers:
                w.wait(30)


@pytest.mark.slow
def test_control_form_in_a_real_browser(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    dashboards: list[Dashboard],
) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    channel = _channel(redis_client)
    channel.note_hosts(["shop.example"])
    readonly = Dashboard(redis_server.url)
    dash = Dashboard(redis_server.url, "-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}")
    dashboards += [readonly, dash]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(
                "console",
                lambda m: errors.append(m.text) if m.type == "error" else None,
            )
            hint = page.locator("#control-hint")
            submit = page.locator("#control-submit")

            # No token configured: the panel is there, read-only, no form to use.
            page.goto(readonly.url + "/")
            _until("the read-only hint", lambda: hint.inner_text().startswith("Read-only"))
            assert not page.locator("#control-form").is_visible()
            assert submit.is_disabled()
            assert not page.locator("#token").is_visible()

            # A token configured, none typed: still no form.
            page.goto(dash.url + "/")
            _until("the token hint", lambda: "Type the dashboard token" in hint.inner_text())
            assert not page.locator("#control-form").is_visible()
            assert submit.is_disabled()
            page.fill("#token", TOKEN)
            _until("the form", lambda: page.locator("#control-form").is_visible())
            assert submit.is_enabled()

            # The form's verbs are the table's, in its order, each with its placeholders.
            options = page.locator("#control-verb option")
            assert options.evaluate_all("os => os.map(o => o.value)") == list(VERBS)
            assert options.evaluate_all("os => os.filter(o => o.disabled).length") == 0
            value, force = page.locator("#control-value"), page.locator("#control-force")
            for verb in VERBS.values():
                page.select_option("#control-verb", verb.name)
                assert page.locator("#control-target").get_attribute("title") == (
                    f"{verb.name} takes {verb.usage}"
                )
                assert value.is_disabled() == (not verb.takes_value and not verb.takes_urls)
                assert force.is_disabled() == (not verb.takes_host)
            page.select_option("#control-verb", "limit")
            assert value.get_attribute("placeholder") == VERBS["limit"].to_json()["value_hint"]

            # A refused action: the server's reason on the page, nothing changed.
            page.select_option("#control-verb", "budget")
            page.fill("#control-target", "shop.example")
            page.fill("#control-value", "-1")
            submit.click()
            _until("the refusal", lambda: hint.inner_text().startswith("Refused (400)"))
            assert "N must be an integer >= 0" in hint.inner_text()
            assert channel.load() == ControlState()

            # pause shop.example: the document in Redis says so, the log names the page.
            page.select_option("#control-verb", "pause")
            assert page.locator("#control-value").is_disabled()  # pause takes no value
            page.fill("#control-target", "shop.example")
            submit.click()
            _until("the pause", lambda: hint.inner_text().startswith("Done: pause shop.example"))
            assert channel.load().host("shop.example").paused
            [entry] = channel.log()
            assert (entry["verb"], entry["who"]) == ("pause", "dashboard 127.0.0.1")

            # The panel shows the directive and the action at its next refresh.
            row = page.locator('#control-directives tr[data-target="shop.example"]')
            _until("the directive", lambda: row.count() == 1 and "paused" in row.inner_text())
            log = page.locator("#control-log tbody")
            _until("the log line", lambda: "pause shop.example" in log.inner_text())
            assert "dashboard 127.0.0.1" in log.inner_text()
            assert page.locator("#control-version").inner_text() == "version 1"
            shot = tmp_path / "dashboard-control.png"
            page.locator("#control-card").screenshot(path=str(shot))
            print(f"\ncontrol panel screenshot: {shot}")
            # The browser logs each refused fetch (the 400 above) as a console error.
            assert not [e for e in errors if "status of 400" not in e], errors
        finally:
            browser.close()


def _number(text: str) -> int:
    digits = "".join(c for c in text if c.isdigit())
    return int(digits) if digits else -1


@pytest.mark.slow
def test_jobdir_mode_in_a_real_browser(
    jobdir: Path, tmp_path: Path, dashboards: list[Dashboard]
) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    dash = Dashboard(None, "-s", f"BANKER_DASHBOARD_TOKEN={TOKEN}", jobdir=jobdir)
    dashboards.append(dash)
    shown = dash.state()["jobdir"]
    host = shown["top_slots"][0]["slot"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(dash.url + "/")
            prefix = page.locator("#prefix")
            _until("the JOBDIR's name", lambda: prefix.inner_text() == f"JOBDIR {jobdir}")
            # The JOBDIR's numbers, the hosts its requests are for; no fleet panels.
            assert page.locator("#k-queued-label").text_content() == "Pending"
            assert _number(page.locator("#k-queued").inner_text()) == shown["queued"]
            assert _number(page.locator("#k-pages").inner_text()) == shown["done"]
            assert page.locator(f'#slots [data-host="{host}"]').count() == 1
            topics = {t["name"] for t in shown["topics"]}
            assert page.locator("#topics tbody tr[data-topic]").count() == len(topics)
            assert page.locator("#jobdir-card").is_visible()
            assert str(jobdir) in page.locator("#jobdir").inner_text()
            for card in ("#nodes-card", "#banker-card", "#placement-card"):
                assert not page.locator(card).is_visible(), card
            # No token typed: no form.  Typed: pause HOST lands in control.json.
            hint = page.locator("#control-hint")
            _until("the token hint", lambda: "Type the dashboard token" in hint.inner_text())
            assert not page.locator("#control-form").is_visible()
            page.fill("#token", TOKEN)
            _until("the form", lambda: page.locator("#control-form").is_visible())
            assert "on this JOBDIR within a second" in hint.inner_text()
            # A single process has no purge, no inject: not offered.
            for verb in ("purge", "inject"):
                assert page.locator(f'#control-verb option[value="{verb}"]').is_disabled()
            for verb in ("pause", "resume", "limit", "delay", "budget"):
                assert page.locator(f'#control-verb option[value="{verb}"]').is_enabled()
            page.select_option("#control-verb", "pause")
            page.fill("#control-target", host)
            page.locator("#control-submit").click()
            _until("the pause", lambda: hint.inner_text().startswith(f"Done: pause {host}"))
            assert ControlFile(str(jobdir)).load().host(host).paused
            [entry] = ControlFile(str(jobdir)).log()
            assert (entry["verb"], entry["who"]) == ("pause", "dashboard 127.0.0.1")
            row = page.locator(f'#control-directives tr[data-target="{host}"]')
            _until("the directive", lambda: row.count() == 1 and "paused" in row.inner_text())
            log = page.locator("#control-log tbody")
            _until("the log line", lambda: f"pause {host}" in log.inner_text())
            time.sleep(1.0)  # a second reading for the rate chart
            shot = tmp_path / "dashboard-jobdir.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"\nJOBDIR dashboard screenshot: {shot}")
            assert not errors, errors
        finally:
            browser.close()
