"""A memo of request URLs already seen, in front of Scrapy's dupefilter.

Why: a crawl of real sites yields far more links than pages -- the same
navigation links on every page (a documentation site: ~90 links per page,
95 % of them already seen).  Scrapy's ``RFPDupeFilter`` answers each with a
fingerprint: the URL canonicalized (``w3lib.url.canonicalize_url``), JSON,
SHA-1 -- about a tenth of a ``CrawlSpider``'s CPU, spent mostly on links
that are exact repeats of a URL string already answered.

For Scrapy's own ``RFPDupeFilter`` with Scrapy's own ``RequestFingerprinter``
the fingerprint of a ``GET`` without a body is a function of the URL string
alone (``verbatim_url`` aside), so a URL string that was answered once has
the same answer forever after: it is in the dupefilter.  This memo keeps the
most recent such strings (bounded, oldest dropped first) and answers a
repeat without fingerprinting it; everything else -- another method, a body,
``verbatim_url``, another dupefilter or fingerprinter, a subclass of either
-- goes straight to the dupefilter.  The dupefilter stays the authority:
the memo only holds strings whose fingerprint the dupefilter already has,
and a duplicate is still logged and counted by it (``dupefilter/filtered``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.request import RequestFingerprinter

from scrapy_banker.core.meta import existing_meta

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.dupefilters import BaseDupeFilter

__all__ = ["MEMO_SIZE", "SeenURLs", "URLMemo", "fingerprints_by_url"]

#: URL strings remembered; at ~100 bytes a URL, about 10 MB.
MEMO_SIZE = 1 << 17


class URLMemo:
    """URL strings of known duplicates, bounded (the oldest dropped first).

    Only where the fingerprint of a ``GET`` without a body is a function of
    the URL string alone (``enabled``, see the module's docstring):
    :meth:`key` is None for every other request, which the caller then
    fingerprints as usual.
    """

    def __init__(self, enabled: bool, size: int = MEMO_SIZE) -> None:
        self.enabled = enabled
        self.size = size
        #: Insertion-ordered: the first key is the oldest.
        self._urls: dict[str, None] = {}
        self.hits = 0

    def key(self, request: Request) -> str | None:
        if not self.enabled or request.method != "GET" or request.body:
            return None
        meta = existing_meta(request)
        if meta and meta.get("verbatim_url"):
            return None
        return request.url

    def __len__(self) -> int:
        return len(self._urls)

    def known(self, key: str) -> bool:
        """Is ``key`` a known duplicate?  (Counted in :attr:`hits` when it is.)"""
        if key in self._urls:
            self.hits += 1
            return True
        return False

    def add(self, key: str) -> None:
        urls = self._urls
        if key in urls:
            return
        if len(urls) >= self.size:
            del urls[next(iter(urls))]
        urls[key] = None


class SeenURLs:
    """``is_duplicate(request)`` for a dupefilter, answering exact repeats from memory."""

    def __init__(self, dupefilter: BaseDupeFilter, size: int = MEMO_SIZE) -> None:
        self.df = dupefilter
        self.memo = URLMemo(_fingerprints_by_url(dupefilter), size)

    def is_duplicate(self, request: Request, spider: Spider | None) -> bool:
        """Scrapy's dupefilter check (``request_seen``, then ``log``), with the memo first."""
        if request.dont_filter:
            return False
        memo = self.memo
        key = memo.key(request)
        if key is not None and memo.known(key):
            self.df.log(request, spider)  # type: ignore[arg-type]
            return True
        seen = self.df.request_seen(request)
        if key is not None:
            memo.add(key)
        if seen:
            self.df.log(request, spider)  # type: ignore[arg-type]
        return bool(seen)


def _fingerprints_by_url(dupefilter: BaseDupeFilter) -> bool:
    """Whether ``dupefilter`` is Scrapy's own, fingerprinting with Scrapy's own function."""
    if type(dupefilter) is not RFPDupeFilter:
        return False
    if getattr(dupefilter, "_legacy_fingerprint", False):
        return False
    return fingerprints_by_url(getattr(dupefilter, "fingerprinter", None))


def fingerprints_by_url(fingerprinter: object) -> bool:
    """Whether ``fingerprinter`` is Scrapy's own (a ``GET``'s fingerprint is its URL's)."""
    return type(fingerprinter) is RequestFingerprinter
