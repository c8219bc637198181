"""A real Apache APISIX 3.18 for the tests: its settings for a Spillway config (the route made
from it, the runner as its ext-plugin), and the ``Stack`` of it with the stand-ins it fronts."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_route import route, standalone_yaml
from gateway_plugin.config import SpillwayConfig
from testing.http import http, wait_until
from testing.paths import ROOT
from testing.standins import MetricsFeed, Upstream

EXAMPLE_CONFIG = ROOT / "examples" / "apisix" / "config.yaml"


def needs_apisix() -> pytest.MarkDecorator:
    reason = apisix.missing_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def example_plugins() -> list[str]:
    """The plugins list of examples/apisix/config.yaml (a list there replaces APISIX's default)."""
    return list(yaml.safe_load(EXAMPLE_CONFIG.read_text())["plugins"])


def runner_cmd(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)]


def spillway_route(config: dict[str, Any]) -> dict[str, Any]:
    """The route ``python -m gateway_plugin apisix-route`` makes from ``config``."""
    made = route(SpillwayConfig.model_validate(config), os.environ["SPILLWAY_ROUTE_TOKEN"].encode())
    return yaml.safe_load(standalone_yaml(made))["routes"][0]  # type: ignore[no-any-return]


def fast_path_settings(
    config: dict[str, Any], tmp: Path, port: int, routes: list[dict[str, Any]], **settings: Any
) -> apisix.ApisixSettings:
    """``apisix_settings`` with the fast path's ``spillway`` plugin enabled too."""
    return apisix_settings(
        config, tmp, port, routes=routes, **{"plugins": [*example_plugins(), "spillway"], **settings}
    )


def apisix_settings(
    config: dict[str, Any], tmp: Path, port: int, routes: list[dict[str, Any]] | None = None, **settings: Any
) -> apisix.ApisixSettings:
    """APISIX with the example config's plugins and Spillway's Lua as ``config_snippet`` says (its
    path, shared dict and plugin_attr; ``attr`` adds to the latter), the route made from ``config``
    (or ``routes``), and the runner as its ext-plugin.cmd with the route token passed through."""
    from gateway_plugin.fast_path.route import config_snippet

    path = tmp / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    snippet = config_snippet(SpillwayConfig.model_validate(config))
    defaults: dict[str, Any] = {
        "port": port,
        "routes_yaml": yaml.safe_dump({"routes": routes or [spillway_route(config)]}, sort_keys=False),
        "runner_cmd": runner_cmd(path),
        "plugins": example_plugins(),
        "envs": ["SPILLWAY_ROUTE_TOKEN"],
        "extra_lua_path": Path(snippet["apisix"]["extra_lua_path"]).parent,
        "shared_dicts": snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
        "plugin_attr": {"spillway": {**snippet["plugin_attr"]["spillway"], **settings.pop("attr", {})}},
        "discovery": snippet.get("discovery"),
    }
    return apisix.ApisixSettings(**{**defaults, **settings})


@dataclass
class Stack:
    """One APISIX with a local and an "aws" upstream and the Triton metrics feed its runner scrapes."""

    gateway: apisix.Apisix
    local: Upstream
    aws: Upstream
    feed: MetricsFeed
    metrics_url: str

    def send(
        self, classification: str | None = None, path: str = "/v2/models/add_sub/infer", **headers: str
    ) -> dict[str, Any]:
        sent = {"content-type": "application/json", **headers}
        if classification is not None:
            sent["x-data-classification"] = classification
        status, answer_headers, body = http("POST", self.gateway.url + path, b"{}", sent)
        decoded = json.loads(body) if body.startswith(b"{") else {}
        return {**decoded, "status": status, "answer_headers": answer_headers}

    def decision(self, answer: dict[str, Any]) -> str:
        return str(answer["answer_headers"].get("x-spillway-decision", ""))

    def metrics(self) -> str:
        return http("GET", self.metrics_url)[2].decode()

    def local_wait_s(self) -> float:
        found = re.search(r'spillway_local_wait_seconds\{model="add_sub"\} ([0-9.e+-]+)', self.metrics())
        return float(found.group(1)) if found else 0.0

    def set_load(self, queue_ms: float) -> None:
        """Triton's queue time as the runner will scrape it; wait until a public request shows it."""
        self.feed.queue_ms = queue_ms
        want = "aws;" if queue_ms > 200 else "local;local_ok"
        wait_until(lambda: self.decision(self.send("public")).startswith(want), 30, f"decisions {want}")


def stack_config(
    local: Upstream, aws: Upstream, feed: MetricsFeed, signing_key_env: str | None = None
) -> dict[str, Any]:
    """spillway.yaml for a ``Stack``: one local endpoint, one "aws" target, a tiny tenant quota."""
    return {
        "local": {
            "endpoints": [{"url": local.url, "metrics_url": feed.url}],
            "latency_target_ms": 200,
            "scrape_period_s": 0.1,
            "stale_after_s": 1.0,
        },
        "targets": [
            {
                "name": "aws",
                "kind": "http",
                "url": aws.url,
                "signing_key_env": signing_key_env,
                "cold_start_ms": 0,
                "concurrency_cap": 10_000,
            }
        ],
        "tenants": {"quotas": {"tiny": {"requests_per_minute": 1}}},
        "breaker": {"consecutive_failures": 3, "cooldown_s": 600},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
    }
