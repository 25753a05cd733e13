"""Admission control in the scheduler: grants, parking, releases on every path, timeouts."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
from scrapy import Request, Spider, signals
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_banker.middlewares import BankerDownloaderMiddleware
from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler.admission import Admission


class Slot:
    def __init__(self) -> None:
        self.active: set[Request] = set()
        self.concurrency = 100


class Downloader:
    def __init__(self) -> None:
        self.slots: dict[str, Slot] = {}
        self.active: set[Request] = set()

    def get_slot_key(self, request: Request) -> str:
        return urlsplit(request.url).hostname or ""


def _open(settings: dict[str, Any] | None = None) -> Any:
    crawler = get_crawler(
        Spider, {"BANKER_RESOURCES": {"pages": 2, "sessions": 1}, **(settings or {})}
    )
    crawler.spider = Spider.from_crawler(crawler, "s")
    scheduler = BankerScheduler.from_crawler(crawler)
    downloader = Downloader()
    crawler.engine = SimpleNamespace(downloader=downloader, scheduler=scheduler)
    scheduler.open(crawler.spider)
    scheduler.dl = downloader
    return scheduler


def _dispatch(scheduler: Any) -> Request | None:
    """next_request, and the request counts as in the downloader until it ends."""
    request = scheduler.next_request()
    if request is not None:
        scheduler.dl.active.add(request)
    return request


def _end(scheduler: Any, request: Request, how: str = "response") -> None:
    scheduler.dl.active.discard(request)
    mw = BankerDownloaderMiddleware.from_crawler(scheduler.crawler)
    if how == "response":
        mw.process_response(request, HtmlResponse(request.url, body=b"", request=request))
    elif how == "exception":
        mw.process_exception(request, TimeoutError())
    elif how == "left":
        scheduler.crawler.signals.send_catch_log(signals.request_left_downloader, request=request)
    elif how == "dropped":
        # A copy the scheduler refuses (here: a duplicate) carries the original's grant.
        assert scheduler.enqueue_request(request.replace()) is False


def task(url: str, name: str, need: int = 1, **meta: Any) -> Request:
    return Request(
        url,
        meta={
            "banker_task": name,
            "banker_max": {"pages": 2},
            "banker_need": {"pages": need},
            **meta,
        },
    )


def test_requests_without_claims_are_not_gated() -> None:
    scheduler = _open()
    for i in range(5):
        scheduler.enqueue_request(Request(f"http://h{i}.test/"))
    assert all(_dispatch(scheduler) is not None for _ in range(5))
    assert scheduler.stats.get_value("banker/admission/granted") is None


def test_unsafe_request_waits_without_polling_and_runs_after_release() -> None:
    scheduler = _open()
    a1 = task("http://a.test/1", "A", banker_hold=True)
    b1 = task("http://b.test/1", "B", banker_hold=True)
    scheduler.enqueue_request(a1)
    scheduler.enqueue_request(b1)
    got = _dispatch(scheduler)
    assert got is a1
    # B's first page would leave 0 free with both tasks needing one more: unsafe.
    assert _dispatch(scheduler) is None
    assert scheduler.has_pending_requests() and len(scheduler) == 1
    assert scheduler.stats.get_value("banker/admission/deferred/unsafe") == 1
    # Nothing released: asking again does not re-evaluate (no busy loop).
    assert _dispatch(scheduler) is None
    assert scheduler.stats.get_value("banker/admission/deferred/unsafe") == 1
    _end(scheduler, a1)  # A holds its page (banker_hold)
    a2 = task("http://a.test/2", "A", banker_finish=True)
    scheduler.enqueue_request(a2)
    assert _dispatch(scheduler) is a2
    _end(scheduler, a2)  # A finished: both its pages come back
    assert scheduler.stats.get_value("banker/task/finished") == 1
    assert _dispatch(scheduler) is b1
    stats = scheduler.stats.get_stats()
    assert stats["banker/topic/default/admission_max_wait_s"] >= 0
    assert stats["banker/alloc/pages"] == 1  # B's page


@pytest.mark.parametrize("how", ["response", "exception", "left", "dropped"])
def test_every_end_path_releases_exactly_once(how: str) -> None:
    scheduler = _open()
    req = Request("http://a.test/", meta={"banker_need": {"pages": 2}})
    scheduler.enqueue_request(req)
    assert _dispatch(scheduler) is req
    assert scheduler.admission.state.available.tolist() == [0, 1]
    _end(scheduler, req, how)
    assert scheduler.admission.state.available.tolist() == [2, 1]
    # Retry/redirect copies meta: the copy must not release again...
    retry = req.replace(dont_filter=True)
    _end(scheduler, retry, "response")
    _end(scheduler, req, "exception")
    assert scheduler.admission.state.available.tolist() == [2, 1]
    # ...and is granted afresh when dispatched.
    scheduler.enqueue_request(retry)
    assert _dispatch(scheduler) is retry
    assert scheduler.admission.state.available.tolist() == [0, 1]
    _end(scheduler, retry)
    scheduler.close("finished")
    stats = scheduler.stats.get_stats()
    assert stats["banker/alloc/leaked/pages"] == 0
    assert stats["banker/alloc/pages"] == 0


def test_leak_is_reported_at_close(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = _open()
    req = Request("http://a.test/", meta={"banker_need": {"pages": 1}})
    scheduler.enqueue_request(req)
    _dispatch(scheduler)
    with caplog.at_level(logging.ERROR):
        scheduler.close("finished")  # the request never ended: a leak
    assert scheduler.stats.get_value("banker/alloc/leaked/pages") == 1
    assert scheduler.stats.get_value("banker/alloc/pages") == 0
    assert "leak" in caplog.text


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"banker_need": {"gpus": 1}}, "unknown resource 'gpus'"),
        ({"banker_need": {"pages": -1}}, "expected an int >= 0"),
        ({"banker_need": ["pages"]}, "expected a dict"),
        ({"banker_need": {"pages": 3}}, "more than the total 2"),
        ({"banker_task": ["x"], "banker_need": {"pages": 1}}, "expected a str or int"),
        (
            {"banker_task": "t", "banker_max": {"pages": 1}, "banker_need": {"pages": 2}},
            "declared need is 1",
        ),
    ],
)
def test_invalid_claims_are_logged_counted_and_dropped(
    meta: dict[str, Any], match: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = _open()
    scheduler.enqueue_request(Request("http://a.test/bad", meta=meta))
    scheduler.enqueue_request(Request("http://a.test/ok"))
    with caplog.at_level(logging.ERROR):
        got = _dispatch(scheduler)
    assert got is not None and got.url.endswith("/ok")
    assert scheduler.stats.get_value("banker/admission/invalid") == 1
    assert match in caplog.text


def test_idle_task_is_reclaimed_after_timeout(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = _open({"BANKER_TASK_TIMEOUT": 5})
    clock = [100.0]
    scheduler.clock = scheduler.admission.clock = lambda: clock[0]
    a1 = task("http://a.test/1", "A", banker_hold=True)
    scheduler.enqueue_request(a1)
    _dispatch(scheduler)
    _end(scheduler, a1)
    assert scheduler.admission.state.available.tolist() == [1, 1]  # held by A
    clock[0] += 6
    with caplog.at_level(logging.WARNING):
        assert _dispatch(scheduler) is None  # the periodic reclaim runs here
    assert scheduler.admission.state.available.tolist() == [2, 1]
    assert scheduler.stats.get_value("banker/task/reclaimed_timeout") == 1
    assert "BANKER_TASK_TIMEOUT" in caplog.text


def test_a_stall_on_idle_holders_is_explained(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = _open({"BANKER_TASK_TIMEOUT": 60})
    clock = [10.0]
    scheduler.clock = scheduler.admission.clock = lambda: clock[0]
    holders = [
        Request(
            f"http://h{i}.test/",
            meta={"banker_task": f"t{i}", "banker_need": {"sessions": 1}, "banker_hold": True},
        )
        for i in range(2)
    ]
    for req in holders:
        scheduler.enqueue_request(req)
    first = _dispatch(scheduler)
    assert _dispatch(scheduler) is None  # only one session
    _end(scheduler, first)  # t0 keeps its session, nothing in flight
    with caplog.at_level(logging.WARNING):
        assert _dispatch(scheduler) is None
        # Not yet: the callback of t0's response may still yield its next step.
        assert "requests wait for resources" not in caplog.text
        clock[0] += 6
        assert _dispatch(scheduler) is None
    assert "1 requests wait for resources held by tasks with no request in flight" in caplog.text
    assert "BANKER_TASK_TIMEOUT=60s" in caplog.text
    assert "sessions" in caplog.text  # the state is printed


def test_a_started_task_is_not_starved_by_new_tasks_parked_before_it() -> None:
    """Regression: after a release every parked request that fits is retried."""
    scheduler = _open({"BANKER_RESOURCES": {"pages": 4}})
    starts = {
        name: Request(
            f"http://{name}.test/1",
            meta={
                "banker_task": name,
                "banker_max": {"pages": 2},
                "banker_need": {"pages": 1},
                "banker_hold": True,
            },
        )
        for name in "ABCDE"
    }
    for name in "ABC":
        scheduler.enqueue_request(starts[name])
        assert _dispatch(scheduler) is starts[name]
        _end(scheduler, starts[name])  # A, B, C each hold 1 page: 1 free
    for name in "DE":
        scheduler.enqueue_request(starts[name])
    assert _dispatch(scheduler) is None  # D and E: unsafe, parked first
    steps = {n: task(f"http://{n}.test/2", n, banker_finish=True) for n in "ABC"}
    for n in "ABC":
        scheduler.enqueue_request(steps[n])
    got = _dispatch(scheduler)
    assert got is steps["A"]  # A's second page is safe: it goes
    assert _dispatch(scheduler) is None
    _end(scheduler, got)  # A finishes: 3 free, B and C hold 1 each
    served = []
    while (req := _dispatch(scheduler)) is not None:
        served.append(req.url)
        _end(scheduler, req)
    # B's and C's second steps (parked after D and E) are not left behind.
    assert "http://b.test/2" in served and "http://c.test/2" in served  # hosts are lower-cased


def test_a_reclaim_frees_resources_for_the_same_call() -> None:
    scheduler = _open({"BANKER_TASK_TIMEOUT": 5, "BANKER_RESOURCES": {"pages": 1}})
    clock = [0.0]
    scheduler.clock = scheduler.admission.clock = lambda: clock[0]
    holder = task("http://a.test/1", "A", banker_hold=True)
    holder.meta["banker_max"] = {"pages": 1}
    scheduler.enqueue_request(holder)
    _end(scheduler, _dispatch(scheduler))
    waiter = Request("http://b.test/", meta={"banker_need": {"pages": 1}})
    scheduler.enqueue_request(waiter)
    assert _dispatch(scheduler) is None
    clock[0] += 6
    assert _dispatch(scheduler) is waiter  # reclaimed and re-queued in one call


def test_explicit_finish_and_topic_claims() -> None:
    scheduler = _open(
        {
            "BANKER_TASK_CLAIMS": {"shop": {"pages": 1, "sessions": 1}},
            "BANKER_TOPIC_RULES": [{"url": "/shop/", "topic": "shop"}],
        }
    )
    login = Request(
        "http://s.test/shop/login",
        meta={"banker_task": "u1", "banker_need": {"sessions": 1}, "banker_hold": True},
    )
    scheduler.enqueue_request(login)
    assert _dispatch(scheduler) is login
    _end(scheduler, login)
    assert scheduler.admission.state.max_of("u1") == {"pages": 1, "sessions": 1}
    assert scheduler.admission.finish_task("u1")
    assert scheduler.admission.state.available.tolist() == [2, 1]
    assert not scheduler.admission.finish_task("u1")


def test_parked_requests_survive_jobdir(tmp_path: Any) -> None:
    settings = {"JOBDIR": str(tmp_path / "job")}
    scheduler = _open(settings)
    scheduler.enqueue_request(Request("http://a.test/1", meta={"banker_need": {"pages": 2}}))
    scheduler.enqueue_request(Request("http://b.test/1", meta={"banker_need": {"pages": 2}}))
    first = _dispatch(scheduler)
    assert _dispatch(scheduler) is None  # parked: insufficient
    assert first is not None
    scheduler.close("shutdown")
    # The parked request, and the one still in flight at the stop: the
    # crash-safe JOBDIR keeps what was not finished (fetched again on resume).
    assert scheduler.stats.get_value("banker/jobdir/saved") == 2
    resumed = _open(settings)
    got = _dispatch(resumed)
    assert got is not None and got.url in {"http://a.test/1", "http://b.test/1"}
    assert _dispatch(resumed) is None  # the other parks again: 2 + 2 pages > 2


def test_admission_naive_policy_grants_unsafe_requests() -> None:
    scheduler = _open({"BANKER_ADMISSION_POLICY": "naive"})
    scheduler.enqueue_request(task("http://a.test/1", "A", banker_hold=True))
    scheduler.enqueue_request(task("http://b.test/1", "B", banker_hold=True))
    assert _dispatch(scheduler) is not None
    assert _dispatch(scheduler) is not None  # first come, first served: deadlock-prone


def test_admission_rejects_bad_policy() -> None:
    with pytest.raises(ValueError, match="'banker' or 'naive'"):
        Admission({"pages": 1}, stats=None, policy="random")  # type: ignore[arg-type]


def test_describe_prints_the_state() -> None:
    scheduler = _open()
    scheduler.enqueue_request(task("http://a.test/1", "A"))
    _dispatch(scheduler)
    text = scheduler.admission.describe()
    assert "available" in text and "A" in text
