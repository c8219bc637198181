"""Content checks on a real Apache APISIX 3.18, on both routes: the ext-plugin route (the runner reads
the body over ExtraInfo) and the fast path (the ``spillway`` Lua plugin reads it in the access
phase). While the cluster is overloaded, a request labelled ``public`` whose text carries a card
number stays home on both, one without detectable content leaves, and the residency log names the
detector, never the text."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import yaml

from devtools import apisix
from functions.sidecar import free_port
from gateway_plugin.apisix_route import route
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path.route import fast_route
from tests.apisix_support import Stack, fast_path_settings, metrics_feed, needs_apisix, stack_config, upstream
from tests.support import http, wait_until

pytestmark = [pytest.mark.integration, needs_apisix()]

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()
CARD = "4111 1111 1111 1111"
# The fast path's route is this one path; every other /v2/ path is the ext-plugin route's.
FAST = "/v2/models/add_sub/infer"
EXT = "/v2/models/add_sub/versions/1/infer"
PATHS = {"ext-plugin": EXT, "fast path": FAST}


def _routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    validated = SpillwayConfig.model_validate(config)
    checks = {"content_checks": True}
    made = [route(validated, TOKEN, overrides=checks), fast_route(validated, TOKEN, "fast", FAST, checks)]
    return [yaml.safe_load(yaml.safe_dump(r)) for r in made]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("apisix-content")
    with ExitStack() as stack:
        local = stack.enter_context(upstream("local"))
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        feed = stack.enter_context(metrics_feed())
        config = {**stack_config(local, aws, feed), "content": {"max_scan_bytes": 4096}}
        settings = fast_path_settings(config, tmp, free_port(), _routes(config), attr={"stale_after_s": 0.5})
        gateway = stack.enter_context(apisix.running(settings))
        yield Stack(gateway, local, aws, feed, f"http://{config['metrics']['listen']}/metrics")


def _inference(*texts: str) -> bytes:
    tensor = {"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    return json.dumps({"inputs": [tensor], "parameters": {"note": "from the test"}}).encode()


def _send(stack: Stack, path: str, body: bytes, classification: str = "public") -> tuple[str, str]:
    """Which upstream answered, and the decision."""
    headers = {"content-type": "application/json", "x-data-classification": classification}
    status, answer_headers, answer = http("POST", stack.gateway.url + path, body, headers)
    assert status == 200, (status, answer[:300])
    return json.loads(answer)["upstream"], answer_headers.get("x-spillway-decision", "")


def test_a_public_request_carrying_a_card_number_stays_home_on_both_routes(stack: Stack) -> None:
    stack.set_load(500)
    for name, path in PATHS.items():
        leaving = _send(stack, path, _inference("what is the capital of France?"))
        assert leaving[0] == "aws" and leaving[1].startswith("aws;overflow"), (name, leaving)
        carried = _send(stack, path, _inference("my card is", f"{CARD}, exp 12/29"))
        assert carried == ("local", "local;residency"), (name, carried)
        # More than max_scan_bytes is not read, and stays home by default.
        large = _send(stack, path, _inference("x" * 5000))
        assert large == ("local", "local;residency"), (name, large)
    assert not any(CARD.replace(" ", "") in json.dumps(seen).replace(" ", "") for seen in stack.aws.seen)


def _counted(stack: Stack, family: str, label: str) -> float:
    found = re.search(rf"{family}\{{{label}\}} ([0-9.e+]+)", stack.metrics())
    return float(found.group(1)) if found else 0.0


def test_matches_are_counted_by_detector_and_logged_without_the_text(stack: Stack) -> None:
    stack.set_load(500)
    counts = {
        "spillway_content_matches_total": 'detector="email"',
        "spillway_content_unscannable_total": 'reason="not_json"',
    }
    before = {family: _counted(stack, family, label) for family, label in counts.items()}
    for path in PATHS.values():
        assert _send(stack, path, _inference("write to jane.doe@example.org"))[0] == "local"
        assert _send(stack, path, b"jane.doe@example.org, not JSON")[0] == "local"
    # The fast path's counts reach the runner with the plugin's next table fetch.
    wait_until(
        lambda: all(_counted(stack, f, label) == before[f] + 2 for f, label in counts.items()),
        10,
        "both routes' matches counted",
    )
    wait_until(lambda: stack.gateway.error_log().count('"content": "email"') == 2, 10, "residency log lines")
    lines = [line for line in stack.gateway.error_log().splitlines() if '"content": "email"' in line]
    # One from each route: the runner's own decision, and the fast path's summary.
    assert sorted('"via": "fast_path"' in line for line in lines) == [False, True], lines
    # Each names the class the client sent, not the one the request was then decided as.
    assert all('"classification": "public"' in line for line in lines), lines
    assert "jane.doe" not in stack.gateway.error_log()
