"""A scan over its CPU budget (``content.scan_budget_ms``) on a real Apache APISIX 3.18, on both
routes: a 1 ms budget and 64 KiB of random a and b read through ``a[ab]{20}(?:c|d)``, a pattern no
automaton keeps few states for (RE2 takes tens of ms on it, the fast path's automaton more, its
prefilter ``a[ab]{20}`` being everywhere). The request stays home, counted as ``over_budget``,
logged without its text; a plain one still leaves."""

from __future__ import annotations

import random

import pytest

from testing.apisix import Stack, StackStarter, needs_apisix
from testing.http import wait_until
from tests.integration.test_apisix_content_attacks import (
    KIB64,
    PATHS,
    content_stack,
    counted,
    inference,
    post,
)

pytestmark = [pytest.mark.integration, needs_apisix()]


@pytest.fixture(scope="module")
def tight(module_apisix_stack: StackStarter) -> Stack:
    patterns = {"window": "a[ab]{20}(?:c|d)"}
    content = {"patterns": patterns, "max_scan_bytes": 2 * KIB64, "scan_budget_ms": 1}
    return content_stack(module_apisix_stack, content)


def _over_budget(stack: Stack) -> float:
    return counted(stack, "spillway_content_unscannable_total", 'reason="over_budget"')


def test_a_scan_over_its_budget_stays_home_counted_and_logged_without_its_text(tight: Stack) -> None:
    tight.set_load(500)
    rng = random.Random(7)
    text = "".join(rng.choice("ab") for _ in range(KIB64))
    before = _over_budget(tight)
    for kind, path in PATHS.items():
        status, decision, _ = post(tight, path, inference(text))
        assert (status, decision) == (200, "local;residency"), kind
        # Plain text still leaves: the budget is per request.
        status, decision, _ = post(tight, path, inference("hello"))
        assert status == 200 and decision.startswith("aws;"), (kind, decision)
    wait_until(
        lambda: _over_budget(tight) == before + 2,
        10,
        "both routes' scans over budget counted",
    )
    wait_until(
        lambda: tight.gateway.error_log().count('"content": "unscannable:over_budget"') == 2,
        10,
        "residency log lines",
    )
    assert text[:40] not in tight.gateway.error_log()
