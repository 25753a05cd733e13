"""Scrapy side of network-aware placement: measure links, probe sites.

* :class:`NetworkMeasureMiddleware` (downloader middleware) records, for
  every response, the application-level latency -- Scrapy's
  ``download_latency``, the time to the response headers, i.e. the GNP
  paper's "httpping" -- and the crawl bandwidth (body bytes / time from
  request to response) per site in a :class:`~scrapy_banker.net.netstats.LinkStats`
  shared with the distributed scheduler, which publishes denoised figures
  to Redis for the planner.
* :class:`Prober` sends the few, rate-limited probe requests that GNP
  needs: a landmark node probes every known site, any other node a handful
  of reference sites.  Probes go straight to the downloader
  (``engine.download``), so they never enter the frontier, are never
  deduplicated against crawl URLs and never reach the spider.
"""

from __future__ import annotations

import logging
import time
import weakref
import zlib
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached

from scrapy_banker.core.meta import META_NET_T0, META_PROBE
from scrapy_banker.net.netstats import LinkStats, RateLimiter
from scrapy_banker.settings import PlacementConfig, placement_config

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.spiders import Spider
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

__all__ = ["NetworkMeasureMiddleware", "Prober", "link_stats", "site_of"]

_LINKS: weakref.WeakKeyDictionary[Crawler, LinkStats] = weakref.WeakKeyDictionary()


def link_stats(crawler: Crawler) -> LinkStats:
    """The crawler's one LinkStats, shared by the middleware and the scheduler."""
    links = _LINKS.get(crawler)
    if links is None:
        config = placement_config(crawler)
        links = _LINKS[crawler] = LinkStats(window=config.window, max_sites=10_000)
    return links


def site_of(request: Request) -> str:
    """A site is a netloc (``host[:port]``): what one crawler connects to."""
    return urlparse_cached(request).netloc.lower()


class NetworkMeasureMiddleware:
    """Record httpping latency and crawl bandwidth per site for this node."""

    def __init__(self, links: LinkStats, stats: StatsCollector) -> None:
        self.links = links
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> NetworkMeasureMiddleware:
        config = placement_config(crawler)  # a typo fails at start-up
        reason = None
        if not config.measure:
            reason = "BANKER_NET_MEASURE is False"
        elif config.mode == "hash":
            # Nothing would read the measurements: keep no per-site state.
            reason = "BANKER_PLACEMENT is 'hash'"
        if reason is not None:
            # Bare: Scrapy logs the message of a NotConfigured as a warning, and
            # the default crawl (hash placement) leaves this middleware off.
            logger.debug("Disabled %s: %s", cls.__name__, reason)
            raise NotConfigured()
        assert crawler.stats is not None
        return cls(link_stats(crawler), crawler.stats)

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        request.meta[META_NET_T0] = time.monotonic()

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        latency = request.meta.get("download_latency")
        t0 = request.meta.get(META_NET_T0)
        if not isinstance(latency, (int, float)) or not isinstance(t0, float):
            return response  # cached or synthesised response: nothing was measured
        elapsed = max(time.monotonic() - t0, float(latency))
        try:
            self.links.record(site_of(request), float(latency), len(response.body), elapsed)
        except ValueError as exc:
            logger.debug("Not recording a measurement for %s: %s", request, exc)
            self.stats.inc_value("banker/net/rejected_samples")
            return response
        self.stats.inc_value("banker/net/samples")
        if request.meta.get(META_PROBE):
            self.stats.inc_value("banker/net/probe_responses")
        return response


class Prober:
    """Decide which sites this node still has to probe, and send the probes.

    ``tick`` is called often (from a ``LoopingCall``); it sends at most what
    the token bucket allows, so a landmark node never floods a site or the
    fleet's own downloader: ``BANKER_PROBE_RATE`` probes/s per node, each
    site ``BANKER_PROBE_SAMPLES`` times, enough for the denoised mean.
    Breadth-first (every site once, then every site twice, ...), because the
    planner can use a site from its first sample, and a crawl is short
    compared with a landmark's whole probe schedule.  ``measured`` (the
    node's latency samples per site, from crawl traffic too) spares the
    probes of sites this node already crawls.
    """

    def __init__(
        self,
        config: PlacementConfig,
        send: Callable[[Request], Any],
        stats: StatsCollector,
        clock: Callable[[], float] = time.monotonic,
        measured: Callable[[str], int] | None = None,
        node: str = "",
    ) -> None:
        self.config = config
        self.measured = measured
        #: Each node walks the sites from its own starting point, so the landmarks
        #: of a fleet do not all probe the same host at the same moment.
        self.offset = zlib.crc32(node.encode("utf-8"))
        self.send = send
        self.stats = stats
        self.limiter = (
            RateLimiter(config.probe_rate, burst=max(1, int(config.probe_rate)), clock=clock)
            if config.probe_rate > 0
            else None
        )
        #: site -> scheme, as published by the fleet (set by the scheduler).
        self.known: dict[str, str] = {}
        #: site -> its backlog at the fleet's last plan: heavier sites are probed first.
        self.weights: Mapping[str, float] = {}
        self.sent: dict[str, int] = {}
        self._done_at = -1

    def targets(self) -> list[str]:
        """Sites still short of probes: all for a landmark, else the reference sites."""
        sites = sorted(self.known)
        if not self.config.landmark:
            sites = sites[: self.config.reference_sites]
        if sites:
            start = self.offset % len(sites)
            sites = sites[start:] + sites[:start]
        if self.weights:
            # Heaviest first (stable: equal weights keep the node's own rotation).
            # Placement matters most for the sites with the most work left, and a
            # crawl's largest site decides when it ends.
            sites.sort(key=lambda site: -self.weights.get(site, 0.0))
        want = self.config.probe_samples
        return [s for s in sites if self._have(s) < want]

    def _have(self, site: str) -> int:
        sent = self.sent.get(site, 0)
        return sent if self.measured is None else max(sent, self.measured(site))

    def tick(self) -> int:
        if self.limiter is None or self.config.mode == "hash":
            return 0
        if self._done_at == len(self.known):  # nothing new since every site was probed
            return 0
        sent = 0
        while True:
            todo = self.targets()
            if not todo:
                # Sites are only ever added, and a site's samples only grow, so the
                # sort of a broad crawl's sites is skipped until a new site shows up.
                self._done_at = len(self.known)
                return sent
            have = {s: self._have(s) for s in todo}
            low = min(have.values())
            for site in todo:
                if have[site] != low:
                    continue
                if not self.limiter.try_acquire():
                    return sent
                self._probe(site)
                sent += 1

    def _probe(self, site: str) -> None:
        self.sent[site] = self.sent.get(site, 0) + 1
        url = f"{self.known.get(site, 'http')}://{site}{self.config.probe_path}"
        request = Request(
            url,
            dont_filter=True,
            meta={
                META_PROBE: site,
                "dont_retry": True,
                "dont_redirect": True,
                "handle_httpstatus_all": True,
                "download_timeout": 15,
            },
        )
        self.stats.inc_value("banker/net/probes")
        result = self.send(request)
        if hasattr(result, "addErrback"):
            result.addErrback(self._failed, site)

    def _failed(self, failure: Any, site: str) -> None:
        self.stats.inc_value("banker/net/probe_errors")
        logger.debug("Probe of %s failed: %s", site, failure.getErrorMessage())

    def update(
        self, sites: Iterable[tuple[str, str]], weights: Mapping[str, float] | None = None
    ) -> None:
        for site, scheme in sites:
            self.known.setdefault(site, scheme)
        if weights is not None:
            self.weights = weights
