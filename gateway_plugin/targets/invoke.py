"""Invoke mode: the runner calls the function itself and answers APISIX with a Stop.

The event is the HTTP API 2.0 shape every Spillway function takes, and the answer the Function URL
response shape, both declared in ``functions.contract``. The cloud SDKs are blocking, so calls run
on a bounded thread pool.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from functions.contract import http_api_result
from gateway_plugin.config import Target
from gateway_plugin.targets.base import FunctionAnswer, InvokeFailed, Invoker


def make_invoker(target: Target) -> Invoker:
    """The cloud SDK client for an invoke-mode target (imported only when one is configured)."""
    if target.kind == "aws_lambda":
        from gateway_plugin.targets.aws_lambda import LambdaInvoker

        return LambdaInvoker(target)
    from gateway_plugin.targets.aliyun_fc import FcInvoker

    return FcInvoker(target)


def parse_answer(raw: bytes) -> FunctionAnswer:
    try:
        return FunctionAnswer(*http_api_result(raw))
    except ValueError as exc:
        raise InvokeFailed(str(exc)) from None


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
