"""The APISIX examples under ``examples/apisix``: what ``apisix-route`` makes of
``examples/spillway.yaml``, with the example route token (a placeholder each reader replaces)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "examples" / "apisix"
EXAMPLE_TOKEN = "example-route-token-replace-me"
# Each example file and the apisix-route options that make it.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "route.json": ("--prometheus",),
    "apisix.yaml": ("--prometheus", "--format", "yaml"),
    "route-lambda-iam.json": ("--lambda-iam", "aws", "--id", "spillway-lambda-iam"),
    "route-fast-path.json": ("--fast-path", "--prometheus"),
    "apisix-fast-path.yaml": ("--fast-path", "--prometheus", "--format", "yaml"),
}


def made(*args: str) -> str:
    """What ``python -m gateway_plugin apisix-route --config examples/spillway.yaml ARGS`` prints."""
    return subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "apisix-route", "--config", "examples/spillway.yaml", *args],
        cwd=ROOT,
        env={**os.environ, "SPILLWAY_ROUTE_TOKEN": EXAMPLE_TOKEN},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def files() -> dict[Path, str]:
    """Each example and its text."""
    return {OUT / name: made(*args) for name, args in EXAMPLES.items()}
