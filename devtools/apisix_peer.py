"""APISIX's side of the ext-plugin protocol, as ``apisix/plugins/ext-plugin/init.lua`` (3.18)
plays it, for unit-speed tests and the development gateway (what APISIX really does is settled on
the real one, in the tests that start it).

Conf tokens cached per conf key; PrepareConf when there is none; HTTPReqCall with the ExtraInfo
loop answered from the request; up to three tries with the token cache flushed on
CONF_TOKEN_NOT_FOUND; 503 on any other failure unless ``allow_degradation``; pooled keep-alive
connections, closed after an error frame, as APISIX closes them; a 1 s connect and 60 s send/read
timeout per operation; call ids ``worker_id << 22`` plus a per-worker count.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway_plugin.protocol import encode, messages, schema
from gateway_plugin.protocol.frames import ErrCode, FrameType, frame

TRIES = 3
TOKEN_CACHE_FACTOR = 0.9
CONNECT_TIMEOUT_S = 1.0
_METHODS = {name: index for index, name in enumerate(schema.METHODS)}


class PeerError(Exception):
    """The runner could not be reached or answered with an error frame."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RouteConf:
    """One route's ``ext-plugin-pre-req`` (or ``-post-resp``) conf."""

    key: str
    conf: Sequence[tuple[str, str]]
    allow_degradation: bool = False


@dataclass
class PeerRequest:
    method: str
    path: str
    args: Sequence[tuple[str, str | None]] = ()
    headers: Sequence[tuple[str, str]] = ()
    src_ip: str = "127.0.0.1"
    vars: Mapping[str, bytes] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class Outcome:
    """What APISIX does next: answer with ``stop``, rewrite, pass unchanged, or fail with ``status``."""

    stop: messages.Stop | None = None
    rewrite: messages.Rewrite | None = None
    status: int | None = None
    error: str | None = None


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, ty: int, payload: bytes) -> None:
        self.writer.write(frame(ty, payload))
        await self.writer.drain()

    async def receive(self) -> tuple[int, bytes]:
        head = await self.reader.readexactly(4)
        length = int.from_bytes(head[1:], "big")
        return head[0], await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        self.writer.close()


class ApisixPeer:
    def __init__(
        self,
        path: Path,
        pool_size: int = 32,
        timeout_s: float = 60.0,
        token_ttl_s: float = 3600.0,
        worker_id: int = 0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._pool: deque[_Conn] = deque()
        self._pool_size = pool_size
        self._tokens: dict[str, tuple[float, int]] = {}
        self._token_ttl = token_ttl_s * TOKEN_CACHE_FACTOR
        self._ids = 0
        self._worker = worker_id
        self.prepares = 0
        self.extra_info_asked = 0

    async def request(self, route: RouteConf, request: PeerRequest) -> Outcome:
        """One request through the runner, retried as APISIX retries it."""
        error = ""
        for _ in range(TRIES):
            try:
                return await asyncio.wait_for(self._request_once(route, request), self.timeout_s)
            except PeerError as exc:
                error = str(exc)
                if exc.code != ErrCode.CONF_TOKEN_NOT_FOUND:
                    break
                self._tokens.clear()
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                error = f"runner unreachable: {exc!r}"
                break
        return Outcome(error=error) if route.allow_degradation else Outcome(status=503, error=error)

    async def response(
        self,
        route: RouteConf,
        status: int,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        variables: Mapping[str, bytes] | None = None,
    ) -> messages.RespCallAnswer | None:
        """``ext-plugin-post-resp``: the runner may change status, headers and body."""
        for _ in range(TRIES):
            try:
                token = await self._token(route)
                payload = encode.resp_call(self._next_id(), token, status, headers)
                fake = PeerRequest("GET", "/", vars=variables or {}, body=body)
                _, answer = await self._exchange(FrameType.HTTP_RESP_CALL, payload, fake)
                return messages.resp_call_answer(answer)
            except PeerError as exc:
                if exc.code != ErrCode.CONF_TOKEN_NOT_FOUND:
                    return None
                self._tokens.clear()
        return None

    async def close(self) -> None:
        while self._pool:
            self._pool.pop().close()

    async def _request_once(self, route: RouteConf, request: PeerRequest) -> Outcome:
        token = await self._token(route)
        payload = encode.req_call(
            self._next_id(),
            token,
            _METHODS.get(request.method.upper(), 0),
            request.path,
            request.args,
            request.headers,
            ipaddress.ip_address(request.src_ip).packed,
        )
        _, answer = await self._exchange(FrameType.HTTP_REQ_CALL, payload, request)
        _, action = messages.req_call_answer(answer)
        if isinstance(action, messages.Stop):
            return Outcome(stop=action)
        return Outcome(rewrite=action)

    async def _token(self, route: RouteConf) -> int:
        cached = self._tokens.get(route.key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        _, answer = await self._exchange(
            FrameType.PREPARE_CONF, encode.prepare_conf(route.key, route.conf), None
        )
        token = messages.conf_token(answer)
        self.prepares += 1
        self._tokens[route.key] = (time.monotonic() + self._token_ttl, token)
        return token

    async def _exchange(self, ty: int, payload: bytes, request: PeerRequest | None) -> tuple[int, bytes]:
        conn = await self._acquire()
        try:
            await conn.send(ty, payload)
            while True:
                got, answer = await conn.receive()
                if got != FrameType.EXTRA_INFO:
                    break
                self.extra_info_asked += 1
                await conn.send(FrameType.EXTRA_INFO, encode.extra_info_answer(_extra_info(answer, request)))
        except BaseException:
            conn.close()
            raise
        if got == FrameType.RPC_ERROR:
            conn.close()
            code = messages.err_code(answer)
            raise PeerError(f"runner answered error {ErrCode(code).name}", code)
        if got != ty:
            conn.close()
            raise PeerError(f"runner answered frame type {got} to a call of type {ty}")
        self._release(conn)
        return got, answer

    async def _acquire(self) -> _Conn:
        if self._pool:
            return self._pool.pop()
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(self.path)), self.connect_timeout_s
        )
        return _Conn(reader, writer)

    def _release(self, conn: _Conn) -> None:
        if len(self._pool) < self._pool_size:
            self._pool.append(conn)
        else:
            conn.close()

    def _next_id(self) -> int:
        """APISIX numbers calls per worker: ``(worker_id << 22) + count``, the count wrapping."""
        self._ids = (self._ids + 1) & ((1 << 22) - 1)
        return (self._worker << 22) + self._ids


def _extra_info(question: bytes, request: PeerRequest | None) -> bytes | None:
    kind, name = messages.extra_info_request(question)
    if request is None:
        return None
    if kind == schema.Info.VAR and name is not None:
        return request.vars.get(name)
    return request.body
