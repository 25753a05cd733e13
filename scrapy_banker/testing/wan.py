"""WAN emulation helper: tell the web farm which crawler node is asking.

The farm (:mod:`scrapy_banker.testing.farm`) delays each response by the
RTT between the requesting node and the site's host, taken from a real RTT
matrix (``FarmConfig.rtt_matrix``, ``node_rows``, ``host_columns``).  It can
only do that if the request says which node sent it; this downloader
middleware adds ``X-Banker-Node: <BANKER_REDIS_NODE_ID>`` to every request.
For tests and benchmarks only: never enable it against real sites.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured

from scrapy_banker.testing.farm.model import NODE_HEADER

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

__all__ = ["NodeHeaderMiddleware"]


class NodeHeaderMiddleware:
    def __init__(self, node: str) -> None:
        self.node = node

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> NodeHeaderMiddleware:
        node = crawler.settings.get("BANKER_REDIS_NODE_ID")
        if not node:
            raise NotConfigured("NodeHeaderMiddleware needs BANKER_REDIS_NODE_ID")
        return cls(str(node))

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        request.headers[NODE_HEADER] = self.node
