"""A request's headers as the runner reads them: the ``[TextEntry]`` vector of an ext-plugin
call, read once per call."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

from gateway_plugin.protocol.flat import Malformed, Table, entry_fields, vector

_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_VTABLE = struct.Struct("<HHHH").unpack_from
# Spillway's own header names begin so (request.header_names.OWN_PREFIX, as bytes).
OWN_PREFIX = b"x-spillway-"


class EntryMap(Mapping[str, str]):
    """A ``[TextEntry]`` vector as a mapping of header names read one way: lower-cased, ``_`` read
    as ``-`` (nginx's ``$http_*`` variables take either), every value of every spelling joined with
    ", " (spellings in sorted order, values in the order they came).

    The vector is read and checked at once, but no text is decoded until asked for: a filter
    usually wants three or four of a request's headers. ``regular``: every name came once, in one
    spelling, and none is Spillway's own (``OWN_PREFIX``): nothing to settle, the usual request.
    """

    __slots__ = ("_spellings", "_values", "regular")

    def __init__(self, buf: bytes, at: int) -> None:
        values: dict[bytes, list[bytes]] = {}
        self._values = values
        self._spellings: dict[bytes, list[bytes]] = {}
        self.regular = True
        if not at:
            return
        underscores = irregular = False
        # One loop with everything inlined: it runs for every header of every call.
        u32, i32, vtable, size = _U32, _I32, _VTABLE, len(buf)
        for item in vector(buf, at):
            pos = item + u32(buf, item)[0]
            vt = pos - i32(buf, pos)[0]
            if vt >= 0 and vt + 8 <= size:
                vlen, _, name_off, value_off = vtable(buf, vt)
                if vlen <= 6:
                    name_off, value_off = entry_fields(buf, pos)
            else:
                name_off, value_off = entry_fields(buf, pos)
            if not value_off:
                continue
            ref = pos + value_off
            start = ref + u32(buf, ref)[0]
            end = start + 4 + u32(buf, start)[0]
            if end > size:
                raise Malformed(f"string at {start} runs past the end of the buffer")
            value = buf[start + 4 : end]
            name = b""
            if name_off:
                ref = pos + name_off
                start = ref + u32(buf, ref)[0]
                end = start + 4 + u32(buf, start)[0]
                if end > size:
                    raise Malformed(f"string at {start} runs past the end of the buffer")
                name = buf[start + 4 : end]
                name = name.lower() if name.isascii() else _lower(name)
                if b"_" in name:
                    underscores = True
                elif name[:11] == OWN_PREFIX:
                    irregular = True
            found = values.get(name)
            if found is None:
                values[name] = [value]
            else:
                found.append(value)
                irregular = True
        if underscores:
            self._fold()
        self.regular = not (underscores or irregular)

    def _fold(self) -> None:
        """Merge the spellings that differ only in ``_`` and ``-`` (rare: only then is this paid)."""
        folded: dict[bytes, list[bytes]] = {}
        for name in sorted(self._values):
            key = name.replace(b"_", b"-")
            folded.setdefault(key, []).extend(self._values[name])
            self._spellings.setdefault(key, []).append(name)
        self._values = folded
        self._spellings = {k: v for k, v in self._spellings.items() if v != [k]}

    def spellings(self, key: str) -> list[str]:
        """The names (lower-cased) under which ``key``'s values came, when any differs from ``key``."""
        found = self._spellings.get(key.encode("utf-8", "surrogateescape"))
        return [name.decode("utf-8", "surrogateescape") for name in found] if found else []

    def count(self, key: str) -> int:
        """How many values ``key`` has, over all its spellings."""
        return len(self._values.get(key.encode("utf-8", "surrogateescape"), ()))

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        found = self._values.get(key.encode("utf-8", "surrogateescape"))
        return default if found is None else _joined(found)

    def __getitem__(self, key: str) -> str:
        found = self._values.get(key.encode("utf-8", "surrogateescape"))
        if found is None:
            raise KeyError(key)
        return _joined(found)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.encode("utf-8", "surrogateescape") in self._values

    def __iter__(self) -> Iterator[str]:
        return (name.decode("utf-8", "surrogateescape") for name in self._values)

    def __len__(self) -> int:
        return len(self._values)


def _lower(name: bytes) -> bytes:
    if name.isascii():
        return name.lower()
    return name.decode("utf-8", "surrogateescape").lower().encode("utf-8", "surrogateescape")


def _joined(values: list[bytes]) -> str:
    if len(values) == 1:
        return values[0].decode("utf-8", "surrogateescape")
    return ", ".join(v.decode("utf-8", "surrogateescape") for v in values)


def entry_map(table: Table, slot: int) -> EntryMap:
    """The ``[TextEntry]`` vector in ``table``'s field ``slot`` as a read-only mapping."""
    return EntryMap(table.buffer, table.ref(slot))
