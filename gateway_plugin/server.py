"""The runner's side of the protocol: a Unix socket server answering APISIX frame by frame.

Calls on one connection are sequential (APISIX waits for each answer), so a connection holds at
most one call in flight; while it runs, the only frames expected are answers to its ExtraInfo
questions, which come back in the order asked. Every call gets exactly one answer frame.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from gateway_plugin.conf_cache import ConfCache, PreparedConf
from gateway_plugin.eager import run_eagerly
from gateway_plugin.plugin import HttpRequest, HttpResponse, Plugin, RequestAction, ResponseAction
from gateway_plugin.protocol import encode, messages
from gateway_plugin.protocol.frames import ErrCode, FrameReader, FrameTooLarge, FrameType, frame

log = logging.getLogger("spillway.runner")

_ERROR_FRAMES = {code: frame(FrameType.RPC_ERROR, encode.error(code)) for code in ErrCode}


class ConfError(ValueError):
    """A PrepareConf the runner cannot accept (unknown plugin, invalid conf)."""


class Runner:
    """Plugins by name, the conf cache, and the dispatch of calls to plugin chains."""

    def __init__(self, plugins: Mapping[str, Plugin[Any]], confs: ConfCache | None = None) -> None:
        self.plugins = dict(plugins)
        self.confs = confs if confs is not None else ConfCache()
        self.tasks: set[asyncio.Task[Any]] = set()

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


class _Connection(asyncio.Protocol):
    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._asks: deque[asyncio.Future[bytes | None]] = deque()
        self._backlog: deque[tuple[int, bytes]] = deque()
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        while self._asks:
            fut = self._asks.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError("APISIX closed the connection"))

    def data_received(self, data: bytes) -> None:
        for ty, payload in self._reader.feed(data):
            if ty == FrameType.EXTRA_INFO and self._asks:
                self._answer(payload)
            elif self._busy:
                self._backlog.append((ty, payload))
            else:
                self._dispatch(ty, payload)

    def ask(self, payload: bytes) -> asyncio.Future[bytes | None]:
        """Send one ExtraInfo question; the future resolves with APISIX's answer."""
        fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        if self._transport is None:
            fut.set_exception(ConnectionError("APISIX closed the connection"))
        else:
            self._asks.append(fut)
            self._transport.write(frame(FrameType.EXTRA_INFO, payload))
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
        else:
            log.error("plugin failed: %r", exc, exc_info=exc)
            self._error(ErrCode.SERVICE_UNAVAILABLE)
        self._busy = False
        while self._backlog and not self._busy:
            self._dispatch(*self._backlog.popleft())

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


def socket_path(address: str | None = None) -> Path:
    """The socket APISIX names in ``APISIX_LISTEN_ADDRESS`` (``unix:/path``)."""
    raw = address if address is not None else os.environ.get("APISIX_LISTEN_ADDRESS", "")
    if not raw:
        raise ValueError(
            "APISIX_LISTEN_ADDRESS is not set: APISIX sets it when it starts the runner "
            "(ext-plugin.cmd); set it yourself, e.g. unix:/tmp/runner.sock, to run by hand"
        )
    return Path(raw.removeprefix("unix:"))


async def serve(runner: Runner, path: Path) -> asyncio.AbstractServer:
    """Listen on ``path``; the socket is made usable by APISIX's worker user."""
    if path.is_socket():
        path.unlink()
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: _Connection(runner), str(path), backlog=1024
    )
    os.chmod(path, 0o766)
    return server
