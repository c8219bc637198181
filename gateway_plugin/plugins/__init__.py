"""Plugins shipped with the runner, and the operator's own, named in ``runner.plugins``."""

from __future__ import annotations

import importlib
from typing import Any

from gateway_plugin.config import ConfigError
from gateway_plugin.plugin import Plugin


def load_plugin(spec: str) -> Plugin[Any]:
    """An instance of the ``Plugin`` subclass ``spec`` names (``module:Class``, no arguments);
    raises ``ConfigError`` saying what is wrong with it."""
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"runner.plugins: cannot import {module_name!r} ({exc}); install the package that holds it "
            "in the runner's Python environment"
        ) from None
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Plugin)):
        raise ConfigError(
            f"runner.plugins: {spec!r} is not a subclass of gateway_plugin.plugin.Plugin; a plugin "
            "class sets name and config_model and defines request_filter or response_filter"
        )
    if not isinstance(getattr(found, "name", None), str):
        raise ConfigError(f"runner.plugins: {spec!r} sets no name, which routes' ext-plugin conf would use")
    return found()


def runner_plugins(shipped: list[Plugin[Any]], specs: list[str]) -> dict[str, Plugin[Any]]:
    """Every plugin by the name a route's conf uses; two of one name are refused, not shadowed."""
    plugins: dict[str, Plugin[Any]] = {}
    for plugin in [*shipped, *(load_plugin(spec) for spec in specs)]:
        if plugin.name in plugins:
            raise ConfigError(
                f"runner.plugins: two plugins are named {plugin.name!r}; rename one (a route's conf "
                "picks a plugin by its name)"
            )
        plugins[plugin.name] = plugin
    return plugins
