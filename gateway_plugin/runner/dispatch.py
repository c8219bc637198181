"""Dispatch: which plugin chain answers a call, and the conf each route's chain was prepared with.

PrepareConf validates and prepares a route's chain once and hands APISIX a token; each
HTTPReqCall or HTTPRespCall runs that chain. Every call gets exactly one answer frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gateway_plugin.plugin import HttpRequest, HttpResponse, Plugin, RequestAction, ResponseAction
from gateway_plugin.protocol import encode, messages
from gateway_plugin.runner.conf_cache import ConfCache, PreparedConf


@dataclass(frozen=True)
class ConnectionLimits:
    """What one APISIX connection may hold: a partial frame only for so long, a few frames queued
    behind a call in flight, ExtraInfo answers within a deadline; and how many connections."""

    frame_timeout_s: float = 10.0
    max_backlog: int = 16
    ask_timeout_s: float = 60.0
    max_connections: int = 1024


class ConfError(ValueError):
    """A PrepareConf the runner cannot accept (unknown plugin, invalid conf)."""


class Runner:
    """Plugins by name, the conf cache, and the dispatch of calls to plugin chains."""

    def __init__(
        self,
        plugins: Mapping[str, Plugin[Any]],
        confs: ConfCache | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.plugins = dict(plugins)
        self.confs = confs if confs is not None else ConfCache()
        self.limits = limits or ConnectionLimits()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.connections = 0

    def prepare(self, payload: bytes) -> bytes:
        name_key, entries = messages.prepare_conf(payload)
        key = (name_key, tuple(entries)) if name_key else None
        token = self.confs.renew(key) if key is not None else None
        if token is not None:
            return encode.prepare_conf_answer(token)
        chain = []
        for name, raw in entries:
            plugin = self.plugins.get(name)
            if plugin is None:
                raise ConfError(f"unknown plugin {name!r}; this runner has {sorted(self.plugins)}")
            try:
                chain.append((plugin, plugin.parse_conf(raw or "")))
            except ValidationError as exc:
                raise ConfError(f"invalid conf for plugin {name!r}: {exc}") from None
        return encode.prepare_conf_answer(self.confs.put(PreparedConf.of(chain), key))

    async def request(self, conf: PreparedConf, call: messages.HttpReqCall, info: Any) -> bytes:
        request = HttpRequest(call, info)
        if conf.prefetch_vars or conf.prefetch_body:
            request.prefetch(conf.prefetch_vars, conf.prefetch_body)
        action = RequestAction(request)
        for plugin, plugin_conf in conf.chain:
            await plugin.request_filter(plugin_conf, request, action)
            if action.stopped:
                break
        return action.encode(call.id)

    async def response(self, conf: PreparedConf, call: messages.HttpRespCall, info: Any) -> bytes:
        response = HttpResponse(call, info)
        action = ResponseAction()
        for plugin, plugin_conf in conf.chain:
            await plugin.response_filter(plugin_conf, response, action)
        return action.encode(call.id)
