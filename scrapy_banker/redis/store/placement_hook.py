"""Network-aware placement plugged into a fleet's request store (``BANKER_PLACEMENT``).

With placement on, partitions go to the workers closest to their sites
(:mod:`scrapy_banker.net.placement`) instead of by hash alone.  The store
tells the :class:`~scrapy_banker.redis.worker.placement_agent.PlacementAgent` which site
each partition holds as requests are queued (:meth:`PlacementHook.note`), and
a :class:`~scrapy_banker.scheduler.netaware.Prober` measures the links to the
sites the agent knows (:meth:`PlacementHook.tick`).  With ``hash`` placement
none of it is built: :func:`placement_for` returns None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached

from scrapy_banker.scheduler.netaware import Prober, link_stats, site_of
from scrapy_banker.settings import placement_config

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster
    from scrapy import Request
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.redis.worker.placement_agent import PlacementAgent

__all__ = ["PlacementHook", "placement_for"]


class PlacementHook:
    """Network-aware placement, plugged into a lease store when ``BANKER_PLACEMENT`` is on."""

    def __init__(self, agent: PlacementAgent, prober: Prober) -> None:
        self.agent = agent
        self.prober = prober

    def note(self, request: Request, partition: int) -> None:
        site = site_of(request)
        if site:  # data:, file: ... have no site to place
            self.agent.note_site(partition, site, urlparse_cached(request).scheme)

    def tick(self) -> None:
        prober, agent = self.prober, self.agent
        if len(prober.known) != len(agent.known) or prober.weights is not agent.backlogs:
            prober.update(agent.known.items(), agent.backlogs)
        prober.tick()


def placement_for(
    crawler: Crawler, client: redis.Redis | RedisCluster, frontier: RedisFrontier, node: str
) -> PlacementHook | None:
    """The one factory of placement parts; None when placement is off (``hash``)."""
    pconfig = placement_config(crawler)
    if pconfig.mode == "hash":
        return None
    assert crawler.stats is not None
    # Imported here: the planners pull in scipy, which costs a worker start-up
    # ~0.5 s (more with a fleet starting on few cores) that hash placement
    # never needs.
    from scrapy_banker.redis.worker.placement_agent import PlacementAgent

    links = link_stats(crawler)
    agent = PlacementAgent(
        client, frontier.keyspace, node, pconfig, links, backlog=frontier.backlog
    )

    def send_probe(request: Request) -> Deferred[Any]:
        """Straight to the downloader: a probe is not crawl work and must not be queued."""
        engine = crawler.engine
        assert engine is not None
        if hasattr(engine, "download_async"):
            return deferred_from_coro(engine.download_async(request))
        return engine.download(request)  # pragma: no cover - Scrapy < 2.14

    prober = Prober(pconfig, send_probe, crawler.stats, measured=links.samples, node=node)
    return PlacementHook(agent, prober)
