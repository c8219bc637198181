"""The ext-plugin runner: APISIX's Unix socket, the dispatch of calls to plugin chains, the conf
cache. It knows plugins only through the public plugin API (``gateway_plugin.plugin``)."""

from gateway_plugin.runner.conf_cache import ConfCache, default_ttl
from gateway_plugin.runner.dispatch import ConfError, ConnectionLimits, Runner
from gateway_plugin.runner.listener import serve, socket_identity, socket_path, unlink_if_ours

__all__ = [
    "ConfCache",
    "ConfError",
    "ConnectionLimits",
    "Runner",
    "default_ttl",
    "serve",
    "socket_identity",
    "socket_path",
    "unlink_if_ours",
]
