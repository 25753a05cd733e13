"""How many pages per second can the web farm serve?

Every crawl benchmark runs against the farm, so the farm must be much faster
than the crawlers it serves (target: > 1,500 pages/s on a 2-core machine);
otherwise scheduler comparisons would measure the farm.  This script starts
a zero-latency :class:`~scrapy_banker.testing.farm.WebFarm` and drives it
from a *separate* process (the same script in ``--loadgen`` mode) with an
asyncio keep-alive load generator: ``C`` persistent HTTP/1.1 connections,
one outstanding request each (as Scrapy does), cycling through the farm's
URLs with their ``Host`` headers.  Only 200 responses completed inside the
measured window count.

Usage::

    python benchmarks/webfarm_throughput.py [--quick | --tiny] [--seconds N] [--connections C]

(``--tiny``: a 1-second smoke test on 20 hosts.)

The last stdout line is a JSON object:
``{"pages_per_s": ..., "connections": C, "seconds": ..., "errors": n, ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import random
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import _common
import _harness

from scrapy_banker.testing.farm import FarmConfig, FarmModel, WebFarm

logger = logging.getLogger(__name__)

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Mode:
    """Measured window, warm-up (s) and farm size of one mode."""

    seconds: float
    warmup: float
    hosts: int = 200
    pages: int = 20000


FULL = Mode(seconds=15.0, warmup=2.0)
QUICK = Mode(seconds=5.0, warmup=1.0)
TINY = Mode(seconds=1.0, warmup=0.3, hosts=20, pages=1000)


class _Counters:
    """Shared by all connections of the load generator (single-threaded asyncio)."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.stop = False


def _requests(config: FarmConfig, port: int, seed: int) -> list[bytes]:
    """Pre-encoded GETs for every farm URL, shuffled so hosts interleave."""
    model = FarmModel(config)
    out = [
        f"GET {path} HTTP/1.1\r\nHost: {model.host_name(i)}:{port}\r\n"
        f"User-Agent: webfarm-bench\r\n\r\n".encode()
        for i in range(model.hosts)
        for path in model.paths(i)
    ]
    random.Random(seed).shuffle(out)
    return out


async def _connection(
    port: int, requests: list[bytes], offset: int, step: int, counters: _Counters
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = len(requests)
    k = offset
    try:
        while not counters.stop:
            writer.write(requests[k % n])
            k += step
            head = await reader.readuntil(b"\r\n\r\n")
            match = _CONTENT_LENGTH.search(head)
            if match is None:
                raise ConnectionError(f"response without Content-Length: {head[:80]!r}")
            await reader.readexactly(int(match.group(1)))
            if head.startswith(b"HTTP/1.1 200 "):
                counters.ok += 1
            else:
                counters.errors += 1
    finally:
        writer.close()


async def _drive(
    port: int, requests: list[bytes], connections: int, warmup: float, seconds: float
) -> dict[str, Any]:
    counters = _Counters()
    tasks = [
        asyncio.create_task(_connection(port, requests, c, connections, counters))
        for c in range(connections)
    ]
    await asyncio.sleep(warmup)
    ok0, err0, t0 = counters.ok, counters.errors, time.perf_counter()
    cpu0 = time.process_time()
    await asyncio.sleep(seconds)
    ok1, err1, t1 = counters.ok, counters.errors, time.perf_counter()
    cpu1 = time.process_time()
    counters.stop = True
    done = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [repr(r) for r in done if isinstance(r, BaseException)]
    elapsed = t1 - t0
    return {
        "ok": ok1 - ok0,
        "errors": (err1 - err0) + len(failures),
        "elapsed": elapsed,
        "loadgen_cpu": (cpu1 - cpu0) / elapsed,
        "failures": failures[:3],
    }


def _loadgen(args: argparse.Namespace) -> int:
    config = FarmConfig.from_json(args.config_json)
    requests = _requests(config, args.port, seed=1)
    result = asyncio.run(_drive(args.port, requests, args.connections, args.warmup, args.seconds))
    print(json.dumps(result), flush=True)
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _harness.parser(__doc__, quick="short run (<= 15 s in total)", tiny="")
    parser.add_argument("--seconds", type=float, default=None, help="measured window")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--hosts", type=int, default=None, help="farm hosts (200)")
    parser.add_argument("--pages", type=int, default=None, help="total content pages (20,000)")
    parser.add_argument("--warmup", type=float, default=None)
    # Internal: the load-generator child.
    parser.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--config-json", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    mode = _harness.override(
        _harness.pick(args, full=FULL, quick=QUICK, tiny=TINY), args,
        seconds="seconds", warmup="warmup", hosts="hosts", pages="pages",
    )  # fmt: skip
    return argparse.Namespace(**{**vars(args), **dataclasses.asdict(mode)})


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.loadgen:
        return _loadgen(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    config = FarmConfig(hosts=args.hosts, total_pages=args.pages, latency_ms=0.0)
    with WebFarm(config) as farm:
        cmd = [
            __file__,
            "--loadgen",
            "--port",
            str(farm.port),
            "--config-json",
            config.to_json(),
            "--connections",
            str(args.connections),
            "--seconds",
            str(args.seconds),
            "--warmup",
            str(args.warmup),
        ]
        logger.info(
            "farm: %d hosts, %d urls on port %d; %d connections for %.1f s (+%.1f s warm-up)",
            config.hosts,
            farm.model.n_urls(),
            farm.port,
            args.connections,
            args.seconds,
            args.warmup,
        )
        child = _harness.run_json(
            cmd, what="the load generator", timeout=args.seconds + args.warmup + 120
        )
        server = farm.stats()
    result = {
        "pages_per_s": round(child["ok"] / child["elapsed"], 1),
        "connections": args.connections,
        "seconds": round(child["elapsed"], 3),
        "errors": child["errors"],
        "hosts": config.hosts,
        "server_requests": server["requests"],
        "loadgen_cpu": round(child["loadgen_cpu"], 2),
    }
    if child["failures"]:
        logger.info("load generator failures: %s", child["failures"])
    print(f"{result['pages_per_s']:,.0f} pages/s over {result['seconds']:.1f} s, "
          f"{result['errors']} errors")  # fmt: skip
    _common.emit_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
