"""Static sites: a folder of files served under a virtual host name by the web farm."""

from __future__ import annotations

import http.client
import os
from pathlib import Path

import pytest

from scrapy_banker.testing.farm import FarmConfig, StaticSite, WebFarm


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "docs" / "api").mkdir(parents=True)
    (root / "index.html").write_text('<a href="/docs/">docs</a>')
    (root / "docs" / "index.html").write_text('<a href="api/x%20y.html">x</a>')
    (root / "docs" / "api" / "x y.html").write_text("<p>x y</p>")
    (root / "robots.txt").write_text("User-agent: *\nSitemap: /sitemap.xml\n")
    (root / "feed.csv").write_text("id,url\n1,/docs/\n")
    (tmp_path / "secret.txt").write_text("outside the root")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    return root


def test_paths_resolve_inside_the_root_only(tree: Path) -> None:
    site = StaticSite(tree)
    assert site.resolve("/") == tree / "index.html"
    assert site.resolve("/docs") == tree / "docs" / "index.html"
    assert site.resolve("/docs/api/x%20y.html?q=1") == tree / "docs" / "api" / "x y.html"
    for bad in ("/../secret.txt", "/docs/../../secret.txt", "/link.txt", "/missing.html",
                "/%2e%2e/secret.txt"):  # fmt: skip
        assert site.resolve(bad) is None, bad
    assert site.answer("/../secret.txt")[0] == 404
    assert site.answer("/robots.txt") == (200, (tree / "robots.txt").read_bytes(), b"text/plain")
    assert site.answer("/feed.csv")[2] == b"text/csv"
    assert "/docs/api/x y.html" in site.files() and "/robots.txt" in site.files()


def test_a_missing_root_is_refused_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nowhere"):
        StaticSite(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no static site"):
        FarmConfig(static_latency_ms={"a.farm.test": 5.0})


def _request(port: int, host: str, path: str, method: str = "GET") -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = b"a=1" if method == "POST" else None
        conn.request(method, path, body=body, headers={"Host": f"{host}:{port}"})
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type", "")
    finally:
        conn.close()


@pytest.mark.slow
def test_the_farm_serves_a_static_tree_beside_generated_hosts(tree: Path) -> None:
    config = FarmConfig(hosts=2, total_pages=10, static_sites={"Docs.Farm.Test": str(tree)},
                        static_latency_ms={"docs.farm.test": 200.0},
                        sample_interval_s=0.02)  # fmt: skip
    with WebFarm(config) as farm:
        status, body, ctype = _request(farm.port, "docs.farm.test", "/docs/api/x%20y.html")
        assert (status, body, ctype) == (200, b"<p>x y</p>", "text/html")
        assert _request(farm.port, "docs.farm.test", "/api", "POST")[0] == 404
        assert _request(farm.port, "docs.farm.test", "/feed.csv", "POST")[:2] == (
            200, b"id,url\n1,/docs/\n",
        )  # fmt: skip
        assert _request(farm.port, "docs.farm.test", "/../secret.txt")[0] in (400, 404)
        assert _request(farm.port, farm.model.host_name(0), "/")[0] == 200
        assert _request(farm.port, farm.model.host_name(0), "/", "POST")[0] == 405
        stats = farm.stats(urls=True)
        samples = farm.samples()
    port = farm.port
    # The span runs from the first request to the last answer: four 200 ms answers in turn.
    assert stats["span_s"] >= 0.8
    assert any(s[1] == 1 and s[2] == {"docs.farm.test": 1} for s in samples), samples[:5]
    assert stats["per_host"]["docs.farm.test"] == 4
    assert stats["fetches"][f"http://docs.farm.test:{port}/feed.csv"] == 1
    assert stats["max_inflight_per_host"]["docs.farm.test"] == 1
