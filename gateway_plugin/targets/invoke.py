"""Invoke mode: the runner calls the function itself and answers APISIX with a Stop.

The event is the HTTP API 2.0 shape every Spillway function takes; the answer is the Function URL
response shape. The cloud SDKs are blocking, so calls run on a bounded thread pool.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from gateway_plugin.config import Target


class InvokeFailed(Exception):
    """The target could not be invoked, or its answer was not a function response."""


@dataclass(frozen=True)
class FunctionAnswer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class Invoker(Protocol):
    def invoke(self, payload: bytes) -> bytes:
        """Blocking: send one event, return the function's raw answer."""
        ...


def make_invoker(target: Target) -> Invoker:
    """The cloud SDK client for an invoke-mode target (imported only when one is configured)."""
    if target.kind == "aws_lambda":
        from gateway_plugin.targets.aws_lambda import LambdaInvoker

        return LambdaInvoker(target)
    from gateway_plugin.targets.aliyun_fc import FcInvoker

    return FcInvoker(target)


def http_event(method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> bytes:
    event = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": dict(headers),
        "requestContext": {"http": {"method": method, "path": path}},
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }
    return json.dumps(event, separators=(",", ":")).encode()


def parse_answer(raw: bytes) -> FunctionAnswer:
    try:
        result: Any = json.loads(raw)
        status = int(result["statusCode"])
        headers = [(str(k), str(v)) for k, v in (result.get("headers") or {}).items()]
        body = result.get("body") or ""
        data = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvokeFailed(f"the function's answer is not a Function URL response: {exc!r}") from None
    return FunctionAnswer(status, headers, data)


class InvokePool:
    """Runs blocking invocations off the event loop, as many at once as the targets allow."""

    def __init__(self, workers: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spillway-invoke")

    async def call(self, invoker: Invoker, payload: bytes, timeout_s: float) -> FunctionAnswer:
        loop = asyncio.get_running_loop()
        try:
            raw = await asyncio.wait_for(
                loop.run_in_executor(self._executor, invoker.invoke, payload), timeout_s
            )
        except TimeoutError:
            raise InvokeFailed(f"no answer within {timeout_s} s") from None
        return parse_answer(raw)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
