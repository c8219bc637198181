"""The pure decision while the on-prem cluster itself fails (its breaker open, not its metrics
missing): requests that may leave go out, warm or cold; the rest get 503 with Retry-After at once;
a probe goes local through the usual steps; and no path sends an on-prem-only request out."""

from __future__ import annotations

import pytest

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import LOCAL, SHED, Reason
from gateway_plugin.policy.overflow import overflowing
from gateway_plugin.policy.snapshot import (
    BreakerState,
    LocalLoad,
    RequestFeatures,
    Snapshot,
    TargetState,
    TenantState,
)
from tests.unit.test_policy import BUSY, CALM, POLICY, WARM, req, snap

DOWN = LocalLoad(failing=True)
# Metrics fresh from an earlier scrape, but the cluster's answers fail.
DOWN_FRESH = CALM._replace(failing=True)
PROBING = LocalLoad(failing=True, probe_allowed=True)


@pytest.mark.parametrize("load", [DOWN, DOWN_FRESH], ids=["signals missing", "signals fresh"])
def test_a_public_request_goes_out_even_cold_and_even_where_local_looked_calm(load: LocalLoad) -> None:
    d = decide(req(), snap(load), POLICY)
    assert (d.target, d.reason, d.status) == ("aws", Reason.OVERFLOW_COLD, 0)
    assert d.overflowing, "traffic comes home through the overflow hysteresis"
    warm = decide(req(), snap(load, ali=WARM), POLICY)
    assert (warm.target, warm.reason) == ("ali", Reason.OVERFLOW_WARM)


@pytest.mark.parametrize("classification", [None, "confidential", "secret"])
def test_an_on_prem_only_request_gets_503_with_retry_after_at_once_never_the_cloud(
    classification: str | None,
) -> None:
    d = decide(req(classification), snap(DOWN, aws=WARM, ali=WARM), POLICY)
    assert (d.target, d.reason, d.status) == (SHED, Reason.LOCAL_FAILING, 503)
    assert d.retry_after_s == POLICY.retry_after_s > 0
    assert d.on_prem_only and not d.residency_kept and not d.is_cloud


@pytest.mark.parametrize(
    "targets",
    [
        {"aws": TargetState(breaker=BreakerState.OPEN), "ali": TargetState(breaker=BreakerState.OPEN)},
        {"aws": TargetState(in_flight=5), "ali": TargetState(in_flight=5)},
        {"aws": TargetState(spent_hour_usd=1.0), "ali": TargetState(breaker=BreakerState.HALF_OPEN)},
    ],
    ids=["breakers open", "caps full", "budget spent, probe taken"],
)
def test_a_public_request_no_target_takes_gets_503_rather_than_a_dead_cluster(
    targets: dict[str, TargetState],
) -> None:
    d = decide(req(), Snapshot({"m": DOWN}, targets), POLICY)
    assert (d.target, d.reason, d.status) == (SHED, Reason.LOCAL_FAILING, 503)
    assert not d.on_prem_only


def test_a_body_too_big_for_every_target_gets_503() -> None:
    limited = SpillwayConfig.model_validate(
        {
            "targets": [
                {"name": "aws", "kind": "http", "url": "https://a.example", "max_request_bytes": 10},
            ]
        }
    )
    features = RequestFeatures("/v2/models/m/infer", {"x-data-classification": "public"}, {}, "m", 11)
    d = decide(features, Snapshot({"m": DOWN}), build_policy(limited))
    assert (d.target, d.reason) == (SHED, Reason.LOCAL_FAILING)


def test_rules_keep_their_word_a_local_rule_is_shed_a_target_rule_goes_out_a_shed_rule_sheds() -> None:
    admin = RequestFeatures("/v2/repository/index", {"x-data-classification": "public"}, {}, None)
    d = decide(admin, Snapshot({"": DOWN}, {"aws": WARM}), POLICY)
    assert (d.target, d.reason) == (SHED, Reason.LOCAL_FAILING), "a local rule is never sent out"
    batch = decide(req(**{"x-priority": "batch"}), snap(DOWN), POLICY)
    assert (batch.target, batch.reason) == ("ali", Reason.OVERFLOW_COLD)
    blocked = decide(req(model="forbidden"), snap(DOWN), POLICY)
    assert (blocked.target, blocked.reason, blocked.status) == (SHED, Reason.RULE, 503)


def test_a_tenant_over_its_quota_is_told_429_before_anything_else() -> None:
    tenants = {"small": TenantState(requests_last_minute=2)}
    d = decide(req(**{"x-tenant": "small"}), Snapshot({"m": DOWN}, {}, tenants), POLICY)
    assert (d.target, d.reason, d.status) == (SHED, Reason.TENANT_RATE, 429)


def test_a_half_open_cluster_takes_its_probe_through_the_usual_steps() -> None:
    assert decide(req(None), snap(PROBING), POLICY)[:2] == (LOCAL, Reason.SIGNALS_MISSING)
    assert decide(req(), snap(PROBING._replace(fresh=True, compute_ms=10)), POLICY)[:2] == (
        LOCAL,
        Reason.LOCAL_OK,
    )
    busy = decide(req(), snap(BUSY._replace(failing=True, probe_allowed=True), aws=WARM), POLICY)
    assert busy[:2] == ("aws", Reason.OVERFLOW_WARM), "a request that would spill anyway is no probe"


def test_missing_signals_alone_keep_the_fail_safe() -> None:
    d = decide(req(), snap(LocalLoad(), aws=WARM), POLICY)
    assert (d.target, d.reason) == (LOCAL, Reason.SIGNALS_MISSING)
    assert decide(req(None), snap(LocalLoad()), POLICY)[:2] == (LOCAL, Reason.SIGNALS_MISSING)


def test_back_home_through_the_hysteresis_once_the_breaker_closes() -> None:
    # Latency between the exit (80 ms) and entry (100 ms) thresholds: still out while overflowing.
    between = LocalLoad(fresh=True, queue_ms=80, compute_ms=10, overflowing=True)
    assert overflowing(between, 100, POLICY)
    assert decide(req(), snap(between, aws=WARM), POLICY).target == "aws"
    assert decide(req(), snap(between._replace(overflowing=False), aws=WARM), POLICY).target == LOCAL
    assert decide(req(), snap(CALM._replace(overflowing=True), aws=WARM), POLICY)[:2] == (
        LOCAL,
        Reason.LOCAL_OK,
    )
