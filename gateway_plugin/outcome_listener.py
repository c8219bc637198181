"""The runner's outcome endpoint: where the route's ``http-logger`` posts what happened.

A small threaded HTTP server on loopback; each accepted batch is handed to the event loop, which
alone writes the gateway's state. Only APISIX may post (``Authorization`` derived from the route
token); bodies, batches and reads are bounded.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import ValidationError

from gateway_plugin.routing.outcomes import Outcome, parse_batch

log = logging.getLogger("spillway.outcomes")

PATH = "/spillway/outcomes"
MAX_BODY_BYTES = 8 << 20
READ_TIMEOUT_S = 10.0


class OutcomeListener:
    """Serves ``POST /spillway/outcomes`` until closed; ``deliver`` runs on ``loop``, or on the
    request's own thread when there is none (the parent of several workers, which only forwards)."""

    def __init__(
        self,
        listen: str,
        auth: str,
        loop: asyncio.AbstractEventLoop | None,
        deliver: Callable[[list[Outcome]], None],
    ) -> None:
        host, _, port = listen.rpartition(":")
        handler = _handler(auth, loop, deliver)
        self._server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="outcomes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    auth: str, loop: asyncio.AbstractEventLoop | None, deliver: Callable[[list[Outcome]], None]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if self.path.partition("?")[0] != PATH:  # http-logger may add an empty query
                self._answer(404, f"no such path; outcomes are posted to {PATH}")
                return
            given = self.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode("latin-1", "replace"), auth.encode()):
                self._answer(401, "wrong or missing Authorization (the route's http-logger auth_header)")
                return
            length = self.headers.get("content-length", "")
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                self._answer(
                    413 if length.isdigit() else 411, f"a Content-Length up to {MAX_BODY_BYTES} bytes"
                )
                return
            try:
                entries = parse_batch(self.rfile.read(int(length)))
            except (ValidationError, ValueError) as exc:
                self._answer(400, f"not a batch of outcomes: {str(exc)[:300]}")
                return
            if loop is None:
                deliver(entries)
            else:
                loop.call_soon_threadsafe(deliver, entries)
            self._answer(204, "")

        def _answer(self, status: int, message: str) -> None:
            body = json.dumps({"error": message}).encode() if message else b""
            self.send_response(status)
            if body:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug(format, *args)

    return Handler
