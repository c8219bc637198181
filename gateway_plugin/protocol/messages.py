"""Read-only views over decoded protocol messages, read with the one reader (``flat``) by named slot
(``schema``).

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
from typing import ParamSpec, TypeVar

from gateway_plugin.protocol import schema
from gateway_plugin.protocol.entry_map import EntryMap, entry_map
from gateway_plugin.protocol.flat import Malformed, Table

P = ParamSpec("P")
R = TypeVar("R")

_REQ = schema.HttpReqCallReq
_RESP_CALL = schema.HttpRespCallReq
# The slots read on every call, as plain ints.
_REQ_ID, _REQ_TOKEN = int(_REQ.ID), int(_REQ.CONF_TOKEN)

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


@_guard
def prepare_conf(buf: bytes) -> tuple[str, TextEntries]:
    """A PrepareConf request: its cache key and its (plugin name, JSON conf) entries in order."""
    t = Table.root(buf)
    return t.text(schema.PrepareConfReq.KEY) or "", t.entries(schema.PrepareConfReq.CONF)


class HttpReqCall:
    """An HTTPReqCall request; ``id`` and ``conf_token`` are read at once, the rest on first use.

    On the path of every request: plain slots rather than ``cached_property`` (which takes a lock
    on each first read in Python 3.11).
    """

    __slots__ = ("_args", "_header_map", "_headers", "_path", "_t", "conf_token", "id")

    @_guard
    def __init__(self, buf: bytes) -> None:
        self._t = Table.root(buf)
        self.id = self._t.u32(_REQ_ID)
        self.conf_token = self._t.u32(_REQ_TOKEN)
        self._path: str | None = None
        self._args: TextEntries | None = None
        self._headers: TextEntries | None = None
        self._header_map: EntryMap | None = None

    @property
    @_guard
    def method(self) -> str:
        index = self._t.u8(_REQ.METHOD)
        return schema.METHODS[index] if index < len(schema.METHODS) else "GET"

    @property
    def path(self) -> str:
        if self._path is None:
            self._path = _read(self._t.text, _REQ.PATH) or "/"
        return self._path

    @property
    def headers(self) -> TextEntries:
        if self._headers is None:
            self._headers = _read(self._t.entries, _REQ.HEADERS)
        return self._headers

    @property
    def header_map(self) -> EntryMap:
        """Lower-cased names; repeated headers joined with ``", "``."""
        if self._header_map is None:
            self._header_map = _read(functools.partial(entry_map, self._t), _REQ.HEADERS)
        return self._header_map

    @property
    def args(self) -> TextEntries:
        if self._args is None:
            self._args = _read(self._t.entries, _REQ.ARGS)
        return self._args

    @property
    @_guard
    def src_ip(self) -> str:
        raw = self._t.blob(_REQ.SRC_IP) or b""
        return str(ipaddress.ip_address(raw)) if len(raw) in (4, 16) else ""


class HttpRespCall:
    """An HTTPRespCall request (``ext-plugin-post-resp``): the upstream's status and headers."""

    __slots__ = ("_header_map", "_headers", "_t", "conf_token", "id", "status")

    @_guard
    def __init__(self, buf: bytes) -> None:
        self._t = Table.root(buf)
        self.id = self._t.u32(_RESP_CALL.ID)
        self.status = self._t.u16(_RESP_CALL.STATUS)
        self.conf_token = self._t.u32(_RESP_CALL.CONF_TOKEN)
        self._headers: TextEntries | None = None
        self._header_map: EntryMap | None = None

    @property
    def headers(self) -> TextEntries:
        if self._headers is None:
            self._headers = _read(self._t.entries, _RESP_CALL.HEADERS)
        return self._headers

    @property
    def header_map(self) -> EntryMap:
        """Lower-cased names; repeated headers joined with ``", "``."""
        if self._header_map is None:
            self._header_map = _read(functools.partial(entry_map, self._t), _RESP_CALL.HEADERS)
        return self._header_map


def _read(reader: Callable[[int], R], slot: int) -> R:
    try:
        return reader(slot)
    except _DECODE_ERRORS as exc:
        raise DecodeError(f"undecodable message: {exc}") from None


@_guard
def extra_info_result(buf: bytes) -> bytes | None:
    """APISIX's answer to one ExtraInfo question; ``None`` when the variable is unset."""
    return Table.root(buf).blob(schema.ExtraInfoResp.RESULT) if buf else None


# Peer side: what APISIX reads from the runner.


@_guard
def conf_token(buf: bytes) -> int:
    return Table.root(buf).u32(schema.PrepareConfResp.CONF_TOKEN)


@_guard
def err_code(buf: bytes) -> int:
    return Table.root(buf).u8(schema.ErrResp.CODE) if buf else 0


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
    resp = Table.root(buf)
    req_id = resp.u32(schema.HttpReqCallResp.ID)
    kind, t = resp.u8(schema.HttpReqCallResp.ACTION_TYPE), resp.table(schema.HttpReqCallResp.ACTION)
    if kind == schema.Action.STOP and t is not None:
        f = schema.Stop
        return req_id, Stop(t.u16(f.STATUS), t.entries(f.HEADERS), t.blob(f.BODY) or b"")
    if kind == schema.Action.REWRITE and t is not None:
        r = schema.Rewrite
        return req_id, Rewrite(
            t.text(r.PATH), t.entries(r.HEADERS), t.entries(r.ARGS), t.entries(r.RESP_HEADERS), t.blob(r.BODY)
        )
    return req_id, None


@dataclass(frozen=True)
class RespCallAnswer:
    id: int
    status: int
    headers: TextEntries
    body: bytes | None


@_guard
def resp_call_answer(buf: bytes) -> RespCallAnswer:
    t, f = Table.root(buf), schema.HttpRespCallResp
    return RespCallAnswer(t.u32(f.ID), t.u16(f.STATUS), t.entries(f.HEADERS), t.blob(f.BODY))


@_guard
def extra_info_request(buf: bytes) -> tuple[int, str | None]:
    """What the runner asks APISIX for: (info type, variable name for Var)."""
    req = Table.root(buf)
    kind = req.u8(schema.ExtraInfoReq.INFO_TYPE)
    info = req.table(schema.ExtraInfoReq.INFO)
    if kind == schema.Info.VAR and info is not None:
        return kind, info.text(schema.Var.NAME)
    return kind, None
