"""One APISIX connection: frames in, answers out.

Calls on one connection are sequential (APISIX waits for each answer), so a connection holds at
most one call in flight; while it runs, the only frames expected are answers to its ExtraInfo
questions, which come back in the order asked. A peer that sends more is held to a short queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, cast

from gateway_plugin.protocol import encode, messages
from gateway_plugin.protocol.frames import ErrCode, FrameReader, FrameTooLarge, FrameType, frame
from gateway_plugin.runner.conf_cache import PreparedConf
from gateway_plugin.runner.dispatch import ConfError, Runner
from gateway_plugin.runner.eager import run_eagerly

log = logging.getLogger("spillway.runner")

_ERROR_FRAMES = {code: frame(FrameType.RPC_ERROR, encode.error(code)) for code in ErrCode}
_MAX_BACKLOG_BYTES = 4 << 20


class ApisixConnection(asyncio.Protocol):
    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._limits = runner.limits
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._asks: deque[asyncio.Future[bytes | None]] = deque()
        self._backlog: deque[tuple[int, bytes]] = deque()
        self._backlog_bytes = 0
        self._busy = False
        self._counted = False
        self._partial_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._runner.connections >= self._limits.max_connections:
            log.error("refusing a connection: %d already open", self._runner.connections)
            self._transport.close()
            return
        self._runner.connections += 1
        self._counted = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._backlog.clear()
        if self._partial_timer is not None:
            self._partial_timer.cancel()
        if self._counted:
            self._runner.connections -= 1
            self._counted = False
        while self._asks:
            fut = self._asks.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError("APISIX closed the connection"))

    def data_received(self, data: bytes) -> None:
        for ty, payload in self._reader.feed(data):
            if ty == FrameType.EXTRA_INFO and self._asks:
                self._answer(payload)
            elif self._busy:
                self._queue(ty, payload)
            else:
                self._dispatch(ty, payload)
        self._time_partial_frame()

    def _queue(self, ty: int, payload: bytes) -> None:
        """APISIX sends one call at a time; a peer that sends more is held to a short queue (reading
        goes on: the call in flight may still be waiting for its ExtraInfo answers)."""
        self._backlog_bytes += len(payload)
        if len(self._backlog) >= self._limits.max_backlog or self._backlog_bytes > _MAX_BACKLOG_BYTES:
            log.error("closing a connection that sent %d frames ahead of an answer", len(self._backlog) + 1)
            self._close()
            return
        self._backlog.append((ty, payload))

    def _time_partial_frame(self) -> None:
        pending = self._reader.pending > 0
        if pending and self._partial_timer is None:
            self._partial_timer = asyncio.get_running_loop().call_later(
                self._limits.frame_timeout_s, self._partial_frame_expired
            )
        elif not pending and self._partial_timer is not None:
            self._partial_timer.cancel()
            self._partial_timer = None

    def _partial_frame_expired(self) -> None:
        self._partial_timer = None
        log.error(
            "closing a connection that left %d bytes of a frame unfinished for %g s",
            self._reader.pending,
            self._limits.frame_timeout_s,
        )
        self._close()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def ask(self, payload: bytes) -> asyncio.Future[bytes | None]:
        """Send one ExtraInfo question; the future resolves with APISIX's answer."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes | None] = loop.create_future()
        if self._transport is None:
            fut.set_exception(ConnectionError("APISIX closed the connection"))
        else:
            self._asks.append(fut)
            self._transport.write(frame(FrameType.EXTRA_INFO, payload))
            timer = loop.call_later(self._limits.ask_timeout_s, _expire_ask, fut, self._limits.ask_timeout_s)
            fut.add_done_callback(lambda done: _settled(done, timer))
        return fut

    def _answer(self, payload: bytes) -> None:
        fut = self._asks.popleft()
        if fut.done():
            return
        try:
            fut.set_result(messages.extra_info_result(payload))
        except messages.DecodeError as exc:
            fut.set_exception(exc)

    def _dispatch(self, ty: int, payload: bytes) -> None:
        try:
            if ty == FrameType.HTTP_REQ_CALL:
                call: Any = messages.HttpReqCall(payload)
                run: Callable[[PreparedConf, Any, Any], Coroutine[Any, Any, bytes]] = self._runner.request
            elif ty == FrameType.HTTP_RESP_CALL:
                call = messages.HttpRespCall(payload)
                run = self._runner.response
            elif ty == FrameType.PREPARE_CONF:
                self._send(FrameType.PREPARE_CONF, self._runner.prepare(payload))
                return
            else:
                log.warning("unexpected frame type %d (%d bytes)", ty, len(payload))
                self._error(ErrCode.BAD_REQUEST)
                return
        except messages.DecodeError as exc:
            log.warning("bad frame of type %d: %s", ty, exc)
            self._error(ErrCode.BAD_REQUEST)
            return
        except ConfError as exc:
            log.error("%s", exc)
            self._error(ErrCode.BAD_REQUEST)
            return
        conf = self._runner.confs.get(call.conf_token)
        if conf is None:
            self._error(ErrCode.CONF_TOKEN_NOT_FOUND)
            return
        self._busy = True
        run_eagerly(run(conf, call, self), lambda out, exc: self._finish(ty, out, exc), self._runner.tasks)

    def _finish(self, ty: int, out: bytes | None, exc: BaseException | None) -> None:
        if exc is None and out is not None:
            self._send(ty, out)
        elif isinstance(exc, messages.DecodeError):
            log.warning("bad frame of type %d: %s", ty, exc)
            self._error(ErrCode.BAD_REQUEST)
        elif self._transport is None:
            log.info("APISIX closed the connection before a call was answered (%r)", exc)
        else:
            log.error("plugin failed: %r", exc, exc_info=exc)
            self._error(ErrCode.SERVICE_UNAVAILABLE)
        self._busy = False
        while self._backlog and not self._busy:
            ty, payload = self._backlog.popleft()
            self._backlog_bytes -= len(payload)
            self._dispatch(ty, payload)

    def _send(self, ty: int, payload: bytes) -> None:
        if self._transport is None:
            return
        try:
            self._transport.write(frame(ty, payload))
        except FrameTooLarge as exc:
            log.error("answer not sent: %s", exc)
            self._error(ErrCode.SERVICE_UNAVAILABLE)

    def _error(self, code: ErrCode) -> None:
        if self._transport is not None:
            self._transport.write(_ERROR_FRAMES[code])


def _settled(fut: asyncio.Future[bytes | None], timer: asyncio.TimerHandle) -> None:
    """An answer nobody awaited (a prefetch the filter never read) must not log as unretrieved."""
    timer.cancel()
    if not fut.cancelled():
        fut.exception()


def _expire_ask(fut: asyncio.Future[bytes | None], seconds: float) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"APISIX did not answer an ExtraInfo question within {seconds:g} s"))
