"""The policies Spillway is measured against, on the same trace, seed and world.

Each keeps residency as the config says (``policy.may_leave``): a baseline that moved on-prem-only
data would win on latency by breaking the one rule that is never traded.

- ``all_local``: never spill.
- ``all_cloud``: every request that may leave goes to the first target of the chain with room.
- ``static_threshold``: spill while the scraped utilisation is over ``utilisation`` (0.8: the
  usual autoscaler rule).
- ``least_busy``: the upstream with the fewest requests in flight (LiteLLM's strategy), each cloud
  target counted ``cost_weight`` requests busier than it is (0: LiteLLM's own; more: the cloud's
  price weighs against it).
- ``perfect``: Spillway's old rule with an exact, lag-free view: the cluster's true queue (how many
  requests wait and run, at the mean service time: no router knows a request's service time
  before it runs) and the true warm pools; spills exactly when local would miss the target, warm
  instances first. Greedy for the request at hand, so not an upper bound (``oracle`` is).

The sweeps ``simulate --frontier`` runs over their parameters are ``SWEEPS``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import may_leave
from gateway_plugin.policy.model import LOCAL, Policy
from gateway_plugin.signals.members import Counters
from gateway_plugin.simulation.cluster import Job
from gateway_plugin.simulation.world import World

UTILISATION_THRESHOLD = 0.8


class Unlearning:
    """A router that learns nothing from what happens (``listens`` False): scrapes, answers and
    warm-up reports are the engine's calls it ignores."""

    listens = False

    def scraped(
        self, counters: Counters, now: float, utilisation: float = 0.0, occupied: float = 0.0
    ) -> None:
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
        tokens: int = 0,
        prompt: int = 0,
    ) -> None:
        pass

    def warm_report(self, target: str, instances: list[str], now: float) -> None:
        pass

    def returned(self, job: Job, now: float) -> None:
        pass

    def members_changed(self, members: int, now: float) -> None:
        pass


class _Baseline(Unlearning):
    name = ""

    def __init__(self, config: SpillwayConfig) -> None:
        self.policy: Policy = build_policy(config)
        self.chain = self.policy.default_chain
        self.params: dict[str, float] = {}

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

    def __init__(self, config: SpillwayConfig, utilisation: float = UTILISATION_THRESHOLD) -> None:
        super().__init__(config)
        self.utilisation = utilisation
        self.params = {"utilisation": utilisation}

    def route(self, job: Job, now: float, world: World) -> str:
        return self.first_open(job, world) if world.utilisation > self.utilisation else LOCAL


class LeastBusy(_Baseline):
    name = "least_busy"

    def __init__(self, config: SpillwayConfig, cost_weight: float = 0.0) -> None:
        super().__init__(config)
        self.cost_weight = cost_weight
        self.params = {"cost_weight": cost_weight}

    def route(self, job: Job, now: float, world: World) -> str:
        best, fewest = LOCAL, float(world.cluster.in_flight)
        if self.may_leave(job, world):
            for name in self.open_targets(job, world):
                busy = world.clouds[name].in_flight + self.cost_weight
                if busy < fewest:
                    best, fewest = name, busy
        return best


class Perfect(_Baseline):
    name = "perfect"

    def __init__(self, config: SpillwayConfig) -> None:
        super().__init__(config)
        cluster = config.simulation.cluster
        self.service_ms, self.network_ms = cluster.service_ms, cluster.network_ms
        self.servers = config.local.parallelism

    def route(self, job: Job, now: float, world: World) -> str:
        waiting = max(0, world.cluster.in_flight - self.servers + 1)
        local_ms = waiting * self.service_ms / self.servers + self.service_ms + self.network_ms
        if local_ms <= world.latency_target_ms or not self.may_leave(job, world):
            return LOCAL
        open_targets = self.open_targets(job, world)
        warm = (name for name in open_targets if world.clouds[name].idle_warm(now))
        return next(warm, open_targets[0] if open_targets else LOCAL)


BASELINES: tuple[type[_Baseline], ...] = (AllLocal, AllCloud, StaticThreshold, LeastBusy, Perfect)
# What ``simulate --frontier`` runs of each baseline: every point of each sweep.
SWEEPS: dict[str, tuple[Callable[[SpillwayConfig], _Baseline], ...]] = {
    "all_local": (AllLocal,),
    "all_cloud": (AllCloud,),
    "static_threshold": tuple(
        functools.partial(StaticThreshold, utilisation=u) for u in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    ),
    "least_busy": tuple(functools.partial(LeastBusy, cost_weight=w) for w in (0, 1, 2, 4, 8, 16)),
    "perfect": (Perfect,),
}
