"""A JOBDIR's budgets as the operator reads them: ``status``, ``explain`` and ``control --jobdir``.

Issue #31 finding 3: over its crawl budget a single process closes and saves
the requests it held as ordinary pending ones; afterwards the commands said
they are "fetched when the crawl resumes", without a word about the budget,
and ``control --jobdir`` showed no counts.  Here the pages fetched come from
the JOBDIR's files (a snapshot's ``"budgets"`` and the journal's ``D``
records), the budgets in force are the operator's (``banker/control.json``)
over the settings', and the held requests are said to be held, over which
budget, with the counts -- in a fleet's words and JSON names.

JOBDIRs are written with the project's own journal functions (fast), and one
comes from a real crawl stopped by its crawl budget (the conformance suite's
CrawlSpider on a static tree).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import test_conformance as conformance
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from scrapy_banker.core.directives import BudgetRules
from scrapy_banker.core.hashing import bkdr
from scrapy_banker.core.journal import done_line, enqueue_line, header_line
from scrapy_banker.ops.jobdir_view import find_in_jobdir, jobdir_budgets, read_jobdir
from scrapy_banker.scheduler.control_file import CONTROL_FILE
from scrapy_banker.scheduler.serialize import RequestCodec

PORT = 8731
HOSTS = conformance.HOSTS
# The conformance suite's fixtures: a static tree on the web farm, a crawl backend.
tree = conformance.tree
make_backend = conformance.make_backend
_fingerprinter = RequestFingerprinter()


def _fingerprint(request: Request) -> str:
    return str(_fingerprinter.fingerprint(request).hex())


def _request(host: str, path: str, topic: str) -> Request:
    return Request(f"http://{host}:{PORT}{path}", meta={"banker_topic": topic})


def make_jobdir(
    root: Path,
    pending: list[tuple[str, str, str]],
    done: list[tuple[str, str, str]],
    *,
    before: dict[str, Any] | None = None,
    unused: int = 0,
    control: dict[str, Any] | None = None,
) -> Path:
    """A JOBDIR as a crawl leaves it after a kill: ``pending`` and ``done`` requests
    ``(host, path, topic)`` journaled in the snapshot, the ``done`` ones finished in the
    journal (their first ``unused`` finished without a page, as a retry's original is).

    ``before``: the snapshot header's ``"budgets"`` (pages counted before it).
    """
    codec = RequestCodec()
    folder = root / "banker"
    folder.mkdir(parents=True)
    header = json.loads(header_line(0, 1, len(pending), 0, None, None))
    if before is not None:
        header["budgets"] = before
    lines = [json.dumps(header) + "\n"]
    finished = []
    for seq, ((host, path, topic), is_done) in enumerate(
        [(p, False) for p in pending] + [(d, True) for d in done], 1
    ):
        request = _request(host, path, topic)
        lines.append(enqueue_line(seq, _fingerprint(request), topic, host, host, bkdr(host), 0,
                                  codec.encode(request)))  # fmt: skip
        if is_done:
            finished.append(seq)
    (folder / "snapshot.jsonl").write_text("".join(lines))
    (folder / "journal-0.jsonl").write_text(done_line(finished, finished[:unused]))
    if control is not None:
        (folder / CONTROL_FILE).write_text(json.dumps(control))
    return root


def _pages(host: str, topic: str, n: int, tag: str = "d") -> list[tuple[str, str, str]]:
    return [(host, f"/{tag}{i}", topic) for i in range(n)]


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    """a.test: 4 fetched (3 in the snapshot's count, 1 in the journal), 5 pending;
    b.test: 2 fetched (topic news), 3 pending; c.test: nothing fetched, 1 pending.
    One finished request of a.test used no budget (a retry's original)."""
    return make_jobdir(
        tmp_path / "job",
        _pages("a.test", "default", 5, "p") + _pages("b.test", "news", 3, "p")
        + [("c.test", "/x", "default")],
        _pages("a.test", "default", 2) + _pages("b.test", "news", 2),
        before={"hosts": {"a.test": 3}, "topics": {"default": 3}, "crawl": 3},
        unused=1,
    )  # fmt: skip


# -- the read model ---------------------------------------------------------------------------


def test_pages_come_from_the_files_and_nothing_is_held_without_a_budget(jobdir: Path) -> None:
    b = jobdir_budgets(str(jobdir), BudgetRules())
    assert b.pages.to_json() == {
        "hosts": {"a.test": 4, "b.test": 2}, "topics": {"default": 4, "news": 2}, "crawl": 6,
    }  # fmt: skip
    assert (b.in_force, b.held, b.pending, b.over) == (False, 0, 9, {})
    assert b.counts_json() == {
        "hosts": {"a.test": 4, "b.test": 2}, "held": {}, "topics": {"default": 4, "news": 2},
        "crawl": 6, "crawl_done": 6,
    }  # fmt: skip
    # Without budgets asked for, the view is what it always was (the dashboard reads it).
    view = read_jobdir(str(jobdir)).to_json()
    assert "budgets" not in view and "totals" not in view


def test_a_spent_crawl_budget_holds_every_pending_request(jobdir: Path) -> None:
    view = read_jobdir(str(jobdir), budgets=BudgetRules(crawl=6))
    doc = view.to_json()
    assert doc["totals"] == {"queued": 0, "over_budget": 9, "dead": 0}
    crawl = doc["budgets"]["crawl"]
    assert crawl == {"budget": 6, "fetched": 6, "spent": True, "pending": 9, "held": 9}
    assert doc["budgets"]["over"] == [{
        "target": "crawl", "kind": "crawl", "budget": 6, "fetched": 6,
        "set_by": "BANKER_CRAWL_BUDGET", "held": 9,
    }]  # fmt: skip
    hosts = {h["host"]: h for h in doc["budgets"]["hosts"]}
    assert hosts["a.test"] == {
        "host": "a.test", "budget": None, "fetched": 4, "pending": 5, "held": 5,
        "held_over": {"crawl": 5},
    }  # fmt: skip
    assert list(hosts) == ["a.test", "b.test", "c.test"]  # most held first
    # Room left: nothing is held.
    assert read_jobdir(str(jobdir), budgets=BudgetRules(crawl=7)).over_budget == 0


def test_host_and_topic_budgets_and_the_operator_s_outranking_the_settings(
    jobdir: Path,
) -> None:
    rules = BudgetRules(patterns=(("a.*", 4),), topics={"news": 2})
    b = jobdir_budgets(str(jobdir), rules)
    assert (b.held, b.held_hosts, b.held_topics) == (8, {"a.test": 5, "b.test": 3}, {
        "default": 5, "news": 3})  # fmt: skip
    assert {t: (h.kind, h.budget, h.fetched, h.set_by) for t, h in b.over.items()} == {
        "a.test": ("host", 4, 4, "BANKER_HOST_BUDGETS"),
        "topic:news": ("topic", 2, 2, "BANKER_TOPICS"),
    }
    assert b.held_by_target() == {"a.test": 5, "topic:news": 3}
    # The operator's budgets (control.json) outrank the settings': a.test raised, c.test set 0.
    control = {"version": 2, "hosts": {"a.test": {"budget": 10}, "c.test": {"budget": 0}}}
    (jobdir / "banker" / CONTROL_FILE).write_text(json.dumps(control))
    b = jobdir_budgets(str(jobdir), rules)
    assert b.held_hosts == {"b.test": 3, "c.test": 1}
    assert b.over["c.test"].set_by == "operator" and b.control_error is None
    assert b.counts_json()["held"] == {"b.test": 3, "c.test": 1}
    # A control file that is no control document: the settings' budgets, and why.
    (jobdir / "banker" / CONTROL_FILE).write_text("{oops")
    b = jobdir_budgets(str(jobdir), rules)
    assert b.held_hosts == {"a.test": 5, "b.test": 3}
    assert b.control_error is not None and "control.json is not read" in b.control_error


def test_explain_finds_a_held_request_over_budget(jobdir: Path) -> None:
    held = _request("a.test", "/p3", "default")
    found = find_in_jobdir(str(jobdir), held, bkdr("a.test"), _fingerprint,
                           BudgetRules(default=4, crawl=6))  # fmt: skip
    assert found.state == "over budget" and found.held is not None
    assert (found.held.target, found.held.budget, found.held.fetched) == ("a.test", 4, 4)
    assert [b.target for b in found.budgets if b.spent] == ["a.test", "crawl"]
    free = find_in_jobdir(str(jobdir), held, bkdr("a.test"), _fingerprint, BudgetRules(crawl=9))
    assert free.state == "queued" and free.held is None and free.budgets[0].fetched == 6
    # Without the settings' budgets: as before.
    assert find_in_jobdir(str(jobdir), held, bkdr("a.test"), _fingerprint).state == "queued"


# -- the commands ---------------------------------------------------------------------------


def _banker(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``scrapy banker ARGS`` outside a project, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "banker", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
        env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\x1b[" not in proc.stdout
    return proc.stdout


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_ok(proc))
    return data


def _rows(out: str) -> list[list[str]]:
    """The cells of every Rich table row in ``out`` (plain text in a pipe)."""
    return [
        [cell.strip() for cell in line.strip("│ ").split("│") if cell.strip()]
        for line in out.splitlines()
        if line.startswith("│")
    ]


@pytest.mark.slow
def test_status_explain_and_control_say_which_budget_holds_what(
    jobdir: Path, tmp_path: Path
) -> None:
    job = str(jobdir)
    settings = ["-s", "BANKER_HOST_BUDGETS={\"a.test\": 4}", "-s",
                'BANKER_TOPICS={"news": {"budget": 2}}']  # fmt: skip
    (jobdir / "banker" / CONTROL_FILE).write_text(
        json.dumps({"version": 1, "hosts": {"c.test": {"budget": 0}}})
    )

    status = _json(_banker("status", "--jobdir", job, "--json", *settings, cwd=tmp_path))
    assert status["kind"] == "jobdir"
    assert status["totals"] == {"queued": 0, "over_budget": 9, "dead": 0}
    assert {o["target"]: (o["held"], o["set_by"]) for o in status["budgets"]["over"]} == {
        "a.test": (5, "BANKER_HOST_BUDGETS"), "c.test": (1, "operator"),
        "topic:news": (3, "BANKER_TOPICS"),
    }  # fmt: skip
    text = _ok(_banker("status", "--jobdir", job, *settings, cwd=tmp_path))
    lines = text.splitlines()
    assert lines[0] == f"JOBDIR {job}: 9 requests pending, 9 held over budget"
    assert "  a.test: 5 held over budget (host budget 4, 4 fetched)" in lines
    assert "  c.test: 1 held over budget (host budget 0, 0 fetched)" in lines
    assert "  topic:news: 3 held over budget (topic budget 2, 2 fetched)" in lines
    release = lines[-1]
    assert release.startswith(
        f"To fetch them, raise their budget with scrapy banker budget TARGET N --jobdir {job}"
    ), release
    assert "or in the settings (BANKER_HOST_BUDGETS, BANKER_TOPICS)" in release
    assert "fetched when the crawl resumes" not in text
    rows = _rows(text)
    assert ["crawl", "none", "6", "9", "9"] in rows and ["a.test", "4", "4", "5", "5"] in rows

    # One request held over its host's budget, one free: the sentence says which.
    url = f"http://a.test:{PORT}/p0"
    explain = _json(_banker("explain", url, "--jobdir", job, "--json", *settings, cwd=tmp_path))
    assert explain["state"] == "over budget"
    assert explain["over_budget"] == {
        "target": "a.test", "kind": "host", "budget": 4, "fetched": 4,
        "set_by": "BANKER_HOST_BUDGETS",
    }  # fmt: skip
    assert explain["waiting"] == (
        "it is over budget: its host (a.test) has been fetched 4 pages, as many as its budget "
        f"(4) allows; it is kept, and fetched if the budget is raised (scrapy banker budget "
        f"a.test N --jobdir {job}, or BANKER_HOST_BUDGETS) and the crawl resumes with "
        f"JOBDIR={job}"
    )
    text = _ok(_banker("explain", url, "--jobdir", job, *settings, cwd=tmp_path))
    assert "over budget" in text and "fetched when the crawl resumes" not in text
    free = _json(_banker("explain", url, "--jobdir", job, "--json", cwd=tmp_path))
    assert free["state"] == "queued" and free["over_budget"] is None
    assert free["waiting"].endswith(f"it is fetched when the crawl resumes with JOBDIR={job}")

    # control --jobdir: the fleet's counts, under the fleet's keys.
    control = _json(_banker("control", "--jobdir", job, "--json", *settings, cwd=tmp_path))
    assert control["kind"] == "control-jobdir"
    assert control["counts"] == {
        "hosts": {"a.test": 4, "b.test": 2}, "held": {"a.test": 5, "b.test": 3, "c.test": 1},
        "topics": {"default": 4, "news": 2}, "crawl": 6, "crawl_done": 6,
    }  # fmt: skip
    rows = _rows(_ok(_banker("control", "--jobdir", job, *settings, cwd=tmp_path)))
    assert ["crawl", "none", "6", "9"] in rows and ["a.test", "4", "4", "5"] in rows
    assert ["topic:news", "2", "2"] in rows and ["c.test", "0", "0", "1"] in rows


# -- a real crawl stopped by its crawl budget ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_crawl_closed_over_its_crawl_budget_is_shown_held_over_it(make_backend: Any) -> None:
    b = make_backend("jobdir")
    stats = b.run(BANKER_CRAWL_BUDGET=30)
    assert {s["finish_reason"] for s in stats} == {"banker_crawl_budget"}
    budget = ["-s", "BANKER_CRAWL_BUDGET=30"]

    status = json.loads(_ok(b.banker("status", "--json", *budget)))
    pending = status["queued"]
    assert pending > 0 and status["totals"] == {"queued": 0, "over_budget": pending, "dead": 0}
    crawl = status["budgets"]["crawl"]
    assert crawl == {"budget": 30, "fetched": 30, "spent": True, "pending": pending,
                     "held": pending}  # fmt: skip
    # The pages counted from the files are the pages the farm served.
    hosts = {h["host"]: h for h in status["budgets"]["hosts"]}
    assert {h: hosts[h]["fetched"] for h in HOSTS} == {h: b.fetched(h) for h in HOSTS}
    text = _ok(b.banker("status", *budget))
    assert f"{pending} requests pending, {pending} held over budget" in text.splitlines()[0]
    assert (
        "Held over budget: crawl budget 30 spent (30 fetched): every pending request is held"
        in text
    )
    assert re.search(
        r"raise their budget with scrapy banker budget crawl N --jobdir \S+, or in "
        r"the settings \(BANKER_CRAWL_BUDGET\), then resume the crawl",
        text,
    )

    # A saved request, explained: held over the crawl budget, with the count.
    snapshot = Path(b.jobdir, "banker", "snapshot.jsonl").read_text().splitlines()
    saved = next(json.loads(line) for line in snapshot if line.startswith('{"e":'))
    url = saved["r"]["url"]
    explain = json.loads(_ok(b.banker("explain", url, "--json", *budget)))
    assert explain["state"] == "over budget"
    assert explain["waiting"].startswith(
        "it is over budget: the crawl has fetched 30 pages, as many as its budget (30) allows"
    )

    control = json.loads(_ok(b.banker("control", "--json", *budget)))
    counts = control["counts"]
    assert (counts["crawl"], sum(counts["held"].values())) == (30, pending)
    assert counts["hosts"] == {h: hosts[h]["fetched"] for h in HOSTS if hosts[h]["fetched"]}
