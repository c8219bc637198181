"""The runner's state as its edge makes it, and the development gateway as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from functions.sidecar import free_port
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from testing.http import answers, wait_until
from testing.paths import ROOT


def gateway_state(config: SpillwayConfig, **kwargs: Any) -> GatewayState:
    """The runner's state with the secrets this process's environment holds, as its edge reads them."""
    return GatewayState(config, GatewaySecrets.read(config), **kwargs)


@contextmanager
def devgateway(
    config: dict[str, Any], tmp: Path, **env: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m devtools devgateway`` (it starts its own runner) on a free loopback port."""
    port = free_port()
    config = {**config, "devgateway": {**config.get("devgateway", {}), "listen": f"127.0.0.1:{port}"}}
    path = tmp / f"devgateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools", "devgateway", "--config", str(path)],
        cwd=ROOT,
        env={**os.environ, **env},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(url + "/") or proc.poll() is not None, 30, "devgateway listening")
        if proc.poll() is not None:
            raise RuntimeError("the development gateway exited")
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(15)
