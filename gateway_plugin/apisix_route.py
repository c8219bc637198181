"""The APISIX route that puts Spillway in front of a Triton cluster, made from ``spillway.yaml``.

One source for both forms APISIX takes: the Admin API's route object (JSON) and standalone mode's
``apisix.yaml``. The route reads each request once (the ``spillway-edge`` Lua plugin, shipped in
this package), runs the runner (``ext-plugin-pre-req``), sends each decision to its upstream
(``traffic-split``, or APISIX's own ``aws-lambda`` plugin for an IAM-authenticated Lambda, on the
``spillway_upstream`` variable: the runner's decision as the edge put it in the request's context,
which no client can write), and reports what happened (``http-logger`` to the runner's outcome
endpoint).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway_plugin.books import outcomes
from gateway_plugin.books.target_header import target_values
from gateway_plugin.config import SpillwayConfig, Target
from gateway_plugin.fast_path.contract import EDGE_PLUGIN
from gateway_plugin.outcome_listener import PATH as OUTCOME_PATH
from gateway_plugin.request import audit

# The variable the edge (or the fast path's plugin) sets to the decision's target value.
TARGET_VAR = outcomes.UPSTREAM_VAR
# Above the edge's priority (12010): on the ext-plugin route authentication must come first.
AUTH_FIRST = 12020


class RouteError(ValueError):
    """The config cannot be turned into a route (a target without a URL, an unknown target)."""


def route(
    config: SpillwayConfig,
    token: bytes,
    route_id: str = "spillway",
    uri: str = "/v2/*",
    lambda_iam: str | None = None,
    auth: str | None = None,
    overrides: dict[str, Any] | None = None,
    prometheus: bool = False,
) -> dict[str, Any]:
    """The route object; ``lambda_iam`` names an upstream-mode aws_lambda target that APISIX's
    aws-lambda plugin calls with SigV4 (the function URL's AWS_IAM auth) instead of traffic-split;
    ``auth`` the APISIX plugin that authenticates consumers (``key-auth``, ``jwt-auth``, ...): on
    this route it runs before the edge and the runner, which decide in the rewrite phase, so the
    runner is told the consumer (``tenants.source: consumer`` needs one); ``overrides`` the route's
    conf for the runner (``request.spillway.RouteOverrides``: ``content_checks``, ``on_prem_only``, ...);
    ``prometheus`` adds APISIX's own prometheus plugin (its per-route metrics, exported on
    ``plugin_attr.prometheus.export_addr``)."""
    plugins = _authentication(config, auth) | {
        EDGE_PLUGIN: {},
        # Every target the runner may decide has a way out on this route: traffic-split or
        # aws-lambda for upstream mode, the runner's own Stop for invoke mode.
        "ext-plugin-pre-req": {
            "conf": [{"name": "spillway", "value": json.dumps(overrides or {})}],
            "allow_degradation": False,
        },
    }
    plugins |= _ways_out(config, token, lambda_iam, uri)
    if config.outcomes.listen:
        plugins["http-logger"] = _outcome_logger(config, token)
    plugins |= observers(config, prometheus)
    return {
        "id": route_id,
        "uri": uri,
        "name": "triton-with-spillway",
        "plugins": plugins,
        "upstream": _local_upstream(config),
    }


def _authentication(config: SpillwayConfig, auth: str | None) -> dict[str, Any]:
    """The plugin that authenticates consumers, run first; none is refused where the tenant is to
    come from one."""
    if auth is not None:
        return {auth: {"_meta": {"priority": AUTH_FIRST}}}
    if config.tenants.source == "consumer":
        raise RouteError(
            "tenants.source is consumer: name the APISIX plugin that authenticates consumers on this "
            "route with --auth (key-auth, jwt-auth, basic-auth, ...); without one no tenant is known"
        )
    return {}


def _ways_out(config: SpillwayConfig, token: bytes, lambda_iam: str | None, uri: str) -> dict[str, Any]:
    """Where an upstream-mode decision goes: traffic-split's rule for its target value, or
    aws-lambda for the target ``lambda_iam`` names."""
    upstream_targets = [t for t in config.targets if t.mode == "upstream"]
    values = target_values([t.name for t in upstream_targets], token)
    plugins: dict[str, Any] = {}
    split = [t for t in upstream_targets if t.name != lambda_iam]
    if split:
        plugins["traffic-split"] = {"rules": [_split_rule(t, values[t.name]) for t in split]}
    if lambda_iam is not None:
        plugins["aws-lambda"] = _aws_lambda(_target(config, lambda_iam), values[lambda_iam], uri)
    return plugins


def _outcome_logger(config: SpillwayConfig, token: bytes) -> dict[str, Any]:
    """http-logger's conf: each outcome posted to the runner's outcome endpoint, in batches."""
    return {
        "uri": f"http://{config.outcomes.listen}{OUTCOME_PATH}",
        "auth_header": outcomes.auth_header(token),
        "log_format": outcomes.log_format(),
        # A batch goes out when it is full, after inactive_timeout without a new entry, or
        # buffer_duration after its first: under steady traffic only the last one holds.
        "batch_max_size": 1000,
        "inactive_timeout": config.outcomes.batch_s,
        "buffer_duration": config.outcomes.batch_s,
        "timeout": 3,
        "concat_method": "json",
    }


def observers(config: SpillwayConfig, prometheus: bool) -> dict[str, Any]:
    """The plugins that watch a route without changing it: the audit trail's logger (one line per
    request) and APISIX's prometheus plugin."""
    plugins: dict[str, Any] = {}
    if config.audit.logger is not None:
        plugins[config.audit.logger] = audit.logger_conf(config.audit)
    if prometheus:
        plugins["prometheus"] = {"prefer_name": True}
    return plugins


def admin_json(route_object: dict[str, Any]) -> str:
    return json.dumps(route_object, indent=2) + "\n"


def standalone_yaml(route_object: dict[str, Any]) -> str:
    """``conf/apisix.yaml`` for APISIX's standalone (YAML) mode."""
    return yaml.safe_dump({"routes": [route_object]}, sort_keys=False) + "#END\n"


def _target(config: SpillwayConfig, name: str) -> Target:
    target = next((t for t in config.targets if t.name == name), None)
    if target is None or target.mode != "upstream" or target.kind != "aws_lambda":
        raise RouteError(f"--lambda-iam {name!r}: no upstream-mode aws_lambda target of that name")
    return target


def _node(url: str) -> tuple[str, str, str]:
    """(scheme, host:port, host) of a URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RouteError(f"{url!r} is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, f"{parts.hostname}:{port}", parts.hostname


def target_upstream(target: Target) -> dict[str, Any]:
    """The APISIX upstream object of an upstream-mode target: its function URL's origin, sent the
    URL's host."""
    if not target.url:
        raise RouteError(f"target {target.name!r} has no url")
    scheme, node, _ = _node(target.url)
    timeout = max(1, round(target.timeout_s))
    return {
        "name": f"spillway-{target.name}",
        "type": "roundrobin",
        "scheme": scheme,
        "pass_host": "node",
        "nodes": {node: 1},
        "timeout": {"connect": 2, "send": timeout, "read": timeout},
    }


def _split_rule(target: Target, value: str) -> dict[str, Any]:
    return {
        "match": [{"vars": [[TARGET_VAR, "==", value]]}],
        "weighted_upstreams": [{"upstream": target_upstream(target), "weight": 1}],
    }


def _aws_lambda(target: Target, value: str, uri: str) -> dict[str, Any]:
    """The plugin appends the part of the path after the route's prefix to ``function_uri``."""
    prefix = uri.removesuffix("*").rstrip("/")
    return {
        "_meta": {"filter": [[TARGET_VAR, "==", value]]},
        "function_uri": (target.url or "").rstrip("/") + prefix,
        "authorization": {
            "iam": {
                "accesskey": "$env://AWS_ACCESS_KEY_ID",
                "secretkey": "$env://AWS_SECRET_ACCESS_KEY",
                "aws_region": target.region or "us-east-1",
                "service": "lambda",
            }
        },
        "timeout": round(target.timeout_s * 1000),
        "ssl_verify": True,
    }


def _local_upstream(config: SpillwayConfig) -> dict[str, Any]:
    """The on-prem Tritons: the members ``local.discovery.dns`` names, through APISIX's own DNS
    discovery (so the route and the runner's signals follow one membership), or the listed
    endpoints."""
    upstream: dict[str, Any] = {"name": "onprem-triton", "type": "least_conn"}
    dns = config.local.discovery.dns
    if dns is not None:
        if dns.upstream_name is None and dns.record == "SRV":
            raise RouteError(
                f"local.discovery.dns names SRV records ({dns.name}): set its upstream_name to the SRV "
                "name of the inference port (_http._tcp.<service>...) for APISIX's discovery"
            )
        # A request a dead node refuses goes to another (APISIX retries over the nodes it found).
        upstream |= {"discovery_type": "dns", "service_name": dns.upstream_name or f"{dns.name}:{dns.port}"}
    else:
        nodes = {_node(e.url)[1]: 1 for e in config.local.endpoints}
        if not nodes:
            raise RouteError(
                "local.endpoints is empty and local.discovery names no members: the route needs the "
                "on-prem Tritons as its upstream"
            )
        upstream |= {"nodes": nodes, "retries": len(nodes) - 1}
    # The checks take a failing node out of the rotation.
    return upstream | {"timeout": {"connect": 1, "send": 30, "read": 30}, "checks": _LOCAL_CHECKS}


# Triton's own readiness, asked every second while a node fails and every 2 s while it serves;
# and what its answers say (5xx and broken connections count against it).
_LOCAL_CHECKS: dict[str, Any] = {
    "active": {
        "type": "http",
        "http_path": "/v2/health/ready",
        "timeout": 1,
        "healthy": {"interval": 2, "successes": 2},
        "unhealthy": {"interval": 1, "http_failures": 2, "tcp_failures": 2, "timeouts": 2},
    },
    "passive": {
        "healthy": {"http_statuses": [200, 201, 204, 400, 404], "successes": 3},
        "unhealthy": {
            "http_statuses": [500, 502, 503, 504],
            "http_failures": 3,
            "tcp_failures": 2,
            "timeouts": 3,
        },
    },
}
