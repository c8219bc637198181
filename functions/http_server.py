"""A small HTTP/1.1 server on asyncio and httptools for the FC and local platforms.

Keep-alive, pipelining (answers in order), ``Expect: 100-continue`` and a body limit that answers
413 from the headers alone, before any of the body is read or Triton is touched. Every client is
bounded (``HttpLimits``): the request head's size (431) and header count, the time to send the
head (408) and each piece of the body (408), idle keep-alive time, queued pipelined requests and
the number of connections. Every request gets exactly one answer, upgrades and CONNECT included.
"""

from __future__ import annotations

import asyncio
import http
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from functions.http_types import Request, Response, body_too_large, error_response, internal_error
from functions.settings import HttpLimits

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


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the refusal to send is on the connection."""


class _Server:
    """What the connections of one listening socket share."""

    def __init__(self, handler: Handler, max_body: int, limits: HttpLimits) -> None:
        self.handler = handler
        self.max_body = max_body
        self.limits = limits
        self.tasks: set[asyncio.Task[None]] = set()
        self.connections = 0


# No body: it goes out before the request is read, and an answer to HEAD may carry none.
_TOO_MANY = Response(503, [("retry-after", "1")])


class _HttpConnection(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self._server = server
        self._limits = server.limits
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        # (request or refusal, keep the connection, answer to HEAD: head only)
        self._pending: deque[tuple[Request | Response, bool, bool]] = deque()
        self._busy = False
        self._discarding = False
        self._counted = False
        self._reading: str | None = None
        self._head_bytes = 0
        self._begun = 0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._eof = False
        self._refusal: Response | None = None
        self._upgrade = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._reset()

    def _reset(self) -> None:
        self._head_method = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_count = 0
        self._body: list[bytes] = []
        self._size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._server.connections >= self._limits.max_connections:
            self._transport.write(encode_response(_TOO_MANY, keep_alive=False) + _TOO_MANY.body)
            self._transport.close()
            return
        self._server.connections += 1
        self._counted = True
        self._arm(self._limits.header_timeout_s, None, "no request")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pending.clear()
        self._disarm()
        self._writable.set()
        if self._counted:
            self._server.connections -= 1
            self._counted = False

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        """Feed the parser; a head still incomplete after ``max_header_bytes`` is refused.

        Bytes are counted from the first read after the one where a head began, so a head is cut
        at most one read (256 KiB) past the limit.
        """
        if self._discarding:
            return
        if self._reading == "head":
            room = self._limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                began = self._begun
                self._feed(data[:room])
                if self._reading == "head" and self._begun == began:
                    limit = self._limits.max_header_bytes
                    self._refuse(431, f"request line and headers exceed {limit} bytes")
                    return
                data = data[room:]
            else:
                self._head_bytes += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        if self._discarding or not data:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._discarding = True
        except httptools.HttpParserError as exc:
            if self._refusal is not None:
                self._reject(self._refusal)
            else:
                self._reject(error_response(400, f"malformed HTTP request: {exc}"))

    def on_message_begin(self) -> None:
        self._reset()
        self._reading = "head"
        self._head_bytes = 0
        self._begun += 1
        self._arm(self._limits.header_timeout_s, 408, "request headers not received")

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._limits.max_headers:
            self._refusal = error_response(431, f"more than {self._limits.max_headers} request headers")
            raise _Refused
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._reading = "body"
        # A complete HEAD request: its answer, whatever it is, carries no body.
        self._head_method = self._parser.get_method() == b"HEAD"
        self._arm(self._limits.body_timeout_s, 408, "request body not received")
        if self._parser.should_upgrade():
            if self._parser.get_method() == b"CONNECT":
                self._refusal = error_response(405, "CONNECT is not supported", [("allow", "GET, POST")])
                return
            self._upgrade = True
        length = self._headers.get("content-length", "0")
        if length.isdigit() and int(length) > self._server.max_body:
            self._reject(body_too_large(self._server.max_body))
        elif (
            self._headers.get("expect", "").lower() == "100-continue"
            and self._transport is not None
            and not (self._busy or self._pending)
        ):
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        if self._discarding:
            return
        self._size += len(chunk)
        if self._size > self._server.max_body:
            self._reject(body_too_large(self._server.max_body))
            return
        self._body.append(chunk)
        self._arm(self._limits.body_timeout_s, 408, "request body not received")

    def on_message_complete(self) -> None:
        self._disarm()
        self._reading = None
        if self._discarding:
            return
        if self._refusal is not None:
            self._reject(self._refusal)
            return
        method = self._parser.get_method().decode("ascii", "replace")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = Request(method, self._url.decode("latin-1"), self._headers, body)
        keep_alive = self._parser.should_keep_alive() and not self._upgrade
        self._pending.append((request, keep_alive, method == "HEAD"))
        if len(self._pending) >= self._limits.max_pipelined:
            self._pause()
        if self._upgrade:
            self._discarding = True
        self._schedule()

    def _schedule(self) -> None:
        if not self._busy:
            self._busy = True
            task = asyncio.get_running_loop().create_task(self._serve_pending())
            self._server.tasks.add(task)
            task.add_done_callback(self._server.tasks.discard)

    async def _serve_pending(self) -> None:
        """Answer queued requests in arrival order.

        A queued ``Response`` is a rejection decided while parsing; it ends the connection.
        """
        while self._pending:
            item, keep_alive, head_only = self._pending.popleft()
            response = item if isinstance(item, Response) else await self._answer(item)
            await self._writable.wait()
            transport = self._transport
            if transport is None or transport.is_closing():
                break
            head = encode_response(response, keep_alive)
            transport.writelines((head,) if head_only else (head, response.body))
            if isinstance(item, Response) or not keep_alive:
                self._discarding = True
                self._linger(transport)
                break
            if self._paused and not self._discarding:
                self._resume()
        self._busy = False
        if self._eof:
            self._close_after_answers()
        elif self._reading is None and self._transport is not None and not self._discarding:
            self._arm(self._limits.idle_timeout_s, None, "idle")

    async def _answer(self, request: Request) -> Response:
        """The handler's answer; if it fails, a 500 all the same: every request gets one answer."""
        try:
            return await self._server.handler(request)
        except Exception:
            return internal_error(f"{request.method} {request.path[:200]}")

    def _refuse(self, status: int, message: str) -> None:
        self._reject(error_response(status, message))

    def _reject(self, response: Response) -> None:
        """Answer after whatever is in flight, then stop reading."""
        if self._discarding or self._transport is None:
            return
        self._discarding = True
        self._disarm()
        self._pending.append((response, False, self._head_method))
        self._schedule()

    def _arm(self, seconds: float, status: int | None, what: str) -> None:
        """One timer per connection: the deadline of whatever it is waiting for now. None while
        reading is paused: a client cannot be late with what the server does not read."""
        self._disarm()
        if not self._paused:
            self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, seconds, status, what)

    def _pause(self) -> None:
        if self._transport is not None and not self._paused:
            self._transport.pause_reading()
            self._paused = True
            self._disarm()

    def _resume(self) -> None:
        if self._transport is None:
            return
        self._paused = False
        self._transport.resume_reading()
        if self._reading == "head":
            self._arm(self._limits.header_timeout_s, 408, "request headers not received")
        elif self._reading == "body":
            self._arm(self._limits.body_timeout_s, 408, "request body not received")

    def eof_received(self) -> bool:
        """The client has finished sending: answer what it sent, then close."""
        self._eof = True
        self._disarm()
        return self._busy or bool(self._pending)

    def _close_after_answers(self) -> None:
        if self._transport is not None and not self._pending:
            self._transport.close()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, seconds: float, status: int | None, what: str) -> None:
        self._timer = None
        if self._transport is None:
            return
        if status is None:
            self._transport.close()
        else:
            self._refuse(status, f"{what} within {seconds:g} s; closing the connection")

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after a short while so the client reads the answer rather than a reset."""
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_S, transport.close)


async def serve(
    handler: Handler, host: str, port: int, max_body: int, limits: HttpLimits | None = None
) -> asyncio.Server:
    server = _Server(handler, max_body, limits or HttpLimits())
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _HttpConnection(server), host, port, reuse_address=True, backlog=1024
    )
