"""The farm's launcher: run the server in a child process for a test or a benchmark.

:class:`WebFarm` starts ``python -m scrapy_banker.testing.farm.server`` with
a :class:`~scrapy_banker.testing.farm.model.FarmConfig`, waits for its
``LISTENING <port>`` line and stops it (SIGTERM, then SIGKILL) on exit or
when garbage-collected.  A separate process keeps the farm's CPU time and
reactor apart from the crawler under test, which matters both for throughput
numbers and for crawls that run their own reactor.  No Twisted here: the
launcher talks to the farm over plain ``http.client``.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, cast

from scrapy_banker.testing.farm.model import STATS_PREFIX, FarmConfig, FarmModel
from scrapy_banker.testing.farm.pushback import HostPushback

logger = logging.getLogger(__name__)

__all__ = ["WebFarm"]


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL: used by stop() and by the garbage-collection safety net."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        except ProcessLookupError:  # pragma: no cover - raced with its exit
            pass
    if proc.stdout is not None:
        proc.stdout.close()


class WebFarm:
    """Run a farm server in a child process for the duration of a test or benchmark.

    A separate process keeps the farm's CPU time and reactor apart from the
    crawler under test, which matters both for throughput numbers and for
    crawls that run their own reactor.  Starts immediately unless
    ``autostart=False``; usable as a context manager::

        with WebFarm(FarmConfig(hosts=5)) as farm:
            urls = farm.start_urls()
    """

    def __init__(
        self,
        config: FarmConfig | None = None,
        *,
        port: int = 0,
        startup_timeout: float = 30.0,
        autostart: bool = True,
    ) -> None:
        self.config = config if config is not None else FarmConfig()
        self.model = FarmModel(self.config)
        self._requested_port = port
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if autostart:
            self.start()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("WebFarm is not running; call start()")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> WebFarm:
        """Spawn the server and wait for its ``LISTENING`` line."""
        if self._proc is not None:
            return self
        # A file, not a pipe: nobody reads the child's stderr while it runs,
        # and a full pipe would block the server.
        self._stderr = tempfile.TemporaryFile(prefix="webfarm-stderr-")  # noqa: SIM115
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable,
            "-m",
            "scrapy_banker.testing.farm.server",
            "--config-json",
            self.config.to_json(),
            "--port",
            str(self._requested_port),
        ]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, env=env
        )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _terminate, proc)
        try:
            self._port = self._await_listening(proc)
        except BaseException:
            self.stop()
            raise
        logger.debug("web farm pid %d listening on port %d", proc.pid, self._port)
        return self

    def _await_listening(self, proc: subprocess.Popen[bytes]) -> int:
        assert proc.stdout is not None
        deadline = time.monotonic() + self._startup_timeout
        fd = proc.stdout.fileno()
        data = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"web farm did not start within {self._startup_timeout:.0f}s"
                        f"{self._child_stderr()}"
                    )
                if sel.select(timeout=min(left, 0.5)):
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        proc.wait(timeout=5)
                        raise RuntimeError(
                            f"web farm exited with code {proc.returncode} before listening"
                            f"{self._child_stderr()}"
                        )
                    data += chunk
        line = data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        word, _, port = line.partition(" ")
        if word != "LISTENING" or not port.isdigit():
            raise RuntimeError(f"unexpected web farm output {line!r}{self._child_stderr()}")
        return int(port)

    def _child_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read()[-4000:].decode("utf-8", "replace").strip()
        return f"; child stderr:\n{text}" if text else "; child stderr was empty"

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 5 s); idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _terminate once
            self._finalizer = None
        self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> WebFarm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ conveniences
    def url(self, host_index: int, path: str = "/") -> str:
        return self.model.url(host_index, path, self.port)

    def start_urls(self) -> list[str]:
        return self.model.start_urls(self.port)

    def expected_urls(self, start_urls: Iterable[str] | None = None) -> set[str]:
        return self.model.expected_urls(self.port, start_urls)

    def pushback_hosts(self) -> dict[str, HostPushback]:
        """Hosts that push back and how (:meth:`FarmModel.pushback_hosts`); no request made."""
        return self.model.pushback_hosts()

    def _get(self, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Host": f"{self.model.host_name(0)}:{self.port}"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"web farm {path} answered {resp.status}")
            return json.loads(body)
        finally:
            conn.close()

    def stats(self, urls: bool = False) -> dict[str, Any]:
        """Server counters; ``urls=True`` adds ``fetches`` and ``refused_urls``: URL -> count."""
        return cast(dict[str, Any], self._get(STATS_PREFIX + "stats" + ("?urls=1" if urls else "")))

    def reset(self) -> None:
        """Zero the counters, forget which transient URLs already failed and the push-back state."""
        self._get(STATS_PREFIX + "reset")

    def samples(self) -> list[list[Any]]:
        """In-flight samples since the last reset (``FarmConfig.sample_interval_s``)."""
        return cast(list[list[Any]], self._get(STATS_PREFIX + "samples"))
