"""ControlFile (scrapy_banker.scheduler.control_file): a single process's control channel.

``scrapy banker pause HOST --jobdir DIR`` and its siblings write
``JOBDIR/banker/control.json`` and append to ``control-log.jsonl``; the
running crawl polls the file once a second.  The commands' tests run a
process and a crawl; these are plain pytest on a ``tmp_path`` JOBDIR (issue
#31): what an action writes, what a poll returns, how a malformed file is
survived, the log's order, and two writers landing both.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from scrapy_banker.core.directives import ControlError, ControlState, parse_action
from scrapy_banker.scheduler.control_file import CONTROL_FILE, CONTROL_LOG, ControlFile

HOST = "a.test"


def act(
    control: ControlFile, verb: str, *args: str, who: str = "alice", now: float = 1.0
) -> ControlState:
    return control.act(parse_action(verb, list(args)), who=who, now=now)


def document(jobdir: Path) -> object:
    return json.loads((jobdir / "banker" / CONTROL_FILE).read_text(encoding="utf-8"))


# -- the commands ------------------------------------------------------------------------


def test_each_action_rewrites_the_file_as_valid_json_with_a_growing_version(
    tmp_path: Path,
) -> None:
    control = ControlFile(str(tmp_path))
    state = act(control, "pause", HOST)
    assert document(tmp_path) == {"version": 1, "hosts": {HOST: {"paused": True}}}
    assert state.version == 1
    act(control, "limit", HOST, "3")
    assert document(tmp_path) == {"version": 2, "hosts": {HOST: {"paused": True, "limit": 3}}}
    act(control, "budget", "crawl", "100")
    assert ControlState.from_json(document(tmp_path)).crawl_budget == 100
    assert control.load().version == 3
    assert not (tmp_path / "banker" / (CONTROL_FILE + ".tmp")).exists()


def test_each_action_appends_a_log_line_saying_who_when_and_what(tmp_path: Path) -> None:
    control = ControlFile(str(tmp_path))
    act(control, "pause", HOST, who="alice", now=10.0)
    act(control, "delay", HOST, "2.5", who="bob", now=20.0)
    lines = (tmp_path / "banker" / CONTROL_LOG).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"at": 10.0, "who": "alice", "version": 1, "verb": "pause", "target": HOST},
        {"at": 20.0, "who": "bob", "version": 2, "verb": "delay", "target": HOST, "value": 2.5},
    ]


@pytest.mark.parametrize(("verb", "args"), [("purge", [HOST]), ("inject", ["https://a.test/new"])])
def test_purge_and_inject_are_refused_for_they_need_redis(
    tmp_path: Path, verb: str, args: list[str]
) -> None:
    control = ControlFile(str(tmp_path))
    with pytest.raises(ControlError, match="needs a crawl that runs on Redis"):
        control.act(parse_action(verb, args), who="alice", now=1.0)
    assert not (tmp_path / "banker" / CONTROL_FILE).exists()
    assert control.log() == []


def test_two_writers_on_one_jobdir_both_land(tmp_path: Path) -> None:
    start = threading.Barrier(2)
    versions: list[int] = []

    def write(host: str) -> None:
        control = ControlFile(str(tmp_path))
        start.wait()
        versions.append(act(control, "pause", host, who=host).version)

    threads = [threading.Thread(target=write, args=(h,)) for h in ("a.test", "b.test")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(versions) == [1, 2]
    state = ControlFile(str(tmp_path)).load()
    assert state.version == 2
    assert state.paused_hosts == {"a.test", "b.test"}
    assert sorted(e["version"] for e in ControlFile(str(tmp_path)).log()) == [1, 2]


def test_an_action_on_a_malformed_file_is_refused_not_written_over(tmp_path: Path) -> None:
    (tmp_path / "banker").mkdir()
    (tmp_path / "banker" / CONTROL_FILE).write_text("{oops", encoding="utf-8")
    with pytest.raises(ControlError, match="not JSON"):
        act(ControlFile(str(tmp_path)), "pause", HOST)
    assert (tmp_path / "banker" / CONTROL_FILE).read_text(encoding="utf-8") == "{oops"


# -- the crawl ---------------------------------------------------------------------------


def test_poll_finds_nothing_while_there_is_no_file(tmp_path: Path) -> None:
    control = ControlFile(str(tmp_path))
    assert control.poll() is None
    assert control.load() == ControlState()


def test_poll_returns_the_state_once_per_change(tmp_path: Path) -> None:
    crawl, operator = ControlFile(str(tmp_path)), ControlFile(str(tmp_path))
    act(operator, "pause", HOST)
    state = crawl.poll()
    assert state is not None
    assert state.version == 1
    assert state.paused_hosts == {HOST}
    assert crawl.poll() is None
    act(operator, "resume", HOST)
    state = crawl.poll()
    assert state is not None
    assert (state.version, state.paused_hosts) == (2, frozenset())
    assert crawl.poll() is None


def test_poll_sees_a_same_size_rewrite_within_one_timestamp_tick(tmp_path: Path) -> None:
    crawl, operator = ControlFile(str(tmp_path)), ControlFile(str(tmp_path))
    act(operator, "limit", HOST, "2")
    first = os.stat(crawl.path)
    assert crawl.poll() is not None
    act(operator, "limit", HOST, "3")  # same length: {"limit": 3}, version 2
    assert os.stat(crawl.path).st_size == first.st_size
    # The filesystem's clock has not ticked since the first write:
    os.utime(crawl.path, ns=(first.st_atime_ns, first.st_mtime_ns))
    state = crawl.poll()
    assert state is not None
    assert state.host(HOST).limit == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "must be a JSON object"),
        ('{"version": 1, "hosts": {"a.test": {"speed": 3}}}', "unknown fields"),
    ],
    ids=["not-json", "not-an-object", "not-a-control-document"],
)
def test_a_malformed_file_is_counted_logged_once_and_the_last_state_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, message: str
) -> None:
    control = ControlFile(str(tmp_path))
    act(control, "pause", HOST)
    assert control.poll() is not None
    path = Path(control.path)
    with caplog.at_level(logging.ERROR, logger="scrapy_banker.scheduler.control_file"):
        path.write_text(text, encoding="utf-8")
        assert control.poll() is None
        assert control.poll() is None  # unchanged: not read again
        path.write_text(text + " ", encoding="utf-8")  # malformed again, another stamp
        assert control.poll() is None
    assert control.malformed == 2
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert message in errors[0].getMessage()
    assert control.path in errors[0].getMessage()


def test_a_valid_file_after_a_malformed_one_is_followed_and_logged_again_if_broken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    control = ControlFile(str(tmp_path))
    path = Path(control.path)
    path.parent.mkdir()
    with caplog.at_level(logging.ERROR, logger="scrapy_banker.scheduler.control_file"):
        path.write_text("nope", encoding="utf-8")
        assert control.poll() is None
        path.write_text(json.dumps({"version": 7, "crawl_budget": 5}), encoding="utf-8")
        state = control.poll()
        assert state is not None
        assert (state.version, state.crawl_budget) == (7, 5)
        path.write_text("nope again", encoding="utf-8")
        assert control.poll() is None
    assert control.malformed == 2
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2


# -- the log -----------------------------------------------------------------------------


def test_the_log_is_newest_first_and_limited(tmp_path: Path) -> None:
    control = ControlFile(str(tmp_path))
    assert control.log() == []
    for n in range(1, 5):
        act(control, "limit", HOST, str(n), now=float(n))
    assert [e["version"] for e in control.log()] == [4, 3, 2, 1]
    assert [e["value"] for e in control.log(2)] == [4, 3]
    assert control.log(0) == []


def test_an_unreadable_log_line_is_reported_not_skipped(tmp_path: Path) -> None:
    control = ControlFile(str(tmp_path))
    act(control, "pause", HOST)
    with open(control.log_path, "a", encoding="utf-8") as f:
        f.write('{"torn": \n')
        f.write("[1, 2]\n")
    act(control, "resume", HOST)
    newest, listed, torn, oldest = control.log()
    assert newest["verb"] == "resume"
    assert listed == {"unreadable": "[1, 2]"}
    assert torn == {"unreadable": '{"torn":'}
    assert oldest["verb"] == "pause"
