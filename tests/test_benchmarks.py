"""Smoke tests of the scheduler benchmarks (``benchmarks/``).

The benchmarks' JSON line is what CI dashboards and the issue's targets are
judged by, so it must keep its keys and stay valid whatever the scheduler
does.  These tests run each benchmark in a tiny mode as a subprocess (as a
user would), check that contract and that real work was measured, and unit
test the fairness arithmetic on hand-made samples.  They deliberately assert
no performance target: speed is the benchmarks' business, not CI's.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import BENCH, run_python
from scrapy.core.scheduler import Scheduler

PEERS = ("banker", "scrapy_pq", "dapq")


def _module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import a benchmark script as a module (they import ``_common`` as a sibling)."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module(name)


def _run(script: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run a benchmark as a user would; its last line of output is its JSON object."""
    proc = run_python(BENCH / script, *args, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) > 1, "human-readable lines must precede the JSON line"
    result = json.loads(lines[-1])
    assert isinstance(result, dict)
    return result


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_scheduler_ops_tiny_reports_every_key() -> None:
    result = _run(
        "scheduler_ops.py", "--domains", "50", "200", "--requests", "2000", "--repeats", "1"
    )
    for key in (
        "banker_ops_per_s",
        "scrapy_pq_ops_per_s",
        "dapq_ops_per_s",
        "ratio_banker_vs_dapq",
        "ratio_banker_vs_scrapy_pq",
    ):
        assert _positive(result[key]), (key, result[key])
    # 10,000 domains is not among them, so the headline is the last count.
    assert result["domains"] == 200
    assert result["requests"] == 2000
    assert set(result["by_domains"]) == {"50", "200"}
    for row in result["by_domains"].values():
        assert all(_positive(row[f"{p}_ops_per_s"]) for p in PEERS)
        assert row["truncated"] == []


@pytest.mark.slow
def test_crawl_skewed_tiny_fetches_pages_with_every_scheduler() -> None:
    result = _run("crawl_skewed.py", "--tiny", timeout=180)
    for key in (
        "pages_per_s_banker",
        "pages_per_s_scrapy_pq",
        "pages_per_s_dapq",
        "ratio_banker_vs_scrapy_pq",
        "ratio_banker_vs_dapq",
        "topic_jain_index",
        "topic_jain_index_scrapy_pq",
        "topic_jain_index_dapq",
    ):
        assert _positive(result[key]), (key, result[key])
    for key in ("topic_jain_index", "topic_jain_index_scrapy_pq", "topic_jain_index_dapq"):
        assert result[key] <= 1.0 + 1e-9
    for key in ("max_topic_wait_s", "max_topic_wait_s_scrapy_pq", "max_topic_wait_s_dapq"):
        value = result[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, key
    for name in PEERS:
        run = result["runs"][name]
        assert run["responses"] > 0, name
        assert run["server_requests"] > 0, name
        # The per-topic counters of the add-on exist for every scheduler.
        assert sum(run["topic_responses"].values()) > 0, name


def test_jain_index_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    common = _module("_common", monkeypatch)
    assert common.jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert common.jain_index([9, 0, 0]) == pytest.approx(1 / 3)
    assert math.isnan(common.jain_index([0, 0]))


def _sample(t: float, responses: list[int], pending: list[int]) -> dict[str, Any]:
    return {"t": t, "responses": responses, "received": responses, "pending": pending}


def test_fairness_window_and_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    crawl = _module("crawl_skewed", monkeypatch)
    samples = [
        _sample(0.0, [0, 0], [0, 0]),  # nothing pending yet: outside the window
        _sample(0.5, [0, 0], [3, 4]),  # window starts
        _sample(1.0, [2, 0], [3, 4]),
        _sample(1.5, [4, 0], [3, 4]),
        _sample(2.0, [6, 2], [0, 4]),  # topic 0 ran dry: window ends here
        _sample(2.5, [6, 4], [0, 4]),
        _sample(3.5, [6, 4], [0, 4]),  # after the budget: ignored
    ]
    fair = crawl.fairness(samples, budget=3.0)
    assert fair["shares"] == [6, 2]
    assert fair["window_s"] == pytest.approx(1.5)
    assert fair["jain"] == pytest.approx(64 / (2 * 40))
    # Topic 1 was pending from 0.5 s and got nothing in the two intervals up to
    # 1.5 s (it was answered between 1.5 s and 2.0 s): a 1.0 s sampled wait.
    assert fair["max_wait_s"] == pytest.approx(1.0)


def test_fairness_without_common_pending_window(monkeypatch: pytest.MonkeyPatch) -> None:
    crawl = _module("crawl_skewed", monkeypatch)
    samples = [_sample(0.0, [0, 0], [1, 0]), _sample(0.5, [1, 0], [0, 0])]
    fair = crawl.fairness(samples, budget=10.0)
    assert math.isnan(fair["jain"])
    assert fair["max_wait_s"] == 0.0


def test_request_stream_covers_every_domain_deterministically(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ops = _module("scheduler_ops", monkeypatch)
    urls = ops.make_urls(100, 1000)
    assert urls == ops.make_urls(100, 1000)
    assert len(set(urls)) == 1000
    hosts = [u.split("/")[2] for u in urls]
    assert set(hosts) == {f"d{i}.example" for i in range(100)}
    # Skewed: the biggest domain has far more than the 10 a uniform split gives.
    assert max(hosts.count(h) for h in set(hosts)) > 50


class _LossyScheduler(Scheduler):
    """Loses every tenth request: the benchmark must refuse to report it."""

    def next_request(self) -> Any:
        request = super().next_request()
        self._calls = getattr(self, "_calls", 0) + 1
        if request is not None and self._calls % 10 == 0:
            return super().next_request()
        return request


def test_scheduler_ops_rejects_a_scheduler_that_loses_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ops = _module("scheduler_ops", monkeypatch)
    common = _module("_common", monkeypatch)
    monkeypatch.setitem(
        common.SCHEDULERS,
        "lossy",
        {
            "SCHEDULER": _LossyScheduler,
            "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
        },
    )
    urls = ops.make_urls(20, 200)
    keys = [f"d{i}.example" for i in range(20)]
    assert ops.measure("scrapy_pq", urls, keys, 60.0).dequeued == 200
    with pytest.raises(SystemExit, match="lossy: dequeued"):
        ops.measure("lossy", urls, keys, 60.0)


@pytest.mark.slow
def test_distributed_tiny_fleet_crawls_everything_politely() -> None:
    result = _run("distributed.py", "--tiny", timeout=180)
    n = result["workers"]
    assert n == 2
    for key in (
        f"pages_per_s_scrapy_redis_{n}w",
        f"pages_per_s_banker_{n}w",
        "pages_per_s_scrapy_redis_1w",
        "pages_per_s_banker_1w",
        f"speedup_banker_{n}w_vs_1w",
        f"speedup_banker_vs_scrapy_redis_{n}w",
    ):
        assert _positive(result[key]), (key, result[key])
    for key in (
        "max_concurrent_per_host_banker",
        "max_concurrent_per_host_scrapy_redis",
        "lost_scrapy_redis",
        "duplicates_scrapy_redis",
    ):
        assert isinstance(result[key], int) and result[key] >= 0, (key, result[key])
    assert result["per_host_limit"] == 2
    assert result["lost"] == 0
    assert result["duplicates"] == 0
    # One owner per host's partition: the limit holds fleet-wide.
    assert 1 <= result["max_concurrent_per_host_banker"] <= result["per_host_limit"]
    for name, run in result["runs"].items():
        assert run["exit_codes"] == [0] * run["workers"], name
        assert run["pages"] >= run["expected"] > 0, name


@pytest.mark.slow
def test_redis_scale_tiny_reports_every_key() -> None:
    result = _run("redis_scale.py", "--tiny", timeout=180)
    sizes = list(result["by_size"])  # the per-size key suffixes: "1e3", "4000"
    assert sizes == ["1e3", "4000"]
    for key in (
        "bytes_per_queued_request_banker",
        "bytes_per_queued_request_scrapy_redis",
        "bytes_per_seen_url_set",
        "bytes_per_seen_url_scrapy_redis",
        "enqueue_per_s_banker",
        "enqueue_per_s_scrapy_redis",
        "pop_ack_per_s_banker",
        "pop_per_s_scrapy_redis",
        "enqueue_rate_flatness_banker",
        "pop_rate_flatness_banker",
        "enqueue_speedup_vs_scrapy_redis_min",
        "pop_speedup_vs_scrapy_redis_min",
        "queued_bytes_ratio_vs_scrapy_redis",
    ):
        assert _positive(result[key]), (key, result[key])
    for size in sizes:
        for key in (
            "bytes_per_queued_request_banker",
            "enqueue_per_s_banker",
            "enqueue_per_s_scrapy_redis",
            "pop_ack_per_s_banker",
            "pop_per_s_scrapy_redis",
            "enqueue_speedup_vs_scrapy_redis",
            "pop_speedup_vs_scrapy_redis",
        ):
            assert _positive(result[f"{key}_{size}"]), (key, size)
        rows = result["by_size"][size]
        assert rows["banker"]["refused_as_seen"] == 0
        assert rows["scrapy_redis"]["refused_as_seen"] == 0
    assert result["enqueue_rate_flatness_banker"] >= 1.0
    assert result["bloom_target_fp_rate"] == 0.001
    # Bloom figures exist once BANKER_DEDUP does, else they are null with the reason.
    if result["bloom_note"] is None:
        assert _positive(result["bytes_per_seen_url_bloom"])
        rate = result["bloom_measured_fp_rate"]
        assert isinstance(rate, float) and 0.0 <= rate <= 1.0
        assert result["bloom_fp_tests"]["lua_hosts"]["tested"] > 0
    else:
        assert result["bytes_per_seen_url_bloom"] is None
        assert result["bloom_measured_fp_rate"] is None
    for name, verdict in result["targets"].items():
        assert verdict["met"] in (True, False, None), name
        assert verdict["met"] is None or isinstance(verdict["value"], (int, float)), name


def _docs_tree(root: Path, pages: int) -> Path:
    """A small folder of HTML with a real link graph: an index, a chain, and back links."""
    root.mkdir(parents=True)
    for k in range(pages):
        links = "".join(f'<a href="p{j}.html">{j}</a>' for j in ((k + 1) % pages, (k * 7) % pages))
        (root / f"p{k}.html").write_text(f"<html><title>{k}</title><body>{links}</body></html>")
    (root / "index.html").write_text('<a href="p0.html">start</a><a href="p5.html">five</a>')
    return root


@pytest.mark.slow
def test_real_sites_on_written_trees_reports_every_key(tmp_path: Path) -> None:
    a = _docs_tree(tmp_path / "a", 20)
    b = _docs_tree(tmp_path / "b", 12)
    result = _run("real_sites.py", "--quick", "--tree", f"a={a}", "--tree", f"b={b}",
                  "--fleet", "2", timeout=240)  # fmt: skip
    assert result["same_url_set"] is True
    assert result["distinct_pages"] == 21 + 13
    assert result["pages_per_host"] == {"a.farm.test": 21, "b.farm.test": 13}
    names = ("dapq_asyncio", "dapq_epoll", "banker", "scrapy_redis_2w", "banker_2w")
    for name in names:
        assert _positive(result[f"wall_s_{name}"]), name
        assert _positive(result[f"cpu_s_{name}"]), name
        assert set(result[f"inflight_longpole_{name}"]) == {
            "longpole_first10s",
            "longpole_last_quarter",
            "all_first10s",
            "all_last_quarter",
        }
    for name in ("dapq_epoll", "banker", "banker_2w"):
        assert result[f"duplicates_{name}"] == 0, name
        assert 1 <= result[f"max_inflight_per_host_{name}"] <= 4, name
    assert result["longpole_host"] == "a.farm.test"
    assert result["bound_s"] == max(result["politeness_bound_s"], result["cpu_bound_s"])
    for key in (
        "wall_over_bound_banker",
        "wall_ratio_banker_vs_dapq_epoll",
        "wall_ratio_banker_vs_dapq_asyncio",
        "wall_ratio_banker_vs_scrapy_redis_2w",
    ):
        assert _positive(result[key]), key
    # Every peer against its bound; a fleet's bound counts the cores it can use.
    for name in names:
        assert _positive(result[f"wall_over_bound_{name}"]), name
    for name in ("banker_2w", "scrapy_redis_2w"):
        cpu_share = result["cpu_bound_s"] / min(2, os.cpu_count() or 1)
        assert result[f"bound_s_{name}"] == pytest.approx(
            max(result["politeness_bound_s"], cpu_share), abs=0.01
        )
        assert result[f"wall_over_bound_{name}"] == pytest.approx(
            result[f"wall_s_{name}"] / result[f"bound_s_{name}"],
            rel=0.02,  # both rounded
        )


@pytest.mark.slow
def test_crawl_matrix_tiny_fetches_exactly_the_expected_urls() -> None:
    result = _run("crawl_matrix.py", "--tiny", timeout=240)
    assert result["exact"] is True
    assert result["hosts"] == [10]
    for regime in ("none", "wan"):
        for name in PEERS:
            tag = f"{name}_{regime}_10"
            assert _positive(result[f"wall_s_{tag}"]), tag
            assert _positive(result[f"cpu_s_{tag}"]), tag
            assert 1 <= result[f"max_inflight_{tag}"] <= 4, tag
    assert _positive(result["bound_s_wan_10"])
    for key in (
        "wall_ratio_banker_vs_dapq_wan_10",
        "worst_wall_ratio_banker_vs_dapq",
        "best_wall_ratio_banker_vs_scrapy_pq",
        "worst_wall_over_bound_banker_wan",
    ):
        assert _positive(result[key]), key


@pytest.mark.slow
def test_engine_overhead_tiny_reports_every_scheduler() -> None:
    result = _run("engine_overhead.py", "--tiny", timeout=240)
    assert result["hosts"] == [10, 100]
    assert result["truncated"] == []
    for name in ("banker", "banker_addon", "banker_topics", "dapq", "scrapy_pq"):
        for h in (10, 100):
            assert _positive(result[f"cpu_per_1k_{name}_{h}"]), (name, h)
    for name in ("banker", "banker_addon", "banker_topics"):
        assert _positive(result[f"worst_cpu_ratio_{name}_vs_dapq"]), name
        assert _positive(result[f"cpu_ratio_{name}_vs_dapq_100"]), name


@pytest.mark.slow
def test_jobdir_cost_tiny_reports_cost_and_resume() -> None:
    result = _run("jobdir_cost.py", "--tiny", timeout=240)
    assert result["incomplete"] == []
    for key in (
        "cpu_per_1k_banker_memory",
        "cpu_per_1k_banker_jobdir",
        "cpu_per_1k_scrapy_jobdir",
        "jobdir_overhead_ratio",
        "jobdir_vs_scrapy_jobdir_ratio",
        "journal_cpu_us_per_request",
        "resume_s_2000",
        "jobdir_bytes_per_request",
    ):
        assert _positive(result[key]), key


@pytest.mark.slow
def test_webfarm_throughput_tiny_serves_pages() -> None:
    result = _run("webfarm_throughput.py", "--tiny", timeout=120)
    assert _positive(result["pages_per_s"])
    assert result["errors"] == 0
    assert result["hosts"] == 20
    assert result["server_requests"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_freshness_tiny_judges_every_peer_on_what_the_farm_served() -> None:
    result = _run("freshness.py", "--tiny", timeout=280)
    peers = ("uniform", "optimal", "full_recrawl", "banker", "banker_poisson", "banker_jobdir",
             "banker_fleet")  # fmt: skip
    for peer in peers:
        assert 0 < result[f"freshness_{peer}"] <= 1, peer
        assert result[f"fetches_{peer}"] > result["pages"], peer  # pages were fetched again
        assert _positive(result[f"bytes_{peer}"]), peer
        assert result[f"pages_missing_{peer}"] == 0, peer
        assert result[f"politeness_violations_{peer}"] == 0, peer
    # Only the banker peers send validators (the resumed one the JOBDIR's); the others
    # get every copy whole.
    assert all(result[f"not_modified_{p}"] > 0 for p in peers[3:])
    assert all(result[f"not_modified_{p}"] == 0 for p in peers[:3])
    # The fixed-interval peers land near what theory says they keep (a check of the judge).
    assert abs(result["freshness_uniform"] - result["expected_freshness_uniform"]) < 0.1
    assert abs(result["freshness_optimal"] - result["freshness_bound"]) < 0.1
    for key in (
        "freshness_ratio_banker_vs_optimal",
        "freshness_ratio_banker_vs_uniform",
        "freshness_ratio_optimal_vs_uniform",
        "bytes_ratio_banker_vs_full_recrawl",
        "freshness_ratio_banker_fleet_vs_optimal",
        "freshness_ratio_banker_fleet_vs_uniform",
        "bytes_ratio_banker_fleet_vs_full_recrawl",
    ):
        assert _positive(result[key]), key


def test_freshness_peers_spend_the_same_budget_and_violations_count_early_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freshness = _module("freshness", monkeypatch)
    from scrapy_banker.testing.farm.changes import ChangeModel

    changes = ChangeModel(seed=3, rate_min=0.01, rate_max=5.0, static_share=0.2)
    keys = {f"h{h}.farm.test/p{i}" for h in range(2) for i in range(12)}
    for peer in ("uniform", "optimal"):
        intervals = freshness.revisit_intervals(peer, keys, changes, 4.0)
        for host in ("h0", "h1"):
            spent = sum(1 / v for k, v in intervals.items() if k.startswith(host) and v)
            assert spent == pytest.approx(4.0), (peer, host)
    optimal = freshness.revisit_intervals("optimal", keys, changes, 4.0)
    static = [k for k in keys if changes.rate(k) == 0]
    assert static and all(optimal[k] is None for k in static)  # never worth a fetch
    served = {
        "max_inflight_per_host": {"a": 1, "b": 2},
        "host_events": {
            "a": [(0.0, 1), (0.1, -1), (0.2, 1), (0.3, -1), (0.45, 1), (0.6, 1)],
            "b": [(0.0, 1), (0.5, 1)],
        },
    }
    # a: 0.2 s and 0.15 s after the one before (< 95 % of 0.25 s) are early, 0.25 s is not;
    # b: two at once.
    assert freshness.violations(served, 0.25) == 3
    assert freshness.page_key("http://h1.farm.test:8080/a/b") == "h1.farm.test/a/b"


# -- the harness -------------------------------------------------------------------------


def test_set_options_are_json_and_a_bad_one_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = _module("_harness", monkeypatch)
    parser = harness.parser("Doc line.\n\nMore.", quick="q", tiny="")
    harness.add_settings(parser, "a setting")
    args = parser.parse_args(["--set", "A=8", "--set", 'B={"x": [1]}', "--set", 'C="s"'])
    assert harness.settings(args.set) == {"A": 8, "B": {"x": [1]}, "C": "s"}
    assert parser.description == "Doc line."
    for bad, message in (("A=eight", "is not JSON"), ("A", "expected KEY=JSON")):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["--set", bad])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--quick", "--tiny"])  # one mode at a time


def test_a_set_dict_setting_adds_to_the_benchmarks_own_instead_of_replacing_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    harness = _module("_harness", monkeypatch)
    base = {"EXTENSIONS": {"_crawler.FetchLog": 0}, "ADDONS": {"scrapy_banker.Addon": 500}, "A": 1}
    extra = {"EXTENSIONS": {"my.Ext": 10}, "A": 2, "B": {"x": 1}}
    assert harness.overlaid(base, extra) == {
        "EXTENSIONS": {"_crawler.FetchLog": 0, "my.Ext": 10},
        "ADDONS": {"scrapy_banker.Addon": 500},
        "A": 2,
        "B": {"x": 1},
    }
    assert base["EXTENSIONS"] == {"_crawler.FetchLog": 0}  # not modified in place
    # As the politeness benchmark builds its banker peers' settings.
    politeness = _module("politeness", monkeypatch)
    opts = politeness.Options("asyncio", {"DOWNLOADER_MIDDLEWARES": {"my.Mw": 900},
                                          "ADDONS": {"other.Addon": 1}}, False)  # fmt: skip
    for peer in ("banker_1w", "banker"):
        got = politeness.peer_settings(peer, politeness.QUICK, opts, "redis://x", "w0", 10,
                                       tmp_path / "f")  # fmt: skip
        assert got["DOWNLOADER_MIDDLEWARES"] == {"my.Mw": 900}
        assert "_crawler.FetchLog" in got["EXTENSIONS"]
        if peer == "banker_1w":
            assert got["ADDONS"] == {"scrapy_banker.Addon": 500, "other.Addon": 1}


def test_modes_pick_a_workload_and_options_override_it(monkeypatch: pytest.MonkeyPatch) -> None:
    harness = _module("_harness", monkeypatch)
    skewed = _module("crawl_skewed", monkeypatch)
    parser = harness.parser(None, quick="q", tiny="")
    parser.add_argument("--pages", type=int)
    harness.add_repeats(parser, "r")
    args = parser.parse_args(["--tiny", "--pages", "7"])
    assert harness.mode(args) == "tiny"
    workload = harness.override(
        harness.pick(args, full=skewed.FULL, quick=skewed.QUICK, tiny=skewed.TINY),
        args,
        total_pages="pages",
    )
    assert workload.total_pages == 7 and workload.hosts == skewed.TINY.hosts
    assert harness.mode(parser.parse_args([])) == "full"
    with pytest.raises(SystemExit):
        parser.parse_args(["--repeats", "0"])


def test_the_json_line_has_null_for_what_was_not_measured(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _module("_common", monkeypatch)
    common.emit_json({"b": math.nan, "a": {"x": [1.0, math.inf]}, "c": 3})
    assert capsys.readouterr().out == '{"a": {"x": [1.0, null]}, "b": null, "c": 3}\n'
    assert common.rounded(2) == 2
    assert common.rounded(1.23456, 2) == 1.23
    assert common.rounded(math.nan) is None and common.rounded(True) is None


class _Farm:
    """What a FarmWatch reads of a web farm: a request counter and per-host maxima."""

    def __init__(self) -> None:
        self.requests = 0
        self.inflight: dict[str, int] = {}

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "max_inflight_per_host": dict(self.inflight)}


def test_farm_watch_progress_and_politeness(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _module("_fleet", monkeypatch)
    farm = _Farm()
    watch = fleet.FarmWatch(farm, t0=100.0, interval=0.5, limit=2)
    for t, n, inflight in ((100.0, 0, 0), (100.4, 5, 1), (100.6, 5, 1), (101.2, 9, 3),
                           (102.1, 10, 2), (103.0, 10, 2)):  # fmt: skip
        farm.requests, farm.inflight = n, {"h1": inflight}
        watch.sample(t)
    # 100.4 is skipped (within 0.5 s of the sample at 100.0).
    assert [n for _, n in watch.samples] == [0, 5, 9, 10, 10]
    assert (watch.first_t, watch.first_n, watch.last_t, watch.last_n) == (100.6, 5, 102.1, 10)
    assert watch.busy_s == pytest.approx(1.5)
    assert watch.first_response_s == pytest.approx(0.6)
    assert watch.tail_start(0.9) == 101.2
    assert watch.timeline() == [0, 9, 10, 10]
    assert watch.max_inflight == 3
    assert watch.over == {"h1": (101.2, 100.6, 3)}


def test_repeats_merge_into_medians_and_worst_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _module("_fleet", monkeypatch)
    runs = [{"rate": 1.0, "lost": 0, "name": "a"}, {"rate": math.nan, "lost": 2, "name": "b"},
            {"rate": 3.0, "lost": 1, "name": "c"}]  # fmt: skip
    merged = fleet.merge_repeats(runs, median=("rate",), worst=("lost",),
                                 samples={"rates": "rate"})  # fmt: skip
    assert merged["rate"] == 2.0  # NaN left out
    assert merged["lost"] == 2
    assert merged["name"] == "a"
    assert merged["rates"][0] == 1.0 and len(merged["rates"]) == 3


@pytest.mark.slow
def test_every_benchmark_explains_its_options() -> None:
    scripts = sorted(p.name for p in BENCH.glob("[a-z]*.py"))
    assert "placement.py" in scripts
    for script in scripts:
        proc = run_python(BENCH / script, "--help", timeout=60)
        assert proc.stdout.startswith("usage: "), script


@pytest.mark.slow
def test_control_tiny_holds_budgets_and_obeys_the_operator() -> None:
    result = _run("control.py", "--tiny", timeout=280)
    for key in ("budget_overrun", "budget_underrun", "paused_fetches", "purged", "purged_fetched",
                "pages_missing", "limit_excess", "crawl_budget", "crawl_served"):  # fmt: skip
        assert isinstance(result[key], int) and result[key] >= 0, (key, result[key])
    assert result["heartbeat_s"] == 1.0
    latency = result["control_latency_s"]
    assert isinstance(latency, (int, float)) and latency >= 0
    assert latency == max(result["control_latency_pause_s"], result["control_latency_limit_s"])
    assert 0.0 <= result["injected_fetched"] <= 1.0
    run = result["runs"]
    # Every step of the schedule ran, and the operator's commands all succeeded.
    kinds = [e["kind"] for e in run["phase1"]["events"]]
    assert kinds == ["pause", "limit", "delay", "kill", "purge", "inject", "join", "resume",
                     "limit none"]  # fmt: skip
    assert all(c["code"] == 0 for c in run["phase1"]["operator_calls"])
    # The host was being crawled when it was paused (what it had in flight at that
    # instant may be 0: between two requests), and had pages left (none missing after).
    assert run["phase1"]["busy_at_command"]["paused_inflight"] is not None
    assert [e["kind"] for e in run["phase2"]["events"]] == ["kill", "join"]
    # The targets: exact budgets, the pause and the limit within 2 heartbeats, nothing lost.
    targets = {k: v for k, v in result.items() if k.startswith("target_")}
    assert len(targets) == 7 and result["targets_met"] is True, targets
    assert result["budget_overrun"] == 0 and result["budget_underrun"] == 0
    assert result["paused_fetches"] == 0
    assert latency <= 2 * result["heartbeat_s"]
    assert result["injected_fetched"] == 1.0
    assert result["crawl_served"] == result["crawl_budget"] > 0
    # Every surviving worker closed because the crawl budget was spent.
    assert set(result["crawl_budget_finish_reasons"]) == {"banker_crawl_budget"}


def test_control_limit_latency_replays_the_hosts_requests_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    control = _module("control", monkeypatch)
    # Two in flight at 10.0 (the command returned then); one leaves at 10.4, the other at
    # 10.9; a third arrives at 11.0 and finds one in flight (within the limit of 1).
    events = [[9.0, 1], [9.5, 1], [10.4, -1], [10.9, -1], [11.0, 1], [11.5, -1]]
    latency, excess = control.limit_latency(events, 10.0, 20.0, 1, 2.0)
    assert latency == pytest.approx(0.4) and excess == 0
    # A request at 12.5 puts it over the limit again, later than the 2 s grace: counted,
    # and the limit holds only from when that stretch ends.
    later = [*events, [12.0, 1], [12.5, 1], [13.0, -1], [13.5, -1]]
    latency, excess = control.limit_latency(later, 10.0, 20.0, 1, 2.0)
    assert latency == pytest.approx(3.0) and excess == 1
    # Over the limit when the window ends: never in force within it.
    assert control.limit_latency(later, 10.0, 12.7, 1, 2.0)[0] == pytest.approx(2.7)
    # Already within the limit at the command: 0.
    assert control.limit_latency([[9.0, 1], [9.5, -1]], 10.0, 20.0, 1, 2.0) == (0.0, 0)
