"""The rest of a request body framed by ``Content-Length``, read from the socket into its own
buffers (``asyncio.BufferedProtocol``), so that no body byte is copied in user space; and where a
chunked body's trailer section begins.

Each buffer is no larger than what the client has already sent (and at least ``FIRST_PART``), so
memory follows the bytes received, not the length a client claims; reads stop at the body's end,
so whatever follows it stays in the socket for the parser.
"""

from __future__ import annotations

import re

FIRST_PART = 64 * 1024
_HEX = re.compile(rb"[0-9A-Fa-f]*")
# Enough of a size line to read any size the parser accepts (16 hex digits; more overflow it).
_SIZE_PREFIX = 20


class BodyReader:
    __slots__ = ("_filled", "_part", "parts", "received", "total")

    def __init__(self, parts: list[bytes | bytearray], received: int, total: int) -> None:
        """``parts``: what the parser already delivered (``received`` bytes of ``total``)."""
        self.parts = parts
        self.received = received
        self.total = total
        self._part: bytearray | None = None
        self._filled = 0

    def buffer(self) -> memoryview:
        """Where the next read goes."""
        if self._part is None:
            self._part = bytearray(min(self.total - self.received, max(FIRST_PART, self.received)))
            self._filled = 0
        return memoryview(self._part)[self._filled :]

    def read(self, nbytes: int) -> bool:
        """``nbytes`` landed in the last buffer; True once the body is complete."""
        part = self._part
        if part is None:
            return False
        self._filled += nbytes
        self.received += nbytes
        if self._filled == len(part):
            self.parts.append(part)
            self._part = None
        return self.received >= self.total


class ChunkFraming:
    """Follows a chunked body's framing (size lines, data and the CRLF after it) to the byte where
    its trailer section begins. The parser buffers each trailer field whole before reporting it and
    reports no offsets, so without this a trailer could grow until the body timeout. Input the
    parser refuses may be followed wrongly here: that request is refused (400) either way."""

    __slots__ = ("_left", "_size")

    def __init__(self) -> None:
        self._left = 0  # data and CRLF still due in the current chunk
        self._size = b""  # the start of the size line being read

    def trailers_at(self, data: bytes | memoryview) -> int | None:
        """How far into ``data`` (the next bytes of the body) the trailer section begins, if it
        does: just after the last chunk's size line."""
        raw, at = bytes(data), 0
        while at < len(raw):
            if self._left:
                step = min(self._left, len(raw) - at)
                self._left -= step
                at += step
                continue
            newline = raw.find(b"\n", at)
            if len(self._size) < _SIZE_PREFIX:
                self._size += raw[at : len(raw) if newline < 0 else newline][:_SIZE_PREFIX]
            if newline < 0:
                return None
            at = newline + 1
            digits = _HEX.match(self._size)
            size = int(digits.group() or b"0", 16) if digits is not None else 0
            if size == 0:
                return at
            self._left, self._size = size + 2, b""
        return None
