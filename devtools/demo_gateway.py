"""The demo's gateway: the development gateway or a real APISIX, and what APISIX's logs tell."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from devtools import apisix
from devtools.demo_report import FEEDBACK_S
from functions.sidecar import free_port
from gateway_plugin.apisix_fast_route import config_snippet
from gateway_plugin.apisix_route import route, standalone_yaml
from gateway_plugin.config import SpillwayConfig

EXAMPLE_APISIX_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "apisix" / "config.yaml"


def start_gateway(
    gateway: str,
    out_dir: Path,
    stack: contextlib.ExitStack,
    config: SpillwayConfig,
    config_path: Path,
    env: dict[str, str],
    port: int,
    step: Callable[[str], None],
) -> dict[str, Any]:
    """The development gateway (which starts the runner itself), or a real APISIX with the route
    ``python -m gateway_plugin apisix-route`` makes (spillway-edge, ext-plugin-pre-req, traffic-split
    on the edge's variable, http-logger to the runner), the runner as its ext-plugin.cmd and the
    example config's plugins. Returns what the report says of it."""
    if gateway == "dev":
        step(f"starting the Spillway runner and the development gateway on 127.0.0.1:{port}")
        cmd = [sys.executable, "-m", "devtools", "devgateway", "--config", str(config_path)]
        wait_port(port, stack.enter_context(process(cmd, env, out_dir / "gateway.log")), 60)
        label = "the development gateway (a stand-in for APISIX)"
        return {"name": "dev", "label": label, "feedback_s": FEEDBACK_S["dev"]}
    home = apisix.prefix() / "apisix"
    found = re.search(r'VERSION = "([^"]+)"', _read(home / "apisix" / "core" / "version.lua"))
    label = f"Apache APISIX {found.group(1) if found else ''} (the runner as its ext-plugin)"
    step(f"starting {label} on 127.0.0.1:{port}")
    snippet = config_snippet(config)
    # APISIX's own exporter on a port of its own (the example's 9091 may be taken here), every second.
    exporter = {"ip": "127.0.0.1", "port": free_port()}
    attr = {**snippet["plugin_attr"], "prometheus": {"export_addr": exporter, "refresh_interval": 1}}
    made = route(config, os.environ["SPILLWAY_ROUTE_TOKEN"].encode(), prometheus=True)
    settings = apisix.ApisixSettings(
        port=port,
        routes_yaml=standalone_yaml(made),
        runner_cmd=[sys.executable, "-m", "gateway_plugin", "run", "--config", str(config_path)],
        plugins=list(yaml.safe_load(EXAMPLE_APISIX_CONFIG.read_text())["plugins"]),
        envs=["SPILLWAY_ROUTE_TOKEN", "SPILLWAY_SIGNING_KEY"],
        shared_dicts=snippet["nginx_config"]["http"]["custom_lua_shared_dict"],
        plugin_attr=attr,
    )
    # Registered before APISIX starts: copied once it has quit (and flushed its buffered logs).
    for name, kept in (("error.log", "gateway.log"), ("access.log", "apisix-access.log")):
        stack.callback(_keep, home / "logs" / name, out_dir / kept)
    stack.enter_context(apisix.running(settings))
    return {
        "name": "apisix",
        "label": label,
        "feedback_s": float(config.outcomes.batch_s),
        "exporter": f"127.0.0.1:{exporter['port']}",
    }


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _keep(log: Path, copy: Path) -> None:
    copy.write_text(_read(log))


# APISIX's default access log: ... "$request" $status $body_bytes_sent $request_time "$http_referer"
# "$http_user_agent" $upstream_addr $upstream_status $upstream_response_time ...
_ACCESS_LINE = re.compile(
    r'"POST /v2/models/\S+ [^"]*" \d+ \d+ \S+ "[^"]*" "[^"]*" (?P<addr>\S+) \S+ (?P<seconds>[\d.]+) '
)


def cluster_times(samples: list[dict[str, Any]], access_log: Path, triton_port: int) -> str:
    """Give local samples the cluster's answer time APISIX logged ($upstream_response_time), as the
    development gateway's header gives it: on-prem lines in the order APISIX logged them, local
    samples in the order their answers came back (the cluster answers one at a time)."""
    lines = (m for m in map(_ACCESS_LINE.search, _read(access_log).splitlines()) if m is not None)
    times = [float(m["seconds"]) * 1000 for m in lines if m["addr"] == f"127.0.0.1:{triton_port}"]
    local = [x for x in samples if x["target"] == "local"]
    local.sort(key=lambda x: x["sent_at"] + x["latency_s"])
    if len(times) != len(local):
        return f"not matched: {len(times)} on-prem lines in APISIX's access log, {len(local)} local answers"
    for sample, ms in zip(local, times, strict=True):
        sample["upstream_ms"] = ms
    return f"from APISIX's access log ({len(times)} on-prem lines)"


@contextlib.contextmanager
def process(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"a demo process exited early (status {proc.returncode}); see its log")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        return False

    wait_for(up, timeout_s)


def wait_for(check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the demo did not get ready within {timeout_s:g} s")
        time.sleep(0.1)
