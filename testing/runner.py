"""Plugins and an in-process runner for the protocol tests (the socket and the peer are real)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from devtools.apisix_peer import ApisixPeer
from gateway_plugin.plugin import HttpRequest, HttpResponse, Plugin, RequestAction, ResponseAction
from gateway_plugin.plugins.headers import HeadersPlugin
from gateway_plugin.runner import Runner, serve
from gateway_plugin.runner.conf_cache import ConfCache

# A loaded machine may accept a burst of connections slower than APISIX's 1 s connect timeout.
PEER_TIMEOUT_S = 10


class Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StopConf(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: int = 403


class StopPlugin(Plugin[StopConf]):
    """Stops every request with the configured status and an echo of what it saw."""

    name = "stop"
    config_model = StopConf

    async def request_filter(self, conf: StopConf, request: HttpRequest, action: RequestAction) -> None:
        seen = " ".join(
            [
                request.method,
                request.path,
                str(request.arg("q")),
                str(request.headers.get("x-a")),
                request.src_ip,
            ]
        )
        action.stop(conf.status, seen.encode(), [("x-stopped", "yes")])


class EchoExtraPlugin(Plugin[Empty]):
    """Fetches a variable and the body over ExtraInfo and stops with both, to check round trips."""

    name = "echo-extra"
    config_model = Empty

    async def request_filter(self, conf: Empty, request: HttpRequest, action: RequestAction) -> None:
        first = await request.var("route_id")
        again = await request.var("route_id")
        missing = await request.var("not_set")
        body = await request.body()
        assert first is again
        action.stop(200, (first or b"") + b"|" + repr(missing).encode() + b"|" + body)


class PrefetchPlugin(Plugin[Empty]):
    """Declares its needs; the runner asks for them before the filter runs."""

    name = "prefetch"
    config_model = Empty
    prefetch_vars = ("remote_addr", "route_id")
    prefetch_body = True

    async def request_filter(self, conf: Empty, request: HttpRequest, action: RequestAction) -> None:
        action.set_header("x-route", (await request.var("route_id") or b"").decode())
        action.set_header("x-body-length", str(len(await request.body())))


class FailingPlugin(Plugin[Empty]):
    name = "failing"
    config_model = Empty

    async def request_filter(self, conf: Empty, request: HttpRequest, action: RequestAction) -> None:
        raise RuntimeError("plugin bug")


class ResponsePlugin(Plugin[Empty]):
    """Rewrites the upstream's answer after reading its body."""

    name = "response"
    config_model = Empty

    async def response_filter(self, conf: Empty, response: HttpResponse, action: ResponseAction) -> None:
        body = await response.body()
        action.set_status(response.status + 1)
        action.set_header("x-upstream-type", response.headers.get("content-type", "-"))
        action.set_body(body.upper())


def test_plugins() -> dict[str, Plugin[Any]]:
    plugins: list[Plugin[Any]] = [
        HeadersPlugin(),
        StopPlugin(),
        EchoExtraPlugin(),
        PrefetchPlugin(),
        FailingPlugin(),
        ResponsePlugin(),
    ]
    return {p.name: p for p in plugins}


@asynccontextmanager
async def running_runner(confs: ConfCache | None = None) -> AsyncIterator[tuple[Runner, ApisixPeer, Path]]:
    """A runner on a real Unix socket in this loop, and an APISIX-side peer talking to it."""
    sock = Path(tempfile.mkdtemp(prefix="spillway-test-")) / "runner.sock"
    runner = Runner(test_plugins(), confs)
    server = await serve(runner, sock)
    peer = ApisixPeer(sock, timeout_s=PEER_TIMEOUT_S, connect_timeout_s=PEER_TIMEOUT_S)
    try:
        yield runner, peer, sock
    finally:
        await peer.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0)
