"""Encoders for every message of the protocol, both directions.

Slots follow ``ext-plugin.fbs`` field order; a TextEntry with no value means "delete".
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

from gateway_plugin.protocol.flat import Entries, Table, Writer
from gateway_plugin.protocol.messages import (
    ACTION_REWRITE,
    ACTION_STOP,
    INFO_REQ_BODY,
    INFO_RESP_BODY,
    INFO_VAR,
)

Field = tuple[int, str, int]


def _scalar_table(fields: Sequence[Field]) -> bytes:
    w = Writer()
    w.table([f for f in fields if f[2]], root=True)
    return w.output()


# Runner → APISIX


def prepare_conf_answer(token: int) -> bytes:
    return _scalar_table([(0, "I", token)])


def error(code: int) -> bytes:
    return _scalar_table([(0, "B", code)])


def no_change(req_id: int) -> bytes:
    return _scalar_table([(0, "I", req_id)])


def _action(w: Writer, req_id: int, kind: int) -> int:
    """The HTTPReqCall.Resp around an action; returns where the action table goes."""
    _, refs = w.table([(0, "I", req_id), (1, "B", kind), (2, "R", 0)], root=True)
    return refs[2]


def stop(req_id: int, status: int, headers: Entries, body: bytes | None) -> bytes:
    w = Writer()
    at = _action(w, req_id, ACTION_STOP)
    fields: list[Field] = [(0, "H", status)] if status else []
    if headers:
        fields.append((1, "R", 0))
    if body:
        fields.append((2, "R", 0))
    start, refs = w.table(fields)
    w.point(at, start)
    if headers:
        w.entries(refs[1], headers)
    if body:
        w.blob(refs[2], body)
    return w.output()


def rewrite(
    req_id: int,
    path: str | None = None,
    headers: Entries = (),
    args: Entries = (),
    resp_headers: Entries = (),
    body: bytes | None = None,
) -> bytes:
    """Most rewrites repeat (the same target header, the same decision header): those are encoded
    once and only the request id is patched in."""
    if body is not None and len(body) > 256:
        return _rewrite(req_id, path, headers, args, resp_headers, body)
    template, id_at = _rewrite_template(path, tuple(headers), tuple(args), tuple(resp_headers), body)
    out = bytearray(template)
    struct.pack_into("<I", out, id_at, req_id)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _rewrite_template(
    path: str | None, headers: Entries, args: Entries, resp_headers: Entries, body: bytes | None
) -> tuple[bytes, int]:
    data = _rewrite(0, path, headers, args, resp_headers, body)
    return data, Table.root(data).field_at(0)


def _rewrite(
    req_id: int, path: str | None, headers: Entries, args: Entries, resp_headers: Entries, body: bytes | None
) -> bytes:
    w = Writer()
    at = _action(w, req_id, ACTION_REWRITE)
    present = [path is not None, bool(headers), bool(args), bool(resp_headers), body is not None]
    start, refs = w.table([(slot, "R", 0) for slot, there in enumerate(present) if there])
    w.point(at, start)
    if path is not None:
        w.blob(refs[0], path.encode("utf-8", "surrogateescape"))
    for slot, entries in ((1, headers), (2, args), (3, resp_headers)):
        if entries:
            w.entries(refs[slot], entries)
    if body is not None:
        w.blob(refs[4], body)
    return w.output()


def resp_call_answer(req_id: int, status: int, headers: Entries, body: bytes | None) -> bytes:
    """Status 0 and no headers or body mean "leave the response as it is"."""
    w = Writer()
    fields: list[Field] = [(0, "I", req_id)] + ([(1, "H", status)] if status else [])
    fields += [(2, "R", 0)] if headers else []
    fields += [(3, "R", 0)] if body is not None else []
    _, refs = w.table(fields, root=True)
    if headers:
        w.entries(refs[2], headers)
    if body is not None:
        w.blob(refs[3], body)
    return w.output()


def _ask(kind: int, name: str | None = None) -> bytes:
    w = Writer()
    _, refs = w.table([(0, "B", kind), (1, "R", 0)], root=True)
    start, inner = w.table([(0, "R", 0)] if name is not None else [])
    w.point(refs[1], start)
    if name is not None:
        w.blob(inner[0], name.encode("utf-8", "surrogateescape"))
    return w.output()


def ask_var(name: str) -> bytes:
    return _ask(INFO_VAR, name)


def ask_req_body() -> bytes:
    return _ask(INFO_REQ_BODY)


def ask_resp_body() -> bytes:
    return _ask(INFO_RESP_BODY)


# APISIX → runner (what the APISIX-side peer sends)


def prepare_conf(key: str, entries: Entries) -> bytes:
    w = Writer()
    _, refs = w.table([(0, "R", 0), (1, "R", 0)], root=True)
    w.entries(refs[0], entries)
    w.blob(refs[1], key.encode("utf-8", "surrogateescape"))
    return w.output()


def req_call(
    req_id: int, token: int, method: int, path: str, args: Entries, headers: Entries, src_ip: bytes
) -> bytes:
    w = Writer()
    fields: list[Field] = [
        (0, "I", req_id),
        (1, "R", 0),
        (3, "R", 0),
        (4, "R", 0),
        (5, "R", 0),
        (6, "I", token),
    ]
    if method:
        fields.append((2, "B", method))
    _, refs = w.table(fields, root=True)
    w.blob(refs[1], src_ip)
    w.blob(refs[3], path.encode("utf-8", "surrogateescape"))
    w.entries(refs[4], args)
    w.entries(refs[5], headers)
    return w.output()


def resp_call(req_id: int, token: int, status: int, headers: Entries) -> bytes:
    w = Writer()
    _, refs = w.table([(0, "I", req_id), (1, "H", status), (2, "R", 0), (3, "I", token)], root=True)
    w.entries(refs[2], headers)
    return w.output()


def extra_info_answer(result: bytes | None) -> bytes:
    w = Writer()
    _, refs = w.table([(0, "R", 0)] if result is not None else [], root=True)
    if result is not None:
        w.blob(refs[0], result)
    return w.output()
