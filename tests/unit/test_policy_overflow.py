"""The overflow decision's inputs: the gateway's own in-flight count, the headroom kept for
on-prem-only traffic, the cheapest warm target and instance concurrency, and how the runner
measures what the policy reads (on-prem-only arrivals, counts handed in with a request)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gateway_plugin.books.target_states import Counts
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import LOCAL
from gateway_plugin.policy.overflow import estimated_latency_ms, onprem_reserve_ms, overflowing
from gateway_plugin.policy.snapshot import LocalLoad, RequestFeatures, Snapshot, TargetState
from gateway_plugin.signals.load import RATE_S
from gateway_plugin.signals.members import Counters
from gateway_plugin.simulation.runner_policy import _SimulatedState

CONFIG = SpillwayConfig.model_validate(
    {
        "local": {"latency_target_ms": 100, "parallelism": 2},
        "overflow": {"enter_ratio": 1.0, "exit_ratio": 0.8, "onprem_headroom": 2.0},
        "targets": [
            {"name": "aws", "kind": "aws_lambda", "url": "https://a.example", "concurrency_cap": 8},
            {
                "name": "ali",
                "kind": "aliyun_fc",
                "url": "https://b.example",
                "concurrency_cap": 8,
                "instance_concurrency": 4,
                "cost": {"memory_gb": 1.0, "expected_duration_ms": 20},
            },
        ],
    }
)
POLICY = build_policy(CONFIG)
# 10 ms a request on 2 instances: 200 requests/s; 70 ms of estimated latency, under the 100 ms target.
QUIET = LocalLoad(fresh=True, queue_ms=60, compute_ms=10)


def _public(model: str = "m") -> RequestFeatures:
    return RequestFeatures(f"/v2/models/{model}/infer", {"x-data-classification": "public"}, {}, model)


def _at(rho: float) -> LocalLoad:
    """QUIET with on-prem-only arrivals using ``rho`` of the cluster."""
    return QUIET._replace(onprem_rps=rho * 200)


def test_the_gateways_own_count_shows_a_queue_the_scrape_has_not_seen_yet() -> None:
    idle = LocalLoad(fresh=True, queue_ms=0, compute_ms=10)
    assert estimated_latency_ms(idle, POLICY) == 10
    # 30 at the cluster, 2 running: the next waits for 29 to finish, 5 ms each, then runs 10 ms.
    assert estimated_latency_ms(idle._replace(in_flight=30), POLICY) == 29 * 5 + 10
    assert overflowing(idle._replace(in_flight=30), 100, POLICY)
    assert estimated_latency_ms(idle._replace(in_flight=1), POLICY) == 10, "a free instance: no wait"
    others = LocalLoad(fresh=True, queue_ms=300, compute_ms=10, pending=20)
    assert estimated_latency_ms(others._replace(in_flight=0), POLICY) == 20 * 5 + 10, (
        "the scrape's backlog holds other gateways' requests: the larger estimate stands"
    )
    answered = LocalLoad(fresh=True, queue_ms=300, compute_ms=10, observed_ms=400)
    assert estimated_latency_ms(answered, POLICY) == 400
    assert estimated_latency_ms(answered._replace(in_flight=0), POLICY) == 10, (
        "with a count, the queue times of requests already answered no longer hold the estimate up"
    )


def test_on_prem_only_load_spills_requests_that_may_leave_sooner_and_all_of_them_past_capacity() -> None:
    """Requests that may not leave have nowhere else to go: as their share of the cluster rises,
    the latency at which the others spill falls, and once they fill it every other request spills."""
    assert onprem_reserve_ms(_at(0.0), POLICY) == 0
    assert onprem_reserve_ms(_at(0.5), POLICY) == pytest.approx(2 * 5 * 1.0)
    assert onprem_reserve_ms(_at(0.8), POLICY) == pytest.approx(2 * 5 * 4.0)
    assert onprem_reserve_ms(_at(1.0), POLICY) == math.inf
    warm = {"aws": TargetState(warm_instances=3)}
    for rho, where in ((0.0, LOCAL), (0.5, LOCAL), (0.8, "aws"), (1.2, "aws")):
        assert decide(_public(), Snapshot({"m": _at(rho)}, warm), POLICY).target == where, rho
    idle = LocalLoad(fresh=True, compute_ms=10, onprem_rps=300)
    assert decide(_public(), Snapshot({"m": idle}, warm), POLICY).target == "aws"
    none = dataclasses.replace(POLICY, onprem_headroom=0.0)
    assert decide(_public(), Snapshot({"m": _at(0.8)}, warm), none).target == LOCAL


def test_on_prem_only_requests_stay_and_say_so_whatever_the_headroom() -> None:
    confidential = RequestFeatures("/v2/models/m/infer", {"x-data-classification": "secret"}, {}, "m")
    warm = {"aws": TargetState(warm_instances=3)}
    for rho in (0.0, 0.8, 2.0):
        decision = decide(confidential, Snapshot({"m": _at(rho)}, warm), POLICY)
        assert decision.target == LOCAL and decision.on_prem_only, rho
    assert not decide(_public(), Snapshot({"m": QUIET}, warm), POLICY).on_prem_only


def test_the_cheapest_warm_target_serves_and_the_chain_orders_cold_starts() -> None:
    assert POLICY.targets["ali"].cost_usd < POLICY.targets["aws"].cost_usd
    busy = QUIET._replace(queue_ms=300)
    both = {"aws": TargetState(warm_instances=2), "ali": TargetState(warm_instances=1)}
    decision = decide(_public(), Snapshot({"m": busy}, both), POLICY)
    assert (decision.target, decision.label) == ("ali", "overflow_warm")
    assert decision.cost_usd == POLICY.targets["ali"].cost_usd
    cold = decide(_public(), Snapshot({"m": busy}, {}), POLICY)
    assert (cold.target, cold.label) == ("aws", "overflow_cold")


def test_an_instance_serves_as_many_requests_as_its_instance_concurrency() -> None:
    busy = QUIET._replace(queue_ms=300)
    for in_flight, label in ((3, "overflow_warm"), (4, "overflow_cold")):
        targets = {"ali": TargetState(warm_instances=1, in_flight=in_flight)}
        decision = decide(_public(), Snapshot({"m": busy}, targets), POLICY)
        assert (decision.target, decision.label) == (("ali" if in_flight < 4 else "aws"), label)


def test_requests_sent_cold_leave_the_warm_instances_free() -> None:
    """Six requests in flight, five of them starting instances of their own: of the two warm
    instances the gateway knows, one is free."""
    busy = QUIET._replace(queue_ms=300)
    aws = TargetState(warm_instances=2, in_flight=6)
    snapshot = Snapshot({"m": busy}, {"aws": aws})
    assert decide(_public(), snapshot, POLICY).label == "overflow_cold"
    decision = decide(_public(), snapshot._replace(targets={"aws": aws._replace(starting=5)}), POLICY)
    assert (decision.target, decision.label) == ("aws", "overflow_warm")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_runner_measures_on_prem_only_arrivals_and_takes_the_gateways_counts() -> None:
    clock = _Clock()
    state = _SimulatedState(CONFIG, GatewaySecrets(), clock=clock, wall=clock)
    state.load.observe([{"m": Counters(success=0)}])
    confidential = RequestFeatures("/v2/models/m/infer", {}, {}, "m")
    for _ in range(50):
        state.commit(decide(confidential, state.snapshot(None, "m"), state.policy), "m")
    rate = state.snapshot(None, "m").local["m"].onprem_rps
    assert rate == pytest.approx(50 / RATE_S)
    clock.now += RATE_S
    assert state.snapshot(None, "m").local["m"].onprem_rps == pytest.approx(rate / math.e)
    counted = state.snapshot(None, "m", Counts({"local": 7, "aws": 3}, {"aws": 2}))
    assert counted.local["m"].in_flight == 7 and counted.local[""].in_flight == 7
    assert (counted.targets["aws"].in_flight, counted.targets["aws"].starting) == (3, 2)
    assert state.snapshot(None, "m").local["m"].in_flight == -1


def test_the_runners_own_books_count_cold_dispatches_until_a_cold_answer() -> None:
    clock = _Clock()
    state = _SimulatedState(CONFIG, GatewaySecrets(), clock=clock, wall=clock)
    state.load.observe([{"m": Counters(success=0)}])
    busy = LocalLoad(fresh=True, queue_ms=300, compute_ms=10)
    cold = decide(_public(), Snapshot({"m": busy}, {}), state.policy)
    assert cold.label == "overflow_cold"
    state.commit(cold, "m")
    assert state.snapshot(None, "m").targets["aws"].starting == 1
    state.answered("aws", None, True, "i-1", cold=True, seconds=0.5)
    assert state.snapshot(None, "m").targets["aws"].starting == 0
