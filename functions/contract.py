"""The wire contract every caller of a Spillway function relies on.

The gateway and the warm-up pinger import this module, so it stays free of heavy imports.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field

HEADER_INSTANCE = "x-spillway-instance"
HEADER_COLD = "x-spillway-cold"
HEADER_SIGNATURE = "x-spillway-signature"
HEADER_TARGET = "x-spillway-target"
HEADER_DECISION = "x-spillway-decision"

WARMUP_KEY = "spillway_warmup"
WARMUP_PATH = "/spillway/warmup"
METRICS_PATH = "/spillway/metrics"

MAX_DWELL_MS = 60_000

# The warm-up report file (Prometheus text) names each warm instance in this family, with labels
# ``target`` and ``instance``; the gateway reads its warm pools from it.
WARM_INSTANCE_METRIC = "spillway_warmup_instance"
# And the estimated spend of the pings it sent, a counter per ``target`` kept across rounds (the
# family's name; its samples end in ``_total``), which the gateway shows again on its /metrics.
WARMUP_SPEND_METRIC = "spillway_warmup_spend_usd"
# Instances a target's provisioned concurrency holds allocated, per ``target``: the platform names
# none, so the gateway counts at least this many warm rather than instances by their ids.
PROVISIONED_METRIC = "spillway_warmup_provisioned_instances"

_MODEL_PATH = re.compile(r"^/v2/models/([^/]+)")


def http_api_event(method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """The HTTP API 2.0 event the gateway's invoke mode sends, the shape a Function URL delivers:
    what ``events.HttpApiEvent`` reads on the function's side. The body always goes base64."""
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


def http_api_result(raw: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of the Function URL answer ``events.to_http_result`` writes;
    raises ``ValueError`` naming what is wrong when ``raw`` is not one."""
    try:
        result: Any = json.loads(raw)
        status = int(result["statusCode"])
        headers = [(str(k), str(v)) for k, v in (result.get("headers") or {}).items()]
        body = result.get("body") or ""
        data = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"the function's answer is not a Function URL response: {exc!r}") from None
    return status, headers, data


def model_of(path: str) -> str | None:
    """The model a KServe v2 path names (``/v2/models/{name}/...``), as decided on the path decoded
    once; None for the server's own endpoints."""
    match = _MODEL_PATH.match(path)
    return match.group(1) if match else None


class WarmupPing(BaseModel):
    """Body of ``{"spillway_warmup": {...}}``: hold the instance, optionally probe the models."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dwell_ms: int = Field(default=0, ge=0, le=MAX_DWELL_MS)
    models: tuple[str, ...] = ()
    probe: bool = False


class WarmupEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    spillway_warmup: WarmupPing


class WarmupReport(BaseModel):
    """What an instance answers to a warm-up ping; the pinger counts distinct ``instance_id``s."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    cold: bool
    init_ms: float
    uptime_s: float
    triton_ready: bool
    models_ready: tuple[str, ...]


def warmup_payload(dwell_ms: int = 0, models: tuple[str, ...] = (), probe: bool = False) -> str:
    """The exact JSON a scheduler (EventBridge, FC timer, cron) sends to warm an instance."""
    ping = WarmupPing(dwell_ms=dwell_ms, models=models, probe=probe)
    return WarmupEvent(spillway_warmup=ping).model_dump_json()


_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_SHOWN = 120


class PathError(ValueError):
    """A request path two layers could read differently: refused (400) wherever it is read."""


def request_path(raw: str) -> str:
    """The path a raw request target names, read as nginx reads it into ``$uri`` (what APISIX
    matches routes on): percent-escapes decoded once, then ``normal_path``.

    Raises ``PathError`` when an escape is left after that one decoding (``%2574`` reads ``%74``):
    a layer that decoded again would serve a path no route, rule or residency check saw.
    """
    decoded = unquote(raw, errors="replace") if "%" in raw else raw
    _refuse_escapes(decoded, raw)
    return resolved_path(decoded)


def gateway_path(path: str) -> str:
    """The path a gateway decides on, from one nginx already decoded (``$uri``): ``path`` without
    its trailing slash.

    Raises ``PathError`` when ``path`` holds an escape (it was encoded more than once) or is not in
    normal form (repeated slashes, dot segments): APISIX chose the route on it as it is, so
    resolving it here could decide on a path that route was never meant for.
    """
    _refuse_escapes(path, path)
    resolved = resolved_path(path)
    if resolved != path and resolved + "/" != path:
        raise PathError(
            f"request path {_shown(path)} is not in normal form (repeated slashes or dot segments); "
            f"send {_shown(resolved)}"
        )
    return resolved


def _refuse_escapes(decoded: str, raw: str) -> None:
    if "%" in decoded and _ESCAPE.search(decoded):
        raise PathError(
            f"request path {_shown(raw)} is percent-encoded more than once; encode each byte once "
            "(a '%' itself is %25, and must not be followed by two hex digits once decoded)"
        )


def resolved_path(path: str) -> str:
    """Repeated slashes merged and dot segments removed (RFC 3986, 5.2.4); no trailing slash.
    Decodes nothing."""
    if path[:1] == "/" and not ("//" in path or "/." in path or (path[-1] == "/" and path != "/")):
        return path
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)


def _shown(path: str) -> str:
    return repr(path if len(path) <= _SHOWN else path[:_SHOWN] + "...")
