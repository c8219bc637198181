"""A real DNS server on loopback for the discovery tests: Debian's ``dnsmasq``, answering only from
the records a test gives it (no upstream, no /etc/hosts), with A/AAAA records that change on SIGHUP
and SRV records that change on a restart, as a headless Service's do when pods come and go."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dns.exception
import dns.resolver
import pytest

from testing.http import http_server_thread


def needs_dnsmasq() -> pytest.MarkDecorator:
    missing = shutil.which("dnsmasq") is None and not Path("/usr/sbin/dnsmasq").exists()
    return pytest.mark.skipif(missing, reason="dnsmasq is not installed (Debian's dnsmasq-base)")


def _udp_port() -> int:
    """A loopback port free for UDP and for TCP: dnsmasq listens on both, and a port the kernel
    gave another process's TCP listener (a tritonserver's, APISIX's) is free for UDP all the same."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port: int = udp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no loopback port free for both UDP and TCP")


def _binary() -> str:
    return shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"


@dataclass
class Dns:
    tmp: Path
    port: int = field(default_factory=lambda: _udp_port())
    hosts: dict[str, list[str]] = field(default_factory=dict)
    srv: list[tuple[str, str, int]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def resolver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_hosts(self) -> None:
        lines = [f"{address} {name}" for name, addresses in self.hosts.items() for address in addresses]
        (self.tmp / "hosts").write_text("\n".join(lines) + "\n")

    def set_hosts(self, name: str, addresses: list[str]) -> None:
        """The A/AAAA records of ``name`` from now on: dnsmasq re-reads its hosts file on SIGHUP,
        in its own time, so this returns once it answers with the new A records."""
        self.hosts[name] = addresses
        self._write_hosts()
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)
            want = sorted(a for a in addresses if ":" not in a)
            deadline = time.monotonic() + 10
            while self.a_records(name) != want:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"dnsmasq still answers {self.a_records(name)} for {name}, not {want}")
                time.sleep(0.02)

    def a_records(self, name: str) -> list[str]:
        """What this server answers for ``name``'s A records (none: an empty list)."""
        asker = dns.resolver.Resolver(configure=False)
        asker.nameservers, asker.port, asker.lifetime = ["127.0.0.1"], self.port, 1.0
        try:
            return sorted(str(record) for record in asker.resolve(name, "A"))
        except dns.exception.DNSException:
            return []

    def set_srv(self, records: list[tuple[str, str, int]]) -> None:
        """The SRV records (name, target, port) from now on: dnsmasq restarts to take them."""
        self.srv = records
        if self.proc is not None:
            self.stop()
            self.start()

    def start(self) -> None:
        self._write_hosts()
        args = [
            _binary(),
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            f"--addn-hosts={self.tmp / 'hosts'}",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            f"--port={self.port}",
            "--local-ttl=0",
            "--user=root" if os.getuid() == 0 else f"--user={os.getuid()}",
            f"--pid-file={self.tmp / 'dnsmasq.pid'}",
            *(f"--srv-host={name},{target},{port}" for name, target, port in self.srv),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"dnsmasq did not start: {err}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind(("127.0.0.1", self.port))
            except OSError:
                return True
        return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


@contextmanager
def dnsmasq(tmp: Path) -> Iterator[Dns]:
    """A dnsmasq on a free loopback port; another, if a process takes the port before it binds."""
    for attempt in range(3):
        dns = Dns(tmp)
        try:
            dns.start()
            break
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
    try:
        yield dns
    finally:
        dns.stop()


def serving_at(address: str, port: int, handler: type[Any]) -> AbstractContextManager[str]:
    """An ``http.server`` on ``address:port`` (another loopback address than 127.0.0.1)."""
    return http_server_thread(handler, bind=(address, port))
