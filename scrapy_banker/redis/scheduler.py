"""``BankerRedisScheduler``: the distributed frontier for a fleet of workers.

Put it in ``SCHEDULER`` on every worker of a crawl (with scrapy-redis's
``REDIS_URL``) and run ``scrapy crawl`` as many times as you like.  It is
:class:`~scrapy_banker.scheduler.BankerScheduler` -- the same topics,
politeness and admission -- composed with another request store,
:class:`~scrapy_banker.redis.store.RedisLeaseStore`: requests are
partitioned by host across the live workers, popped as leases and
acknowledged only once the engine is done with them, so per-domain limits
hold fleet-wide and ``kill -9`` loses nothing.  See
:mod:`scrapy_banker.redis.store`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from scrapy_banker.core.meta import META_LEASE
from scrapy_banker.redis.store import RedisLeaseStore
from scrapy_banker.scheduler import BankerScheduler

__all__ = ["META_LEASE", "BankerRedisScheduler"]


class BankerRedisScheduler(BankerScheduler):
    """Partitioned, leased, fleet-wide polite frontier on Redis."""

    store_class: ClassVar[Any] = RedisLeaseStore
