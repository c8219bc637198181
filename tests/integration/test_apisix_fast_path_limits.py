"""The fast path's counters on a real APISIX with two nginx workers: concurrency caps and budgets
hold under concurrent load (a module of its own: one APISIX per prefix at a time)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from functions.signature import Verifier
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.build import build_policy
from testing.apisix import Stack, StackStarter, needs_apisix, runner_table
from testing.budget import clear_of_the_hours_end
from testing.http import wait_until
from testing.standins import StandIns, upstream
from tests.integration.test_apisix_fast_path import routes_for

pytestmark = [pytest.mark.integration, needs_apisix()]


def test_caps_and_budgets_hold_across_workers_under_concurrent_load(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """Two nginx workers, twelve clients, slow functions: aws never has more than its cap of 2 in
    flight (shared-dict counters), and ali, whose hourly budget covers 3.5 cold requests, gets 3."""
    clear_of_the_hours_end()
    aws = stand_ins.aws
    with upstream("ali") as ali:
        stand_ins.feed.queue_ms = 500
        config = stand_ins.config("SPILLWAY_SIGNING_KEY")
        config["targets"][0].update(concurrency_cap=2, signing_key_env=None)
        config["targets"].append(
            {**config["targets"][0], "name": "ali", "url": ali.url, "concurrency_cap": 100}
        )
        cold = build_policy(SpillwayConfig.model_validate(config)).targets["ali"].cold_cost_usd
        config["budgets"] = {"per_target_hourly_usd": {"ali": cold * 3.5}}
        # What neither target takes stays local: the feed's queue plus the requests sent since its
        # last scrape must not read as a saturated cluster, which would shed them.
        config["overflow"] = {"saturation_ratio": 50}
        aws.delay_s = ali.delay_s = 0.3
        front = apisix_stack(config, routes_for(config), fast_path=True, workers=2)
        wait_until(lambda: front.decision(front.send("public")).startswith("aws;"), 30, "overflow to aws")
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda _: front.send("public"), range(120)))
        assert {a["status"] for a in answers} == {200}
        assert aws.max_in_flight <= 2 and aws.seen, aws.max_in_flight
        assert len(ali.seen) == 3, len(ali.seen)


def test_signatures_made_by_two_workers_all_verify_with_nonces_never_repeated(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """Each worker draws its nonce prefix itself, after the fork: of 160 signed requests spread over
    two workers, the function's verifier (which refuses a nonce it has seen) accepts every one."""
    key = "two-workers-signing-key-0123456789abcdef"
    stand_ins.feed.queue_ms = 500
    config = stand_ins.config("SPILLWAY_SIGNING_KEY")
    config["overflow"] = {"saturation_ratio": 50}
    front = apisix_stack(config, routes_for(config), fast_path=True, workers=2, signing_key=key)
    wait_until(lambda: front.decision(front.send("public")).startswith("aws;"), 30, "overflow to aws")
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: front.send("public"), range(160)))
    signed = [a for a in answers if a.get("upstream") == "aws"]
    assert len(signed) == 160, answers
    verifier = Verifier(key.encode(), allow_unsigned_payload=True)
    for answer in signed:
        header = answer["headers"]["x-spillway-signature"]
        verifier.verify(header, "POST", answer["path"], b"{}", time.time())


def _tenants_stack(
    stand_ins: StandIns, apisix_stack: StackStarter, tenants: dict[str, object], workers: int
) -> tuple[dict[str, Any], Stack]:
    """The fast path under the tenants' quotas ``tenants``, an "aws" that names no instance, and a
    table decided from."""
    stand_ins.aws.instance = None
    config = stand_ins.config("SPILLWAY_SIGNING_KEY")
    config["tenants"] = tenants
    front = apisix_stack(config, routes_for(config), fast_path=True, workers=workers)
    wait_until(lambda: front.decision(front.send("public")) == "local;local_ok", 30, "a table")
    return config, front


def test_a_tenants_concurrency_quota_holds_and_its_counter_goes_when_idle(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """Tenant t1 may have 2 requests in flight: of 8 at once on a slow cluster, 2 reach it and the
    others get 429; once they are answered, t1 gets through again (its counter was released)."""
    _, front = _tenants_stack(stand_ins, apisix_stack, {"quotas": {"t1": {"concurrency": 2}}}, workers=2)
    front.local.delay_s = 0.5
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: front.send("secret", **{"x-tenant": "t1"}), range(8)))
    front.local.delay_s = 0.0
    assert sorted(a["status"] for a in answers) == [200, 200] + [429] * 6, answers
    assert {front.decision(a) for a in answers if a["status"] == 429} == {"shed;tenant_concurrency"}
    assert front.local.max_in_flight == 2
    assert front.send("secret", **{"x-tenant": "t1"})["status"] == 200


def test_an_overlong_tenant_name_or_uri_costs_no_other_outcome_and_the_tenant_keeps_its_quota(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """A 5,000-character tenant name (over a default quota of 2 a minute) and a request kept home
    with a 6,000-character path: the summaries carrying them still count, the tenant is keyed by
    its hash on both sides, so its third request within the minute is shed."""
    _, front = _tenants_stack(stand_ins, apisix_stack, {"default": {"requests_per_minute": 2}}, workers=1)
    front.set_load(500)
    long_path = "/onprem/models/add_sub/infer/" + "p" * 6000
    kept = front.send("public", path=long_path)
    assert front.decision(kept).startswith("local;residency"), kept
    tenant = {"x-tenant": "t" * 5000}
    assert [front.send("public", **tenant)["status"] for _ in range(2)] == [200, 200]
    wait_until(lambda: front.decision(front.send("public", **tenant)) == "shed;tenant_rate", 10, "the quota")
    wait_until(
        lambda: 'spillway_decisions_total{reason="residency",target="local"}' in front.metrics(),
        10,
        "the summary with the long path counted",
    )


def test_a_tenants_concurrency_slot_is_taken_atomically_across_workers(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """Tenant t1 may have 1 request in flight; 16 clients on two nginx workers send 400 requests
    between them: the cluster never sees two of t1's at once, and t1 still gets through after."""
    _, front = _tenants_stack(stand_ins, apisix_stack, {"quotas": {"t1": {"concurrency": 1}}}, workers=2)
    front.local.delay_s = 0.002
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: front.send("secret", **{"x-tenant": "t1"}), range(400)))
    front.local.delay_s = 0.0
    statuses = [a["status"] for a in answers]
    assert set(statuses) == {200, 429}, f"both served and refused while contended: {statuses}"
    assert front.local.max_in_flight == 1, front.local.max_in_flight
    assert front.send("secret", **{"x-tenant": "t1"})["status"] == 200


def test_a_tenants_requests_count_against_its_quota_while_they_are_in_flight(
    stand_ins: StandIns, apisix_stack: StackStarter
) -> None:
    """A tenant's requests count from their decision, as the runner counts its own: counted only
    once answered, slow answers (a stream runs for minutes) would let a tenant start any number of
    them within its quotas. Two of t1's requests still in flight fill its quota of two a minute:
    the runner's table says so, and the fast path sheds t1's next request."""
    config, front = _tenants_stack(
        stand_ins, apisix_stack, {"quotas": {"t1": {"requests_per_minute": 2}}}, workers=1
    )
    front.local.delay_s = 12.0
    with ThreadPoolExecutor(2) as pool:
        slow = [pool.submit(front.send, "secret", **{"x-tenant": "t1"}) for _ in range(2)]
        wait_until(lambda: front.local.in_flight == 2, 5, "t1's two requests at the cluster")
        front.local.delay_s = 0.0
        wait_until(
            lambda: runner_table(config)["tenants"].get("t1", {}).get("requests_last_minute") == 2,
            8,
            "the runner counting t1's requests in flight",
        )
        wait_until(
            lambda: front.decision(front.send("secret", **{"x-tenant": "t1"})) == "shed;tenant_rate",
            8,
            "the fast path shedding t1 while its requests are in flight",
        )
        assert front.local.in_flight == 2, "decided while both were in flight"
        assert [f.result()["status"] for f in slow] == [200, 200]
