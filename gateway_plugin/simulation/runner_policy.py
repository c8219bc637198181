"""Spillway's own policy in simulated time: the runner's ``GatewayState`` (snapshots, commits,
breakers, budgets, quotas, warm pools, the load tracker) on a simulated clock, and
``policy.decide()`` itself, fed the scrapes, answers and warm-up reports the runner would get, and
(``simulation.gateway_counts``, the default) the in-flight counts the gateway keeps, local and per
target, exact as the fast path's shared-dict counters are: APISIX sees each answer go by. Without
them it is the ext-plugin route: the runner's own books, which learn of answers only when the
logger reports them."""

from __future__ import annotations

from gateway_plugin.books.state import GatewayState
from gateway_plugin.books.target_states import Counts
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.config.thresholds import GPU_UTILIZATION, KV_CACHE, WAITING
from gateway_plugin.policy.admission import SHEDDABLE
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.gauges import compiled
from gateway_plugin.policy.model import LOCAL, Reason
from gateway_plugin.policy.snapshot import RequestFeatures
from gateway_plugin.signals.members import Counters
from gateway_plugin.simulation.cluster import Job
from gateway_plugin.simulation.world import World

# Simulated wall-clock time starts at a fixed instant (budgets roll over on wall-clock hours).
EPOCH = 1_767_225_600.0


class _SimulatedState(GatewayState):
    """The runner's state; upstream targets need no route token here, nothing is routed for real."""

    @staticmethod
    def route_values(config: SpillwayConfig, secrets: GatewaySecrets) -> dict[str, str]:
        return {}


class SpillwayRouter:
    name = "spillway"
    listens = True

    def __init__(self, config: SpillwayConfig) -> None:
        self.now = 0.0
        self.state = _SimulatedState(config, GatewaySecrets(), clock=self._clock, wall=self._wall)
        self.model = config.simulation.model
        # Requests are streamed generations: books kept, and bills settled, as streams; except at
        # a function the runner invokes, which answers whole (request.spillway's commit).
        self.streams = config.simulation.generation is not None
        self.invoked = {t.name for t in config.targets if t.mode == "invoke"}
        self.tenant_header = config.tenants.header.lower()
        self.priority_header = self.state.policy.priority_header
        self.in_flight = {LOCAL: 0, **{t.name: 0 for t in config.targets}}
        self.starting = {t.name: 0 for t in config.targets}
        self.counts = Counts(self.in_flight, self.starting) if config.simulation.gateway_counts else None
        # The members the next scrape finds; the first reports the cluster's counters, the others
        # none (so a member leaving or joining moves no counter, only the capacity).
        self.members = config.simulation.members_at_start(len(config.local.endpoints))
        self.state.load.member_parallelism = per_member(config)

    def _clock(self) -> float:
        return self.now

    def _wall(self) -> float:
        return EPOCH + self.now

    def route(self, job: Job, now: float, world: World) -> str:
        self.now = now
        base = world.features[job.confidential]
        headers = base.headers if job.tenant is None else {**base.headers, self.tenant_header: job.tenant}
        if job.sheddable and self.priority_header:
            headers = {**headers, self.priority_header: SHEDDABLE}
        features = RequestFeatures(base.path, headers, base.args, base.model, job.body_bytes)
        state = self.state
        decision = decide(features, state.snapshot(job.tenant, self.model, self.counts), state.policy)
        state.commit(decision, self.model, streamed=self.streams and decision.target not in self.invoked)
        target = decision.target
        if target in self.in_flight:
            self.in_flight[target] += 1
        job.sent_cold = decision.reason is Reason.OVERFLOW_COLD
        if job.sent_cold:
            self.starting[target] += 1
        return target

    def returned(self, job: Job, now: float) -> None:
        self.in_flight[job.target] -= 1
        if job.sent_cold:
            self.starting[job.target] -= 1

    def scraped(
        self, counters: Counters, now: float, utilisation: float = 0.0, occupied: float = 0.0
    ) -> None:
        self.now = now
        members = [{self.model: counters}, *({} for _ in range(self.members - 1))]
        self.state.load.observe(members, self._gauges(utilisation, counters.pending, occupied))

    def members_changed(self, members: int, now: float) -> None:
        self.members = members

    def _gauges(self, utilisation: float, waiting: float, occupied: float) -> tuple[float | None, ...]:
        """GPU utilisation as the cluster's busy share of its parallelism over the scrape period (a
        share, as Triton reports it: the busy seconds' sums round a hair past 1 on a saturated
        cluster); an LLM engine's waiting requests as the cluster's queue, and its KV cache's use
        as the share of its model instances (its sequences) running now, each holding its blocks
        for its whole stream. Any other gauge (GPU memory, CPU) is not in the model: absent, it
        never crosses."""
        read = {
            GPU_UTILIZATION: min(1.0, max(0.0, utilisation)),
            **dict.fromkeys(_WAITING, waiting),
            **dict.fromkeys(_KV_CACHE, occupied),
        }
        return tuple(read.get(s.metric) for s in self.state.gauge_specs)

    def answered_local(self, ms: float, now: float, tenant: str | None = None) -> None:
        self.now = now
        self.state.answered_local(self.model, ms)
        self.state.answered(None, tenant, True, seconds=ms / 1000, streamed=self.streams)

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
        self.now = now
        streamed = self.streams and target not in self.invoked
        self.state.answered(target, tenant, ok, instance or None, cold, seconds, streamed)
        if streamed:
            self.state.stream_settled(target, tenant, self.model, seconds, tokens, cold, prompt)

    def warm_report(self, target: str, instances: list[str], now: float) -> None:
        self.now = now
        self.state.warm_report(target, instances)


def per_member(config: SpillwayConfig) -> float:
    """What one member runs at once: ``local.member_parallelism``, or ``parallelism``'s share of the
    members the simulation starts with (also where each member's model configuration would say:
    the simulation reads no Triton)."""
    if isinstance(config.local.member_parallelism, float):
        return config.local.member_parallelism
    return config.local.parallelism / config.simulation.members_at_start(len(config.local.endpoints))


_WAITING = frozenset(name for name, _ in WAITING.values())
_KV_CACHE = frozenset(name for name, _ in KV_CACHE.values())


def modelled(metric: str) -> bool:
    return metric == GPU_UTILIZATION or metric in _WAITING or metric in _KV_CACHE


def thresholds_modelled(config: SpillwayConfig) -> dict[str, list[str]]:
    """Which of ``local.thresholds`` the simulation models (what ``simulate`` says it left out)."""
    specs, _ = compiled(config.thresholds(), config.overflow.enter_ratio, config.overflow.exit_ratio)
    names: dict[str, list[str]] = {"modelled": [], "not_modelled": []}
    for spec in specs:
        names["modelled" if modelled(spec.metric) else "not_modelled"].append(spec.name)
    return names
