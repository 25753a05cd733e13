"""``scrapy banker plot``: real PNG charts from time-series records.

The charts are checked as files an operator would open: PNG signature, the
size in the IHDR chunk, a byte size that only a drawn chart reaches, and
pixels that vary (a blank or single-colour image would pass the first three).
"""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
from argparse import Namespace
from pathlib import Path

import pytest
from conftest import PROJECT, run_python, run_scrapy

from scrapy_banker.core.telemetry import (
    BankerSample,
    PlacementSample,
    Sample,
    SlotSample,
    TopicSample,
    dump_sample,
)
from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.plots import CHARTS, _Timeline, plot_samples, read_samples

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: matplotlib writes these 1200 x 750 charts at 65-110 KB with this data; a
#: chart with titles, axes and flat lines only is already 34-46 KB, so the size
#: rules out a blank or broken file, not an empty chart: the colour counts of
#: :func:`drawn_pixels` check that the data was drawn.
MIN_PNG_BYTES = 30_000
#: matplotlib's tab10 (topics) and Dark2 (nodes) colours, as the charts use them.
TOPIC_COLOURS = {"products": "#1f77b4", "news": "#ff7f0e", "archive": "#2ca02c"}
NODE_COLOURS = {"worker-a": "#1b9e77", "worker-b": "#d95f02"}
T0 = 1_700_000_000.0
NODES = ("worker-a", "worker-b")
TOPICS = ("news", "products", "archive")


def build_samples(seconds: int = 40, nodes: tuple[str, ...] = NODES) -> list[Sample]:
    """Two nodes, three topics, Banker state and a placement plan, ``seconds`` long."""
    rng = random.Random(7)
    sites = {f"h{i:04d}.farm.test": [rng.gauss(0, 40), rng.gauss(0, 30)] for i in range(24)}
    node_xy = {n: [rng.gauss(0, 40), rng.gauss(0, 30)] for n in nodes}

    def nearest(coords: list[float]) -> str:
        return min(nodes, key=lambda n: math.dist(coords, node_xy[n]))

    assignment = {site: nearest(coords) for site, coords in sites.items()}
    out = []
    for k, node in enumerate(nodes):
        pages = dict.fromkeys(TOPICS, 0)
        for i in range(seconds):
            rates = {"news": 20 if i < 10 else 1, "products": 8 + i % 5, "archive": 4 * (i > 5)}
            for topic in TOPICS:
                pages[topic] += rates[topic]
            total = {"browser_pages": 4, "sessions": 2}
            held = {r: rng.randrange(n + 1) for r, n in total.items()}
            out.append(
                Sample(
                    t=T0 + i + 0.4 * k, node=node, pages=sum(pages.values()),
                    queued=400 - 5 * i, inflight=8 + rng.randrange(20),
                    topics={t: TopicSample(p, 50, 3, 1.0) for t, p in pages.items()},
                    slots=tuple(
                        SlotSample(f"h{j:04d}.farm.test", max(0, 4 - j % 5 + rng.randrange(-1, 1)),
                                   4, rng.randrange(30))
                        for j in range(10 * k, 10 * k + 8)
                    ),
                    banker=BankerSample(
                        total, {r: total[r] - n for r, n in held.items()}, held,
                        {"browser_pages": rng.randrange(3), "sessions": rng.randrange(2)},
                        tasks=rng.randrange(4), parked=rng.randrange(6),
                    ),
                    placement=PlacementSample("topk", node_xy, sites, assignment),
                )
            )  # fmt: skip
    return out


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, after checking the PNG signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def assert_real_chart(path: Path) -> None:
    import matplotlib.image

    width, height = png_size(path)
    assert width >= 600 and height >= 400, (path, width, height)
    assert path.stat().st_size > MIN_PNG_BYTES, (path, path.stat().st_size)
    pixels = matplotlib.image.imread(str(path))
    assert pixels.shape[:2] == (height, width)
    # Mostly white background, but lines, text and fills: clearly not blank.
    assert float(pixels[..., :3].std()) > 0.05, path
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50, (path, len(colours))


def drawn_pixels(path: Path, colour: str) -> int:
    """How many pixels of ``path`` are (nearly) exactly ``colour`` (``#rrggbb``)."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(path))[..., :3]
    target = np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(pixels - target).max(axis=-1) < 0.02).sum())


def test_every_chart_is_a_real_png(tmp_path: Path) -> None:
    result = plot_samples(build_samples(), tmp_path)
    assert [p.name for p in result.written] == list(CHARTS)
    assert result.skipped == []
    for path in result.written:
        assert path.parent == tmp_path
        assert_real_chart(path)
    # The data is drawn, not only the legend (a legend line is ~60 pixels):
    # each topic's lines on both panels, each node's line and its sites.
    for topic, colour in TOPIC_COLOURS.items():
        assert drawn_pixels(tmp_path / "pages_per_topic.png", colour) > 800, topic
    for node, colour in NODE_COLOURS.items():
        assert drawn_pixels(tmp_path / "active_downloads.png", colour) > 800, node
        assert drawn_pixels(tmp_path / "gnp_map.png", colour) > 400, node


def test_charts_without_banker_or_placement_data_are_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    samples = [
        Sample(s.t, s.node, s.pages, s.queued, s.inflight, s.topics, s.slots)
        for s in build_samples(nodes=("solo",))
    ]
    (tmp_path / "banker.png").write_bytes(b"an earlier crawl's chart")
    result = plot_samples(samples, tmp_path)
    assert [p.name for p in result.written] == ["pages_per_topic.png", "active_downloads.png"]
    skipped = dict(result.skipped)
    assert "BANKER_RESOURCES" in skipped["banker.png"]
    assert "placement" in skipped["gnp_map.png"]
    assert not (tmp_path / "banker.png").exists()  # not left to pass for this crawl's
    for path in result.written:
        assert_real_chart(path)


def test_gnp_map_uses_the_newest_plan_with_coordinates(tmp_path: Path) -> None:
    samples = build_samples(seconds=3)
    mapped = samples[-1].placement
    assert mapped is not None
    unmapped = PlacementSample("topk", {}, {}, {"h0000.farm.test": "worker-a"})
    later = Sample(samples[-1].t + 1, "worker-a", 0, 0, 0, placement=unmapped)
    assert plot_samples([*samples, later], tmp_path).skipped == []
    assert_real_chart(tmp_path / "gnp_map.png")
    result = plot_samples([later], tmp_path)
    assert "no placement plan has GNP coordinates" in dict(result.skipped)["gnp_map.png"]


def test_one_sample_still_plots(tmp_path: Path) -> None:
    result = plot_samples(build_samples(seconds=1, nodes=("solo",)), tmp_path)
    assert len(result.written) == 4
    assert all(png_size(p)[0] >= 600 for p in result.written)


def test_fleet_figures_are_summed_over_nodes_with_restarts_carried_over() -> None:
    # Node a counts 0, 10, 20 then restarts (5, 15); node b samples half a second later.
    a = [Sample(T0 + i, "a", pages, 0, 2) for i, pages in enumerate((0, 10, 20, 5, 15))]
    b = [Sample(T0 + i + 0.5, "b", 100 * i, 0, 3) for i in range(5)]
    tl = _Timeline(a + b + a[:1])  # a sample given twice counts once
    assert tl.nodes == ["a", "b"]
    assert tl.count == 10
    assert tl.span == 4.5
    pages = tl.counter(lambda s: s.pages)
    # At t=4 node a has 20 + 15 (restarted), node b is between 300 and 400.
    assert pages[list(tl.grid).index(4.0)] == pytest.approx(35 + 350)
    assert list(pages) == sorted(pages)  # never goes backwards
    inflight = tl.gauge(lambda s: s.inflight)
    assert inflight[0] == 2  # only a has reported at t=0
    assert inflight[1] == 5
    centres, rate = tl.rate(lambda s: s.pages)
    assert list(centres) == [1.125, 3.375]  # two bins of >= 2 sampling intervals
    assert rate.sum() * (centres[1] - centres[0]) == pytest.approx(pages[-1] - pages[0])


def test_a_topic_not_reported_yet_counts_zero_not_its_first_value() -> None:
    topic = {"news": TopicSample(7, 0, 0, 1.0)}
    samples = [Sample(T0 + i, "a", 7, 0, 0, topic if i >= 2 else {}) for i in range(4)]
    tl = _Timeline(samples)
    news = tl.counter(lambda s: None if "news" not in s.topics else s.topics["news"].pages)
    assert list(news) == [0, 0, 7, 7]


def test_read_samples_merges_files_and_reports_bad_lines(tmp_path: Path) -> None:
    samples = build_samples(seconds=3)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with first.open("w") as f:
        for s in samples[:3]:
            dump_sample(s, f)
        f.write('{"version": 99}\n\n{"t": 1, "trunc')
    with second.open("w") as f:
        for s in samples[3:]:
            dump_sample(s, f)
    got, bad = read_samples([first, second])
    assert got == samples
    assert [(b.path, b.line) for b in bad] == [(str(first), 4), (str(first), 6)]
    assert "version 99" in bad[0].error


def _write(path: Path, samples: list[Sample], extra: str = "") -> Path:
    with path.open("w") as f:
        for s in samples:
            dump_sample(s, f)
        f.write(extra)
    return path


def _banker(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``scrapy banker ...`` in ``cwd``, whatever its exit code."""
    return run_python("-m", "scrapy.cmdline", "banker", *args, cwd=cwd, timeout=120, expect=None)


@pytest.mark.slow
def test_plot_command_writes_the_pngs_of_two_node_files(tmp_path: Path) -> None:
    samples = build_samples()
    a = _write(tmp_path / "a.jsonl", [s for s in samples if s.node == "worker-a"], '{"bad')
    b = _write(tmp_path / "b.jsonl", [s for s in samples if s.node == "worker-b"])
    out = tmp_path / "plots"
    proc = _banker("plot", str(a), str(b), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.split()
    assert printed == [str(out / name) for name in CHARTS]
    for path in printed:
        assert_real_chart(Path(path))
    warnings = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "skipped 1 line" in warnings[0], proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.jsonl", "cannot read"),
        (lambda d: d, "cannot read"),  # a directory
        (lambda d: _write(d / "empty.jsonl", []), "no valid sample"),
        (lambda d: _write(d / "junk.jsonl", [], "not json\n\x00\x01\n"), "no valid sample"),
    ],
)
def test_plot_command_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, make: object, message: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    proc = _banker("plot", str(path), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scrapy banker plot: "), proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists()


def test_plot_run_reads_the_configured_file_and_refuses_bad_input(tmp_path: Path) -> None:
    """The subcommand's ``run`` directly: the project's file by default, and its errors."""
    from scrapy.settings import Settings

    from scrapy_banker.ops.commands import plot

    record = _write(tmp_path / "ts.jsonl", build_samples(seconds=5))
    out = tmp_path / "out"
    settings = Settings({"BANKER_TIMESERIES_FILE": str(record)})
    assert plot.run(Namespace(timeseries=[], plot_dir=str(out)), settings) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(CHARTS)
    with pytest.raises(CommandError, match="BANKER_TIMESERIES_FILE"):
        plot.run(Namespace(timeseries=[], plot_dir=str(out)), Settings())
    with pytest.raises(CommandError, match="no valid sample"):
        plot.run(Namespace(timeseries=[str(_write(tmp_path / "e", []))], plot_dir=str(out)),
                 settings)  # fmt: skip
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CommandError, match="cannot write"):
        plot.run(Namespace(timeseries=[str(record)], plot_dir=str(blocker / "x")), settings)


@pytest.mark.slow
def test_plots_module_does_not_import_matplotlib_until_it_draws() -> None:
    code = (
        "import sys, scrapy_banker.ops.plots, scrapy_banker.ops.commands.plot;"
        "print('matplotlib' in sys.modules)"
    )
    out = run_python("-c", code)
    assert out.stdout.strip() == "False"


def test_json_lines_record_round_trips_through_the_plot_reader(tmp_path: Path) -> None:
    samples = build_samples(seconds=2)
    path = tmp_path / "ts.jsonl"
    path.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in samples))
    assert read_samples([path]) == (samples, [])


# -- real crawls of the web farm -------------------------------------------------------------

ADMISSION_SPIDER = """
import sys
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
from scrapy_banker.testing.resolver import farm_settings

port, hosts, timeseries = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


class Spider(scrapy.Spider):
    name = "plotted"
    links = LinkExtractor(allow=[r"^https?://[a-z0-9-]+\\.farm\\.test(:\\d+)?/"])

    async def start(self):
        for i in range(hosts):
            yield scrapy.Request(f"http://h{i:04d}.farm.test:{port}/",
                                 meta={"banker_need": {"pages": 1}})
        # Three tasks holding a session each, two sessions: one waits (parked)
        # until BANKER_TASK_TIMEOUT reclaims an idle holder.
        for t in range(3):
            yield scrapy.Request(
                f"http://h0000.farm.test:{port}/?task={t}",
                meta={"banker_task": f"t{t}", "banker_max": {"sessions": 1, "pages": 1},
                      "banker_need": {"sessions": 1}, "banker_hold": True},
                dont_filter=True, callback=self.noop,
            )

    def parse(self, response):
        for link in self.links.extract_links(response):
            yield response.follow(link.url, meta={"banker_need": {"pages": 1}})

    def noop(self, response):
        return None


process = CrawlerProcess({
    **farm_settings(),
    "ADDONS": {"scrapy_banker.Addon": 500},
    "BANKER_RESOURCES": {"pages": 3, "sessions": 2},
    "BANKER_TASK_TIMEOUT": 1,
    "BANKER_TIMESERIES_FILE": timeseries,
    "BANKER_TIMESERIES_INTERVAL": 0.1,
    "CONCURRENT_REQUESTS": 16,
    "LOG_LEVEL": "WARNING",
})
process.crawl(Spider)
process.start()
"""


@pytest.mark.slow
def test_demo_project_crawl_records_a_time_series_that_plots(tmp_path: Path) -> None:
    """``scrapy crawl farm`` with BANKER_TIMESERIES_FILE, then ``scrapy banker plot``."""
    from scrapy_banker.testing.farm import FarmConfig, WebFarm

    timeseries = tmp_path / "ts.jsonl"
    with WebFarm(FarmConfig(seed=5, hosts=6, total_pages=300, latency_ms=20.0)) as farm:
        run_scrapy("crawl", "farm", "-a", f"port={farm.port}", "-a", "hosts=6",
                   "-s", f"BANKER_TIMESERIES_FILE={timeseries}",
                   "-s", "BANKER_TIMESERIES_INTERVAL=0.1", "-s", "LOG_LEVEL=WARNING")  # fmt: skip
        expected = len(farm.expected_urls())
    samples, bad = read_samples([timeseries])
    assert bad == []
    assert len(samples) >= 5
    assert samples[-1].pages == expected  # the last sample is taken at close
    assert max(s.inflight for s in samples) > 1
    assert set(samples[-1].topics) >= {"news", "products", "archive"}

    out = tmp_path / "plots"
    proc = _banker("plot", str(timeseries), "-o", str(out), cwd=PROJECT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / "pages_per_topic.png"),
                                   str(out / "active_downloads.png")]  # fmt: skip
    assert "skipped banker.png" in proc.stderr and "skipped gnp_map.png" in proc.stderr
    for name in ("pages_per_topic.png", "active_downloads.png"):
        assert_real_chart(out / name)
    print(f"\nplots of a real crawl: {out}")


@pytest.mark.slow
def test_crawl_with_banker_admission_plots_its_allocation(tmp_path: Path) -> None:
    from scrapy_banker.testing.farm import FarmConfig, WebFarm

    script, timeseries = tmp_path / "spider.py", tmp_path / "ts.jsonl"
    script.write_text(ADMISSION_SPIDER)
    with WebFarm(FarmConfig(seed=11, hosts=4, total_pages=160, latency_ms=20.0)) as farm:
        run_python(script, str(farm.port), "4", timeseries)
    samples, bad = read_samples([timeseries])
    assert bad == []
    banker = [s.banker for s in samples if s.banker is not None]
    assert banker, "no sample carries Banker data"
    assert banker[0].total == {"pages": 3, "sessions": 2}
    assert max(b.allocated["pages"] for b in banker) >= 1
    assert max(b.allocated["sessions"] for b in banker) == 2

    out = tmp_path / "plots"
    proc = _banker("plot", str(timeseries), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert str(out / "banker.png") in proc.stdout.split()
    assert_real_chart(out / "banker.png")
    print(f"\nBanker plot of a real crawl: {out / 'banker.png'}")


@pytest.mark.slow
def test_demo_writes_its_plots_and_says_where(tmp_path: Path) -> None:
    proc = run_python(PROJECT / "run_demo.py", "--hosts", "4", "--pages", "120",
                      "--latency-ms", "5", "--out", tmp_path)  # fmt: skip
    for name in ("pages_per_topic.png", "active_downloads.png"):
        path = tmp_path / "plots" / name
        assert str(path) in proc.stdout
        assert_real_chart(path)
    assert str(tmp_path / "timeseries.jsonl") in proc.stdout
    assert "scrapy banker dashboard" in proc.stdout
