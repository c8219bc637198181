"""The runner's side of the protocol: a Unix socket server answering APISIX frame by frame.

Calls on one connection are sequential (APISIX waits for each answer), so a connection holds at
most one call in flight; while it runs, the only frames expected are answers to its ExtraInfo
questions, which come back in the order asked. Every call gets exactly one answer frame.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from gateway_plugin.plugin import HttpRequest, HttpResponse, Plugin, RequestAction, ResponseAction
from gateway_plugin.protocol import encode, messages
from gateway_plugin.protocol.frames import ErrCode, FrameReader, FrameTooLarge, FrameType, frame
from gateway_plugin.runner.conf_cache import ConfCache, PreparedConf
from gateway_plugin.runner.eager import run_eagerly

log = logging.getLogger("spillway.runner")

_ERROR_FRAMES = {code: frame(FrameType.RPC_ERROR, encode.error(code)) for code in ErrCode}


class ConfError(ValueError):
    """A PrepareConf the runner cannot accept (unknown plugin, invalid conf)."""


class Runner:
    """Plugins by name, the conf cache, and the dispatch of calls to plugin chains."""

    def __init__(
        self,
        plugins: Mapping[str, Plugin[Any]],
        confs: ConfCache | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.plugins = dict(plugins)
        self.confs = confs if confs is not None else ConfCache()
        self.limits = limits or ConnectionLimits()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.connections = 0

    def prepare(self, payload: bytes) -> bytes:
        _, entries = messages.prepare_conf(payload)
        chain = []
        for name, raw in entries:
            plugin = self.plugins.get(name)
            if plugin is None:
                raise ConfError(f"unknown plugin {name!r}; this runner has {sorted(self.plugins)}")
            try:
                chain.append((plugin, plugin.parse_conf(raw or "")))
            except ValidationError as exc:
                raise ConfError(f"invalid conf for plugin {name!r}: {exc}") from None
        return encode.prepare_conf_answer(self.confs.put(PreparedConf.of(chain)))

    async def request(self, conf: PreparedConf, call: messages.HttpReqCall, info: Any) -> bytes:
        request = HttpRequest(call, info)
        if conf.prefetch_vars or conf.prefetch_body:
            request.prefetch(conf.prefetch_vars, conf.prefetch_body)
        action = RequestAction(request)
        for plugin, plugin_conf in conf.chain:
            await plugin.request_filter(plugin_conf, request, action)
            if action.stopped:
                break
        return action.encode(call.id)

    async def response(self, conf: PreparedConf, call: messages.HttpRespCall, info: Any) -> bytes:
        response = HttpResponse(call, info)
        action = ResponseAction()
        for plugin, plugin_conf in conf.chain:
            await plugin.response_filter(plugin_conf, response, action)
        return action.encode(call.id)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one APISIX connection may hold: a partial frame only for so long, a few frames queued
    behind a call in flight, ExtraInfo answers within a deadline; and how many connections."""

    frame_timeout_s: float = 10.0
    max_backlog: int = 16
    ask_timeout_s: float = 60.0
    max_connections: int = 1024


_MAX_BACKLOG_BYTES = 4 << 20


class _Connection(asyncio.Protocol):
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


def socket_path(address: str | None = None) -> Path:
    """The socket APISIX names in ``APISIX_LISTEN_ADDRESS`` (``unix:/path``)."""
    raw = address if address is not None else os.environ.get("APISIX_LISTEN_ADDRESS", "")
    if not raw:
        raise ValueError(
            "APISIX_LISTEN_ADDRESS is not set: APISIX sets it when it starts the runner "
            "(ext-plugin.cmd); set it yourself, e.g. unix:/tmp/runner.sock, to run by hand"
        )
    return Path(raw.removeprefix("unix:"))


async def serve(runner: Runner, path: Path, group: str | None = None) -> asyncio.AbstractServer:
    """Listen on ``path``, owner-only (0600), or owner and ``group`` (0660) where APISIX's workers
    run as another user: only APISIX may talk to the runner."""
    if path.is_socket():
        path.unlink()
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: _Connection(runner), str(path), backlog=1024
    )
    if group is None:
        os.chmod(path, 0o600)
    else:
        shutil.chown(path, group=group)
        os.chmod(path, 0o660)
    return server
