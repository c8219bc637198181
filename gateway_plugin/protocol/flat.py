"""A small, fast FlatBuffers reader and writer for the runner's hot path.

The generic ``flatbuffers`` package spends tens of microseconds per message in Python; these
read and write the same bytes with ``struct`` (the tests check them against the generated
``a6pluginprotos`` readers in the tests). The writer lays tables out front to back, children after parents,
so every unsigned offset points forward as the format requires.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_U8 = struct.Struct("<B").unpack_from
_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_PACK_U32 = struct.Struct("<I").pack_into

Entries = Sequence[tuple[str, str | None]]


class Malformed(ValueError):
    pass


class Table:
    """One table in a buffer; ``slot`` numbers follow the schema's field order."""

    __slots__ = ("_buf", "_pos", "_vlen", "_vt")

    def __init__(self, buf: bytes, pos: int) -> None:
        vt = pos - _I32(buf, pos)[0] if pos >= 0 else -1
        if vt < 0 or vt + 4 > len(buf):
            raise Malformed(f"table at {pos} has no vtable inside the buffer")
        self._buf, self._pos, self._vt = buf, pos, vt
        self._vlen = _U16(buf, vt)[0]

    @classmethod
    def root(cls, buf: bytes) -> Table:
        if len(buf) < 8:
            raise Malformed(f"message of {len(buf)} bytes is too short to be a FlatBuffers table")
        return cls(buf, _U32(buf, 0)[0])

    def field_at(self, slot: int) -> int:
        """Where a field's value sits in the buffer (0 when absent)."""
        return self._field(slot)

    def _field(self, slot: int) -> int:
        at = 4 + 2 * slot
        if at >= self._vlen:
            return 0
        off: int = _U16(self._buf, self._vt + at)[0]
        return self._pos + off if off else 0

    def u8(self, slot: int) -> int:
        at = self._field(slot)
        return _U8(self._buf, at)[0] if at else 0

    def u16(self, slot: int) -> int:
        at = self._field(slot)
        return _U16(self._buf, at)[0] if at else 0

    def u32(self, slot: int) -> int:
        at = self._field(slot)
        return _U32(self._buf, at)[0] if at else 0

    def _ref(self, slot: int) -> int:
        at = self._field(slot)
        return at + _U32(self._buf, at)[0] if at else 0

    def table(self, slot: int) -> Table | None:
        at = self._ref(slot)
        return Table(self._buf, at) if at else None

    def blob(self, slot: int) -> bytes | None:
        """A string or a ``[ubyte]`` vector, as bytes."""
        at = self._ref(slot)
        if not at:
            return None
        length = _U32(self._buf, at)[0]
        end = at + 4 + length
        if end > len(self._buf):
            raise Malformed(f"vector at {at} runs past the end of the buffer")
        return self._buf[at + 4 : end]

    def text(self, slot: int) -> str | None:
        raw = self.blob(slot)
        return None if raw is None else raw.decode("utf-8", "surrogateescape")

    def entries(self, slot: int) -> list[tuple[str, str | None]]:
        """A ``[TextEntry]`` vector: (name, value) pairs; a missing value stays ``None``."""
        at = self._ref(slot)
        if not at:
            return []
        buf, out = self._buf, []
        for item in vector(buf, at):
            pos = item + _U32(buf, item)[0]
            name_off, value_off = entry_fields(buf, pos)
            out.append((_string(buf, pos, name_off) or "", _string(buf, pos, value_off)))
        return out

    def ref(self, slot: int) -> int:
        """Where the table, string or vector a reference field points to sits (0 when absent)."""
        return self._ref(slot)

    @property
    def buffer(self) -> bytes:
        return self._buf


_VTABLE_2 = struct.Struct("<HHHH").unpack_from


def entry_fields(buf: bytes, pos: int) -> tuple[int, int]:
    """A TextEntry's field offsets (name, value) from its vtable, 0 where absent."""
    vt = pos - _I32(buf, pos)[0]
    if vt < 0:
        raise Malformed(f"table at {pos} has no vtable inside the buffer")
    if vt + 8 > len(buf):
        vlen = _U16(buf, vt)[0]
        return (_U16(buf, vt + 4)[0] if vlen > 4 else 0), 0
    vlen, _, name, value = _VTABLE_2(buf, vt)
    return (name if vlen > 4 else 0), (value if vlen > 6 else 0)


def vector(buf: bytes, at: int) -> range:
    count = _U32(buf, at)[0]
    if at + 4 + 4 * count > len(buf):
        raise Malformed(f"vector at {at} runs past the end of the buffer")
    return range(at + 4, at + 4 + 4 * count, 4)


def _raw_string(buf: bytes, field_at: int) -> bytes:
    """The string a reference field at ``field_at`` points to."""
    at = field_at + _U32(buf, field_at)[0]
    end = at + 4 + _U32(buf, at)[0]
    if end > len(buf) or at < 0:
        raise Malformed(f"string at {at} runs past the end of the buffer")
    return buf[at + 4 : end]


def _string(buf: bytes, table: int, field: int) -> str | None:
    return _raw_string(buf, table + field).decode("utf-8", "surrogateescape") if field else None


_SIZES = {"B": 1, "H": 2, "I": 4, "R": 4}
_FORMATS = {"B": "<B", "H": "<H", "I": "<I"}


class _Shape:
    """The vtable and field offsets of one table layout, computed once per layout."""

    __slots__ = ("empty", "offsets", "vtable")

    def __init__(self, fields: tuple[tuple[int, str], ...]) -> None:
        slots = max((slot for slot, _ in fields), default=-1) + 1
        by_slot = [0] * slots
        at = 4
        for index in sorted(range(len(fields)), key=lambda i: -_SIZES[fields[i][1]]):
            by_slot[fields[index][0]] = at
            at += _SIZES[fields[index][1]]
        size = at + (-at % 4)
        self.offsets = tuple(by_slot[slot] for slot, _ in fields)
        self.vtable = struct.pack(f"<HH{slots}H", 4 + 2 * slots, size, *by_slot)
        self.empty = bytes(size)


_SHAPES: dict[tuple[tuple[int, str], ...], _Shape] = {}


def _shape(fields: tuple[tuple[int, str], ...]) -> _Shape:
    shape = _SHAPES.get(fields)
    if shape is None:
        shape = _SHAPES[fields] = _Shape(fields)
    return shape


# vtable (size, table size, field offsets) then the table's soffset back to it, fields zeroed.
_ENTRY_NAME_ONLY = struct.pack("<HHHHi", 6, 8, 4, 0, 8) + bytes(4)
_ENTRY_NAME_VALUE = struct.pack("<HHHHi", 8, 12, 4, 8, 8) + bytes(8)


def _string_after(buf: bytearray, field_at: int, data: bytes) -> None:
    """Append a 4-aligned string and point ``field_at`` at it."""
    buf.extend(bytes(-len(buf) % 4))
    _PACK_U32(buf, field_at, len(buf) - field_at)
    buf += len(data).to_bytes(4, "little")
    buf += data
    buf += b"\0"


class Writer:
    """Builds one message; ``table`` returns where each reference field must be patched."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray(4)

    def _pad(self, align: int) -> None:
        self.buf.extend(bytes(-len(self.buf) % align))

    def table(self, fields: Sequence[tuple[int, str, int]], root: bool = False) -> tuple[int, dict[int, int]]:
        """Write a table of ``(slot, kind, value)`` fields; kind "R" is a reference patched later."""
        shape = _shape(tuple((slot, kind) for slot, kind, _ in fields))
        buf = self.buf
        buf.extend(bytes(len(buf) % 2))
        vtable = len(buf)
        buf += shape.vtable
        buf.extend(bytes(-len(buf) % 4))
        start = len(buf)
        buf += shape.empty
        struct.pack_into("<i", buf, start, start - vtable)
        refs = {}
        for (slot, kind, value), at in zip(fields, shape.offsets, strict=True):
            if kind == "R":
                refs[slot] = start + at
            else:
                struct.pack_into(_FORMATS[kind], buf, start + at, value)
        if root:
            _PACK_U32(buf, 0, start)
        return start, refs

    def point(self, field_at: int, target: int) -> None:
        _PACK_U32(self.buf, field_at, target - field_at)

    def blob(self, field_at: int, data: bytes) -> None:
        """A string or ``[ubyte]`` after everything written so far, referenced from ``field_at``."""
        self._pad(4)
        self.point(field_at, len(self.buf))
        self.buf += len(data).to_bytes(4, "little")
        self.buf += data
        self.buf += b"\0"

    def entries(self, field_at: int, entries: Entries, starts: list[int] | None = None) -> None:
        """A ``[TextEntry]`` vector; an entry whose value is ``None`` carries no value field.
        ``starts`` gets where each entry's value bytes begin (-1 for none): a template's values
        are written over there.

        Entries are laid out by hand (vtable, table, strings): they are most of what the
        runner writes, and the generic ``table`` costs several times more.
        """
        buf = self.buf
        buf.extend(bytes(-len(buf) % 4))
        self.point(field_at, len(buf))
        buf += len(entries).to_bytes(4, "little")
        slot = len(buf)
        buf.extend(bytes(4 * len(entries)))
        for name, value in entries:
            table = len(buf) + 8
            _PACK_U32(buf, slot, table - slot)
            slot += 4
            raw_name = name.encode("utf-8", "surrogateescape")
            if value is None:
                buf += _ENTRY_NAME_ONLY
                _string_after(buf, table + 4, raw_name)
                if starts is not None:
                    starts.append(-1)
            else:
                buf += _ENTRY_NAME_VALUE
                _string_after(buf, table + 4, raw_name)
                raw_value = value.encode("utf-8", "surrogateescape")
                _string_after(buf, table + 8, raw_value)
                if starts is not None:
                    starts.append(len(buf) - 1 - len(raw_value))

    def output(self) -> bytes:
        return bytes(self.buf)
