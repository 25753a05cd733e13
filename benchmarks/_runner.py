"""The benchmarks' crawler process: ``python benchmarks/_runner.py SPEC.json``.

Every crawl runs in a process of its own, because a Twisted reactor cannot
be restarted and because the peers must not share an interpreter (warm
caches, leftover state).  The spec (written by ``_harness.crawl_spec``):

* ``spider``: the spider class, ``module:Class`` (this folder is on
  ``sys.path``, so ``_crawler:DeadlockSpider`` works), and ``spider_kwargs``;
* ``settings``: the crawl's Scrapy settings, complete (nothing is added);
  extensions are named by import path (``_crawler.TopicSampler``);
* ``profile`` (optional): run the crawl under cProfile and print the
  profile to stderr; ``profile_out`` (optional): also save it there
  (``pstats`` format, for ``snakeviz`` or a diff of two runs).

The last stdout line is JSON: ``{"stats": ...}``, the crawl's final stats
(values that are not numbers, strings or booleans as strings) plus
``run/cpu_s`` (this process's CPU seconds when the spider closed),
``run/started_at`` / ``run/closed_at`` (wall clock) and ``finish_reason``.
"""

from __future__ import annotations

import json
import sys
import time
from importlib import import_module
from pathlib import Path
from typing import Any

from _harness import self_cpu_s
from scrapy import signals
from scrapy.crawler import CrawlerProcess


def load(path: str) -> Any:
    """``module:Name`` (or ``module.Name``) -> the object."""
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    return getattr(import_module(module), name)


def _plain(value: Any) -> Any:
    """A stat as JSON: numbers, strings, booleans and None as they are, the rest as text."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: _runner.py SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    process = CrawlerProcess(spec["settings"])
    crawler = process.create_crawler(load(spec["spider"]))
    closed: dict[str, Any] = {"run/started_at": time.time()}

    def spider_closed(spider: Any, reason: str) -> None:
        closed.update({"run/cpu_s": round(self_cpu_s(), 3), "run/closed_at": time.time(),
                       "finish_reason": reason})  # fmt: skip

    crawler.signals.connect(spider_closed, signal=signals.spider_closed)
    process.crawl(crawler, **spec.get("spider_kwargs", {}))
    if spec.get("profile"):
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        process.start()
        profile.disable()
        if spec.get("profile_out"):
            profile.dump_stats(spec["profile_out"])
        out = pstats.Stats(profile, stream=sys.stderr)
        out.sort_stats("tottime").print_stats(30)
        out.sort_stats("cumulative").print_stats("scrapy_banker|scheduler|pqueues|dupefilter", 40)
    else:
        process.start()
    assert crawler.stats is not None
    stats = {k: _plain(v) for k, v in crawler.stats.get_stats().items()}
    print(json.dumps({"stats": {**stats, **closed}}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
