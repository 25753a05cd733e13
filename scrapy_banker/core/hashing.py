"""Queue keys: BKDR string hashing, SURT and the key policies built on them.

The BKDR paper's point is that the *key* a URL is queued under decides how
many queues can be active at once: Heritrix's host key puts a portal's whole
site behind one thread.  Here the key policy picks what is hashed (host, SURT
authority, registered domain or the full URL) and BKDR turns it into the
integer the extendible-hash directory indexes.  Pure functions, no Scrapy.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import mmh3

__all__ = [
    "BKDR_SEED",
    "KEY_POLICIES",
    "bkdr",
    "host_of",
    "key_policy",
    "murmur",
    "registered_domain",
    "surt",
    "surt_authority",
]

#: The seed used by the paper (and the classic BKDRHash): 131.
BKDR_SEED = 131
_MASK32 = 0xFFFFFFFF


def bkdr(text: str | bytes, seed: int = BKDR_SEED) -> int:
    """Classic BKDRHash: ``h = h * seed + byte`` over the UTF-8 bytes, 31-bit result.

    Matches the reference C implementation (``unsigned int`` arithmetic, final
    ``& 0x7FFFFFFF``), so keys are identical across languages and processes --
    unlike Python's ``hash()``, which is salted per process.
    """
    if seed <= 0:
        raise ValueError(f"BKDR seed must be a positive integer, got {seed!r}")
    data = text.encode("utf-8") if isinstance(text, str) else text
    h = 0
    for byte in data:
        h = (h * seed + byte) & _MASK32
    return h & 0x7FFFFFFF


def murmur(text: str | bytes, seed: int = 0) -> int:
    """32-bit unsigned MurmurHash3, for partitioning where avalanche matters."""
    return int(mmh3.hash(text, seed, signed=False))


_SIMPLE_NETLOC = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:")


def host_of(url: str) -> str:
    """Lower-cased host name of ``url`` (no port, no credentials), as ``urlsplit`` gives it.

    The scheduler needs the host of every request it queues; ``urlsplit``
    costs more than the rest of an enqueue.  Plain ``scheme://host[:port]/...``
    URLs -- nearly all of them -- are cut by hand; anything unusual
    (credentials, IPv6 brackets, escapes, whitespace) goes through ``urlsplit``,
    so the result is always the same as ``urlsplit(url).hostname``.
    """
    sep = url.find("://")
    if sep > 0:
        start = sep + 3
        end = len(url)
        for ch in "/?#":
            i = url.find(ch, start)
            if i != -1 and i < end:
                end = i
        netloc = url[start:end]
        if netloc and url[:sep].isalnum() and _SIMPLE_NETLOC.issuperset(netloc):
            host = netloc.split(":", 1)[0]
            if host:
                return host.lower()
    return (urlsplit(url).hostname or "").lower()


def surt(url: str, *, with_scheme: bool = True) -> str:
    """Sort-friendly URI Reordering Transform, as Heritrix writes it.

    ``http://www.baidu.com`` → ``http://(com,baidu,www,)/``;
    ``https://u@a.b.example.org:8080/p?q`` →
    ``https://(org,example,b,a,:8080@u)/p?q``.  Host labels are reversed so
    that every URL of a domain shares a prefix: sorting or prefix-matching SURTs
    groups a site's pages.  The fragment is dropped (never sent to a server).
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    labels = host.split(".") if host else []
    if labels and all(label.isdigit() for label in labels):
        authority = host + ","  # an IPv4 address is not reversed
    else:
        authority = ",".join(reversed(labels)) + ","
    if parts.port is not None:
        authority += f":{parts.port}"
    if parts.username:
        authority += f"@{parts.username}"
    path = parts.path or "/"
    query = f"?{parts.query}" if parts.query else ""
    body = f"({authority}){path}{query}"
    return f"{parts.scheme.lower()}://{body}" if with_scheme else body


def surt_authority(url: str) -> str:
    """The SURT host part only: ``http://(com,example,www,)``."""
    return surt(url).split(")", 1)[0] + ")"


# Public suffixes of two labels that are common enough to matter for queue
# grouping.  A full public-suffix list would be more exact; the cost of a miss
# is only that e.g. ``a.foo.co.xx`` and ``b.foo.co.xx`` share a queue key.
_TWO_LABEL_SUFFIXES = frozenset(
    {
        "co.uk", "org.uk", "ac.uk", "gov.uk", "com.au", "net.au", "org.au", "co.jp",
        "ne.jp", "or.jp", "com.cn", "net.cn", "org.cn", "gov.cn", "edu.cn", "com.br",
        "com.tw", "com.hk", "co.in", "co.kr", "co.nz", "com.mx", "com.sg", "co.za",
    }
)  # fmt: skip


def registered_domain(url: str) -> str:
    """``www.news.bbc.co.uk`` → ``bbc.co.uk``: the domain a site registered."""
    host = host_of(url).rstrip(".")
    labels = host.split(".")
    if len(labels) <= 2 or all(label.isdigit() for label in labels):
        return host
    n = 3 if ".".join(labels[-2:]) in _TWO_LABEL_SUFFIXES else 2
    return ".".join(labels[-n:])


KeyFunction = Callable[[str], str]

#: Name (the value of the queue-key setting) → what part of the URL is hashed.
KEY_POLICIES: dict[str, KeyFunction] = {
    "host": host_of,
    "surt": surt_authority,
    "domain": registered_domain,
    "url": lambda url: url,
}


def key_policy(name: str) -> KeyFunction:
    try:
        return KEY_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"Unknown queue key policy {name!r}; allowed: {sorted(KEY_POLICIES)}"
        ) from None
