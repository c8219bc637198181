"""One event invocation (Lambda ``Invoke``, Function URL, FC ``/invoke``) answered by the core."""

from __future__ import annotations

from typing import Any

from functions.contract import WarmupPing
from functions.core import FunctionCore
from functions.events import parse_event, to_http_result


async def answer_event(core: FunctionCore, event: object, time_left_s: float | None) -> dict[str, Any]:
    """Warm-up pings get the warm-up report; HTTP events get the Function URL response shape.

    Raises ``UnknownEvent`` for anything else, which each platform reports as a failed invocation.
    """
    what = parse_event(event)
    if isinstance(what, WarmupPing):
        report = await core.warmup(what, time_left_s)
        return report.model_dump(mode="json")
    return to_http_result(await core.handle(what.to_request(), time_left_s))
