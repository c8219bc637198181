"""Deadlines and priorities (``admission:``): a request the cluster cannot answer in time and that
goes nowhere else is refused at once, sheddable ones first; none is refused that the cluster's
estimate says it could still answer in time; a header that says neither is a 400."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.admission import invalid_message
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide, may_leave
from gateway_plugin.policy.model import LOCAL, SHED, Reason
from gateway_plugin.policy.overflow import estimated_latency_ms
from gateway_plugin.policy.snapshot import LocalLoad, RequestFeatures, Snapshot, TargetState

POLICY = build_policy(
    SpillwayConfig.model_validate(
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
                }
            ],
            "admission": {"max_deadline_s": 30},
        }
    )
)
DEADLINE, PRIORITY = "x-request-deadline-s", "x-request-priority"
CALM = LocalLoad(fresh=True, queue_ms=1, compute_ms=10)  # 11 ms
BUSY = LocalLoad(fresh=True, queue_ms=300, compute_ms=10, pending=40)  # 310 ms: past the target
WARM = TargetState(warm_instances=3)


def req(classification: str = "confidential", **headers: str) -> RequestFeatures:
    return RequestFeatures(
        "/v2/models/m/infer", {"x-data-classification": classification, **headers}, {}, "m"
    )


def snap(load: LocalLoad, **targets: TargetState) -> Snapshot:
    return Snapshot({"m": load}, targets)


def test_the_estimates_the_cases_rest_on() -> None:
    assert estimated_latency_ms(CALM, POLICY) == 11
    assert estimated_latency_ms(BUSY, POLICY) == 310


@pytest.mark.parametrize(
    ("headers", "target", "label"),
    [
        ({}, LOCAL, "residency"),
        ({PRIORITY: "critical"}, LOCAL, "residency"),
        ({PRIORITY: " Sheddable "}, SHED, "deadline"),
        ({PRIORITY: "sheddable", DEADLINE: "0.5"}, LOCAL, "residency"),
        ({DEADLINE: "0.3"}, SHED, "deadline"),
        ({DEADLINE: "0.31"}, LOCAL, "residency"),
        ({DEADLINE: " 12.5 "}, LOCAL, "residency"),
    ],
)
def test_on_a_busy_cluster_what_cannot_leave_queues_unless_it_would_miss_its_deadline(
    headers: dict[str, str], target: str, label: str
) -> None:
    decision = decide(req(**headers), snap(BUSY, aws=WARM), POLICY)
    assert (decision.target, decision.label) == (target, label)
    assert decision.on_prem_only
    if target == SHED:
        assert (decision.status, decision.retry_after_s) == (503, POLICY.retry_after_s)


def test_a_deadline_past_the_longest_read_is_read_as_the_longest() -> None:
    short = dataclasses.replace(POLICY, max_deadline_ms=200)
    assert decide(req(**{DEADLINE: "3600"}), snap(BUSY), short).label == "deadline"
    assert decide(req(**{DEADLINE: "3600"}), snap(BUSY), POLICY).label == "residency"


def test_a_request_that_may_leave_goes_out_to_meet_its_deadline_and_is_refused_if_nothing_takes_it() -> None:
    """The cluster meets the latency target (nothing spills), but not this request's deadline."""
    tight = {DEADLINE: "0.005"}
    assert decide(req("public", **tight), snap(CALM, aws=WARM), POLICY).target == "aws"
    assert decide(req("public"), snap(CALM, aws=WARM), POLICY).target == LOCAL
    # Only a cold start, longer than the local queue and the cluster meeting its target: nowhere.
    nowhere = decide(req("public", **tight), snap(CALM), POLICY)
    assert (nowhere.target, nowhere.label, nowhere.on_prem_only) == (SHED, "deadline", False)


def test_a_sheddable_request_that_may_leave_spills_rather_than_being_refused() -> None:
    assert decide(req("public", **{PRIORITY: "sheddable"}), snap(BUSY, aws=WARM), POLICY).target == "aws"


def test_the_default_priority_is_the_configs() -> None:
    sheddable = dataclasses.replace(POLICY, default_sheddable=True)
    assert decide(req(), snap(BUSY), sheddable).label == "deadline"
    assert decide(req(**{PRIORITY: "critical"}), snap(BUSY), sheddable).label == "residency"


def test_without_fresh_signals_no_deadline_refuses_anything() -> None:
    stale = BUSY._replace(fresh=False)
    assert decide(req(**{DEADLINE: "0"}), snap(stale), POLICY).target == LOCAL


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (DEADLINE, "soon"),
        (DEADLINE, "-1"),
        (DEADLINE, "1e3"),
        (DEADLINE, ""),
        (DEADLINE, "1.2345"),
        (DEADLINE, "0x10"),
        (DEADLINE, "1,2"),
        (DEADLINE, "\u0661"),  # an Arabic-Indic digit: a digit to Python's \d, not to [0-9]
        (PRIORITY, "urgent"),
        (PRIORITY, ""),
    ],
)
def test_a_deadline_or_priority_that_says_neither_is_a_400(header: str, value: str) -> None:
    decision = decide(req("public", **{header: value}), snap(CALM, aws=WARM), POLICY)
    assert (decision.target, decision.status, decision.label) == (SHED, 400, Reason.ADMISSION_INVALID)
    message = invalid_message(POLICY)
    assert DEADLINE in message and PRIORITY in message


def test_headers_switched_off_are_not_read() -> None:
    off = dataclasses.replace(POLICY, deadline_header="", priority_header="")
    decision = decide(req(**{DEADLINE: "soon", PRIORITY: "sheddable"}), snap(BUSY), off)
    assert (decision.target, decision.label) == (LOCAL, "residency")


@settings(max_examples=300, deadline=None)
@given(
    classification=st.sampled_from(["public", "confidential"]),
    deadline_ms=st.integers(0, 3000),
    sheddable=st.booleans(),
    queue_ms=st.sampled_from([0.0, 50.0, 95.0, 300.0, 1500.0, 5000.0]),
    pending=st.integers(0, 400),
    warm=st.integers(0, 3),
)
def test_no_request_is_refused_for_its_deadline_that_the_cluster_could_still_answer_in_time(
    classification: str, deadline_ms: int, sheddable: bool, queue_ms: float, pending: int, warm: int
) -> None:
    load = LocalLoad(fresh=True, queue_ms=queue_ms, compute_ms=10, pending=pending)
    headers = {DEADLINE: f"{deadline_ms / 1000:.3f}", PRIORITY: "sheddable" if sheddable else "critical"}
    features = req(classification, **headers)
    decision = decide(features, snap(load, aws=TargetState(warm_instances=warm)), POLICY)
    if decision.reason is Reason.DEADLINE:
        assert estimated_latency_ms(load, POLICY) > deadline_ms
    if decision.target not in (LOCAL, SHED):
        assert may_leave(features, POLICY)
