"""The policies Spillway is measured against, on the same trace, seed and world.

Each keeps residency as the config says (``policy.may_leave``): a baseline that moved on-prem-only
data would win on latency by breaking the one rule that is never traded.

- ``all_local``: never spill.
- ``all_cloud``: every request that may leave goes to the first target of the chain with room.
- ``static_threshold``: spill while the scraped utilisation is over 0.8 (the usual autoscaler rule).
- ``least_busy``: the upstream with the fewest requests in flight (LiteLLM's strategy).
- ``perfect``: an oracle that knows the cluster's true queue wait and the warm pools at each
  arrival, with no scrape lag: spill exactly when local would miss the target, warm instances first.
"""

from __future__ import annotations

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.routing.policy import LOCAL, Policy, may_leave
from gateway_plugin.routing.policy_build import build_policy
from gateway_plugin.routing.signals import Counters
from gateway_plugin.simulation.cluster import Job
from gateway_plugin.simulation.world import World

UTILISATION_THRESHOLD = 0.8


class _Baseline:
    name = ""
    listens = False

    def __init__(self, config: SpillwayConfig) -> None:
        self.policy: Policy = build_policy(config)
        self.chain = self.policy.default_chain

    def route(self, job: Job, now: float, world: World) -> str:
        raise NotImplementedError

    def may_leave(self, job: Job, world: World) -> bool:
        return may_leave(world.features[job.confidential], self.policy)

    def open_targets(self, job: Job, world: World) -> list[str]:
        """Targets of the chain with room under their cap that take the request's size."""
        out = []
        for name in self.chain:
            cloud, spec = world.clouds[name], self.policy.targets[name]
            if cloud.in_flight < spec.concurrency_cap and spec.takes(job.body_bytes):
                out.append(name)
        return out

    def first_open(self, job: Job, world: World) -> str:
        if not self.may_leave(job, world):
            return LOCAL
        return next(iter(self.open_targets(job, world)), LOCAL)

    def scraped(self, counters: Counters, now: float) -> None:
        pass

    def answered_local(self, ms: float, now: float, tenant: str | None = None) -> None:
        pass

    def answered_cloud(
        self,
        target: str,
        instance: str,
        cold: bool,
        ok: bool,
        seconds: float,
        now: float,
        tenant: str | None = None,
    ) -> None:
        pass

    def warm_report(self, target: str, instances: list[str], now: float) -> None:
        pass


class AllLocal(_Baseline):
    name = "all_local"

    def route(self, job: Job, now: float, world: World) -> str:
        return LOCAL


class AllCloud(_Baseline):
    name = "all_cloud"

    def route(self, job: Job, now: float, world: World) -> str:
        return self.first_open(job, world)


class StaticThreshold(_Baseline):
    name = "static_threshold"

    def route(self, job: Job, now: float, world: World) -> str:
        return self.first_open(job, world) if world.utilisation > UTILISATION_THRESHOLD else LOCAL


class LeastBusy(_Baseline):
    name = "least_busy"

    def route(self, job: Job, now: float, world: World) -> str:
        best, fewest = LOCAL, world.cluster.in_flight
        if self.may_leave(job, world):
            for name in self.open_targets(job, world):
                if world.clouds[name].in_flight < fewest:
                    best, fewest = name, world.clouds[name].in_flight
        return best


class Perfect(_Baseline):
    name = "perfect"

    def route(self, job: Job, now: float, world: World) -> str:
        local_ms = world.cluster.wait_if_sent(now) * 1000 + job.local_ms
        if local_ms <= world.latency_target_ms or not self.may_leave(job, world):
            return LOCAL
        open_targets = self.open_targets(job, world)
        warm = (name for name in open_targets if world.clouds[name].idle_warm(now))
        return next(warm, open_targets[0] if open_targets else LOCAL)


BASELINES: tuple[type[_Baseline], ...] = (AllLocal, AllCloud, StaticThreshold, LeastBusy, Perfect)
