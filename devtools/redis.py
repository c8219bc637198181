"""A real ``redis-server`` (Debian's package) on a free loopback port: for the shared-state tests
and benchmarks. No persistence by default (killed, it comes back empty); ``persist`` writes every
command to an append-only file first, so killed it comes back with its data."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from functions.sidecar import free_port

REDIS_SERVER = shutil.which("redis-server")
INSTALL_HINT = (
    "redis-server is not installed (apt-get install redis-server; scripts/setup.sh does it as root)"
)


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One server process; ``stop`` kills it (as a crash would), ``start`` brings it back, empty
    unless ``persist``."""

    def __init__(
        self, folder: Path, port: int | None = None, persist: bool = False, args: Sequence[str] = ()
    ) -> None:
        self.folder, self.port, self.persist = folder, port or free_port(), persist
        self.args = list(args)  # more of redis-server's options (a replica's, a Cluster node's)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(INSTALL_HINT)
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running: stop it first")
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / "redis.log"
        appendonly = ("yes", "--appendfsync", "always") if self.persist else ("no",)
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder)),
                *("--save", "", "--appendonly", *appendonly),
                *("--protected-mode", "yes", "--logfile", str(log)),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while not answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server did not answer on port {self.port}: {tail}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
