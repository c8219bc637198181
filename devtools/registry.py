"""The plugins a runner serves, by the name a route's conf uses."""

from __future__ import annotations

from typing import Any

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.plugin import Plugin


def default_plugins(config: SpillwayConfig | None = None) -> dict[str, Plugin[Any]]:
    """The shipped plugins for a config (defaults when none): ``spillway`` and ``headers``."""
    from gateway_plugin.app import RunnerApp

    return RunnerApp(config or SpillwayConfig()).plugins
