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
from A6.HTTPReqCall.Resp import Resp as HttpReqCallResp
from A6.PrepareConf.Req import Req as PrepareConfReq
from A6.PrepareConf.Resp import Resp as PrepareConfResp

from gateway_plugin.protocol.flat import Malformed, Table

P = ParamSpec("P")
R = TypeVar("R")

METHODS = {v: k for k, v in vars(Method.Method).items() if not k.startswith("_")}
INFO_VAR, INFO_REQ_BODY, INFO_RESP_BODY = 1, 2, 3
ACTION_STOP, ACTION_REWRITE = 1, 2

_DECODE_ERRORS = (
    Malformed,
    struct.error,
    IndexError,
    ValueError,
    TypeError,
    UnicodeDecodeError,
    AttributeError,
)

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


@_guard
def prepare_conf(buf: bytes) -> tuple[str, TextEntries]:
    """A PrepareConf request: its cache key and its (plugin name, JSON conf) entries in order."""
    req = _root(PrepareConfReq, buf)
    return _text(req.Key()) or "", _entries(req.ConfLength(), req.Conf)


class HttpReqCall:
    """An HTTPReqCall request; ``id`` and ``conf_token`` are read at once, the rest on demand.

    Read with the fast reader: this is on the path of every request.
    """

    __slots__ = ("__dict__", "_t", "conf_token", "id")

    @_guard
    def __init__(self, buf: bytes) -> None:
        self._t = Table.root(buf)
        self.id = self._t.u32(0)
        self.conf_token = self._t.u32(6)

    @cached_property
    @_guard
    def method(self) -> str:
        return str(METHODS.get(self._t.u8(2), "GET"))

    @cached_property
    @_guard
    def path(self) -> str:
        return self._t.text(3) or "/"

    @cached_property
    @_guard
    def headers(self) -> TextEntries:
        return self._t.entries(5)

    @cached_property
    @_guard
    def header_map(self) -> dict[str, str]:
        """Lower-cased names; repeated headers joined with ``", "``."""
        return self._t.entry_dict(5)

    @cached_property
    @_guard
    def args(self) -> TextEntries:
        return self._t.entries(4)

    @cached_property
    @_guard
    def src_ip(self) -> str:
        raw = self._t.blob(1) or b""
        return str(ipaddress.ip_address(raw)) if len(raw) in (4, 16) else ""


class HttpRespCall:
    """An HTTPRespCall request (``ext-plugin-post-resp``): the upstream's status and headers."""

    __slots__ = ("__dict__", "_t", "conf_token", "id", "status")

    @_guard
    def __init__(self, buf: bytes) -> None:
        self._t = Table.root(buf)
        self.id = self._t.u32(0)
        self.status = self._t.u16(1)
        self.conf_token = self._t.u32(3)

    @cached_property
    @_guard
    def headers(self) -> TextEntries:
        return self._t.entries(2)

    @cached_property
    @_guard
    def header_map(self) -> dict[str, str]:
        """Lower-cased names; repeated headers joined with ``", "``."""
        return self._t.entry_dict(2)


@_guard
def extra_info_result(buf: bytes) -> bytes | None:
    """APISIX's answer to one ExtraInfo question; ``None`` when the variable is unset."""
    return Table.root(buf).blob(0) if buf else None


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
        t = Table(bytes(action.Bytes), action.Pos)
        return resp.Id(), Stop(t.u16(0), t.entries(1), t.blob(2) or b"")
    if kind == ACTION_REWRITE and action is not None:
        t = Table(bytes(action.Bytes), action.Pos)
        return resp.Id(), Rewrite(t.text(0), t.entries(1), t.entries(2), t.entries(3), t.blob(4))
    return resp.Id(), None


@dataclass(frozen=True)
class RespCallAnswer:
    id: int
    status: int
    headers: TextEntries
    body: bytes | None


@_guard
def resp_call_answer(buf: bytes) -> RespCallAnswer:
    t = Table.root(buf)
    return RespCallAnswer(t.u32(0), t.u16(1), t.entries(2), t.blob(3))


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
