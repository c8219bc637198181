"""Loopback HTTP for the harness: one request, polling for readiness, and ``http.server`` on a
thread for upstreams and misbehaving targets."""

from __future__ import annotations

import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll for readiness instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise TimeoutError(f"{what} not within {timeout} s")


def settled(read: Callable[[], float], pause_s: float = 1.5) -> float:
    """``read()`` once two readings ``pause_s`` apart agree: counts that reach the runner in
    batches and gauges set every second have come in."""
    last = -1.0
    while (now := read()) != last:
        last = now
        time.sleep(pause_s)
    return now


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-cased names) and body; an error status is an answer, not a raise."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def answers(url: str) -> bool:
    """Something listens at ``url`` and answers HTTP (any status)."""
    try:
        http("GET", url, timeout=1)
        return True
    except OSError:
        return False


class QuietHandler(BaseHTTPRequestHandler):
    """``http.server``'s handler without its line on stderr per request."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, body: bytes, status: int = 200) -> None:
        """One answer with its length."""
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def http_server_thread(
    handler: type[Any],
    tls: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
    bind: tuple[str, int] = ("127.0.0.1", 0),
) -> Iterator[str]:
    """A plain ``http.server`` on a loopback port, for upstreams and misbehaving targets; with
    ``tls``, HTTPS (its URL names ``host``); ``bind``: another loopback address and a given port
    (each pod of a headless Service has its own address and the same ports)."""

    class Server(ThreadingHTTPServer):
        # A burst of connections at once is queued, not refused or left to time out (the default
        # backlog of 5 makes the gateway's 1 s connect timeout answer 504 for some of them).
        request_queue_size = 128
        daemon_threads = True

    server = Server(bind, handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = host if bind[0] == "127.0.0.1" else bind[0]
        yield f"{'https' if tls else 'http'}://{address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
