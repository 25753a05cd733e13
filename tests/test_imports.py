"""A crawl with the add-on imports numpy, rich and prometheus-client only when it needs them.

Why it matters: Python's cyclic garbage collector scans every live tracked
object on each full (generation 2) collection, the objects of imported
modules included, and a crawl allocates enough to run many of them.  numpy,
rich and prometheus-client together add about 11,000 such objects, which a
crawl would pay for on every full collection even with the components that
need them off (the add-on lists those components in every crawl; they raise
NotConfigured): the network measurements (numpy, ``net/netstats``), the
terminal progress table (rich, ``ops/progress``) and the Prometheus metrics
(prometheus-client, ``ops/metrics`` -> ``ops/metric_families``).

Each check builds a real crawler in a fresh interpreter (this process has
imported everything already): the add-on applied, the extensions built
(``Crawler._apply_settings``), the scheduler and both middleware managers.
"""

from __future__ import annotations

import json

import pytest
from conftest import output_tail, run_python

#: Each check starts an interpreter that builds a real Scrapy crawler.
pytestmark = [pytest.mark.slow, pytest.mark.scrapy213]

#: Imported only once the component that needs it is configured.
HEAVY = ("numpy", "rich", "prometheus_client")

#: argv[1]: the crawl's extra settings (JSON).  Prints, after each step of
#: building the crawler, the HEAVY modules loaded by then.
_CRAWLER = f"""
import json, sys
from scrapy.utils.reactor import install_reactor
install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
from scrapy import Spider
from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
from scrapy.core.spidermw import SpiderMiddlewareManager
from scrapy.crawler import Crawler
from scrapy.utils.misc import build_from_crawler, load_object

class Quiet(Spider):
    name = "quiet"

def loaded():
    return sorted(m for m in {HEAVY!r} if m in sys.modules)

settings = {{"ADDONS": {{"scrapy_banker.Addon": 500}}, **json.loads(sys.argv[1])}}
crawler = Crawler(Quiet, settings)
steps = {{}}
crawler._apply_settings()
steps["add-on and extensions"] = loaded()
scheduler = build_from_crawler(load_object(crawler.settings["SCHEDULER"]), crawler)
steps["scheduler"] = loaded()
downloader_mws = DownloaderMiddlewareManager.from_crawler(crawler)
steps["downloader middlewares"] = loaded()
spider_mws = SpiderMiddlewareManager.from_crawler(crawler)
steps["spider middlewares"] = loaded()
print(json.dumps(steps))
"""
STEPS = ("add-on and extensions", "scheduler", "downloader middlewares", "spider middlewares")


def heavy_loaded(**settings: object) -> dict[str, list[str]]:
    """Step of building a fresh crawler with the add-on -> :data:`HEAVY` modules loaded by then."""
    proc = run_python("-c", _CRAWLER, json.dumps(settings), timeout=60)
    try:
        steps: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(output_tail(proc)) from None
    return steps


def test_a_default_crawl_imports_none_of_the_heavy_modules() -> None:
    """Default settings: metrics, progress and network measurements are off,
    so the crawl carries none of their libraries' objects into every full GC."""
    assert heavy_loaded() == {step: [] for step in STEPS}


def test_metrics_import_prometheus_client_once_configured() -> None:
    """With BANKER_METRICS_PORT set, BankerMetrics is built and imports
    prometheus-client (so the check above can fail); the others stay out."""
    steps = heavy_loaded(BANKER_METRICS_PORT=0)  # 0: any free port, bound only at spider open
    assert steps["add-on and extensions"] == ["prometheus_client"]
