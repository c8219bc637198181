"""HTTP requests and answers as every part of Spillway passes them around (no I/O here)."""

from __future__ import annotations

import http
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger("spillway.function")

_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus}

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


class Body:
    """A request body kept in the pieces it arrived in, so a large one is never copied into one
    buffer on its way to Triton: the socket takes the pieces as they are (``writelines``)."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: Sequence[bytes | bytearray]) -> None:
        self.parts = parts
        self.size = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        """One buffer, for the few readers that parse the body (warm-up and FC event JSON)."""
        return b"".join(self.parts)


@dataclass(slots=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes | Body = b""

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass(slots=True)
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    # An answer made as it is sent (generate_stream's events): sent chunked, piece by piece, where
    # the platform streams (``http_stream.send``), gathered into ``body`` where it does not.
    stream: AsyncIterator[bytes] | None = None

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


_CHUNKED_CLOSE = b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"


def encode_response(response: Response, keep_alive: bool) -> bytes:
    """The status line and headers of an HTTP/1.1 answer (the body follows as it is)."""
    status = response.status
    head = _STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status
    for name, value in response.headers:
        head += f"{name}: {value}\r\n".encode("latin-1")
    if response.stream is not None:
        return head + (b"transfer-encoding: chunked\r\n\r\n" if keep_alive else _CHUNKED_CLOSE)
    head += (
        b"content-length: %d\r\n\r\n" % len(response.body)
        if keep_alive
        else (b"content-length: %d\r\nconnection: close\r\n\r\n" % len(response.body))
    )
    return head
