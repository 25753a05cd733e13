"""The operator's control commands without a crawl (issue #31 item 7).

A HOST is read as the crawl keys it (a URL or ``HOST:PORT`` is taken as its
download slot, and the output says so); an unknown host is refused naming the
close ones; numbers are integers or finite seconds within a sane range; the
``--json`` documents carry ``schema`` and ``kind``; ``control`` prints
readable tables.  A JOBDIR here is a snapshot written by hand (the hosts it
holds pending are what the command accepts); the fleet tests use the
session's redis-server.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings

from scrapy_banker.core import directives as core_control
from scrapy_banker.core.directives import HOST, VERBS, ControlError, Verb, parse_action
from scrapy_banker.core.hashing import bkdr
from scrapy_banker.core.journal import enqueue_line, header_line
from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands._common import json_document
from scrapy_banker.ops.commands.banker import CONTROL
from scrapy_banker.ops.commands.control import (
    HELPS,
    add_arguments_for,
    logged_action,
    run_verb,
    when,
)
from scrapy_banker.ops.controller import (
    Controller,
    JobdirController,
    close_hosts,
    host_target,
    unknown_host,
)
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.control_channel import ControlChannel
from scrapy_banker.redis.keys import Keyspace
from scrapy_banker.scheduler.serialize import RequestCodec
from scrapy_banker.settings import load_config
from scrapy_banker.testing.redis_server import RedisServer

HOSTS = ("127.0.0.1", "a.test", "shop.example.com")
PREFIX = "banker:ctl"
PARTITIONS = 8


def make_jobdir(root: Path, hosts: tuple[str, ...] = HOSTS) -> Path:
    """A JOBDIR whose snapshot holds one pending request per host (on port 8731)."""
    codec = RequestCodec()
    folder = root / "banker"
    folder.mkdir(parents=True)
    lines = [header_line(0, len(hosts) + 1, len(hosts), 0, None, None)]
    for seq, host in enumerate(hosts, 1):
        payload = codec.encode(Request(f"http://{host}:8731/page"))
        lines.append(enqueue_line(seq, f"{seq:040x}", "default", host, host, bkdr(host), 0,
                                  payload))  # fmt: skip
    (folder / "snapshot.jsonl").write_text("".join(lines))
    return root


def _opts(verb: str, *words: str, **kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"spider": None, "spider_option": None, "prefix": None,
                            "jobdir": None, "json": False, "force": False}  # fmt: skip
    if verb == "control":
        base["last"] = 20
    elif verb == "inject":
        base.update(urls=list(words), topic=None)
    else:
        base["target"] = words[0]
        if len(words) > 1:
            base["value"] = words[1]
    return argparse.Namespace(**{**base, **kw})


# -- reading a HOST -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "host"),
    [
        ("127.0.0.1:8731", "127.0.0.1"),
        ("http://127.0.0.1:8731/page?x=1", "127.0.0.1"),
        ("https://user:pw@WWW.Example.com:8443/p#f", "www.example.com"),
        ("A.Test:80", "a.test"),
        ("a.test/some/path", "a.test"),
        ("[::1]:8080", "::1"),
        ("bücher.de", "xn--bcher-kva.de"),  # what Scrapy's request URL and its slot hold
    ],
)
def test_a_url_or_host_port_is_taken_as_the_download_slot_with_a_note(
    given: str, host: str
) -> None:
    got, note = host_target(given)
    assert got == host
    assert note is not None and repr(given) in note and f"taken as host {host!r}" in note


@pytest.mark.parametrize(
    "given", ["a.test", "A.Test", "::1", "fe80::1", "[::1]", "topic:news", "topic:123", "crawl",
              "http://", "a.test:"],
)  # fmt: skip
def test_hosts_topics_and_what_is_no_url_are_left_as_given(given: str) -> None:
    assert host_target(given) == (given, None)


def test_the_core_refuses_a_port_naming_the_host_and_any_bad_ipv6() -> None:
    # Before, '127.0.0.1:8731' passed for an IPv6 address and was set as a host.
    for given, host in [("127.0.0.1:8731", "'127.0.0.1'"), ("a.test:80", "'a.test'"),
                        ("[::1]:80", "'::1'")]:  # fmt: skip
        with pytest.raises(ControlError, match="names a port;") as info:
            parse_action("pause", [given])
        assert str(info.value).endswith(f"give {host}")
    with pytest.raises(ControlError, match="'1:2:3' is not a host name nor an IPv6 address"):
        parse_action("pause", ["1:2:3"])
    assert parse_action("pause", ["fe80::1"]).target == "fe80::1"
    assert parse_action("pause", ["[::1]"]).target == "::1"


def test_close_hosts_are_the_same_site_then_near_spellings() -> None:
    known = {"www.example.com", "example.org", "127.0.0.1", "a.test"}
    assert close_hosts("example.com", known) == ["www.example.com", "example.org"]
    assert close_hosts("exmaple.org", known) == ["example.org"]
    assert close_hosts("127.0.0.2", known) == ["127.0.0.1"]
    assert close_hosts("nothing.like.it", known) == []


def test_an_unknown_host_is_refused_naming_the_close_ones_first() -> None:
    where = "this crawl has queued no request of"
    error = str(unknown_host("127.0.0.2", "127.0.0.2:8731", {"127.0.0.1", "b.test"}, where))
    assert error == (
        "HOST: this crawl has queued no request of '127.0.0.2' (read from '127.0.0.2:8731'; "
        "its hosts include 127.0.0.1, b.test); did you mean 127.0.0.1? --force sets it anyway"
    )
    many = {f"h{i}.test" for i in range(9)}
    error = str(unknown_host("zzz.invalid", "zzz.invalid", many, where))
    assert "(its hosts include h0.test, h1.test, h2.test, h3.test, h4.test, ...); --force" in error
    assert "did you mean" not in error
    assert "(it has no request of any host yet)" in str(unknown_host("x.test", "x.test", [], where))


# -- numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "value", "message"),
    [
        ("limit", "99999999999999999999",
         "limit: N must be an integer >= 1 or 'none', got '99999999999999999999' (at most 10,000)"),
        ("limit", "10001", "got '10001' (at most 10,000)"),
        ("limit", "1_000", "limit: N must be an integer >= 1 or 'none', got '1_000'"),
        ("limit", "\u0663", "limit: N must be an integer >= 1 or 'none', got '\u0663'"),
        ("limit", "+3", "got '+3'"),
        ("budget", "1e6", "budget: N must be an integer >= 0 or 'none', got '1e6'"),
        ("budget", "1000000000001", "(at most 1,000,000,000,000)"),
        ("budget", "-0", "got '-0'"),
        ("delay", "1e300", "delay: N must be a number of seconds >= 0, got '1e300' "
                           "(at most 86,400 s)"),
        ("delay", "1e400", "got '1e400'"),
        ("delay", "nan", "got 'nan'"),
        ("delay", "infinity", "got 'infinity'"),
        ("delay", "0x10", "got '0x10'"),
        ("delay", "1_0", "got '1_0'"),
        ("delay", "86400.5", "got '86400.5' (at most 86,400 s)"),
    ],
)  # fmt: skip
def test_numbers_are_plain_integers_or_finite_seconds_in_range(
    verb: str, value: str, message: str
) -> None:
    with pytest.raises(ControlError) as info:
        parse_action(verb, ["a.test", value])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("verb", "value", "parsed"),
    [("limit", "10000", 10000), ("limit", " 7 ", 7), ("limit", "NONE", None),
     ("budget", "0", 0), ("budget", "1000000000000", 10**12), ("budget", "none", None),
     ("delay", "0", 0.0), ("delay", ".25", 0.25), ("delay", "1.5e2", 150.0),
     ("delay", "86400", 86400.0)],
)  # fmt: skip
def test_numbers_in_range_are_taken(verb: str, value: str, parsed: float | None) -> None:
    action = parse_action(verb, ["a.test", value])
    assert action.value == parsed and type(action.value) is type(parsed)


# -- a JOBDIR -------------------------------------------------------------------------------


def test_jobdir_pause_of_host_port_is_the_host_and_said(tmp_path: Path) -> None:
    jobdir = make_jobdir(tmp_path / "job")
    controller = JobdirController(str(jobdir), load_config(Settings()))
    action = controller.parse("pause", ["127.0.0.1:8731"])
    assert action.target == "127.0.0.1"
    outcome = controller.execute(action, who="tester", now=1_700_000_000.0)
    assert outcome.notes and "taken as host '127.0.0.1'" in outcome.notes[0]
    assert outcome.to_json()["notes"] == outcome.notes
    saved = json.loads((jobdir / "banker" / "control.json").read_text())
    assert saved == {"hosts": {"127.0.0.1": {"paused": True}}, "version": 1}
    # A note belongs to the action parsed: another action's outcome has none.
    plain = controller.parse("pause", ["a.test"])
    assert controller.execute(plain, who="tester", now=1.0).notes == []
    assert "notes" not in controller.execute(plain, who="tester", now=1.0).to_json()


def test_jobdir_unknown_host_names_the_close_ones_and_force_still_normalises(
    tmp_path: Path,
) -> None:
    controller = JobdirController(str(make_jobdir(tmp_path / "job")), load_config(Settings()))
    with pytest.raises(ControlError) as info:
        controller.parse("pause", ["http://127.0.0.2:8731/x"])
    assert str(info.value) == (
        "HOST: the JOBDIR holds no pending request of '127.0.0.2' (read from "
        "'http://127.0.0.2:8731/x'; its hosts include 127.0.0.1, a.test, shop.example.com); "
        "did you mean 127.0.0.1? --force sets it anyway"
    )
    with pytest.raises(ControlError, match=re.escape("did you mean shop.example.com?")):
        controller.parse("pause", ["example.com"])
    forced = controller.parse("budget", ["new.test:8080", "5"], force=True)
    assert (forced.target, forced.value) == ("new.test", 5)


def _jobdir_run(capsys: pytest.CaptureFixture[str], verb: str, *words: str, **kw: Any) -> str:
    assert run_verb(verb, _opts(verb, *words, **kw), Settings()) == 0
    return capsys.readouterr().out


def test_jobdir_commands_print_notes_json_with_schema_and_a_readable_control(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    jobdir = str(make_jobdir(tmp_path / "job"))
    text = _jobdir_run(capsys, "pause", "127.0.0.1:8731", jobdir=jobdir)
    note, line = text.strip().splitlines()
    assert note.startswith("Note: '127.0.0.1:8731' taken as host '127.0.0.1'")
    assert line.startswith("pause 127.0.0.1: in force in the crawl on this JOBDIR")
    doc = json.loads(_jobdir_run(capsys, "delay", "http://A.test/x", "0.5", jobdir=jobdir,
                                 json=True))  # fmt: skip
    assert doc["schema"] == 1 and doc["kind"] == "action-jobdir" and doc["jobdir"] == jobdir
    assert doc["action"] == {"verb": "delay", "target": "a.test", "value": 0.5}
    assert doc["done"] == "delay a.test 0.5" and doc["version"] == 2
    assert len(doc["notes"]) == 1
    plain = json.loads(_jobdir_run(capsys, "budget", "crawl", "9", jobdir=jobdir, json=True))
    assert plain["notes"] == [] and plain["kind"] == "action-jobdir"
    with pytest.raises(CommandError, match=r"limit: N must be .* got '99999999999999999999'"):
        run_verb("limit", _opts("limit", "a.test", "99999999999999999999", jobdir=jobdir),
                 Settings())  # fmt: skip

    shown = json.loads(_jobdir_run(capsys, "control", jobdir=jobdir, json=True))
    assert (shown["schema"], shown["kind"], shown["jobdir"]) == (1, "control-jobdir", jobdir)
    assert shown["state"]["hosts"]["127.0.0.1"] == {"paused": True}
    assert [e["version"] for e in shown["log"]] == [3, 2, 1]

    out = _jobdir_run(capsys, "control", jobdir=jobdir)
    assert "{" not in out and "'at'" not in out  # no raw dict, no epoch
    assert f"Control of JOBDIR {jobdir}, version 3: 3 target(s) with directives" in out
    rows = _table_rows(out)
    assert ["127.0.0.1", "yes"] in rows and ["a.test", "0.5"] in rows and ["crawl", "9"] in rows
    for entry in shown["log"]:  # one row per action: local ISO time, who, words, version
        stamp = datetime.fromtimestamp(entry["at"]).astimezone().isoformat(timespec="seconds")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", stamp)
        row = next(r for r in rows if r and r[0] == stamp and r[-1] == str(entry["version"]))
        assert row[2] == logged_action(entry) and "(scrapy banker)" in row[1]
    assert [r[2] for r in rows if r and r[0][:2] == "20"] == [
        "budget crawl 9", "delay a.test 0.5", "pause 127.0.0.1",
    ]  # fmt: skip


# -- the subcommands come from the verb table --------------------------------------------


def _parser(verb: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"scrapy banker {verb}", exit_on_error=False)
    add_arguments_for(verb, parser)
    return parser


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_verb_subcommand_is_built_from_its_table_entry(verb: str) -> None:
    spec = VERBS[verb]
    parser = _parser(verb)
    assert parser.usage == f"scrapy banker {verb} {spec.synopsis} [options]"
    assert parser.epilog is not None and f"{verb} takes {spec.usage}" in parser.epilog
    assert ("only" in parser.epilog) == ("jobdir" not in spec.where)
    assert HELPS[verb] == spec.help
    options = {a.dest for a in parser._actions}
    assert ("force" in options) == spec.takes_host
    assert ("topic" in options) == spec.takes_urls
    if spec.takes_urls:
        opts = parser.parse_args(["http://a.test/", "http://b.test/", "--topic", "news"])
        assert (opts.urls, opts.topic) == (["http://a.test/", "http://b.test/"], "news")
        return
    words = ["a.test", "5"] if spec.takes_value else ["a.test"]
    opts = parser.parse_args([*words, "--force"])
    assert (opts.target, getattr(opts, "value", None), opts.force) == (
        "a.test", "5" if spec.takes_value else None, True,
    )  # fmt: skip
    with pytest.raises(SystemExit):  # one word too many: argparse's usage error, exit 2
        parser.parse_args([*words, "extra"])


def test_the_command_lists_control_then_every_verb_with_its_help() -> None:
    assert ("control", *VERBS) == CONTROL
    assert set(HELPS) == set(CONTROL)


@pytest.mark.parametrize(("verb", "words"), [("purge", ["a.test"]), ("inject", ["http://a.test/"])])
def test_a_verb_a_jobdir_cannot_carry_out_is_refused_before_the_jobdir_is_read(
    tmp_path: Path, verb: str, words: list[str]
) -> None:
    made = make_jobdir(tmp_path / "job")
    for jobdir in (tmp_path / "nosuch", made):
        with pytest.raises(CommandError) as info:
            run_verb(verb, _opts(verb, *words, jobdir=str(jobdir)), Settings())
        assert str(info.value) == (
            f"{verb}: a single process's queue is its own memory; {verb} needs a crawl that "
            "runs on Redis (the BankerRedisScheduler)"
        )
    assert not (made / "banker" / "control.json").exists()


def test_a_verb_added_to_the_table_is_a_subcommand_that_acts_on_a_jobdir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nudge = Verb("nudge", (HOST,), help="Nudge a host")
    monkeypatch.setitem(core_control.VERBS, "nudge", nudge)  # type: ignore[arg-type]
    parser = _parser("nudge")
    assert parser.usage == "scrapy banker nudge HOST [options]"
    opts = parser.parse_args(["127.0.0.1:8731", "--jobdir", str(make_jobdir(tmp_path / "job"))])
    assert run_verb("nudge", argparse.Namespace(**{**vars(_opts("pause", "x")), **vars(opts)}),
                    Settings()) == 0  # fmt: skip
    note, line = capsys.readouterr().out.strip().splitlines()
    assert note.startswith("Note: '127.0.0.1:8731' taken as host '127.0.0.1'")
    assert line.startswith("nudge 127.0.0.1: in force in the crawl on this JOBDIR")
    [entry] = JobdirController(opts.jobdir, load_config(Settings())).file.log()
    assert (entry["verb"], entry["target"], logged_action(entry)) == (
        "nudge", "127.0.0.1", "nudge 127.0.0.1",
    )  # fmt: skip


def _table_rows(out: str) -> list[list[str]]:
    """The cells of every Rich table row in ``out`` (plain text in a pipe)."""
    return [
        [cell.strip() for cell in line.strip("│ ").split("│") if cell.strip()]
        for line in out.splitlines()
        if line.startswith("│")
    ]


def test_log_entries_in_words_and_time_stamps() -> None:
    assert logged_action({"verb": "limit", "target": "a.test", "value": 2}) == "limit a.test 2"
    assert logged_action({"verb": "budget", "target": "crawl"}) == "budget crawl none"
    urls = [f"http://a.test/{i}" for i in range(20)] + ["... 5 more"]
    assert logged_action({"verb": "inject", "urls": urls, "topic": "news"}) == (
        "inject 25 URL(s) (topic news)"
    )
    assert logged_action({"what": 1}) == '{"what": 1}'
    assert when(0) == datetime.fromtimestamp(0).astimezone().isoformat(timespec="seconds")
    assert when("garbage") == "garbage" and when(None) == ""


def test_json_document_puts_schema_and_kind_first() -> None:
    doc = json_document("control", {"kind": "ignored?", "x": 1})
    assert list(doc)[:2] == ["schema", "kind"] and doc["schema"] == 1
    assert json_document("action", {"x": 1}) == {"schema": 1, "kind": "action", "x": 1}


# -- a fleet ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fleet_actions_and_control_through_the_command(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    ks = Keyspace(PREFIX, PARTITIONS)
    redis_client.set(ks.finished, 0)  # a crawl exists under the prefix
    channel = ControlChannel(RedisFrontier(redis_client, prefix=PREFIX,
                                           partitions=PARTITIONS).link)  # fmt: skip
    channel.note_hosts(["127.0.0.1", "a.example", "www.shop.test"])
    redis_client.hset(ks.partition(1).meta, mapping={"u:127.0.0.1": 7, "o:127.0.0.1": 2,
                                                     "u:a.example": 3})  # fmt: skip
    redis_client.hset(ks.budget, mapping={"c": 10, "d": 8, "t:news": 4})
    settings = Settings({
        "REDIS_URL": redis_server.url, "BANKER_REDIS_PARTITIONS": PARTITIONS,
        "BANKER_HOST_BUDGET": 100, "BANKER_TOPICS": {"news": {"budget": 50}},
    })  # fmt: skip

    def run(verb: str, *words: str, **kw: Any) -> str:
        assert run_verb(verb, _opts(verb, *words, prefix=PREFIX, **kw), settings) == 0
        return capsys.readouterr().out

    note, line = run("pause", "127.0.0.1:8731").strip().splitlines()
    assert note.startswith("Note: '127.0.0.1:8731' taken as host '127.0.0.1'")
    assert line == "pause 127.0.0.1: in force fleet-wide within a heartbeat (control version 1)"
    assert channel.load().paused_hosts == {"127.0.0.1"}
    doc = json.loads(run("budget", "http://A.example:8080/x", "5", json=True))
    assert (doc["schema"], doc["kind"], doc["prefix"]) == (1, "action", PREFIX)
    assert doc["action"] == {"verb": "budget", "target": "a.example", "value": 5}
    assert "taken as host 'a.example'" in doc["notes"][0]
    injected = json.loads(run("inject", "http://a.example/1", json=True))
    assert injected["kind"] == "action" and injected["injected"] == 1
    assert injected["notes"] == []
    with pytest.raises(CommandError, match=r"no request of 'shop.test' .*did you mean "
                                           r"www.shop.test\? --force"):  # fmt: skip
        run_verb("pause", _opts("pause", "shop.test", prefix=PREFIX), settings)
    with pytest.raises(CommandError, match=r"delay: N must be .*got '1e300' \(at most 86,400 s\)"):
        run_verb("delay", _opts("delay", "a.example", "1e300", prefix=PREFIX), settings)

    shown = json.loads(run("control", json=True))
    assert (shown["schema"], shown["kind"], shown["prefix"]) == (1, "control", PREFIX)
    assert shown["counts"]["crawl"] == 10 and [e["verb"] for e in shown["log"]] == [
        "inject", "budget", "pause",
    ]  # fmt: skip
    out = run("control")
    assert "{" not in out
    rows = _table_rows(out)
    # Budgets: the operator's, else the settings'; pages charged and held.
    assert ["crawl", "none", "10 (8 done)", "2"] in rows
    assert ["topic:news", "50", "4"] in rows
    assert ["127.0.0.1", "100", "7", "2"] in rows and ["a.example", "5", "3", "0"] in rows
    assert [r[2] for r in rows if r and r[0][:2] == "20"] == [
        "inject 1 URL(s)", "budget a.example 5", "pause 127.0.0.1",
    ]  # fmt: skip


@pytest.mark.slow
def test_controller_reads_a_url_as_its_host_for_the_dashboard_too(
    redis_client: redis.Redis,
) -> None:
    frontier = RedisFrontier(redis_client, prefix=PREFIX, partitions=PARTITIONS)
    controller = Controller(frontier, load_config(Settings()), None)
    controller.channel.note_hosts(["a.example"])
    # What the dashboard does: parse, then execute; the note reaches the answer.
    action = controller.parse("limit", ["https://a.example:8443/x", "2"])
    answer = controller.execute(action, who="dash", now=1.0).to_json()
    assert answer["action"] == {"verb": "limit", "target": "a.example", "value": 2}
    assert "taken as host 'a.example'" in answer["notes"][0]
    with pytest.raises(ControlError, match=r"\(its hosts include a.example\); --force"):
        controller.parse("pause", ["unknown.example"])
