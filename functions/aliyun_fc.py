"""Alibaba Cloud Function Compute custom-container routes on top of the core.

``POST /initialize`` is the initializer hook, ``POST /invoke`` takes event invocations
(``invoke_function`` and timer triggers), everything else is an HTTP-trigger request. FC reads a
failed event invocation from the ``x-fc-status: 404`` header.
"""

from __future__ import annotations

import asyncio
import json

from functions.core import FunctionCore
from functions.events import UnknownEvent
from functions.http_types import Request, Response, error_response, json_response
from functions.invocation import answer_event
from functions.sidecar import SidecarFailed

FAILED = [("x-fc-status", "404")]


class FcRoutes:
    def __init__(self, core: FunctionCore) -> None:
        self.core = core

    async def __call__(self, request: Request) -> Response:
        if request.method == "POST" and request.path == "/initialize":
            return self.core.identify(await self.initialize(request))
        if request.method == "POST" and request.path == "/invoke":
            return self.core.identify(await self.invoke(request))
        return await self.core.handle(request)

    async def initialize(self, request: Request) -> Response:
        timeout = _seconds(
            request.headers.get("x-fc-initialization-timeout"), self.core.settings.ready_timeout_s
        )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.core.sidecar.wait_ready, timeout)
        except SidecarFailed as exc:
            return error_response(500, f"initializer failed: {exc}", list(FAILED))
        return json_response(
            200, {"instance_id": self.core.instance.id, "init_ms": round(self.core.init_ms, 3)}
        )

    async def invoke(self, request: Request) -> Response:
        try:
            result = await answer_event(self.core, bytes(request.body), None)
        except UnknownEvent as exc:
            return error_response(400, str(exc), list(FAILED))
        return Response(200, [("content-type", "application/json")], json.dumps(result).encode())


def _seconds(raw: str | None, default: float) -> float:
    try:
        return float(raw) if raw else default
    except ValueError:
        return default
