"""``local.thresholds`` on a real Apache APISIX 3.18, on both paths (the fast path's Lua plugin
deciding from the runner's table, and the ext-plugin route the runner decides itself): a GPU whose
memory is past its limit spills public traffic on a queue that is empty, keeps it out while between
its limits, and brings it home below the exit limit. Sensitive requests stay home throughout.

The GPU gauges come from the loopback metrics feed in Triton's format: a real tritonserver exports
``nv_gpu_*`` only with a GPU, and this machine has none."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import Stack, StackStarter, needs_apisix
from testing.http import wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
FAST_HOST = "fast.test"
PATHS = {"ext-plugin": {}, "fast": {"host": FAST_HOST}}


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Stack:
    module_stand_ins.feed.gpu_memory_share = 0.5
    config = module_stand_ins.config()
    config["local"]["thresholds"] = {"gpu_memory": {"limit": 0.9, "exit": 0.7}}
    parsed = SpillwayConfig.model_validate(config)
    fast = fast_route(parsed, TOKEN)
    fast["host"] = FAST_HOST
    routes = [yaml.safe_load(yaml.safe_dump(r)) for r in (route(parsed, TOKEN), fast)]
    return module_apisix_stack(config, routes, fast_path=True)


def _gpu_memory_seen(stack: Stack) -> float | None:
    found = re.search(
        r'spillway_local_threshold_value\{threshold="gpu_memory"\} ([0-9.e+-]+)', stack.metrics()
    )
    return float(found.group(1)) if found else None


def _set_memory(stack: Stack, share: float) -> None:
    """The GPU's memory share as the feed serves it, once the runner has scraped it."""
    stack.feed.gpu_memory_share = share
    wait_until(lambda: _gpu_memory_seen(stack) == share, 30, f"the runner reads GPU memory {share}")


def _decisions(stack: Stack, classification: str | None = "public") -> dict[str, str]:
    return {path: stack.decision(stack.send(classification, **h)) for path, h in PATHS.items()}


def _decision(stack: Stack, path: str) -> str:
    return stack.decision(stack.send("public", **PATHS[path]))


SPILLED = ("aws;overflow_cold", "aws;overflow_warm")  # warm once the function has answered


@pytest.mark.parametrize("first", list(PATHS))
def test_gpu_memory_past_its_limit_spills_public_traffic_on_both_paths_and_home_below_exit(
    stack: Stack, first: str
) -> None:
    """Each path on its own sees the limit crossed (the paths share the cluster's overflow state,
    so the one asked first must enter it itself), then both hold it between the limits and leave
    it below the exit limit."""
    stack.feed.queue_ms = 0
    _set_memory(stack, 0.5)
    calm = {path: "local;local_ok" for path in PATHS}
    wait_until(lambda: _decisions(stack) == calm, 30, "both paths local while the GPU has room")

    _set_memory(stack, 0.95)
    wait_until(lambda: _decision(stack, first) in SPILLED, 30, f"the {first} path spills past the limit")
    # The other path reads the overflow state from its table or the runner's next snapshot.
    wait_until(lambda: all(d in SPILLED for d in _decisions(stack).values()), 10, "both paths spilling")
    for classification in ("confidential", None):
        kept = _decisions(stack, classification)
        assert all(d.startswith("local;residency") for d in kept.values()), kept

    # Between the limits (0.7 < 0.8 < 0.9) on a calm queue: the cluster keeps overflowing.
    _set_memory(stack, 0.8)
    for _ in range(10):
        assert _decision(stack, "fast") in SPILLED and _decision(stack, "ext-plugin") in SPILLED

    _set_memory(stack, 0.6)
    wait_until(lambda: _decisions(stack) == calm, 30, "both paths home below the exit limit")
    answer = stack.send("public", host=FAST_HOST)
    assert answer["upstream"] == "local", answer
