"""``oracle``: a router that plans with hindsight over the whole trace, the reference Spillway and
the baselines are measured against.

What it knows that no gateway can: every arrival of the trace ahead, its class and its service
times (local and cloud), the cluster's exact queue, each cloud target's idle warm instances. What
it is still bound by: the same world as every policy (a FIFO cluster, instances that start only
when a request is sent to them and are reaped when idle, each target's concurrency cap), and it
decides each request when it arrives, once.

How it decides:
- an on-prem-only request goes local when it will meet the latency target there, and is shed when
  it will not (a request that misses anyway only delays the ones behind it);
- a request that may leave first feeds the pool plan (``eager``; else only one it would shed): when
  the instances alive are fewer than the
  most the cloud will be asked for over the life of one started now (from the end of its cold
  start to its idle TTL; planned from the trace's own arrivals: what the cluster cannot take at
  ``UTILISATION`` of its capacity after the on-prem-only load, times the cloud's latency, times
  ``pool``), it starts one on the chain's first target with room (``spread``: the first with room
  and no idle warm instance, which the platform would send it to instead);
- else it goes local when it meets the target there and takes no on-prem-only request ahead below
  it: the cluster's queue is played forward over the on-prem-only arrivals to come, with and
  without it, until the two futures meet (``harm``: how many more of them would miss);
- else to the cheapest idle warm instance that answers within the target, when what that saves
  (one answer, or the on-prem-only answers it would cost) is worth its price at ``price`` USD a
  request met;
- else it is shed.

Sweeping ``price`` and ``pool`` (and, where a baseline point or Spillway's default is left
unbounded, other pools, larger and smaller) gives the oracle's points; their Pareto frontier is the
reference (``simulation.frontier``). It is an upper bound in practice, not a proven one: the test
suite checks, on every trace family and both example configs, that for every point of every
baseline's sweep and for Spillway's default an oracle point reaches at least its SLO attainment at
no more than its spend.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import may_leave
from gateway_plugin.policy.model import LOCAL, SHED
from gateway_plugin.simulation.baselines import Unlearning
from gateway_plugin.simulation.cluster import Job
from gateway_plugin.simulation.world import World

# The share of the cluster's capacity the plan expects it to run at while meeting the target.
UTILISATION = 0.8
# How far the queue is played forward to see whom a request kept local would delay: until the two
# futures meet, at most this long and over at most this many on-prem-only arrivals.
HORIZON_S = 5.0
HORIZON_REQUESTS = 64


class Oracle(Unlearning):
    name = "oracle"

    def __init__(
        self,
        config: SpillwayConfig,
        arrivals: Sequence[Job],
        price: float = 0.0,
        pool: float = 1.0,
        spread: bool = False,
        eager: bool = True,
    ) -> None:
        self.policy = build_policy(config)
        self.params = {"price": price, "pool": pool, "spread": float(spread), "eager": float(eager)}
        self.price, self.pool, self.spread, self.eager = price, pool, spread, eager
        sim = config.simulation
        self.target_s = (
            config.local.model_latency_targets_ms.get(sim.model, config.local.latency_target_ms) / 1000
        )
        self.net_s = sim.cluster.network_ms / 1000
        self.at = [j.at for j in arrivals]
        self.local_s = [j.local_ms / 1000 for j in arrivals]
        self.stays = [j.confidential for j in arrivals]
        self.next_stay = _next_true(self.stays)
        self.index = 0
        self.chain = self.policy.default_chain
        self.prices = {
            t.name: (
                t.cost.usd_per_request,
                t.cost.memory_gb * t.cost.usd_per_gb_second + t.cost.usd_per_gpu_second,
            )
            for t in config.targets
        }
        self.want = self._plan(config, arrivals)

    def _plan(self, config: SpillwayConfig, arrivals: Sequence[Job]) -> list[int]:
        """Instances alive wanted at each second: the cloud demand a cold start begun then meets."""
        seconds = int(self.at[-1]) + 2 if self.at else 1
        public, stays = [0] * seconds, [0] * seconds
        for job in arrivals:
            (stays if job.confidential else public)[int(job.at)] += 1
        sim = config.simulation
        capacity = config.local.parallelism * 1000 / sim.cluster.service_ms * UTILISATION
        if not config.targets:
            return [0] * seconds
        first = config.targets[0]
        model = sim.target(first.name)
        cloud_s = (model.network_ms + (model.service_ms or first.cost.expected_duration_ms)) / 1000
        slots = model.instance_concurrency or first.instance_concurrency
        need = [
            max(0.0, p - max(0.0, capacity - s)) * cloud_s / slots for p, s in zip(public, stays, strict=True)
        ]
        cold = math.ceil((model.cold_start_ms or first.cold_start_ms) / 1000)
        return [math.ceil(peak * self.pool) for peak in _window_max(need, cold, int(first.idle_ttl_s))]

    def route(self, job: Job, now: float, world: World) -> str:
        i = self.index
        self.index += 1
        cluster = world.cluster
        ends = cluster.free_at(now, self.target_s)
        latency = max(0.0, ends[0] - now) + self.local_s[i] + self.net_s
        meets = latency <= self.target_s
        if not may_leave(world.features[job.confidential], self.policy):
            return LOCAL if meets else SHED
        grow = self._grow(job, now, world) if self.eager else None
        if grow is not None:
            return grow
        harm = self._harm(i, now, cluster.free_at(now)) if meets else 0
        if meets and harm == 0:
            return LOCAL
        warm = self._warm(job, now, world)
        if warm is not None and (1 if not meets else harm) >= self.price * warm[1]:
            return warm[0]
        return (None if self.eager else self._grow(job, now, world)) or SHED

    def _grow(self, job: Job, now: float, world: World) -> str | None:
        """Where to start an instance when the pool plan wants more alive than there are: the
        chain's first target with room (``spread``: the first with room and no idle warm one),
        unless it has an idle warm one (a request sent there would take it, and start nothing)."""
        want = self.want[min(int(now), len(self.want) - 1)]
        if want <= sum(world.clouds[name].live for name in self.chain):
            return None
        for name in self.chain:
            cloud, spec = world.clouds[name], self.policy.targets[name]
            room = cloud.in_flight < spec.concurrency_cap and cloud.live < cloud.max_instances
            if room and spec.takes(job.body_bytes):
                if not cloud.idle_warm(now):
                    return name
                if not self.spread:
                    return None
        return None

    def _warm(self, job: Job, now: float, world: World) -> tuple[str, float] | None:
        """The cheapest target with an idle warm instance that answers within the target."""
        best: tuple[str, float] | None = None
        for name in self.chain:
            cloud, spec = world.clouds[name], self.policy.targets[name]
            if (
                cloud.in_flight >= spec.concurrency_cap
                or not spec.takes(job.body_bytes)
                or not cloud.idle_warm(now)
            ):
                continue
            service_ms = cloud.service_ms(job.cloud_z)
            if cloud.network_s + service_ms / 1000 > self.target_s:
                continue
            per_request, per_second = self.prices[name]
            cost = per_request + math.ceil(service_ms) / 1000 * per_second
            if best is None or cost < best[1]:
                best = (name, cost)
        return best

    def _harm(self, i: int, now: float, ends: list[float]) -> int:
        """How many on-prem-only requests to come would miss the target because request ``i`` ran
        local: the queue played forward with and without it until the two futures meet."""
        k = self.next_stay[i]
        if k is None or self.at[k] > now + HORIZON_S:
            return 0
        without = list(ends)
        within = list(ends)
        heapq.heapreplace(within, max(within[0], now) + self.local_s[i])
        target, net, met, horizon = self.target_s, self.net_s, 0, now + HORIZON_S
        at_, local_s, next_stay = self.at, self.local_s, self.next_stay
        for _ in range(HORIZON_REQUESTS):
            if k is None or at_[k] > horizon:
                break
            at, service = at_[k], local_s[k]
            for heap, sign in ((without, 1), (within, -1)):
                start = max(heap[0], at)
                if start - at + service + net <= target:
                    heapq.heapreplace(heap, start + service)
                    met += sign
            # The two futures meet once every instance is as free in one as in the other.
            if max(within) <= at or (sum(within) == sum(without) and sorted(within) == sorted(without)):
                break
            k = next_stay[k]
        return met


def _window_max(values: list[float], start: int, length: int) -> list[float]:
    """For each index i, the largest of ``values[i + start : i + start + length]`` (0 past the end)."""
    out: list[float] = []
    window: deque[int] = deque()  # indices, their values decreasing
    for i in range(len(values) + start + length):
        if i < len(values):
            while window and values[window[-1]] <= values[i]:
                window.pop()
            window.append(i)
        first = i - length + 1 - start
        while window and window[0] < first + start:
            window.popleft()
        if first >= 0 and first < len(values):
            out.append(values[window[0]] if window else 0.0)
    return out


def _next_true(flags: list[bool]) -> list[int | None]:
    """For each index, the next later index whose flag is set."""
    out: list[int | None] = [None] * len(flags)
    following: int | None = None
    for i in range(len(flags) - 1, -1, -1):
        out[i] = following
        if flags[i]:
            following = i
    return out
