"""Answers made as they are sent: generate_stream's server-sent events, relayed from the sidecar
piece by piece where the platform streams (chunked), gathered whole where it does not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from functions.http_types import Response, encode_response
from functions.sidecar_client import UpstreamUnavailable

_LAST_CHUNK = b"0\r\n\r\n"


def error_event(message: str) -> bytes:
    """How Triton itself ends a stream that failed: one event carrying its error shape."""
    return b"data: " + json.dumps({"error": message}).encode() + b"\n\n"


async def events(pieces: AsyncIterator[bytes], timeout: float | None) -> AsyncIterator[bytes]:
    """The sidecar's pieces, and where it stops short, an error event rather than a stream cut
    without a word: a client reading events learns why the generation ended."""
    try:
        async for piece in pieces:
            yield piece
    except TimeoutError:
        yield error_event(
            f"generation did not finish within the {timeout or 0:.3f} s this invocation had; "
            "the rest was abandoned: ask for fewer tokens or raise the function's timeout"
        )
    except UpstreamUnavailable as exc:
        yield error_event(f"the Triton sidecar stopped mid-stream ({exc}); retry the request")
    finally:
        await close(pieces)


async def send(
    transport: asyncio.Transport | None,
    response: Response,
    framing: tuple[bool, bool],
    writable: asyncio.Event,
    stall_s: float,
) -> bool:
    """Write ``response`` once the client's socket takes more (``writable``); a streamed one
    chunked, piece by piece as it is made. ``framing``: keep the connection alive, answer a HEAD.
    False when it could not be sent whole (the client left, or stopped reading for ``stall_s``, as
    one that stops sending a body would: it does not hold a generation): the connection is over."""
    keep_alive, head_only = framing
    stream = None if head_only else response.stream
    try:
        if transport is None or not await _writable(transport, writable, stall_s):
            return False
        head = encode_response(response, keep_alive)
        if stream is None:
            transport.writelines((head,) if head_only else (head, response.body))
            return True
        transport.write(head)
        async for piece in stream:
            if piece and await _writable(transport, writable, stall_s):
                transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            elif piece:
                return False
        if transport.is_closing():
            return False
        transport.write(_LAST_CHUNK)
        return True
    finally:
        if response.stream is not None:
            await close(response.stream)


async def _writable(transport: asyncio.Transport, writable: asyncio.Event, stall_s: float) -> bool:
    if not writable.is_set():
        try:
            await asyncio.wait_for(writable.wait(), stall_s)
        except TimeoutError:
            transport.close()
            return False
    return not transport.is_closing()


class TooLong(Exception):
    """A streamed answer longer than a buffered answer may be."""


async def gather(stream: AsyncIterator[bytes], limit: int) -> bytes:
    """The whole answer, for platforms that answer an invocation at once (Lambda ``Invoke``)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for piece in stream:
            size += len(piece)
            if size > limit:
                raise TooLong(
                    f"the streamed answer exceeds the {limit} bytes a buffered invocation may "
                    "return; ask for fewer tokens, or call generate_stream over a streaming route"
                )
            parts.append(piece)
    finally:
        await close(stream)
    return b"".join(parts)


async def close(stream: AsyncIterator[bytes]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
