"""The warm-up in ``simulate``, sized as the pinger sizes it: a window of the simulated day's clock,
Little's law on the overflow a target took, and provisioned concurrency that follows the count."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway_plugin.config import SpillwayConfig, load
from gateway_plugin.simulation.baselines import AllCloud, AllLocal
from gateway_plugin.simulation.billing import Bill
from gateway_plugin.simulation.cloud import CloudTarget
from gateway_plugin.simulation.engine import jobs, replay
from gateway_plugin.simulation.results import Measures
from gateway_plugin.simulation.settings import SimulatedTarget
from gateway_plugin.simulation.trace import RateTrace, Shaping
from gateway_plugin.simulation.world import Router
from testing.paths import ROOT

BURSTY = load(ROOT / "examples" / "simulation" / "bursty.yaml")
# The simulated day starts at midnight UTC: the first ten minutes of the trace are 00:00-00:10.
FIRST_TEN_MINUTES = [{"start": "00:00", "end": "00:10", "instances": 3}]


def lambda_only(warm: dict[str, Any], interval_s: float = 60.0) -> SpillwayConfig:
    """The bursty example with its Lambda target alone, provisionable, kept warm by ``warm``."""
    data = BURSTY.model_dump()
    aws = next(t for t in data["targets"] if t["name"] == "aws")
    aws |= {"function_name": "infer", "qualifier": "live"}
    aws["cost"]["usd_per_provisioned_gb_second"] = 0.0000041667
    data["targets"] = [aws]
    data["simulation"]["targets"] = {"aws": data["simulation"]["targets"]["aws"]}
    data["warmup"] = {"interval_s": interval_s, "targets": {"aws": warm}}
    return SpillwayConfig.model_validate(data)


class Counting:
    """A policy's router that also counts the instances each warm-up round reached."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.rounds: list[tuple[float, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)

    def warm_report(self, target: str, instances: list[str], now: float) -> None:
        self.rounds.append((now, len(instances)))
        self.router.warm_report(target, instances, now)


def run(
    config: SpillwayConfig, rate: float, seconds: int, cloud: bool
) -> tuple[Measures, list[tuple[float, int]]]:
    counting = Counting((AllCloud if cloud else AllLocal)(config))
    arrivals = list(jobs(config, RateTrace((rate,) * seconds), Shaping(), 5))
    measures = replay(config, counting, arrivals, 5)  # type: ignore[arg-type]
    return measures, counting.rounds


def test_a_window_of_the_day_is_kept_warm_within_it_and_not_after() -> None:
    """Three instances from 00:00 to 00:10, none outside: rounds every minute ping three within the
    window and none after, so the warm-up pays 9 rounds of pings where a fixed count pays 19."""
    windowed, rounds = run(lambda_only({"instances": 0, "windows": FIRST_TEN_MINUTES}), 1.0, 1200, False)
    fixed, _ = run(lambda_only({"instances": 3}), 1.0, 1200, False)
    pinged = [(at, n) for at, n in rounds if at > 1.0]
    assert [n for at, n in pinged if at < 600] == [3] * 9
    assert {n for at, n in pinged if at > 601} == {0}
    assert windowed.warmup_cost_usd == pytest.approx(fixed.warmup_cost_usd * 9 / 19, rel=1e-6)


@pytest.mark.parametrize(("ceiling", "instances"), [(5, 5), (20, 12)])
def test_adaptive_sizing_follows_the_overflow_the_target_took(ceiling: int, instances: int) -> None:
    """100 requests a second all sent to Lambda at 120 ms each: Little's law keeps 12 instances busy;
    sized from what the target took over the 10 s before each round, clamped by the ceiling."""
    adaptive = {
        "metrics_url": "http://127.0.0.1:9/metrics",
        "sample_s": 10,
        "headroom": 1.0,
        "ceiling": ceiling,
    }
    _, rounds = run(lambda_only({"instances": 0, "adaptive": adaptive}), 100.0, 600, True)
    sized = [n for at, n in rounds if at > 1.0]
    assert len(sized) == 9
    assert all(abs(n - instances) <= max(1, instances // 5) for n in sized), sized


def test_provisioned_concurrency_follows_the_window_and_is_billed_while_held() -> None:
    """Provisioned for the window only: the instances provisioned at the start are let go when it
    closes, and the warm-up's part of the bill is three instances' provisioned GB-seconds for its
    ten minutes, not for the whole run."""
    config = lambda_only({"instances": 0, "windows": FIRST_TEN_MINUTES, "provisioned": True})
    measures, _ = run(config, 1.0, 1800, False)
    assert measures.warmup_cost_usd == pytest.approx(3 * 4.0 * 0.0000041667 * 600, rel=1e-6)


def _fc(idle_usd_per_s: float = 0.0) -> CloudTarget:
    config = SpillwayConfig.model_validate(
        {"targets": [{"name": "fc", "kind": "aliyun_fc", "url": "https://x", "idle_ttl_s": 60}]}
    )
    bill = Bill({"fc": config.targets[0].cost})
    settings = SimulatedTarget(
        cold_start_ms=1000, cold_start_cv=0, network_ms=0, idle_usd_per_second=idle_usd_per_s
    )
    return CloudTarget(config.targets[0], settings, bill, random.Random(1))


def test_an_instance_provisioned_while_others_are_warm_takes_no_request_before_it_has_started() -> None:
    """Provisioned concurrency raised from 1 to 2: the new instance starts (1 s here); a request
    meanwhile goes to the warm one, and once that is busy it starts one of its own (cold), as the
    platform's on-demand instances do; the provisioned one serves warm once it is up."""
    cloud = _fc()
    cloud.slots = 1
    cloud.prewarm(1, 0.0, pinned=True)
    assert cloud.provision(2, 100.0) == pytest.approx(101.0)
    first = cloud.dispatch(100.0, 10.0)
    assert not first.cold and first.instance is not None and first.instance.id == "fc-1"
    assert cloud.dispatch(100.1, 10.0).cold, "the provisioned one is still starting"
    later = cloud.dispatch(101.5, 10.0)
    assert not later.cold and later.instance is not None and later.instance.id == "fc-2"


def test_a_provisioned_instance_let_go_is_billed_its_provisioned_idle_time_as_the_warm_ups() -> None:
    """FC bills a provisioned instance's idle time: two held from 0 to 600 s, then let go, owe the
    warm-up 1,200 instance-seconds; from then on they idle as any instance, until reaped."""
    cloud = _fc(idle_usd_per_s=1.0)
    cloud.prewarm(2, 0.0, pinned=True)
    cloud.provision(0, 600.0)
    assert cloud.pinned_idle_usd == pytest.approx(1200.0)
    assert cloud.idle_warm(700.0) == 0, "reaped once idle past the TTL"
    assert cloud.bill.by_target["fc"] == pytest.approx(1200.0 + 2 * 60.0)


def test_windows_are_read_on_the_clock_of_the_warmups_time_zone() -> None:
    """The simulated day starts at midnight where the warm-up's windows are read: the same window
    in Asia/Shanghai as in UTC pings the same rounds."""
    warm = {"instances": 0, "windows": FIRST_TEN_MINUTES}
    shanghai = lambda_only(warm).model_dump()
    shanghai["warmup"]["timezone"] = "Asia/Shanghai"
    _, there = run(SpillwayConfig.model_validate(shanghai), 1.0, 900, False)
    _, here = run(lambda_only(warm), 1.0, 900, False)
    assert there == here and {n for at, n in here if 1 < at < 600} == {3}
