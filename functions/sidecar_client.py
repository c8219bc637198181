"""A keep-alive HTTP/1.1 client for the sidecar on localhost.

The inference data path goes through here byte for byte: no tensor is decoded, bodies are handed
to the socket without joining, and connections are reused. A streamed answer (``generate_stream``'s
server-sent events) is handed on piece by piece as Triton writes it (``UpstreamPool.stream``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import httptools

from functions.http_types import Body

Headers = list[tuple[bytes, bytes]]


class UpstreamUnavailable(Exception):
    """The sidecar refused or dropped the connection."""


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: Headers
    body: bytes


# Pieces of a streamed answer held for a slow reader before the sidecar's socket stops being read.
_STREAM_PIECES = 16


@dataclass(frozen=True, slots=True)
class UpstreamStream:
    """A streamed answer's head, and its body as it comes: iterate ``pieces`` to the end (the
    connection then goes back to the pool) or ``aclose`` it (the connection is closed)."""

    status: int
    headers: Headers
    pieces: AsyncIterator[bytes]


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[UpstreamResponse] | None = None
        self._headers: Headers = []
        self._body: list[bytes] = []
        # Streaming: the head's waiter, and the body's pieces (None once complete).
        self._head_waiter: asyncio.Future[tuple[int, Headers]] | None = None
        self._pieces: asyncio.Queue[bytes | Exception | None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(UpstreamUnavailable(f"sidecar closed the connection: {exc}"))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            self._fail(UpstreamUnavailable(f"bad response from sidecar: {exc}"))

    def _fail(self, exc: Exception) -> None:
        for waiter in (self._waiter, self._head_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
        if self._pieces is not None:
            self._pieces.put_nowait(exc)
            self._pieces = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._head_waiter is not None and not self._head_waiter.done():
            self._head_waiter.set_result((self._parser.get_status_code(), self._headers))

    def on_body(self, body: bytes) -> None:
        pieces = self._pieces
        if pieces is None:
            self._body.append(body)
            return
        pieces.put_nowait(body)
        if pieces.qsize() >= _STREAM_PIECES and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def taken(self) -> None:
        """A streamed piece was read: the sidecar's socket is read again once the backlog drains."""
        if self._paused and self._pieces is not None and self._pieces.qsize() < _STREAM_PIECES // 2:
            self._paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    def on_message_complete(self) -> None:
        if self._pieces is not None:
            self._pieces.put_nowait(None)
            self._pieces = None
            self._headers = []
            if not self._parser.should_keep_alive():
                self.close()
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        response = UpstreamResponse(self._parser.get_status_code(), self._headers, body)
        self._headers, self._body = [], []
        if not self._parser.should_keep_alive():
            self.close()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def send(self, head: bytes, body: bytes | Body) -> asyncio.Future[UpstreamResponse]:
        """Only called on a connected protocol (the pool hands out connected ones)."""
        self._waiter = asyncio.get_running_loop().create_future()
        transport = cast(asyncio.Transport, self.transport)
        if isinstance(body, Body):
            transport.writelines((head, *body.parts))
        else:
            transport.writelines((head, body) if body else (head,))
        return self._waiter

    def send_streamed(
        self, head: bytes, body: bytes | Body
    ) -> tuple[asyncio.Future[tuple[int, Headers]], asyncio.Queue[bytes | Exception | None]]:
        """Like ``send``, for an answer read piece by piece: the head's status, then the pieces."""
        self._head_waiter = asyncio.get_running_loop().create_future()
        self._pieces = asyncio.Queue()
        self.send(head, body)
        self._waiter = None
        return self._head_waiter, self._pieces

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[UpstreamResponse]) -> None:
    """A timer rather than ``asyncio.wait_for``: no extra task or future on the hot path."""
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class UpstreamPool:
    """Idle keep-alive connections to one ``host:port``; a connection serves one request at a time."""

    def __init__(self, host: str, port: int, max_idle: int = 64) -> None:
        self.host = host
        self.port = port
        self._idle: deque[_Connection] = deque()
        self._max_idle = max_idle
        self._host_header = f"Host: {host}:{port}\r\n".encode()

    async def request(
        self, method: str, target: str, headers: Headers, body: bytes | Body, timeout: float | None
    ) -> UpstreamResponse:
        """One round trip; raises ``TimeoutError`` or ``UpstreamUnavailable``."""
        conn = await self._acquire()
        waiter = conn.send(self._head(method, target, headers, len(body)), body)
        expiry = None if timeout is None else asyncio.get_running_loop().call_later(timeout, _expire, waiter)
        try:
            response = await waiter
        except BaseException:
            conn.close()
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        if not conn.closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def stream(
        self, method: str, target: str, headers: Headers, body: bytes | Body, timeout: float | None
    ) -> UpstreamStream:
        """A round trip whose answer is read as it comes; ``timeout`` bounds the whole answer,
        head and body. Raises ``TimeoutError`` or ``UpstreamUnavailable`` before the head; after
        it, the pieces raise them."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        conn = await self._acquire()
        head_waiter, pieces = conn.send_streamed(self._head(method, target, headers, len(body)), body)
        try:
            status, head = await asyncio.wait_for(head_waiter, timeout)
        except BaseException:
            conn.close()
            raise
        return UpstreamStream(status, head, self._pieces(conn, pieces, deadline))

    async def _pieces(
        self, conn: _Connection, pieces: asyncio.Queue[bytes | Exception | None], deadline: float | None
    ) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        done = False
        try:
            while True:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    raise TimeoutError()
                piece = await asyncio.wait_for(pieces.get(), left)
                conn.taken()
                if isinstance(piece, Exception):
                    raise piece
                if piece is None:
                    done = True
                    return
                yield piece
        finally:
            if done and not conn.closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as exc:
            raise UpstreamUnavailable(
                f"cannot connect to the sidecar at {self.host}:{self.port}: {exc}"
            ) from exc
        return conn

    def _head(self, method: str, target: str, headers: Headers, length: int) -> bytes:
        lines = [f"{method} {target} HTTP/1.1\r\n".encode(), self._host_header]
        lines.extend(b"%s: %s\r\n" % pair for pair in headers)
        lines.append(b"Content-Length: %d\r\n\r\n" % length)
        return b"".join(lines)
