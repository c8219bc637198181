"""The size of a request head, counted from its first byte however the socket's reads cut it.

A read may end inside a head, hold several heads, or hold the end of one request and the start
of the next; the parser reports no offsets. So the connection feeds the parser in pieces that end
where a head ends (its blank line) and counts every piece fed while a head is unfinished. Heads
end at the first ``CRLF CRLF`` (the parser is strict: no bare ``LF``), and empty lines between
requests begin nothing, so they are not counted. The trailer section after a chunked body is
counted the same way, from the byte after the last chunk's size line to its blank line.
"""

from __future__ import annotations

import re

_BLANK_LINE = re.compile(rb"\r\n\r\n")
_EMPTY_LINES = re.compile(rb"[\r\n]*")
_CR_LF = b"\r\n"


def _end_of_last_blank_line(data: bytes | memoryview) -> int:
    found = bytes(data).rfind(b"\r\n\r\n")
    return found + 4 if found >= 0 else 0


class HeadMeter:
    """The bytes the head in progress has taken, against ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0
        self._tail = b""

    def next_piece(self, data: bytes | memoryview, in_head: bool) -> int:
        """How much of ``data`` (read between requests or inside a head) to feed next: the empty
        lines before a request alone, else up to the end of the head and at most the room left."""
        if not in_head:
            self.taken, self._tail = 0, b""
            if data[0] in _CR_LF:
                empty = _EMPTY_LINES.match(data)
                return empty.end() if empty is not None else 1
        elif (straddling := (self._tail + bytes(data[:3])).find(b"\r\n\r\n")) >= 0:
            return straddling + 4 - len(self._tail)
        room = self.limit - self.taken
        end = _BLANK_LINE.search(data, 0, room)
        return end.end() if end is not None else room

    def begin_trailers(self) -> None:
        """The last chunk's size line has just been fed: it ends in the CRLF a blank line may follow."""
        self.taken, self._tail = 0, _CR_LF

    def took(self, piece: bytes | memoryview, began: bool) -> bool:
        """Count a piece after which a head is unfinished; False once it has taken the limit.

        A head that began inside the piece follows a chunked body, which ends in a blank line
        (heads and bodies framed by Content-Length each end a piece of their own).
        """
        if began:
            self.taken, self._tail = len(piece) - _end_of_last_blank_line(piece), b""
        else:
            self.taken += len(piece)
        self._tail = (self._tail + bytes(piece[-3:]))[-3:]
        return self.taken < self.limit
