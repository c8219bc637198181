"""A small HTTP/1.1 server on asyncio and httptools for the FC and local platforms.

Keep-alive, pipelining (answers in order), ``Expect: 100-continue`` and a body limit that answers
413 from the headers alone, before any of the body is read or Triton is touched. Every client is
bounded (``HttpLimits``): the request head's size (431) and header count, the time to send the
head (408) and each piece of the body (408), idle keep-alive time, queued pipelined requests and
the number of connections. A chunked body's trailer section is bounded as a head is (431), and
its fields are dropped: the handler sees the header section alone. A streamed answer goes out
chunked as it is made (``http_stream``). Every request gets exactly one answer, upgrades and
CONNECT included.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from functions import http_stream
from functions.http_body import BodyReader, ChunkFraming
from functions.http_deadline import Deadline
from functions.http_head import HeadMeter
from functions.http_types import (
    Body,
    Request,
    Response,
    body_too_large,
    encode_response,
    error_response,
    internal_error,
)
from functions.settings import HttpLimits

Handler = Callable[[Request], Awaitable[Response]]

_LINGER_S = 2.0
# Reads of request heads (and of whatever follows them in the same read) go through one buffer
# that every connection shares: the parser copies what it keeps before the read returns.
_SCRATCH_BYTES = 64 * 1024


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
        self.scratch = memoryview(bytearray(_SCRATCH_BYTES))
        # A connection's one timer fires at least this often, so that moving on to a shorter
        # deadline (idle, then a new request's head) never has to replace it.
        self.tick_s = min(limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s)


# No body: it goes out before the request is read, and an answer to HEAD may carry none.
_TOO_MANY = Response(503, [("retry-after", "1")])


class _HttpConnection(asyncio.BufferedProtocol):
    """One client connection.

    httptools parses every request head and every body that is chunked or arrives in the same
    read as its head. The rest of a body framed by ``Content-Length`` is read from the socket
    straight into the request's own buffers, never more than the bytes still due, so the next
    pipelined request stays in the socket; the parser then starts afresh for it. No body byte is
    copied in user space on its way to Triton.
    """

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        # (request or refusal, keep the connection, answer to HEAD: head only)
        self._pending: deque[tuple[Request | Response, bool, bool]] = deque()
        self._busy = False
        self._discarding = False
        self._counted = False
        self._reading: str | None = None
        self._head = HeadMeter(server.limits.max_header_bytes)
        self._begun = 0
        self._deadline = Deadline(self._loop, server.tick_s, self._expire)
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
        self._body: list[bytes | bytearray] = []
        self._size = 0
        # The declared length of a body this connection may read itself; -1: the parser reads it.
        self._expect = -1
        self._chunks: ChunkFraming | None = None
        self._method = b""
        self._keep_alive = False
        self._direct: BodyReader | None = None

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
        self._deadline.cancel()
        self._writable.set()
        if self._counted:
            self._server.connections -= 1
            self._counted = False

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: the rest of the current body part, else the shared buffer."""
        if self._direct is None or self._discarding:
            return self._server.scratch
        return self._direct.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._discarding:
            return
        if self._direct is None:
            self.data_received(self._server.scratch[:nbytes])
            if self._reading == "body" and self._expect > self._size and not self._discarding:
                self._direct = BodyReader(self._body, self._size, self._expect)
        elif not self._direct.read(nbytes):
            self._arm(self._limits.body_timeout_s, 408, "request body not received")
        else:
            # Complete; the parser, left inside this body, starts afresh for the next request.
            self._direct = None
            self._parser = httptools.HttpRequestParser(self)
            self._complete(self._method, self._keep_alive)

    def data_received(self, data: bytes | memoryview) -> None:
        """Feed the parser a head or trailer section up to its blank line, a body framed by
        Content-Length up to its end and a chunked one in pieces no longer than a head may be,
        ending where its trailers begin, so that each head and trailer section is counted from its
        first byte whatever the reads hold (a head that both begins and ends in a piece of a chunked
        body is shorter than the piece); one that takes ``max_header_bytes`` is refused."""
        limit = self._limits.max_header_bytes
        while data and not self._discarding:
            trailers: int | None = None
            if self._reading == "body":
                size = max(1, self._expect - self._size) if self._expect >= 0 else limit
                if self._chunks is not None and (trailers := self._chunks.trailers_at(data[:size])):
                    size = trailers
            else:
                size = self._head.next_piece(data, self._reading in ("head", "trailers"))
            piece, data = data[:size], data[size:]
            began = self._begun
            self._feed(piece)
            if trailers and self._reading == "body":
                self._reading = "trailers"
                self._head.begin_trailers()
            elif self._reading in ("head", "trailers") and not self._head.took(piece, self._begun != began):
                what = "request line and headers" if self._reading == "head" else "trailer section"
                self._refuse(431, f"{what} exceed {limit} bytes")

    def _feed(self, data: bytes | memoryview) -> None:
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
        self._begun += 1
        self._arm(self._limits.header_timeout_s, 408, "request headers not received")

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._limits.max_headers:
            self._refusal = error_response(431, f"more than {self._limits.max_headers} request headers")
            raise _Refused
        if self._reading == "trailers":
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._reading = "body"
        parser = self._parser
        self._method = method = parser.get_method()
        self._keep_alive = parser.should_keep_alive()
        # A complete HEAD request: its answer, whatever it is, carries no body.
        self._head_method = method == b"HEAD"
        self._arm(self._limits.body_timeout_s, 408, "request body not received")
        if parser.should_upgrade():
            if method == b"CONNECT":
                self._refusal = error_response(405, "CONNECT is not supported", [("allow", "GET, POST")])
                return
            self._upgrade = True
        length = self._headers.get("content-length", "0")
        if length.isdigit() and int(length) > self._server.max_body:
            self._reject(body_too_large(self._server.max_body))
            return
        if length.isdigit() and "transfer-encoding" not in self._headers and not self._upgrade:
            # Framed by Content-Length alone (the parser refuses it next to Transfer-Encoding, and
            # twice): this connection may read the rest of the body itself.
            self._expect = int(length)
        elif "transfer-encoding" in self._headers and not self._upgrade:
            self._chunks = ChunkFraming()  # the parser refuses a request body framed otherwise
        if (
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
        self._complete(self._parser.get_method(), self._parser.should_keep_alive())

    def _complete(self, raw_method: bytes, keep_alive: bool) -> None:
        self._disarm()
        self._reading = None
        if self._discarding:
            return
        if self._refusal is not None:
            self._reject(self._refusal)
            return
        method = raw_method.decode("ascii", "replace")
        parts = self._body
        body: bytes | Body
        if not parts:
            body = b""
        elif len(parts) == 1 and isinstance(parts[0], bytes):
            body = parts[0]
        else:
            body = Body(parts)
        request = Request(method, self._url.decode("latin-1"), self._headers, body)
        keep_alive = keep_alive and not self._upgrade
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
            transport = self._transport
            sent = await http_stream.send(
                transport, response, (keep_alive, head_only), self._writable, self._limits.body_timeout_s
            )
            if transport is None or not sent:
                break
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
        """One deadline per connection: that of whatever it is waiting for now. None while
        reading is paused: a client cannot be late with what the server does not read."""
        if self._paused:
            self._deadline.clear()
        else:
            self._deadline.arm(seconds, status, what)

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
        elif self._reading in ("body", "trailers"):
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
        self._deadline.clear()

    def _expire(self, seconds: float, status: int | None, what: str) -> None:
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
