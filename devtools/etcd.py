"""A real etcd (Debian's ``etcd-server``, 3.4) on loopback: the store APISIX's traditional
deployment keeps its routes in, for the multi-node tests, the demo of several nodes and the
benchmarks. One member, its data in a folder of its own, stopped by SIGTERM."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from functions.sidecar import free_port

ETCD = shutil.which("etcd")
ETCD_HINT = "etcd is not installed (apt-get install etcd-server; scripts/setup.sh does it as root)"


class Etcd:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as answer:
                return b'"true"' in answer.read()
        except OSError:
            return False

    def start(self, timeout_s: float = 30.0) -> None:
        if ETCD is None:
            raise RuntimeError(ETCD_HINT)
        self.folder.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = self.folder / "etcd.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    ETCD,
                    *("--name", "spillway", "--data-dir", str(self.folder / "data")),
                    *("--listen-client-urls", self.url, "--advertise-client-urls", self.url),
                    *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
                    *("--initial-cluster", f"spillway={peer}"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not answer on {self.url}: {log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@contextmanager
def etcd_server(folder: Path) -> Iterator[Etcd]:
    server = Etcd(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
