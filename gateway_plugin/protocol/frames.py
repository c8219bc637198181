"""Framing: one type byte, a 3-byte big-endian length, then a FlatBuffers payload."""

from __future__ import annotations

import enum

MAX_PAYLOAD = (1 << 24) - 1


class FrameType(enum.IntEnum):
    RPC_ERROR = 0
    PREPARE_CONF = 1
    HTTP_REQ_CALL = 2
    EXTRA_INFO = 3
    HTTP_RESP_CALL = 4


class ErrCode(enum.IntEnum):
    BAD_REQUEST = 0
    SERVICE_UNAVAILABLE = 1
    CONF_TOKEN_NOT_FOUND = 2


class FrameTooLarge(ValueError):
    pass


def frame(ty: int, payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise FrameTooLarge(f"payload of {len(payload)} bytes exceeds the protocol's {MAX_PAYLOAD}")
    return ((ty << 24) | len(payload)).to_bytes(4, "big") + payload


class FrameReader:
    """Reassembles frames from arbitrary chunks (partial reads, several frames per chunk)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        if not buf and len(data) >= 4 and int.from_bytes(data[1:4], "big") == len(data) - 4:
            return [(data[0], data[4:])]
        buf += data
        frames = []
        start = 0
        end = len(buf)
        while end - start >= 4:
            length = int.from_bytes(buf[start + 1 : start + 4], "big")
            if end - start - 4 < length:
                break
            frames.append((buf[start], bytes(buf[start + 4 : start + 4 + length])))
            start += 4 + length
        if start:
            del buf[:start]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)
