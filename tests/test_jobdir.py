"""Crash-safe JOBDIR: the journal's replay rule, resume after a simulated and a real ``kill -9``.

The pure record format and replay (``scrapy_banker.core.journal``) are tested on
lines; the scheduler's use of them in process (crash = the object is dropped
without ``close``); then real ``scrapy crawl farm`` runs of example_project
killed with SIGKILL at two moments and resumed to completion, counted by the
farm's own per-URL fetch counters.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import scrapy
from conftest import PROJECT
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_banker.core.journal import (
    JournalState,
    UnsupportedSnapshot,
    done_line,
    enqueue_line,
    header_line,
    needs_compaction,
    parse_enqueue,
    seen_lines,
)
from scrapy_banker.ops.jobdir_view import find_in_jobdir, read_jobdir
from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler import jobdir as jobdir_module
from scrapy_banker.testing.farm import FarmConfig, WebFarm

SCRAPY_VERSION = tuple(int(x) for x in scrapy.__version__.split(".")[:2])


# -- the pure journal ------------------------------------------------------------------


def _e(seq: int, fp: str = "", topic: str = "t", payload: str = '{"url":"http://a.test/"}') -> str:
    return enqueue_line(seq, fp or f"{seq:040x}", topic, "a.test", "a.test", 7, 0, payload)


def test_enqueue_record_keeps_the_payload_text_and_odd_strings() -> None:
    payload = '{"url":"http://a.test/?q=\\",\\"r\\":","meta":{"x":[1,2]}}'
    line = enqueue_line(3, "ff", 'to,"r":pic', "s\n", "k\u00e9", 2**40, -5, payload)
    assert line.endswith("}\n") and line.count("\n") == 1
    rec = parse_enqueue(line)
    assert rec.payload == payload  # spliced in and out untouched, never re-encoded
    assert (rec.seq, rec.fingerprint, rec.topic, rec.slot, rec.key) == (
        3, "ff", 'to,"r":pic', "s\n", "k\u00e9"
    )  # fmt: skip
    assert (rec.key_hash, rec.priority) == (2**40, -5)
    assert json.loads(line)["r"] == json.loads(payload)
    with pytest.raises(ValueError):
        parse_enqueue('{"e":1,"f":"x"}\n')
    with pytest.raises(ValueError):
        parse_enqueue('{"e":"1","f":"x","t":"t","s":"s","k":"k","h":1,"p":0,"r":{}}\n')


def test_replay_an_enqueue_without_its_done_is_pending_and_everything_journaled_is_seen() -> None:
    state = JournalState()
    lines = [_e(0), _e(1), _e(2, fp="x" * 40), done_line([0]), _e(3), done_line([2, 3])]
    # seq 4 is a dont_filter request: pending, but never "seen".
    lines.append(enqueue_line(4, "", "t", "s", "k", 1, 0, "{}"))
    state.feed(lines, "journal-0.jsonl", journal=True)
    assert list(state.live) == [1, 4]
    assert state.done == {f"{0:040x}", "x" * 40, f"{3:040x}"}
    assert state.seen() == state.done | {f"{1:040x}"}
    assert state.next_seq == 5 and state.journal_records == 5 + 3
    assert not state.malformed and state.truncated == 0


def test_a_line_cut_by_a_kill_is_skipped_and_counted_other_garbage_is_reported() -> None:
    state = JournalState()
    cut = _e(2)[:25]  # the kill came in the middle of the write
    state.feed([_e(0), "{not json\n", '{"x":1}\n', _e(1), cut], "j", journal=True)
    assert state.truncated == 1
    assert list(state.live) == [0, 1]
    assert [(b.line, b.text) for b in state.malformed] == [(2, "{not json"), (3, '{"x":1}')]
    # The same cut line with records after it is not a kill's tail: it is malformed.
    later = JournalState()
    later.feed([cut, _e(1)], "j", journal=True)
    assert later.truncated == 0 and len(later.malformed) == 1 and list(later.live) == [1]


def test_snapshot_then_journal_and_an_unknown_snapshot_version_is_refused() -> None:
    state = JournalState()
    snapshot = [header_line(4, 10, 1, 2, None, None), *seen_lines(["aa", "bb"], per_line=1), _e(7)]
    state.feed(snapshot, "snapshot.jsonl", journal=False)
    state.feed([_e(10), done_line([7])], "journal-4.jsonl", journal=True)
    assert state.header is not None and state.header["generation"] == 4
    assert list(state.live) == [10] and state.done == {"aa", "bb", f"{7:040x}"}
    assert state.next_seq == 11
    bad = header_line(1, 0, 0, 0, None, None).replace('"version":2', '"version":99')
    with pytest.raises(UnsupportedSnapshot, match="version 99"):
        JournalState().feed([bad], "snapshot.jsonl", journal=False)


def test_compaction_rule_is_amortised_and_bounded() -> None:
    assert not needs_compaction(99, 10, 100)
    assert needs_compaction(100, 10, 100)
    assert not needs_compaction(500, 600, 100)
    assert needs_compaction(600, 600, 100)


# -- the scheduler, in process -----------------------------------------------------------


class _Spider(Spider):
    name = "s"

    def parse_page(self, response: Any) -> None:
        pass


def _open(tmp_path: Path, engine: bool = True, **settings: Any) -> Any:
    """A scheduler with JOBDIR; ``engine``: a fake engine whose in-progress set tests fill."""
    crawler = get_crawler(_Spider, {"JOBDIR": str(tmp_path / "job"), **settings})
    crawler.spider = _Spider.from_crawler(crawler)
    if engine:
        crawler.engine = SimpleNamespace(_slot=SimpleNamespace(inprogress=set()))
    scheduler = BankerScheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    return scheduler


def _inprogress(scheduler: Any) -> set[Request]:
    return scheduler.crawler.engine._slot.inprogress  # type: ignore[no-any-return]


def _crash(scheduler: Any) -> None:
    """What ``kill -9`` leaves: no close, no save; only what reached the kernel."""
    scheduler.store.jobdir.close_journal()


def _req(i: int, **kw: Any) -> Request:
    return Request(f"http://h{i % 5}.test/p/{i}", priority=i % 3, **kw)


def _dispatch(scheduler: Any, n: int) -> list[Request]:
    """Hand out ``n`` requests as the engine would (into its in-progress set)."""
    out = []
    for _ in range(n):
        request = scheduler.next_request()
        assert request is not None
        _inprogress(scheduler).add(request)
        out.append(request)
    return out


def _finish(scheduler: Any, requests: list[Request]) -> None:
    """Their callbacks' output is scheduled: the engine forgets them."""
    for request in requests:
        scheduler.release(request, "response")
        _inprogress(scheduler).discard(request)
    scheduler.store.refill(0.0)


def _journal_lines(tmp_path: Path) -> list[str]:
    banker = tmp_path / "job" / "banker"
    return [ln for p in sorted(banker.glob("journal-*.jsonl")) for ln in p.read_text().splitlines()]


def test_kill_resumes_every_pending_and_in_flight_request_and_keeps_the_seen_set(
    tmp_path: Path,
) -> None:
    first = _open(tmp_path)
    for i in range(30):
        assert first.enqueue_request(_req(i))
    assert first.enqueue_request(_req(99, dont_filter=True))
    served = _dispatch(first, 10)
    _finish(first, served[:4])  # 4 done; 6 still in flight at the kill
    _crash(first)

    second = _open(tmp_path)
    assert len(second) == 31 - 4
    assert second.stats.get_value("banker/jobdir/restored") == 27
    assert second.stats.get_value("banker/jobdir/replayed") > 0
    # Done, pending and in-flight URLs are all seen; nothing else is.
    for request in [*served, _req(20)]:
        assert not second.enqueue_request(request.replace(dont_filter=False))
    assert second.enqueue_request(_req(1000))
    urls = sorted(r.url for r in iter(second.next_request, None))
    done = {r.url for r in served[:4]}
    assert urls == sorted({_req(i).url for i in range(30)} - done | {_req(99).url, _req(1000).url})
    # The replayed journal was compacted away: the new run appends to a fresh one.
    assert second.stats.get_value("banker/jobdir/compactions") == 1


def test_a_request_is_done_only_after_its_children_are_journaled(tmp_path: Path) -> None:
    first = _open(tmp_path)
    first.enqueue_request(_req(0))
    (parent,) = _dispatch(first, 1)
    first.release(parent, "response")  # response in, callback still running
    first.store.refill(0.0)
    assert not any(line.startswith('{"d":') for line in _journal_lines(tmp_path))
    child = _req(1)
    first.enqueue_request(child)  # the callback yields a child...
    _finish(first, [parent])  # ...then the engine is done with the parent
    lines = _journal_lines(tmp_path)
    child_at = next(i for i, ln in enumerate(lines) if child.url in ln)
    done_at = next(i for i, ln in enumerate(lines) if ln.startswith('{"d":'))
    assert child_at < done_at
    # A kill while the callback runs: the parent comes back, its output is redone.
    second_dir = tmp_path / "second"
    again = _open(second_dir)
    again.enqueue_request(_req(0))
    (p2,) = _dispatch(again, 1)
    again.release(p2, "response")
    again.store.refill(0.0)
    _crash(again)
    resumed = _open(second_dir)
    assert [r.url for r in iter(resumed.next_request, None)] == [p2.url]


def test_compaction_keeps_the_journal_bounded_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobdir_module, "COMPACT_MIN_RECORDS", 40)
    scheduler = _open(tmp_path)
    rng = random.Random(5)
    expected_pending: set[str] = set()
    longest = 0
    for i in range(600):
        request = _req(i)
        scheduler.enqueue_request(request)
        expected_pending.add(request.url)
        if rng.random() < 0.7:
            (out,) = _dispatch(scheduler, 1)
            _finish(scheduler, [out])
            expected_pending.discard(out.url)
        longest = max(longest, len(_journal_lines(tmp_path)))
    compactions = scheduler.stats.get_value("banker/jobdir/compactions")
    assert compactions >= 5
    snapshot_records = scheduler.store.jobdir.snapshot_records
    # Records, not lines: a D line may carry several; bounded by the state, not the crawl.
    assert longest <= max(40, snapshot_records) + 1
    _crash(scheduler)
    resumed = _open(tmp_path)
    assert {r.url for r in iter(resumed.next_request, None)} == expected_pending
    assert not resumed.enqueue_request(_req(3))  # done long ago, compacted into the snapshot
    assert len(list((tmp_path / "job" / "banker").glob("journal-*.jsonl"))) == 1


def test_a_truncated_journal_line_is_skipped_counted_and_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _open(tmp_path)
    for i in range(5):
        first.enqueue_request(_req(i))
    _crash(first)
    journal = next((tmp_path / "job" / "banker").glob("journal-*.jsonl"))
    with journal.open("a") as f:
        f.write(_e(77)[:30])  # killed mid-write
    second = _open(tmp_path)
    assert second.stats.get_value("banker/jobdir/truncated") == 1
    assert second.stats.get_value("banker/jobdir/malformed") is None
    assert len(second) == 5
    assert "cut short by a kill" in caplog.text
    # Compacted at once: the next run never appends after a half line.
    assert all(ln.endswith("}") for ln in _journal_lines(tmp_path))


def test_a_clean_stop_keeps_requests_in_flight_and_writes_no_requests_seen(
    tmp_path: Path,
) -> None:
    first = _open(tmp_path)
    for i in range(8):
        first.enqueue_request(_req(i))
    served = _dispatch(first, 3)
    _finish(first, served[:1])
    first.close("shutdown")  # two still in flight: their responses are dropped
    assert first.stats.get_value("banker/jobdir/saved") == 7
    assert (tmp_path / "job" / "requests.seen").stat().st_size == 0
    view = read_jobdir(str(tmp_path / "job"))
    assert view.pending == view.queued == 7 and view.seen == 8
    assert view.n_buckets is not None  # a clean stop saves the directory
    second = _open(tmp_path)
    assert len(second) == 7
    assert second.stats.get_value("banker/jobdir/replayed") is None  # nothing to replay


def _write_seen(path: Path, fingerprints: list[bytes]) -> None:
    """``requests.seen`` as this Scrapy writes it: binary from 2.14, hex lines before."""
    if SCRAPY_VERSION >= (2, 14):
        path.write_bytes(b"".join(len(fp).to_bytes(2, "big") + fp for fp in fingerprints))
    else:
        path.write_text("".join(fp.hex() + "\n" for fp in fingerprints))


def test_requests_seen_without_journal_records_does_not_block_a_url(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    _write_seen(job / "requests.seen",
                [get_crawler(_Spider).request_fingerprinter.fingerprint(_req(1))])  # fmt: skip
    scheduler = _open(tmp_path)
    assert scheduler.enqueue_request(_req(1))
    assert "Ignoring 1 fingerprints of JOBDIR/requests.seen" in caplog.text


def test_malformed_journal_entries_are_dead_lettered(tmp_path: Path) -> None:
    first = _open(tmp_path)
    for i in range(6):
        first.enqueue_request(_req(i))
    _crash(first)
    journal = next((tmp_path / "job" / "banker").glob("journal-*.jsonl"))
    lines = journal.read_text().splitlines(keepends=True)
    lines[0] = re.sub(r'"_class":"[^"]*"', '"_class":"os.system"', lines[0])
    if '"_class"' not in lines[0]:
        lines[0] = lines[0].replace('"r":{', '"r":{"_class":"os.system",')
    lines.insert(2, "{not json\n")
    journal.write_text("".join(lines))
    second = _open(tmp_path)
    assert second.stats.get_value("banker/jobdir/malformed") == 2
    assert len(second) == 5
    dead = [json.loads(x) for x in (tmp_path / "job" / "banker-deadletter.jsonl").read_text()
            .splitlines()]  # fmt: skip
    assert len(dead) == 2 and any("not allow-listed" in d["error"] for d in dead)
    view = read_jobdir(str(tmp_path / "job"))
    assert view.dead_letter_kinds == {"restore": 2}
    # Dropped from the files by the resume's compaction: not dead-lettered twice.
    second.close("shutdown")
    _open(tmp_path)
    assert len((tmp_path / "job" / "banker-deadletter.jsonl").read_text().splitlines()) == 2


# -- the operator's view: explain against a JOBDIR ----------------------------------------


def test_explain_finds_a_pending_request_by_fingerprint_and_a_done_one_in_the_seen_set(
    tmp_path: Path,
) -> None:
    first = _open(tmp_path)
    spider = first.spider
    for i in range(20):
        first.enqueue_request(_req(i, callback=spider.parse_page, cb_kwargs={"i": i}))
    done = _dispatch(first, 5)
    _finish(first, done)
    first.close("shutdown")
    job = tmp_path / "job"
    fingerprinter = first.crawler.request_fingerprinter

    def fingerprint(r: Request) -> str:
        return str(fingerprinter.fingerprint(r).hex())

    pending = next(_req(i) for i in range(20) if _req(i).url not in {r.url for r in done})
    found = find_in_jobdir(str(job), pending, 0, fingerprint)
    assert found.state == "queued" and found.seen is True and found.entry is not None
    assert found.bucket == found.entry.bucket and found.ahead is not None
    assert find_in_jobdir(str(job), done[0], 0, fingerprint).state == "done"
    assert find_in_jobdir(str(job), _req(1000), 0, fingerprint).state == "unknown"
    resumed = _open(tmp_path)
    rest = list(iter(resumed.next_request, None))
    assert sorted(r.url for r in rest) == sorted({_req(i).url for i in range(20)}
                                                 - {r.url for r in done})  # fmt: skip
    assert rest[0].callback == resumed.spider.parse_page and "i" in rest[0].cb_kwargs


# -- real crawls, killed ---------------------------------------------------------------------


KILL_CONFIG = FarmConfig(seed=11, hosts=24, total_pages=1400, latency_ms=15.0)
#: A wrapper so a crawl can compact often (the threshold is a module constant).
_CRAWL = (
    "import sys; import scrapy_banker.scheduler.jobdir as j; "
    "j.COMPACT_MIN_RECORDS = int(sys.argv.pop(1)); "
    "from scrapy.cmdline import execute; execute(['scrapy', *sys.argv[1:]])"
)


def _start(farm: WebFarm, jobdir: Path, compact_min: int, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", _CRAWL, str(compact_min), "crawl", "farm",
             "-a", f"port={farm.port}", "-a", f"hosts={farm.model.hosts}",
             "-s", f"JOBDIR={jobdir}", "-s", "LOG_LEVEL=INFO",
             "-s", "SCRAPER_SLOT_MAX_ACTIVE_SIZE=1"],
            cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=err, text=True,
            env={**os.environ, "PYTHONPATH": str(PROJECT)},
        )  # fmt: skip


@pytest.mark.slow
def test_kill_9_early_and_mid_crawl_then_resume_fetches_every_page(tmp_path: Path) -> None:
    rng = random.Random(18)
    jobdir = tmp_path / "job"
    with WebFarm(KILL_CONFIG) as farm:
        expected = farm.expected_urls()
        kills = []
        # Early (start requests still being queued) and mid-crawl, the second
        # run compacting every 200 records so a kill can land around one.
        for n, (at, compact_min) in enumerate(
            ((rng.randint(10, 60), 100_000), (rng.randint(500, 700), 200))
        ):
            before = farm.stats()["requests"]
            log = tmp_path / f"run{n}.log"
            proc = _start(farm, jobdir, compact_min, log)
            deadline = time.monotonic() + 90
            while farm.stats()["requests"] - before < at:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.005)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            kills.append(farm.stats()["requests"] - before)
        log = tmp_path / "final.log"
        final = _start(farm, jobdir, 100_000, log)
        final.wait(timeout=180)
        err = log.read_text()
        assert final.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        fetches: dict[str, int] = farm.stats(urls=True)["fetches"]
    # The second run resumed from the first one's journal (the third may find it just compacted).
    assert "journal records replayed" in (tmp_path / "run1.log").read_text()
    fetched = {u for u in fetches if not urlsplit(u).path.startswith("/__farm__")}
    missing = expected - fetched
    duplicates = sum(n - 1 for u, n in fetches.items() if u in fetched)
    print(f"kill -9 after {kills} fetches: {len(fetched & expected)}/{len(expected)} pages, "
          f"{duplicates} duplicate fetches (bound {2 * 32})")  # fmt: skip
    assert not missing, sorted(missing)[:10]
    assert fetched <= expected
    # At most the requests in flight at each kill are fetched again: with the scraper
    # taking one response at a time (SCRAPER_SLOT_MAX_ACTIVE_SIZE=1) that is at most
    # CONCURRENT_REQUESTS = 32 (with Scrapy's default, add the responses waiting for callbacks).
    assert duplicates <= 2 * 32


def test_a_reader_racing_a_compaction_sees_every_pending_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scrapy banker`` reads a JOBDIR its crawl compacts: the snapshot may be
    replaced (and its journal removed) between the two reads of a replay."""
    scheduler = _open(tmp_path)
    for i in range(10):
        assert scheduler.enqueue_request(_req(i))
    store = scheduler.store
    path = store.jobdir.path
    compacted: list[bool] = []
    real = jobdir_module.read_lines

    def read_lines(name: str) -> Any:
        if name.endswith(".jsonl") and "journal-" in name and not compacted:
            compacted.append(True)
            store._compact()  # the crawl compacts right after the snapshot was read
        return real(name)

    monkeypatch.setattr(jobdir_module, "read_lines", read_lines)
    state, _ = jobdir_module.replay(path)
    assert compacted  # the race happened...
    assert len(state.live) == 10  # ...and the replay still saw every pending request
    scheduler.close("shutdown")
