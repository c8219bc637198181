"""A real Apache APISIX 3.18 for a Spillway config and its routes, the one way the tests and the
benchmarks start one (``gateway_for``), and the ``Stack`` of it with the stand-ins it fronts (``stack``).

The settings are the example config's plugins and Spillway's Lua as ``config_snippet`` says (its
path, shared dict and plugin_attr), the route made from the config unless routes are given, and
the runner as APISIX's ext-plugin.cmd with the route token passed through. One APISIX runs per
install (``SPILLWAY_APISIX_PREFIX``): a second one started while the first runs would collide.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pytest
import yaml

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_route import route, standalone_yaml
from gateway_plugin.books.outcomes import auth_header
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import config_snippet, fast_route, lua_path
from testing.http import http, wait_until
from testing.paths import ROOT, TEST_LUA
from testing.standins import MetricsFeed, StandIns, Upstream

EXAMPLE_CONFIG = ROOT / "examples" / "apisix" / "config.yaml"
# The host the fast path's route answers on where both routes stand on one APISIX.
FAST_HOST = "fast.test"


def needs_apisix() -> pytest.MarkDecorator:
    reason = apisix.missing_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def route_token() -> bytes:
    """The token the tests' runners take (``tests/conftest.py`` sets one)."""
    return os.environ["SPILLWAY_ROUTE_TOKEN"].encode()


def example_plugins() -> list[str]:
    """The plugins list of examples/apisix/config.yaml (a list there replaces APISIX's default)."""
    return list(yaml.safe_load(EXAMPLE_CONFIG.read_text())["plugins"])


def runner_cmd(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)]


def spillway_route(config: dict[str, Any]) -> dict[str, Any]:
    """The route ``python -m gateway_plugin apisix-route`` makes from ``config``."""
    made = route(SpillwayConfig.model_validate(config), route_token())
    return yaml.safe_load(standalone_yaml(made))["routes"][0]  # type: ignore[no-any-return]


def both_routes(config: dict[str, Any], auth: str | None = None) -> list[dict[str, Any]]:
    """The ext-plugin route and the fast path's on ``FAST_HOST``, on one APISIX (``auth``: the
    authentication plugin both routes run first)."""
    validated = SpillwayConfig.model_validate(config)
    token = route_token()
    return [
        route(validated, token, auth=auth),
        {**fast_route(validated, token, auth=auth), "hosts": [FAST_HOST]},
    ]


def content_routes(
    config: dict[str, Any], fast_uri: str = "/v2/models/add_sub/infer"
) -> list[dict[str, Any]]:
    """Both routes asking for content checks: the fast path's on ``fast_uri`` alone, the
    ext-plugin route on every other /v2/ path."""
    validated = SpillwayConfig.model_validate(config)
    checks = {"content_checks": True}
    token = route_token()
    made = [route(validated, token, overrides=checks), fast_route(validated, token, "fast", fast_uri, checks)]
    return [yaml.safe_load(yaml.safe_dump(r)) for r in made]


def apisix_settings(
    config: dict[str, Any],
    tmp: Path,
    port: int,
    routes: list[dict[str, Any]] | None = None,
    *,
    signing_key: str | None = None,
    runner_env: dict[str, str] | None = None,
    **settings: Any,
) -> apisix.ApisixSettings:
    """APISIX with the example config's plugins and Spillway's Lua as ``config_snippet`` says (its
    path, shared dict and plugin_attr; ``attr`` adds to spillway's, ``plugin_attr`` names other
    plugins'), the route made from ``config`` (or ``routes``), and the runner as its
    ext-plugin.cmd with the route token passed through. ``signing_key``: SPILLWAY_SIGNING_KEY
    in APISIX's environment (never this process's) and passed through; ``runner_env``: variables
    the runner's command line sets (as an operator's environment would)."""
    path = tmp / "spillway.yaml"
    path.write_text(yaml.safe_dump(config))
    snippet = config_snippet(SpillwayConfig.model_validate(config))
    attr = {"spillway": {**snippet["plugin_attr"]["spillway"], **settings.pop("attr", {})}}
    command = runner_cmd(path)
    if runner_env:
        command = ["env", *(f"{name}={value}" for name, value in runner_env.items()), *command]
    defaults: dict[str, Any] = {
        "port": port,
        "routes_yaml": yaml.safe_dump({"routes": routes or [spillway_route(config)]}, sort_keys=False),
        "runner_cmd": command,
        "plugins": example_plugins(),
        "envs": ["SPILLWAY_ROUTE_TOKEN"],
        "extra_lua_path": Path(snippet["apisix"]["extra_lua_path"]).parent,
        "shared_dicts": snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
        "plugin_attr": {**attr, **settings.pop("plugin_attr", {})},
        "discovery": snippet.get("discovery"),
    }
    if signing_key is not None:
        defaults["envs"] = ["SPILLWAY_ROUTE_TOKEN", "SPILLWAY_SIGNING_KEY"]
        defaults["env"] = {"SPILLWAY_SIGNING_KEY": signing_key}
    return apisix.ApisixSettings(**{**defaults, **settings})


def gateway_for(
    config: dict[str, Any],
    tmp: Path,
    routes: list[dict[str, Any]] | None = None,
    *,
    fast_path: bool = False,
    **settings: Any,
) -> AbstractContextManager[apisix.Apisix]:
    """APISIX on a free port for ``config`` and ``routes`` (see ``apisix_settings``; ``fast_path``:
    the ``spillway`` plugin enabled too), stopped when the block ends. ``tmp`` holds the runner's
    spillway.yaml."""
    if fast_path:
        settings = {"plugins": [*example_plugins(), "spillway"], **settings}
    return apisix.running(apisix_settings(config, tmp, free_port(), routes, **settings))


def lua_plugin_gateway(
    plugin: str, route_id: str, *, shared_dicts: dict[str, str] | None = None
) -> AbstractContextManager[apisix.Apisix]:
    """APISIX with no runner, serving one of tests/lua's plugins on ``/<plugin>`` (Spillway's Lua
    on its path too), for tests that run the plugin's modules in APISIX itself."""
    test_route = {
        "id": route_id,
        "uri": f"/{plugin}",
        "plugins": {plugin: {}},
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1": 1}},
    }
    settings = apisix.ApisixSettings(
        port=free_port(),
        routes_yaml=json.dumps({"routes": [test_route]}),
        plugins=[plugin],
        extra_lua_path=lua_path(),
        more_lua_paths=[TEST_LUA],
        shared_dicts=shared_dicts or {},
    )
    return apisix.running(settings)


def runner_table(config: dict[str, Any]) -> dict[str, Any]:
    """The decision table the runner of ``config`` serves now, fetched as a node of its own (the
    route token from ``SPILLWAY_ROUTE_TOKEN``, as the stacks' runners have it)."""
    token = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
    headers = {"authorization": auth_header(token), "content-type": "application/json"}
    url = f"http://{config['outcomes']['listen']}/spillway/table"
    status, _, answer = http("POST", url, json.dumps({"node": "probe"}).encode(), headers)
    assert status == 200, answer[:300]
    table: dict[str, Any] = json.loads(answer)
    return table


def metrics_url(config: dict[str, Any]) -> str:
    """Where the runner of ``config`` serves its metrics."""
    return f"http://{config['metrics']['listen']}/metrics"


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

    @classmethod
    def of(cls, made: Stack) -> Self:
        """``made`` as this subclass of ``Stack`` (one that adds ways to ask it)."""
        return cls(made.gateway, made.local, made.aws, made.feed, made.metrics_url)

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


@contextmanager
def stack(
    trio: StandIns,
    config: dict[str, Any],
    tmp: Path,
    routes: list[dict[str, Any]] | None = None,
    *,
    fast_path: bool = False,
    **settings: Any,
) -> Iterator[Stack]:
    """``gateway_for`` ``config`` (made from ``trio.config()``), as a ``Stack`` in front of ``trio``."""
    with gateway_for(config, tmp, routes, fast_path=fast_path, **settings) as running:
        yield Stack(running, trio.local, trio.aws, trio.feed, metrics_url(config))


class StackStarter:
    """Starts a stack in front of one trio, stopped when ``close`` runs: what the ``apisix_stack``
    fixtures hand a test or a module. One only: a second would run on the first one's install."""

    def __init__(self, trio: StandIns, tmp: Path) -> None:
        self.stand_ins = trio
        self.tmp = tmp
        self._running = ExitStack()
        self._started: Stack | None = None

    def __call__(
        self,
        config: dict[str, Any],
        routes: list[dict[str, Any]] | None = None,
        *,
        fast_path: bool = False,
        **settings: Any,
    ) -> Stack:
        """``stack`` for ``config`` and ``routes`` in ``tmp`` (the runner's spillway.yaml there)."""
        if self._started is not None:
            raise RuntimeError("this starter's stack still runs: one APISIX per install at a time")
        made = stack(self.stand_ins, config, self.tmp, routes, fast_path=fast_path, **settings)
        self._started = self._running.enter_context(made)
        return self._started

    def close(self) -> None:
        self._started = None
        self._running.close()
