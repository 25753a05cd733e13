"""Start-up errors are one line a person reads, not a traceback (#31): scrapy_banker.errors.

The slow tests run ``scrapy crawl`` in a tiny project written into ``tmp_path``
(the README's ``ADDONS`` line and a spider with nothing to fetch): a bad
setting, a JOBDIR another process holds, with and without ``--nolog``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import scrapy
from conftest import child_env, output_tail, run_scrapy

from scrapy_banker.errors import (
    BankerConfigError,
    BankerError,
    StartupErrorFilter,
    _shown,
    startup_error,
)
from scrapy_banker.scheduler.jobdir import JobdirLocked

SCRAPY = tuple(int(p) for p in scrapy.__version__.split(".")[:2])
LINE = "Cannot start the crawl: "

# -- the filter, in this process ------------------------------------------------------


def _record(exc: BaseException, name: str = "asyncio") -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        return logging.getLogger(name).makeRecord(
            name, logging.ERROR, __file__, 1, "Task exception was never retrieved", (),
            sys.exc_info(),
        )  # fmt: skip


def test_the_errors_are_still_value_and_runtime_errors() -> None:
    assert issubclass(BankerConfigError, ValueError) and issubclass(BankerConfigError, BankerError)
    assert issubclass(JobdirLocked, RuntimeError) and issubclass(JobdirLocked, BankerError)


def test_the_error_is_found_where_scrapy_chained_its_own_to_it() -> None:
    refused = JobdirLocked("another crawl holds JOBDIR j")
    try:
        try:
            raise refused
        except JobdirLocked:
            raise RuntimeError("Engine slot not assigned")  # noqa: B904 -- as Scrapy does
    except RuntimeError as closing:
        assert startup_error(closing) is refused
    assert startup_error(RuntimeError("other")) is None
    assert startup_error(None) is None


def test_a_start_up_error_record_becomes_one_error_line_and_a_debug_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = BankerConfigError("Invalid BANKER_X=1: expected 2")
    with caplog.at_level(logging.DEBUG):
        assert StartupErrorFilter().filter(_record(error)) is False
        assert StartupErrorFilter().filter(_record(error, "scrapy.core.engine")) is False
        assert StartupErrorFilter().filter(_record(KeyError("other"))) is True
    ours = [r for r in caplog.records if r.name == "scrapy_banker.errors"]
    assert [(r.levelno, r.getMessage()) for r in ours if r.levelno > logging.DEBUG] == [
        (logging.ERROR, f"{LINE}Invalid BANKER_X=1: expected 2")
    ]  # told once, though two loggers reported it
    tracebacks = [r for r in ours if r.levelno == logging.DEBUG]
    assert len(tracebacks) == 2 and all(r.exc_info for r in tracebacks)
    assert "logged by asyncio as: Task exception" in tracebacks[0].getMessage()


def test_a_line_no_handler_would_show_is_known() -> None:
    log = logging.getLogger("tests.errors.shown")
    log.propagate = False
    try:
        log.addHandler(logging.NullHandler())  # what --nolog leaves
        assert not _shown(log, logging.ERROR)
        log.addHandler(logging.StreamHandler(stream=sys.stderr))
        log.handlers[-1].setLevel(logging.CRITICAL)  # LOG_LEVEL=CRITICAL
        assert not _shown(log, logging.ERROR)
        log.handlers[-1].setLevel(logging.INFO)
        assert _shown(log, logging.ERROR)
    finally:
        log.handlers.clear()
        log.propagate = True


# -- real crawls --------------------------------------------------------------------

SPIDER = """\
import scrapy


class Nothing(scrapy.Spider):
    name = "nothing"
    start_urls = []
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("errors_project")
    (root / "scrapy.cfg").write_text("[settings]\ndefault = errproj.settings\n")
    package = root / "errproj"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "nothing.py").write_text(SPIDER)
    (package / "settings.py").write_text(
        'BOT_NAME = "errproj"\n'
        'SPIDER_MODULES = ["errproj.spiders"]\n'
        'ADDONS = {"scrapy_banker.Addon": 500}\n'
        "TELNETCONSOLE_ENABLED = False\n"
    )
    return root


def _crawl(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_scrapy("crawl", "nothing", *args, cwd=project, expect=None, timeout=60)


def _one_line(proc: subprocess.CompletedProcess[str], *names: str) -> str:
    """The one line the crawl printed about its error, checked to name ``names``."""
    output = proc.stdout + proc.stderr
    lines = [line for line in output.splitlines() if LINE in line]
    assert len(lines) == 1, output_tail(proc)
    assert all(name in lines[0] for name in names), output_tail(proc)
    return lines[0]


BAD = [
    # Parsed by the add-on, before anything is built.
    ("BANKER_TOPIC_SLICE=abc", "Invalid BANKER_TOPIC_SLICE='abc': expected a number"),
    (
        'BANKER_TOPICS={"a": "x"}',
        "Invalid BANKER_TOPICS['a']='x': expected an integer priority, or a dict with keys",
    ),
    ("BANKER_RECRAWL_SIGNATURE=dom", "Invalid BANKER_RECRAWL_SIGNATURE='dom': allowed: ['body'"),
    # Parsed by a downloader middleware, while the engine is built.
    ("BANKER_PLACEMENT=nowhere", "Invalid BANKER_PLACEMENT='nowhere': expected one of hash"),
]


@pytest.mark.slow
@pytest.mark.scrapy213
@pytest.mark.parametrize(("setting", "message"), BAD, ids=[s.split("=")[0] for s, _ in BAD])
def test_a_bad_setting_is_one_error_line_and_exit_1(
    project: Path, setting: str, message: str
) -> None:
    proc = _crawl(project, "-s", setting, "-s", "LOG_LEVEL=INFO")
    assert proc.returncode == 1, output_tail(proc)
    line = _one_line(proc, message)
    assert "ERROR: " in line
    assert "Traceback" not in proc.stdout + proc.stderr, output_tail(proc)
    errors = [ln for ln in proc.stderr.splitlines() if "] ERROR: " in ln or "] CRITICAL: " in ln]
    assert errors == [line], output_tail(proc)


#: Scrapy >= 2.14 runs an AsyncCrawlerProcess: asyncio reports the unhandled error.
#: FORCE_CRAWLER_PROCESS (what Scrapy 2.13 always runs, where the setting does
#: not exist): Twisted's "Unhandled error in Deferred", which it also prints itself.
PROCESSES = ["FORCE_CRAWLER_PROCESS=False", "FORCE_CRAWLER_PROCESS=True"]


@pytest.mark.slow
@pytest.mark.scrapy213
@pytest.mark.parametrize("process", PROCESSES)
def test_with_nolog_the_line_is_all_that_is_printed(project: Path, process: str) -> None:
    proc = _crawl(project, "--nolog", "-s", BAD[0][0], "-s", process)
    assert proc.returncode == 1, output_tail(proc)
    assert (proc.stdout + proc.stderr).strip() == LINE + BAD[0][1], output_tail(proc)


@pytest.mark.slow
@pytest.mark.scrapy213
def test_twisted_s_report_is_one_line_too(project: Path) -> None:
    proc = _crawl(project, "-s", BAD[1][0], "-s", PROCESSES[1], "-s", "LOG_LEVEL=INFO")
    assert proc.returncode == 1, output_tail(proc)
    _one_line(proc, BAD[1][1])
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "Unhandled error" not in output, output_tail(proc)


@pytest.mark.slow
@pytest.mark.scrapy213
def test_at_debug_level_the_traceback_follows_the_line(project: Path) -> None:
    proc = _crawl(project, "-s", BAD[0][0], "-s", "LOG_LEVEL=DEBUG")
    assert proc.returncode == 1, output_tail(proc)
    _one_line(proc, BAD[0][1])
    _, after = proc.stderr.split(LINE, 1)
    assert "DEBUG: Traceback of the error above" in after, output_tail(proc)
    assert "Traceback (most recent call last)" in after
    assert "scrapy_banker.errors.BankerConfigError: " + BAD[0][1] in after


HOLD = """\
import sys
from scrapy_banker.scheduler.jobdir import JobdirLock

lock = JobdirLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes it
"""


@pytest.mark.slow
@pytest.mark.scrapy213
def test_a_jobdir_another_process_holds_is_refused_in_one_line(
    project: Path, tmp_path: Path
) -> None:
    jobdir = tmp_path / "job"
    (jobdir / "banker").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(jobdir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        for args in (["-s", "LOG_LEVEL=INFO"], ["--nolog"]):
            proc = _crawl(project, "-s", f"JOBDIR={jobdir}", *args)
            line = _one_line(proc, f"another crawl holds JOBDIR {jobdir} (process {holder.pid}")
            assert "Traceback" not in proc.stdout + proc.stderr, output_tail(proc)
            if args == ["--nolog"]:
                assert (proc.stdout + proc.stderr).strip() == line
            # Refused by the add-on before the spider is built: exit 1 on every
            # Scrapy (2.13's crawl command exits 0 for a failure after that).
            assert proc.returncode == 1, output_tail(proc)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.scrapy213
def test_a_jobdir_this_version_cannot_resume_is_refused_in_one_line_and_left_as_it_was(
    project: Path, tmp_path: Path
) -> None:
    jobdir = tmp_path / "job"
    (jobdir / "banker").mkdir(parents=True)
    snapshot = jobdir / "banker" / "snapshot.jsonl"
    written = '{"banker":"snapshot","version":99,"generation":1,"next_seq":0}\n'
    snapshot.write_text(written)
    proc = _crawl(project, "-s", f"JOBDIR={jobdir}", "-s", "LOG_LEVEL=INFO")
    line = _one_line(proc, f"JOBDIR {jobdir} cannot be resumed", "layout version 99")
    assert "give the crawl another JOBDIR" in line
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "AssertionError" not in output, output_tail(proc)
    assert snapshot.read_text() == written  # nothing rewritten
    assert sorted(p.name for p in (jobdir / "banker").iterdir()) == ["lock", "snapshot.jsonl"]
    assert proc.returncode == 1, output_tail(proc)
