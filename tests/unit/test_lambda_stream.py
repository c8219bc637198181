"""The streaming runtime's side of Lambda's runtime API, against the stand-in of the documented
API (``testing.lambda_runtime_api``): the Function URL's prelude, and a failure after the first
byte reported in the trailers, as a caller of a streaming function sees it."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

from functions.http_types import Response
from functions.lambda_stream import PRELUDE_END, RuntimeApi, prelude
from testing.lambda_runtime_api import runtime_api


async def _failing() -> AsyncIterator[bytes]:
    yield b"data: {}\n\n"
    raise ValueError("the generation broke")


def test_a_failure_after_the_first_byte_goes_in_the_trailers() -> None:
    with runtime_api() as (stand_in, address):
        answer = stand_in.invoke({})
        stand_in.events.get()  # taken as the runtime's /next would take it
        response = Response(200, [("content-type", "text/event-stream")])
        asyncio.run(RuntimeApi(address).stream(answer.request_id, response, _failing()))
        answer.wait(10)
    assert answer.body == prelude(response) + b"data: {}\n\n"
    assert answer.trailers["lambda-runtime-function-error-type"] == "Runtime.ValueError"
    body = json.loads(base64.b64decode(answer.trailers["lambda-runtime-function-error-body"]))
    assert body["errorMessage"] == "the generation broke"


def test_the_prelude_carries_the_status_headers_and_cookies_apart() -> None:
    made = prelude(Response(429, [("retry-after", "1"), ("set-cookie", "a=1"), ("x-a", "1"), ("x-a", "2")]))
    assert made.endswith(PRELUDE_END)
    assert json.loads(made[: -len(PRELUDE_END)]) == {
        "statusCode": 429,
        "headers": {"retry-after": "1", "x-a": "1, 2"},
        "cookies": ["a=1"],
    }
