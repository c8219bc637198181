"""The oracle is an upper bound in practice: on every trace family and both example configs, for
every point of every baseline's sweep and for Spillway's default there is an oracle point with at
least its SLO attainment at no more than its spend. And it keeps residency, and plans only with
what it is said to know."""

from __future__ import annotations

import itertools

import pytest

from gateway_plugin.simulation.engine import jobs, replay
from gateway_plugin.simulation.frontier import sweep
from gateway_plugin.simulation.oracle import Oracle, _window_max
from gateway_plugin.simulation.trace import Shaping
from tests.unit.test_simulation_matrix import CONFIGS, SECONDS, capacity, family

CELLS = list(itertools.product(CONFIGS, ("heavy", "burst", "cron", "daily", "sporadic"), (0.5, 2.0)))


@pytest.mark.parametrize(
    ("config_name", "family_name", "load"), CELLS, ids=["-".join(map(str, c)) for c in CELLS]
)
def test_neither_a_baseline_point_nor_spillway_reaches_a_higher_slo_at_no_more_spend_than_the_oracle(
    config_name: str, family_name: str, load: float
) -> None:
    config = CONFIGS[config_name]
    trace = family(family_name, load * capacity(config), SECONDS[load])
    frontier = sweep(config, trace, Shaping(confidential_share=0.2), 7, knobs=False)
    assert frontier["oracle_bounds_baselines"], frontier["baselines_past_the_oracle"]
    assert frontier["oracle_bounds_spillway"], frontier["spillway_default"]
    assert frontier["oracle_frontier"]


def test_the_oracle_keeps_residency_sheds_only_what_would_miss_and_a_price_keeps_it_home() -> None:
    config = CONFIGS["example"]
    trace = family("burst", 2 * capacity(config), SECONDS[2.0])
    arrivals = list(jobs(config, trace, Shaping(confidential_share=0.5), 7))
    measures = replay(config, Oracle(config, arrivals), arrivals, 7)
    figures = measures.summary()
    assert measures.residency_breaches == 0 and figures["cloud_cost_usd"] > 0 and figures["shed"] > 0
    local = [ms for ms, kind in zip(measures.latency_ms, measures.kinds, strict=True) if kind == 0]
    assert max(local) <= measures.latency_target_ms, "a request it kept local missed: it knew"
    home = replay(config, Oracle(config, arrivals, price=1e9, pool=0.0), arrivals, 7).summary()
    assert home["cloud_cost_usd"] == 0 and home["cloud_share"] == 0


def test_the_pool_plan_looks_over_an_instances_life() -> None:
    values = [1.0, 5.0, 2.0, 0.0, 3.0, 0.0, 0.0, 9.0]
    assert _window_max(values, 1, 2) == [max(values[i + 1 : i + 3] or [0.0]) for i in range(len(values))]
