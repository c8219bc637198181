"""Encoders for every message of the protocol, both directions, with the FlatBuffers builder.

Slots follow ``ext-plugin.fbs`` field order; a TextEntry with no value means "delete".
"""

from __future__ import annotations

from collections.abc import Sequence

import flatbuffers

from gateway_plugin.protocol.messages import (
    ACTION_REWRITE,
    ACTION_STOP,
    INFO_REQ_BODY,
    INFO_RESP_BODY,
    INFO_VAR,
)

Entries = Sequence[tuple[str, str | None]]


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _entries(b: flatbuffers.Builder, entries: Entries) -> int:
    offsets = []
    for name, value in entries:
        n = b.CreateString(_utf8(name))
        v = b.CreateString(_utf8(value)) if value is not None else 0
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(0, n, 0)
        if value is not None:
            b.PrependUOffsetTRelativeSlot(1, v, 0)
        offsets.append(b.EndObject())
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return int(b.EndVector())


def _finish(b: flatbuffers.Builder, root: int) -> bytes:
    b.Finish(root)
    return bytes(b.Output())


# Runner → APISIX


def prepare_conf_answer(token: int) -> bytes:
    b = flatbuffers.Builder(32)
    b.StartObject(1)
    b.PrependUint32Slot(0, token, 0)
    return _finish(b, b.EndObject())


def error(code: int) -> bytes:
    b = flatbuffers.Builder(16)
    b.StartObject(1)
    b.PrependUint8Slot(0, code, 0)
    return _finish(b, b.EndObject())


def no_change(req_id: int) -> bytes:
    b = flatbuffers.Builder(32)
    b.StartObject(2)
    b.PrependUint32Slot(0, req_id, 0)
    return _finish(b, b.EndObject())


def stop(req_id: int, status: int, headers: Entries, body: bytes | None) -> bytes:
    b = flatbuffers.Builder(64 + (len(body) if body else 0))
    hdrs = _entries(b, headers) if headers else 0
    data = b.CreateByteVector(body) if body else 0
    b.StartObject(3)
    b.PrependUint16Slot(0, status, 0)
    if hdrs:
        b.PrependUOffsetTRelativeSlot(1, hdrs, 0)
    if data:
        b.PrependUOffsetTRelativeSlot(2, data, 0)
    return _action(b, req_id, ACTION_STOP, b.EndObject())


def rewrite(
    req_id: int,
    path: str | None = None,
    headers: Entries = (),
    args: Entries = (),
    resp_headers: Entries = (),
    body: bytes | None = None,
) -> bytes:
    b = flatbuffers.Builder(128 + (len(body) if body else 0))
    slots = (
        b.CreateString(_utf8(path)) if path is not None else 0,
        _entries(b, headers) if headers else 0,
        _entries(b, args) if args else 0,
        _entries(b, resp_headers) if resp_headers else 0,
        b.CreateByteVector(body) if body is not None else 0,
    )
    b.StartObject(5)
    for slot, off in enumerate(slots):
        if off:
            b.PrependUOffsetTRelativeSlot(slot, off, 0)
    return _action(b, req_id, ACTION_REWRITE, b.EndObject())


def _action(b: flatbuffers.Builder, req_id: int, kind: int, action: int) -> bytes:
    b.StartObject(3)
    b.PrependUint32Slot(0, req_id, 0)
    b.PrependUint8Slot(1, kind, 0)
    b.PrependUOffsetTRelativeSlot(2, action, 0)
    return _finish(b, b.EndObject())


def resp_call_answer(req_id: int, status: int, headers: Entries, body: bytes | None) -> bytes:
    """Status 0 and no headers or body mean "leave the response as it is"."""
    b = flatbuffers.Builder(64 + (len(body) if body else 0))
    hdrs = _entries(b, headers) if headers else 0
    data = b.CreateByteVector(body) if body is not None else 0
    b.StartObject(4)
    b.PrependUint32Slot(0, req_id, 0)
    b.PrependUint16Slot(1, status, 0)
    if hdrs:
        b.PrependUOffsetTRelativeSlot(2, hdrs, 0)
    if data:
        b.PrependUOffsetTRelativeSlot(3, data, 0)
    return _finish(b, b.EndObject())


def ask_var(name: str) -> bytes:
    b = flatbuffers.Builder(32 + len(name))
    n = b.CreateString(_utf8(name))
    b.StartObject(1)
    b.PrependUOffsetTRelativeSlot(0, n, 0)
    return _ask(b, INFO_VAR, b.EndObject())


def ask_req_body() -> bytes:
    b = flatbuffers.Builder(32)
    b.StartObject(0)
    return _ask(b, INFO_REQ_BODY, b.EndObject())


def ask_resp_body() -> bytes:
    b = flatbuffers.Builder(32)
    b.StartObject(0)
    return _ask(b, INFO_RESP_BODY, b.EndObject())


def _ask(b: flatbuffers.Builder, kind: int, info: int) -> bytes:
    b.StartObject(2)
    b.PrependUint8Slot(0, kind, 0)
    b.PrependUOffsetTRelativeSlot(1, info, 0)
    return _finish(b, b.EndObject())


# APISIX → runner (what the APISIX-side peer sends)


def prepare_conf(key: str, entries: Entries) -> bytes:
    b = flatbuffers.Builder(256)
    conf = _entries(b, entries)
    k = b.CreateString(_utf8(key))
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, conf, 0)
    b.PrependUOffsetTRelativeSlot(1, k, 0)
    return _finish(b, b.EndObject())


def req_call(
    req_id: int, token: int, method: int, path: str, args: Entries, headers: Entries, src_ip: bytes
) -> bytes:
    b = flatbuffers.Builder(512)
    ip = b.CreateByteVector(src_ip)
    p = b.CreateString(_utf8(path))
    a = _entries(b, args)
    h = _entries(b, headers)
    b.StartObject(7)
    b.PrependUint32Slot(0, req_id, 0)
    b.PrependUOffsetTRelativeSlot(1, ip, 0)
    b.PrependUint8Slot(2, method, 0)
    b.PrependUOffsetTRelativeSlot(3, p, 0)
    b.PrependUOffsetTRelativeSlot(4, a, 0)
    b.PrependUOffsetTRelativeSlot(5, h, 0)
    b.PrependUint32Slot(6, token, 0)
    return _finish(b, b.EndObject())


def resp_call(req_id: int, token: int, status: int, headers: Entries) -> bytes:
    b = flatbuffers.Builder(256)
    h = _entries(b, headers)
    b.StartObject(4)
    b.PrependUint32Slot(0, req_id, 0)
    b.PrependUint16Slot(1, status, 0)
    b.PrependUOffsetTRelativeSlot(2, h, 0)
    b.PrependUint32Slot(3, token, 0)
    return _finish(b, b.EndObject())


def extra_info_answer(result: bytes | None) -> bytes:
    b = flatbuffers.Builder(32 + (len(result) if result else 0))
    data = b.CreateByteVector(result) if result is not None else 0
    b.StartObject(1)
    if result is not None:
        b.PrependUOffsetTRelativeSlot(0, data, 0)
    return _finish(b, b.EndObject())
