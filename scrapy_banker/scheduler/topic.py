"""Topic of a request, shared by the spider middleware and the scheduler.

Kept in one place so a request tagged by a rule in the spider middleware and a
request that reached the scheduler some other way (``engine.crawl`` from an
extension, a redirect) are classified by the same code.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_banker.core.meta import META_TOPIC
from scrapy_banker.settings import _TOPIC_NAME_RE

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)


def callback_name(request: Request) -> str | None:
    cb = request.callback
    if cb is None:
        return "parse"
    if isinstance(cb, str):
        return cb
    return getattr(cb, "__name__", None)


def request_topic(
    request: Request, config: BankerConfig, stats: StatsCollector | None = None
) -> str:
    """Return the request's topic, writing it to ``request.meta`` when it was derived.

    A malformed ``banker_topic`` meta value is not fatal: the request is still
    crawled, under the rule-derived topic, and the incident is logged and counted
    so it cannot go unnoticed.
    """
    topic = request.meta.get(META_TOPIC)
    if topic is not None:
        if isinstance(topic, str) and _TOPIC_NAME_RE.match(topic):
            return topic
        logger.warning(
            "Ignoring invalid meta %s=%r on %s: expected a topic name of 1-64 "
            "letters, digits, '_', '.', '-'",
            META_TOPIC,
            topic,
            request,
        )
        if stats is not None:
            stats.inc_value("banker/topic/invalid_meta")
    topic = config.topic_for(request.url, callback_name(request))
    request.meta[META_TOPIC] = topic
    return topic
