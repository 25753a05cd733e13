"""Request -> (topic, download slot, queue key, key hash): what the frontier files it under."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from scrapy_banker.core.hashing import bkdr, key_policy, murmur
from scrapy_banker.scheduler.topic import request_topic

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.scheduler.downloader import DownloaderView
    from scrapy_banker.settings import BankerConfig

__all__ = ["Classified", "Classifier", "UnparsableURL"]

#: Distinct keys whose hash is remembered; cleared when full (only costs re-hashing).
HASH_CACHE_SIZE = 1 << 17


class UnparsableURL(ValueError):
    """A request's URL has no host or key this frontier can file it under.

    Raised only around the URL parsing itself, so an error of another
    component (a user's fingerprinter, a topic rule) is never mistaken for
    it and propagates as it would through Scrapy's own scheduler.
    """


class Classified(NamedTuple):
    topic: str
    slot: str
    key: str
    key_hash: int


class Classifier:
    """Classify requests by the crawl's rules; :class:`UnparsableURL` for a URL it cannot parse."""

    def __init__(
        self, config: BankerConfig, downloader: DownloaderView, stats: StatsCollector | None
    ) -> None:
        self.config = config
        self.downloader = downloader
        self.stats = stats
        self._key_of = key_policy(config.queue_key)
        self._hash_fn = bkdr if config.queue_hash == "bkdr" else murmur
        self._host_key = config.queue_key == "host"
        # Keys repeat (hosts): hash each distinct key once.
        self._hash_cache: dict[str, int] = {}

    def classify(self, request: Request) -> Classified:
        topic = request_topic(request, self.config, self.stats)
        downloader = self.downloader
        try:
            slot = downloader.slot_key(request)
            # With host keys the slot is the host name: parsed once.
            key = (
                slot
                if self._host_key and downloader.slot_is_host(request)
                else self._key_of(request.url)
            )
        except ValueError as exc:  # e.g. a broken IPv6 literal left by a middleware
            raise UnparsableURL(str(exc) or "invalid URL") from exc
        return Classified(topic, slot, key, self.key_hash(key))

    def key_hash(self, key: str) -> int:
        cache = self._hash_cache
        key_hash = cache.get(key)
        if key_hash is None:
            if len(cache) >= HASH_CACHE_SIZE:
                cache.clear()
            key_hash = cache[key] = self._hash_fn(key)
        return key_hash
