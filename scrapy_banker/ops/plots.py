"""PNG charts of a crawl's time-series record (``BANKER_TIMESERIES_FILE``).

The final stats say how a crawl ended; these charts say how it went: which
topic was served when (the PQ-MCSA paper's Fig. 4 view), how many downloads
were in flight and whether the busiest hosts sat at their limit (the BKDR
paper's Figs. 4-6 view), what the Banker's algorithm held back, and where the
GNP map put each site.  They read nothing but :class:`~scrapy_banker.core.telemetry.Sample`
records, so they can be drawn after the fact, on another machine, from the
files of several fleet nodes at once (merged by ``node``).

matplotlib is an optional dependency (the ``plot`` extra): it is imported only
when a chart is drawn, with the non-interactive Agg backend, so neither a
crawl nor any other command pays for it or needs a display.

No Scrapy, Twisted or Redis here: the command in
:mod:`scrapy_banker.ops.commands.plot` turns :class:`PlotError` into its one-line
error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scrapy_banker.core.telemetry import Sample, iter_samples

if TYPE_CHECKING:
    from numpy.typing import NDArray

    FloatArray = NDArray[np.float64]

__all__ = [
    "CHARTS",
    "BadLine",
    "PlotError",
    "PlotResult",
    "plot_samples",
    "read_samples",
]

logger = logging.getLogger(__name__)

#: Every chart this module draws, in the order they are written.
CHARTS = ("pages_per_topic.png", "active_downloads.png", "banker.png", "gnp_map.png")

#: Size of every chart: 1200 x 750 pixels, readable on a laptop and in the docs.
_FIGSIZE = (12.0, 7.5)
_DPI = 100
#: The busiest slots drawn as small multiples on the active-downloads chart.
_TOP_SLOTS = 6
#: Rate panels use at most about this many bins, whatever the crawl's length: a
#: rate over one sampling interval mostly shows the sampling's jitter.
_RATE_BINS = 80
#: ...and bins of at least this many sampling intervals.
_RATE_MIN_INTERVALS = 2
#: Site names are written next to their dot only on small maps (else unreadable).
_LABEL_SITES_UP_TO = 16
#: A node silent for this many of its own sampling intervals counts as gone.
_STALE_INTERVALS = 3.0


class PlotError(Exception):
    """A chart cannot be drawn at all (matplotlib missing, nothing to draw)."""


@dataclass(frozen=True)
class BadLine:
    """A line of a time-series file that is not a sample (truncated, other version)."""

    path: str
    line: int
    error: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.error}"


@dataclass(frozen=True)
class PlotResult:
    """What :func:`plot_samples` wrote, and which charts it skipped and why."""

    written: list[Path] = field(default_factory=list)
    #: ``(chart file name, reason)``.
    skipped: list[tuple[str, str]] = field(default_factory=list)


def read_samples(paths: Iterable[str | Path]) -> tuple[list[Sample], list[BadLine]]:
    """Every sample of ``paths`` (any order, any nodes) and the lines that were not.

    A crawl killed mid-write leaves a truncated last line, and a file may
    hold samples of a newer format: those lines are returned, not raised, so
    one bad line does not hide an hour of good ones.  Undecodable bytes are
    replaced, which makes their line a bad line too.  ``OSError`` (missing,
    unreadable file) is the caller's to report.
    """
    samples: list[Sample] = []
    bad: list[BadLine] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, item in iter_samples(f):
                if isinstance(item, Sample):
                    samples.append(item)
                else:
                    bad.append(BadLine(str(path), number, str(item)))
    return samples, bad


# -- time lines ---------------------------------------------------------------------------


class _Timeline:
    """The samples of every node on one time axis (seconds from the first sample).

    Nodes sample on their own clocks, so figures of the fleet are computed on
    the union of their sample times: a gauge (in flight, available...) holds
    a node's last value until it goes stale, a counter (pages) is
    interpolated and corrected for restarts, then the nodes are summed.
    """

    def __init__(self, samples: Sequence[Sample]) -> None:
        by_node: dict[str, dict[float, Sample]] = {}
        for s in samples:
            # The same sample read twice (a file given twice) counts once.
            by_node.setdefault(s.node, {})[s.t] = s
        self.t0 = min(s.t for s in samples)
        self.nodes = sorted(by_node)
        self.samples = {n: [by_node[n][t] for t in sorted(by_node[n])] for n in self.nodes}
        self.times = {
            n: np.array([s.t - self.t0 for s in ss], dtype=float) for n, ss in self.samples.items()
        }
        self.grid: FloatArray = np.unique(np.concatenate(list(self.times.values())))
        self.span = float(self.grid[-1])
        steps = [float(np.median(np.diff(t))) for t in self.times.values() if len(t) > 1]
        #: The typical sampling interval (``BANKER_TIMESERIES_INTERVAL``).
        self.step = max(steps) if steps else 1.0
        self.count = sum(len(ss) for ss in self.samples.values())

    def _stale(self, node: str) -> float:
        t = self.times[node]
        interval = float(np.median(np.diff(t))) if len(t) > 1 else self.step
        return _STALE_INTERVALS * max(interval, 1e-9)

    def node_gauge(
        self, node: str, get: Callable[[Sample], float | None], at: FloatArray | None = None
    ) -> FloatArray:
        """``node``'s last value at each time of ``at``; NaN before it or once it went silent."""
        at = self.grid if at is None else at
        t = self.times[node]
        values = np.array([_nan(get(s)) for s in self.samples[node]], dtype=float)
        idx = np.searchsorted(t, at, side="right") - 1
        out = np.full(len(at), np.nan)
        ok = idx >= 0
        ok[ok] = (at[ok] - t[idx[ok]]) <= self._stale(node)
        out[ok] = values[idx[ok]]
        return out

    def gauge(
        self, get: Callable[[Sample], float | None], at: FloatArray | None = None
    ) -> FloatArray:
        """The fleet's sum of a gauge; NaN where no node has a value."""
        at = self.grid if at is None else at
        stack = np.vstack([self.node_gauge(n, get, at) for n in self.nodes])
        total: FloatArray = np.nansum(stack, axis=0)
        total[np.all(np.isnan(stack), axis=0)] = np.nan
        return total

    def node_counter(
        self, node: str, get: Callable[[Sample], float | None], at: FloatArray | None = None
    ) -> FloatArray:
        """``node``'s cumulative count at each time of ``at`` (linear between samples).

        A counter that goes down means the node restarted and counts from 0
        again: what it had counted before is carried over, so the fleet's
        total never goes backwards.  A counter the node does not report yet
        (a topic whose first request it has not seen) is 0 until it does; one
        it stops reporting keeps its last value.
        """
        at = self.grid if at is None else at
        values = [get(s) for s in self.samples[node]]
        first = next((i for i, value in enumerate(values) if value is not None), len(values))
        pairs = [
            (when, 0.0 if i < first else value)
            for i, (when, value) in enumerate(zip(self.times[node], values, strict=True))
            if i < first or value is not None
        ]
        if not pairs:
            return np.zeros(len(at))
        t = np.array([p[0] for p in pairs], dtype=float)
        v = np.array([p[1] for p in pairs], dtype=float)
        drops = np.concatenate((np.zeros(1), np.where(np.diff(v) < 0, v[:-1], 0.0)))
        v = v + np.cumsum(drops)
        out: FloatArray = np.interp(at, t, v, left=v[0], right=v[-1])
        return out

    def counter(
        self, get: Callable[[Sample], float | None], at: FloatArray | None = None
    ) -> FloatArray:
        """The fleet's sum of a cumulative count."""
        at = self.grid if at is None else at
        total: FloatArray = np.sum([self.node_counter(n, get, at) for n in self.nodes], axis=0)
        return total

    def rate(self, get: Callable[[Sample], float | None]) -> tuple[FloatArray, FloatArray]:
        """``(bin centres, count per second)`` of a counter, in equal bins.

        Bins are two sampling intervals wide, or wider on long crawls so the
        panel keeps about :data:`_RATE_BINS` of them.
        """
        if self.span <= 0:
            return np.zeros(0), np.zeros(0)
        n = max(1, round(self.span / max(_RATE_MIN_INTERVALS * self.step, self.span / _RATE_BINS)))
        width = self.span / n
        edges = np.linspace(0.0, n * width, n + 1)
        per_second: FloatArray = np.diff(self.counter(get, edges)) / width
        return (edges[:-1] + edges[1:]) / 2, per_second


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


# -- drawing ------------------------------------------------------------------------------


def _matplotlib() -> Any:
    """Import matplotlib with the Agg backend (no display), or say how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install scrapy-banker[plot]") from None
    matplotlib.use("Agg")
    return matplotlib


def _palette(mpl: Any, name: str, count: int) -> list[Any]:
    cmap = mpl.colormaps[name]
    size = getattr(cmap, "N", 10)
    return [cmap(i % size) for i in range(count)]


def _style(ax: Any, ylabel: str, *, xlabel: bool = True) -> None:
    ax.grid(True, color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if xlabel:
        ax.set_xlabel("time since the first sample (s)")


def _figure(mpl: Any, title: str, subtitle: str) -> Any:
    from matplotlib.figure import Figure

    fig: Any = Figure(figsize=_FIGSIZE, dpi=_DPI, layout="constrained")
    fig.suptitle(f"{title}\n", fontsize=15, fontweight="bold")
    fig.text(0.5, 0.955, subtitle, ha="center", va="top", fontsize=10, color="#555555")
    fig.get_layout_engine().set(h_pad=0.12, hspace=0.06)
    return fig


def _describe(tl: _Timeline) -> str:
    nodes = f"{len(tl.nodes)} node" + ("s" if len(tl.nodes) != 1 else "")
    names = (
        f" ({', '.join(tl.nodes)})"
        if 1 < len(tl.nodes) <= 4
        else (f" ({tl.nodes[0]})" if len(tl.nodes) == 1 else "")
    )
    if tl.count < 2:
        return f"{nodes}{names} · 1 sample"
    return f"{nodes}{names} · {tl.count} samples every ~{tl.step:g} s · {tl.span:.0f} s recorded"


def _marker(tl: _Timeline) -> str | None:
    """Dots where a line would be too short to see (one or two sample times)."""
    return "o" if len(tl.grid) < 3 else None


def _legend_outside(ax: Any, **kwargs: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kwargs)


def _pages_per_topic(mpl: Any, tl: _Timeline, path: Path) -> None:
    topics: set[str] = set()
    for ss in tl.samples.values():
        for s in ss:
            topics.update(s.topics)
    final = {name: tl.counter(_topic_pages(name))[-1] for name in topics}
    order = sorted(topics, key=lambda name: (-final[name], name))
    colours = dict(zip(order, _palette(mpl, "tab10", len(order)), strict=True))

    fig = _figure(
        mpl,
        "Pages per topic over time",
        _describe(tl) + (" · summed over the nodes" if len(tl.nodes) > 1 else ""),
    )
    cum, rate = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    all_pages = tl.counter(lambda s: s.pages)
    centres, all_rate = tl.rate(lambda s: s.pages)
    for name in order:
        get = _topic_pages(name)
        cum.plot(tl.grid, tl.counter(get), color=colours[name], linewidth=2.0, marker=_marker(tl),
                 label=f"{name} ({final[name]:,.0f})")  # fmt: skip
        rate.plot(centres, tl.rate(get)[1], color=colours[name], linewidth=1.6, label=name)
    cum.plot(tl.grid, all_pages, color="#444444", linewidth=1.2, linestyle="--",
             label=f"all topics ({all_pages[-1]:,.0f})")  # fmt: skip
    rate.plot(centres, all_rate, color="#444444", linewidth=1.0, linestyle="--", label="all topics")
    cum.set_title("pages fetched (cumulative)", loc="left", fontsize=11)
    if len(centres) > 1:
        width = f"{centres[1] - centres[0]:.2g} s bins"
    elif len(centres) == 1:
        width = f"one {tl.span:.3g} s bin"
    else:
        width = ""
        rate.text(0.5, 0.5, "one sample: no rate yet", transform=rate.transAxes, ha="center")
    rate.set_title(f"pages/s (mean over {width})" if width else "pages/s", loc="left", fontsize=11)
    _style(cum, "pages", xlabel=False)
    _style(rate, "pages/s")
    cum.set_xlim(0, max(tl.span, tl.step))
    _legend_outside(cum, title="topic (pages)")
    _legend_outside(rate)
    fig.savefig(path)


def _topic_pages(name: str) -> Callable[[Sample], float | None]:
    def get(s: Sample) -> float | None:
        topic = s.topics.get(name)
        return None if topic is None else topic.pages

    return get


def _active_downloads(mpl: Any, tl: _Timeline, path: Path) -> None:
    busy: dict[str, float] = {}
    limits: dict[str, int] = {}
    #: Which node reported a slot most: its colour (one owner per host in a fleet).
    reporters: dict[str, dict[str, int]] = {}
    for node, ss in tl.samples.items():
        for s in ss:
            for slot in s.slots:
                busy[slot.slot] = busy.get(slot.slot, 0.0) + slot.inflight
                limits[slot.slot] = max(limits.get(slot.slot, 0), slot.limit)
                seen = reporters.setdefault(slot.slot, {})
                seen[node] = seen.get(node, 0) + 1
    top = sorted(busy, key=lambda name: (-busy[name], name))[:_TOP_SLOTS]
    node_colours = dict(zip(tl.nodes, _palette(mpl, "Dark2", len(tl.nodes)), strict=True))
    single = len(tl.nodes) == 1

    fig = _figure(mpl, "Active downloads over time", _describe(tl))
    upper, lower = fig.subfigures(2, 1, height_ratios=(1, 1)) if top else (fig, None)
    total_ax = upper.subplots()
    total = tl.gauge(lambda s: s.inflight)
    peak = float(np.nanmax(total))
    total_ax.plot(tl.grid, total, drawstyle="steps-post", color="#222222", linewidth=2.0,
                  marker=_marker(tl),
                  label=f"in flight (peak {peak:.0f})" if single
                  else f"all nodes (peak {peak:.0f})")  # fmt: skip
    if not single:
        for node in tl.nodes:
            values = tl.node_gauge(node, lambda s: s.inflight)
            total_ax.plot(tl.grid, values, drawstyle="steps-post", color=node_colours[node],
                          linewidth=1.6, label=node)  # fmt: skip
    total_ax.set_title("downloads in flight", loc="left", fontsize=11)
    _style(total_ax, "requests in flight")
    total_ax.set_xlim(0, max(tl.span, tl.step))
    _legend_outside(total_ax)

    if lower is not None:
        cols = min(3, len(top))
        rows = math.ceil(len(top) / cols)
        lower.suptitle(
            f"the {len(top)} busiest download slots: in flight (filled) vs their limit (dashed)"
            + ("" if single else ", stacked by the node that fetched them"),
            x=0.01, ha="left", fontsize=11,
        )  # fmt: skip
        axes = lower.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
        top_limit = max(limits[name] for name in top)
        for i, name in enumerate(top):
            ax = axes[i]
            # In a fleet a host moves between nodes (rebalance, placement):
            # each node's share is stacked in its colour, so a hand-over shows
            # as a change of colour -- and the few samples where both nodes
            # still report it (their clocks differ) as two colours at once.
            owners = sorted(reporters[name], key=lambda n: (-reporters[name][n], n))
            base = np.zeros(len(tl.grid))
            for node in sorted(reporters[name]):
                share = np.nan_to_num(tl.node_gauge(node, _slot_inflight(name)))
                colour = "#4c72b0" if single else node_colours[node]
                ax.fill_between(tl.grid, base, base + share, step="post", color=colour,
                                alpha=0.4, linewidth=0)  # fmt: skip
                base = base + share
            ax.plot(tl.grid, base, drawstyle="steps-post", color="#333333", linewidth=0.8,
                    marker=_marker(tl))  # fmt: skip
            ax.axhline(limits[name], color="#c44e52", linestyle="--", linewidth=1.6)
            ax.set_title(
                f"{name}  (limit {limits[name]})" + ("" if single else f"  · {', '.join(owners)}"),
                loc="left", fontsize=9.5,
            )  # fmt: skip
            _style(ax, "in flight" if i % cols == 0 else "", xlabel=i // cols == rows - 1)
            ax.set_ylim(0, top_limit * 1.3 + 0.5)
            ax.yaxis.get_major_locator().set_params(integer=True)
            ax.set_xlim(0, max(tl.span, tl.step))
        for ax in axes[len(top) :]:
            ax.set_visible(False)
    fig.savefig(path)


def _slot_inflight(name: str) -> Callable[[Sample], float | None]:
    def get(s: Sample) -> float | None:
        # A slot missing from a sample's busiest list counts as idle then.
        return next((slot.inflight for slot in s.slots if slot.slot == name), 0)

    return get


def _banker(mpl: Any, tl: _Timeline, path: Path) -> str | None:
    resources: set[str] = set()
    for ss in tl.samples.values():
        for s in ss:
            if s.banker is not None:
                resources.update(s.banker.total)
    if not any(s.banker is not None for ss in tl.samples.values() for s in ss):
        return "no sample carries Banker data (the crawl set no BANKER_RESOURCES)"
    names = sorted(resources)
    panels = len(names) + 1
    cols = 1 if panels <= 3 else 2
    rows = math.ceil(panels / cols)
    fig = _figure(mpl, "Banker's algorithm: resources over time", _describe(tl))
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        total = tl.gauge(_banker_value("total", name))
        allocated = tl.gauge(_banker_value("allocated", name))
        available = tl.gauge(_banker_value("available", name))
        need = tl.gauge(_banker_value("need", name))
        held = np.nan_to_num(allocated)
        # allocated + available = total in a consistent state: stacked, the
        # band's height is the pool and the split is who has it.
        ax.fill_between(tl.grid, 0, held, step="post", color="#4c72b0", alpha=0.55,
                        linewidth=0, label="allocated")  # fmt: skip
        ax.fill_between(tl.grid, held, held + np.nan_to_num(available), step="post",
                        color="#55a868", alpha=0.45, linewidth=0, label="available")  # fmt: skip
        ax.plot(tl.grid, need, drawstyle="steps-post", color="#c44e52", linewidth=1.8,
                label="need (what tasks may still ask)")  # fmt: skip
        ax.plot(tl.grid, total, drawstyle="steps-post", color="#333333", linestyle="--",
                linewidth=1.2, label="total")  # fmt: skip
        ax.set_title(f"resource {name!r}", loc="left", fontsize=11)
        _style(ax, "units", xlabel=False)
        top = np.nanmax(np.concatenate([total, need, held + np.nan_to_num(available)]))
        ax.set_ylim(0, max(1.0, float(top)) * 1.15)
        ax.yaxis.get_major_locator().set_params(integer=True)
    ax = axes[len(names)]
    parked = tl.gauge(lambda s: None if s.banker is None else s.banker.parked)
    tasks = tl.gauge(lambda s: None if s.banker is None else s.banker.tasks)
    ax.plot(tl.grid, tasks, drawstyle="steps-post", color="#8172b2", linewidth=1.8,
            label="tasks holding a grant")  # fmt: skip
    ax.plot(tl.grid, parked, drawstyle="steps-post", color="#dd8452", linewidth=2.0,
            label="requests parked (unsafe)")  # fmt: skip
    ax.set_title("tasks and parked requests", loc="left", fontsize=11)
    _style(ax, "count", xlabel=False)
    ax.yaxis.get_major_locator().set_params(integer=True)
    for extra in axes[panels:]:
        extra.set_visible(False)
    for ax in axes[:panels]:
        ax.set_xlim(0, max(tl.span, tl.step))
    for ax in axes[max(0, panels - cols) : panels]:
        ax.set_xlabel("time since the first sample (s)")
        ax.xaxis.set_tick_params(labelbottom=True)
    handles, labels = axes[0].get_legend_handles_labels()
    more_handles, more_labels = ax.get_legend_handles_labels()
    handles, labels = handles + more_handles, labels + more_labels
    summed = ", summed over the nodes" if len(tl.nodes) > 1 else ""
    fig.legend(handles, labels, loc="outside lower center", ncols=3, frameon=False,
               title=f"per resource{summed}")  # fmt: skip
    fig.savefig(path)
    return None


def _banker_value(field_name: str, resource: str) -> Callable[[Sample], float | None]:
    def get(s: Sample) -> float | None:
        if s.banker is None:
            return None
        value: dict[str, int] = getattr(s.banker, field_name)
        return value.get(resource)

    return get


def _gnp_map(mpl: Any, tl: _Timeline, path: Path) -> str | None:
    planned = [s for ss in tl.samples.values() for s in ss if s.placement is not None]
    if not planned:
        return "no sample carries a placement plan (BANKER_PLACEMENT is 'hash', or no plan yet)"
    # The newest plan that has a map: a strategy that made no GNP fit (nothing
    # measured yet) publishes its assignment without coordinates.
    mapped = [s for s in planned if s.placement is not None and s.placement.sites]
    if not mapped:
        return "no placement plan has GNP coordinates (no fit made yet: too few measurements)"
    latest = max(mapped, key=lambda s: s.t)
    plan = latest.placement
    assert plan is not None
    from matplotlib.collections import LineCollection

    def xy(coords: list[float]) -> tuple[float, float]:
        return (coords[0] if coords else 0.0, coords[1] if len(coords) > 1 else 0.0)

    dims = max((len(c) for c in [*plan.nodes.values(), *plan.sites.values()]), default=0)
    owners = sorted(set(plan.nodes) | set(plan.assignment.values()))
    colours = dict(zip(owners, _palette(mpl, "Dark2", len(owners)), strict=True))
    placed = set(plan.assignment) | set(plan.sites)
    # Sites placed without coordinates (not measured, or added after the
    # fit) count in the legend but cannot be drawn: say how many are drawn.
    drawn = "" if len(plan.sites) == len(placed) else f" ({len(plan.sites)} on the map)"
    space = "2-D coordinates" if dims <= 2 else f"first 2 of {dims} coordinates"
    fig = _figure(
        mpl,
        f"GNP map and assignment (placement: {plan.mode})",
        f"{len(placed)} sites{drawn} on {len(owners)} nodes · plan of t = "
        f"{latest.t - tl.t0:.0f} s from node {latest.node} · {space}, "
        "distance ≈ predicted RTT (ms)",
    )
    ax = fig.add_subplot(1, 1, 1)
    segments = []
    segment_colours = []
    for site, coords in plan.sites.items():
        node = plan.assignment.get(site)
        if node in plan.nodes:
            segments.append([xy(coords), xy(plan.nodes[node])])
            segment_colours.append(colours[node])
    if segments:
        ax.add_collection(LineCollection(segments, colors=segment_colours, linewidths=0.8,
                                         alpha=0.35, zorder=1))  # fmt: skip
    counts = {node: 0 for node in owners}
    for node in plan.assignment.values():
        counts[node] += 1
    for node in owners:
        sites = [xy(c) for site, c in plan.sites.items() if plan.assignment.get(site) == node]
        if sites:
            xs, ys = zip(*sites, strict=True)
            ax.scatter(xs, ys, s=22, color=colours[node], edgecolors="white", linewidths=0.5,
                       zorder=2)  # fmt: skip
    unassigned = [xy(c) for site, c in plan.sites.items() if site not in plan.assignment]
    if unassigned:
        xs, ys = zip(*unassigned, strict=True)
        ax.scatter(xs, ys, s=22, marker="x", color="#999999", zorder=2,
                   label=f"unassigned ({len(unassigned)})")  # fmt: skip
    for node in owners:
        if node not in plan.nodes:
            ax.scatter([], [], s=160, marker="s", color=colours[node],
                       label=f"{node}: {counts[node]} sites (no coordinates)")  # fmt: skip
            continue
        x, y = xy(plan.nodes[node])
        ax.scatter([x], [y], s=220, marker="s", color=colours[node], edgecolors="black",
                   linewidths=1.2, zorder=4, label=f"{node}: {counts[node]} sites")  # fmt: skip
        ax.annotate(node, (x, y), xytext=(8, 8), textcoords="offset points", fontsize=10,
                    fontweight="bold", zorder=5,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": colours[node],
                          "alpha": 0.85})  # fmt: skip
    if len(plan.sites) <= _LABEL_SITES_UP_TO:
        for site, coords in plan.sites.items():
            ax.annotate(site, xy(coords), xytext=(4, -10), textcoords="offset points",
                        fontsize=7.5, color="#555555", zorder=3)  # fmt: skip
    ax.set_aspect("equal", adjustable="datalim")
    ax.autoscale_view()
    ax.grid(True, color="#eeeeee", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.set_xlabel("GNP coordinate 1 (ms)")
    ax.set_ylabel("GNP coordinate 2 (ms)" if dims > 1 else "(one-dimensional map)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              title="node (squares) and its sites (dots)")  # fmt: skip
    fig.savefig(path)
    return None


def plot_samples(samples: Sequence[Sample], out_dir: str | Path) -> PlotResult:
    """Write the charts of :data:`CHARTS` for ``samples`` into ``out_dir``.

    ``samples`` may come from several nodes and in any order.  A chart whose
    data no sample carries (Banker state, a placement plan) is skipped with
    the reason, not drawn empty, and its file of an earlier run is removed.
    """
    if not samples:
        raise PlotError("no sample to plot")
    mpl = _matplotlib()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tl = _Timeline(samples)
    result = PlotResult()
    drawers: tuple[Callable[[Any, _Timeline, Path], str | None], ...] = (
        _pages_per_topic, _active_downloads, _banker, _gnp_map,
    )  # fmt: skip
    for name, draw in zip(CHARTS, drawers, strict=True):
        path = out / name
        why = draw(mpl, tl, path)
        if why is None:
            logger.info("Wrote %s", path)
            result.written.append(path)
        else:
            logger.info("Skipped %s: %s", name, why)
            result.skipped.append((name, why))
            # A chart of an earlier crawl left in the directory would pass
            # for this one's.
            path.unlink(missing_ok=True)
    return result
