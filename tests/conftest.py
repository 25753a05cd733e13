"""What the test modules share: the repository's paths, a subprocess runner, farms, Redis.

Test modules import the helpers by name (``from conftest import ROOT, run_python``);
pytest puts this folder on ``sys.path`` (as it does for ``spider_matrix``).

Markers (registered in ``setup.cfg``):

``slow``
    The test starts a process, a web farm, a crawl, a server (redis-server
    through :func:`redis_server` / :func:`redis_client` included) or a
    browser.  ``pytest -m "not slow"`` is the inner loop: pure code only.
``scrapy213``
    A slow test that drives Scrapy itself (a real crawl): CI runs it again
    on Scrapy 2.13, the oldest version ``setup.cfg`` allows, with every test
    that is not slow -- ``-m "(not slow or scrapy213) and not fleetfaults"``.
``fleetfaults``
    A long Redis fault-injection or cluster fleet run (kill -9, restarts,
    pauses): Redis's behaviour, not Scrapy's, so never rerun on 2.13.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from scrapy_banker.testing.farm import FarmConfig, WebFarm
from scrapy_banker.testing.redis_server import RedisServer

#: The checkout's root and the folders the tests reach into.
ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
BENCH = ROOT / "benchmarks"
PROJECT = ROOT / "example_project"
#: The PlanetLab RTT matrix the repository ships (``data/rtt/README.md``).
PLANETLAB = ROOT / "data" / "rtt" / "planetlab-490-t1.tsv.gz"

# The commands' output in a pipe must not depend on the terminal pytest runs in
# (pytest-xdist's workers are given its width): a test that wants one sets it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


# -- processes ---------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH``, plus ``extra``.

    A child then imports this tree's ``scrapy_banker`` whatever its working
    directory (``example_project/``, a temporary folder).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def output_tail(proc: subprocess.CompletedProcess[str], chars: int = 3000) -> str:
    """The end of a finished process's stdout and stderr, for an assertion message."""
    return (
        f"exit code {proc.returncode}\n--- stdout\n{(proc.stdout or '')[-chars:]}"
        f"\n--- stderr\n{(proc.stderr or '')[-chars:]}"
    )


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] = ROOT,
    timeout: float = 240,
    expect: int | None = 0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion, its output captured as text.

    The exit code must be ``expect`` (``None``: any), else the assertion
    shows the tail of the output.  ``env`` defaults to :func:`child_env`.
    """
    proc = subprocess.run(
        [os.fspath(c) for c in cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env() if env is None else env,
        check=False,
    )
    if expect is not None:
        assert proc.returncode == expect, output_tail(proc)
    return proc


def run_python(*args: str | os.PathLike[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """:func:`run` this interpreter with ``args`` (a script, ``-c code``, ``-m module``)."""
    return run([sys.executable, *args], **kwargs)


def run_scrapy(*args: str | os.PathLike[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """:func:`run` the ``scrapy`` command, in ``example_project/`` unless ``cwd`` says otherwise."""
    kwargs.setdefault("cwd", PROJECT)
    return run_python("-m", "scrapy", *args, **kwargs)


# -- web farms ---------------------------------------------------------------------


def farm_fixture(
    config: FarmConfig | Callable[[pytest.TempPathFactory], FarmConfig],
    *,
    scope: str = "module",
) -> Any:
    """A fixture running one :class:`WebFarm` for ``scope`` (a module by default).

    Assign it to the fixture's name at module level::

        farm = farm_fixture(FarmConfig(seed=7, hosts=6, total_pages=240))

    ``config`` may be a function of ``tmp_path_factory``, for a farm that
    reads files (an RTT matrix, static sites).  Tests using it start a
    process: mark them ``slow``.
    """

    @pytest.fixture(scope=scope)
    def _farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebFarm]:
        cfg = config if isinstance(config, FarmConfig) else config(tmp_path_factory)
        with WebFarm(cfg) as farm:
            yield farm

    return _farm


# -- Redis -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free port, shared by the session's tests (mark them slow)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client on a freshly flushed database of the session's server."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()  # a previous test may have killed it on purpose
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()
