"""Encoders for every message of the protocol, both directions, by named slot (``schema``).

A TextEntry with no value means "delete".
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Collection, Sequence

from gateway_plugin.protocol.flat import Entries, Table, Writer
from gateway_plugin.protocol.schema import (
    Action,
    ErrResp,
    ExtraInfoReq,
    ExtraInfoResp,
    HttpReqCallReq,
    HttpReqCallResp,
    HttpRespCallReq,
    HttpRespCallResp,
    Info,
    PrepareConfReq,
    PrepareConfResp,
    Rewrite,
    Stop,
    Var,
)

Field = tuple[int, str, int]  # (slot, kind, value)


def _scalar_table(fields: Sequence[Field]) -> bytes:
    w = Writer()
    w.table([f for f in fields if f[2]], root=True)
    return w.output()


# Runner → APISIX


def prepare_conf_answer(token: int) -> bytes:
    return _scalar_table([(PrepareConfResp.CONF_TOKEN, "I", token)])


def error(code: int) -> bytes:
    return _scalar_table([(ErrResp.CODE, "B", code)])


def no_change(req_id: int) -> bytes:
    return _scalar_table([(HttpReqCallResp.ID, "I", req_id)])


def _action(w: Writer, req_id: int, kind: int) -> int:
    """The HTTPReqCall.Resp around an action; returns where the action table goes."""
    fields: list[Field] = [
        (HttpReqCallResp.ID, "I", req_id),
        (HttpReqCallResp.ACTION_TYPE, "B", kind),
        (HttpReqCallResp.ACTION, "R", 0),
    ]
    _, refs = w.table(fields, root=True)
    return refs[HttpReqCallResp.ACTION]


def stop(req_id: int, status: int, headers: Entries, body: bytes | None) -> bytes:
    w = Writer()
    at = _action(w, req_id, Action.STOP)
    fields: list[Field] = [(Stop.STATUS, "H", status)] if status else []
    if headers:
        fields.append((Stop.HEADERS, "R", 0))
    if body:
        fields.append((Stop.BODY, "R", 0))
    start, refs = w.table(fields)
    w.point(at, start)
    if headers:
        w.entries(refs[Stop.HEADERS], headers)
    if body:
        w.blob(refs[Stop.BODY], body)
    return w.output()


def rewrite(
    req_id: int,
    path: str | None = None,
    headers: Entries = (),
    args: Entries = (),
    resp_headers: Entries = (),
    body: bytes | None = None,
    fresh: Collection[str] = (),
) -> bytes:
    """Most rewrites repeat (the same target header, the same decision header): those are encoded
    once and only the request id is patched in. The values of the headers named in ``fresh`` are
    new with every request (a signature): the template holds a placeholder of their length, which
    each copy overwrites, so they do not make every request's rewrite a new one."""
    if body is not None and len(body) > 256:
        return _rewrite(req_id, path, headers, args, resp_headers, body)
    if not fresh:  # the usual answer: nothing to write but the id
        template, id_at, _ = _rewrite_template(
            path, tuple(headers), tuple(args), tuple(resp_headers), body, ()
        )
        out = bytearray(template)
        struct.pack_into("<I", out, id_at, req_id)
        return bytes(out)
    placed, marked, values = _placeholders(headers, fresh)
    template, id_at, value_at = _rewrite_template(
        path, placed, tuple(args), tuple(resp_headers), body, marked
    )
    out = bytearray(template)
    struct.pack_into("<I", out, id_at, req_id)
    for at, raw in zip(value_at, values, strict=True):
        out[at : at + len(raw)] = raw
    return bytes(out)


def _placeholders(headers: Entries, fresh: Collection[str]) -> tuple[Entries, tuple[int, ...], list[bytes]]:
    """The headers with each fresh value replaced by as many NULs as it has bytes, which of them
    were, and their values' bytes."""
    placed = list(headers)
    marked: list[int] = []
    values: list[bytes] = []
    for i, (name, value) in enumerate(placed):
        if value is not None and name in fresh:
            raw = value.encode("utf-8", "surrogateescape")
            placed[i] = (name, "\0" * len(raw))
            marked.append(i)
            values.append(raw)
    return tuple(placed), tuple(marked), values


@functools.lru_cache(maxsize=4096)
def _rewrite_template(
    path: str | None,
    headers: Entries,
    args: Entries,
    resp_headers: Entries,
    body: bytes | None,
    marked: tuple[int, ...],
) -> tuple[bytes, int, tuple[int, ...]]:
    """The rewrite with request id 0, where its id goes, and where the values of the ``marked``
    headers begin."""
    starts: list[int] = []
    data = _rewrite(0, path, headers, args, resp_headers, body, starts)
    return data, Table.root(data).field_at(HttpReqCallResp.ID), tuple(starts[i] for i in marked)


def _rewrite(
    req_id: int,
    path: str | None,
    headers: Entries,
    args: Entries,
    resp_headers: Entries,
    body: bytes | None,
    starts: list[int] | None = None,
) -> bytes:
    w = Writer()
    at = _action(w, req_id, Action.REWRITE)
    present = {
        Rewrite.PATH: path is not None,
        Rewrite.HEADERS: bool(headers),
        Rewrite.ARGS: bool(args),
        Rewrite.RESP_HEADERS: bool(resp_headers),
        Rewrite.BODY: body is not None,
    }
    start, refs = w.table([(slot, "R", 0) for slot, there in present.items() if there])
    w.point(at, start)
    if path is not None:
        w.blob(refs[Rewrite.PATH], path.encode("utf-8", "surrogateescape"))
    if headers:
        w.entries(refs[Rewrite.HEADERS], headers, starts)
    if args:
        w.entries(refs[Rewrite.ARGS], args)
    if resp_headers:
        w.entries(refs[Rewrite.RESP_HEADERS], resp_headers)
    if body is not None:
        w.blob(refs[Rewrite.BODY], body)
    return w.output()


def resp_call_answer(req_id: int, status: int, headers: Entries, body: bytes | None) -> bytes:
    """Status 0 and no headers or body mean "leave the response as it is"."""
    w, f = Writer(), HttpRespCallResp
    fields: list[Field] = [(f.ID, "I", req_id)]
    fields += [(f.STATUS, "H", status)] if status else []
    fields += [(f.HEADERS, "R", 0)] if headers else []
    fields += [(f.BODY, "R", 0)] if body is not None else []
    _, refs = w.table(fields, root=True)
    if headers:
        w.entries(refs[f.HEADERS], headers)
    if body is not None:
        w.blob(refs[f.BODY], body)
    return w.output()


def _ask(kind: int, name: str | None = None) -> bytes:
    w = Writer()
    _, refs = w.table([(ExtraInfoReq.INFO_TYPE, "B", kind), (ExtraInfoReq.INFO, "R", 0)], root=True)
    start, inner = w.table([(Var.NAME, "R", 0)] if name is not None else [])
    w.point(refs[ExtraInfoReq.INFO], start)
    if name is not None:
        w.blob(inner[Var.NAME], name.encode("utf-8", "surrogateescape"))
    return w.output()


def ask_var(name: str) -> bytes:
    return _ask(Info.VAR, name)


def ask_req_body() -> bytes:
    return _ask(Info.REQ_BODY)


def ask_resp_body() -> bytes:
    return _ask(Info.RESP_BODY)


# APISIX → runner (what the APISIX-side peer sends)


def prepare_conf(key: str, entries: Entries) -> bytes:
    w = Writer()
    _, refs = w.table([(PrepareConfReq.CONF, "R", 0), (PrepareConfReq.KEY, "R", 0)], root=True)
    w.entries(refs[PrepareConfReq.CONF], entries)
    w.blob(refs[PrepareConfReq.KEY], key.encode("utf-8", "surrogateescape"))
    return w.output()


def req_call(
    req_id: int, token: int, method: int, path: str, args: Entries, headers: Entries, src_ip: bytes
) -> bytes:
    w, f = Writer(), HttpReqCallReq
    fields: list[Field] = [
        (f.ID, "I", req_id),
        (f.SRC_IP, "R", 0),
        (f.PATH, "R", 0),
        (f.ARGS, "R", 0),
        (f.HEADERS, "R", 0),
        (f.CONF_TOKEN, "I", token),
    ]
    if method:
        fields.append((f.METHOD, "B", method))
    _, refs = w.table(fields, root=True)
    w.blob(refs[f.SRC_IP], src_ip)
    w.blob(refs[f.PATH], path.encode("utf-8", "surrogateescape"))
    w.entries(refs[f.ARGS], args)
    w.entries(refs[f.HEADERS], headers)
    return w.output()


def resp_call(req_id: int, token: int, status: int, headers: Entries) -> bytes:
    w, f = Writer(), HttpRespCallReq
    fields: list[Field] = [
        (f.ID, "I", req_id),
        (f.STATUS, "H", status),
        (f.HEADERS, "R", 0),
        (f.CONF_TOKEN, "I", token),
    ]
    _, refs = w.table(fields, root=True)
    w.entries(refs[f.HEADERS], headers)
    return w.output()


def extra_info_answer(result: bytes | None) -> bytes:
    w = Writer()
    _, refs = w.table([(ExtraInfoResp.RESULT, "R", 0)] if result is not None else [], root=True)
    if result is not None:
        w.blob(refs[ExtraInfoResp.RESULT], result)
    return w.output()
