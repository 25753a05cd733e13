"""A multi-topic spider for the local web farm (``scrapy_banker.testing.farm``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor


class FarmSpider(scrapy.Spider):
    """Crawl every farm host from its root page, following in-farm links.

    Arguments (``-a name=value``): ``port`` (required, the farm's port),
    ``hosts`` (how many hosts to start from, default 20), ``domain``
    (default ``farm.test``).
    """

    name = "farm"

    def __init__(
        self, port: str | None = None, hosts: str = "20", domain: str = "farm.test", **kw: Any
    ):
        super().__init__(**kw)
        if port is None or not port.isdigit():
            raise ValueError(f"FarmSpider needs -a port=<farm port>, got port={port!r}")
        self.port = int(port)
        self.hosts = int(hosts)
        self.domain = domain
        # allow_domains would not match: Scrapy compares it with host:port.
        host_re = rf"^https?://[a-z0-9-]+\.{re.escape(domain)}(:\d+)?/"
        self.links = LinkExtractor(allow=[host_re], unique=True)

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for i in range(self.hosts):
            yield scrapy.Request(f"http://h{i:04d}.{self.domain}:{self.port}/")

    def parse(self, response: Response) -> Iterator[Any]:
        path = urlsplit(response.url).path
        yield {
            "url": response.url,
            "topic": response.meta.get("banker_topic"),
            "status": response.status,
            "bytes": len(response.body),
            "kind": "index" if path.endswith("/") else "page",
        }
        for link in self.links.extract_links(response):
            yield response.follow(link.url, callback=self.parse)
