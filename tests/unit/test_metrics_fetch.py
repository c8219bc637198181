"""The runner's scrape of a metrics page is bounded in size and in time: whatever answers on the
metrics port (a misconfigured port, a proxy, a hostile host) cannot hold the scrape's thread or
grow the runner's memory. Real sockets on loopback; the server here plays that other thing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from gateway_plugin.app import http_fetcher
from testing.http import QuietHandler, http_server_thread

PAGE = b'nv_inference_request_success{model="m",version="1"} 10\n'


class _Endless(QuietHandler):
    """A page with no end: 64 KiB after 64 KiB until the client goes."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.end_headers()
        line = b"# " + b"x" * 65533 + b"\n"
        try:
            while True:
                self.wfile.write(line)
        except OSError:
            return


class _Drip(QuietHandler):
    """A byte of a comment every 0.2 s, for ever: each read is well within its own timeout."""

    stop = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.end_headers()
        try:
            self.wfile.write(b"#")
            while not self.stop.wait(0.2):
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:
            return


class _Plain(QuietHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)


def _fetch_in_thread(url: str, **limits: float) -> concurrent.futures.Future[str]:
    """The fetch on a thread of its own, so that a fetch that never ends fails the test rather than
    hanging it."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(asyncio.run, http_fetcher(**limits)(url))  # type: ignore[arg-type]
    pool.shutdown(wait=False)
    return future


def test_a_page_is_read_whole() -> None:
    with http_server_thread(_Plain) as url:
        assert asyncio.run(http_fetcher()(url + "/metrics")) == PAGE.decode()


def test_a_page_without_end_is_refused_past_the_bound() -> None:
    with http_server_thread(_Endless) as url:
        future = _fetch_in_thread(url + "/metrics", timeout_s=30.0, max_bytes=1024 * 1024)
        with pytest.raises(ValueError, match="metrics page over 1048576 bytes"):
            future.result(timeout=120)


def test_a_page_that_drips_is_given_up_at_the_deadline() -> None:
    _Drip.stop.clear()
    try:
        with http_server_thread(_Drip) as url:
            future = _fetch_in_thread(url + "/metrics", timeout_s=1.0)
            with pytest.raises(TimeoutError, match="not read whole within 1 s"):
                future.result(timeout=120)
    finally:
        _Drip.stop.set()
