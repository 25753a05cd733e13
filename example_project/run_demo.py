"""Start the local web farm, crawl it with ``scrapy crawl farm``, print a summary.

Run from anywhere: ``python example_project/run_demo.py [--hosts N] [--pages N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scrapy_banker.testing.webfarm import FarmConfig, WebFarm

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--pages", type=int, default=3000, help="total pages on the farm")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)

    config = FarmConfig(
        seed=args.seed, hosts=args.hosts, total_pages=args.pages, latency_ms=args.latency_ms
    )
    with WebFarm(config) as farm, tempfile.TemporaryDirectory() as tmp:
        stats_file = os.path.join(tmp, "stats.json")
        cmd = [
            sys.executable, "-m", "scrapy", "crawl", "farm",
            "-a", f"port={farm.port}", "-a", f"hosts={args.hosts}",
            "-s", f"BANKER_STATS_FILE={stats_file}",
            "-s", f"LOG_LEVEL={args.log_level}",
        ]  # fmt: skip
        print(f"web farm: {args.hosts} hosts, {args.pages} pages, port {farm.port}", flush=True)
        print("running:", " ".join(cmd[2:]), flush=True)
        started = time.monotonic()
        rc = subprocess.call(cmd, cwd=HERE)
        wall = time.monotonic() - started
        if rc != 0 or not os.path.exists(stats_file):
            print(f"scrapy crawl failed (exit code {rc})", file=sys.stderr)
            return rc or 1
        with open(stats_file, encoding="utf-8") as f:
            stats = json.load(f)
        expected = len(farm.expected_urls())

    pages = int(stats.get("response_received_count", 0))
    elapsed = float(stats.get("elapsed_time_seconds") or wall)
    topics = sorted(
        {k.split("/")[2] for k in stats if k.startswith("banker/topic/") and k.count("/") == 3}
    )
    print()
    print("scrapy-banker demo summary")
    print(f"  pages fetched   {pages} of {expected} on the farm")
    print(f"  elapsed         {elapsed:.1f} s")
    print(f"  pages/s         {pages / elapsed if elapsed else 0.0:.0f}")
    print(f"  items scraped   {stats.get('item_scraped_count', 0)}")
    print(f"  finish reason   {stats.get('finish_reason')}")
    print("  per topic       responses  bytes")
    for topic in topics:
        responses = stats.get(f"banker/topic/{topic}/responses", 0)
        nbytes = stats.get(f"banker/topic/{topic}/response_bytes", 0)
        print(f"    {topic:<13} {responses:>9}  {nbytes:>9}")
    return 0 if pages == expected else 2


if __name__ == "__main__":
    sys.exit(main())
