"""The platform-neutral HTTP core of a function instance.

Every platform adapter (Lambda events, the FC server, the local server) turns what it receives
into a ``Request`` and hands it here; the answer is one ``Response``, whatever went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from pydantic import ValidationError

from functions import contract, http_stream, surface
from functions.forward import GENERATE_PATHS, Forwarder, Upstream
from functions.http_types import (
    Body,
    Request,
    Response,
    body_too_large,
    error_response,
    internal_error,
)
from functions.instance import Instance
from functions.metrics import CONTENT_TYPE, FunctionMetrics
from functions.model_probe import ModelProber
from functions.settings import FunctionSettings
from functions.sidecar import Sidecar, SidecarState
from functions.sidecar_client import UpstreamPool, UpstreamUnavailable
from functions.signature import ReplayCacheFull, SignatureError, Verifier

MIN_TIMEOUT_S = 0.05
# Triton's statistics, read for /spillway/metrics: a scrape waits no longer for them.
STATS_TIMEOUT_S = 2.0


class Prober(Protocol):
    """How warm-up pings check the models (``ModelProber`` in production)."""

    async def ready_models(self, models: Iterable[str]) -> tuple[str, ...]: ...

    async def probe_models(self, models: Iterable[str]) -> tuple[str, ...]: ...

    async def close(self) -> None: ...


class FunctionCore:
    def __init__(
        self,
        settings: FunctionSettings,
        sidecar: Sidecar,
        upstream: Upstream,
        prober: Prober,
        instance: Instance | None = None,
        metrics: FunctionMetrics | None = None,
        triton_metrics: Upstream | None = None,
    ) -> None:
        self.settings = settings
        self.sidecar = sidecar
        self.instance = instance or Instance()
        self.metrics = metrics or FunctionMetrics()
        self._served = False
        self._pool = upstream
        self._forwarder = Forwarder(upstream, sidecar, settings.max_body_bytes)
        # Triton's own metrics port, where it has one (SPILLWAY_GPU_METRICS): its GPU gauges.
        self._triton_metrics = triton_metrics
        self._prober = prober
        self._verifier = (
            Verifier(settings.signing_key, settings.allow_unsigned_payload, settings.replay_cache_entries)
            if settings.signing_key
            else None
        )
        self._restarts_seen = 0

    @classmethod
    def on_sidecar(cls, settings: FunctionSettings, sidecar: Sidecar, instance: Instance) -> FunctionCore:
        """The production wiring: keep-alive HTTP to the sidecar, tritonclient for warm-up probes."""
        address = f"127.0.0.1:{sidecar.http_port}"
        port = sidecar.options.metrics_port
        return cls(
            settings,
            sidecar,
            UpstreamPool("127.0.0.1", sidecar.http_port),
            ModelProber(address),
            instance,
            triton_metrics=None if port is None else UpstreamPool("127.0.0.1", port),
        )

    @property
    def init_ms(self) -> float:
        ready_at = self.sidecar.ready_at
        return 0.0 if ready_at is None else (ready_at - self.instance.started_at) * 1000

    def take_cold(self) -> bool:
        """True exactly once per instance: for the first request it serves."""
        cold, self._served = not self._served, True
        if cold:
            self.metrics.cold_starts.inc()
        return cold

    def identify(self, response: Response, cold: bool = False) -> Response:
        """Every answer names its instance, so callers can count distinct warm instances."""
        response.headers.append((contract.HEADER_INSTANCE, self.instance.id))
        if cold:
            response.headers.append((contract.HEADER_COLD, "1"))
        return response

    async def handle(self, request: Request, time_left_s: float | None = None) -> Response:
        """Answer one HTTP request; ``time_left_s`` is what the platform still allows."""
        started = time.perf_counter()
        # A metrics scrape is no one's request: the first inference after it is still a cold start.
        cold = False if request.path == contract.METRICS_PATH else self.take_cold()
        try:
            response = await self._route(request, self._timeout(time_left_s), cold)
        except Exception:  # the one answer every request is owed
            response = internal_error(f"{request.method} {request.path[:200]}")
        self.identify(response, cold)
        if response.stream is None:
            self._done(request, response, started, cold)
        else:
            response.stream = self._counted(response.stream, request, response, started, cold)
        return response

    async def _counted(
        self, stream: AsyncIterator[bytes], request: Request, response: Response, started: float, cold: bool
    ) -> AsyncIterator[bytes]:
        """A stream is counted (and logged) when it ends, sent whole or cut, with its duration; its
        events (an SSE event ends with a blank line, which no JSON payload holds) as they go."""
        events, last = 0, b""
        try:
            async for piece in stream:
                if not last and piece:
                    self.metrics.first_event.observe(time.perf_counter() - started)
                ended = piece.count(b"\n\n") + (last == b"\n" and piece[:1] == b"\n")
                events, last = events + ended, piece[-1:] or last
                yield piece
        finally:
            self.metrics.stream_events.inc(events)
            await http_stream.close(stream)
            self._done(request, response, started, cold)

    def _done(self, request: Request, response: Response, started: float, cold: bool) -> None:
        elapsed = time.perf_counter() - started
        self.metrics.observe(_kind(request.path), response.status, elapsed)
        if self.settings.access_log_headers is not None:
            self._log_access(request, response, elapsed, cold)

    def _log_access(self, request: Request, response: Response, elapsed: float, cold: bool) -> None:
        """One JSON line per request on stdout, where the platforms collect logs."""
        fields = self.settings.access_log_headers or ()
        line = {
            "event": "request",
            "instance": self.instance.id,
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "ms": round(elapsed * 1000, 3),
            "cold": cold,
            "headers": {h: request.headers.get(h) for h in fields},
        }
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()

    async def warmup(
        self, ping: contract.WarmupPing, time_left_s: float | None = None
    ) -> contract.WarmupReport:
        """A warm-up event (not over HTTP): it is this instance's request, cold or not."""
        return await self._warmup(ping, self._timeout(time_left_s), self.take_cold())

    async def _warmup(
        self, ping: contract.WarmupPing, timeout: float | None, cold: bool
    ) -> contract.WarmupReport:
        """Hold this instance for ``dwell_ms`` so overlapping pings land on distinct instances."""
        dwell = ping.dwell_ms / 1000
        if timeout is not None:
            dwell = min(dwell, max(0.0, timeout - MIN_TIMEOUT_S))
        triton_ready = self.sidecar.state is SidecarState.READY
        models = ping.models or self.settings.models
        check = self._prober.probe_models if ping.probe else self._prober.ready_models
        ready: tuple[str, ...] = ()
        if triton_ready:
            checked, _ = await asyncio.gather(
                asyncio.wait_for(check(models), timeout), asyncio.sleep(dwell), return_exceptions=True
            )
            ready = () if isinstance(checked, BaseException) else checked
        else:
            await asyncio.sleep(dwell)
        self.metrics.warmups.labels(str(cold).lower()).inc()
        return contract.WarmupReport(
            instance_id=self.instance.id,
            cold=cold,
            init_ms=round(self.init_ms, 3),
            uptime_s=round(time.monotonic() - self.instance.started_at, 3),
            triton_ready=triton_ready,
            models_ready=ready,
        )

    def close_connections(self) -> None:
        """Synchronous, for signal handlers: idle keep-alive connections would hold Triton's exit."""
        self._pool.close()
        if self._triton_metrics is not None:
            self._triton_metrics.close()

    async def close(self) -> None:
        self.close_connections()
        await self._prober.close()

    def _timeout(self, time_left_s: float | None) -> float | None:
        if time_left_s is None:
            return self.settings.request_timeout_s
        return time_left_s - self.settings.deadline_margin_s

    async def _route(self, request: Request, timeout: float | None, cold: bool) -> Response:
        if timeout is not None and timeout < MIN_TIMEOUT_S:
            return error_response(
                504,
                "too little time left in this invocation to run an inference; "
                "raise the function timeout or the caller's deadline",
            )
        if len(request.body) > self.settings.max_body_bytes:
            return body_too_large(self.settings.max_body_bytes)
        if self._verifier is not None and not self._scraper(request):
            try:
                self._verifier.verify(
                    request.headers.get(contract.HEADER_SIGNATURE),
                    request.method,
                    request.target,
                    request.body.parts if isinstance(request.body, Body) else request.body,
                    time.time(),
                )
            except SignatureError as exc:
                return error_response(401, str(exc))
            except ReplayCacheFull as exc:
                return error_response(503, str(exc), [("retry-after", str(exc.retry_after_s))])
        try:
            path = contract.request_path(request.path)
        except contract.PathError as exc:
            return error_response(400, str(exc))
        if surface.is_v2(path):
            settings = self.settings
            refusal = surface.check(
                request.method, path, settings.expose_statistics, settings.expose_model_config
            )
            if refusal is not None:
                allow = [("allow", refusal.allow)] if refusal.allow else None
                return error_response(refusal.status, refusal.message, allow)
            return await self._forwarder.forward(request, path, timeout)
        if path == contract.WARMUP_PATH and request.method == "POST":
            return await self._warmup_over_http(request, timeout, cold)
        if path == contract.METRICS_PATH and request.method == "GET":
            return await self._metrics()
        return error_response(
            404,
            f"no such path: {request.method} {path}; this function serves "
            f"/v2/..., POST {contract.WARMUP_PATH} and GET {contract.METRICS_PATH}",
        )

    def _scraper(self, request: Request) -> bool:
        """A metrics scrape carrying SPILLWAY_METRICS_TOKEN: it may read /spillway/metrics unsigned."""
        token = self.settings.metrics_token
        if token is None or request.method != "GET" or request.path != contract.METRICS_PATH:
            return False
        sent = request.headers.get("authorization", "")
        return hmac.compare_digest(sent.encode("latin-1", "replace"), b"Bearer " + token)

    async def _warmup_over_http(self, request: Request, timeout: float | None, cold: bool) -> Response:
        try:
            event = contract.WarmupEvent.model_validate_json(bytes(request.body))
        except ValidationError as exc:
            return error_response(
                400,
                f"bad warm-up ping: {_first_error(exc)}; expected "
                '{"spillway_warmup": {"dwell_ms": int, "models": [str], "probe": bool}}',
            )
        report = await self._warmup(event.spillway_warmup, timeout, cold)
        return Response(200, [("content-type", "application/json")], report.model_dump_json().encode())

    async def _metrics(self) -> Response:
        state = self.sidecar.state
        self.metrics.sidecar_up.set(1 if state is SidecarState.READY else 0)
        if state is SidecarState.READY:
            with contextlib.suppress(TimeoutError, UpstreamUnavailable):
                stats = await self._pool.request(
                    "GET", "/v2/models/stats", [self.sidecar.admin_header()], b"", STATS_TIMEOUT_S
                )
                if stats.status == 200:
                    self.metrics.triton.read(stats.body)
            if self._triton_metrics is not None:
                with contextlib.suppress(TimeoutError, UpstreamUnavailable):
                    page = await self._triton_metrics.request("GET", "/metrics", [], b"", STATS_TIMEOUT_S)
                    if page.status == 200:
                        self.metrics.gpu.read(page.body.decode("utf-8", "replace"))
        new_restarts = self.sidecar.restarts - self._restarts_seen
        if new_restarts > 0:
            self.metrics.sidecar_restarts.inc(new_restarts)
            self._restarts_seen += new_restarts
        self.metrics.init_seconds.set(self.init_ms / 1000)
        return Response(200, [("content-type", CONTENT_TYPE)], self.metrics.render())


def _kind(path: str) -> str:
    """The ``kind`` label of the function's request metrics."""
    if path.endswith("/infer"):
        return "infer"
    return "generate" if path.endswith(GENERATE_PATHS) else "control"


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"
