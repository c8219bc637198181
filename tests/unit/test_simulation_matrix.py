"""Spillway's default against every baseline's sweep, across traffic it was not tuned on: each
trace family shaped like a published serverless workload, x on-prem-only share (0, 0.2, 0.5) x
load (0.5x, 2x and 10x the cluster's capacity) x both example configs.

In every cell: no baseline point dominates the default (a higher SLO attainment by more than 0.2
points at no more than 2 % more spend), no request that may leave is shed while a cloud target had
an idle warm instance under its cap to serve it within the target, and no on-prem-only request
leaves. The traces are short (a few thousand requests a cell, the families' periods compressed to
fit), so the whole matrix runs in well under a minute; ``bench/simulation_goals.py`` runs the
full-length traces.
"""

from __future__ import annotations

import itertools
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
from gateway_plugin.simulation.world import World
from testing.paths import ROOT

SLO_TOLERANCE, SPEND_TOLERANCE = 0.002, 0.02
SHARES = (0.0, 0.2, 0.5)
LOADS = (0.5, 2.0, 10.0)
# Seconds of trace per load: about the same number of requests in every cell.
SECONDS = {0.5: 120, 2.0: 45, 10.0: 12}


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
    }[name]
    return generate(name, {"mean": mean, "seconds": seconds, **compressed})


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


CELLS = list(itertools.product(CONFIGS, ("heavy", "burst", "cron", "daily", "sporadic"), SHARES, LOADS))


@pytest.mark.parametrize(
    ("config_name", "family_name", "share", "load"), CELLS, ids=["-".join(map(str, c)) for c in CELLS]
)
def test_spillway_is_dominated_by_no_baseline_point_and_keeps_its_promises(
    config_name: str, family_name: str, share: float, load: float
) -> None:
    config = CONFIGS[config_name]
    trace = family(family_name, load * capacity(config), SECONDS[load])
    arrivals = list(jobs(config, trace, Shaping(confidential_share=share), 7))
    router = _Watched(config)
    measures = replay(config, router, arrivals, 7)
    ours = measures.summary()
    default = Point("spillway", {}, ours["slo_attainment"], ours["cloud_cost_usd"])
    points = []
    for makers in SWEEPS.values():
        for make in makers:
            baseline = make(config)
            figures = replay(config, baseline, arrivals, 7).summary()
            points.append(
                Point(baseline.name, baseline.params, figures["slo_attainment"], figures["cloud_cost_usd"])
            )
    over = dominating(default, points, SLO_TOLERANCE, SPEND_TOLERANCE)
    assert not over, (default, over)
    assert router.shed_with_room == 0
    assert ours["residency_breaches"] == 0
