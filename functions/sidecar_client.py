"""A keep-alive HTTP/1.1 client for the sidecar on localhost.

The inference data path goes through here byte for byte: no tensor is decoded, bodies are handed
to the socket without joining, and connections are reused.
"""

from __future__ import annotations

import asyncio
from collections import deque
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


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[UpstreamResponse] | None = None
        self._headers: Headers = []
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(UpstreamUnavailable(f"sidecar closed the connection: {exc}"))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(UpstreamUnavailable(f"bad response from sidecar: {exc}"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
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
