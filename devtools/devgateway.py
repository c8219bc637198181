"""A development stand-in for APISIX: one route, the runner asked through the APISIX-side peer.

Per request it does what the route's ``spillway-edge`` plugin does (the path read as nginx reads
it, decoded once; no client spelling of ``X-Spillway-*``), calls the runner, applies Stop or
Rewrite, picks the upstream named by the runner's ``X-Spillway-Target`` as a ``traffic-split``
rule on ``spillway_upstream`` would (else the route's own upstream), and proxies without it.
It is for local runs and tests, not a gateway for production: use APISIX there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from devtools.apisix_peer import ApisixPeer, PeerRequest, RouteConf
from functions.contract import HEADER_COLD, HEADER_INSTANCE, HEADER_TARGET, PathError, request_path
from functions.http_types import HOP_BY_HOP, Request, Response, error_response
from functions.sidecar_client import UpstreamPool, UpstreamUnavailable
from gateway_plugin.protocol import messages
from gateway_plugin.request.header_names import HEADER_WORKER, OWN_PREFIX, fold

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
    log_outcomes: bool = Field(
        default=True, description="post each request's outcome to the runner, as the route's http-logger does"
    )
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
        self,
        settings: DevGatewaySettings,
        peer: ApisixPeer,
        route_values: dict[str, str] | None = None,
        outcomes: OutcomeLogger | None = None,
    ) -> None:
        self.settings = settings
        self.peer = peer
        self.outcomes = outcomes if settings.log_outcomes else None
        conf = [(name, json.dumps(value)) for name, value in settings.plugins]
        self.route = RouteConf("devgateway#route", conf, settings.allow_degradation)
        values = route_values or {}
        self.pools = {values.get(name, name): (name, _pool(url)) for name, url in settings.upstreams.items()}
        self.default = self.pools[values.get(settings.default_upstream, settings.default_upstream)]

    async def handle(self, request: Request) -> Response:
        sent, _, query = request.target.partition("?")
        try:
            path = request_path(sent)
        except PathError as exc:
            return error_response(400, str(exc))
        headers = {k: v for k, v in request.headers.items() if not fold(k).startswith(OWN_PREFIX)}
        request_body = bytes(request.body)
        peer_request = PeerRequest(
            method=request.method,
            path=path,
            args=parse_qsl(query, keep_blank_values=True),
            headers=list(headers.items()),
            vars=_variables(request, path, query),
            body=request_body,
        )
        outcome = await self.peer.request(self.route, peer_request)
        if outcome.status is not None:
            return error_response(outcome.status, f"ext-plugin failed: {outcome.error}")
        if outcome.stop is not None:
            stop = outcome.stop
            return Response(stop.status or 200, [(k, v) for k, v in stop.headers if v is not None], stop.body)
        upstream = sent if sent == path else quote(path, safe="/")
        body, resp_headers = request_body, []
        if outcome.rewrite is not None:
            upstream, query, body = _rewrite(outcome.rewrite, headers, upstream, query, body)
            resp_headers = [(k, v) for k, v in outcome.rewrite.resp_headers if v is not None]
        decided, worker = headers.pop(HEADER_TARGET, ""), headers.pop(HEADER_WORKER, None)
        response = await self._proxy(request.method, upstream, query, decided, headers, body)
        response.headers.extend(resp_headers)
        if self.outcomes is not None:
            self.outcomes.log(response, headers, path, decided, worker)
        return response

    async def _proxy(
        self, method: str, path: str, query: str, decided: str, headers: dict[str, str], body: bytes
    ) -> Response:
        name, pool = self.pools.get(decided, self.default)
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

    async def close(self) -> None:
        for _, pool in self.pools.values():
            pool.close()
        if self.outcomes is not None:
            await self.outcomes.flush()
            self.outcomes.close()
        await self.peer.close()


class OutcomeLogger:
    """What APISIX's http-logger does with the route's ``log_format``: one entry per request
    answered by an upstream, posted to the runner's outcome endpoint in short batches."""

    def __init__(self, url: str, auth: str, tenant_header: str, every_s: float = 0.2) -> None:
        parts = urlsplit(url)
        self._pool = UpstreamPool(parts.hostname or "127.0.0.1", parts.port or 80)
        self._path = parts.path
        self._auth = auth
        self._tenant = tenant_header.lower()
        self._every_s = every_s
        self._entries: list[dict[str, str]] = []
        self._flushing: asyncio.Task[None] | None = None

    def log(
        self, response: Response, headers: dict[str, str], uri: str, target: str, worker: str | None
    ) -> None:
        upstream_ms = response.header(UPSTREAM_TIME_HEADER)
        if upstream_ms is None:
            return  # answered by the gateway (a Stop): no upstream, nothing to report
        entry = {
            "target": target or None,
            "worker": worker,
            "status": str(response.status),
            "upstream_status": str(response.status),
            "upstream_s": f"{float(upstream_ms) / 1000:.3f}",
            "instance": response.header(HEADER_INSTANCE),
            "cold": response.header(HEADER_COLD),
            "tenant": headers.get(self._tenant),
            "uri": uri,
        }
        self._entries.append({k: v for k, v in entry.items() if v is not None})
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._every_s)
        self._flushing = None
        await self.flush()

    async def flush(self) -> None:
        entries, self._entries = self._entries, []
        if not entries:
            return
        body = json.dumps(entries).encode()
        headers = [(b"authorization", self._auth.encode()), (b"content-type", b"application/json")]
        try:
            answer = await self._pool.request("POST", self._path, headers, body, 5.0)
        except (UpstreamUnavailable, TimeoutError) as exc:
            log.warning("outcomes not delivered to the runner: %s", exc)
            return
        if answer.status != 204:
            log.warning("the runner refused outcomes: %s %s", answer.status, answer.body[:200])

    def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
        self._pool.close()


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
    """Apply a Rewrite as APISIX does: a header or arg with no value is deleted, the path is sent
    URI-encoded (args appended), and a body replaces the request's only when it is not empty."""
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
    new_path = quote(rewrite.path, safe="/%:@!$&'()*+,;=-._~") if rewrite.path else path
    return new_path, query, rewrite.body or body
