"""The plugin API: what a plugin sees of a request, and how it asks for changes.

A plugin declares its name and a pydantic config model; its conf is parsed once per conf token
(``parse_conf`` may build costly state there). Filters read the request's method, path, args,
headers and source address, fetch APISIX variables and the body on demand (cached per request,
or prefetched when declared), and record only the changes they make.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from gateway_plugin.protocol import encode
from gateway_plugin.protocol.entry_map import EntryMap
from gateway_plugin.protocol.messages import HttpReqCall, HttpRespCall, TextEntries

ConfT = TypeVar("ConfT")


class InfoSource(Protocol):
    """The connection a call arrived on: ExtraInfo questions go back over it."""

    def ask(self, payload: bytes) -> asyncio.Future[bytes | None]: ...


class _Fetches:
    """ExtraInfo fetches for one call, each asked once and cached."""

    def __init__(self, info: InfoSource) -> None:
        self._info = info
        self._vars: dict[str, asyncio.Future[bytes | None]] = {}
        self._body: asyncio.Future[bytes | None] | None = None

    def var(self, name: str) -> asyncio.Future[bytes | None]:
        fut = self._vars.get(name)
        if fut is None:
            fut = self._vars[name] = self._info.ask(encode.ask_var(name))
        return fut

    def body(self, payload: bytes) -> asyncio.Future[bytes | None]:
        if self._body is None:
            self._body = self._info.ask(payload)
        return self._body


class HttpRequest:
    """A request as APISIX describes it, before it goes upstream."""

    def __init__(self, call: HttpReqCall, info: InfoSource) -> None:
        self._call = call
        self._fetches = _Fetches(info)

    @property
    def id(self) -> int:
        return int(self._call.id)

    @property
    def method(self) -> str:
        return self._call.method

    @property
    def path(self) -> str:
        return self._call.path

    @property
    def src_ip(self) -> str:
        return self._call.src_ip

    @property
    def raw_headers(self) -> TextEntries:
        return self._call.headers

    @property
    def headers(self) -> EntryMap:
        """Names lower-cased with ``_`` read as ``-``; every value of a name joined with ``", "``."""
        return self._call.header_map

    @property
    def args(self) -> TextEntries:
        return self._call.args

    def arg(self, name: str) -> str | None:
        return next((v for k, v in self._call.args if k == name), None)

    def prefetch(self, names: Sequence[str], body: bool) -> None:
        """Ask for everything at once; APISIX answers in order, one round trip in all."""
        for name in names:
            self._fetches.var(name)
        if body:
            self._fetches.body(encode.ask_req_body())

    async def var(self, name: str) -> bytes | None:
        """An nginx/APISIX variable (``remote_addr``, ``route_id``, ...); ``None`` when unset."""
        return await self._fetches.var(name)

    async def body(self) -> bytes:
        return await self._fetches.body(encode.ask_req_body()) or b""


class HttpResponse:
    """The upstream's answer as APISIX describes it (``ext-plugin-post-resp``)."""

    def __init__(self, call: HttpRespCall, info: InfoSource) -> None:
        self._call = call
        self._fetches = _Fetches(info)

    @property
    def id(self) -> int:
        return self._call.id

    @property
    def status(self) -> int:
        return self._call.status

    @property
    def headers(self) -> Mapping[str, str]:
        """Lower-cased names; repeated headers joined with ``", "``."""
        return self._call.header_map

    def prefetch(self, names: Sequence[str]) -> None:
        """Ask for every variable at once: one round trip in all."""
        for name in names:
            self._fetches.var(name)

    async def var(self, name: str) -> bytes | None:
        return await self._fetches.var(name)

    async def body(self) -> bytes:
        return await self._fetches.body(encode.ask_resp_body()) or b""


class RequestAction:
    """What the plugins want done with a request: stop it, or rewrite parts of it.

    Only what a plugin asked for goes back to APISIX, never the whole request; the last word
    on a header or argument wins.
    """

    __slots__ = ("_args", "_body", "_fresh", "_headers", "_path", "_request", "_resp_headers", "_stop")

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._stop: tuple[int, list[tuple[str, str | None]], bytes] | None = None
        self._path: str | None = None
        self._headers: dict[str, str | None] = {}
        self._fresh: tuple[str, ...] = ()
        self._args: dict[str, str | None] = {}
        self._resp_headers: list[tuple[str, str | None]] = []
        self._body: bytes | None = None

    @property
    def stopped(self) -> bool:
        return self._stop is not None

    def stop(self, status: int, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()) -> None:
        """Answer the client now; the request never reaches an upstream."""
        self._stop = (status, list(headers), body)

    def set_path(self, path: str) -> None:
        self._path = path if path != self._request.path else None

    def set_header(self, name: str, value: str) -> None:
        self._headers[name.lower()] = value

    def set_fresh_header(self, name: str, value: str) -> None:
        """A value new with every request (a signature): written into an answer encoded once for
        the requests rewritten alike, rather than making each answer a new one."""
        key = name.lower()
        self._headers[key] = value
        self._fresh = (*self._fresh, key)

    def delete_header(self, name: str) -> None:
        self._headers[name.lower()] = None

    def set_arg(self, name: str, value: str) -> None:
        if self._request.arg(name) == value:
            self._args.pop(name, None)
        else:
            self._args[name] = value

    def delete_arg(self, name: str) -> None:
        if self._request.arg(name) is not None:
            self._args[name] = None

    def add_response_header(self, name: str, value: str) -> None:
        """A header on the client's answer, whoever gives it: an upstream, or a stop."""
        self._resp_headers.append((name, value))

    def set_body(self, body: bytes) -> None:
        self._body = body

    def encode(self, req_id: int) -> bytes:
        if self._stop is not None:
            status, headers, body = self._stop
            return encode.stop(req_id, status, [*headers, *self._resp_headers], body)
        if (
            self._path is None
            and not (self._headers or self._args or self._resp_headers)
            and self._body is None
        ):
            return encode.no_change(req_id)
        return encode.rewrite(
            req_id,
            self._path,
            list(self._headers.items()),
            list(self._args.items()),
            self._resp_headers,
            self._body,
            self._fresh,
        )


class ResponseAction:
    """Changes to the upstream's answer; status 0 keeps the upstream's status."""

    __slots__ = ("_body", "_headers", "_status")

    def __init__(self) -> None:
        self._status = 0
        self._headers: list[tuple[str, str | None]] = []
        self._body: bytes | None = None

    def set_status(self, status: int) -> None:
        self._status = status

    def set_header(self, name: str, value: str) -> None:
        self._headers.append((name, value))

    def set_body(self, body: bytes) -> None:
        self._body = body

    def encode(self, req_id: int) -> bytes:
        return encode.resp_call_answer(req_id, self._status, self._headers, self._body)


class Plugin(Generic[ConfT]):
    """Subclass with ``name``, ``config_model`` and at least ``request_filter``."""

    name: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]
    prefetch_vars: ClassVar[tuple[str, ...]] = ()
    prefetch_body: ClassVar[bool] = False

    def parse_conf(self, raw: str) -> ConfT:
        """Once per conf token: validate, then build whatever the filters need."""
        return self.prepare(self.config_model.model_validate_json(raw or "{}"))

    def prepare(self, config: Any) -> ConfT:
        return config  # type: ignore[no-any-return]

    async def request_filter(self, conf: ConfT, request: HttpRequest, action: RequestAction) -> None:
        return None

    async def response_filter(self, conf: ConfT, response: HttpResponse, action: ResponseAction) -> None:
        return None

    @classmethod
    def filters_responses(cls) -> bool:
        return cls.response_filter is not Plugin.response_filter
