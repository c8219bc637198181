"""Requests passed on to the Triton sidecar and its answers passed back, byte for byte: what a
client may send (headers, target size), how Triton's errors read to the client, and a streamed
generation's events relayed as the model makes them."""

from __future__ import annotations

from typing import Protocol

from functions import http_stream
from functions.http_types import Body, Request, Response, error_response
from functions.sidecar import Sidecar, SidecarState
from functions.sidecar_client import Headers, UpstreamResponse, UpstreamStream, UpstreamUnavailable

RETRY_AFTER_S = "1"
_FORWARD_REQUEST_HEADERS = (
    "content-type",
    "inference-header-content-length",
    "accept-encoding",
    "content-encoding",
)
_FORWARD_RESPONSE_HEADERS = frozenset(
    (b"content-type", b"inference-header-content-length", b"content-encoding")
)
_CLIENT_ERROR_PREFIXES = (b'{"error":"failed to parse', b'{"error":"Unable to parse')
# Triton's generate extension: a generation answered whole, and one streamed as server-sent events.
_STREAMED = "/generate_stream"
GENERATE_PATHS = ("/generate", _STREAMED)
# Triton's Python backend, when the stub process of a model instance has died.
_BROKEN_BACKEND = b"is not healthy"
# The longest request target, and header value, passed on to Triton. Triton 2.51's HTTP server
# closes the connection unanswered past a target of 8,189 bytes (resets it from about 16 KB), and
# it dropped some forwarded requests from about 7,950 bytes: its reads are 4,096 bytes and a
# request line cut between them is not always parsed. Half its limit keeps well clear of that.
MAX_FORWARDED_BYTES = 4096


class Upstream(Protocol):
    """How requests reach the sidecar (``UpstreamPool`` in production, a handler in tests)."""

    async def request(
        self, method: str, target: str, headers: Headers, body: bytes | Body, timeout: float | None
    ) -> UpstreamResponse: ...

    async def stream(
        self, method: str, target: str, headers: Headers, body: bytes | Body, timeout: float | None
    ) -> UpstreamStream: ...

    def close(self) -> None: ...


class Forwarder:
    def __init__(self, pool: Upstream, sidecar: Sidecar, max_body: int) -> None:
        self.pool = pool
        self.sidecar = sidecar
        # The longest answer gathered whole from a stream that ends in an error status.
        self.max_body = max_body

    async def forward(self, request: Request, path: str, timeout: float | None) -> Response:
        """Triton's answer to ``request`` (its normalised ``path`` checked), or why there is none."""
        headers = [
            (name.encode(), request.headers[name].encode("latin-1"))
            for name in _FORWARD_REQUEST_HEADERS
            if name in request.headers
        ]
        query = request.target.partition("?")[2]
        target = f"{path}?{query}" if query else path
        refusal = _too_long_for_triton(target, headers)
        if refusal is not None:
            return refusal
        if self.sidecar.state is not SidecarState.READY:
            return sidecar_unavailable(self.sidecar.state)
        streamed = path.endswith(_STREAMED)
        try:
            if streamed:
                stream = await self.pool.stream(request.method, target, headers, request.body, timeout)
                if stream.status == 200:
                    pieces = http_stream.events(stream.pieces, timeout)
                    return Response(200, _kept(stream.headers), stream=pieces)
                body = await http_stream.gather(stream.pieces, self.max_body)
                upstream = UpstreamResponse(stream.status, stream.headers, body)
            else:
                upstream = await self.pool.request(request.method, target, headers, request.body, timeout)
        except TimeoutError:
            return error_response(
                504,
                f"inference did not finish within the {timeout:.3f} s this "
                "invocation had left; the request was abandoned",
            )
        except UpstreamUnavailable as exc:
            return sidecar_unavailable(self.sidecar.state, str(exc))
        except http_stream.TooLong as exc:
            return error_response(502, str(exc))
        status = upstream.status
        if status == 500 and upstream.body.startswith(_CLIENT_ERROR_PREFIXES):
            status = 400
        elif status == 500 and _BROKEN_BACKEND in upstream.body:
            self.sidecar.report_broken(upstream.body.decode("utf-8", "replace")[:300])
            return sidecar_unavailable(self.sidecar.state, "a model backend died; restarting it")
        return Response(status, _kept(upstream.headers), upstream.body)


def _kept(headers: Headers) -> list[tuple[str, str]]:
    return [(k.decode(), v.decode("latin-1")) for k, v in headers if k in _FORWARD_RESPONSE_HEADERS]


def _too_long_for_triton(target: str, headers: Headers) -> Response | None:
    """Refused before Triton sees it: Triton would drop the connection, which reads as a sidecar
    that is down (503, retry) when no retry can help."""
    size = len(target.encode())
    if size > MAX_FORWARDED_BYTES:
        return error_response(
            414,
            f"request target (path and query) of {size} bytes is longer than the {MAX_FORWARDED_BYTES} "
            "bytes this function passes on to Triton; shorten the query or send its data in the body",
        )
    for name, value in headers:
        if len(value) > MAX_FORWARDED_BYTES:
            return error_response(
                431,
                f"header {name.decode()} of {len(value)} bytes is longer than the {MAX_FORWARDED_BYTES} "
                "bytes this function passes on to Triton; shorten it",
            )
    return None


def sidecar_unavailable(state: SidecarState, detail: str = "") -> Response:
    message = f"the Triton sidecar is {state.value}; retry shortly"
    return error_response(
        503, f"{message} ({detail})" if detail else message, [("retry-after", RETRY_AFTER_S)]
    )
