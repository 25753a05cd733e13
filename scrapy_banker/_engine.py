"""Reach the running scheduler from other components, across Scrapy versions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def running_scheduler(crawler: Crawler) -> Any:
    """The scheduler instance of the running crawl, or None before/after it."""
    try:
        engine = crawler.engine
    except RuntimeError:  # Scrapy >= 2.14: no engine yet
        return None
    scheduler = getattr(engine, "scheduler", None)  # Scrapy >= 2.14
    if scheduler is None:
        slot = getattr(engine, "slot", None) or getattr(engine, "_slot", None)
        scheduler = getattr(slot, "scheduler", None)
    return scheduler
