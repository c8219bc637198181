"""The rest of a request body framed by ``Content-Length``, read from the socket into its own
buffers (``asyncio.BufferedProtocol``), so that no body byte is copied in user space.

Each buffer is no larger than what the client has already sent (and at least ``FIRST_PART``), so
memory follows the bytes received, not the length a client claims; reads stop at the body's end,
so whatever follows it stays in the socket for the parser.
"""

from __future__ import annotations

FIRST_PART = 64 * 1024


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
