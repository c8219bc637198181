"""One event invocation (Lambda ``Invoke``, Function URL, FC ``/invoke``) answered by the core."""

from __future__ import annotations

from typing import Any

from functions import http_stream
from functions.contract import WarmupPing
from functions.core import FunctionCore
from functions.events import parse_event, to_http_result
from functions.http_types import Response, error_response


async def answer(core: FunctionCore, event: object, time_left_s: float | None) -> dict[str, Any] | Response:
    """A warm-up ping's report, or an HTTP event's response (a stream still to be read).

    Raises ``UnknownEvent`` for anything else, which each platform reports as a failed invocation.
    """
    what = parse_event(event)
    if isinstance(what, WarmupPing):
        report = await core.warmup(what, time_left_s)
        return report.model_dump(mode="json")
    return await core.handle(what.to_request(), time_left_s)


async def gathered(core: FunctionCore, response: Response) -> dict[str, Any]:
    """The Function URL response shape; a streamed generation is gathered whole first (an
    invocation answers at once)."""
    if response.stream is not None:
        try:
            response.body = await http_stream.gather(response.stream, core.settings.max_body_bytes)
        except http_stream.TooLong as exc:
            response = core.identify(error_response(502, str(exc)))
        response.stream = None
    return to_http_result(response)


async def answer_event(core: FunctionCore, event: object, time_left_s: float | None) -> dict[str, Any]:
    """Every answer whole: warm-up pings get the warm-up report, HTTP events the Function URL shape."""
    answered = await answer(core, event, time_left_s)
    return answered if isinstance(answered, dict) else await gathered(core, answered)
