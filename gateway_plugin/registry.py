"""The plugins this runner serves, by the name a route's conf uses."""

from __future__ import annotations

from typing import Any

from gateway_plugin.plugin import Plugin
from gateway_plugin.plugins.headers import HeadersPlugin


def default_plugins() -> dict[str, Plugin[Any]]:
    plugins: list[Plugin[Any]] = [HeadersPlugin()]
    return {p.name: p for p in plugins}
