"""The fast path on a real Apache APISIX 3.18: the ``spillway`` Lua plugin deciding from the
runner's decision table, the route made by ``fast_route``, and what clients see."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest
import yaml

from devtools.legacy_fast_route import split_fast_route
from functions.signature import Verifier
from gateway_plugin.books.target_header import target_value
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from testing.apisix import Stack, StackStarter, needs_apisix
from testing.budget import clear_of_the_hours_end
from testing.http import settled, wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)
# Given to APISIX's environment only: the tests' own process keeps no signing key.
SIGNING_KEY = "fast-path-signing-key-0123456789abcdef"


def routes_for(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The fast route, one that keeps every request home and one without the decision header."""
    validated = SpillwayConfig.model_validate(config)
    routes = (
        fast_route(validated, TOKEN),
        fast_route(validated, TOKEN, "on-prem-only", "/onprem/*", {"on_prem_only": True}),
        fast_route(validated, TOKEN, "quiet", "/quiet/*", {"decision_header": False}),
    )
    return [yaml.safe_load(yaml.safe_dump(r)) for r in routes]


def other_layouts(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The aws function named by host (APISIX's resolver reads /etc/hosts: localhost is 127.0.0.1),
    a route made before the plugin set upstreams itself (traffic-split picks by the target's value),
    and one naming a target it has no upstream for (refused with the route)."""
    aws, *others = config["targets"]
    by_name = {**config, "targets": [{**aws, "url": aws["url"].replace("127.0.0.1", "localhost")}, *others]}
    named = fast_route(SpillwayConfig.model_validate(by_name), TOKEN, "named", "/named/*")
    validated = SpillwayConfig.model_validate(config)
    legacy = split_fast_route(validated, TOKEN, "legacy", "/legacy/*")
    broken = fast_route(validated, TOKEN, "broken", "/broken/*", {"targets": ["aws"]})
    broken["plugins"]["spillway"]["upstreams"] = {}
    return [yaml.safe_load(yaml.safe_dump(r)) for r in (named, legacy, broken)]


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Stack:
    config = module_stand_ins.config("SPILLWAY_SIGNING_KEY")
    routes = [*routes_for(config), *other_layouts(config)]
    return module_apisix_stack(
        config, routes, fast_path=True, signing_key=SIGNING_KEY, attr={"stale_after_s": 0.5}
    )


def test_the_plugin_decides_from_the_table_and_keeps_sensitive_requests_home(stack: Stack) -> None:
    stack.set_load(0)
    calm = stack.send("public")
    assert calm["upstream"] == "local" and stack.decision(calm) == "local;local_ok"
    stack.set_load(500)
    public = stack.send("public")
    assert public["upstream"] == "aws" and stack.decision(public) == "aws;overflow_cold"
    seen = public["headers"]
    # The decision stays at the gateway (the plugin set the upstream itself).
    assert "x-spillway-target" not in seen and seen["x-spillway-signature"].startswith("t=")
    for classification in ("confidential", "secret", None):
        for value in (AWS, "aws", "local"):
            answer = stack.send(classification, **{"x-spillway-target": value})
            assert answer["upstream"] == "local", (classification, value, answer)
            assert stack.decision(answer).startswith("local;residency"), answer
    on_prem = stack.send("public", path="/onprem/models/add_sub/infer")
    assert on_prem["upstream"] == "local" and stack.decision(on_prem) == "local;residency", on_prem


def test_functions_named_by_host_or_picked_by_traffic_split_are_reached_and_no_upstream_is_refused(
    stack: Stack,
) -> None:
    stack.set_load(500)
    for path in ("/named/models/add_sub/infer", "/legacy/models/add_sub/infer"):
        answer = stack.send("public", path=path)
        assert answer["upstream"] == "aws" and stack.decision(answer).startswith("aws;"), (path, answer)
        assert answer["headers"]["x-spillway-signature"].startswith("t="), answer
        assert stack.decision(stack.send("secret", path=path)).startswith("local;residency")
    assert stack.send("public", path="/broken/models/add_sub/infer")["status"] == 404
    assert "targets names aws but upstreams has no aws" in stack.gateway.error_log()


def test_a_route_can_leave_the_decision_header_out(stack: Stack) -> None:
    stack.set_load(500)
    quiet = stack.send("public", path="/quiet/models/add_sub/infer")
    assert quiet["upstream"] == "aws" and "x-spillway-decision" not in quiet["answer_headers"], quiet
    assert stack.decision(stack.send("public")).startswith("aws;")


def test_the_signature_made_in_lua_verifies_at_the_function(stack: Stack) -> None:
    stack.set_load(500)
    key = SIGNING_KEY.encode()
    verifier = Verifier(key, allow_unsigned_payload=True)
    for path in (
        "/v2/models/add_sub/infer",
        "/v2/models/add_sub/infer?b=2&a=x+y&c&a=%2F",
        "/v2//models/a%20b/./infer",
    ):
        answer = stack.send("public", path=path)
        assert answer["upstream"] == "aws", answer
        verifier.verify(answer["headers"]["x-spillway-signature"], "POST", answer["path"], b"{}", time.time())


def test_a_stale_table_keeps_everything_local_and_sheds_when_the_last_table_said_saturated(
    stack: Stack,
) -> None:
    """The runner dies (APISIX respawns it after 3 s): once the table is older than stale_after_s
    (0.5 s here), no request goes out, whatever its class; local saturation per the last table sheds."""
    for queue_ms, want in ((500, "local;table_stale"), (5000, "shed;table_stale+local_saturated")):
        stack.feed.queue_ms = queue_ms
        wait_until(lambda: stack.decision(stack.send("public")).startswith("aws;"), 30, "overflow to aws")
        # The runner's gauge (refreshed every second) trails the tables the plugin fetches.
        wait_until(lambda q=queue_ms: stack.local_wait_s() >= q / 1000, 30, "the runner's estimate")
        runner = stack.gateway.runner_pids()[-1]
        os.kill(runner, signal.SIGKILL)
        wait_until(lambda w=want: stack.decision(stack.send("public")) == w, 10, want)
        while stack.gateway.runner_pids()[-1] == runner:
            answer = stack.send("public")
            assert answer.get("upstream") != "aws" and stack.decision(answer) == want, answer
            time.sleep(0.05)
        wait_until(
            lambda: stack.decision(stack.send("public")).startswith("aws;"),
            30,
            "the respawned runner's table",
        )
    failsafe = re.search(r"spillway_fast_path_fail_safe_total ([0-9.e+]+)", stack.metrics())
    assert failsafe and float(failsafe.group(1)) > 0


def test_a_respawned_runner_counts_the_nodes_spend_from_the_table_it_holds(stack: Stack) -> None:
    """The plugin's spend counters run from nginx's start, across runners. A runner that APISIX
    respawned counts a node's spend from the marks of the table the node holds (what the dead one
    had taken in), so the hour's budget holds what was spent since, not all the node ever spent
    (which would stop every burst until the hour rolled)."""
    clear_of_the_hours_end()
    stack.set_load(500)
    before = _settled_spend(stack)
    assert all(stack.send("public")["upstream"] == "aws" for _ in range(20))
    price = (_settled_spend(stack) - before) / 20
    assert price > 0
    runner = stack.gateway.runner_pids()[-1]
    os.kill(runner, signal.SIGKILL)
    wait_until(lambda: stack.gateway.runner_pids()[-1] != runner, 30, "APISIX respawns the runner")
    sent = []
    wait_until(
        lambda: sent.append(stack.send("public")) or sent[-1].get("upstream") == "aws",
        30,
        "the respawned runner's table",
    )
    spilled = sum(a.get("upstream") == "aws" for a in sent)
    assert _settled_spend(stack) == pytest.approx(spilled * price)


def _settled_spend(stack: Stack) -> float:
    """The runner's hour budget for aws once it stays put (the plugin's counts reach it with the
    next table fetched, every 50 ms, and the gauge is set every second)."""
    series = re.compile(r'^spillway_target_spent_usd\{target="aws",window="hour"\} (\S+)$', re.M)

    def now() -> float:
        found = series.search(stack.metrics())
        return float(found.group(1)) if found else 0.0

    return settled(now)


def test_outcomes_reach_the_runner_spend_is_counted_and_failures_open_the_breaker(stack: Stack) -> None:
    stack.set_load(500)
    stack.send("public")
    wait_until(
        lambda: 'spillway_decisions_total{reason="overflow_cold",target="aws"}' in stack.metrics(),
        10,
        "decisions counted",
    )
    assert re.search(r'spillway_cloud_spend_usd_total\{target="aws"\} [0-9.e-]+', stack.metrics())
    stack.aws.status = 502
    try:
        wait_until(
            lambda: stack.decision(stack.send("public")) == "local;no_target", 30, "the aws breaker open"
        )
    finally:
        stack.aws.status = 200
