"""Several APISIX nodes in APISIX's traditional deployment, on one machine: one etcd holds the
routes, each node is a copy of the installed APISIX (``scripts/install-apisix.sh``) with its own
runner as ``ext-plugin.cmd`` and its own ``spillway.yaml``, and the first node serves the Admin API,
through which ``python -m gateway_plugin apisix-route --push`` puts the routes. For the multi-node
tests and the multi-node benchmark.

On one machine the nodes share a loopback, so each runner's outcome endpoint has its own port and
each node gets its own ext-plugin route (``--node-port``: matched by the port the node listens on);
on hosts of their own one route serves every node. The fast path's route needs nothing per node:
each node's ``plugin_attr.spillway.runner`` names its own runner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools import apisix
from devtools.etcd import Etcd
from functions.sidecar import free_port
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import config_snippet

ROOT = Path(__file__).resolve().parent.parent
ADMIN_KEY_ENV = "APISIX_ADMIN_KEY"
FAST_PATH_PLUGINS = ROOT / "examples" / "apisix" / "config-fast-path.yaml"


@dataclass
class Node:
    name: str
    gateway: apisix.Apisix
    config: dict[str, Any]
    config_path: Path

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def port(self) -> int:
        return self.gateway.settings.port

    @property
    def metrics_url(self) -> str:
        return f"http://{self.config['metrics']['listen']}/metrics"


@dataclass
class Nodes:
    etcd: Etcd
    nodes: list[Node]
    admin_url: str
    admin_key: str

    def push(self, node: Node, *args: str) -> str:
        """``apisix-route --config <node's spillway.yaml> ARGS --push <Admin API>``: what it printed."""
        env = {**os.environ, ADMIN_KEY_ENV: self.admin_key}
        done = subprocess.run(
            [
                *(sys.executable, "-m", "gateway_plugin", "apisix-route"),
                *("--config", str(node.config_path), *args, "--push", self.admin_url),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"apisix-route --push failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def push_routes(self, fast_uri: str = "/fast/*") -> None:
        """Each node's ext-plugin route (``/v2/*``, matched on its port) and the fast path's route,
        one for every node (``fast_uri``)."""
        for node in self.nodes:
            self.push(node, "--id", f"spillway-{node.name}", "--node-port", str(node.port))
        self.push(self.nodes[0], "--fast-path", "--id", "spillway-fast", "--uri", fast_uri)


def plugins() -> list[str]:
    """The example fast-path config's plugins (both routes' plugins: the list replaces APISIX's)."""
    return list(yaml.safe_load(FAST_PATH_PLUGINS.read_text())["plugins"])


def node_settings(
    config: dict[str, Any],
    config_path: Path,
    home: Path,
    etcd_url: str,
    admin_port: int | None = None,
    env: dict[str, str] | None = None,
    envs: Sequence[str] = ("SPILLWAY_ROUTE_TOKEN",),
) -> apisix.ApisixSettings:
    """One node on etcd: Spillway's Lua as ``apisix-lua-path --config`` says, its runner as
    ext-plugin.cmd, the Admin API on ``admin_port`` if given (key from ``ADMIN_KEY_ENV``)."""
    snippet = config_snippet(SpillwayConfig.model_validate(config))
    return apisix.ApisixSettings(
        port=free_port(),
        routes_yaml="",
        runner_cmd=[sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)],
        plugins=plugins(),
        envs=list(envs),
        env=env or {},
        shared_dicts=snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
        plugin_attr=snippet["plugin_attr"],
        home=home,
        etcd=etcd_url,
        etcd_prefix="/spillway-nodes",
        admin_port=admin_port,
        admin_key_env=ADMIN_KEY_ENV,
    )


@contextmanager
def nodes_running(
    folder: Path, configs: list[dict[str, Any]], admin_key: str, env: dict[str, str] | None = None
) -> Iterator[Nodes]:
    """etcd and one APISIX node per config (each config its own runner's: its own metrics and
    outcome ports), the first serving the Admin API; no routes yet."""
    base = Path(tempfile.mkdtemp(prefix="spw-nodes-"))  # short: APISIX's sockets live under it
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        etcd = Etcd(folder / "etcd")
        etcd.start()
        stack.callback(etcd.stop)
        admin_port = free_port()
        made = []
        for index, config in enumerate(configs):
            name = "abcdefgh"[index]
            path = folder / f"spillway-{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            first = index == 0
            node_env = {**(env or {}), **({ADMIN_KEY_ENV: admin_key} if first else {})}
            home = apisix.node_prefix(base, index)
            settings = node_settings(config, path, home, etcd.url, admin_port if first else None, node_env)
            gateway = stack.enter_context(apisix.running(settings))
            made.append(Node(name, gateway, config, path))
        yield Nodes(etcd, made, f"http://127.0.0.1:{admin_port}", admin_key)
