"""pytest plugin: run Scrapy's own test files with ``BankerScheduler`` as the default scheduler.

Loaded with ``-p banker_default_scheduler`` by ``scripts/scrapy-suite``: it
changes Scrapy's default ``SCHEDULER`` before any settings object exists, so
every crawler Scrapy's tests build (``get_crawler``, ``CrawlerProcess``...)
gets scrapy-banker's scheduler unless the test itself names another.  At the
end it fails the session if scrapy-banker's scheduler was never built: a
suite that passed without it would prove nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import scrapy.settings.default_settings as default_settings

from scrapy_banker.scheduler import BankerScheduler

default_settings.SCHEDULER = "scrapy_banker.scheduler.BankerScheduler"

_built = 0
_from_crawler = BankerScheduler.from_crawler.__func__  # type: ignore[attr-defined]


def _counting_from_crawler(cls: Any, crawler: Any) -> Any:
    global _built
    _built += 1
    return _from_crawler(cls, crawler)


BankerScheduler.from_crawler = classmethod(_counting_from_crawler)  # type: ignore[method-assign,assignment]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"scrapy-banker: BankerScheduler built {_built} times")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _built == 0 and session.testscollected:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
