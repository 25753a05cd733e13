"""Tests of the web farm: the pure model, the server, the launcher and the resolver.

The farm is the yardstick for every crawl test and benchmark, so these tests
pin down the properties the others rely on: determinism, reachability of
every page, faithful serving of the model's bytes, real delays, fault
injection and the bookkeeping counters.
"""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
import re
import socket
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scrapy
from conftest import PLANETLAB, farm_fixture, run_python
from scrapy.resolver import CachingThreadedResolver
from scrapy.settings import Settings

from scrapy_banker.testing.farm import (
    FarmConfig,
    FarmModel,
    WebFarm,
    load_rtt_matrix,
)
from scrapy_banker.testing.resolver import (
    FarmResolver,
    farm_settings,
    install_farm_resolver,
    resolver_setting_name,
)

SCRAPY_VERSION = tuple(int(x) for x in scrapy.__version__.split(".")[:2])
HREF = re.compile(r'href="([^"]+)"')


# ----------------------------------------------------------------------- model
def test_same_seed_gives_identical_bytes_and_other_seed_another_graph() -> None:
    cfg = FarmConfig(seed=7, hosts=6, total_pages=300, cross_host_link_prob=0.3)
    a, b = FarmModel(cfg), FarmModel(FarmConfig.from_json(cfg.to_json()))
    for i in range(cfg.hosts):
        assert a.paths(i) == b.paths(i)
        for path in a.paths(i):
            assert a.page(i, path, 8080) == b.page(i, path, 8080)
    other = FarmModel(FarmConfig(seed=8, hosts=6, total_pages=300, cross_host_link_prob=0.3))
    edges_a = {(i, p, u) for i in range(6) for p in a.paths(i) for u in a.links(i, p, 1)}
    edges_o = {(i, p, u) for i in range(6) for p in other.paths(i) for u in other.links(i, p, 1)}
    # Same layout (page counts depend only on the Zipf law), different links.
    assert [a.n_pages(i) for i in range(6)] == [other.n_pages(i) for i in range(6)]
    assert len(edges_a ^ edges_o) > len(edges_a) // 2


def test_zipf_skew_and_page_counts() -> None:
    model = FarmModel(FarmConfig(hosts=50, total_pages=5000, zipf_s=1.0))
    counts = model.page_counts()
    assert counts[0] == max(counts)
    assert all(x >= y for x, y in itertools.pairwise(counts))
    assert sum(counts) == 5000  # the minimum does not bind here
    assert counts[0] / counts[9] == pytest.approx(10, rel=0.05)  # 1/(i+1) law
    # When the per-host minimum binds, the sum grows by just what it adds.
    small = FarmModel(FarmConfig(hosts=40, total_pages=100, min_pages_per_host=3))
    assert min(small.page_counts()) == 3
    assert 100 <= sum(small.page_counts()) <= 100 + 3 * 40
    assert small.n_urls(0) == 1 + 3 + small.n_pages(0)
    flat = FarmModel(FarmConfig(hosts=4, total_pages=400, zipf_s=0.0))
    assert flat.page_counts() == (100, 100, 100, 100)


def test_every_page_reachable_from_the_roots() -> None:
    model = FarmModel(FarmConfig(hosts=12, total_pages=900, error_rate=0.2, timeout_rate=0.1))
    expected = model.expected_urls(4242)
    assert expected == model.all_urls(4242)
    assert len(expected) == model.n_urls()
    assert set(model.start_urls(4242)) <= expected
    # Without cross-host links a single root reaches exactly its own host.
    isolated = FarmModel(FarmConfig(hosts=12, total_pages=900, cross_host_link_prob=0.0))
    one = isolated.expected_urls(4242, [isolated.url(3, "/", 4242)])
    assert one == {isolated.url(3, p, 4242) for p in isolated.paths(3)}
    assert "http://elsewhere.example/" in model.expected_urls(1, ["http://elsewhere.example/"])


def test_topics_are_encoded_in_paths() -> None:
    cfg = FarmConfig(hosts=3, total_pages=120, topics=("news", "shop"))
    model = FarmModel(cfg)
    for i in range(cfg.hosts):
        root_links = model.links(i, "/", 1)
        assert root_links == [model.url(i, f"/{t}/", 1) for t in cfg.topics]
        for topic in cfg.topics:
            assert model.topic_of(f"/{topic}/") == topic
            members = model.links(i, f"/{topic}/", 1)
            leaves = [p for p in model.paths(i) if p.startswith(f"/{topic}/") and p != f"/{topic}/"]
            assert members == [model.url(i, p, 1) for p in leaves]
            assert all(model.topic_of(p) == topic for p in leaves)
            assert all(re.fullmatch(rf"/{topic}/\d+\.html", p) for p in leaves)
    assert model.topic_of("/") is None
    assert model.topic_of("/unknown/1.html") is None


def test_config_json_round_trip() -> None:
    cfg = FarmConfig(
        seed=3,
        topics=("a", "b"),
        host_latency_ms={2: 15.0, 11: 40.5},
        host_bandwidth_kbps={0: 800.0},
        bandwidth_kbps=2000,
        node_rows={"eu": 4, "us": 9},
        host_columns={1: 17},
        rtt_matrix="m.tsv",
        error_rate=0.01,
    )
    back = FarmConfig.from_json(cfg.to_json())
    assert back == cfg
    assert hash(back) == hash(cfg)
    assert back.host_latency_ms == {2: 15.0, 11: 40.5}
    assert all(isinstance(k, int) for k in back.host_latency_ms)
    assert back.topics == ("a", "b")
    assert json.loads(cfg.to_json())["host_columns"] == {"1": 17}
    with pytest.raises(ValueError, match="unknown farm config keys"):
        FarmConfig.from_json('{"hosts": 2, "bogus": 1}')
    with pytest.raises(ValueError, match="fault rates"):
        FarmConfig(error_rate=0.7, timeout_rate=0.5)


def test_fault_injection_is_deterministic_and_spares_index_pages() -> None:
    cfg = FarmConfig(
        hosts=10, total_pages=4000, error_rate=0.1, transient_error_rate=0.05, timeout_rate=0.05
    )
    model = FarmModel(cfg)
    faults = [model.fault(i, p) for i in range(cfg.hosts) for p in model.paths(i)]
    share = {f: faults.count(f) / 4000 for f in ("error", "transient", "timeout")}
    assert share["error"] == pytest.approx(0.1, abs=0.02)
    assert share["transient"] == pytest.approx(0.05, abs=0.015)
    assert share["timeout"] == pytest.approx(0.05, abs=0.015)
    for i in range(cfg.hosts):
        assert model.fault(i, "/") == "ok"
        for path in model.paths(i):
            status, _, links = model.page(i, path, 80)
            if model.fault(i, path) == "error":
                assert (status, links) == (500, [])
            else:
                assert status == 200
    assert model.fault(0, "/nope") == "missing"
    assert FarmModel(cfg).page(0, "/nope", 80)[0] == 404
    # Changing the link density must not move the faults.
    denser = FarmModel(FarmConfig(**{**json.loads(cfg.to_json()), "links_per_page": 9}))
    assert [denser.fault(i, p) for i in range(cfg.hosts) for p in model.paths(i)] == faults


def test_page_sizes_are_skewed_around_the_mean() -> None:
    model = FarmModel(FarmConfig(hosts=4, total_pages=2000, page_bytes=2048))
    sizes = [len(model.page(i, p, 12345)[1]) for i in range(4) for p in model.paths(i)[5:]]
    assert 1700 < float(np.mean(sizes)) < 2400
    assert max(sizes) > 3 * float(np.median(sizes))  # long tail, not constant


def test_delays_follow_latency_bandwidth_and_rtt(tmp_path: Path) -> None:
    matrix = tmp_path / "rtt.tsv"
    matrix.write_text("0 10 NA\n10 0 300\n-1 300 0\n")
    cfg = FarmConfig(
        hosts=4,
        total_pages=40,
        latency_ms=5.0,
        host_latency_ms={1: 50.0},
        host_bandwidth_kbps={2: 80.0},
        rtt_matrix=str(matrix),
        node_rows={"a": 0, "b": 1},
        host_columns={0: 2},
        latency_scale=2.0,
    )
    model = FarmModel(cfg)
    assert model.delay_s(0, "/", nbytes=0) == pytest.approx(0.005)
    assert model.delay_s(1, "/", nbytes=0) == pytest.approx(0.050)
    assert model.delay_s(2, "/", nbytes=1000) == pytest.approx(0.005 + 0.1)  # 8000 bit @ 80 kbps
    assert model.delay_s(0, "/", node="b", nbytes=0) == pytest.approx(0.600)  # 300 ms * 2
    assert model.delay_s(0, "/", node="zz", nbytes=0) == pytest.approx(0.005)  # unknown node
    assert model.host_column(1) == (1 * 7 + 1) % 3
    # Missing both ways ("NA" and a negative value): each row's median RTT.
    m = model.rtt_matrix_ms()
    assert (m[0, 2], m[2, 0]) == (10.0, 300.0)
    assert np.isfinite(m).all()


def test_rtt_matrix_loader_handles_gzip_and_missing_values(tmp_path: Path) -> None:
    path = tmp_path / "m.tsv.gz"
    path.write_bytes(gzip.compress(b"# comment\n0\t7\tnan\n7\t0\t?\n0\t9\t0\n"))
    m = load_rtt_matrix(path)
    assert m.shape == (3, 3)
    assert m[1, 2] == 9.0 and m[2, 1] == 9.0  # "?" repaired from the symmetric entry
    # nan and an off-diagonal 0 facing each other: each row's median instead.
    assert (m[0, 2], m[2, 0]) == (7.0, 9.0)
    assert (np.diag(m) == 0).all()
    bad = tmp_path / "bad.tsv"
    bad.write_text("0 1\n1 0 2\n")
    with pytest.raises(ValueError, match="not square"):
        load_rtt_matrix(bad)


def test_real_planetlab_matrix_loads() -> None:
    m = load_rtt_matrix(PLANETLAB)  # the repository's copy (data/rtt/)
    assert m.shape == (490, 490)
    assert np.isfinite(m).all() and (m >= 0).all()
    assert (np.diag(m) == 0).all()
    assert np.allclose(m, m.T)
    assert 50 < float(np.median(m)) < 300


def test_model_metadata_of_a_large_farm() -> None:
    model = FarmModel(FarmConfig(hosts=200, total_pages=20000))
    n = sum(len(model.paths(i)) for i in range(model.hosts))
    assert n == model.n_urls() > 20000


# ---------------------------------------------------------------------- server
def _server_config(tmp_path_factory: pytest.TempPathFactory) -> FarmConfig:
    rtt_file = tmp_path_factory.mktemp("rtt") / "rtt.tsv"
    # node "near" (row 0) is 20 ms from column 2, node "far" (row 1) 400 ms.
    rtt_file.write_text("0 5 20\n5 0 400\nNA 400 0\n")
    return FarmConfig(
        seed=11,
        hosts=6,
        total_pages=300,
        host_latency_ms={3: 300.0},
        rtt_matrix=str(rtt_file),
        node_rows={"near": 0, "far": 1},
        host_columns={2: 2},
        error_rate=0.1,
        transient_error_rate=0.1,
        timeout_rate=0.05,
        timeout_s=0.6,
    )


farm = farm_fixture(_server_config)


def _get(
    farm: WebFarm,
    host: int | str,
    path: str,
    headers: dict[str, str] | None = None,
    method: str = "GET",
) -> tuple[int, bytes, http.client.HTTPResponse]:
    name = farm.model.host_name(host) if isinstance(host, int) else host
    conn = http.client.HTTPConnection("127.0.0.1", farm.port, timeout=10)
    try:
        conn.request(method, path, headers={"Host": f"{name}:{farm.port}", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read(), resp
    finally:
        conn.close()


def _first(farm: WebFarm, fault: str, host: int = 0) -> str:
    return next(p for p in farm.model.paths(host) if farm.model.fault(host, p) == fault)


@pytest.mark.slow
def test_server_serves_the_models_bytes(farm: WebFarm) -> None:
    for i in (0, 1, 5):
        for path in farm.model.paths(i)[:6]:
            if farm.model.fault(i, path) in ("transient", "timeout"):
                continue
            status, body, resp = _get(farm, i, path)
            exp_status, exp_body, exp_links = farm.model.page(i, path, farm.port)
            assert (status, body) == (exp_status, exp_body)
            assert resp.getheader("Content-Type") == "text/html; charset=utf-8"
            assert int(resp.getheader("Content-Length", "-1")) == len(body)
            assert HREF.findall(body.decode()) == exp_links


@pytest.mark.slow
def test_keep_alive_and_head(farm: WebFarm) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", farm.port, timeout=10)
    host = {"Host": f"{farm.model.host_name(1)}:{farm.port}"}
    conn.request("GET", "/", headers=host)
    first = conn.getresponse().read()
    sock = conn.sock
    conn.request("HEAD", "/", headers=host)
    resp = conn.getresponse()
    assert resp.read() == b""
    assert int(resp.getheader("Content-Length", "0")) == len(first)
    assert conn.sock is sock  # same TCP connection reused
    conn.close()


@pytest.mark.slow
def test_unknown_host_and_path_are_404(farm: WebFarm) -> None:
    assert _get(farm, "nobody.farm.test", "/")[0] == 404
    assert _get(farm, 0, "/no/such/page.html")[0] == 404
    assert _get(farm, 0, "/", method="POST")[0] == 405


@pytest.mark.slow
def test_per_host_latency_really_delays(farm: WebFarm) -> None:
    start = time.perf_counter()
    assert _get(farm, 3, "/")[0] == 200
    assert time.perf_counter() - start >= 0.8 * 0.300
    # Other hosts have no latency of their own (no upper bound on the clock:
    # a loaded machine may take any time to answer).
    assert farm.model.delay_s(0, "/") == 0.0
    assert _get(farm, 0, "/")[0] == 200


@pytest.mark.slow
def test_node_header_uses_the_rtt_matrix(farm: WebFarm) -> None:
    timings = {}
    for node in ("far", "near"):
        start = time.perf_counter()
        assert _get(farm, 2, "/", {"X-Banker-Node": node})[0] == 200
        timings[node] = time.perf_counter() - start
    assert timings["far"] >= 0.8 * 0.400
    assert timings["near"] >= 0.8 * 0.020
    assert farm.model.latency_ms(2, "near") == 20.0  # the row of "near", not of "far"


@pytest.mark.slow
def test_error_transient_and_timeout_injection(farm: WebFarm) -> None:
    farm.reset()
    error = _first(farm, "error")
    assert [_get(farm, 0, error)[0] for _ in range(2)] == [500, 500]
    transient = _first(farm, "transient")
    assert _get(farm, 0, transient)[0] == 503
    status, body, _ = _get(farm, 0, transient)
    assert (status, body) == (200, farm.model.page(0, transient, farm.port)[1])
    farm.reset()  # forgets which transient URLs already failed
    assert _get(farm, 0, transient)[0] == 503
    hang = _first(farm, "timeout")
    start = time.perf_counter()
    assert _get(farm, 0, hang)[0] == 200
    assert time.perf_counter() - start >= 0.8 * 0.6


@pytest.mark.slow
def test_pipelined_responses_keep_request_order(farm: WebFarm) -> None:
    names = [farm.model.host_name(i) for i in (3, 0)]  # slow host first
    raw = b"".join(f"GET / HTTP/1.1\r\nHost: {n}\r\n\r\n".encode() for n in names)
    with socket.create_connection(("127.0.0.1", farm.port), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while data.count(b"</html>") < 2:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
    titles = re.findall(rb"<title>([^<]+)</title>", data)
    assert titles == [f"{n}/".encode() for n in names]


@pytest.mark.slow
def test_stats_count_requests_hosts_nodes_and_urls(farm: WebFarm) -> None:
    farm.reset()
    assert farm.stats()["requests"] == 0
    _get(farm, 0, "/")
    _get(farm, 0, "/")
    _get(farm, 1, "/news/", {"X-Banker-Node": "near"})
    stats = farm.stats(urls=True)
    assert stats["requests"] == 3
    assert stats["per_host"] == {farm.model.host_name(0): 2, farm.model.host_name(1): 1}
    assert stats["per_node"] == {"near": 1}
    assert stats["fetches"] == {farm.url(0): 2, farm.url(1, "/news/"): 1}
    assert "fetches" not in farm.stats()
    farm.reset()
    assert farm.stats(urls=True)["fetches"] == {}


@pytest.mark.slow
def test_max_inflight_per_host_sees_concurrency(farm: WebFarm) -> None:
    farm.reset()
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(_get(farm, 3, "/")[0])) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = farm.stats()
    slow = farm.model.host_name(3)
    assert results == [200] * 4
    assert stats["max_inflight_per_host"][slow] >= 2
    assert stats["inflight"] == {}


@pytest.mark.slow
def test_launcher_reports_child_errors(tmp_path: Path) -> None:
    cfg = FarmConfig(hosts=2, total_pages=6, rtt_matrix=str(tmp_path / "missing.tsv"))
    with pytest.raises(RuntimeError, match=r"(?s)before listening.*missing\.tsv"):
        WebFarm(cfg)
    lazy = WebFarm(FarmConfig(hosts=1, total_pages=3), autostart=False)
    with pytest.raises(RuntimeError, match="not running"):
        _ = lazy.port


# -------------------------------------------------------------------- resolver
class _FakeReactor:
    def __init__(self) -> None:
        self.installed: object = None

    def installResolver(self, resolver: object) -> None:
        self.installed = resolver


class _FakeCrawler:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = Settings(settings)


def _result(d: Any) -> list[Any]:
    out: list[Any] = []
    d.addCallback(out.append)
    return out


def test_resolver_maps_farm_hosts_and_defers_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scrapy 2.14 renamed the setting; CI runs this on 2.13 too.
    name = "TWISTED_DNS_RESOLVER" if SCRAPY_VERSION >= (2, 14) else "DNS_RESOLVER"
    assert resolver_setting_name() == name
    assert farm_settings() == {name: "scrapy_banker.testing.resolver.FarmResolver"}
    reactor: Any = _FakeReactor()
    res = FarmResolver.from_crawler(_FakeCrawler({"BANKER_FARM_DOMAIN": "lab.example"}), reactor)
    assert res.domain == "lab.example"
    assert _result(res.getHostByName("h0001.lab.example")) == ["127.0.0.1"]
    seen: list[str] = []

    def parent(self: Any, name: str, timeout: Any = ()) -> Any:
        seen.append(name)
        from twisted.internet import defer

        return defer.succeed("10.0.0.1")

    monkeypatch.setattr(CachingThreadedResolver, "getHostByName", parent)
    assert _result(res.getHostByName("h0001.farm.test")) == ["10.0.0.1"]
    assert _result(res.getHostByName("notlab.example")) == ["10.0.0.1"]
    assert seen == ["h0001.farm.test", "notlab.example"]
    installed = install_farm_resolver(reactor)
    assert reactor.installed is installed and installed.is_farm_host("H0003.FARM.TEST.")


# ------------------------------------------------------------------ real crawl
CRAWL_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    from scrapy import Request, Spider
    from scrapy.crawler import CrawlerProcess

    from scrapy_banker.testing.resolver import farm_settings


    class FarmSpider(Spider):
        name = "farm"
        # Record 500 pages too: a perfect crawl fetches them once.
        custom_settings = {"HTTPERROR_ALLOW_ALL": True}
        fetched = []

        async def start(self):
            # Not start_urls: those bypass the dupefilter, so a link back to
            # a root would fetch it a second time.
            for url in json.loads(sys.argv[1]):
                yield Request(url)

        def parse(self, response):
            self.fetched.append([response.url, response.status])
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href, self.parse)

        def closed(self, reason):
            with open(sys.argv[2], "w") as fh:
                json.dump({"reason": reason, "fetched": self.fetched}, fh)


    process = CrawlerProcess({
        **farm_settings(),
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "HTTPPROXY_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "RETRY_ENABLED": False,
        "COOKIES_ENABLED": False,
        "CONCURRENT_REQUESTS": 32,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        "DOWNLOAD_TIMEOUT": 20,
    })
    process.crawl(FarmSpider)
    process.start()
    """
)


@pytest.mark.slow
@pytest.mark.scrapy213
def test_real_scrapy_crawl_fetches_exactly_the_expected_urls(tmp_path: Path) -> None:
    cfg = FarmConfig(seed=5, hosts=5, total_pages=60, error_rate=0.05, latency_ms=2.0)
    script = tmp_path / "crawl.py"
    script.write_text(CRAWL_SCRIPT)
    out = tmp_path / "fetched.json"
    with WebFarm(cfg) as farm:
        run_python(script, json.dumps(farm.start_urls()), out, timeout=120)
        result = json.loads(out.read_text())
        stats = farm.stats(urls=True)
        expected = farm.expected_urls()
    fetched = [url for url, _ in result["fetched"]]
    assert result["reason"] == "finished"
    assert len(fetched) == len(set(fetched))
    assert set(fetched) == expected
    assert stats["fetches"] == dict.fromkeys(expected, 1)
    statuses = {url: status for url, status in result["fetched"]}
    errors = {u for u in expected if farm.model.fault(*_split(farm, u)) == "error"}
    assert errors and all(statuses[u] == 500 for u in errors)


def _split(farm: WebFarm, url: str) -> tuple[int, str]:
    host, _, rest = url.removeprefix("http://").partition("/")
    index = farm.model.host_index(host)
    assert index is not None
    return index, "/" + rest
