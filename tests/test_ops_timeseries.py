"""BankerTimeseries: the JSON-lines record of a real crawl, read back with ``iter_samples``."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import farm_fixture
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_banker.core.telemetry import PlacementSample, Sample, iter_samples
from scrapy_banker.ops.timeseries import BankerTimeseries
from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.fleet import FleetWorker

TOPICS = ("news", "archive", "products")
INTERVAL = 0.2

pytestmark = pytest.mark.timeout(120)


farm = farm_fixture(FarmConfig(seed=9, hosts=10, total_pages=300, latency_ms=40.0))


@pytest.mark.slow
def test_a_crawl_records_one_sample_per_interval_ending_on_its_final_stats(
    farm: WebFarm, tmp_path: Path
) -> None:
    record = tmp_path / "record" / "timeseries.jsonl"  # its directory is created
    worker = FleetWorker(
        "solo",
        tmp_path,
        {
            "seeds": farm.start_urls(),
            "settings": {
                "ADDONS": {"scrapy_banker.Addon": 500},
                "BANKER_TOPIC_RULES": [{"url": f"/{t}/", "topic": t} for t in TOPICS],
                "BANKER_TIMESERIES_FILE": str(record),
                "BANKER_TIMESERIES_INTERVAL": INTERVAL,
                # Resources nobody asks for: the Banker's state is sampled all the same.
                "BANKER_RESOURCES": {"sessions": 2},
                "CONCURRENT_REQUESTS": 8,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            },
        },
    )
    assert worker.wait(90) == 0, worker.log_tail()
    stats = worker.stats()
    with record.open(encoding="utf-8") as fp:
        parsed = list(iter_samples(fp))
    errors = [(n, s) for n, s in parsed if isinstance(s, ValueError)]
    assert errors == []
    samples = [s for _, s in parsed if isinstance(s, Sample)]
    assert len(samples) >= 4, f"{len(samples)} samples for a crawl of several intervals"

    # Time goes forward, pages (cumulative) never go back, and they grew.
    assert all(a.t <= b.t for a, b in itertools.pairwise(samples))
    assert all(a.pages <= b.pages for a, b in itertools.pairwise(samples))
    for topic in TOPICS:
        series = [s.topics[topic].pages for s in samples if topic in s.topics]
        assert series == sorted(series), topic
    assert samples[0].pages < samples[-1].pages
    assert any(s.inflight > 0 for s in samples)
    assert any(s.queued > 0 for s in samples)

    # The last line is the crawl's final state.
    final = samples[-1]
    assert final.pages == stats["downloader/response_count"] == stats["response_received_count"]
    assert set(TOPICS) <= set(final.topics)
    for topic, t in final.topics.items():
        assert t.pages == stats.get(f"banker/topic/{topic}/responses", 0), topic
    assert final.queued == final.inflight == 0
    assert final.fleet is None and final.placement is None  # one process
    assert final.banker is not None
    assert final.banker.total == final.banker.available == {"sessions": 2}
    assert final.node and {s.node for s in samples} == {final.node}


def _crawler(settings: dict[str, Any]) -> Any:
    return get_crawler(settings_dict=settings)


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({}, ""),
        (
            {"BANKER_TIMESERIES_FILE": "x.jsonl", "SCHEDULER": "scrapy.core.scheduler.Scheduler"},
            "not a BankerScheduler",
        ),
        (
            {
                "BANKER_TIMESERIES_FILE": "x.jsonl",
                "SCHEDULER": "scrapy_banker.scheduler.BankerScheduler",
                "BANKER_ENABLED": False,
            },
            "not a BankerScheduler",
        ),
    ],
)
def test_off_without_a_file_or_a_banker_scheduler(
    settings: dict[str, Any], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, "scrapy_banker"), pytest.raises(NotConfigured) as info:
        BankerTimeseries.from_crawler(_crawler(settings))
    assert not info.value.args  # Scrapy logs a NotConfigured message as a warning
    assert why in caplog.text


def test_the_placement_map_is_written_when_a_new_plan_appears_and_last(tmp_path: Path) -> None:
    path = tmp_path / "ts.jsonl"
    ext = BankerTimeseries.from_crawler(
        _crawler(
            {
                "BANKER_TIMESERIES_FILE": str(path),
                "SCHEDULER": "scrapy_banker.scheduler.BankerScheduler",
            }
        )
    )
    plan_a = PlacementSample("topk", {"n0": [0.0, 1.0]}, {"a.test": [1.0, 1.0]}, {"a.test": "n0"})
    plan_b = PlacementSample("topk", {"n0": [0.0, 2.0]}, {"a.test": [2.0, 1.0]}, {"a.test": "n0"})

    def at(t: float, plan: PlacementSample | None) -> Sample:
        return Sample(t=t, node="n0", pages=int(t), queued=0, inflight=0, placement=plan)

    assert ext.start()
    for sample in (at(1, None), at(2, plan_a), at(3, plan_a), at(4, plan_b), at(5, plan_b)):
        ext.on_sample(sample)
    ext.on_close(at(6, plan_b))
    with path.open(encoding="utf-8") as fp:
        lines = [json.loads(line) for line in fp]
        fp.seek(0)
        samples = [s for _, s in iter_samples(fp)]
    assert [line["placement"] is not None for line in lines] == [
        False, True, False, True, False, True,
    ]  # fmt: skip
    assert all(isinstance(s, Sample) for s in samples)
    assert lines[1]["placement"]["nodes"] == {"n0": [0.0, 1.0]}
    assert lines[3]["placement"]["nodes"] == lines[5]["placement"]["nodes"] == {"n0": [0.0, 2.0]}
    assert ext.out is None  # closed
