"""Read-only views over decoded protocol messages.

Runner side: PrepareConf, HTTPReqCall and HTTPRespCall requests and ExtraInfo answers. Peer side
(what APISIX reads): the runner's answers. Fields are decoded on first use and cached; anything
malformed raises ``DecodeError``, which the server answers with BAD_REQUEST.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ParamSpec, TypeVar

from A6 import Method
from A6.Err.Resp import Resp as ErrResp
from A6.ExtraInfo.Req import Req as ExtraInfoReq
from A6.ExtraInfo.Var import Var
from A6.HTTPReqCall.Req import Req as HttpReqCallReq
from A6.HTTPReqCall.Resp import Resp as HttpReqCallResp
from A6.PrepareConf.Req import Req as PrepareConfReq
from A6.PrepareConf.Resp import Resp as PrepareConfResp
from flatbuffers.table import Table

P = ParamSpec("P")
R = TypeVar("R")

METHODS = {v: k for k, v in vars(Method.Method).items() if not k.startswith("_")}
INFO_VAR, INFO_REQ_BODY, INFO_RESP_BODY = 1, 2, 3
ACTION_STOP, ACTION_REWRITE = 1, 2

_DECODE_ERRORS = (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, AttributeError)

TextEntries = list[tuple[str, str | None]]


class DecodeError(ValueError):
    """A payload that is not the FlatBuffers table it claims to be."""


def _guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Low-level read errors of a malformed buffer become one ``DecodeError``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except _DECODE_ERRORS as exc:
            raise DecodeError(f"undecodable message: {exc}") from None

    return wrapper


def _root(cls: Any, buf: bytes) -> Any:
    if len(buf) < 8:
        raise DecodeError(f"message of {len(buf)} bytes is too short to be a FlatBuffers table")
    return _guard(cls.GetRootAs)(buf, 0)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


def _entries(length: int, get: Any) -> TextEntries:
    out: TextEntries = []
    for j in range(length):
        entry = get(j)
        out.append((_text(entry.Name()) or "", _text(entry.Value())))
    return out


class _Slots:
    """Reads a table by field slot, for the tables ``a6pluginprotos`` lacks."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.tab = Table(buf, pos)

    @classmethod
    def root(cls, buf: bytes) -> _Slots:
        if len(buf) < 8:
            raise DecodeError(f"message of {len(buf)} bytes is too short to be a FlatBuffers table")
        return cls(buf, struct.unpack_from("<I", buf, 0)[0])

    def _off(self, slot: int) -> int:
        return int(self.tab.Offset(4 + 2 * slot))

    def uint(self, slot: int, fmt: str) -> int:
        o = self._off(slot)
        return struct.unpack_from("<" + fmt, self.tab.Bytes, self.tab.Pos + o)[0] if o else 0

    def raw_bytes(self, slot: int) -> bytes | None:
        o = self._off(slot)
        if not o:
            return None
        start = self.tab.Vector(o)
        return bytes(self.tab.Bytes[start : start + self.tab.VectorLen(o)])

    def entries(self, slot: int) -> TextEntries:
        o = self._off(slot)
        if not o:
            return []
        start, out = self.tab.Vector(o), []
        for j in range(self.tab.VectorLen(o)):
            entry = _Slots(self.tab.Bytes, self.tab.Indirect(start + 4 * j))
            name, value = entry.string(0), entry.string(1)
            out.append((name or "", value))
        return out

    def string(self, slot: int) -> str | None:
        o = self._off(slot)
        return _text(bytes(self.tab.String(o + self.tab.Pos))) if o else None

    def table(self, slot: int) -> _Slots | None:
        o = self._off(slot)
        return _Slots(self.tab.Bytes, self.tab.Indirect(o + self.tab.Pos)) if o else None


@_guard
def prepare_conf(buf: bytes) -> tuple[str, TextEntries]:
    """A PrepareConf request: its cache key and its (plugin name, JSON conf) entries in order."""
    req = _root(PrepareConfReq, buf)
    return _text(req.Key()) or "", _entries(req.ConfLength(), req.Conf)


class HttpReqCall:
    """An HTTPReqCall request; ``id`` and ``conf_token`` are read at once, the rest on demand."""

    __slots__ = ("__dict__", "_req", "conf_token", "id")

    def __init__(self, buf: bytes) -> None:
        self._req = _root(HttpReqCallReq, buf)
        self.id, self.conf_token = _guard(lambda r: (r.Id(), r.ConfToken()))(self._req)

    @cached_property
    @_guard
    def method(self) -> str:
        return str(METHODS.get(self._req.Method(), "GET"))

    @cached_property
    @_guard
    def path(self) -> str:
        return _text(self._req.Path()) or "/"

    @cached_property
    @_guard
    def headers(self) -> TextEntries:
        return _entries(self._req.HeadersLength(), self._req.Headers)

    @cached_property
    @_guard
    def args(self) -> TextEntries:
        return _entries(self._req.ArgsLength(), self._req.Args)

    @cached_property
    @_guard
    def src_ip(self) -> str:
        raw = _Slots(self._req._tab.Bytes, self._req._tab.Pos).raw_bytes(1) or b""
        return str(ipaddress.ip_address(raw)) if len(raw) in (4, 16) else ""


class HttpRespCall:
    """An HTTPRespCall request (``ext-plugin-post-resp``): the upstream's status and headers."""

    __slots__ = ("__dict__", "_t", "conf_token", "id", "status")

    @_guard
    def __init__(self, buf: bytes) -> None:
        self._t = _Slots.root(buf)
        self.id = self._t.uint(0, "I")
        self.status = self._t.uint(1, "H")
        self.conf_token = self._t.uint(3, "I")

    @cached_property
    @_guard
    def headers(self) -> TextEntries:
        return self._t.entries(2)


@_guard
def extra_info_result(buf: bytes) -> bytes | None:
    """APISIX's answer to one ExtraInfo request; ``None`` when the variable is unset."""
    return _Slots.root(buf).raw_bytes(0) if buf else None


# Peer side: what APISIX reads from the runner.


@_guard
def conf_token(buf: bytes) -> int:
    return int(_root(PrepareConfResp, buf).ConfToken())


@_guard
def err_code(buf: bytes) -> int:
    return int(_root(ErrResp, buf).Code()) if buf else 0


@dataclass(frozen=True)
class Stop:
    status: int
    headers: TextEntries
    body: bytes


@dataclass(frozen=True)
class Rewrite:
    path: str | None
    headers: TextEntries
    args: TextEntries
    resp_headers: TextEntries
    body: bytes | None


@_guard
def req_call_answer(buf: bytes) -> tuple[int, Stop | Rewrite | None]:
    """The runner's HTTPReqCall answer: its id and its action (``None`` means no change)."""
    resp = _root(HttpReqCallResp, buf)
    kind, action = resp.ActionType(), resp.Action()
    if kind == ACTION_STOP and action is not None:
        t = _Slots(action.Bytes, action.Pos)
        return resp.Id(), Stop(t.uint(0, "H"), t.entries(1), t.raw_bytes(2) or b"")
    if kind == ACTION_REWRITE and action is not None:
        t = _Slots(action.Bytes, action.Pos)
        return resp.Id(), Rewrite(t.string(0), t.entries(1), t.entries(2), t.entries(3), t.raw_bytes(4))
    return resp.Id(), None


@dataclass(frozen=True)
class RespCallAnswer:
    id: int
    status: int
    headers: TextEntries
    body: bytes | None


@_guard
def resp_call_answer(buf: bytes) -> RespCallAnswer:
    t = _Slots.root(buf)
    return RespCallAnswer(t.uint(0, "I"), t.uint(1, "H"), t.entries(2), t.raw_bytes(3))


@_guard
def extra_info_request(buf: bytes) -> tuple[int, str | None]:
    """What the runner asks APISIX for: (info type, variable name for Var)."""
    req = _root(ExtraInfoReq, buf)
    kind = req.InfoType()
    if kind == INFO_VAR:
        table = req.Info()
        var = Var()
        var.Init(table.Bytes, table.Pos)
        return kind, _text(var.Name())
    return kind, None
