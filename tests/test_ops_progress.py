"""BankerProgress: a live table on a terminal, nothing anywhere else."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_banker.core.telemetry import BankerSample, FleetSample, Sample, TopicSample
from scrapy_banker.ops.progress import BankerProgress, progress_view
from scrapy_banker.testing.farm import FarmConfig, WebFarm

TOPICS = ("news", "archive", "products")

pytestmark = pytest.mark.timeout(120)


def test_quiet_when_stdout_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, a file: no escape codes
    crawler = get_crawler(settings_dict={"BANKER_PROGRESS": True})
    with pytest.raises(NotConfigured) as info:
        BankerProgress.from_crawler(crawler)
    assert not info.value.args  # bare: no warning in the log
    with pytest.raises(NotConfigured):
        BankerProgress.from_crawler(get_crawler(settings_dict={}))


def test_the_table_shows_topics_rates_and_the_fleet() -> None:
    def at(t: float, news: int, archive: int) -> Sample:
        return Sample(
            t=t, node="w1", pages=news + archive, queued=7, inflight=3,
            topics={"news": TopicSample(news, 5, 2, 1.0),
                    "archive": TopicSample(archive, 2, 1, 0.5)},
            banker=BankerSample({"sessions": 2}, {"sessions": 1}, {"sessions": 1},
                                {"sessions": 0}, 1, 0),
            fleet=FleetSample(12, 64, 9, 0, True),
        )  # fmt: skip

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    console.print(progress_view(at(12.0, 30, 10), at(10.0, 20, 10)))
    text = out.getvalue()
    for expected in ("news", "archive", "pages/s", "5.0", "total", "partitions 12/64",
                     "leases 9", "sessions 1/2"):  # fmt: skip
        assert expected in text, (expected, text)


@pytest.mark.slow
def test_a_crawl_on_a_pseudo_terminal_draws_the_topics(tmp_path: Path) -> None:
    with WebFarm(FarmConfig(seed=4, hosts=6, total_pages=120, latency_ms=20.0)) as farm:
        spec = {
            "seeds": farm.start_urls(),
            "stats_out": str(tmp_path / "stats.json"),
            "settings": {
                "ADDONS": {"scrapy_banker.Addon": 500},
                "BANKER_TOPIC_RULES": [{"url": f"/{t}/", "topic": t} for t in TOPICS],
                "BANKER_PROGRESS": True,
                "BANKER_TIMESERIES_INTERVAL": 0.2,
                "LOG_FILE": str(tmp_path / "crawl.log"),
            },
        }
        (tmp_path / "spec.json").write_text(json.dumps(spec), "utf-8")
        primary, secondary = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy_banker.testing.fleet", str(tmp_path / "spec.json")],
            stdin=subprocess.DEVNULL, stdout=secondary, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(secondary)
        screen = bytearray()
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([primary], [], [], 0.2)
                if ready:
                    try:
                        chunk = os.read(primary, 65536)
                    except OSError:  # EIO: the crawl closed its side of the terminal
                        break
                    if not chunk:
                        break
                    screen += chunk
                elif proc.poll() is not None:
                    break
            assert proc.wait(timeout=30) == 0
        finally:
            os.close(primary)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = screen.decode("utf-8", errors="replace")
    assert "\x1b[" in text  # drawn for a terminal (cursor movement, styles)
    for expected in (*TOPICS, "pages/s", "in flight", "total"):
        assert expected in text, (expected, text[-2000:])
    stats = json.loads((tmp_path / "stats.json").read_text("utf-8"))
    # The last table shows the final page count.
    assert str(stats["downloader/response_count"]) in text
