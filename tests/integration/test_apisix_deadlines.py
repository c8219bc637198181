"""Deadlines and priorities (``admission:``) on a real Apache APISIX 3.18, on both paths (the fast
path's Lua plugin deciding from the runner's table, and the ext-plugin route the runner decides
itself): a request the cluster cannot answer in time and that may not leave is answered 503 with
Retry-After at once, one that may leave goes out instead, a sheddable one without a deadline is
refused once the cluster would miss its latency target, a critical one keeps queueing, and a
deadline or priority that says neither is refused with 400 naming the headers.

The cluster's queue comes from the loopback metrics feed in Triton's format, so the load is the
same on every run."""

from __future__ import annotations

import json
import os
from typing import Any

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
DEADLINE, PRIORITY = "x-request-deadline-s", "x-request-priority"


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Stack:
    config = module_stand_ins.config()
    parsed = SpillwayConfig.model_validate(config)
    fast = fast_route(parsed, TOKEN)
    fast["host"] = FAST_HOST
    routes = [yaml.safe_load(yaml.safe_dump(r)) for r in (route(parsed, TOKEN), fast)]
    return module_apisix_stack(config, routes, fast_path=True)


def _send(stack: Stack, path: str, classification: str, **headers: str) -> dict[str, Any]:
    return stack.send(classification, **PATHS[path], **headers)


def _decided(stack: Stack, path: str, classification: str, **headers: str) -> str:
    return stack.decision(_send(stack, path, classification, **headers))


def _all_at_once(stack: Stack, path: str, cases: list[tuple[str, dict[str, str], str]], load: str) -> None:
    """Every case decided as expected in one round of requests (bounded at 30 s). The estimate
    moves between scrapes: each takes off what the cluster has finished since the last one, so a
    round is asked for again until one falls where the scrape's queue holds."""
    rounds: list[list[str]] = []

    def one_round() -> bool:
        got = [_decided(stack, path, cls, **headers) for cls, headers, _ in cases]
        rounds.append(got)
        return all(d.startswith(want) for d, (_, _, want) in zip(got, cases, strict=True))

    wait_until(one_round, 30, f"decisions on {load} (last rounds: {rounds[-3:]})")


@pytest.mark.parametrize("path", list(PATHS))
def test_a_request_that_cannot_be_answered_in_time_is_refused_at_once_or_goes_out(
    stack: Stack, path: str
) -> None:
    """A queue short of the latency target (nothing spills) but longer than a tight deadline."""
    stack.set_load(140)
    tight = {DEADLINE: "0.03"}
    cases = [
        ("confidential", tight, "shed;deadline"),
        ("public", tight, "aws;"),  # may leave: goes out to meet it
        ("public", {}, "local;local_ok"),
        ("confidential", {DEADLINE: "10"}, "local;local_ok"),
        ("public", {DEADLINE: " 2.5 ", PRIORITY: "Sheddable"}, "local;local_ok"),
    ]
    _all_at_once(stack, path, cases, "a short queue")
    shed = _send(stack, path, "confidential", **{DEADLINE: "0.001"})
    assert shed["status"] == 503 and stack.decision(shed) == "shed;deadline", shed
    assert shed["answer_headers"].get("retry-after") == "1", shed
    stack.set_load(0)


@pytest.mark.parametrize("path", list(PATHS))
def test_on_a_busy_cluster_sheddable_requests_are_refused_first_and_critical_ones_queue(
    stack: Stack, path: str
) -> None:
    """Past the latency target but short of saturation: what cannot leave still queues, unless it
    is sheddable (its deadline is the target) or its own deadline is shorter than the wait."""
    stack.set_load(600)
    cases = [
        ("confidential", {}, "local;residency"),
        ("confidential", {PRIORITY: "critical"}, "local;residency"),
        ("confidential", {PRIORITY: "sheddable"}, "shed;deadline"),
        ("confidential", {PRIORITY: "sheddable", DEADLINE: "30"}, "local;residency"),
        ("confidential", {DEADLINE: "0.1"}, "shed;deadline"),
        ("public", {PRIORITY: "sheddable"}, "aws;"),
    ]
    _all_at_once(stack, path, cases, "a long queue")
    stack.set_load(0)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    ("header", "value"), [(DEADLINE, "soon"), (DEADLINE, "-1"), (DEADLINE, "1e3"), (PRIORITY, "urgent")]
)
def test_a_deadline_or_priority_that_says_neither_is_refused_naming_the_headers(
    stack: Stack, path: str, header: str, value: str
) -> None:
    answer = _send(stack, path, "public", **{header: value})
    assert answer["status"] == 400, answer
    assert stack.decision(answer) == "shed;admission_invalid", answer
    error = answer["error"]
    assert DEADLINE in error and PRIORITY in error and "critical or sheddable" in error, json.dumps(error)
    assert "retry-after" not in answer["answer_headers"], answer
