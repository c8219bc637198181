"""Spillway on a real Apache APISIX 3.18: the generated route, the runner as ext-plugin.cmd, the
outcome path through http-logger, and what clients see."""

from __future__ import annotations

import os
import re
import secrets
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

from gateway_plugin.books.target_header import target_value
from testing.apisix import Stack, StackStarter, needs_apisix, spillway_route
from testing.http import wait_until
from testing.standins import StandIns

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
AWS = target_value("aws", TOKEN)
VAR_HOST = "var.test"


@pytest.fixture(scope="module")
def stack(module_stand_ins: StandIns, module_apisix_stack: StackStarter) -> Stack:
    config = module_stand_ins.config()
    route = spillway_route(config)
    # A second route reads X-Spillway-Target in its own match (route vars) before the runner
    # sets it: APISIX keeps the client's value in its variable cache (apache/apisix#11325).
    reader = {
        **route,
        "id": "reads-the-target-first",
        "hosts": [VAR_HOST],
        "vars": [["http_x_spillway_target", "!", "==", "never"]],
    }
    return module_apisix_stack(config, [route, reader])


def test_decisions_reach_their_upstream_and_nothing_sensitive_leaves_under_overload(stack: Stack) -> None:
    stack.set_load(0)
    calm = stack.send("public")
    assert calm["upstream"] == "local" and stack.decision(calm) == "local;local_ok"
    stack.set_load(500)
    public = stack.send("public")
    assert public["upstream"] == "aws" and stack.decision(public) == "aws;overflow_cold"
    forged = [AWS, "aws", "aws:" + "0" * 32, "AWS", "local"]
    for classification in ("confidential", "secret", None):
        for value in forged:
            answer = stack.send(classification, **{"x-spillway-target": value})
            assert answer["upstream"] == "local", (classification, value, answer)
            assert stack.decision(answer).startswith("local;"), answer


def test_a_clients_value_cached_before_the_runner_ran_never_picks_the_cloud(stack: Stack) -> None:
    """On a route whose match reads X-Spillway-Target, APISIX's cache keeps the client's value even
    after the runner set its own: with MAC'd values, no value a client can make matches a cloud rule.
    Calm load (the runner keeps everything local) and overload (it keeps the confidential local)."""
    guesses = ["aws", "aws:" + "f" * 32, "aws:" + AWS.partition(":")[2].upper()]
    for load, classifications in ((0, ("public", "confidential")), (500, ("confidential", "secret"))):
        stack.set_load(load)
        for value in guesses:
            for classification in classifications:
                answer = stack.send(classification, host=VAR_HOST, **{"x-spillway-target": value})
                assert answer["upstream"] == "local", (load, value, classification, answer)


def test_stop_answers_and_the_decision_header_reach_the_client(stack: Stack) -> None:
    first = stack.send("public", **{"x-tenant": "tiny"})
    second = stack.send("public", **{"x-tenant": "tiny"})
    assert first["status"] == 200
    assert second["status"] == 429 and second["answer_headers"]["retry-after"] == "60"
    assert stack.decision(second) == "shed;tenant_rate"
    assert "tenant_rate" in second["error"]


def test_local_answer_times_reach_the_runner_through_the_logger_and_feed_the_estimate(stack: Stack) -> None:
    """Triton's own metrics show a little queueing; the answers APISIX sees take 400 ms."""
    stack.set_load(0)
    stack.feed.queue_ms = 5.0
    stack.local.delay_s = 0.4
    try:
        wait_until(
            lambda: stack.decision(stack.send("public")).startswith("aws;"),
            30,
            "local answer times reported by http-logger push the estimate past the target",
        )
    finally:
        stack.local.delay_s = 0.0
    assert re.search(r'spillway_local_wait_seconds\{model="add_sub"\}', stack.metrics())


def gauge(stack: Stack, name: str, target: str = "aws") -> float:
    """A target's gauge from the runner's metrics; a missing one fails rather than reads as a value."""
    found = re.search(rf'{name}\{{target="{target}"\}} ([0-9.e+-]+)', stack.metrics())
    assert found, f"{name} for {target} is missing from the runner's metrics"
    return float(found.group(1))


def test_answers_reported_a_second_late_do_not_inflate_the_cloud_in_flight_count(stack: Stack) -> None:
    """http-logger reports a batch up to a second after the fact; four clients, each waiting
    50 ms for every answer, never have more than four requests in flight: the runner counts them
    (at most three times that, for answer times it smooths), not a second's worth of requests."""
    stack.set_load(500)
    before = gauge(stack, "spillway_warm_instances")
    stack.aws.instance, stack.aws.delay_s = f"fn-{secrets.token_hex(4)}", 0.05
    try:
        stack.send("public")
        wait_until(
            lambda: gauge(stack, "spillway_warm_instances") > before,
            30,
            "a batch of outcomes with answer times (its new instance counts as warm)",
        )

        def client() -> None:
            for _ in range(80):
                assert stack.decision(stack.send("public")).startswith("aws;")

        samples: list[float] = []
        with ThreadPoolExecutor(4) as pool:
            clients = [pool.submit(client) for _ in range(4)]
            # Samples of the gauge (refreshed every second) until the clients are done.
            while wait(clients, timeout=0.25).not_done:
                samples.append(gauge(stack, "spillway_target_in_flight"))
            for done in clients:
                done.result()
    finally:
        stack.aws.instance, stack.aws.delay_s = "fn-1", 0.0
    assert samples and max(samples) <= 12, f"counted in flight: {samples}"
    assert max(samples) >= 1, f"the samples never saw the clients' requests: {samples}"


def test_a_target_answering_5xx_opens_its_breaker_through_the_logger(stack: Stack) -> None:
    stack.set_load(500)
    stack.aws.status = 502
    try:
        wait_until(
            lambda: stack.decision(stack.send("public")) == "local;no_target",
            30,
            "failures reported by http-logger open the aws breaker",
        )
        gauge = 'spillway_breaker_open{target="aws"} 1.0'
        wait_until(lambda: gauge in stack.metrics(), 10, "the breaker gauge (refreshed every second)")
    finally:
        stack.aws.status = 200


def test_the_runner_refuses_what_the_example_config_forgets() -> None:
    """The example config's plugin list is what APISIX gets: the route needs every one of them."""
    from testing.apisix import example_plugins

    needed = {"ext-plugin-pre-req", "traffic-split", "http-logger", "aws-lambda"}
    assert needed <= set(example_plugins())
