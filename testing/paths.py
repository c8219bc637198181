"""Where the checkout keeps what the harness starts things from."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Captured event shapes, the tests' own models and Lua plugins: test data, kept beside the tests.
EVENTS = ROOT / "tests" / "events"
TEST_MODELS = ROOT / "tests" / "model_repository"
TEST_LUA = ROOT / "tests" / "lua"
EXAMPLE_MODELS = ROOT / "examples" / "model_repository"


def tool(name: str) -> Path:
    """A real third-party binary fetched by ``scripts/fetch-tools.sh``."""
    root = Path(os.environ.get("SPILLWAY_TOOLS", ROOT / ".cache" / "tools"))
    path = root / "bin" / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run 'bash scripts/fetch-tools.sh' first")
    return path
