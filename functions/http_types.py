"""HTTP requests and answers as every part of Spillway passes them around (no I/O here)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger("spillway.function")

# Headers that describe one connection, not the request: never forwarded by a proxy.
HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "expect",
        "te",
        "upgrade",
        "proxy-connection",
    )
)


@dataclass(slots=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes = b""

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass(slots=True)
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


def json_response(status: int, payload: object, headers: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(status, [("content-type", "application/json"), *(headers or [])], body)


def error_response(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> Response:
    """Triton's own error shape, so clients see one kind of error whoever answered."""
    return json_response(status, {"error": message}, headers)


def body_too_large(limit: int) -> Response:
    return error_response(
        413,
        f"request body larger than this function's limit of {limit} bytes; "
        "send smaller batches or raise SPILLWAY_MAX_BODY_BYTES",
    )


def internal_error(what: str) -> Response:
    """Logged with its traceback under an id the client gets; the client learns nothing else."""
    error_id = uuid.uuid4().hex[:12]
    log.exception("internal error %s while answering %s", error_id, what)
    return error_response(500, f"internal error (id {error_id}); retry, or report the id to the operator")
