"""A Scrapy DNS resolver that sends every web-farm host to ``127.0.0.1``.

The farm (:mod:`scrapy_banker.testing.farm`) serves hundreds of virtual
hosts such as ``h0042.farm.test`` from one local port.  Crawls must keep the
real host names -- scheduling, politeness slots and statistics are all keyed
by host -- so instead of rewriting URLs we teach the resolver that every
name under the farm's domain lives on the loopback interface.  Everything
else is resolved exactly as by Scrapy's default resolver.

Scrapy only installs a resolver class from settings inside
``CrawlerProcess`` (``scrapy crawl`` included); code driving a
``CrawlerRunner`` on its own reactor calls :func:`install_farm_resolver`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer

from scrapy_banker.settings import core_config

if TYPE_CHECKING:
    from twisted.internet.base import ReactorBase
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_FARM_DOMAIN",
    "FARM_ADDRESS",
    "FarmResolver",
    "farm_settings",
    "install_farm_resolver",
    "resolver_setting_name",
]

DEFAULT_FARM_DOMAIN = "farm.test"
FARM_ADDRESS = "127.0.0.1"


class FarmResolver(CachingThreadedResolver):
    """Resolve ``*.<domain>`` (and ``<domain>``) to 127.0.0.1 without a lookup.

    Answering synchronously also keeps the thread pool free: a crawl over
    hundreds of farm hosts would otherwise queue hundreds of failing
    ``getaddrinfo`` calls for a TLD that does not exist.
    """

    def __init__(
        self,
        reactor: ReactorBase,
        cache_size: int,
        timeout: float,
        domain: str = DEFAULT_FARM_DOMAIN,
    ) -> None:
        super().__init__(reactor, cache_size, timeout)
        self.domain = domain.strip(".").lower()
        self._suffix = "." + self.domain

    @classmethod
    def from_crawler(cls, crawler: Any, reactor: ReactorBase) -> FarmResolver:
        # ``crawler`` is really the CrawlerProcess in Scrapy's _setup_reactor;
        # like the parent we only touch ``crawler.settings``.
        settings = crawler.settings
        cache_size = settings.getint("DNSCACHE_SIZE") if settings.getbool("DNSCACHE_ENABLED") else 0
        # Validated like every BANKER_* setting: a bad suffix fails at start-up.
        domain = core_config(crawler).farm_domain
        return cls(reactor, cache_size, settings.getfloat("DNS_TIMEOUT"), domain=domain)

    def is_farm_host(self, name: str) -> bool:
        host = name.rstrip(".").lower()
        return host == self.domain or host.endswith(self._suffix)

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> Deferred[str]:
        if self.is_farm_host(name):
            return defer.succeed(FARM_ADDRESS)
        return super().getHostByName(name, timeout)


def resolver_setting_name() -> str:
    """``TWISTED_DNS_RESOLVER`` on Scrapy >= 2.14, ``DNS_RESOLVER`` before.

    Setting the old name on a new Scrapy works but emits a deprecation
    warning, so detect which one the installed version knows.
    """
    from scrapy.settings import default_settings

    if hasattr(default_settings, "TWISTED_DNS_RESOLVER"):
        return "TWISTED_DNS_RESOLVER"
    return "DNS_RESOLVER"


def farm_settings() -> dict[str, str]:
    """Scrapy settings that make ``CrawlerProcess`` / ``scrapy crawl`` use :class:`FarmResolver`."""
    return {resolver_setting_name(): f"{__name__}.FarmResolver"}


def install_farm_resolver(
    reactor: ReactorBase,
    domain: str = DEFAULT_FARM_DOMAIN,
    *,
    cache_size: int = 10000,
    timeout: float = 60.0,
) -> FarmResolver:
    """Install a :class:`FarmResolver` on ``reactor`` (for ``CrawlerRunner`` users)."""
    resolver = FarmResolver(reactor, cache_size, timeout, domain=domain)
    resolver.install_on_reactor()
    logger.debug("farm resolver installed for *.%s", resolver.domain)
    return resolver
