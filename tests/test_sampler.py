"""The sampler: one Sample from a scheduler's real parts, and the pieces it reads."""

from __future__ import annotations

import math
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_banker.core.bankers_algorithm import BankersState
from scrapy_banker.core.telemetry import sample_from_dict
from scrapy_banker.net.placement import Observations, PlacementProblem, strategy
from scrapy_banker.redis.worker.placement_agent import plan_sample
from scrapy_banker.scheduler import BankerScheduler


def _scheduler(settings: dict[str, Any]) -> Any:
    crawler = get_crawler(Spider, settings)
    crawler.spider = Spider.from_crawler(crawler, "s")
    scheduler = BankerScheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    return scheduler


def test_need_total_sums_claims_minus_allocations_of_live_processes() -> None:
    state = BankersState({"a": 5, "b": 3})
    state.add_process("t1", {"a": 3, "b": 1})
    state.add_process("t2", {"a": 2, "b": 2})
    assert state.request("t1", {"a": 2})
    assert state.need_total() == {"a": 3, "b": 3}  # t1: 1 a + 1 b, t2: 2 a + 2 b
    state.finish("t2")  # a finished process no longer needs anything
    assert state.need_total() == {"a": 1, "b": 1}


def test_a_sample_counts_topics_slots_and_the_bankers_state() -> None:
    scheduler = _scheduler(
        {
            "BANKER_TOPIC_RULES": [{"url": "/news/", "topic": "news"}],
            "BANKER_RESOURCES": {"sessions": 3},
            "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        }
    )
    urls = [f"http://a.test/news/{i}" for i in range(5)]
    urls += [f"http://b.test/x/{i}" for i in range(3)] + ["http://c.test/news/0"]
    for url in urls:
        assert scheduler.enqueue_request(Request(url))
    dispatched = [scheduler.next_request() for _ in range(4)]
    assert all(r is not None for r in dispatched)
    scheduler.stats.set_value("banker/topic/news/responses", 4)

    sample = scheduler.sample(top_slots=2)
    assert set(sample.topics) == {"news", "default"}
    assert sample.topics["news"].pages == 4 and sample.topics["default"].pages == 0
    assert sample.pages == 4
    assert sum(t.queued for t in sample.topics.values()) == sample.queued == len(scheduler) == 5
    # No downloader here: a slot's transfers are what was handed out, within its limit.
    assert len(sample.slots) <= 2
    handed = scheduler.parts.downloader.inflight
    assert [s.inflight for s in sample.slots] == sorted(handed.values(), reverse=True)[:2]
    assert all(s.limit == 4 and s.inflight <= s.limit for s in sample.slots)
    for s in sample.slots:
        assert s.queued == scheduler.queue.frontier.slot_backlog(s.slot)
    assert sample.inflight == 0  # nothing is in a downloader
    assert sample.banker is not None
    assert sample.banker.total == sample.banker.available == {"sessions": 3}
    assert sample.banker.allocated == sample.banker.need == {"sessions": 0}
    assert sample.fleet is None and sample.placement is None
    assert sample.node
    # The sample is what the record stores: it survives its JSON form.
    assert sample_from_dict(sample.to_dict()) == sample
    assert scheduler.sample(top_slots=0).slots == ()


def test_a_plan_sample_has_the_gnp_map_and_every_site_assigned() -> None:
    # Three nodes and six sites on a plane; one pair unmeasured, so GNP fits
    # (and predicts it).
    nodes = {"n0": (0.0, 0.0), "n1": (100.0, 0.0), "n2": (0.0, 100.0)}
    sites = {f"s{j}.test": (20.0 * j, 10.0 * (j % 3)) for j in range(6)}
    rtt = {
        n: {s: 1.0 + math.dist(p, q) for s, q in sites.items() if (n, s) != ("n0", "s5.test")}
        for n, p in nodes.items()
    }
    obs = Observations(
        {n: 1.0 for n in nodes}, {p: s for p, s in enumerate(sorted(sites))}, rtt_ms=rtt
    )
    problem = PlacementProblem(obs, current={p: "n1" for p in range(6)}, dims=2)
    result = strategy("top1").place(problem)
    plan = plan_sample("top1", problem, result)
    assert plan.mode == "top1"
    assert set(plan.nodes) == set(nodes) and set(plan.sites) == set(sites)
    assert {len(xs) for xs in (*plan.nodes.values(), *plan.sites.values())} == {2}
    assert set(plan.assignment) == set(sites)
    assert plan.assignment == {obs.sites[p]: node for p, node in result.owners.items()}
