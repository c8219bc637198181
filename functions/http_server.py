"""A small HTTP/1.1 server on asyncio and httptools for the FC and local platforms.

Keep-alive, pipelining (answers in order), ``Expect: 100-continue`` and a body limit that answers
413 from the headers alone, before any of the body is read or Triton is touched.
"""

from __future__ import annotations

import asyncio
import http
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from functions.messages import Request, Response, body_too_large, error_response

Handler = Callable[[Request], Awaitable[Response]]

_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}
_LINGER_S = 2.0


def encode_response(response: Response, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (response.status, _REASONS.get(response.status, b"Unknown"))]
    lines.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in response.headers)
    lines.append(b"content-length: %d\r\n" % len(response.body))
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


class _HttpConnection(asyncio.Protocol):
    def __init__(self, handler: Handler, max_body: int, tasks: set[asyncio.Task[None]]) -> None:
        self._handler = handler
        self._max_body = max_body
        self._tasks = tasks
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[Request | Response, bool]] = deque()
        self._busy = False
        self._discarding = False
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(error_response(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as exc:
            self._reject(error_response(400, f"malformed HTTP request: {exc}"))

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length", "0")
        if length.isdigit() and int(length) > self._max_body:
            self._reject(body_too_large(self._max_body))
        elif self._headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self._max_body:
            self._reject(body_too_large(self._max_body))
        else:
            self._body.append(chunk)

    def on_message_complete(self) -> None:
        if self._discarding:
            return
        method = self._parser.get_method().decode("ascii", "replace")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = Request(method, self._url.decode("latin-1"), self._headers, body)
        self._pending.append((request, self._parser.should_keep_alive()))
        self._schedule()

    def _schedule(self) -> None:
        if not self._busy:
            self._busy = True
            task = asyncio.get_running_loop().create_task(self._serve_pending())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_pending(self) -> None:
        """Answer queued requests in arrival order.

        A queued ``Response`` is a rejection decided while parsing; it ends the connection.
        """
        while self._pending:
            item, keep_alive = self._pending.popleft()
            response = item if isinstance(item, Response) else await self._answer(item)
            transport = self._transport
            if transport is None or transport.is_closing():
                break
            transport.writelines((encode_response(response, keep_alive), response.body))
            if isinstance(item, Response):
                self._linger(transport)
                break
            if not keep_alive:
                transport.close()
                break
        self._busy = False

    async def _answer(self, request: Request) -> Response:
        """The handler's answer; if it fails, a 500 all the same: every request gets one answer."""
        try:
            return await self._handler(request)
        except Exception as exc:
            return error_response(500, f"internal error answering {request.method} {request.path}: {exc!r}")

    def _reject(self, response: Response) -> None:
        """Answer after whatever is in flight, then stop reading."""
        if self._discarding or self._transport is None:
            return
        self._discarding = True
        self._pending.append((response, False))
        self._schedule()

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after a short while so the client reads the answer rather than a reset."""
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_S, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pending.clear()


async def serve(handler: Handler, host: str, port: int, max_body: int) -> asyncio.Server:
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _HttpConnection(handler, max_body, tasks), host, port, reuse_address=True, backlog=1024
    )
