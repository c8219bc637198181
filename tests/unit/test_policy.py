"""The routing policy as a pure function: tables of cases, and residency as a property."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide, may_leave
from gateway_plugin.policy.model import LOCAL, SHED, Policy, RuleAction, RulePolicy
from gateway_plugin.policy.overflow import estimated_latency_ms, overflowing
from gateway_plugin.policy.snapshot import (
    BreakerState,
    LocalLoad,
    RequestFeatures,
    Snapshot,
    TargetState,
    TenantState,
)

CONFIG = SpillwayConfig.model_validate(
    {
        "local": {"latency_target_ms": 100, "parallelism": 2, "max_queue_ms": 2000},
        "overflow": {"enter_ratio": 1.0, "exit_ratio": 0.8},
        "targets": [
            {
                "name": "aws",
                "kind": "aws_lambda",
                "url": "https://a.example",
                "concurrency_cap": 5,
                "cold_start_ms": 500,
            },
            {
                "name": "ali",
                "kind": "aliyun_fc",
                "url": "https://b.example",
                "concurrency_cap": 5,
                "cold_start_ms": 800,
            },
        ],
        "rules": [
            {
                "name": "batch",
                "priority": 10,
                "match": {"headers": {"x-priority": "batch"}},
                "action": "target",
                "targets": ["ali"],
            },
            {"name": "admin", "priority": 20, "match": {"uri": "^/v2/repository"}, "action": "local"},
            {"name": "blocked", "priority": 5, "match": {"models": ["forbidden"]}, "action": "shed"},
        ],
        "tenants": {"quotas": {"small": {"requests_per_minute": 2, "concurrency": 1}}},
        "budgets": {"per_target_hourly_usd": {"aws": 0.001}},
    }
)
POLICY = build_policy(CONFIG)

CALM = LocalLoad(fresh=True, queue_ms=1, compute_ms=10)
BUSY = LocalLoad(fresh=True, queue_ms=300, compute_ms=10, pending=40)
# Still overflowing (hysteresis) at 95 ms, which meets the 100 ms target: no reason to start a cold instance.
EASING = LocalLoad(fresh=True, queue_ms=85, compute_ms=10, overflowing=True)
SATURATED = LocalLoad(fresh=True, queue_ms=3000, compute_ms=10, pending=600)
WARM = TargetState(warm_instances=3)


def req(classification: str | None = "public", model: str = "m", **headers: str) -> RequestFeatures:
    h = dict(headers)
    if classification is not None:
        h["x-data-classification"] = classification
    return RequestFeatures(f"/v2/models/{model}/infer", h, {}, model)


def snap(load: LocalLoad = CALM, **targets: TargetState) -> Snapshot:
    return Snapshot({"m": load, "forbidden": load}, targets)


CASES = [
    ("calm cluster stays local", req(), snap(CALM), LOCAL, "local_ok"),
    ("busy cluster spills to a warm target", req(), snap(BUSY, aws=WARM), "aws", "overflow_warm"),
    ("warm target preferred over the first cold one", req(), snap(BUSY, ali=WARM), "ali", "overflow_warm"),
    (
        "cold target worth it when the local queue is longer than its start",
        req(),
        snap(SATURATED),
        "aws",
        "overflow_cold",
    ),
    ("cold target not worth it while local still meets the target", req(), snap(EASING), LOCAL, "no_target"),
    ("a request local would miss starts a cold instance", req(), snap(BUSY), "aws", "overflow_cold"),
    (
        "sensitive data stays home even when busy",
        req("confidential"),
        snap(BUSY, aws=WARM),
        LOCAL,
        "residency",
    ),
    ("unclassified is on-prem-only by default", req(None), snap(BUSY, aws=WARM), LOCAL, "residency"),
    (
        "missing signals keep it local",
        req(),
        snap(BUSY._replace(fresh=False), aws=WARM),
        LOCAL,
        "signals_missing",
    ),
    (
        "open breaker falls down the chain",
        req(),
        snap(BUSY, aws=TargetState(breaker=BreakerState.OPEN, warm_instances=3), ali=WARM),
        "ali",
        "overflow_warm",
    ),
    (
        "half-open breaker lets its probe through",
        req(),
        snap(BUSY, aws=TargetState(breaker=BreakerState.HALF_OPEN, probe_allowed=True, warm_instances=3)),
        "aws",
        "overflow_warm",
    ),
    (
        "capped target is skipped",
        req(),
        snap(BUSY, aws=TargetState(in_flight=5, warm_instances=9), ali=WARM),
        "ali",
        "overflow_warm",
    ),
    (
        "budget exhausted keeps it off that target",
        req(),
        snap(BUSY, aws=TargetState(warm_instances=3, spent_hour_usd=0.001), ali=WARM),
        "ali",
        "overflow_warm",
    ),
    (
        "a rule sends batch to its target whatever the load",
        req(**{"x-priority": "batch"}),
        snap(CALM),
        "ali",
        "overflow_cold",
    ),
    (
        "a batch rule never moves sensitive data",
        req("secret", **{"x-priority": "batch"}),
        snap(CALM),
        LOCAL,
        "residency",
    ),
    (
        "admin paths stay local",
        RequestFeatures("/v2/repository/index", {"x-data-classification": "public"}),
        snap(BUSY, aws=WARM),
        LOCAL,
        "rule:admin",
    ),
    ("a shed rule sheds", req(model="forbidden"), snap(CALM), SHED, "rule:blocked"),
]


@pytest.mark.parametrize(
    ("features", "snapshot", "target", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decision_table(
    features: RequestFeatures, snapshot: Snapshot, target: str, reason: str | None
) -> None:
    decision = decide(features, snapshot, POLICY)
    assert decision.target == target
    if reason is not None:
        assert decision.label == reason


def test_residency_kept_is_flagged_only_when_a_rule_wanted_out() -> None:
    assert decide(req("confidential"), snap(BUSY, aws=WARM), POLICY).residency_kept
    assert not decide(req("confidential"), snap(CALM, aws=WARM), POLICY).residency_kept


def test_saturated_local_with_nowhere_to_go_sheds_with_retry_after() -> None:
    everything_open = {n: TargetState(breaker=BreakerState.OPEN) for n in ("aws", "ali")}
    for features in (req(), req("confidential")):
        decision = decide(features, snap(SATURATED, **everything_open), POLICY)
        assert (decision.target, decision.status, decision.retry_after_s) == (SHED, 503, 1)


def test_tenant_over_quota_gets_429() -> None:
    over_rate = Snapshot({"m": CALM}, {}, {"small": TenantState(requests_last_minute=2)})
    assert decide(req(**{"x-tenant": "small"}), over_rate, POLICY).status == 429
    over_conc = Snapshot({"m": CALM}, {}, {"small": TenantState(in_flight=1)})
    assert decide(req(**{"x-tenant": "small"}), over_conc, POLICY).reason == "tenant_concurrency"
    assert decide(req(**{"x-tenant": "big"}), over_rate, POLICY).target == LOCAL


def test_hysteresis_does_not_flap_between_thresholds() -> None:
    between = LocalLoad(fresh=True, queue_ms=80, compute_ms=5)
    assert overflowing(between._replace(overflowing=True), 100, POLICY) is True
    assert overflowing(between._replace(overflowing=False), 100, POLICY) is False
    assert overflowing(LocalLoad(fresh=True, queue_ms=200, compute_ms=5), 100, POLICY) is True
    assert (
        overflowing(LocalLoad(fresh=True, queue_ms=10, compute_ms=5, overflowing=True), 100, POLICY) is False
    )


def test_gateway_accounting_counts_before_the_next_scrape() -> None:
    quiet = LocalLoad(fresh=True, queue_ms=0, compute_ms=10)
    assert not overflowing(quiet, 100, POLICY)
    assert overflowing(quiet._replace(sent_since_scrape=30), 100, POLICY)


# Residency as a property: random configs, requests, loads, breakers, budgets and faults.

names = st.sampled_from(["aws", "ali", "gcp"])
classes = st.sampled_from(["public", "internal", "confidential", "PUBLIC", " public ", "", "secret"])


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    targets = draw(st.lists(names, unique=True, max_size=3))
    rules = [
        {
            "name": f"r{i}",
            "priority": draw(st.integers(-5, 5)),
            "match": draw(
                st.sampled_from([{}, {"headers": {"x-p": "batch"}}, {"models": ["m"]}, {"uri": "infer"}])
            ),
            "action": draw(st.sampled_from(["local", "overflow", "target", "shed"])),
            "targets": draw(st.lists(st.sampled_from(targets), max_size=3)) if targets else [],
        }
        for i in range(draw(st.integers(0, 4)))
    ]
    config = SpillwayConfig.model_validate(
        {
            "targets": [
                {
                    "name": n,
                    "kind": "http",
                    "url": "https://x",
                    "concurrency_cap": draw(st.integers(1, 5)),
                    "cold_start_ms": draw(st.floats(0, 5000)),
                }
                for n in targets
            ],
            "rules": rules,
            "residency": {
                "cloud_allowed": draw(st.lists(st.sampled_from(["public", "internal"]), max_size=2)),
                "unclassified_may_leave": draw(st.booleans()),
            },
            "overflow": {"enter_ratio": 1.0, "exit_ratio": draw(st.floats(0.1, 1.0))},
        }
    )
    return build_policy(config)


loads = st.builds(
    LocalLoad,
    fresh=st.booleans(),
    queue_ms=st.floats(0, 1e5),
    compute_ms=st.floats(0, 1e3),
    pending=st.integers(0, 10_000),
    sent_since_scrape=st.integers(0, 1000),
    overflowing=st.booleans(),
    failing=st.booleans(),
    probe_allowed=st.booleans(),
)
target_states = st.builds(
    TargetState,
    breaker=st.sampled_from(list(BreakerState)),
    probe_allowed=st.booleans(),
    in_flight=st.integers(0, 10),
    warm_instances=st.integers(0, 10),
    spent_hour_usd=st.floats(0, 10),
)


@settings(max_examples=3000, deadline=None)
@given(policies(), classes | st.none(), st.booleans(), loads, st.dictionaries(names, target_states))
def test_no_on_prem_only_request_is_ever_sent_to_a_cloud_target(
    policy: Policy, label: str | None, batch: bool, load: LocalLoad, targets: dict[str, TargetState]
) -> None:
    headers = {"x-p": "batch"} if batch else {}
    if label is not None:
        headers["x-data-classification"] = label
    features = RequestFeatures("/v2/models/m/infer", headers, {}, "m")
    decision = decide(features, Snapshot({"m": load}, targets), policy)
    if not may_leave(features, policy):
        assert decision.target in (LOCAL, SHED), decision
    if decision.is_cloud:
        assert decision.target in policy.targets
        assert targets.get(decision.target, TargetState()).breaker != "open"


def test_work_finished_since_the_scrape_is_taken_off_the_backlog() -> None:
    sent = LocalLoad(fresh=True, queue_ms=0, compute_ms=10, sent_since_scrape=30)
    assert overflowing(sent, 100, POLICY)
    assert not overflowing(sent._replace(age_ms=150), 100, POLICY), "2 x 150 ms / 10 ms = 30 done"


def test_a_drained_cluster_stops_the_overflow_whatever_earlier_answers_took() -> None:
    """The gateway's own view of answer times (queueing included) lags the cluster: once nothing
    waits, it must not keep public requests spilling."""
    drained = LocalLoad(fresh=True, compute_ms=51, queue_ms=0, observed_ms=300, overflowing=True)
    assert estimated_latency_ms(drained, POLICY) == 51
    assert not overflowing(drained, 500, POLICY)
    idle = drained._replace(queue_ms=0.17)
    assert estimated_latency_ms(idle, POLICY) < 52, (
        "Triton reports a few µs of queue for requests that never waited"
    )
    for busy in (drained._replace(pending=2), drained._replace(queue_ms=20)):
        assert estimated_latency_ms(busy, POLICY) >= 300, (
            "while the cluster queues, the observed time is a floor"
        )


def test_a_saturated_cluster_starts_a_cold_instance_for_each_request_rather_than_shed() -> None:
    """Past saturation the request would be shed: a cold start answers it, and the instance it
    starts serves the rest of the burst. Each request that finds no warm instance free starts one,
    up to the target's cap, then on the chain's next target; only with every target full is it shed.
    Short of missing the target, a queue shorter than the start wins."""
    saturated = SATURATED._replace(queue_ms=450, pending=90)
    decision = decide(req(), snap(saturated), POLICY)
    assert (decision.target, decision.label) == ("aws", "overflow_cold")
    starting = TargetState(in_flight=1)
    assert decide(req(), snap(saturated, aws=starting), POLICY).target == "aws"
    full = TargetState(in_flight=5)
    assert decide(req(), snap(saturated, aws=full), POLICY).target == "ali"
    assert decide(req(), snap(saturated, aws=full, ali=full), POLICY).target == SHED
    assert decide(req(), snap(EASING), POLICY).target == LOCAL
    assert decide(req("confidential"), snap(saturated), POLICY).target == SHED


def test_a_busy_warm_pool_grows_with_each_request_local_would_miss() -> None:
    """Local would miss the target (not saturated): a target whose warm instances are all busy
    starts one more for each such request, since the request misses either way and the instance
    serves the burst; while local still meets the target, the request stays."""
    all_busy = TargetState(warm_instances=2, in_flight=2)
    decision = decide(req(), snap(BUSY, aws=all_busy), POLICY)
    assert (decision.target, decision.label) == ("aws", "overflow_cold")
    starting = TargetState(warm_instances=2, in_flight=3)
    assert decide(req(), snap(BUSY, aws=starting, ali=all_busy), POLICY).target == "aws"
    assert decide(req(), snap(EASING, aws=all_busy), POLICY).target == LOCAL
    assert decide(req(), snap(CALM, aws=all_busy), POLICY).target == LOCAL


def test_a_classification_is_read_whatever_its_case_and_spaces_and_a_blank_one_is_none() -> None:
    for label in ("PUBLIC", " public ", "Public\t"):
        assert decide(req(label), snap(BUSY, aws=WARM), POLICY).target == "aws", repr(label)
    leaving = dataclasses.replace(POLICY, unclassified_may_leave=True)
    assert may_leave(req(" "), leaving) and not may_leave(req(" "), POLICY)


def test_without_fresh_signals_nothing_is_shed_and_nothing_counts_as_overflowing() -> None:
    """Fail safe: a stale view of the cluster, however loaded it looked, keeps requests local
    without shedding them, and does not set the overflow state that hysteresis remembers."""
    stale = SATURATED._replace(fresh=False)
    decision = decide(req("confidential"), snap(stale, aws=WARM), POLICY)
    assert (decision.target, decision.label, decision.overflowing) == (LOCAL, "signals_missing", False)
    everything_open = {n: TargetState(breaker=BreakerState.OPEN) for n in ("aws", "ali")}
    for features in (req("secret", **{"x-priority": "batch"}), req(**{"x-priority": "batch"})):
        assert decide(features, snap(stale, **everything_open), POLICY).target == LOCAL


def test_a_local_queue_past_max_queue_ms_is_saturation_on_its_own() -> None:
    """Nowhere to go: a queue longer than max_queue_ms sheds even with the latency short of
    target x saturation_ratio."""
    nowhere = {n: TargetState(breaker=BreakerState.OPEN) for n in ("aws", "ali")}
    queue_capped = dataclasses.replace(POLICY, max_queue_ms=250, saturation_ratio=1000)
    decision = decide(req(), snap(BUSY, **nowhere), queue_capped)
    assert (decision.target, decision.status, decision.label) == (SHED, 503, "no_target+local_saturated")
    assert decide(req(), snap(BUSY, **nowhere), POLICY).target == LOCAL


def test_a_warm_target_later_in_the_chain_beats_a_cold_start_earlier() -> None:
    decision = decide(req(), snap(SATURATED, ali=WARM), POLICY)
    assert (decision.target, decision.label) == ("ali", "overflow_warm")


def test_idle_billing_weighs_only_on_a_target_nothing_else_is_using() -> None:
    """A target that bills idle instances is cheaper per request here, but waking it keeps an
    instance billed for its idle TTL: with nothing in flight there and no answer from it within
    its TTL, the other one serves. Once it serves, its instances stay alive whatever this request
    does, and its price alone counts; one that answered a moment ago adds only that moment."""
    priced = dataclasses.replace(
        POLICY,
        targets={
            "aws": dataclasses.replace(POLICY.targets["aws"], cost_usd=8e-6, idle_usd=0.0),
            "ali": dataclasses.replace(POLICY.targets["ali"], cost_usd=6e-6, idle_usd=1.5e-3, slots=4),
        },
    )
    idle = snap(BUSY, aws=WARM, ali=TargetState(warm_instances=2))
    serving = snap(BUSY, aws=WARM, ali=TargetState(warm_instances=2, in_flight=1))
    assert decide(req(), idle, priced).target == "aws"
    assert decide(req(), serving, priced).target == "ali"
    ttl = priced.targets["ali"].idle_ttl_s
    answered = {"a moment ago": (0.1, "ali"), "a TTL ago": (ttl, "aws"), "past its TTL": (2 * ttl, "aws")}
    for when, (idle_s, expected) in answered.items():
        lately = snap(BUSY, aws=WARM, ali=TargetState(warm_instances=2, idle_s=idle_s))
        assert decide(req(), lately, priced).target == expected, when


def test_each_model_has_its_own_load_and_target_and_the_clusters_stands_in_for_the_rest() -> None:
    cluster_wide = Snapshot({"": BUSY}, {"aws": WARM})
    assert decide(req(model="other"), cluster_wide, POLICY).target == "aws"
    lenient = dataclasses.replace(POLICY, model_targets_ms={"m": 1000.0})
    assert decide(req(), snap(BUSY, aws=WARM), lenient).label == "local_ok"
    assert decide(req(model="forbidden"), snap(BUSY, aws=WARM), lenient).target == SHED


def test_rules_match_query_arguments_and_a_rule_without_targets_uses_the_default_chain() -> None:
    keep = RulePolicy("keep", RuleAction.LOCAL, (), args=(("stay", re.compile("1")),))
    out = RulePolicy("out", RuleAction.TARGET, (), headers=(("x-out", re.compile("yes")),))
    ruled = dataclasses.replace(POLICY, rules=(keep, out))
    staying = req()._replace(args={"stay": "1"})
    assert decide(staying, snap(BUSY, aws=WARM), ruled).label == "rule:keep"
    assert decide(req(), snap(BUSY, aws=WARM), ruled).target == "aws"
    assert decide(req(**{"x-out": "yes"}), snap(CALM, aws=WARM), ruled).target == "aws"


def test_a_first_token_target_holds_the_wait_not_the_whole_answer() -> None:
    """A generation runs seconds (Triton's compute counts its whole stream), but its users wait for
    the first token: with ``model_ttft_targets_ms`` the wait alone is held to it, so a cluster
    that would start it at once keeps it however long it runs, and one it would wait on sends it
    out though the whole answer meets ``latency_target_ms``."""
    llm = dataclasses.replace(POLICY, latency_target_ms=60_000, model_ttft_ms={"llm": 300.0})
    running = LocalLoad(fresh=True, queue_ms=1, compute_ms=4000)
    waiting = LocalLoad(fresh=True, queue_ms=400, compute_ms=4000, pending=1)
    for load, want in ((running, LOCAL), (waiting, "aws")):
        decision = decide(req(model="llm"), Snapshot({"llm": load}, {"aws": WARM}), llm)
        assert decision.target == want, (load, decision)
    whole = dataclasses.replace(llm, model_ttft_ms={})
    assert decide(req(model="llm"), Snapshot({"llm": waiting}, {"aws": WARM}), whole).target == LOCAL
    # A mean wait of 200 ms meets 300 ms, but its tail (ln 10 x 200 = 460 ms, overflow.WAIT_TAIL)
    # does not: the share of requests that would wait past the target is what the SLO counts.
    tail = LocalLoad(fresh=True, queue_ms=200, compute_ms=4000)
    assert decide(req(model="llm"), Snapshot({"llm": tail}, {"aws": WARM}), llm).target == "aws"
    short = LocalLoad(fresh=True, queue_ms=100, compute_ms=4000)
    assert decide(req(model="llm"), Snapshot({"llm": short}, {"aws": WARM}), llm).target == LOCAL
