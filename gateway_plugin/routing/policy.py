"""Where each request goes: the whole routing policy, as one pure function.

``decide(features, snapshot, policy)`` reads no clock and does no I/O: load signals, breaker
states, budgets and warm pools arrive in an immutable ``Snapshot``, so what runs in the runner is
what the tests and any simulator run.

The order of concerns, each able only to narrow the choice:
1. residency: a request whose class may not leave is never given a cloud target;
2. tenant quota: over its quota, a tenant is shed with 429;
3. the first matching rule picks the action (default: overflow over every target);
4. overflow: stay local while the estimated local wait plus service time, plus the headroom kept
   for on-prem-only traffic, meets the latency target, with hysteresis (``routing.overflow``);
   fail safe to local when the signals are missing;
5. cold starts: a cold target is not worth it when the local queue is shorter than its start,
   unless local would miss the target anyway or is saturated: then the chain's first cold target
   starts an instance for each request that finds no warm one free, up to its cap;
6. targets: of those in the chain whose breaker, concurrency cap, budget and request size limit
   allow, the cheapest with a free warm instance, else the first cold one (a body too big for one
   target goes to the next, else stays local);
7. nothing eligible: local, or shed with 503 and Retry-After when local is saturated too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple

from gateway_plugin.routing.overflow import (
    estimated_latency_ms,
    overflowing,
    saturated,
)

LOCAL = "local"
SHED = "shed"
# What one request's decision reads is built for every request: immutable tuples, which cost a
# fifth of what frozen dataclasses cost to make.
_EMPTY: Mapping[str, Any] = MappingProxyType({})


class RuleAction(StrEnum):
    """What a matching rule does: stay, overflow while the cluster is hot, go out first, or shed."""

    LOCAL = "local"
    OVERFLOW = "overflow"
    TARGET = "target"
    SHED = "shed"


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Reason(StrEnum):
    """Why a request went where it went (``Decision.label`` adds the rule name and saturation)."""

    LOCAL_OK = "local_ok"
    SIGNALS_MISSING = "signals_missing"
    RULE = "rule"
    RESIDENCY = "residency"
    NO_TARGET = "no_target"
    OVERFLOW_WARM = "overflow_warm"
    OVERFLOW_COLD = "overflow_cold"
    TENANT_RATE = "tenant_rate"
    TENANT_CONCURRENCY = "tenant_concurrency"
    INVOKE_FAILED = "invoke_failed"


class RequestFeatures(NamedTuple):
    """What the policy may know of a request; built at the edge from the APISIX call.

    ``body_bytes`` is the body's declared size (Content-Length); None when it is not known (a
    chunked body), which no target with a size limit takes.
    """

    path: str
    headers: Mapping[str, str]
    args: Mapping[str, str] = _EMPTY
    model: str | None = None
    body_bytes: int | None = 0


class LocalLoad(NamedTuple):
    """The on-prem cluster's state for one model, from Triton's metrics and the gateway's own count.

    ``in_flight``: the requests the gateway has at the cluster now, as it counts them (negative:
    it keeps no count); ``onprem_rps``: the rate at which requests that may not leave arrive.
    """

    fresh: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    pending: int = 0
    sent_since_scrape: int = 0
    age_ms: float = 0.0
    overflowing: bool = False
    observed_ms: float = 0.0
    in_flight: int = -1
    onprem_rps: float = 0.0


class TargetState(NamedTuple):
    """One target as the gateway sees it; ``starting``: the requests in flight that were sent
    there cold (each starting an instance, or on a warm one the gateway had not learnt of), so
    ``in_flight - starting`` of them occupy the warm instances it knows."""

    breaker: BreakerState = BreakerState.CLOSED
    probe_allowed: bool = False
    in_flight: int = 0
    warm_instances: int = 0
    spent_hour_usd: float = 0.0
    spent_day_usd: float = 0.0
    starting: int = 0


class TenantState(NamedTuple):
    requests_last_minute: int = 0
    in_flight: int = 0
    spent_hour_usd: float = 0.0
    spent_day_usd: float = 0.0


class Snapshot(NamedTuple):
    local: Mapping[str, LocalLoad] = _EMPTY
    targets: Mapping[str, TargetState] = _EMPTY
    tenants: Mapping[str, TenantState] = _EMPTY


@dataclass(frozen=True)
class Quota:
    requests_per_minute: int | None = None
    concurrency: int | None = None
    hourly_usd: float | None = None
    daily_usd: float | None = None

    @property
    def limits_anything(self) -> bool:
        return self != _NO_QUOTA


_NO_QUOTA = Quota()


@dataclass(frozen=True)
class TargetPolicy:
    """A target as the policy prices and fills it; ``slots``: requests one warm instance serves at
    once (FC's instance concurrency; 1 on Lambda); ``idle_usd``: what using one of its slots may
    keep billed as idle time (an instance used is kept alive up to its idle TTL: FC bills idle
    GPUs), which weighs in choosing among warm targets."""

    name: str
    concurrency_cap: int
    cold_start_ms: float
    cost_usd: float
    cold_cost_usd: float
    hourly_usd: float | None = None
    daily_usd: float | None = None
    max_request_bytes: int | None = None
    slots: int = 1
    idle_usd: float = 0.0

    def takes(self, body_bytes: int | None) -> bool:
        """Whether the platform accepts a body this size (an unknown size only where none is set)."""
        limit = self.max_request_bytes
        return limit is None or (body_bytes is not None and body_bytes <= limit)


@dataclass(frozen=True)
class RulePolicy:
    name: str
    action: RuleAction
    targets: tuple[str, ...]
    headers: tuple[tuple[str, re.Pattern[str]], ...] = ()
    uri: re.Pattern[str] | None = None
    args: tuple[tuple[str, re.Pattern[str]], ...] = ()
    models: frozenset[str] = frozenset()

    def matches(self, f: RequestFeatures) -> bool:
        if self.models and f.model not in self.models:
            return False
        if self.uri is not None and not self.uri.search(f.path):
            return False
        for name, pattern in self.headers:
            if not pattern.fullmatch(f.headers.get(name, "")):
                return False
        return not self.args or all(p.fullmatch(f.args.get(name, "")) for name, p in self.args)


@dataclass(frozen=True)
class Policy:
    """The config, compiled once: regexes built, targets indexed, rules sorted by priority."""

    targets: Mapping[str, TargetPolicy]
    rules: tuple[RulePolicy, ...]
    default_chain: tuple[str, ...]
    classification_header: str = "x-data-classification"
    cloud_allowed: frozenset[str] = frozenset({"public"})
    unclassified_may_leave: bool = False
    tenant_header: str = "x-tenant"
    # The tenant is the APISIX consumer (request_reading.as_decided); consumer → its data's class.
    tenant_from_consumer: bool = False
    consumer_ceilings: Mapping[str, str] = field(default_factory=dict)
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    default_quota: Quota = Quota()
    latency_target_ms: float = 200.0
    model_targets_ms: Mapping[str, float] = field(default_factory=dict)
    parallelism: int = 1
    max_queue_ms: float = 5000.0
    enter_ratio: float = 0.8
    exit_ratio: float = 0.7
    saturation_ratio: float = 4.0
    retry_after_s: int = 1
    onprem_headroom: float = 4.0

    def quota_of(self, tenant: str | None) -> Quota:
        return _NO_QUOTA if tenant is None else self.quotas.get(tenant, self.default_quota)


class Decision(NamedTuple):
    target: str
    reason: Reason
    status: int = 0
    retry_after_s: int = 0
    residency_kept: bool = False
    overflowing: bool = False
    cost_usd: float = 0.0
    tenant: str | None = None
    rule: str | None = None
    local_saturated: bool = False
    on_prem_only: bool = False

    @property
    def is_cloud(self) -> bool:
        return self.target not in (LOCAL, SHED)

    @property
    def label(self) -> str:
        """The reason as operators see it: ``rule:<name>``, ``residency+local_saturated``, ..."""
        base = f"rule:{self.rule}" if self.reason is Reason.RULE else self.reason.value
        return f"{base}+local_saturated" if self.local_saturated else base


_NO_TENANT_STATE = TenantState()
_NO_TARGET_STATE = TargetState()
_NO_LOAD = LocalLoad()


def may_leave(features: RequestFeatures, policy: Policy) -> bool:
    """Principle 2: only the configured classes leave; no class means on-prem-only by default."""
    label = features.headers.get(policy.classification_header)
    if label is None or label.strip() == "":
        return policy.unclassified_may_leave
    return label.strip().lower() in policy.cloud_allowed


def decide(features: RequestFeatures, snapshot: Snapshot, policy: Policy) -> Decision:
    tenant = features.headers.get(policy.tenant_header) or None
    shed = _over_quota(tenant, snapshot, policy)
    if shed is not None:
        return shed
    rule = next((r for r in policy.rules if r.matches(features)), None)
    action = rule.action if rule else RuleAction.OVERFLOW
    chain = rule.targets if rule and rule.targets else policy.default_chain
    rule_name = rule.name if rule else None
    load = snapshot.local.get(features.model or "") or snapshot.local.get("") or _NO_LOAD
    target_ms = policy.model_targets_ms.get(features.model or "", policy.latency_target_ms)
    latency = estimated_latency_ms(load, policy) if load.fresh else 0.0
    hot = overflowing(load, target_ms, policy, latency) if load.fresh else False
    if action is RuleAction.SHED:
        return Decision(SHED, Reason.RULE, 503, policy.retry_after_s, tenant=tenant, rule=rule_name)
    wants_out = bool(chain) and (action is RuleAction.TARGET or (action is RuleAction.OVERFLOW and hot))
    if not may_leave(features, policy):
        if wants_out:
            kept = _stay_local(load, latency, policy, Reason.RESIDENCY, tenant, hot, residency_kept=True)
            return kept._replace(on_prem_only=True)
        reason = Reason.LOCAL_OK if load.fresh else Reason.SIGNALS_MISSING
        return Decision(LOCAL, reason, overflowing=hot, tenant=tenant, on_prem_only=True)
    if action is RuleAction.LOCAL:
        return Decision(LOCAL, Reason.RULE, overflowing=hot, tenant=tenant, rule=rule_name)
    if action is RuleAction.OVERFLOW and not load.fresh:
        return Decision(LOCAL, Reason.SIGNALS_MISSING, tenant=tenant)
    if not wants_out:
        return Decision(LOCAL, Reason.LOCAL_OK, tenant=tenant)
    local_wait = latency - load.compute_ms if action is RuleAction.OVERFLOW else float("inf")
    grow = latency > target_ms or saturated(load, latency, policy)
    choice = _pick_target(chain, snapshot, policy, tenant, local_wait, features.body_bytes, grow)
    if choice is not None:
        name, chosen, cost = choice
        return Decision(name, chosen, overflowing=hot, cost_usd=cost, tenant=tenant)
    return _stay_local(load, latency, policy, Reason.NO_TARGET, tenant, hot)


def _stay_local(
    load: LocalLoad,
    latency_ms: float,
    policy: Policy,
    reason: Reason,
    tenant: str | None,
    hot: bool,
    residency_kept: bool = False,
) -> Decision:
    """Local, unless local is saturated too: then shed, so the client retries rather than times out."""
    if load.fresh and saturated(load, latency_ms, policy):
        retry = policy.retry_after_s
        return Decision(SHED, reason, 503, retry, residency_kept, hot, tenant=tenant, local_saturated=True)
    return Decision(LOCAL, reason, residency_kept=residency_kept, overflowing=hot, tenant=tenant)


def _over_quota(tenant: str | None, snapshot: Snapshot, policy: Policy) -> Decision | None:
    if tenant is None:
        return None
    quota = policy.quota_of(tenant)
    state = snapshot.tenants.get(tenant, _NO_TENANT_STATE)
    if quota.requests_per_minute is not None and state.requests_last_minute >= quota.requests_per_minute:
        return Decision(SHED, Reason.TENANT_RATE, 429, 60, tenant=tenant)
    if quota.concurrency is not None and state.in_flight >= quota.concurrency:
        return Decision(SHED, Reason.TENANT_CONCURRENCY, 429, policy.retry_after_s, tenant=tenant)
    return None


def _tenant_budget_allows(tenant: str | None, cost: float, snapshot: Snapshot, policy: Policy) -> bool:
    if tenant is None:
        return True
    quota = policy.quota_of(tenant)
    state = snapshot.tenants.get(tenant, _NO_TENANT_STATE)
    return _within(state.spent_hour_usd + cost, quota.hourly_usd) and _within(
        state.spent_day_usd + cost, quota.daily_usd
    )


def _within(spend: float, limit: float | None) -> bool:
    return limit is None or spend <= limit


def _pick_target(
    chain: tuple[str, ...],
    snapshot: Snapshot,
    policy: Policy,
    tenant: str | None,
    local_wait_ms: float,
    body_bytes: int | None,
    grow: bool,
) -> tuple[str, Reason, float] | None:
    """The cheapest eligible target with a free warm instance (its price and the idle time using it
    may keep billed; the chain's order among equals), else the chain's first eligible cold one.

    A cold target whose start is longer than the local queue is not worth it, except the first
    such target of the chain when ``grow`` (local would miss the target anyway, or is saturated):
    the request misses either way, and the instance it starts serves the rest of the burst. Each
    request that finds no free warm instance may start one, up to the target's concurrency cap, so
    the pool grows at the pace of the burst. A warm instance is free while the warm instances'
    slots outnumber the requests in flight that were not sent there cold (those are starting
    instances of their own)."""
    eligible: list[tuple[str, bool, float]] = []
    for name in chain:
        spec = policy.targets.get(name)
        if spec is None or not spec.takes(body_bytes):
            continue
        state = snapshot.targets.get(name, _NO_TARGET_STATE)
        if state.breaker == BreakerState.OPEN or (
            state.breaker == BreakerState.HALF_OPEN and not state.probe_allowed
        ):
            continue
        if state.in_flight >= spec.concurrency_cap:
            continue
        warm = state.warm_instances * spec.slots > state.in_flight - state.starting
        if not warm and local_wait_ms < spec.cold_start_ms:
            may_start, grow = grow, False
            if not may_start:
                continue
        cost = spec.cost_usd if warm else spec.cold_cost_usd
        if not (
            _within(state.spent_hour_usd + cost, spec.hourly_usd)
            and _within(state.spent_day_usd + cost, spec.daily_usd)
        ):
            continue
        if not _tenant_budget_allows(tenant, cost, snapshot, policy):
            continue
        eligible.append((name, warm, cost))
    if not eligible:
        return None
    warm_ones = [e for e in eligible if e[1]]
    name, warm, cost = (
        min(warm_ones, key=lambda e: e[2] + policy.targets[e[0]].idle_usd) if warm_ones else eligible[0]
    )
    return name, Reason.OVERFLOW_WARM if warm else Reason.OVERFLOW_COLD, cost
