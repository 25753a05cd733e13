"""The quickstart (``docs/quickstart.rst``) on a project ``scrapy startproject`` generates.

``scrapy startproject`` + ``scrapy genspider -t crawl``, then exactly the
edits the quickstart lists -- the add-on on the template's own ``ADDONS = {}``
line, ``http://`` for the start URL, the host without its port in
``allowed_domains``, a rule that follows every link, an item that is not
empty -- and a real
``scrapy crawl`` with ``JOBDIR`` of a small static site served by
``python -m http.server``.  The template's ``DOWNLOAD_DELAY = 1`` and
``ROBOTSTXT_OBEY = True`` are kept, as the quickstart keeps them.

The test also pins what the quickstart quotes of the generated files, so a
Scrapy release that changes its templates fails here first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import child_env, run_python

pytestmark = [pytest.mark.slow, pytest.mark.scrapy213]

#: The static site: path -> links.  Nothing links back to ``/`` (the start
#: URL is requested with ``dont_filter``, so a link to it would fetch it
#: again), ``about.html`` and ``news/`` are outside the template rule's
#: ``allow=r"Items/"``, and one link leaves the site.
SITE = {
    "index.html": ["about.html", "Items/1.html", "news/a.html"],
    "about.html": ["Items/1.html", "Items/2.html"],
    "Items/1.html": ["2.html", "../about.html"],
    "Items/2.html": ["3.html", "/about.html"],
    "Items/3.html": ["../news/a.html", "http://example.com/elsewhere.html"],
    "news/a.html": ["../Items/1.html"],
}
#: What the crawl must fetch: the start URL (``/``, served from index.html)
#: and every page linked from it.
PAGES = {"/", "/about.html", "/Items/1.html", "/Items/2.html", "/Items/3.html", "/news/a.html"}


def _write_site(root: Path) -> None:
    for path, links in SITE.items():
        page = root / path
        page.parent.mkdir(parents=True, exist_ok=True)
        anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
        page.write_text(f"<html><body><h1>{path}</h1><ul>{anchors}</ul></body></html>\n")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """``python -m http.server`` on a free port of 127.0.0.1: ``(port, its log file)``."""
    root = tmp_path / "site"
    root.mkdir()
    _write_site(root)
    log = tmp_path / "http.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
             "--directory", str(root)],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41234 (...) ..."
            match = re.search(r" port (\d+)", line)
            assert match, f"http.server did not start: {line!r}"
            yield int(match.group(1)), log
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            proc.stdout.close()  # type: ignore[union-attr]


def _replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer has exactly one {old!r}:\n{text}"
    path.write_text(text.replace(old, new))


def test_generated_project_crawls_with_the_quickstart_edits(
    site: tuple[int, Path], tmp_path: Path
) -> None:
    port, http_log = site
    project = tmp_path / "qs"
    run_python("-m", "scrapy", "startproject", "demo", project, cwd=tmp_path, timeout=60)
    run_python(
        "-m", "scrapy", "genspider", "-t", "crawl", "site", f"127.0.0.1:{port}",
        cwd=project, timeout=60,
    )  # fmt: skip
    settings = project / "demo" / "settings.py"
    spider = project / "demo" / "spiders" / "site.py"

    # What the quickstart says the templates contain.
    text = settings.read_text()
    assert re.findall(r"(?m)^ADDONS = .*$", text) == ["ADDONS = {}"]
    assert re.findall(r"(?m)^DOWNLOAD_DELAY = .*$", text) == ["DOWNLOAD_DELAY = 1"]
    assert re.findall(r"(?m)^CONCURRENT_REQUESTS_PER_DOMAIN = .*$", text) == [
        "CONCURRENT_REQUESTS_PER_DOMAIN = 1"
    ]
    assert re.findall(r"(?m)^ROBOTSTXT_OBEY = .*$", text) == ["ROBOTSTXT_OBEY = True"]

    # The quickstart's edits, nothing else.
    _replace_once(settings, "ADDONS = {}", 'ADDONS = {"scrapy_banker.Addon": 500}')
    _replace_once(
        spider,
        f'start_urls = ["https://127.0.0.1:{port}"]',
        f'start_urls = ["http://127.0.0.1:{port}"]',
    )
    _replace_once(
        spider, f'allowed_domains = ["127.0.0.1:{port}"]', 'allowed_domains = ["127.0.0.1"]'
    )
    _replace_once(spider, 'Rule(LinkExtractor(allow=r"Items/")', "Rule(LinkExtractor()")
    _replace_once(spider, "item = {}", 'item = {"url": response.url}')

    stats_file, items_file = tmp_path / "stats.json", tmp_path / "items.jsonl"
    proc = run_python(
        "-m", "scrapy", "crawl", "site",
        "-s", f"JOBDIR={tmp_path / 'job'}",
        "-s", f"BANKER_STATS_FILE={stats_file}",
        "-O", f"{items_file}:jsonlines",
        cwd=project, timeout=120, env=child_env(),
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    stats = json.loads(stats_file.read_text())

    # Every page once, and robots.txt (a 404: http.server has none).
    served = Counter(
        m.group(1) for m in re.finditer(r'"GET (\S+) HTTP/1\.[01]" \d{3}', http_log.read_text())
    )
    assert set(served) == PAGES | {"/robots.txt"}, served
    assert all(n == 1 for n in served.values()), served
    assert stats["downloader/response_count"] == len(PAGES) + 1
    assert stats["robotstxt/response_count"] == 1
    assert stats["offsite/filtered"] >= 1  # the link to example.com

    # parse_item ran once for every page the rule followed: all but the start URL.
    items = [json.loads(line) for line in items_file.read_text().splitlines()]
    base = f"http://127.0.0.1:{port}"
    assert sorted(item["url"] for item in items) == sorted(base + p for p in PAGES - {"/"})

    # scrapy-banker's scheduler ran it, with JOBDIR.
    assert stats["banker/topic/default/dequeued"] == len(PAGES)
    assert stats["banker/topic/default/responses"] == stats["downloader/response_count"]
    assert any(key.startswith("banker/jobdir/") for key in stats), sorted(stats)
    assert stats["finish_reason"] == "finished"
    assert stats.get("log_count/ERROR", 0) == 0

    # The template's DOWNLOAD_DELAY = 1 held: one host, one request at a time,
    # each at least 0.5 s after the one before (the delay varies by ±50 %).
    assert stats["elapsed_time_seconds"] >= 0.5 * (stats["downloader/response_count"] - 1)
