"""What a rolling update costs, simulated: the cluster's members leave and join at given times
(``simulation.membership``), its capacity follows, and so does the one the runner's policy sees
(each scrape finds the members there are), so an operator can weigh ``maxUnavailable`` in SLO and
spend before a rollout."""

from __future__ import annotations

from typing import Any

from gateway_plugin.config import SpillwayConfig, load
from gateway_plugin.simulation.baselines import AllLocal
from gateway_plugin.simulation.engine import simulate
from gateway_plugin.simulation.runner_policy import SpillwayRouter
from gateway_plugin.simulation.trace import Shaping, generate
from testing.paths import ROOT
from tests.unit.test_simulation import _with

BASE = load(ROOT / "examples" / "simulation" / "bursty.yaml")
# Four members of one instance each (50 ms a request: 80 requests a second), at 60 a second.
STEADY = generate("poisson", {"rate": 60, "seconds": 300})


def _rollout(unavailable: int) -> list[dict[str, float]]:
    """Four members replaced ``unavailable`` at a time, 30 s each, from t = 60 s."""
    changes, at, left = [], 60.0, 4
    while left > 0:
        step = min(unavailable, left)
        changes += [{"at_s": at, "members": 4 - step}, {"at_s": at + 30, "members": 4}]
        at, left = at + 30, left - step
    return changes


def _config(membership: list[dict[str, float]]) -> SpillwayConfig:
    local: dict[str, Any] = {"member_parallelism": 1, "parallelism": 4}
    return _with(BASE, local=local, simulation={"members": 4, "membership": membership})


def _run(router: type, membership: list[dict[str, float]]) -> dict[str, float]:
    config = _config(membership)
    return simulate(config, router(config), STEADY, Shaping(confidential_share=0.2), 5).summary()


def test_a_rolling_update_costs_spill_not_the_slo_and_more_unavailable_costs_more() -> None:
    quiet, one, two = (_run(SpillwayRouter, m) for m in ([], _rollout(1), _rollout(2)))
    home_quiet, home_one = _run(AllLocal, []), _run(AllLocal, _rollout(1))
    # Kept home, the cluster at 3 of 4 members (60 a second where 60 arrive) falls behind.
    assert home_one["slo_attainment"] < home_quiet["slo_attainment"] - 0.05, (home_quiet, home_one)
    # Spillway follows the members it finds: it spills through the update and holds the SLO.
    assert one["slo_attainment"] > home_one["slo_attainment"] + 0.05, (one, home_one)
    assert one["slo_attainment"] >= quiet["slo_attainment"] - 0.03, (quiet, one)
    assert quiet["cloud_share"] < one["cloud_share"] < two["cloud_share"], (quiet, one, two)
    assert one["residency_breaches"] == two["residency_breaches"] == 0


class _Blind(SpillwayRouter):
    """The runner as it was: capacity fixed by the config, whoever answers."""

    def members_changed(self, members: int, now: float) -> None:
        pass


def test_following_the_members_is_what_holds_the_slo_through_the_update() -> None:
    config = _config(_rollout(2))
    shaping = Shaping(confidential_share=0.2)
    follows = simulate(config, SpillwayRouter(config), STEADY, shaping, 5).summary()
    blind = simulate(config, _Blind(config), STEADY, shaping, 5).summary()
    assert follows["slo_attainment"] > blind["slo_attainment"] + 0.05, (follows, blind)


def test_the_cluster_and_the_runner_see_the_members_there_are() -> None:
    config = _config([{"at_s": 1.0, "members": 2}, {"at_s": 2.0, "members": 6}])
    router = SpillwayRouter(config)
    simulate(config, router, generate("poisson", {"rate": 10, "seconds": 3}), Shaping(), 1)
    assert router.members == 6 and router.state.load.capacity == 6.0
