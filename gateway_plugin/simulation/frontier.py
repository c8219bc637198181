"""``simulate --frontier``: every policy's (spend, SLO attainment) points over the same requests,
the Pareto frontier they make, whether any point dominates Spillway's default and by how much,
and whether the oracle's points bound every baseline's.

A point dominates another when its SLO attainment is higher and its cloud spend no higher. The
points: Spillway's default and its own knobs (how early it spills, how much headroom it keeps for
on-prem-only traffic), each baseline's sweep (``baselines.SWEEPS``: static_threshold's utilisation
0.5-0.95, least_busy's cost weight, ...), and the oracle's (``oracle``: price and pool size).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway_plugin.config import SpillwayConfig, parse
from gateway_plugin.simulation.baselines import SWEEPS
from gateway_plugin.simulation.engine import jobs, replay
from gateway_plugin.simulation.oracle import Oracle
from gateway_plugin.simulation.results import Measures
from gateway_plugin.simulation.runner_policy import SpillwayRouter
from gateway_plugin.simulation.trace import Shaping, Trace
from gateway_plugin.simulation.world import Router

# Spillway's own knobs: (enter_ratio, exit_ratio, onprem_headroom); None keeps the config's.
SPILLWAY_KNOBS: tuple[tuple[float | None, float | None, float | None], ...] = (
    (None, None, None),
    (0.6, 0.5, None),
    (0.8, 0.7, None),
    (1.0, 0.8, None),
    (None, None, 0.0),
    (None, None, 5.0),
)
# The oracle's (price USD per request met, pool, spread, eager) grid; 1e9 USD a request: the cloud is
# never worth it, and a pool of 0 starts nothing.
ORACLE_GRID: tuple[tuple[float, float, bool, bool], ...] = (
    (0.0, 0.5, False, True),
    (0.0, 1.0, False, True),
    (0.0, 2.0, False, True),
    (0.0, 1.0, True, True),
    (0.0, 2.0, True, True),
    (0.0, 1.0, False, False),
    (0.0, 2.0, True, False),
    (1e5, 1.0, False, True),
    (1e9, 0.0, False, True),
)
# Where a point is left unbounded: pools between and past the grid's, then smaller ones.
POOLS_BETWEEN = (0.6, 0.7, 0.8, 0.9, 1.25, 1.5, 3.0, 4.0, 6.0)
Tick = Callable[[str], Callable[[float], None] | None]
POOL_STEP, MIN_POOL = 0.8, 0.05


@dataclass(frozen=True)
class Point:
    policy: str
    params: dict[str, float]
    slo: float
    spend: float
    figures: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "params": self.params,
            "slo_attainment": self.slo,
            "cloud_cost_usd": self.spend,
            **{
                k: self.figures[k]
                for k in ("p99_ms", "cloud_share", "shed", "flaps_per_min", "cold_hits", "warmup_cost_usd")
                if k in self.figures
            },
        }


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other dominates, cheapest first (at equal spend, the higher SLO only)."""
    out: list[Point] = []
    for point in sorted(points, key=lambda p: (p.spend, -p.slo)):
        if not out or point.slo > out[-1].slo:
            out.append(point)
    return out


def dominating(
    point: Point, others: Sequence[Point], slo_tol: float = 0.0, spend_tol: float = 0.0
) -> list[Point]:
    """The points with a higher SLO attainment (by more than ``slo_tol``) at a spend no higher
    than ``point``'s (give or take ``spend_tol`` of it)."""
    return [
        o for o in others if o.slo > point.slo + slo_tol and o.spend <= point.spend * (1 + spend_tol) + 1e-12
    ]


def bounded_by(point: Point, bounds: Sequence[Point]) -> bool:
    """Whether some bound reaches at least ``point``'s SLO attainment at no more than its spend."""
    return any(b.slo >= point.slo and b.spend <= point.spend + 1e-12 for b in bounds)


def cheapest_reaching(point: Point, bounds: Sequence[Point]) -> Point | None:
    """The bound that spends least to reach ``point``'s SLO attainment (None: none does): what that
    attainment needed, against which ``point``'s own spend is read."""
    return min((b for b in bounds if b.slo >= point.slo), key=lambda b: (b.spend, -b.slo), default=None)


def with_knobs(
    config: SpillwayConfig, enter: float | None, exit: float | None, headroom: float | None
) -> SpillwayConfig:
    data = config.model_dump()
    for key, value in (("enter_ratio", enter), ("exit_ratio", exit), ("onprem_headroom", headroom)):
        if value is not None:
            data["overflow"][key] = value
    return parse(data, "a frontier point")


def _point(router: Router, measures: Measures, params: dict[str, float]) -> Point:
    figures = measures.summary()
    return Point(router.name, params, figures["slo_attainment"], figures["cloud_cost_usd"], figures)


def sweep(
    config: SpillwayConfig,
    trace: Trace,
    shaping: Shaping,
    seed: int,
    tick: Tick | None = None,
    oracle: bool = True,
    knobs: bool = True,
) -> dict[str, Any]:
    """Every point on the same requests (drawn once); the frontier and what it says of Spillway's
    default. ``knobs=False`` runs Spillway's default alone."""
    arrivals = list(jobs(config, trace, shaping, seed))

    def run(router: Router, params: dict[str, float], on: SpillwayConfig = config) -> Point:
        return _point(router, replay(on, router, arrivals, seed, tick(router.name) if tick else None), params)

    ours: list[Point] = []
    for enter, exit_, headroom in SPILLWAY_KNOBS if knobs else SPILLWAY_KNOBS[:1]:
        variant = with_knobs(config, enter, exit_, headroom)
        params = {
            "enter_ratio": variant.overflow.enter_ratio,
            "exit_ratio": variant.overflow.exit_ratio,
            "onprem_headroom": variant.overflow.onprem_headroom,
        }
        if all(p.params != params for p in ours):
            ours.append(run(SpillwayRouter(variant), params, variant))
    baselines = [
        run(router, router.params) for makers in SWEEPS.values() for router in (m(config) for m in makers)
    ]
    oracles: list[Point] = []
    # The oracle plans whole answers; a generation's SLO is its first token, which it does not plan.
    if oracle and config.simulation.generation is None:
        for price, pool, spread, eager in ORACLE_GRID:
            made = Oracle(config, arrivals, price, pool, spread, eager)
            oracles.append(run(made, made.params))
        # Where a baseline point or Spillway's default is left unbounded, the oracle plans again
        # with other pool sizes (the instances it starts are its spend's main part): between and
        # past the grid's, then smaller.
        smaller = (round(0.5 * POOL_STEP**k, 4) for k in range(1, 100))
        for pool in (*POOLS_BETWEEN, *itertools.takewhile(lambda p: p > MIN_POOL, smaller)):
            if not any(b.spend > 0 and not bounded_by(b, oracles) for b in (*baselines, ours[0])):
                break
            for spread, eager in itertools.product((False, True), (True, False)):
                made = Oracle(config, arrivals, 0.0, pool, spread, eager)
                oracles.append(run(made, made.params))
    return summarise(ours[0], ours[1:], baselines, oracles)


def summarise(
    default: Point, knobs: Sequence[Point], baselines: Sequence[Point], oracles: Sequence[Point]
) -> dict[str, Any]:
    over = dominating(default, baselines)
    cheaper = [b for b in baselines if b.slo >= default.slo and b.spend < default.spend]
    unbounded = [b for b in baselines if not bounded_by(b, oracles)] if oracles else []
    needed = cheapest_reaching(default, oracles)
    return {
        "points": [p.as_json() for p in (default, *knobs, *baselines, *oracles)],
        "frontier": [p.as_json() for p in pareto([default, *knobs, *baselines])],
        "oracle_frontier": [p.as_json() for p in pareto(oracles)],
        "spillway_default": default.as_json(),
        "dominated": bool(over),
        "dominated_by": [
            {**p.as_json(), "slo_points_more": round((p.slo - default.slo) * 100, 3)} for p in over
        ],
        "most_slo_points_more": round(max(((p.slo - default.slo) * 100 for p in over), default=0.0), 3),
        "most_spend_saved": round(max((1 - b.spend / default.spend for b in cheaper), default=0.0), 4)
        if default.spend > 0
        else 0.0,
        "oracle_bounds_baselines": not unbounded if oracles else None,
        "oracle_bounds_spillway": bounded_by(default, oracles) if oracles else None,
        # Spend at equal SLO: the default's over the least an oracle point pays to reach its SLO
        # attainment (1 where both are nothing; None where none reaches it, or it needed nothing
        # and the default spent).
        "oracle_at_equal_slo": needed.as_json() if needed else None,
        "oracle_spend_at_equal_slo": needed.spend if needed else None,
        "spend_vs_oracle_at_equal_slo": _ratio(default.spend, needed.spend if needed else None),
        "baselines_past_the_oracle": [p.as_json() for p in unbounded],
    }


def _ratio(spend: float, needed: float | None) -> float | None:
    if needed is None or (needed <= 0 < spend):
        return None
    return round(spend / needed, 4) if needed > 0 else 1.0


def text(frontier: dict[str, Any]) -> str:
    """The frontier as the command prints it on a terminal."""

    def line(p: dict[str, Any]) -> str:
        params = ",".join(f"{k}={v:g}" for k, v in p["params"].items())
        return f"  {p['policy']}({params}): SLO {p['slo_attainment']:.2%} at ${p['cloud_cost_usd']:.4f}"

    default = frontier["spillway_default"]
    lines = ["", "Pareto frontier (Spillway's knobs and every baseline's sweep):"]
    lines += [line(p) for p in frontier["frontier"]]
    lines += ["oracle's frontier:", *(line(p) for p in frontier["oracle_frontier"])]
    if frontier["dominated"]:
        most = frontier["most_slo_points_more"]
        lines.append(f"Spillway's default is dominated: up to {most} SLO points more at no more spend")
    else:
        lines.append(f"Spillway's default ({line(default).strip()}) is dominated by no point")
    ratio, needed = frontier.get("spend_vs_oracle_at_equal_slo"), frontier.get("oracle_spend_at_equal_slo")
    if needed is not None:
        said = f"{ratio:.2f}x that" if ratio is not None else "more"
        lines.append(f"the oracle reaches the default's SLO for ${needed:.4f}: Spillway spends {said}")
    return "\n".join(lines)
