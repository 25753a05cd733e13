"""Start the local web farm, crawl it with ``scrapy crawl farm``, print a summary.

The crawl also records its time series (``BANKER_TIMESERIES_FILE``), which
``scrapy banker plot`` then draws as PNG charts; the demo prints where they are.

Run from anywhere: ``python example_project/run_demo.py [--hosts N] [--pages N] [--out DIR]``.
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

from scrapy_banker.testing.farm import FarmConfig, WebFarm

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--pages", type=int, default=3000, help="total pages on the farm")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--out",
        help="directory for the time-series record and the plots (default: a new temporary one)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="banker-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    timeseries = out / "timeseries.jsonl"
    timeseries.unlink(missing_ok=True)  # the extension appends; a rerun starts afresh
    plots = out / "plots"

    config = FarmConfig(
        seed=args.seed, hosts=args.hosts, total_pages=args.pages, latency_ms=args.latency_ms
    )
    with WebFarm(config) as farm, tempfile.TemporaryDirectory() as tmp:
        stats_file = os.path.join(tmp, "stats.json")
        cmd = [
            sys.executable, "-m", "scrapy", "crawl", "farm",
            "-a", f"port={farm.port}", "-a", f"hosts={args.hosts}",
            "-s", f"BANKER_STATS_FILE={stats_file}",
            "-s", f"BANKER_TIMESERIES_FILE={timeseries}",
            # A demo crawl lasts seconds: sample often enough to draw curves.
            "-s", "BANKER_TIMESERIES_INTERVAL=0.25",
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

    print()
    plot_cmd = [sys.executable, "-m", "scrapy", "banker", "plot", str(timeseries), "-o", str(plots)]
    print("running:", " ".join(plot_cmd[2:]), flush=True)
    plotted = subprocess.run(plot_cmd, cwd=HERE, stdout=subprocess.PIPE, text=True)
    written = plotted.stdout.splitlines()
    if plotted.returncode != 0 or not written:
        print(f"scrapy banker plot failed (exit code {plotted.returncode})", file=sys.stderr)
        return plotted.returncode or 1
    print(f"  time series     {timeseries}")
    print("  plots           " + "\n                  ".join(written))
    print("  live dashboard  of a fleet (docs/tutorial.rst): in example_project/, "
          "scrapy banker dashboard farm -s REDIS_URL=redis://...")  # fmt: skip
    print("                  then open http://127.0.0.1:8765/")
    return 0 if pages == expected else 2


if __name__ == "__main__":
    sys.exit(main())
