"""Parsed plugin confs under the tokens handed to APISIX.

Each PrepareConf is validated and prepared once; every request then finds its plugin chain by
token. APISIX keeps a token in a shared dict for 0.9 x ``APISIX_CONF_EXPIRE_TIME`` and each worker
keeps what it fetched from there for another full ``APISIX_CONF_EXPIRE_TIME`` in its own LRU, so a
token may be used up to 1.9 x that time after it was handed out: entries here live 2 x. A
PrepareConf with a key (and entries) seen before gets the same token back, its life renewed. An
expired or unknown token is answered with CONF_TOKEN_NOT_FOUND and APISIX prepares again.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway_plugin.plugin import Plugin

log = logging.getLogger("spillway.runner")

DEFAULT_APISIX_EXPIRE_S = 3600.0
TTL_FACTOR = 2.0


def default_ttl() -> float:
    raw = os.environ.get("APISIX_CONF_EXPIRE_TIME") or ""
    try:
        apisix = float(raw or DEFAULT_APISIX_EXPIRE_S)
    except ValueError:
        apisix = -1.0
    if not 0 < apisix < float("inf"):
        log.warning(
            "APISIX_CONF_EXPIRE_TIME=%r is not a positive number of seconds; keeping confs for %g s",
            raw,
            DEFAULT_APISIX_EXPIRE_S * TTL_FACTOR,
        )
        apisix = DEFAULT_APISIX_EXPIRE_S
    return apisix * TTL_FACTOR


@dataclass(frozen=True)
class PreparedConf:
    """The plugin chain of one route, in conf order, with what it asks APISIX for up front."""

    chain: tuple[tuple[Plugin[Any], Any], ...]
    prefetch_vars: tuple[str, ...] = ()
    prefetch_body: bool = False
    filters_responses: bool = False

    @classmethod
    def of(cls, chain: list[tuple[Plugin[Any], Any]]) -> PreparedConf:
        names = tuple(dict.fromkeys(v for plugin, _ in chain for v in plugin.prefetch_vars))
        return cls(
            tuple(chain),
            names,
            any(plugin.prefetch_body for plugin, _ in chain),
            any(plugin.filters_responses() for plugin, _ in chain),
        )


ConfKey = tuple[str, tuple[tuple[str, str | None], ...]]


@dataclass
class ConfCache:
    """Tokens in the order they were handed out or renewed; with one TTL that is also the order
    they expire in, so expiry and the size cap only ever look at the oldest entry."""

    ttl_s: float = field(default_factory=default_ttl)
    clock: Callable[[], float] = time.monotonic
    max_entries: int = 20_000
    _entries: OrderedDict[int, tuple[float, PreparedConf, ConfKey | None]] = field(
        default_factory=OrderedDict
    )
    _by_key: dict[ConfKey, int] = field(default_factory=dict)
    _next: int = 0

    def renew(self, key: ConfKey) -> int | None:
        """The live token already handed out for ``key``, its life renewed; None if there is none."""
        token = self._by_key.get(key)
        entry = self._entries.get(token) if token is not None else None
        if token is None or entry is None or entry[0] < self.clock():
            return None
        self._entries[token] = (self.clock() + self.ttl_s, entry[1], key)
        self._entries.move_to_end(token)
        return token

    def put(self, conf: PreparedConf, key: ConfKey | None = None) -> int:
        now = self.clock()
        self._evict(now)
        self._next = (self._next + 1) & 0xFFFFFFFF or 1
        self._drop(self._next)
        self._entries[self._next] = (now + self.ttl_s, conf, key)
        if key is not None:
            self._by_key[key] = self._next
        return self._next

    def get(self, token: int) -> PreparedConf | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        if entry[0] < self.clock():
            self._drop(token)
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, token: int) -> None:
        entry = self._entries.pop(token, None)
        if entry is not None and entry[2] is not None and self._by_key.get(entry[2]) == token:
            del self._by_key[entry[2]]

    def _evict(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest = next(iter(entries))
            if entries[oldest][0] >= now and len(entries) < self.max_entries:
                return
            self._drop(oldest)
