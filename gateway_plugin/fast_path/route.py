"""Spillway's Lua plugins in APISIX: where they live, what APISIX's config.yaml needs for them, and
the fast path's route.

Both routes run Lua shipped in this package: ``spillway-edge`` on the ext-plugin route, ``spillway``
on the fast path. The fast route has the same upstreams as the ext-plugin route (``apisix_route``)
and the same route-level overrides, but the decision is made by the Lua plugin from the runner's
decision table, which also sends each request to its upstream (no traffic-split) and reports
outcomes itself (no ext-plugin-pre-req, no http-logger).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway_plugin.apisix_route import RouteError, observers, route, target_upstream
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.contract import PLUGIN, SHARED_DICT

LUA_DIR = Path(__file__).resolve().parent / "lua"
# APISIX sends SNI (the node's host) and names the trusted CAs, but verifies no HTTP upstream's
# certificate unless nginx is told to: without it anyone on the path to a function URL reads and
# changes what goes there. The name checked is the node's host (proxy_ssl_name $upstream_host).
VERIFY_UPSTREAM_TLS = "proxy_ssl_verify on;\nproxy_ssl_verify_depth 4;\n"
# Where APISIX's own prometheus plugin exports (its default, named so that no one guesses).
APISIX_EXPORTER = {"ip": "127.0.0.1", "port": 9091}


def lua_path() -> Path:
    """The directory to name in ``apisix.extra_lua_path`` (``<dir>/?.lua``): it holds
    ``apisix/plugins/spillway.lua`` and ``spillway-edge.lua``."""
    return LUA_DIR


def fast_route(
    config: SpillwayConfig,
    token: bytes,
    route_id: str = "spillway-fast",
    uri: str = "/v2/*",
    overrides: dict[str, Any] | None = None,
    auth: str | None = None,
    prometheus: bool = False,
) -> dict[str, Any]:
    """The route object for the fast path. The plugin sends a cloud decision to its target's
    upstream itself (``upstreams`` in its conf: traffic-split's per-request work cost more than
    the decision), so invoke-mode targets (which the runner itself calls) stay on the ext-plugin
    route: when the config has some, the route's chain names only the upstream-mode ones
    (``invoke_targets`` says which were left out), and the plugin never picks an invoke-mode
    target a rule names."""
    made = route(config, token, route_id, uri, auth=auth)
    conf = dict(overrides or {})
    upstream_targets = [t for t in config.targets if t.mode == "upstream"]
    if invoke_targets(config) and "targets" not in conf:
        conf["targets"] = [t.name for t in upstream_targets]
    if upstream_targets:
        conf["upstreams"] = {t.name: target_upstream(t) for t in upstream_targets}
    # The plugin decides in the access phase, after authentication at its own priority.
    plugins: dict[str, Any] = {auth: {}} if auth is not None else {}
    plugins[PLUGIN] = conf
    plugins |= observers(config, prometheus)
    return {**made, "name": "triton-with-spillway-fast-path", "plugins": plugins}


def invoke_targets(config: SpillwayConfig) -> list[str]:
    return [t.name for t in config.targets if t.mode == "invoke"]


def config_snippet(config: SpillwayConfig) -> dict[str, Any]:
    """What APISIX's config.yaml needs for Spillway's routes (either kind): the plugins' path, their
    shared dict, where the runner serves its table (``outcomes.listen``), the variables nginx must
    pass through (the route token's, every target's signing key's and the shared store's user and
    password's; names only), verified TLS
    to the functions, and the DNS discovery of the on-prem members where the config has one."""
    if not config.outcomes.listen:
        raise RouteError("outcomes.listen is null: the fast path fetches its table from that endpoint")
    exporter = f"{APISIX_EXPORTER['ip']}:{APISIX_EXPORTER['port']}"
    for name, listen in (
        ("metrics.listen", config.metrics.listen),
        ("outcomes.listen", config.outcomes.listen),
    ):
        if listen == exporter:
            raise RouteError(
                f"{name} is {listen}, where APISIX's prometheus plugin exports (plugin_attr.prometheus."
                "export_addr): one of them would not start; give the runner another port"
            )
    keys = [t.signing_key_env for t in config.targets if t.signing_key_env]
    shared = config.shared_state
    keys += [name for name in (shared.username_env, shared.password_env) if name] if shared else []
    dns = config.local.discovery.dns
    discovery: dict[str, Any] = {}
    if dns is not None:
        asked = {"servers": [dns.resolver]} if dns.resolver else {"resolv_conf": "/etc/resolv.conf"}
        # The route's on-prem upstream resolves the members the runner scrapes, from the same server.
        discovery = {"discovery": {"dns": asked}}
    return discovery | {
        "apisix": {
            "extra_lua_path": f"{lua_path()}/?.lua",
            # The CAs a function's certificate must chain to ("system": the OS bundle; else a path).
            "ssl": {"ssl_trusted_certificate": "system"},
        },
        "nginx_config": {
            "envs": list(dict.fromkeys([config.runner.route_token_env, *keys])),
            "http": {"custom_lua_shared_dict": {SHARED_DICT: "10m"}},
            "http_server_location_configuration_snippet": VERIFY_UPSTREAM_TLS,
        },
        "plugin_attr": {
            PLUGIN: {"runner": config.outcomes.listen, "token_env": config.runner.route_token_env},
            # APISIX's own metrics (apisix-route --prometheus), clear of the runner's metrics.listen.
            "prometheus": {"export_addr": dict(APISIX_EXPORTER)},
        },
    }
