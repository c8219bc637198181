"""AWS Lambda with a Function URL in ``RESPONSE_STREAM`` mode: ``python -m functions lambda-runtime``.

``awslambdaric`` answers an invocation only when its handler returns, so through it a generation
reaches the caller whole. This runtime speaks Lambda's runtime API itself, as AWS documents it for
custom runtimes that stream: an HTTP event whose answer is a stream (``generate_stream``) is posted
to ``/runtime/invocation/{id}/response`` chunked, with ``Lambda-Runtime-Function-Response-Mode:
streaming``, as a Function URL's HTTP integration response (a JSON prelude with the status and
headers, eight NUL bytes, then the events as the model makes them); a failure after the first
byte goes in the trailers (``Lambda-Runtime-Function-Error-Type`` and ``-Body``). Every other
invocation (``infer``, warm-up pings, ``Invoke``) is answered buffered, as ``awslambdaric`` would.

The instance's set-up is ``functions.aws_lambda``'s (the sidecar, the core); a set-up that fails
is reported to ``/runtime/init/error``.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported once the sidecar has started (functions.aws_lambda), so the two overlap
    from functions.core import FunctionCore
    from functions.http_types import Response

log = logging.getLogger("spillway.function.lambda")

API = "/2018-06-01/runtime"
HTTP_INTEGRATION = "application/vnd.awslambda.http-integration-response"
PRELUDE_END = b"\0" * 8
ERROR_TRAILERS = "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body"
# The runtime API is Lambda's own, on the instance; it answers a posted response at once.
POST_TIMEOUT_S = 10.0
# An event is at most Lambda's 6 MB synchronous payload; anything longer is not Lambda's.
MAX_EVENT_BYTES = 7 << 20


@dataclass(frozen=True)
class Invocation:
    request_id: str
    deadline_ms: int
    event: bytes

    def time_left_s(self) -> float | None:
        return max(0.0, self.deadline_ms / 1000 - time.time()) if self.deadline_ms else None


class RuntimeApi:
    """Lambda's runtime API at ``address`` (``$AWS_LAMBDA_RUNTIME_API``, ``host:port``)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)

    def next(self) -> Invocation:
        """The next invocation. No timeout: Lambda answers when there is one, and freezes the
        instance until then."""
        connection = http.client.HTTPConnection(self.host, self.port)
        try:
            connection.request("GET", f"{API}/invocation/next")
            answer = connection.getresponse()
            length = int(answer.headers.get("content-length") or 0)
            if answer.status != 200 or length > MAX_EVENT_BYTES:
                raise RuntimeError(
                    f"the runtime API answered /invocation/next with {answer.status}, {length} bytes"
                )
            event = answer.read(length)
            return Invocation(
                answer.headers.get("lambda-runtime-aws-request-id") or "",
                int(answer.headers.get("lambda-runtime-deadline-ms") or 0),
                event,
            )
        finally:
            connection.close()

    def respond(self, request_id: str, payload: object) -> None:
        self._post(f"{API}/invocation/{request_id}/response", json.dumps(payload).encode())

    def fail(self, request_id: str, exc: BaseException) -> None:
        """The invocation failed, as a handler's exception would under ``awslambdaric``."""
        self._post(f"{API}/invocation/{request_id}/error", _error_body(exc), _error_type(exc))

    def init_failed(self, exc: BaseException) -> None:
        self._post(f"{API}/init/error", _error_body(exc), "Runtime.InitError")

    def _post(self, path: str, body: bytes, error_type: str | None = None) -> None:
        headers = {"content-type": "application/json"}
        if error_type is not None:
            headers["lambda-runtime-function-error-type"] = error_type
        connection = http.client.HTTPConnection(self.host, self.port, timeout=POST_TIMEOUT_S)
        try:
            connection.request("POST", path, body, headers)
            answer = connection.getresponse()
            answer.read()
            if answer.status >= 400:
                log.error("the runtime API refused %s with %d", path, answer.status)
        finally:
            connection.close()

    async def stream(self, request_id: str, response: Response, pieces: AsyncIterator[bytes]) -> None:
        """Post ``response`` as a Function URL's streamed HTTP response, each piece as it comes;
        the pieces' source is closed however it ends (a caller gone closes the sidecar's stream)."""
        from functions import http_stream

        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except BaseException:
            await http_stream.close(pieces)
            raise
        try:
            head = (
                f"POST {API}/invocation/{request_id}/response HTTP/1.1\r\n"
                f"Host: {self.host}:{self.port}\r\n"
                f"Content-Type: {HTTP_INTEGRATION}\r\n"
                "Lambda-Runtime-Function-Response-Mode: streaming\r\n"
                "Transfer-Encoding: chunked\r\n"
                f"Trailer: {ERROR_TRAILERS}\r\n\r\n"
            )
            writer.write(head.encode() + _chunk(prelude(response)))
            trailers = b""
            try:
                async for piece in pieces:
                    writer.write(_chunk(piece))
                    await writer.drain()
            except Exception as exc:  # after the first byte, a failure can only go in the trailers
                log.error("stream %s failed after its first byte: %s", request_id, exc)
                trailers = (
                    f"Lambda-Runtime-Function-Error-Type: {_error_type(exc)}\r\n"
                    f"Lambda-Runtime-Function-Error-Body: {base64.b64encode(_error_body(exc)).decode()}\r\n"
                ).encode()
            writer.write(b"0\r\n" + trailers + b"\r\n")
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), POST_TIMEOUT_S)
            if not status.startswith(b"HTTP/1.1 2"):
                log.error("the runtime API refused stream %s: %r", request_id, status[:100])
        finally:
            writer.close()
            await http_stream.close(pieces)


def prelude(response: Response) -> bytes:
    """What a Function URL makes the HTTP response's status and headers of."""
    from functions.events import folded

    cookies = [value for name, value in response.headers if name.lower() == "set-cookie"]
    headers = folded([(name, value) for name, value in response.headers if name.lower() != "set-cookie"])
    return (
        json.dumps({"statusCode": response.status, "headers": headers, "cookies": cookies}).encode()
        + PRELUDE_END
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


def _error_type(exc: BaseException) -> str:
    return f"Runtime.{type(exc).__name__}"


def _error_body(exc: BaseException) -> bytes:
    return json.dumps(
        {"errorMessage": str(exc)[:1000], "errorType": _error_type(exc), "stackTrace": []}
    ).encode()


async def _serve(api: RuntimeApi, invocation: Invocation, core: FunctionCore) -> None:
    """One invocation, answered buffered, or streamed when its answer is a stream."""
    from functions.events import UnknownEvent
    from functions.http_types import Response
    from functions.invocation import answer, gathered

    try:
        event = json.loads(invocation.event)
    except ValueError as exc:
        api.fail(invocation.request_id, UnknownEvent(f"the event is not JSON: {exc}"))
        return
    answered = await answer(core, event, invocation.time_left_s())
    if isinstance(answered, Response) and answered.stream is not None:
        await api.stream(invocation.request_id, answered, answered.stream)
        return
    api.respond(
        invocation.request_id, answered if isinstance(answered, dict) else await gathered(core, answered)
    )


def main() -> int:
    """Set the instance up, then answer invocations until Lambda stops the instance."""
    api = RuntimeApi(os.environ["AWS_LAMBDA_RUNTIME_API"])
    try:
        from functions import aws_lambda
    except Exception as exc:  # the set-up failed: Lambda reports it and tries a new instance
        log.exception("the function's set-up failed")
        api.init_failed(exc)
        return 1
    while True:
        invocation = api.next()
        try:
            aws_lambda.loop.run_until_complete(_serve(api, invocation, aws_lambda.core))
        except Exception as exc:  # the next invocation is served whatever this one did
            log.exception("invocation %s failed", invocation.request_id)
            api.fail(invocation.request_id, exc)
