"""How a benchmark runs: modes and options, CPU accounting, crawler processes (not a public API).

A benchmark is its workload plus its peers (``_common.py``); this module is
the rest, the same for all of them:

* **Modes and options.**  :func:`parser` builds the command line: the
  description is the docstring's first line, ``--quick`` and (where the
  benchmark has one) ``--tiny`` pick the mode, the full run being the
  default; :func:`mode` / :func:`pick` read it, :func:`override` lays the
  options a user gave over the mode's workload (a frozen dataclass), and
  :func:`add_repeats` / :func:`add_settings` add ``--repeats N`` and a
  repeatable ``--set KEY=JSON`` (a bad value is a usage error naming it).
* **CPU accounting.**  :func:`self_cpu_s` / :func:`children_cpu_s`
  (``getrusage``), :class:`CpuWindow` (all cores' busy share from
  ``/proc/stat`` and the reaped children's CPU over a stretch of time) and
  :func:`redis_cpu_s` (a ``redis-server``'s own).
* **Crawler processes.**  A crawl runs in a process of its own (a Twisted
  reactor cannot be restarted, and peers must not share an interpreter):
  :func:`crawl` writes a JSON spec, runs ``_runner.py`` on it and returns
  the crawl's final stats with its wall and CPU time (:func:`crawls`:
  several at once); :func:`run_json` runs any Python child whose last
  stdout line is JSON.  What runs inside the crawler (spiders, extensions,
  the engine-heartbeat tweak) is ``_crawler.py``; fleets of worker
  processes are ``_fleet.py``.

Imported as a sibling (``import _harness``), like ``_common``.  Only the
standard library is imported at the top: the crawler processes import it
too (``_runner.py``, ``_crawler.py``), and their CPU is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The PlanetLab RTT matrix the repository ships (``data/rtt/README.md``).
RTT_MATRIX = ROOT / "data" / "rtt" / "planetlab-490-t1.tsv.gz"
#: The crawler process: ``python benchmarks/_runner.py SPEC.json``.
RUNNER = HERE / "_runner.py"
#: The spider of the farm crawls: every host root as a seed, every farm link followed.
FARM_SPIDER = "scrapy_banker.testing.fleet:FleetSpider"

T = TypeVar("T")

# This checkout's scrapy_banker, whether the package is installed or not.
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

# -- modes and options -------------------------------------------------------------------


def parser(
    doc: str | None, *, quick: str | None = None, tiny: str | None = None
) -> argparse.ArgumentParser:
    """A benchmark's command line, described by ``doc``'s first line: ``--quick`` and
    ``--tiny`` (their help texts; ``tiny=""``: hidden, a smoke-test size the tests use;
    ``None``: no such mode), one at a time."""
    description = (doc or "").strip().split("\n", 1)[0] or None
    out = argparse.ArgumentParser(description=description)
    has_modes = quick is not None or tiny is not None
    modes = out.add_mutually_exclusive_group() if has_modes else out
    if quick is not None:
        modes.add_argument("--quick", action="store_true", help=quick)
    if tiny is not None:
        modes.add_argument("--tiny", action="store_true", help=tiny or argparse.SUPPRESS)
    return out


def mode(args: argparse.Namespace) -> str:
    """``"tiny"``, ``"quick"`` or ``"full"`` (no mode option given)."""
    if getattr(args, "tiny", False):
        return "tiny"
    return "quick" if getattr(args, "quick", False) else "full"


def pick(args: argparse.Namespace, *, full: T, quick: T, tiny: T | None = None) -> T:
    """The value of the mode ``args`` ask for."""
    chosen = {"full": full, "quick": quick, "tiny": tiny}[mode(args)]
    assert chosen is not None, "this benchmark has no --tiny mode"
    return chosen


def override(base: T, args: argparse.Namespace, **fields: str) -> T:
    """``base`` (a dataclass) with ``field=option``'s value wherever that option was given.

    ``override(QUICK, args, total_pages="pages")`` replaces
    ``QUICK.total_pages`` by ``args.pages`` unless it is ``None``.
    """
    given = {f: getattr(args, opt) for f, opt in fields.items() if getattr(args, opt) is not None}
    return dataclasses.replace(base, **given) if given else base  # type: ignore[type-var]


def positive(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def add_repeats(out: argparse.ArgumentParser, help: str, default: int | None = None) -> None:
    """``--repeats N`` (N >= 1); ``None`` when not given and no default, i.e. the mode's."""
    out.add_argument("--repeats", type=positive, default=default, metavar="N", help=help)


def setting(text: str) -> tuple[str, Any]:
    """An argparse type: ``KEY=JSON`` as ``(key, value)``; a bad one is a usage error."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=JSON, e.g. BANKER_REDIS_BUFFER=8")
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the value is not JSON ({exc.msg}); quote a string, e.g. "
            f"{key.strip()}='\"{raw}\"'"
        ) from None


def add_settings(out: argparse.ArgumentParser, help: str, flag: str = "--set") -> None:
    """A repeatable ``flag KEY=JSON``; :func:`settings` turns the pairs into a dict."""
    out.add_argument(flag, type=setting, action="append", default=[], metavar="KEY=JSON", help=help)


def settings(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """The ``--set`` pairs as settings (a later one wins)."""
    return dict(pairs)


def overlaid(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s settings on top, a dict setting merged key by key.

    ``--set DOWNLOADER_MIDDLEWARES='{"x.Mw": 900}'`` adds a middleware, as a
    project's ``settings.py`` entry adds to Scrapy's ``*_BASE`` dicts; it
    must not drop the benchmark's own extensions, middlewares or add-ons.
    """
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = {**old, **value}
        else:
            out[key] = value
    return out


# -- CPU accounting ----------------------------------------------------------------------


def self_cpu_s() -> float:
    """This process's CPU seconds so far (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    """CPU seconds of this process's children so far, once they have been reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class CpuWindow:
    """The machine's and the children's CPU over a stretch of time: start, then :meth:`stop`.

    ``busy``: the share of all cores busy (``nan`` off Linux); ``children_s``:
    CPU seconds of the children reaped in between -- reap them before
    :meth:`stop` to count them.
    """

    def __init__(self) -> None:
        self._ticks = cpu_ticks()
        self._children = children_cpu_s()
        self.busy = float("nan")
        self.children_s = 0.0

    def stop(self) -> CpuWindow:
        ticks = cpu_ticks()
        if self._ticks is not None and ticks is not None and ticks[1] > self._ticks[1]:
            self.busy = (ticks[0] - self._ticks[0]) / (ticks[1] - self._ticks[1])
        self.children_s = children_cpu_s() - self._children
        return self


def redis_cpu_s(client: Any, main_thread: bool = False) -> float:
    """A redis-server's CPU seconds (``INFO cpu``); ``main_thread``: its command thread's only.

    Older servers do not split the threads: the whole process's is returned then.
    """
    info = client.info("cpu")
    if main_thread and "used_cpu_sys_main_thread" in info:
        return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


# -- child processes ---------------------------------------------------------------------


def workers_import_benchmarks() -> None:
    """Let child processes import this folder's modules (extensions loaded by import path)."""
    here = str(HERE)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, *paths) if p)


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object on the last line of a child's stdout."""
    data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return data


def _failed(what: str, code: int | None, stderr: str) -> SystemExit:
    sys.stderr.write(stderr[-5000:])
    return SystemExit(f"{Path(sys.argv[0]).stem}: {what} failed (exit code {code})")


def run_json(
    args: Sequence[str | os.PathLike[str]],
    *,
    what: str,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``python args...``; its last stdout line, parsed.  A failure ends the benchmark."""
    proc = subprocess.run(
        [sys.executable, *(os.fspath(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        check=False,
    )
    if proc.returncode != 0:
        raise _failed(what, proc.returncode, proc.stderr)
    return last_json(proc.stdout)


@dataclasses.dataclass
class Crawl:
    """One finished crawl: its final stats and what it cost."""

    stats: dict[str, Any]
    #: Wall seconds from the process's start to its exit (of the batch's last process).
    wall_s: float
    #: CPU seconds of the crawler process (of the batch's processes), start-up included.
    cpu_s: float
    stderr: str


def farm_crawl_settings() -> dict[str, Any]:
    """Settings of a crawl of the web farm, whatever the peer: its resolver, no delay, quiet."""
    from scrapy_banker.testing.resolver import farm_settings

    return {
        **farm_settings(),
        "DOWNLOAD_DELAY": 0,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
    }


def with_extensions(
    settings: Mapping[str, Any], extensions: Sequence[str] = (), heartbeat_s: float | None = None
) -> dict[str, Any]:
    """``settings`` plus ``extensions`` (import paths, order 0) and an engine heartbeat.

    ``heartbeat_s``: how often Scrapy's engine polls the scheduler
    (:class:`_crawler.EngineHeartbeat`); ``None`` or 0 leaves Scrapy's 5 s.
    """
    merged = dict(settings)
    exts = {**(merged.get("EXTENSIONS") or {}), **dict.fromkeys(extensions, 0)}
    if heartbeat_s:
        exts["_crawler.EngineHeartbeat"] = 0
        merged["BENCH_ENGINE_HEARTBEAT"] = float(heartbeat_s)
    if exts:
        merged["EXTENSIONS"] = exts
    return merged


def crawl_spec(
    spider: str,
    settings: Mapping[str, Any],
    *,
    spider_kwargs: Mapping[str, Any] | None = None,
    extensions: Sequence[str] = (),
    heartbeat_s: float | None = None,
) -> dict[str, Any]:
    """The spec ``_runner.py`` reads: a spider (``module:Class``) and its settings
    (:func:`with_extensions` ``extensions`` and ``heartbeat_s``)."""
    return {
        "spider": spider,
        "spider_kwargs": dict(spider_kwargs or {}),
        "settings": with_extensions(settings, extensions, heartbeat_s),
    }


def crawls(
    specs: Mapping[str, Mapping[str, Any]],
    workdir: Path,
    *,
    timeout: float,
    outputs: Sequence[Path] = (),
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Crawl]:
    """Run crawls (``_runner.py``) at once, one process each, from specs (:func:`crawl_spec`).

    Each spec is written to ``workdir/<name>-spec.json``, its process's
    output to ``<name>.out`` / ``<name>.err``.  A crawl that exits non-zero,
    or a batch that leaves one of ``outputs`` unwritten, ends the benchmark.
    Wall and CPU time are the batch's: start a farm before and stop it
    after, so that its process is not counted.
    """
    procs: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}
    cpu_before = children_cpu_s()
    started = time.perf_counter()
    for name, spec in specs.items():
        spec_file = workdir / f"{name}-spec.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        out, err = workdir / f"{name}.out", workdir / f"{name}.err"
        with out.open("wb") as stdout_file, err.open("wb") as stderr_file:
            proc = subprocess.Popen(
                [sys.executable, str(RUNNER), str(spec_file)],
                stdout=stdout_file,
                stderr=stderr_file,
                cwd=cwd,
                env=None if env is None else {**os.environ, **env},
            )
        procs[name] = (proc, out, err)
    deadline = time.monotonic() + timeout
    for proc, _, _ in procs.values():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other, _, _ in procs.values():
                other.kill()
                other.wait()
            raise
    wall = time.perf_counter() - started
    cpu = children_cpu_s() - cpu_before
    result: dict[str, Crawl] = {}
    for name, (proc, out, err) in procs.items():
        stderr = err.read_text("utf-8", errors="replace")
        if proc.returncode != 0 or not all(p.exists() for p in outputs):
            raise _failed(f"the {name} crawl", proc.returncode, stderr)
        stats = last_json(out.read_text("utf-8"))["stats"]
        result[name] = Crawl(stats, wall, cpu, stderr)
    return result


def crawl(
    spec: Mapping[str, Any],
    workdir: Path,
    name: str,
    *,
    timeout: float,
    outputs: Sequence[Path] = (),
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Crawl:
    """One crawl in its own process: :func:`crawls` of one."""
    return crawls({name: spec}, workdir, timeout=timeout, outputs=outputs, cwd=cwd, env=env)[name]
