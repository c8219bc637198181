"""The gateway's live state, owned by the runner's event loop, and the snapshots taken from it.

Everything the policy reads is gathered here into one immutable ``Snapshot`` per request; every
consequence of a decision and of its outcome (in-flight counts, spend, probes, breakers, retry
budget, warm instances, metrics, the residency log) is written here and nowhere else, by the loop
alone, so no counter has two owners and none is read and written across tasks.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping

from functions.contract import HEADER_COLD, HEADER_INSTANCE
from gateway_plugin.books.ledger import HeldPrices, InFlight, Ledger, Outstanding, TenantBook, TenantBooks
from gateway_plugin.books.metrics import RunnerMetrics
from gateway_plugin.books.summed_outcomes import SummedOutcomes, residency_log
from gateway_plugin.books.target_header import target_values
from gateway_plugin.books.target_states import Counts, TargetStates
from gateway_plugin.books.warm_instances import WarmPool
from gateway_plugin.config import ConfigError, SpillwayConfig, Target
from gateway_plugin.config.secrets import GatewaySecrets, RouteTokenError
from gateway_plugin.content.checks import ContentPolicy, Verdict, content_policy
from gateway_plugin.health.breakers import Breaker, RetryBudget
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.gauges import GaugeSpec, compiled
from gateway_plugin.policy.model import LOCAL, SHED, Decision, Policy, Reason
from gateway_plugin.policy.snapshot import BreakerState, Snapshot, TargetState, TenantState
from gateway_plugin.shared.view import Round, SharedView
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.targets.signing import TargetSigner

log = logging.getLogger("spillway.state")

# What the residency log says of the request a decision was for (request id, path, model, class).
RequestSeen = dict[str, object]


_NO_TENANT = TenantState()


def _described(decision: Decision) -> dict[str, object]:
    return {"decision": decision.target, "reason": decision.label}


class GatewayState(SummedOutcomes):
    def __init__(
        self,
        config: SpillwayConfig,
        secrets: GatewaySecrets,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        metrics: RunnerMetrics | None = None,
        shared: SharedView | None = None,
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.metrics = metrics or RunnerMetrics()
        self.load = LoadTracker(config.local.stale_after_s, clock)
        self.ledger = Ledger()
        self.tenants = TenantBooks(config.tenants.max_tracked)
        self.version = 0
        self.targets: dict[str, Target] = {}
        self.breakers: dict[str, Breaker] = {}
        self.pools: dict[str, WarmPool] = {}
        self.outstanding: dict[str, InFlight] = {}
        # Cold dispatches not yet answered by an instance that said it was cold.
        self.starting: dict[str, Outstanding] = {}
        # What each stream still running was held at, per target (its settlement replaces it).
        self.held: dict[str, HeldPrices] = {}
        self.shared = shared
        # Where several runner workers share the socket: this one's index, sent with each decision.
        self.worker: str | None = None
        self.metrics.cost.models.eligible = self.load.known
        self.metrics.cost.accrue(clock(), 0.0)
        self.apply(config, secrets)

    def apply(self, config: SpillwayConfig, secrets: GatewaySecrets) -> None:
        """Take a new config and the secrets its edge read for it; breakers, warm pools and in-flight
        counts of remaining targets are kept."""
        self.config = config
        self.policy: Policy = build_policy(config)
        specs = compiled(config.thresholds(), config.overflow.enter_ratio, config.overflow.exit_ratio)[0]
        if specs != getattr(self, "gauge_specs", ()) or self.policy.thresholds != self.load.thresholds:
            # Values read for other thresholds mean nothing to these: none until the next scrape.
            self.load.gauges, self.load.gauges_hot = (), False
            self.load.thresholds = self.policy.thresholds
            self.metrics.threshold_value.clear()
            self.metrics.threshold_limit.clear()
        self.gauge_specs: tuple[GaugeSpec, ...] = specs
        self.load.ttft_targets_ms = config.local.model_ttft_targets_ms
        self.load.ttft_ratios = (self.policy.enter_ratio, self.policy.exit_ratio)
        self.content: ContentPolicy = content_policy(config)
        self.targets = {t.name: t for t in config.targets}
        self.breakers = {n: self.breakers.get(n) or Breaker(config.breaker) for n in self.targets}
        self.pools = {n: self.pools.get(n) or WarmPool(t.idle_ttl_s) for n, t in self.targets.items()}
        self.outstanding = {
            n: self.outstanding.get(n) or InFlight(t.timeout_s) for n, t in self.targets.items()
        }
        self.starting = {n: self.starting.get(n) or Outstanding(t.timeout_s) for n, t in self.targets.items()}
        self.held = {n: self.held.get(n) or HeldPrices() for n in self.targets}
        keys = secrets.signing_keys
        self.signers = {n: TargetSigner(keys.get(n), t.sign_body) for n, t in self.targets.items()}
        self.target_values = self.route_values(config, secrets)
        self.target_by_value = {value: name for name, value in self.target_values.items()}
        self.retry_budget = RetryBudget(config.breaker.retry_budget_ratio)
        self.load.stale_after_s = config.local.stale_after_s
        self.load.health = config.local.health
        self.load.parallelism = config.local.parallelism
        per_member = config.local.member_parallelism
        self.load.from_model_config = per_member == "model_config"
        self.load.member_parallelism = per_member if isinstance(per_member, float) else 0.0
        self.load.members.drop_after_s = config.local.drop_member_after_s
        self.load.members.failures_to_wedge = config.local.health.failures_to_open
        self.load.members.addressed(*config.local.member_addresses())
        self.load.declare(config.declared_models())
        self.tenants.max_tenants = config.tenants.max_tracked
        if self.shared is not None:
            self.shared.apply(config, self.policy)
        self.metrics.cost.resize(config.metrics.tenant_series, config.metrics.model_series)
        self.metrics.local_cost_rate.set(config.local.cost.usd_per_hour)
        self.metrics.local_gpus.set(config.local.cost.gpus)
        self.metrics.publish_limits(config)
        self.version += 1
        log.info("config %d applied: targets %s", self.version, sorted(self.targets))

    @staticmethod
    def route_values(config: SpillwayConfig, secrets: GatewaySecrets) -> dict[str, str]:
        """``X-Spillway-Target`` per upstream-mode target (invoke mode never goes through traffic-split)."""
        names = [t.name for t in config.targets if t.mode == "upstream"]
        try:
            return target_values(names, secrets.require_route_token()) if names else {}
        except RouteTokenError as exc:
            raise ConfigError(str(exc)) from None

    def snapshot(
        self, tenant: str | None, model: str | None = None, counts: Counts | None = None
    ) -> Snapshot:
        """What the policy may read for one request; target states are taken when first read.

        ``counts``: the requests the gateway has in flight, as it counts them itself; they replace
        the runner's own books, which learn of answers only when the logger reports them."""
        now, wall = self.clock(), self.wall()
        tenants = {}
        book = self.tenants.get(tenant) if tenant is not None else None
        if tenant is not None and book is not None:
            hour, day = book.spent(wall)
            tenants[tenant] = TenantState(
                requests_last_minute=book.last_minute(wall),
                in_flight=book.in_flight.count(now),
                spent_hour_usd=hour,
                spent_day_usd=day,
            )
        if tenant is not None and self.shared is not None:
            tenants[tenant] = self.shared.tenant_state(tenant, tenants.get(tenant, _NO_TENANT), wall)
        local = self.load.snapshot(model or "", counts.in_flight.get(LOCAL, -1) if counts is not None else -1)
        targets = TargetStates(self.targets, lambda name: self.target_state(name, now, wall, counts))
        return Snapshot(local, targets, tenants)

    def target_state(
        self, name: str, now: float, wall: float, counts: Counts | None = None, fast_path: bool = False
    ) -> TargetState:
        """``counts``: the gateway's own, where it keeps them; else the runner's books.
        ``fast_path``: the state the fast path's table gives the plugin (under shared state, its
        block of each budget)."""
        breaker = self.breakers[name]
        counted = counts.in_flight.get(name) if counts is not None else None
        in_flight = self.outstanding[name].count(now) if counted is None else counted
        starting = counts.starting.get(name, 0) if counts is not None else self.starting[name].count(now)
        warm, idle_s = self.pools[name].warm(now), self.pools[name].idle_s(now)
        if self.shared is not None:
            shared = self.shared.target_state(name, breaker, in_flight, warm, now, wall, fast_path)
            return shared._replace(starting=min(starting, shared.in_flight), idle_s=idle_s)
        hour, day = self.ledger.spent(f"target:{name}", wall)
        return TargetState(
            breaker=breaker.current(now),
            probe_allowed=breaker.probe_allowed(now),
            in_flight=in_flight,
            warm_instances=warm,
            spent_hour_usd=hour,
            spent_day_usd=day,
            starting=min(starting, in_flight),
            idle_s=idle_s,
        )

    def cap(self, name: str) -> int:
        """The concurrency cap this node may fill: under a shared cap, the slots it holds."""
        shared = self.shared.cap(name, self.wall()) if self.shared is not None else None
        return self.targets[name].concurrency_cap if shared is None else shared

    def fast_path_cap(self, name: str) -> int:
        """The concurrency cap the fast path's plugin may fill: under a shared cap, its block of
        this node's slots."""
        shared = self.shared.fast_path_cap(name, self.wall()) if self.shared is not None else None
        return self.targets[name].concurrency_cap if shared is None else shared

    def target(self, name: str) -> Target:
        return self.targets[name]

    def signer(self, name: str) -> TargetSigner:
        return self.signers[name]

    def route_value(self, name: str) -> str:
        """The ``X-Spillway-Target`` value that sends a request to upstream-mode target ``name``."""
        return self.target_values[name]

    @property
    def decision_header(self) -> bool:
        return self.config.metrics.decision_header

    def content_read(self, verdict: Verdict) -> None:
        """Count what reading a request's text found (by detector or reason, never the text)."""
        if verdict.detector is not None:
            self.metrics.content_matches.labels(verdict.detector).inc()
        elif verdict.unscannable is not None:
            self.metrics.content_unscannable.labels(verdict.unscannable.value).inc()

    def commit(
        self, decision: Decision, model: str | None, seen: RequestSeen | None = None, streamed: bool = False
    ) -> None:
        """Account for a decision before the request leaves; ``seen`` names it in the residency log;
        ``streamed``: its answer is a stream of generated tokens."""
        now, wall = self.clock(), self.wall()
        self.metrics.decided(decision.target, decision.label)
        if decision.residency_kept:
            self.metrics.residency_kept.inc()
            residency_log.info(
                json.dumps({"event": "residency_kept", **(seen or {}), **_described(decision)})
            )
        self.load.set_overflowing(model, decision.overflowing)
        if decision.on_prem_only:
            self.load.arrived_onprem(model)
        book = self._tenant_book(decision)
        if book is not None:
            if self.policy.quota_of(decision.tenant).requests_per_minute is not None:
                book.arrivals.append(wall)
            book.in_flight.add(now, streamed)
        # A stream's spend is counted when it ends, at what it cost (``stream_settled``); its
        # price at decision is held in the budgets meanwhile.
        billed = 0.0 if streamed and decision.is_cloud else decision.cost_usd
        self.metrics.cost.counted(decision.tenant, model, decision.target, 1, billed)
        if decision.target == LOCAL:
            self.load.sent_local(model)
            self.load.dispatched_local(model)
        elif decision.is_cloud:
            name = decision.target
            self.outstanding[name].add(now, streamed)
            if streamed:
                self.held[name].hold(now, decision.tenant, decision.cost_usd, wall)
            if decision.reason is Reason.OVERFLOW_COLD:
                self.starting[name].add(now)
            self.breakers[name].dispatched(now)
            self.ledger.spend(f"target:{name}", decision.cost_usd, wall)
            if book is not None:
                book.add_spend(decision.cost_usd, wall)
            self.metrics.spend.labels(name).inc(billed)
        if self.shared is not None:
            in_flight = self.outstanding[decision.target].unanswered if decision.is_cloud else 0
            self.shared.committed(decision, wall, in_flight)

    def _tenant_book(self, decision: Decision) -> TenantBook | None:
        """Only tenants under a quota are kept, and only as many as ``tenants.max_tracked``. A shed
        tenant's book is not counted into, but it was seen: the decision table keeps the most
        recently seen at their limits."""
        tenant = decision.tenant
        if tenant is None or not self.policy.quota_of(tenant).limits_anything:
            return None
        if decision.target == SHED:
            self.tenants.seen(tenant)
            return None
        return self.tenants.book(tenant)

    def answered(
        self,
        target: str | None,
        tenant: str | None,
        ok: bool,
        instance: str | None = None,
        cold: bool = False,
        seconds: float | None = None,
        streamed: bool = False,
    ) -> None:
        """The answer to a request the gateway sent, which took ``seconds`` where known: close its
        books (``streamed``: a stream of generated tokens, which ended or was cut)."""
        now = self.clock()
        book = self.tenants.get(tenant) if tenant else None
        if book is not None:
            book.in_flight.done(now, seconds, streamed)
        if target is None or target not in self.targets:
            return
        self.outstanding[target].done(now, seconds, streamed)
        if cold:
            self.starting[target].done(now, seconds)
        breaker = self.breakers[target]
        was_open = breaker.current(now) is BreakerState.OPEN
        breaker.record(ok, now)
        if self.shared is not None:
            tripped = not was_open and breaker.current(now) is BreakerState.OPEN
            self.shared.answered(target, ok, instance, self.wall(), tripped)
        if instance:
            self.pools[target].seen(instance, now, cold)
            if cold:
                self.metrics.cold_hits.labels(target).inc()

    def invoke_started(self, target: str) -> None:
        self.retry_budget.request(is_retry=False)

    def invoke_failed(self, target: str) -> bool:
        """An invocation failed (the function never answered): whether a local retry is allowed."""
        self.metrics.invoke_failures.labels(target).inc()
        self.answered(target, None, ok=False)
        allowed = self.retry_budget.allows_retry()
        if allowed:
            self.retry_budget.request(is_retry=True)
        return allowed

    def invoke_answered(
        self, target: str, tenant: str | None, status: int, headers: Mapping[str, str], seconds: float
    ) -> None:
        self.metrics.target_latency.labels(target).observe(seconds)
        self.answered(
            target,
            tenant,
            ok=status < 500,
            instance=headers.get(HEADER_INSTANCE),
            cold=headers.get(HEADER_COLD) == "1",
            seconds=seconds,
        )

    def scrape_failed(self) -> None:
        self.metrics.scrape_errors.inc()

    def shared_round(self, release: bool = False) -> Round:
        """What this node tells the shared store now (its in-flight counts for the slots it holds)."""
        shared = self._shared()
        now = self.clock()
        in_flight = {name: o.count(now) for name, o in self.outstanding.items()}
        tenants = {}
        for tenant in shared.tenants:
            book = self.tenants.get(tenant)
            if book is not None:
                tenants[tenant] = book.in_flight.count(now)
        return shared.round_request(self.wall(), in_flight, tenants, release)

    def shared_answered(self, sent: Round, reply: list[object]) -> None:
        """A breaker the store opened for every node is open in the shared view; the local one,
        its detector, starts afresh."""
        shared = self._shared()
        for target in shared.round_done(sent, reply):
            self.breakers[target] = Breaker(self.config.breaker)
        wall = self.wall()
        for name, limits in shared.targets.items():
            for window, lease in (("hour", limits.hour), ("day", limits.day)):
                if lease is not None:
                    alone = lease.remaining(wall, connected=False) + lease.spent
                    self.metrics.shared_alone.labels(name, window).set(alone / 1e9)

    def refresh_gauges(self) -> None:
        now = self.clock()
        m = self.metrics
        m.cost.accrue(now, self.config.local.cost.usd_per_hour)
        m.signals_fresh.set(1 if self.load.fresh else 0)
        for member_state, count in self.load.members.counts().items():
            m.local_members.labels(member_state).set(count)
        for model, load in self.load.snapshot(None).items():
            label = model or "*"
            m.overflowing.labels(label).set(1 if load.overflowing or load.gauges_hot else 0)
            m.local_failing.labels(label).set(1 if load.failing else 0)
            m.local_wait.labels(label).set(max(load.queue_ms, 0) / 1000)
            m.local_capacity.labels(label).set(load.capacity)
        for threshold, value in itertools.zip_longest(self.policy.thresholds, self.load.gauges):
            if threshold is not None:
                m.threshold_limit.labels(threshold.name).set(threshold.enter)
                m.threshold_value.labels(threshold.name).set(math.nan if value is None else value)
        wall = self.wall()
        for name in self.targets:
            taken = self.target_state(name, now, wall)
            breaker = taken.breaker
            m.breaker_open.labels(name).set(0 if breaker is BreakerState.CLOSED else 1)
            m.cap.labels(name).set(self.cap(name))
            m.spent.labels(name, "hour").set(taken.spent_hour_usd)
            m.spent.labels(name, "day").set(taken.spent_day_usd)
            m.in_flight.labels(name).set(self.outstanding[name].count(now))
            m.warm.labels(name).set(self.pools[name].warm(now))

    def _shared(self) -> SharedView:
        if self.shared is None:
            raise RuntimeError("this runner has no shared_state section")
        return self.shared
