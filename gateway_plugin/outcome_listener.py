"""The runner's outcome endpoint: where the route's ``http-logger`` (or the fast path's ``spillway``
Lua plugin) posts what happened, where the fast path fetches its decision table, and where APISIX's
side asks whether the runner still answers (``GET /spillway/alive``, answered from the event loop
that serves APISIX's calls, so a wedged loop reads as silent).

A small threaded HTTP server on loopback; each accepted batch is handed to the event loop, which
alone writes the gateway's state (and checks the batch's entries there, a slice at a time), and
each table is built there too. Only APISIX may post (``Authorization`` derived from the route
token); bodies, batches and reads are bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hmac
import json
import logging
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway_plugin.books.outcomes import auth_header, entries_of
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.fast_path import contract
from gateway_plugin.fast_path.book import FastPathReport
from gateway_plugin.fast_path.summary import FastOutcomes

log = logging.getLogger("spillway.outcomes")

PATH = "/spillway/outcomes"
# The fast path's (its plugin's paths are the contract's).
TABLE_PATH, FAST_OUTCOMES_PATH, ALIVE_PATH = contract.TABLE_PATH, contract.OUTCOMES_PATH, contract.ALIVE_PATH
ALIVE_TIMEOUT_S = 1.0
MAX_BODY_BYTES = 8 << 20
MAX_REPORT_BYTES = 256 << 10
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 256
TABLE_TIMEOUT_S = 2.0
# Builds the fast path's decision table from a node's report; runs on the event loop.
TableSource = Callable[[FastPathReport], bytes]
# Takes a fast-path worker's summary of outcomes; runs on the event loop.
FastSink = Callable[[FastOutcomes], None]


class OutcomeListener:
    """Serves ``POST /spillway/outcomes`` until closed; ``deliver`` takes each batch's entries, not
    yet checked (``outcomes.entries_of``), on ``loop``, or on the request's own thread when there is
    none (the parent of several workers, which only forwards)."""

    def __init__(
        self,
        listen: str,
        auth: str,
        loop: asyncio.AbstractEventLoop | None,
        deliver: Callable[[list[object]], None],
        table: TableSource | None = None,
        fast: FastSink | None = None,
    ) -> None:
        host, _, port = listen.rpartition(":")
        endpoint = _Endpoint(auth, loop, deliver, table, fast)
        handler = functools.partial(_Handler, endpoint=endpoint)
        self._server = _BoundedServer((host or "127.0.0.1", int(port)), handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="outcomes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def open_outcome_listener(
    config: SpillwayConfig,
    secrets: GatewaySecrets,
    loop: asyncio.AbstractEventLoop | None,
    deliver: Callable[[list[object]], None],
    table: TableSource | None = None,
    fast: FastSink | None = None,
) -> OutcomeListener | None:
    """The started endpoint, or None (said in the log) when the config has none, the route token
    its auth comes from is missing, or the address cannot be bound: routing goes on without it."""
    if not config.outcomes.listen:
        return None
    if secrets.route_token is None:
        log.warning(
            "no outcome endpoint: %s is not set, and the logger's Authorization comes from it; "
            "breakers, warm instances and local answer times then learn nothing",
            config.runner.route_token_env,
        )
        return None
    try:
        listener = OutcomeListener(
            config.outcomes.listen, auth_header(secrets.route_token), loop, deliver, table, fast
        )
    except OSError as exc:
        log.error("cannot serve outcomes on %s: %s", config.outcomes.listen, exc)
        return None
    listener.start()
    return listener


class _BoundedServer(ThreadingHTTPServer):
    """One thread per connection, at most ``MAX_CONNECTIONS`` of them: others are closed at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Callable[..., BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _on_loop(loop: asyncio.AbstractEventLoop, work: Callable[[], bytes], timeout_s: float) -> bytes:
    """Run ``work`` on the loop (which owns the state) and wait for its answer, bounded."""
    done: concurrent.futures.Future[bytes] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(work())
        except Exception as exc:  # handed to the waiting thread, which answers 500
            done.set_exception(exc)

    loop.call_soon_threadsafe(run)
    return done.result(timeout=timeout_s)


def identity() -> bytes:
    """Which process answers: its pid, and its start time in clock ticks since boot (field 22 of
    /proc/<pid>/stat), so that whoever stops a silent runner can tell it from a later process
    that got the same pid."""
    try:
        stat = Path("/proc/self/stat").read_text()
        started = stat.rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        started = ""
    return json.dumps({"pid": os.getpid(), "started": started}).encode()


class _Endpoint:
    """What one listener serves, and the little it keeps across requests; shared by the handlers
    of all its connections. Without a loop (a workers' parent holds no state) it serves outcomes
    only, delivered on the request's own thread."""

    def __init__(
        self,
        auth: str,
        loop: asyncio.AbstractEventLoop | None,
        deliver: Callable[[list[object]], None],
        table: TableSource | None,
        fast: FastSink | None,
    ) -> None:
        self.auth, self.loop, self.deliver, self.table, self.fast = auth, loop, deliver, table, fast
        owned = loop is not None
        self.served = {
            PATH: True,
            TABLE_PATH: owned and table is not None,
            FAST_OUTCOMES_PATH: owned and fast is not None,
        }
        self.me = identity()
        self.watched = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    """One connection to the endpoint, with the listener's ``_Endpoint`` given to it at creation
    (as ``http.server``'s own handlers take their directory)."""

    timeout = READ_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def __init__(self, *args: Any, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint  # before the base class's __init__, which handles the request
        super().__init__(*args)

    def do_GET(self) -> None:
        if self.path.partition("?")[0] != ALIVE_PATH:
            self._answer(404, f"no such path; GET serves only {ALIVE_PATH}")
            return
        if not self._authorised():
            return
        me, loop = self.endpoint.me, self.endpoint.loop
        try:
            self._send(200, me if loop is None else _on_loop(loop, lambda: me, ALIVE_TIMEOUT_S))
        except concurrent.futures.TimeoutError:
            self._answer(503, f"the runner's event loop has not answered within {ALIVE_TIMEOUT_S} s")
            return
        if not self.endpoint.watched.is_set():
            self.endpoint.watched.set()
            log.info("APISIX's side watches whether this runner answers (GET %s)", ALIVE_PATH)

    def _authorised(self) -> bool:
        given = self.headers.get("authorization", "")
        if hmac.compare_digest(given.encode("latin-1", "replace"), self.endpoint.auth.encode()):
            return True
        self._answer(401, "wrong or missing Authorization (the route's http-logger auth_header)")
        return False

    def do_POST(self) -> None:
        path = self.path.partition("?")[0]  # http-logger may add an empty query
        if not self.endpoint.served.get(path):
            self._answer(404, f"no such path; outcomes are posted to {PATH}, tables fetched at {TABLE_PATH}")
            return
        if not self._authorised():
            return
        limit = MAX_BODY_BYTES if path == PATH else MAX_REPORT_BYTES
        length = self.headers.get("content-length", "")
        if not length.isdigit() or int(length) > limit:
            self._answer(413 if length.isdigit() else 411, f"a Content-Length up to {limit} bytes")
            return
        body = self.rfile.read(int(length))
        loop, table, fast = self.endpoint.loop, self.endpoint.table, self.endpoint.fast
        if path == TABLE_PATH and table is not None and loop is not None:
            self._table(loop, table, body)
        elif path == FAST_OUTCOMES_PATH and fast is not None and loop is not None:
            self._fast(loop, fast, body)
        else:
            self._outcomes(loop, body)

    def _outcomes(self, loop: asyncio.AbstractEventLoop | None, body: bytes) -> None:
        try:
            entries = entries_of(body)
        except ValueError as exc:
            self._answer(400, f"not a batch of outcomes: {str(exc)[:300]}")
            return
        if loop is None:
            self.endpoint.deliver(entries)
        else:
            loop.call_soon_threadsafe(self.endpoint.deliver, entries)
        self._answer(204, "")

    def _table(self, owner: asyncio.AbstractEventLoop, build: TableSource, body: bytes) -> None:
        try:
            report = FastPathReport.model_validate_json(body)
        except ValidationError as exc:
            self._answer(400, f"not a fast-path report: {str(exc)[:300]}")
            return
        try:
            answer = _on_loop(owner, functools.partial(build, report), TABLE_TIMEOUT_S)
        except Exception as exc:
            log.error("decision table not built: %s", exc)
            self._answer(500, "the decision table could not be built; see the runner's log")
            return
        self._send(200, answer)

    def _fast(self, owner: asyncio.AbstractEventLoop, sink: FastSink, body: bytes) -> None:
        try:
            summary = FastOutcomes.parse(body)
        except (ValidationError, ValueError) as exc:
            self._answer(400, f"not a summary of fast-path outcomes: {str(exc)[:300]}")
            return
        owner.call_soon_threadsafe(sink, summary)
        self._answer(204, "")

    def _answer(self, status: int, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode() if message else b"")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        if status >= 400:
            # A refusal may leave the request's body unread: the connection carries nothing more.
            self.send_header("connection", "close")
            self.close_connection = True
        if body:
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug(format, *args)
