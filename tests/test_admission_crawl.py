"""A real crawl with Banker's admission: every way a request ends releases its grant."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_python

from scrapy_banker.testing.farm import FarmConfig, WebFarm

pytestmark = [pytest.mark.slow, pytest.mark.scrapy213]

SPIDER = textwrap.dedent(
    '''
    import json, sys
    import scrapy
    from scrapy.crawler import CrawlerProcess
    from scrapy.exceptions import IgnoreRequest
    from scrapy.linkextractors import LinkExtractor
    from scrapy_banker.testing.resolver import farm_settings

    port, hosts, stats_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    tasks = int(sys.argv[4])


    class IgnoreSome:
        """Raises IgnoreRequest before the download for every 7th page."""

        def process_request(self, request, spider=None):
            if request.url.endswith("7.html"):
                raise IgnoreRequest("test: ignored before download")


    class Spider(scrapy.Spider):
        name = "admission"
        links = LinkExtractor(allow=[r"^https?://[a-z0-9-]+\\.farm\\.test(:\\d+)?/"])

        async def start(self):
            for i in range(hosts):
                yield scrapy.Request(
                    f"http://h{i:04d}.farm.test:{port}/",
                    meta={"banker_need": {"pages": 1}},
                    errback=self.failed,
                )
            # Tasks that take a session and never finish: 2 sessions for 3 tasks, so
            # the third waits until BANKER_TASK_TIMEOUT reclaims one; the last
            # holder is reclaimed at close.  They need no page, so they go to a
            # host of their own (the farm answers 404): the farm's in-flight
            # count of the crawled hosts is then pages only.
            for t in range(tasks):
                yield scrapy.Request(
                    f"http://h{hosts:04d}.farm.test:{port}/?task={t}",
                    meta={"banker_task": f"t{t}", "banker_max": {"sessions": 1, "pages": 1},
                          "banker_need": {"sessions": 1}, "banker_hold": True},
                    dont_filter=True, callback=self.noop,
                )

        def parse(self, response):
            for link in self.links.extract_links(response):
                yield response.follow(link.url, meta={"banker_need": {"pages": 1}},
                                      errback=self.failed)

        def noop(self, response):
            return None

        def failed(self, failure):
            return None


    process = CrawlerProcess({
        **farm_settings(),
        "SCHEDULER": "scrapy_banker.scheduler.BankerScheduler",
        "ADDONS": {"scrapy_banker.Addon": 500},
        "DOWNLOADER_MIDDLEWARES": {IgnoreSome: 100},
        "BANKER_RESOURCES": {"pages": 3, "sessions": 2},
        "BANKER_TASK_TIMEOUT": 2,
        "BANKER_STATS_FILE": stats_file,
        "CONCURRENT_REQUESTS": 16,
        "DOWNLOAD_TIMEOUT": 1,
        "RETRY_TIMES": 1,
        "LOG_LEVEL": "WARNING",
    })
    process.crawl(Spider)
    process.start()
    '''
)


def test_every_end_path_releases_and_nothing_leaks(tmp_path: Path) -> None:
    config = FarmConfig(
        seed=11,
        hosts=4,
        total_pages=120,
        latency_ms=5.0,
        error_rate=0.1,  # 500: HttpErrorMiddleware, after RetryMiddleware retried it
        transient_error_rate=0.1,  # 503 once, then 200: a retry copies the meta
        timeout_rate=0.05,  # DOWNLOAD_TIMEOUT: exceptions, retried, then given up
        timeout_s=3.0,
    )
    script = tmp_path / "spider.py"
    script.write_text(SPIDER)
    stats_file = tmp_path / "stats.json"
    with WebFarm(config) as farm:
        proc = run_python(script, str(farm.port), "4", stats_file, "3", timeout=120)
        server = farm.stats()
    stats = json.loads(stats_file.read_text())
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # Every path was taken...
    # Downloads (responses, 5xx, timeouts) release when they leave the downloader;
    # IgnoreRequest before the download is released by the downloader middleware.
    assert stats["banker/admission/released/left_downloader"] > 100
    assert stats["banker/admission/released/exception"] > 0
    assert any("Timeout" in k for k in stats if k.startswith("downloader/exception_type_count/"))
    assert stats.get("retry/count", 0) > 0
    assert stats["downloader/exception_type_count/scrapy.exceptions.IgnoreRequest"] > 0
    assert stats["downloader/response_status_count/500"] > 0
    # Each of the 3 tasks holds its session to the end: idle holders are reclaimed by
    # BANKER_TASK_TIMEOUT (the third task waits for one), the rest at close.
    reclaimed_timeout = stats["banker/task/reclaimed_timeout"]
    assert reclaimed_timeout >= 1
    assert reclaimed_timeout + stats.get("banker/task/reclaimed_close", 0) == 3
    # ...the resource limit held (at most 3 pages in flight, as the farm saw)...
    assert max(server["max_inflight_per_host"].values()) <= 3
    # ...and nothing leaked.
    assert stats["banker/alloc/leaked/pages"] == 0
    assert stats["banker/alloc/leaked/sessions"] == 0
    assert stats["banker/alloc/pages"] == 0
    assert stats["banker/alloc/sessions"] == 0
    assert stats["finish_reason"] == "finished"
