"""The revisits' JOBDIR file: what a resume reads back, after a clean stop or a kill."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.scheduler.revisit_log import FILE, RevisitLog
from scrapy_banker.scheduler.serialize import RequestCodec


class Pages(Spider):
    name = "pages"

    def parse_page(self, response: object) -> None:
        pass


def _log(tmp_path: Path) -> tuple[RevisitLog, Spider, object]:
    crawler = get_crawler(Pages)
    spider = Pages()
    return RevisitLog(str(tmp_path), RequestCodec(), crawler.stats), spider, crawler.stats


def _state(due: float, etag: str = "") -> UrlState:
    return UrlState(due=due, interval=10.0, fetched=due - 10, succeeded=due - 10, etag=etag)


def test_a_resume_reads_each_urls_last_state_and_request_with_its_callback(
    tmp_path: Path,
) -> None:
    log, spider, _ = _log(tmp_path)
    assert log.restore(spider) == {}
    a, b = "http://a.test/x", "http://b.test/y"
    request = Request(a, callback=spider.parse_page, meta={"k": 1}, priority=3)
    log.write(a, _state(100.0), request, spider)
    log.write(b, _state(50.0), Request(b, callback=spider.parse_page), spider)
    log.write(a, _state(200.0, etag='"v2"'), None, spider)  # a revisit: the state only
    log.close()

    again, spider2, _ = _log(tmp_path)
    restored = again.restore(spider2)
    assert set(restored) == {a, b}
    assert restored[a].state == _state(200.0, etag='"v2"')
    assert restored[b].state.due == 50.0
    copy = restored[a].request
    assert (copy.url, copy.meta, copy.priority) == (a, {"k": 1}, 3)
    assert copy.callback == spider2.parse_page  # resolved on the running spider
    # Three lines for two URLs: the resume compacted the file to one line per URL.
    lines = (tmp_path / "banker" / FILE).read_text().splitlines()
    assert len(lines) == 2 and again.lines == 2


def test_a_line_cut_short_by_a_kill_is_skipped_and_a_bad_one_dead_lettered(
    tmp_path: Path,
) -> None:
    log, spider, _ = _log(tmp_path)
    log.restore(spider)
    a, b = "http://a.test/x", "http://b.test/y"
    log.write(a, _state(100.0), Request(a, callback=spider.parse_page), spider)
    log.write(b, _state(100.0), Request(b, callback=spider.parse_page), spider)
    log.close()
    path = tmp_path / "banker" / FILE
    with path.open("a") as f:
        f.write('{"u": "http://c.test/", "s": {"due": "soon"}}\n')  # a bad state
        f.write(json.dumps({"u": b, "s": {"due": 5.0}, "r": "{not json"}) + "\n")
        f.write('{"u": "http://a.test/x", "s": {"du')  # a kill mid-write

    again, spider2, stats = _log(tmp_path)
    restored = again.restore(spider2)
    assert set(restored) == {a}  # b's last request cannot be rebuilt: it is not revisited
    assert restored[a].state.due == 100.0  # the cut line was never acknowledged
    assert stats.get_value("banker/recrawl/malformed") == 2  # type: ignore[attr-defined]
    letters = [json.loads(x) for x in (tmp_path / "banker-deadletter.jsonl").read_text().split("\n")
               if x]  # fmt: skip
    assert [x["when"] for x in letters] == ["restore", "restore"]
    assert "due" in letters[0]["error"] and b in letters[1]["error"]


def test_a_request_that_cannot_be_written_is_dead_lettered_and_counted(tmp_path: Path) -> None:
    log, spider, stats = _log(tmp_path)
    log.restore(spider)
    url = "http://a.test/x"
    log.write(url, _state(100.0), Request(url, callback=lambda r: None), spider)
    assert stats.get_value("banker/recrawl/unsaved") == 1  # type: ignore[attr-defined]
    letter = json.loads((tmp_path / "banker-deadletter.jsonl").read_text())
    assert (letter["url"], letter["when"]) == (url, "save")
    log.compact({url: _state(100.0)})  # nothing to rebuild it from: not kept
    assert (tmp_path / "banker" / FILE).read_text() == ""


def test_the_file_is_compacted_while_crawling_once_it_doubles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("scrapy_banker.scheduler.revisit_log.COMPACT_MIN_LINES", 4)
    log, spider, _ = _log(tmp_path)
    log.restore(spider)
    url = "http://a.test/x"
    log.write(url, _state(10.0), Request(url, callback=spider.parse_page), spider)
    states = {}
    for i in range(2, 6):
        states[url] = _state(float(10 * i))
        log.write(url, states[url], None, spider)
        if log.should_compact():
            log.compact(states)
    assert log.lines < 4
    path = tmp_path / "banker" / FILE
    assert not os.path.exists(f"{path}.tmp")
    again, spider2, _ = _log(tmp_path)
    assert again.restore(spider2)[url].state.due == 50.0
