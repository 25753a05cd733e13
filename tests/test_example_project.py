"""Real `scrapy crawl` runs of example_project against the local web farm."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import PROJECT, farm_fixture, run_python, run_scrapy

from scrapy_banker.testing.farm import FarmConfig, WebFarm

pytestmark = [pytest.mark.slow, pytest.mark.scrapy213]

HOSTS = 6

farm = farm_fixture(FarmConfig(seed=7, hosts=HOSTS, total_pages=240, latency_ms=2.0))


def _crawl(farm: WebFarm, tmp: Path, *settings: str) -> tuple[dict[str, object], list[dict]]:
    farm.reset()
    return _crawl_keep_farm(farm, tmp, *settings)


def _topic(url: str) -> str:
    first = urlsplit(url).path.strip("/").split("/")[0]
    return first if first in {"news", "archive", "products"} else "index"


def test_banker_crawl_fetches_every_page_once_with_topic_stats(
    farm: WebFarm, tmp_path: Path
) -> None:
    stats, items = _crawl(farm, tmp_path)
    expected = farm.expected_urls()
    fetched = [item["url"] for item in items]
    assert set(fetched) == expected
    assert len(fetched) == len(expected)  # each page once
    server = farm.stats(urls=True)
    assert set(server["fetches"]) == expected
    assert set(server["fetches"].values()) == {1}
    # Topics come from BANKER_TOPIC_RULES and agree with the URL paths.
    assert all(item["topic"] == _topic(item["url"]) for item in items)
    per_topic = Counter(_topic(u) for u in expected)
    for topic, count in per_topic.items():
        assert stats[f"banker/topic/{topic}/responses"] == count
        assert stats[f"banker/topic/{topic}/dequeued"] == count
    assert stats["finish_reason"] == "finished"
    assert stats.get("log_count/ERROR", 0) == 0


def test_default_scheduler_fetches_the_same_pages(farm: WebFarm, tmp_path: Path) -> None:
    _, banker_items = _crawl(farm, tmp_path / "banker")
    stats, default_items = _crawl(
        farm,
        tmp_path / "default",
        "ADDONS={}",
        'EXTENSIONS={"scrapy_banker.extensions.BankerStatsFile": 500}',
    )
    assert {i["url"] for i in default_items} == {i["url"] for i in banker_items}
    # Without the add-on no banker component ran.
    assert not [k for k in stats if k.startswith("banker/")]


def test_demo_prints_summary() -> None:
    proc = run_python(PROJECT / "run_demo.py", "--hosts", "4", "--pages", "80", "--latency-ms", "0")
    assert "scrapy-banker demo summary" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if "pages fetched" in ln)
    fetched, total = int(line.split()[2]), int(line.split()[4])
    assert fetched == total > 0
    assert "news" in proc.stdout and "pages/s" in proc.stdout


def test_jobdir_stop_and_resume_fetches_the_rest(farm: WebFarm, tmp_path: Path) -> None:
    jobdir = tmp_path / "job"
    farm.reset()
    first_stats, first_items = _crawl_keep_farm(
        farm, tmp_path / "one", f"JOBDIR={jobdir}", "CLOSESPIDER_PAGECOUNT=60"
    )
    assert first_stats["finish_reason"] == "closespider_pagecount"
    saved = first_stats["banker/jobdir/saved"]
    assert saved > 0
    second_stats, second_items = _crawl_keep_farm(farm, tmp_path / "two", f"JOBDIR={jobdir}")
    assert second_stats["banker/jobdir/restored"] == saved
    assert second_stats["finish_reason"] == "finished"
    fetched = [i["url"] for i in first_items + second_items]
    expected = farm.expected_urls()
    # Requests in flight when the first run stopped were fetched but their
    # responses dropped; they are in requests.seen, so a resume cannot redo them.
    missing = expected - set(fetched)
    server = farm.stats(urls=True)["fetches"]
    assert all(url in server for url in missing)
    assert len(missing) <= 32  # at most CONCURRENT_REQUESTS were in flight
    assert len(fetched) == len(set(fetched))  # nothing parsed twice


def _crawl_keep_farm(
    farm: WebFarm, tmp: Path, *settings: str
) -> tuple[dict[str, object], list[dict]]:
    """Run ``scrapy crawl farm`` in example_project; return its final stats and items."""
    tmp.mkdir(parents=True, exist_ok=True)
    stats_file, items_file = tmp / "stats.json", tmp / "items.jsonl"
    args = [
        "crawl", "farm",
        "-a", f"port={farm.port}", "-a", f"hosts={farm.model.hosts}",
        "-s", f"BANKER_STATS_FILE={stats_file}", "-s", "LOG_LEVEL=WARNING",
        "-O", str(items_file),
    ]  # fmt: skip
    for s in settings:
        args += ["-s", s]
    proc = run_scrapy(*args)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    items = [json.loads(line) for line in items_file.read_text().splitlines()]
    return json.loads(stats_file.read_text()), items


def test_per_host_concurrency_holds_under_the_asyncio_reactor(tmp_path: Path) -> None:
    """Scrapy 2.19 + asyncio reactor overfills a slot; BankerScheduler does not."""
    with WebFarm(FarmConfig(seed=3, hosts=2, total_pages=80, latency_ms=100.0)) as slow:
        stats, items = _crawl(
            slow,
            tmp_path,
            "CONCURRENT_REQUESTS_PER_DOMAIN=2",
            "TWISTED_REACTOR=twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        )
        inflight = slow.stats()["max_inflight_per_host"]
        assert {i["url"] for i in items} == slow.expected_urls()
    assert max(inflight.values()) == 2, inflight
    assert stats["finish_reason"] == "finished"
