"""A stand-in of Lambda's runtime API, for what the official emulator cannot do: take a streamed
response (``aws-lambda-rie`` reads a runtime's whole response before it answers anything).

It serves the documented endpoints a runtime calls: ``GET /2018-06-01/runtime/invocation/next``
(the next queued event), ``POST .../invocation/{id}/response`` (whole, or chunked with
``Lambda-Runtime-Function-Response-Mode: streaming`` and error trailers), ``.../invocation/{id}/error``
and ``.../init/error``. Each chunk of a streamed response is recorded as it arrives, so a test
can see the first one while the function has not sent the next.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API = "/2018-06-01/runtime"
MAX_CHUNK = 1 << 20


@dataclass
class Answer:
    """What the runtime posted for one invocation, filled in as it arrives."""

    request_id: str
    headers: dict[str, str] = field(default_factory=dict)
    chunks: queue.Queue[bytes | None] = field(default_factory=queue.Queue)  # None: the end
    body: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def next_chunk(self, timeout: float = 30) -> bytes | None:
        return self.chunks.get(timeout=timeout)

    def wait(self, timeout: float = 60) -> Answer:
        if not self.done.wait(timeout):
            raise TimeoutError(f"no answer to {self.request_id} within {timeout} s")
        return self


class RuntimeApiStandIn:
    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, bytes, int]] = queue.Queue()
        self.answers: dict[str, Answer] = {}
        self.init_error: dict[str, Any] | None = None
        self._count = 0

    def invoke(self, event: object, deadline_ms: int = 0) -> Answer:
        """Queue an event for the runtime's next ``/invocation/next``; its answer fills in later."""
        self._count += 1
        request_id = f"request-{self._count}"
        answer = self.answers[request_id] = Answer(request_id)
        self.events.put((request_id, json.dumps(event).encode(), deadline_ms))
        return answer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: RuntimeApiStandIn

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != f"{API}/invocation/next":
            self._reply(404)
            return
        request_id, event, deadline_ms = self.api.events.get()
        self.send_response(200)
        self.send_header("Lambda-Runtime-Aws-Request-Id", request_id)
        self.send_header("Lambda-Runtime-Deadline-Ms", str(deadline_ms))
        self.send_header("Content-Length", str(len(event)))
        self.end_headers()
        self.wfile.write(event)

    def do_POST(self) -> None:
        if self.path == f"{API}/init/error":
            self.api.init_error = json.loads(self._whole())
            self._reply(202)
            return
        request_id, _, kind = self.path.removeprefix(f"{API}/invocation/").partition("/")
        answer = self.api.answers.get(request_id)
        if answer is None or kind not in ("response", "error"):
            self._reply(404)
            return
        answer.headers = {k.lower(): v for k, v in self.headers.items()}
        if kind == "error":
            answer.error = json.loads(self._whole())
        elif answer.headers.get("lambda-runtime-function-response-mode") == "streaming":
            self._read_chunks(answer)
        else:
            answer.body = self._whole()
        answer.chunks.put(None)
        answer.done.set()
        self._reply(202)

    def _whole(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _read_chunks(self, answer: Answer) -> None:
        """RFC 9112's chunked body, each chunk recorded as it arrives, then the trailer fields."""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0 or size > MAX_CHUNK:
                break
            chunk = self.rfile.read(size)
            self.rfile.readline()
            answer.body += chunk
            answer.chunks.put(chunk)
        while (line := self.rfile.readline().strip()) != b"":
            name, _, value = line.decode().partition(":")
            answer.trailers[name.strip().lower()] = value.strip()

    def _reply(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def runtime_api() -> Iterator[tuple[RuntimeApiStandIn, str]]:
    """The stand-in on a free loopback port, and its ``host:port`` for ``AWS_LAMBDA_RUNTIME_API``."""
    api = RuntimeApiStandIn()
    handler = type("Handler", (_Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
