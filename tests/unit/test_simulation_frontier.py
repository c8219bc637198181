"""``simulate --frontier``: the Pareto frontier of every policy's points, whether any dominates
Spillway's default and by how much, and the plot in the report."""

from __future__ import annotations

import json
from pathlib import Path

from gateway_plugin.simulation.frontier import Point, bounded_by, dominating, pareto, summarise
from tests.unit.test_simulation import _simulate


def _p(name: str, slo: float, spend: float) -> Point:
    return Point(name, {}, slo, spend)


def test_the_frontier_keeps_the_points_no_other_dominates() -> None:
    points = [
        _p("a", 0.9, 1.0),
        _p("b", 0.95, 1.0),
        _p("c", 0.8, 0.5),
        _p("d", 0.85, 2.0),
        _p("e", 0.99, 3.0),
    ]
    assert [p.policy for p in pareto(points)] == ["c", "b", "e"]


def test_dominance_needs_more_slo_at_no_more_spend_within_the_tolerances() -> None:
    default = _p("spillway", 0.90, 1.00)
    others = [
        _p("more_slo_same_spend", 0.91, 1.0),
        _p("more_slo_more_spend", 0.95, 1.03),
        _p("less", 0.89, 0.5),
    ]
    assert [p.policy for p in dominating(default, others)] == ["more_slo_same_spend"]
    assert dominating(default, others, slo_tol=0.02) == []
    assert [p.policy for p in dominating(default, others, spend_tol=0.05)] == [
        "more_slo_same_spend",
        "more_slo_more_spend",
    ]
    assert bounded_by(_p("b", 0.9, 1.0), [_p("o", 0.9, 1.0)]) and not bounded_by(
        _p("b", 0.9, 1.0), [_p("o", 0.95, 1.01)]
    )


def test_the_summary_says_by_how_much_the_default_is_dominated_and_what_the_oracle_bounds() -> None:
    result = summarise(
        _p("spillway", 0.90, 1.0),
        [],
        [_p("least_busy", 0.93, 0.8), _p("static", 0.95, 2.0)],
        [_p("oracle", 0.97, 0.9)],
    )
    assert result["dominated"] and result["most_slo_points_more"] == 3.0 and result["most_spend_saved"] == 0.2
    assert result["oracle_bounds_baselines"] is False
    assert [p["policy"] for p in result["baselines_past_the_oracle"]] == ["least_busy"]


def test_the_command_prints_the_frontier_and_plots_it(tmp_path: Path) -> None:
    done = _simulate(
        "--config", "examples/simulation/bursty.yaml", "--trace", "burst:mean=60,seconds=60",
        "--confidential-share", "0.2", "--frontier", "--json", "--report", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    frontier = json.loads(done.stdout)["frontier"]
    assert {"points", "frontier", "oracle_frontier", "spillway_default", "dominated", "dominated_by"} <= set(
        frontier
    )
    policies = {p["policy"] for p in frontier["points"]}
    assert policies == {
        "spillway",
        "all_local",
        "all_cloud",
        "static_threshold",
        "least_busy",
        "perfect",
        "oracle",
    }
    utilisations = sorted(
        p["params"]["utilisation"] for p in frontier["points"] if p["policy"] == "static_threshold"
    )
    assert utilisations[0] == 0.5 and utilisations[-1] == 0.95
    assert frontier["oracle_bounds_baselines"] is True
    default = frontier["spillway_default"]
    reaching = [
        p["cloud_cost_usd"]
        for p in frontier["points"]
        if p["policy"] == "oracle" and p["slo_attainment"] >= default["slo_attainment"]
    ]
    assert frontier["oracle_spend_at_equal_slo"] == min(reaching) > 0
    assert frontier["spend_vs_oracle_at_equal_slo"] == round(default["cloud_cost_usd"] / min(reaching), 4)
    report = (tmp_path / "report.html").read_text()
    assert 'id="chart-pareto"' in report and "Pareto frontier" in report


def test_spend_at_equal_slo_is_read_against_the_cheapest_oracle_point_that_reaches_it() -> None:
    oracles = [_p("oracle", 0.85, 0.2), _p("oracle", 0.91, 0.5), _p("oracle", 0.99, 0.8)]
    result = summarise(_p("spillway", 0.90, 1.0), [], [], oracles)
    assert result["oracle_spend_at_equal_slo"] == 0.5 and result["spend_vs_oracle_at_equal_slo"] == 2.0
    out_of_reach = summarise(_p("spillway", 0.995, 1.0), [], [], oracles)
    assert out_of_reach["oracle_spend_at_equal_slo"] is None
    assert out_of_reach["spend_vs_oracle_at_equal_slo"] is None
    free = [_p("oracle", 0.95, 0.0)]
    assert summarise(_p("spillway", 0.9, 0.0), [], [], free)["spend_vs_oracle_at_equal_slo"] == 1.0
    assert summarise(_p("spillway", 0.9, 0.1), [], [], free)["spend_vs_oracle_at_equal_slo"] is None
