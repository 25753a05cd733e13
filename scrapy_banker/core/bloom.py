"""Bloom filter geometry and hashing for the fleet's seen set (pure).

The Redis frontier keeps a crawl's seen set as bit arrays that ``enqueue.lua``
sets and tests; this module is the arithmetic both sides agree on -- sizes,
hash counts, the bit positions of a fingerprint, the shard that holds it and
the layers a filter grows by -- so that it can be tested without Redis and
used by the settings' start-up checks without importing redis-py.
"""

from __future__ import annotations

import hashlib
import math

__all__ = [
    "MAX_BLOOM_BITS",
    "SHARD_BITS",
    "bloom_geometry",
    "bloom_hashes",
    "bloom_layers",
    "bloom_positions",
    "bloom_shard",
    "bloom_shard_count",
]

#: A Redis string holds 512 MB: ``SETBIT`` offsets stop at 2**32 - 1.
MAX_BLOOM_BITS = 2**32
#: Bits per shard of a crawl-wide filter: a quarter of what a string holds,
#: so the layers a crawl past its capacity appends still fit.
SHARD_BITS = 2**30


def bloom_geometry(capacity: int, error: float) -> tuple[int, int]:
    """Bits ``m`` and hash count ``k`` of a Bloom filter for ``capacity`` items at ``error``.

    The textbook optimum: ``m = ceil(-n ln p / ln(2)**2)``, ``k = round(m / n * ln 2)``
    -- about ``1.44 * log2(1/p)`` bits per item (1.8 bytes at 0.1 %).
    """
    if capacity < 1 or not 0.0 < error < 0.5:
        raise ValueError(f"need capacity >= 1 and 0 < error < 0.5, got {capacity}, {error}")
    bits = math.ceil(-capacity * math.log(error) / math.log(2) ** 2)
    return bits, max(1, round(bits / capacity * math.log(2)))


def bloom_hashes(fingerprint: str) -> tuple[int, int]:
    """Two 32-bit base hashes of a fingerprint, for Kirsch-Mitzenmacher double hashing.

    Scrapy's fingerprints are SHA1 already (40 hex digits): their first two
    32-bit words are as good as any hash of them.  Anything else (a custom
    fingerprinter) is hashed with SHA1 first.
    """
    head = fingerprint[:16]
    if len(head) == 16 and all(c in "0123456789abcdefABCDEF" for c in head):
        return int(head[:8], 16), int(head[8:], 16)
    digest = hashlib.sha1(fingerprint.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big"), int.from_bytes(digest[4:8], "big")


def bloom_shard(fingerprint: str, shards: int) -> int:
    """Which shard of a crawl-wide filter holds ``fingerprint``.

    From the fingerprint's third 32-bit word: the first two place its bits
    (:func:`bloom_hashes`), and a shard picked by ``h1`` would see only some
    residues of ``h1`` -- fewer reachable bits, more false positives.
    """
    if shards <= 1:
        return 0
    word = fingerprint[16:24]
    if len(word) == 8 and all(c in "0123456789abcdefABCDEF" for c in word):
        return int(word, 16) % shards
    digest = hashlib.sha1(fingerprint.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:12], "big") % shards


def bloom_shard_count(capacity: int, error: float, shard_bits: int = SHARD_BITS) -> int:
    """Shards of a crawl-wide filter: strings of at most ``shard_bits`` (128 MB) each."""
    bits, _ = bloom_geometry(capacity, error)
    return max(1, -(-bits // shard_bits))


def bloom_positions(fingerprint: str, bits: int, hashes: int) -> list[int]:
    """The ``k`` bit offsets of a fingerprint: ``(h1 + i * h2) mod m``, as ``enqueue.lua`` sets.

    Lua numbers are doubles: with 32-bit ``h1``/``h2`` and ``i < 64`` every
    intermediate stays below 2**38, exact in both languages.
    """
    h1, h2 = bloom_hashes(fingerprint)
    return [(h1 + i * h2) % bits for i in range(hashes)]


def bloom_layers(bits: int, hashes: int, layers: int) -> list[tuple[int, int, int]]:
    """``(offset, bits, hashes)`` of each layer of a scalable bit-array filter, as ``enqueue.lua``.

    Layer ``j`` holds twice the items of layer ``j - 1`` at half its error:
    ``k + j`` hashes over ``ceil(m * 2**j * (k + j) / k)`` bits, the layers
    laid end to end in one string (one key: one cluster slot).
    """
    out: list[tuple[int, int, int]] = []
    offset = 0
    for j in range(layers):
        size = -(-(bits * 2**j * (hashes + j)) // hashes)
        out.append((offset, size, hashes + j))
        offset += size
    return out
