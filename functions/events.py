"""Typed, read-only views over the raw events a function receives.

Function URL and API Gateway HTTP API (payload 2.0) events, direct ``Invoke`` calls from the
gateway (the same shape), warm-up pings, and FC timer-trigger bodies. The raw dict stays
reachable as ``.raw``; bodies are decoded once and cached.
"""

from __future__ import annotations

import base64
import binascii
import json
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from functions.contract import WARMUP_KEY, WarmupEvent, WarmupPing
from functions.http_types import Request, Response

_TEXT_TYPES = ("application/json", "text/")


class UnknownEvent(ValueError):
    """An event this adapter does not know how to answer."""


class HttpApiEvent:
    """A Function URL / HTTP API 2.0 request event."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def _text(self, value: object, name: str) -> str:
        if not isinstance(value, str):
            raise UnknownEvent(f"HTTP event field {name} must be a string, got {type(value).__name__}")
        return value

    @property
    def method(self) -> str:
        return self._text(
            self.raw["requestContext"]["http"].get("method"), "requestContext.http.method"
        ).upper()

    @property
    def target(self) -> str:
        path = self._text(
            self.raw.get("rawPath") or self.raw["requestContext"]["http"].get("path") or "/", "rawPath"
        )
        query = self._text(self.raw.get("rawQueryString") or "", "rawQueryString")
        return f"{path}?{query}" if query else path

    @cached_property
    def headers(self) -> dict[str, str]:
        headers = self.raw.get("headers") or {}
        if not isinstance(headers, dict):
            raise UnknownEvent("HTTP event field headers must be an object")
        return {str(k).lower(): str(v) for k, v in headers.items()}

    @cached_property
    def body(self) -> bytes:
        body = self.raw.get("body") or ""
        if not isinstance(body, str):
            raise UnknownEvent("HTTP event 'body' must be a string")
        if self.raw.get("isBase64Encoded"):
            try:
                return base64.b64decode(body, validate=True)
            except binascii.Error:
                raise UnknownEvent("HTTP event says isBase64Encoded but 'body' is not valid base64") from None
        return body.encode()

    def to_request(self) -> Request:
        return Request(self.method, self.target, self.headers, self.body)

    def __repr__(self) -> str:
        return f"HttpApiEvent({self.method} {self.target}, {len(self.body)} body bytes)"


class TimerEvent:
    """An FC timer-trigger body: ``{"triggerTime", "triggerName", "payload"}``."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    @property
    def trigger_name(self) -> str:
        return str(self.raw.get("triggerName", ""))

    @property
    def payload(self) -> str:
        return str(self.raw.get("payload") or "")


def is_http_event(event: dict[str, Any]) -> bool:
    context = event.get("requestContext")
    return (
        event.get("version") == "2.0" and isinstance(context, dict) and isinstance(context.get("http"), dict)
    )


def is_timer_event(event: dict[str, Any]) -> bool:
    return {"triggerTime", "triggerName", "payload"} <= event.keys()


def parse_event(event: object) -> HttpApiEvent | WarmupPing:
    """What one invocation asks for; raises ``UnknownEvent`` naming what was wrong."""
    if isinstance(event, (bytes, str)):
        try:
            event = json.loads(event)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UnknownEvent(f"event is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise UnknownEvent(f"event must be a JSON object, got {type(event).__name__}")
    if WARMUP_KEY in event:
        return warmup_ping(event)
    if is_timer_event(event):
        return parse_event(TimerEvent(event).payload)
    if is_http_event(event):
        return HttpApiEvent(event)
    keys = ", ".join(sorted(map(str, event))[:8]) or "none"
    raise UnknownEvent(
        "unknown event shape (top-level keys: " + keys + "); this function takes Function URL / "
        f'HTTP API 2.0 events, FC timer events and {{"{WARMUP_KEY}": {{...}}}} warm-up pings'
    )


def warmup_ping(event: dict[str, Any]) -> WarmupPing:
    try:
        return WarmupEvent.model_validate(event).spillway_warmup
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UnknownEvent(f"bad warm-up ping at {where}: {err['msg']}") from None


def folded(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Header fields as a Function URL response carries them: one value per name, repeats joined."""
    headers: dict[str, str] = {}
    for name, value in pairs:
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def to_http_result(response: Response) -> dict[str, Any]:
    """The Function URL response shape; binary bodies go base64."""
    headers = folded(response.headers)
    content_type = headers.get("content-type", "")
    if content_type.startswith(_TEXT_TYPES) and "inference-header-content-length" not in headers:
        try:
            return {
                "statusCode": response.status,
                "headers": headers,
                "body": response.body.decode(),
                "isBase64Encoded": False,
            }
        except UnicodeDecodeError:
            pass
    return {
        "statusCode": response.status,
        "headers": headers,
        "body": base64.b64encode(response.body).decode(),
        "isBase64Encoded": True,
    }
