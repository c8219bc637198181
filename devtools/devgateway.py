"""A development stand-in for APISIX: one route, the runner asked through the APISIX-side peer.

Per request it calls the runner, applies Stop or Rewrite, picks the upstream named by
``X-Spillway-Target`` as a ``traffic-split`` rule on ``http_x_spillway_target`` would (else the
route's own upstream), proxies, and calls the runner again for ``ext-plugin-post-resp``.
It is for local runs and tests, not a gateway for production: use APISIX there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from functions.contract import HEADER_TARGET
from functions.http_types import HOP_BY_HOP, Request, Response, error_response
from functions.sidecar_client import UpstreamPool, UpstreamUnavailable
from gateway_plugin.protocol import messages

log = logging.getLogger("spillway.devgateway")

UPSTREAM_TIMEOUT_S = 60.0
# The upstream's own answer time, as APISIX logs $upstream_response_time.
UPSTREAM_TIME_HEADER = "x-spillway-upstream-ms"


class DevGatewaySettings(BaseModel):
    """The development stand-in for APISIX: one route, upstreams picked as traffic-split picks them.

    Read from the ``devgateway`` section of the file given to ``python -m devtools devgateway``; the
    rest of that file is the runner's ``spillway.yaml``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = Field(default="127.0.0.1:9080", description="host:port to serve HTTP on")
    upstreams: dict[str, str] = Field(
        default_factory=lambda: {"local": "http://127.0.0.1:8000"},
        description="upstream name → http://host:port; X-Spillway-Target picks one",
    )
    default_upstream: str = Field(default="local", description="the route's own upstream")
    plugins: list[tuple[str, dict[str, Any]]] = Field(
        default_factory=lambda: [("spillway", dict[str, Any]())],
        description="the route's ext-plugin-pre-req conf, in order",
    )
    post_resp: bool = Field(default=True, description="also call the runner after the upstream answers")
    allow_degradation: bool = Field(default=False, description="pass requests through when the runner fails")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not url.startswith("http://"):
                raise ValueError(f"upstream {name!r}: {url!r} must be an http:// URL")
        return value


def _pool(url: str) -> UpstreamPool:
    parts = urlsplit(url)
    return UpstreamPool(parts.hostname or "127.0.0.1", parts.port or 80)


class DevGateway:
    """``route_values`` maps each upstream name to the ``X-Spillway-Target`` value that selects it,
    as the route's traffic-split rules do (``local``: the name itself)."""

    def __init__(
        self, settings: DevGatewaySettings, peer: ApisixPeer, route_values: dict[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.peer = peer
        conf = [(name, json.dumps(value)) for name, value in settings.plugins]
        self.route = RouteConf("devgateway#route", conf, settings.allow_degradation)
        values = route_values or {}
        self.pools = {values.get(name, name): (name, _pool(url)) for name, url in settings.upstreams.items()}
        self.default = self.pools[values.get(settings.default_upstream, settings.default_upstream)]

    async def handle(self, request: Request) -> Response:
        path, _, query = request.target.partition("?")
        peer_request = PeerRequest(
            method=request.method,
            path=path,
            args=parse_qsl(query, keep_blank_values=True),
            headers=list(request.headers.items()),
            vars=_variables(request, path, query),
            body=request.body,
        )
        outcome = await self.peer.request(self.route, peer_request)
        if outcome.status is not None:
            return error_response(outcome.status, f"ext-plugin failed: {outcome.error}")
        if outcome.stop is not None:
            stop = outcome.stop
            return Response(stop.status or 200, [(k, v) for k, v in stop.headers if v is not None], stop.body)
        headers = dict(request.headers)
        body, resp_headers = request.body, []
        if outcome.rewrite is not None:
            path, query, body = _rewrite(outcome.rewrite, headers, path, query, body)
            resp_headers = [(k, v) for k, v in outcome.rewrite.resp_headers if v is not None]
        response = await self._proxy(request.method, path, query, headers, body)
        response.headers.extend(resp_headers)
        if self.settings.post_resp:
            await self._post_response(response, headers, path)
        return response

    async def _proxy(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes
    ) -> Response:
        name, pool = self.pools.get(headers.get(HEADER_TARGET, ""), self.default)
        forward = [(k.encode(), v.encode("latin-1")) for k, v in headers.items() if k not in HOP_BY_HOP]
        target = f"{path}?{query}" if query else path
        started = time.perf_counter()
        try:
            up = await pool.request(method, target, forward, body, UPSTREAM_TIMEOUT_S)
        except UpstreamUnavailable as exc:
            return error_response(502, f"upstream {name!r} unreachable: {exc}")
        except TimeoutError:
            return error_response(504, f"upstream {name!r} did not answer within {UPSTREAM_TIMEOUT_S:.0f} s")
        kept = [(k.decode(), v.decode("latin-1")) for k, v in up.headers if k.decode() not in HOP_BY_HOP]
        kept.append((UPSTREAM_TIME_HEADER, f"{(time.perf_counter() - started) * 1000:.3f}"))
        return Response(up.status, kept, up.body)

    async def _post_response(self, response: Response, request_headers: dict[str, str], uri: str) -> None:
        """``ext-plugin-post-resp``: the runner sees the answer, and request headers as ``http_*`` vars."""
        variables = {"http_" + k.replace("-", "_"): v.encode("latin-1") for k, v in request_headers.items()}
        upstream_ms = response.header(UPSTREAM_TIME_HEADER)
        if upstream_ms is not None:
            variables["upstream_response_time"] = f"{float(upstream_ms) / 1000:.3f}".encode()
        variables["uri"] = uri.encode("latin-1")
        try:
            answer = await self.peer.response(
                self.route, response.status, response.headers, response.body, variables
            )
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.warning("post-response call failed (%r); the upstream's answer goes out unchanged", exc)
            return
        if answer is None:
            return
        if answer.status:
            response.status = answer.status
        for name, value in answer.headers:
            response.headers = [(k, v) for k, v in response.headers if k.lower() != name.lower()]
            if value is not None:
                response.headers.append((name, value))
        if answer.body is not None:
            response.body = answer.body

    async def close(self) -> None:
        for _, pool in self.pools.values():
            pool.close()
        await self.peer.close()


def _variables(request: Request, path: str, query: str) -> dict[str, bytes]:
    values = {
        "uri": path,
        "request_uri": request.target,
        "args": query,
        "request_method": request.method,
        "host": request.headers.get("host", ""),
        "remote_addr": "127.0.0.1",
        "route_id": "devgateway",
        "request_length": str(len(request.body)),
        "msec": f"{time.time():.3f}",
    }
    return {k: v.encode() for k, v in values.items()}


def _rewrite(
    rewrite: messages.Rewrite, headers: dict[str, str], path: str, query: str, body: bytes
) -> tuple[str, str, bytes]:
    """Apply a Rewrite as APISIX does: a header or arg with no value is deleted."""
    for name, value in rewrite.headers:
        if value is None:
            headers.pop(name.lower(), None)
        else:
            headers[name.lower()] = value
    if rewrite.args:
        args = dict(parse_qsl(query, keep_blank_values=True))
        for name, value in rewrite.args:
            if value is None:
                args.pop(name, None)
            else:
                args[name] = value
        query = urlencode(args)
    return rewrite.path or path, query, rewrite.body if rewrite.body is not None else body
