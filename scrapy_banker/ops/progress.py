"""``BankerProgress``: a live table on the terminal during ``scrapy crawl``.

With :setting:`BANKER_PROGRESS` set and standard output a terminal, a rich
``Live`` table shows, every :setting:`BANKER_TIMESERIES_INTERVAL` seconds,
each topic's pages, pages per second, queued and in-flight requests, the
totals and, on a fleet, this node's partitions, leases and Redis link.  Quiet
(not even enabled) when standard output is not a terminal: a pipe or a log
file gets no escape codes.  Scrapy's log goes to standard error; on the same
terminal its lines scroll above the table, which is redrawn at the next
interval (``LOG_FILE`` or ``-L WARNING`` keep the screen tidy).

rich is imported where the table is drawn, not with this module: the add-on
lists the extension in every crawl, and a crawl without the table should not
carry rich's objects, which every full collection of Python's cyclic garbage
collector scans.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from scrapy_banker.ops.timeseries import SamplingExtension
from scrapy_banker.settings import ops_config

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_banker.core.telemetry import Sample
    from scrapy_banker.settings import OpsConfig

logger = logging.getLogger(__name__)

__all__ = ["BankerProgress", "progress_view"]


def _rate(now: int, before: int | None, dt: float) -> str:
    if before is None or dt <= 0:
        return "-"
    return f"{max(0, now - before) / dt:.1f}"


def progress_view(sample: Sample, previous: Sample | None = None) -> RenderableType:
    """The table for one sample; pages/s from the previous one (``-`` for the first)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    dt = 0.0 if previous is None else sample.t - previous.t
    table = Table(title=f"scrapy-banker · {sample.node}", title_justify="left", expand=False)
    table.add_column("topic")
    for name in ("pages", "pages/s", "queued", "in flight", "slice s"):
        table.add_column(name, justify="right")
    for name, t in sorted(sample.topics.items()):
        before = None if previous is None or name not in previous.topics else previous.topics[name]
        table.add_row(
            name,
            str(t.pages),
            _rate(t.pages, None if before is None else before.pages, dt),
            str(t.queued),
            str(t.inflight),
            f"{t.slice_s:g}",
        )
    table.add_section()
    table.add_row(
        Text("total", style="bold"),
        str(sample.pages),
        _rate(sample.pages, None if previous is None else previous.pages, dt),
        str(sample.queued),
        str(sample.inflight),
        "",
    )
    lines: list[RenderableType] = [table]
    if sample.slots:
        busiest = ", ".join(f"{s.slot} {s.inflight}/{s.limit}" for s in sample.slots[:5])
        lines.append(Text(f"busiest slots: {busiest}"))
    if sample.banker is not None:
        b = sample.banker
        free = ", ".join(f"{r} {b.available[r]}/{b.total[r]}" for r in sorted(b.total))
        lines.append(Text(f"resources free: {free} · tasks {b.tasks} · parked {b.parked}"))
    if sample.fleet is not None:
        f = sample.fleet
        link = "connected" if f.connected else "UNREACHABLE"
        lines.append(
            Text(
                f"fleet: partitions {f.partitions_owned}/{f.partitions_total} · "
                f"leases {f.leased} · pending ops {f.pending_ops} · Redis {link}",
                style="" if f.connected else "bold red",
            )
        )
    return Group(*lines)


class BankerProgress(SamplingExtension):
    """Live progress on a terminal; off unless ``BANKER_PROGRESS`` and stdout is a TTY."""

    label = "BankerProgress"

    def __init__(self, crawler: Crawler, config: OpsConfig, console: Console | None = None) -> None:
        super().__init__(crawler, config)
        if console is None:
            from rich.console import Console

            console = Console(file=sys.stdout)
        self.console = console
        self.live: Live | None = None
        self.previous: Sample | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = ops_config(crawler)
        if not config.progress:
            raise NotConfigured()  # bare: being off is no reason to warn
        if not _isatty(sys.stdout):
            logger.debug("BankerProgress disabled: standard output is not a terminal")
            raise NotConfigured()
        cls._check_scheduler(crawler, cls)
        return cls(crawler, config)

    def start(self) -> bool:
        # Refreshed by the samples only: rich's own refresh thread would draw
        # from another thread, and there is nothing new between two samples.
        from rich.live import Live
        from rich.text import Text

        self.live = Live(
            Text("scrapy-banker: starting..."),
            console=self.console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.live.start(refresh=True)
        return True

    def on_sample(self, sample: Sample) -> None:
        if self.live is not None:
            self.live.update(progress_view(sample, self.previous), refresh=True)
        self.previous = sample

    def on_close(self, sample: Sample | None) -> None:
        live, self.live = self.live, None
        if live is None:
            return
        if sample is not None:
            live.update(progress_view(sample, self.previous), refresh=True)
        live.stop()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
