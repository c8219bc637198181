"""Spillway's default against every baseline's sweep, across traffic it was not tuned on: each
trace family shaped like a published serverless workload x on-prem-only share x load (0.5x to 20x
the cluster's capacity) x both example configs.

In every cell: no baseline point dominates the default (a higher SLO attainment by more than 0.2
points at no more than 2 % more spend), no request that may leave is shed while a cloud target had
an idle warm instance under its cap to serve it within the target, and no on-prem-only request
leaves. The traces are short (a few thousand requests a cell, the families' periods compressed to
fit), so the matrix runs in under a minute; ``bench/simulation_goals.py`` runs the full-length
traces.

The full cross product (7 families x 3 shares x 5 loads x 2 configs, 210 cells) takes over two
minutes, so CI runs a subset: every family at every load with 20 % of the traffic on-prem-only (the
share the benchmarks use), and the 5x load with half of it on-prem-only (where the reserve for
on-prem-only traffic and the cloud's cold starts meet at a load the cloud can absorb).
SPILLWAY_MATRIX_FULL=1 runs every cell (shares 0 and 0.5 at every load too), SPILLWAY_MATRIX_SEED
another draw of arrivals and world, SPILLWAY_MATRIX_TRACE_SEED another draw of the traces' shapes;
the cells marked as known to be dominated are so at the default seeds (7, trace 1).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

from gateway_plugin.config import SpillwayConfig, load, parse
from gateway_plugin.policy.decide import may_leave
from gateway_plugin.policy.model import SHED
from gateway_plugin.simulation.baselines import SWEEPS
from gateway_plugin.simulation.cluster import Job
from gateway_plugin.simulation.engine import jobs, replay
from gateway_plugin.simulation.frontier import Point, dominating
from gateway_plugin.simulation.runner_policy import SpillwayRouter
from gateway_plugin.simulation.trace import Shaping, generate
from gateway_plugin.simulation.workloads import FAMILIES
from gateway_plugin.simulation.world import World
from testing.paths import ROOT

SLO_TOLERANCE, SPEND_TOLERANCE = 0.002, 0.02
LOADS = (0.5, 2.0, 5.0, 10.0, 20.0)
# Seconds of trace per load: about the same number of requests in every cell.
SECONDS = {0.5: 120, 2.0: 45, 5.0: 20, 10.0: 12, 20.0: 6}
# The seeds of each cell's arrivals and world, and of its trace's shape (SPILLWAY_MATRIX_SEED and
# SPILLWAY_MATRIX_TRACE_SEED run another draw).
SEED = int(os.environ.get("SPILLWAY_MATRIX_SEED", "7"))
TRACE_SEED = int(os.environ.get("SPILLWAY_MATRIX_TRACE_SEED", "1"))


def _loopback(path: str) -> SpillwayConfig:
    """An example config with every host it names moved to loopback: nothing here may reach out."""
    data = load(ROOT / path).model_dump()
    for endpoint in data["local"]["endpoints"]:
        endpoint["url"], endpoint["metrics_url"] = "http://127.0.0.1:1", "http://127.0.0.1:1/metrics"
    for port, target in enumerate(data["targets"], start=1):
        if target.get("url"):
            target["url"] = f"http://127.0.0.1:{port}"
        target["endpoint_url"] = None
    return parse(data, path)


CONFIGS = {
    name: _loopback(path)
    for name, path in (("example", "examples/spillway.yaml"), ("bursty", "examples/simulation/bursty.yaml"))
}


def capacity(config: SpillwayConfig) -> float:
    return config.local.parallelism * 1000 / config.simulation.cluster.service_ms


def family(name: str, mean: float, seconds: int) -> Any:
    """The family with its periods compressed to the trace's length."""
    compressed = {
        "heavy": {"block_s": seconds / 6},
        "burst": {"gap_s": seconds / 4},
        "cron": {"period_s": seconds / 4},
        "daily": {"period_s": 10 * seconds},
        "sporadic": {"idle_s": seconds / 3, "active_s": seconds / 10},
        "rare_bursts": {"off_s": seconds, "on_s": seconds / 5},
        "flash": {"period_s": 10 * seconds, "flash_s": seconds / 10},
    }[name]
    return generate(name, {"mean": mean, "seconds": seconds, "seed": TRACE_SEED, **compressed})


class _Watched(SpillwayRouter):
    """Spillway's router, counting the requests that may leave it sheds while a target in its chain
    had an idle warm instance under its cap that would have answered within the target."""

    def __init__(self, config: SpillwayConfig) -> None:
        super().__init__(config)
        self.shed_with_room = 0
        self.chain = self.state.policy.default_chain

    def route(self, job: Job, now: float, world: World) -> str:
        target = super().route(job, now, world)
        if target == SHED and may_leave(world.features[job.confidential], self.state.policy):
            self.shed_with_room += any(self._room(name, job, now, world) for name in self.chain)
        return target

    def _room(self, name: str, job: Job, now: float, world: World) -> bool:
        cloud, spec = world.clouds[name], self.state.policy.targets[name]
        fits = cloud.in_flight < spec.concurrency_cap and spec.takes(job.body_bytes)
        return (
            fits
            and cloud.idle_warm(now) > 0
            and cloud.network_s * 1000 + cloud.service_ms(0) <= world.latency_target_ms
        )


CELLS = (
    list(itertools.product(CONFIGS, FAMILIES, (0.0, 0.2, 0.5), LOADS))
    if os.environ.get("SPILLWAY_MATRIX_FULL") == "1"
    else [
        *itertools.product(CONFIGS, FAMILIES, (0.2,), LOADS),
        *itertools.product(CONFIGS, FAMILIES, (0.5,), (5.0,)),
    ]
)
# Cells where a baseline point dominates the default at the default seeds, with what was measured
# (seed 7 / seed 11, trace seed 1): they fail the day the default is no longer dominated there.
DOMINATED = {
    ("example", "burst", 0.2, 20.0): "by static_threshold(utilisation=0.5): 0.37 points at 1.014x the "
    "spend (seed 11: 0.59 at 1.015x); on a 6 s trace at 20x, cold starts (4-6 s) decide the SLO",
    ("example", "daily", 0.2, 20.0): "by least_busy(cost_weight=1): 0.23 points at 1.001x the spend "
    "(seed 11: all_cloud, 0.13 at 1.002x, not dominated): within seed-to-seed noise",
}


def _cell(config_name: str, family_name: str, share: float, load: float) -> Any:
    reason = DOMINATED.get((config_name, family_name, share, load))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    cell_id = f"{config_name}-{family_name}-{share}-{load}"
    return pytest.param(config_name, family_name, share, load, marks=marks, id=cell_id)


@pytest.mark.parametrize(("config_name", "family_name", "share", "load"), [_cell(*c) for c in CELLS])
def test_spillway_is_dominated_by_no_baseline_point_and_keeps_its_promises(
    config_name: str, family_name: str, share: float, load: float
) -> None:
    config = CONFIGS[config_name]
    trace = family(family_name, load * capacity(config), SECONDS[load])
    arrivals = list(jobs(config, trace, Shaping(confidential_share=share), SEED))
    router = _Watched(config)
    measures = replay(config, router, arrivals, SEED)
    ours = measures.summary()
    default = Point("spillway", {}, ours["slo_attainment"], ours["cloud_cost_usd"])
    points = []
    for makers in SWEEPS.values():
        for make in makers:
            baseline = make(config)
            figures = replay(config, baseline, arrivals, SEED).summary()
            points.append(
                Point(baseline.name, baseline.params, figures["slo_attainment"], figures["cloud_cost_usd"])
            )
    over = dominating(default, points, SLO_TOLERANCE, SPEND_TOLERANCE)
    assert not over, (default, over)
    assert router.shed_with_room == 0
    assert ours["residency_breaches"] == 0
