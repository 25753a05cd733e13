"""The spider classes users write, run against a small static site: the matrix's parts.

``tests/test_spiders.py`` crawls this site with every spider class Scrapy and
scrapy-redis ship, in every mode scrapy-banker offers (memory, JOBDIR with a
clean stop or a ``kill -9`` and a resume, a Redis fleet).  This module holds
what both the test and its crawler processes need:

* :func:`write_site` -- one small site per spider (HTML pages with relative
  links and a dead link, ``robots.txt`` naming a sitemap index, two
  sitemaps, an RSS feed, a CSV feed, targets for ``FormRequest`` and
  ``JsonRequest``), served by the web farm's static host kind;
* :func:`expected_urls` -- what a complete crawl of each spider fetches;
* the spiders, each using what its class is for: private, name-mangled and
  mixin callbacks, ``async def`` callbacks and async generators, errbacks,
  ``cb_kwargs``, ``follow_all``, nested ``meta``, ``dont_filter``, priorities,
  CrawlSpider rules with ``process_links`` / ``process_request`` /
  ``errback``, SitemapSpider's robots.txt -> index -> sitemaps, feed spiders;
* :func:`main` -- ``python tests/spider_matrix.py SPEC.json`` runs several
  of them at once in one ``CrawlerProcess`` (one process per mode keeps the
  matrix cheap), writes each callback's call as a JSON line (flushed, so a
  ``kill -9`` keeps them) and each crawler's final stats; with
  ``kill_after`` it SIGKILLs itself once every crawler has that many
  responses.

Every callback records ``{"url", "callback", "ok"}``: ``ok`` is False when
what the request carried (``cb_kwargs``, nested ``meta``, the rule's tag)
did not come back intact.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import FormRequest, JsonRequest, Request, Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, CSVFeedSpider, Rule, SitemapSpider, XMLFeedSpider
from scrapy_redis.spiders import RedisCrawlSpider, RedisSpider

PAGES = 12
SECTIONS = 3
NESTED = {"a": [1, {"b": None, "c": "d"}], "e": {"f": 2.5}}
RULE_KWARGS = {"kind": "page"}


def host_of(spider: str) -> str:
    return f"{spider}.farm.test"


def write_site(root: Path, host: str, port: int) -> None:
    """The site of one spider under ``root`` (absolute URLs where formats need them)."""
    base = f"http://{host}:{port}"
    pages = [f"/page/{n}.html" for n in range(PAGES)]
    files: dict[str, str] = {
        "index.html": "<html><body>"
        + "".join(f'<a href="section/{k}/">section {k}</a>' for k in range(SECTIONS))
        + '<a href="missing.html">gone</a></body></html>',
        "robots.txt": f"User-agent: *\nDisallow:\nSitemap: {base}/sitemap_index.xml\n",
        "sitemap_index.xml": '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<sitemap><loc>{base}/sitemap-a.xml</loc></sitemap>"
        f"<sitemap><loc>{base}/sitemap-b.xml</loc></sitemap></sitemapindex>\n",
        "feed.xml": '<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0"><channel>'
        + "".join(f"<item><title>{p}</title><link>{base}{p}</link></item>" for p in pages)
        + "</channel></rss>\n",
        "feed.csv": "id,url\n" + "".join(f"{n},{base}{p}\n" for n, p in enumerate(pages)),
        "form": "<html><body>form received</body></html>",
        "api.json": '{"ok": true}',
    }
    half = PAGES // 2
    for name, chunk in (("sitemap-a.xml", pages[:half]), ("sitemap-b.xml", pages[half:])):
        files[name] = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<url><loc>{base}{p}</loc></url>" for p in chunk)
            + "</urlset>\n"
        )
    for k in range(SECTIONS):
        own = [n for n in range(PAGES) if n % SECTIONS == k]
        links = "".join(f'<a href="../../page/{n}.html">page {n}</a>' for n in own)
        nxt = f'<a href="../{(k + 1) % SECTIONS}/">next</a>'
        files[f"section/{k}/index.html"] = f"<html><body>{links}{nxt}</body></html>"
    for n in range(PAGES):
        # A chain deeper than the sections: page n links to page n+1 and back up.
        links = (
            f'<a href="{(n + 1) % PAGES}.html">next</a><a href="../section/{n % SECTIONS}/">up</a>'
        )
        files[f"page/{n}.html"] = f"<html><body><p>page {n}</p>{links}</body></html>"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")


def _html_urls(base: str) -> set[str]:
    return (
        {f"{base}/", f"{base}/missing.html"}
        | {f"{base}/section/{k}/" for k in range(SECTIONS)}
        | {f"{base}/page/{n}.html" for n in range(PAGES)}
    )


def expected_urls(spider: str, port: int) -> set[str]:
    """Every URL a complete crawl by ``spider`` fetches (errors included)."""
    base = f"http://{host_of(spider)}:{port}"
    pages = {f"{base}/page/{n}.html" for n in range(PAGES)}
    if spider in ("plain", "redisplain"):
        extra = {f"{base}/form", f"{base}/api.json"} if spider == "plain" else set()
        return _html_urls(base) | extra
    if spider in ("rules", "redisrules"):
        return _html_urls(base)
    if spider == "sitemap":
        files = ("robots.txt", "sitemap_index.xml", "sitemap-a.xml", "sitemap-b.xml")
        return pages | {f"{base}/{f}" for f in files}
    if spider == "xmlfeed":
        return pages | {f"{base}/feed.xml"}
    if spider == "csvfeed":
        return pages | {f"{base}/feed.csv"}
    raise KeyError(spider)


def expected_callbacks(spider: str) -> set[str]:
    """Callback names every complete crawl by ``spider`` records at least once."""
    return {
        "plain": {"parse", "parse_section", "_parse_page", "parse_from_mixin", "on_error",
                  "parse_form", "__parse_json", "parse_again"},
        "rules": {"parse_start_url", "parse_item", "on_error"},
        "redisrules": {"parse_start_url", "parse_item", "on_error"},
        "redisplain": {"parse", "parse_section", "on_error"},
        "sitemap": {"parse_page"},
        "xmlfeed": {"parse_node", "parse_page"},
        "csvfeed": {"parse_row", "parse_page"},
    }[spider]  # fmt: skip


# -- the spiders -----------------------------------------------------------------------


class Recording:
    """What every spider of the matrix shares: where it is, and a record per callback."""

    name: str
    port: int

    @property
    def base(self) -> str:
        return f"http://{host_of(self.name)}:{self.port}"

    def record(self, url: str, callback: str, ok: bool = True) -> dict[str, Any]:
        return {"url": url, "callback": callback, "ok": bool(ok)}

    def on_error(self, failure: Any) -> Iterator[dict[str, Any]]:
        yield self.record(failure.request.url, "on_error")


class FromMixin:
    """A callback that lives in a mixin, as in many real projects."""

    def parse_from_mixin(self, response: Response, via: str) -> Iterator[Any]:
        assert isinstance(self, PlainSpider)
        yield self.record(response.url, "parse_from_mixin", via == "page")
        yield from response.follow_all(css="a", callback=self._parse_page)


class PlainSpider(FromMixin, Recording, scrapy.Spider):
    name = "plain"
    custom_settings = {"DEPTH_PRIORITY": 1}

    async def start(self) -> AsyncIterator[Request]:
        yield Request(f"{self.base}/", callback=self.parse, meta={"nested": NESTED}, priority=5)
        yield FormRequest(f"{self.base}/form", formdata={"q": "banker"}, callback=self.parse_form)
        yield JsonRequest(f"{self.base}/api.json", data={"x": [1, 2]}, callback=self.__parse_json)

    def parse(self, response: Response) -> Iterator[Any]:
        yield self.record(response.url, "parse", response.meta.get("nested") == NESTED)
        yield from response.follow_all(
            css="a", callback=self.parse_section, errback=self.on_error,
            cb_kwargs={"via": "root"}, meta={"nested": NESTED}, priority=2,
        )  # fmt: skip
        yield response.request.replace(dont_filter=True, callback=self.parse_again, meta={})

    def parse_again(self, response: Response) -> Iterator[dict[str, Any]]:
        yield self.record(response.url, "parse_again")

    async def parse_section(self, response: Response, via: str) -> AsyncIterator[Any]:
        ok = via == "root" and response.meta.get("nested") == NESTED
        yield self.record(response.url, "parse_section", ok)
        for href in response.css("a::attr(href)").getall():
            if "/page/" in href and int(href.rsplit("/", 1)[1].split(".")[0]) % 2:
                yield response.follow(href, callback=self.parse_from_mixin, errback=self.on_error,
                                      cb_kwargs={"via": "page"})  # fmt: skip
            elif "/page/" in href:
                yield response.follow(href, callback=self._parse_page, errback=self.on_error)
            else:
                yield response.follow(
                    href, callback=self.parse_section, cb_kwargs={"via": "root"},
                    meta={"nested": NESTED},
                )  # fmt: skip

    async def _parse_page(self, response: Response) -> list[Any]:
        out: list[Any] = [self.record(response.url, "_parse_page")]
        for href in response.css("a::attr(href)").getall():
            if "/page/" in href:
                out.append(response.follow(href, callback=self.parse_from_mixin,
                                           cb_kwargs={"via": "page"}))  # fmt: skip
        return out

    def parse_form(self, response: Response) -> Iterator[dict[str, Any]]:
        yield self.record(response.url, "parse_form", response.request.method == "POST")

    def __parse_json(self, response: Response) -> Iterator[dict[str, Any]]:
        body = json.loads(response.request.body)
        yield self.record(response.url, "__parse_json", body == {"x": [1, 2]})


class _Rules(Recording):
    """The rules of both crawl spiders: sections followed and tagged, pages parsed."""

    rules = (
        Rule(LinkExtractor(allow=r"/section/"), follow=True,
             process_links="keep_links", process_request="tag"),
        Rule(LinkExtractor(allow=(r"/page/", r"/missing")), callback="parse_item",
             errback="on_error", follow=True, cb_kwargs=RULE_KWARGS),
    )  # fmt: skip

    def keep_links(self, links: list[Any]) -> list[Any]:
        return [link for link in links if "/section/" in link.url]

    def tag(self, request: Request, response: Response) -> Request:
        request.meta["tagged"] = response.url
        return request

    def parse_start_url(self, response: Response) -> Iterator[dict[str, Any]]:
        yield self.record(response.url, "parse_start_url")

    def parse_item(self, response: Response, kind: str) -> Iterator[dict[str, Any]]:
        yield self.record(response.url, "parse_item", kind == "page")


class RulesSpider(_Rules, CrawlSpider):
    name = "rules"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{self.base}/"]


class RedisRulesSpider(_Rules, RedisCrawlSpider):  # type: ignore[misc]
    name = "redisrules"
    redis_key = "redisrules:start_urls"


class RedisPlainSpider(Recording, RedisSpider):  # type: ignore[misc]
    name = "redisplain"
    redis_key = "redisplain:start_urls"

    def parse(self, response: Response) -> Iterator[Any]:
        yield self.record(response.url, "parse")
        yield from response.follow_all(
            css="a", callback=self.parse_section, errback=self.on_error, cb_kwargs={"n": 1}
        )

    def parse_section(self, response: Response, n: int) -> Iterator[Any]:
        yield self.record(response.url, "parse_section", n == 1)
        yield from response.follow_all(
            css="a", callback=self.parse_section, errback=self.on_error, cb_kwargs={"n": 1}
        )


class MapSpider(Recording, SitemapSpider):
    name = "sitemap"
    sitemap_rules = [("/page/", "parse_page")]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sitemap_urls = [f"{self.base}/robots.txt"]

    def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
        yield self.record(response.url, "parse_page")


class _FeedPages(Recording):
    def parse_page(self, response: Response, row: int) -> Iterator[dict[str, Any]]:
        yield self.record(response.url, "parse_page", row >= 0)


class FeedSpider(_FeedPages, XMLFeedSpider):
    name = "xmlfeed"
    iterator = "iternodes"
    itertag = "item"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{self.base}/feed.xml"]

    def parse_node(self, response: Response, node: Any) -> Iterator[Any]:
        url = node.xpath("link/text()").get()
        yield self.record(response.url, "parse_node", bool(url))
        yield Request(url, callback=self.parse_page, cb_kwargs={"row": 0})


class RowsSpider(_FeedPages, CSVFeedSpider):
    name = "csvfeed"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{self.base}/feed.csv"]

    def parse_row(self, response: Response, row: dict[str, str]) -> Iterator[Any]:
        yield self.record(response.url, "parse_row", "url" in row)
        yield Request(row["url"], callback=self.parse_page, cb_kwargs={"row": int(row["id"])})


_CLASSES: tuple[type[scrapy.Spider], ...] = (
    PlainSpider, RulesSpider, MapSpider, FeedSpider, RowsSpider, RedisPlainSpider,
    RedisRulesSpider,
)  # fmt: skip
SPIDERS: dict[str, type[scrapy.Spider]] = {cls.name: cls for cls in _CLASSES}
REDIS_SPIDERS = ("redisplain", "redisrules")


# -- the crawler process -----------------------------------------------------------------


class _KillSwitch:
    """SIGKILL this process once every crawler has ``after`` responses or has closed."""

    def __init__(self, names: Iterable[str], after: int) -> None:
        self.after = after
        self.left = set(names)
        self.counts: dict[str, int] = {}

    def response(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        if self.counts[name] >= self.after:
            self.done(name)

    def done(self, name: str) -> None:
        self.left.discard(name)
        if not self.left:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text("utf-8"))
    out = Path(spec["out"])
    process = CrawlerProcess(spec["settings"])
    kill = (
        None if spec.get("kill_after") is None else _KillSwitch(spec["spiders"], spec["kill_after"])
    )
    for name in spec["spiders"]:
        cls = SPIDERS[name]
        custom = {**(cls.custom_settings or {}), **spec.get("per_spider", {}).get(name, {})}
        crawler = process.create_crawler(type(cls.__name__, (cls,), {"custom_settings": custom}))
        _connect(crawler, name, out, kill)
        process.crawl(crawler, port=spec["port"])
    process.start()
    return 0


_HANDLERS: list[Any] = []


def _connect(crawler: Any, name: str, out: Path, kill: _KillSwitch | None) -> None:
    records = open(out / f"{name}.records.jsonl", "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def scraped(item: Any, response: Response, spider: scrapy.Spider) -> None:
        records.write(json.dumps(dict(item)) + "\n")

    def received(response: Response, request: Request, spider: scrapy.Spider) -> None:
        if kill is not None:
            kill.response(name)

    def closed(spider: scrapy.Spider, reason: str) -> None:
        stats = {k: v if isinstance(v, (int, float, str)) else str(v)
                 for k, v in crawler.stats.get_stats().items()}  # fmt: skip
        stats["finish_reason"] = reason
        (out / f"{name}.stats.json").write_text(json.dumps(stats, sort_keys=True), "utf-8")
        records.close()
        if kill is not None:
            kill.done(name)

    _HANDLERS.extend((scraped, received, closed))  # signals hold weak references
    crawler.signals.connect(scraped, signal=signals.item_scraped)
    crawler.signals.connect(received, signal=signals.response_received)
    crawler.signals.connect(closed, signal=signals.spider_closed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
