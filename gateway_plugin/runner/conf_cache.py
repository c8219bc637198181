"""Parsed plugin confs under the tokens handed to APISIX.

Each PrepareConf is validated and prepared once; every request then finds its plugin chain by
token. Entries outlive APISIX's own token cache (``APISIX_CONF_EXPIRE_TIME``, 3600 s by default)
by 20 %, so APISIX always refreshes before a token here expires; an expired or unknown token is
answered with CONF_TOKEN_NOT_FOUND and APISIX prepares again.
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
TTL_FACTOR = 1.2


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


@dataclass
class ConfCache:
    """Tokens in the order they were handed out; with one TTL that is also the order they expire
    in, so expiry and the size cap only ever look at the oldest entry."""

    ttl_s: float = field(default_factory=default_ttl)
    clock: Callable[[], float] = time.monotonic
    max_entries: int = 20_000
    _entries: OrderedDict[int, tuple[float, PreparedConf]] = field(default_factory=OrderedDict)
    _next: int = 0

    def put(self, conf: PreparedConf) -> int:
        now = self.clock()
        self._evict(now)
        self._next = (self._next + 1) & 0xFFFFFFFF or 1
        self._entries.pop(self._next, None)
        self._entries[self._next] = (now + self.ttl_s, conf)
        return self._next

    def get(self, token: int) -> PreparedConf | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        if entry[0] < self.clock():
            del self._entries[token]
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest = next(iter(entries))
            if entries[oldest][0] >= now and len(entries) < self.max_entries:
                return
            entries.popitem(last=False)
