"""A single node's dead letters: ``scrapy banker deadletters --jobdir`` and the JOBDIR lock.

The pure part (:mod:`scrapy_banker.ops.jobdir_deadletters`: reading letters,
choosing, building the new ``E`` records) is tested on lines; requeue and
the lock against JOBDIRs written by real schedulers in process (a resume
dead-letters an entry whose callback the spider lacks, a requeue puts it
back, the next resume fetches it); the command in process for its output
and bad input.  One end-to-end test runs the real thing: ``scrapy crawl``
of a small project against the web farm dead-letters a ``CrawlSpider``
entry (``_callback``), ``scrapy banker deadletters`` is refused while the
JOBDIR is locked and then requeues it, and a resumed crawl fetches it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import child_env, run_scrapy
from scrapy import Request, Spider
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler

from scrapy_banker.core.hashing import bkdr
from scrapy_banker.core.journal import enqueue_line, parse_enqueue
from scrapy_banker.ops import jobdir_deadletters as dl
from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands import deadletters as command
from scrapy_banker.scheduler import BankerScheduler
from scrapy_banker.scheduler.jobdir import JobdirLock, JobdirLocked, replay
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.testing.farm import FarmConfig, WebFarm

CODEC = RequestCodec()


def _fp(url: str) -> str:
    return RequestFingerprinter().fingerprint(Request(url)).hex()


def _e(seq: int, url: str, payload: str | None = None, fp: str | None = None) -> str:
    payload = payload if payload is not None else CODEC.encode(Request(url))
    return enqueue_line(seq, _fp(url) if fp is None else fp, "default", "a.test", "a.test",
                        bkdr("a.test"), 3, payload)  # fmt: skip


def _restore_letter(line: str, error: str = "callback 'parse_later' is missing") -> str:
    return json.dumps({"file": "journal-0.jsonl", "line": 1, "error": error,
                       "payload": line.rstrip("\n"), "when": "restore"})  # fmt: skip


# -- the pure part ----------------------------------------------------------------------


def test_letters_are_read_with_what_they_would_fetch_and_whether_they_can_be_requeued() -> None:
    crawl_spider = _payload_with_callback("http://a.test/c", "_callback")
    dotted = _payload_with_callback("http://a.test/d", "os.system")
    evil = CODEC.payload_dict(CODEC.encode(Request("http://a.test/evil")))
    evil["_class"] = "os.system"
    save = {"url": "http://a.test/mem", "method": "POST", "error": "not serializable",
            "when": "save"}  # fmt: skip
    lines = [
        _restore_letter(_e(4, "http://a.test/c", crawl_spider)),
        _restore_letter(_e(5, "http://a.test/evil", json.dumps(evil)), "not allow-listed"),
        _restore_letter(_e(6, "http://a.test/d", dotted)),
        _restore_letter("{not json", "Expecting property name"),
        json.dumps(save),
        "",
        "garbage",
    ]
    letters = [dl.parse_letter(n, text, CODEC) for n, text in enumerate(lines, 1) if text]
    ok, bad_class, bad_name, not_e, save, unreadable = letters
    # CrawlSpider's private callback: fine without a spider, requeued as is.
    assert ok.requeueable and ok.payload_error is None and ok.why_not is None
    assert (ok.url, ok.callback, ok.topic, ok.priority) == ("http://a.test/c", "_callback",
                                                            "default", 3)  # fmt: skip
    assert ok.fingerprint == _fp("http://a.test/c") and ok.source == "journal-0.jsonl:1"
    assert ok.record is not None and ok.record.seq == 4
    # What the codec refuses is the payload's error; such letters are still requeueable.
    assert bad_class.requeueable and "not allow-listed" in (bad_class.payload_error or "")
    assert bad_name.requeueable and "not a single identifier" in (bad_name.payload_error or "")
    assert not not_e.requeueable and "not a journal E record" in (not_e.why_not or "")
    assert not save.requeueable and "clean stop" in (save.why_not or "")
    assert (save.url, save.method, save.line) == ("http://a.test/mem", "POST", 5)
    assert unreadable.when == "unreadable" and unreadable.line == 7
    assert json.loads(json.dumps(ok.to_json()))["requeueable"] is True


def _payload_with_callback(url: str, name: str) -> str:
    raw = json.loads(CODEC.encode(Request(url)))
    raw["callback"] = name
    return json.dumps(raw, separators=(",", ":"))


def test_plan_takes_the_first_n_requeueable_letters_with_fresh_sequence_numbers() -> None:
    save = dl.parse_letter(1, json.dumps({"url": "http://a.test/m", "when": "save"}), CODEC)
    a, b, b_again, c = (
        dl.parse_letter(n, _restore_letter(_e(seq, url)), CODEC)
        for n, (seq, url) in enumerate(
            [(0, "http://a.test/a"), (1, "http://a.test/b"), (7, "http://a.test/b"),
             (2, "http://a.test/c")], 2)
    )  # fmt: skip
    letters = [save, a, b, b_again, c]
    plan = dl.plan_requeue(letters, 2, 40, {})
    assert [(d.line, seq) for d, seq, _ in plan.requeued] == [(2, 40), (3, 41)]
    assert [(d.line, why) for d, why in plan.skipped] == [(1, save.why_not)]
    assert plan.removed == {2, 3}
    for d, seq, line in plan.requeued:
        new, old = parse_enqueue(line), d.record
        assert old is not None and new == old._replace(seq=seq)  # all but the seq, payload as is
    # All: the same request twice is queued once; one already pending is only taken off.
    plan = dl.plan_requeue(letters, None, 40, {_fp("http://a.test/a"): 9})
    assert [(d.line, seq) for d, seq, _ in plan.requeued] == [(3, 40), (5, 41)]
    assert [(d.line, seq) for d, seq in plan.already_queued] == [(2, 9), (4, 40)]
    assert plan.journal_text().count("\n") == 2 and plan.removed == {2, 3, 4, 5}
    with pytest.raises(ValueError, match="count"):
        dl.plan_requeue(letters, 0, 0, {})
    assert dl.without_lines([b"one", b"two", b"", b"f\xffour"], frozenset({2})) == (
        b"one\n\nf\xffour\n"
    )


# -- requeue and the lock on JOBDIRs written by a real scheduler --------------------------


class Later(Spider):
    name = "later"

    def parse_later(self, response: Any) -> None:
        pass


class WithoutLater(Spider):
    """The same crawl's spider without ``parse_later``: its entries are dead-lettered."""

    name = "later"


def _scheduler(job: Path, spidercls: type[Spider] = Later) -> Any:
    crawler = get_crawler(spidercls, {"JOBDIR": str(job)})
    crawler.spider = spidercls.from_crawler(crawler)
    crawler.engine = SimpleNamespace(_slot=SimpleNamespace(inprogress=set()))
    return BankerScheduler.from_crawler(crawler)


def _open(job: Path, spidercls: type[Spider] = Later) -> Any:
    scheduler = _scheduler(job, spidercls)
    scheduler.open(scheduler.crawler.spider)
    return scheduler


def _drain(scheduler: Any) -> list[Request]:
    """Fetch everything: dispatched, then done as the engine finishes each."""
    out = list(iter(scheduler.next_request, None))
    for request in out:
        scheduler.release(request, "response")
    scheduler.store.refill(0.0)
    return out


def _files(job: Path) -> dict[str, bytes]:
    return {str(p.relative_to(job)): p.read_bytes() for p in sorted(job.rglob("*"))
            if p.is_file() and p.name != "lock"}  # fmt: skip


def _banker_files(files: Path | dict[str, bytes]) -> dict[str, bytes]:
    files = _files(files) if isinstance(files, Path) else files
    return {k: v for k, v in files.items() if "banker" in k}


def _dead_lettered(job: Path) -> None:
    """A JOBDIR after a clean stop with one restore letter (a callback the spider lacked)
    and one save letter (a request JSON cannot carry)."""
    first = _open(job)
    first.enqueue_request(Request("http://h1.test/later", callback=first.spider.parse_later,
                                  cb_kwargs={"i": 1}, priority=4))  # fmt: skip
    first.enqueue_request(Request("http://h2.test/plain"))
    first.close("shutdown")
    second = _open(job, WithoutLater)
    assert second.stats.get_value("banker/jobdir/malformed") == 1
    assert [r.url for r in _drain(second)] == ["http://h2.test/plain"]
    second.enqueue_request(Request("http://h3.test/mem", meta={"s": {1}}))
    second.close("shutdown")


def test_requeue_appends_new_records_and_the_next_resume_fetches_them(tmp_path: Path) -> None:
    job = tmp_path / "job"
    _dead_lettered(job)
    deadletters = job / "banker-deadletter.jsonl"
    save_line = deadletters.read_text().splitlines(keepends=True)[1]
    letters = dl.list_letters(str(job))
    assert [(d.when, d.requeueable, d.url) for d in letters] == [
        ("restore", True, "http://h1.test/later"),
        ("save", False, "http://h3.test/mem"),
    ]
    assert "parse_later" in letters[0].error and letters[0].callback == "parse_later"
    before, _ = replay(str(job / "banker"))
    generation = before.header["generation"] if before.header else 0

    outcome = dl.requeue(str(job), None)
    (requeued,) = outcome.plan.requeued
    assert requeued[1] == before.next_seq and outcome.journal == f"journal-{generation}.jsonl"
    assert [why for _, why in outcome.plan.skipped] == [letters[1].why_not]
    assert outcome.left == 1 and not outcome.cut_tail
    assert deadletters.read_text() == save_line  # the other letter, byte for byte
    journal = (job / "banker" / outcome.journal).read_text().splitlines(keepends=True)
    assert journal[-1] == requeued[2]
    assert letters[0].record is not None
    assert parse_enqueue(journal[-1]) == letters[0].record._replace(seq=before.next_seq)
    # Pending and seen before any resume.
    after, _ = replay(str(job / "banker"))
    fp = _fp("http://h1.test/later")
    assert after.live.get(before.next_seq) == fp and fp in after.seen()

    resumed = _open(job)
    assert resumed.stats.get_value("banker/jobdir/restored") == 1
    (request,) = _drain(resumed)  # queued, not filtered as seen
    assert request.url == "http://h1.test/later" and request.priority == 4
    assert request.callback == resumed.spider.parse_later and request.cb_kwargs == {"i": 1}
    assert not resumed.enqueue_request(Request("http://h1.test/later"))  # seen
    resumed.close("finished")
    assert deadletters.read_text() == save_line  # not dead-lettered again
    assert dl.requeue(str(job), None).plan.requeued == ()


def test_an_interrupted_requeue_leaves_the_letter_queued_and_listed_then_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "job"
    _dead_lettered(job)

    def crash(path: str, content: bytes) -> None:
        raise OSError("killed before the rewrite")

    with monkeypatch.context() as m:
        m.setattr(dl, "_replace", crash)
        with pytest.raises(OSError, match="killed"):
            dl.requeue(str(job), 1)
    listed = dl.list_letters(str(job))
    assert len(listed) == 2 and listed[0].queued_as is not None  # queued and listed
    journal_before = _files(job)
    outcome = dl.requeue(str(job), None)
    assert outcome.plan.requeued == ()
    assert [(d.line, seq) for d, seq in outcome.plan.already_queued] == [(1, listed[0].queued_as)]
    after = _files(job)
    assert after.pop("banker-deadletter.jsonl") != journal_before.pop("banker-deadletter.jsonl")
    assert after == journal_before  # no second copy in the journal
    assert len(_drain(_open(job))) == 1


def test_a_journal_line_cut_by_a_kill_is_cut_off_before_the_append(tmp_path: Path) -> None:
    job = tmp_path / "job"
    _dead_lettered(job)
    state, _ = replay(str(job / "banker"))
    journal = job / "banker" / f"journal-{state.header['generation'] if state.header else 0}.jsonl"
    with journal.open("a") as f:
        f.write(_e(999, "http://a.test/cut")[:25])  # a kill mid-write
    outcome = dl.requeue(str(job), None)
    assert outcome.cut_tail
    lines = journal.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines) and parse_enqueue(lines[-1])
    resumed = _open(job)
    assert resumed.stats.get_value("banker/jobdir/truncated") is None
    assert [r.url for r in _drain(resumed)] == ["http://h1.test/later"]


def test_the_lock_refuses_a_second_crawl_and_a_requeue_and_outlives_compactions(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    _dead_lettered(job)
    crawl = _open(job)
    crawl.store.jobdir.compact(crawl.queue.topics.to_state())  # a compaction mid-crawl
    before = _files(job)
    refused = re.escape(f"another crawl holds JOBDIR {job} (process {os.getpid()}, lock ")
    with pytest.raises(JobdirLocked, match=refused):
        dl.requeue(str(job), None)
    # A second crawl is refused when its scheduler is built, before its spider opens.
    with pytest.raises(JobdirLocked, match=re.escape(f"another crawl holds JOBDIR {job}")):
        _scheduler(job)
    assert _files(job) == before
    crawl.close("shutdown")  # releases the lock
    assert dl.requeue(str(job), None).plan.requeued
    lock = JobdirLock(str(job))
    lock.acquire()
    lock.release()


def test_bad_jobdirs_are_refused_and_nothing_is_created(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no JOBDIR at"):
        dl.requeue(str(tmp_path / "nope"), None)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no scrapy-banker journal"):
        dl.list_letters(str(empty))
    with pytest.raises(ValueError, match="holds no scrapy-banker journal"):
        dl.requeue(str(empty), None)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["empty"]


# -- the command, in process ---------------------------------------------------------------


def _command(*args: str, **settings: Any) -> int:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.run(parser.parse_args(list(args)), Settings(settings))


def test_command_lists_requeues_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    _dead_lettered(job)
    assert _command("--jobdir", str(job)) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"2 dead letters in {job}\n")
    assert "http://h1.test/later -> parse_later" in text and "no: only memory held it" in text
    # The JOBDIR setting when no fleet is configured.
    assert _command("--json", "--limit", "1", JOBDIR=str(job)) == 0
    listing = json.loads(capsys.readouterr().out)
    assert (listing["schema"], listing["kind"], listing["count"], listing["total"]) == (
        1, "deadletters-jobdir", 1, 2)  # fmt: skip
    assert listing["letters"][0]["url"] == "http://h1.test/later"
    setting = {"JOBDIR": str(job)}
    for args, settings, match in (
        (("--requeue", "0"), setting, "--requeue takes a number >= 1 or 'all', got '0'"),
        (("--requeue", "some"), setting, "got 'some'"),
        (("--limit", "0"), setting, "--limit takes a number >= 1, got 0"),
        (("--jobdir", str(tmp_path / "nope"), "--requeue", "all"), {}, "no JOBDIR at"),
        ((), {}, "give --jobdir DIR for a single node, or REDIS_URL"),
    ):
        before = _files(tmp_path)
        with pytest.raises(CommandError, match=re.escape(match)):
            _command(*args, **settings)
        assert _files(tmp_path) == before
    assert _command("--jobdir", str(job), "--requeue", "all", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "requeue-jobdir" and result["left"] == 1
    assert [d["url"] for d in result["requeued"]] == ["http://h1.test/later"]
    assert [d["url"] for d in result["skipped"]] == ["http://h3.test/mem"]
    (job / "banker-deadletter.jsonl").write_text("")
    assert _command("--jobdir", str(job)) == 0
    assert capsys.readouterr().out == f"0 dead letters in {job}\n"


# -- end to end: scrapy crawl, scrapy banker deadletters, scrapy crawl -----------------------


class _Links(CrawlSpider):
    """The test project's ``links`` spider (only its method names matter here)."""

    name = "links"
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=False),)

    def parse_item(self, response: Any) -> None:
        pass


_SETTINGS = """\
from scrapy_banker.testing.resolver import farm_settings

BOT_NAME = "dlproj"
SPIDER_MODULES = ["dlproj.spiders"]
ADDONS = {{"scrapy_banker.Addon": 500}}
JOBDIR = {jobdir!r}
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False
ROBOTSTXT_OBEY = False
locals().update(farm_settings())
"""

_SPIDERS = '''\
from scrapy import Spider
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class Links(CrawlSpider):
    """Its requests carry CrawlSpider's private ``_callback``."""

    name = "links"
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=False),)

    def parse_item(self, response):
        yield {"url": response.url, "via": "parse_item"}


class Plain(Spider):
    """Resuming the crawl without ``_callback``: its entries are dead-lettered."""

    name = "plain"

    def parse(self, response):
        yield {"url": response.url, "via": "parse"}
'''


def _project(tmp_path: Path, jobdir: Path) -> Path:
    root = tmp_path / "project"
    (root / "dlproj" / "spiders").mkdir(parents=True)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = dlproj.settings\n")
    (root / "dlproj" / "__init__.py").write_text("")
    (root / "dlproj" / "settings.py").write_text(_SETTINGS.format(jobdir=str(jobdir)))
    (root / "dlproj" / "spiders" / "__init__.py").write_text(_SPIDERS)
    return root


def _scrapy(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy ...`` in ``project`` (its package alone on ``PYTHONPATH``), any exit code."""
    env = child_env(PYTHONPATH=str(project))
    return run_scrapy(*args, cwd=project, timeout=120, expect=None, env=env)


@pytest.mark.slow
def test_a_dead_lettered_crawlspider_request_is_requeued_and_fetched_on_resume(
    tmp_path: Path,
) -> None:
    jobdir = tmp_path / "job"
    project = _project(tmp_path, jobdir)
    with WebFarm(FarmConfig(seed=7, hosts=2, total_pages=6, latency_ms=1.0)) as farm:
        lost, plain = farm.url(0, "/"), farm.url(1, "/")
        # A crawl killed before its first compaction: two requests in its journal, one
        # with CrawlSpider's _callback.
        spider = _Links()
        request = Request(lost, callback=spider._callback, meta={"rule": 0, "link_text": ""})
        payload = CODEC.encode(request, spider)
        assert json.loads(payload)["callback"] == "_callback"
        journal = ""
        for seq, (url, body) in enumerate([(lost, payload), (plain, CODEC.encode(Request(plain)))]):
            host = urlsplit(url).hostname or ""
            journal += enqueue_line(seq, _fp(url), "default", host, host, bkdr(host), 0, body)
        (jobdir / "banker").mkdir(parents=True)
        (jobdir / "banker" / "journal-0.jsonl").write_text(journal)

        # Resumed by a spider without _callback: the entry is dead-lettered, the other fetched.
        run = _scrapy(project, "crawl", "plain")
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Skipping malformed JOBDIR entry" in run.stderr
        fetches = farm.stats(urls=True)["fetches"]
        assert fetches.get(plain) == 1 and lost not in fetches
        listing = _scrapy(project, "banker", "deadletters", "--json")  # the JOBDIR setting
        assert listing.returncode == 0, listing.stderr
        (letter,) = json.loads(listing.stdout)["letters"]
        assert (letter["url"], letter["callback"], letter["requeueable"]) == (
            lost, "_callback", True)  # fmt: skip
        assert letter["payload_error"] is None and "_callback" in letter["error"]

        # While a crawl holds the JOBDIR the requeue is refused, changing nothing.
        before = _files(jobdir)
        with _locked(jobdir):
            refused = _scrapy(project, "banker", "deadletters", "--jobdir", str(jobdir),
                              "--requeue", "all")  # fmt: skip
        assert refused.returncode == 2 and not refused.stdout
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith(
            f"scrapy banker deadletters: another crawl holds JOBDIR {jobdir} (process {os.getpid()}"
        ), line
        assert _files(jobdir) == before

        requeued = _scrapy(project, "banker", "deadletters", "--jobdir", str(jobdir),
                           "--requeue", "all", "--json")  # fmt: skip
        assert requeued.returncode == 0, requeued.stderr
        result = json.loads(requeued.stdout)
        assert [d["url"] for d in result["requeued"]] == [lost] and result["left"] == 0
        state, _ = replay(str(jobdir / "banker"))
        assert state.live.get(result["requeued"][0]["new_seq"]) == _fp(lost)
        assert _fp(lost) in state.seen()

        # The crawl resumed with the method back: fetched once, through _callback.
        resumed = _scrapy(project, "crawl", "links", "-o", str(tmp_path / "items.jsonl"))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
        fetches = farm.stats(urls=True)["fetches"]
    assert fetches.get(lost) == 1 and fetches.get(plain) == 1
    items = [json.loads(x) for x in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert items == [{"url": lost, "via": "parse_item"}]
    assert (jobdir / "banker-deadletter.jsonl").read_text() == ""
    empty = _scrapy(project, "banker", "deadletters", "--jobdir", str(jobdir))
    assert empty.returncode == 0 and empty.stdout.startswith(f"0 dead letters in {jobdir}")

    # A second crawl on a held JOBDIR fails when its scheduler is built, before the
    # spider opens: it leaves the banker files and Scrapy's spider.state alone.
    before = _files(jobdir)
    state_before = (jobdir / "spider.state").read_bytes()
    with _locked(jobdir):
        second = _scrapy(project, "crawl", "links")
    assert second.returncode == 1, second.stderr[-3000:]
    assert f"another crawl holds JOBDIR {jobdir}" in second.stderr, second.stderr[-3000:]
    assert _banker_files(jobdir) == _banker_files(before)
    assert (jobdir / "spider.state").read_bytes() == state_before


@contextlib.contextmanager
def _locked(jobdir: Path) -> Iterator[None]:
    """Hold the JOBDIR lock as a running crawl does."""
    lock = JobdirLock(str(jobdir))
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
