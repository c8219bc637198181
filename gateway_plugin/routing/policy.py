"""Where each request goes: the whole routing policy, as one pure function.

``decide(features, snapshot, policy)`` reads no clock and does no I/O: load signals, breaker
states, budgets and warm pools arrive in an immutable ``Snapshot``, so what runs in the runner is
what the tests and any simulator run.

The order of concerns, each able only to narrow the choice:
1. residency: a request whose class may not leave is never given a cloud target;
2. tenant quota: over its quota, a tenant is shed with 429;
3. the first matching rule picks the action (default: overflow over every target);
4. overflow: stay local while the estimated local wait plus service time meets the latency target,
   with hysteresis; fail safe to local when the signals are missing;
5. cold starts: a cold target is not worth it when the local queue is shorter than its start,
   unless local would miss anyway with the target's warm instances all busy, or is saturated
   (then the chain's first cold target starts one instance at a time);
6. targets: the first of the chain whose breaker, concurrency cap, budget and request size limit
   allow, warm first (a body too big for one target goes to the next, else stays local);
7. nothing eligible: local, or shed with 503 and Retry-After when local is saturated too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple

LOCAL = "local"
SHED = "shed"
# Triton reports a few microseconds of queue time even for requests that never waited.
IDLE_QUEUE_SHARE = 0.1
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
    """The on-prem cluster's state for one model, from Triton's metrics and the gateway's own count."""

    fresh: bool = False
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    pending: int = 0
    sent_since_scrape: int = 0
    age_ms: float = 0.0
    overflowing: bool = False
    observed_ms: float = 0.0


class TargetState(NamedTuple):
    breaker: BreakerState = BreakerState.CLOSED
    probe_allowed: bool = False
    in_flight: int = 0
    warm_instances: int = 0
    spent_hour_usd: float = 0.0
    spent_day_usd: float = 0.0


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
    name: str
    concurrency_cap: int
    cold_start_ms: float
    cost_usd: float
    cold_cost_usd: float
    hourly_usd: float | None = None
    daily_usd: float | None = None
    max_request_bytes: int | None = None

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
    enter_ratio: float = 1.0
    exit_ratio: float = 0.8
    saturation_ratio: float = 4.0
    retry_after_s: int = 1

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


def estimated_latency_ms(load: LocalLoad, policy: Policy) -> float:
    """Wait behind the queue plus service time.

    The wait is the larger of what Triton measured and the backlog: requests pending at the
    scrape plus those the gateway sent since, less what the cluster finished in the meantime,
    spread over its parallelism. While the cluster queues, what the gateway itself recently saw it
    take to answer (``observed_ms``) is a floor: it includes what Triton's own metrics do not (its
    HTTP front, a busy host). Once nothing is left waiting and Triton's queue time is a sliver of
    its compute time (it reports some microseconds even for requests that never waited), that
    floor (which only local answers lower, and few are local while spilling) no longer holds a
    drained cluster busy.
    """
    backlog = float(load.pending + load.sent_since_scrape)
    if load.compute_ms > 0:
        backlog = max(0.0, backlog - load.age_ms * policy.parallelism / load.compute_ms)
    modelled = max(load.queue_ms, backlog * load.compute_ms / policy.parallelism) + load.compute_ms
    drained = backlog == 0 and load.pending == 0 and load.queue_ms <= IDLE_QUEUE_SHARE * load.compute_ms
    return modelled if drained else max(modelled, load.observed_ms)


def overflowing(load: LocalLoad, target_ms: float, policy: Policy) -> bool:
    """Hysteresis: enter above target x enter_ratio, leave below target x exit_ratio, else keep."""
    latency = estimated_latency_ms(load, policy)
    if latency > target_ms * policy.enter_ratio:
        return True
    if latency < target_ms * policy.exit_ratio:
        return False
    return load.overflowing


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
    hot = overflowing(load, target_ms, policy) if load.fresh else False
    if action is RuleAction.SHED:
        return Decision(SHED, Reason.RULE, 503, policy.retry_after_s, tenant=tenant, rule=rule_name)
    wants_out = bool(chain) and (action is RuleAction.TARGET or (action is RuleAction.OVERFLOW and hot))
    if not may_leave(features, policy):
        if wants_out:
            return _stay_local(load, policy, Reason.RESIDENCY, tenant, hot, residency_kept=True)
        reason = Reason.LOCAL_OK if load.fresh else Reason.SIGNALS_MISSING
        return Decision(LOCAL, reason, overflowing=hot, tenant=tenant)
    if action is RuleAction.LOCAL:
        return Decision(LOCAL, Reason.RULE, overflowing=hot, tenant=tenant, rule=rule_name)
    if action is RuleAction.OVERFLOW and not load.fresh:
        return Decision(LOCAL, Reason.SIGNALS_MISSING, tenant=tenant)
    if not wants_out:
        return Decision(LOCAL, Reason.LOCAL_OK, tenant=tenant)
    latency = estimated_latency_ms(load, policy)
    local_wait = latency - load.compute_ms if action is RuleAction.OVERFLOW else float("inf")
    grow = (latency > target_ms, _saturated(load, latency, policy))
    choice = _pick_target(chain, snapshot, policy, tenant, local_wait, features.body_bytes, grow)
    if choice is not None:
        name, chosen, cost = choice
        return Decision(name, chosen, overflowing=hot, cost_usd=cost, tenant=tenant)
    return _stay_local(load, policy, Reason.NO_TARGET, tenant, hot)


def _stay_local(
    load: LocalLoad,
    policy: Policy,
    reason: Reason,
    tenant: str | None,
    hot: bool,
    residency_kept: bool = False,
) -> Decision:
    """Local, unless local is saturated too: then shed, so the client retries rather than times out."""
    if load.fresh and _saturated(load, estimated_latency_ms(load, policy), policy):
        retry = policy.retry_after_s
        return Decision(SHED, reason, 503, retry, residency_kept, hot, tenant=tenant, local_saturated=True)
    return Decision(LOCAL, reason, residency_kept=residency_kept, overflowing=hot, tenant=tenant)


def _may_start(state: TargetState, misses: bool, saturated: bool) -> bool:
    """Whether the chain's first cold target may start an instance though the local queue is
    shorter than its start: one at a time, when local would miss the target anyway and the
    target's warm instances are all busy, or local is saturated (the request would be shed). The
    request misses either way; the instance serves the rest of the burst."""
    one_at_a_time = state.in_flight <= state.warm_instances
    return one_at_a_time and (saturated or (misses and state.warm_instances > 0))


def _saturated(load: LocalLoad, latency_ms: float, policy: Policy) -> bool:
    return (
        latency_ms - load.compute_ms > policy.max_queue_ms
        or latency_ms > policy.latency_target_ms * policy.saturation_ratio
    )


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
    grow: tuple[bool, bool],
) -> tuple[str, Reason, float] | None:
    """The first eligible target of the chain, preferring one with a free warm instance."""
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
        warm = state.warm_instances > state.in_flight
        if not warm and local_wait_ms < spec.cold_start_ms:
            first_cold, grow = grow, (False, False)
            if not _may_start(state, *first_cold):
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
    name, warm, cost = next((e for e in eligible if e[1]), eligible[0])
    return name, Reason.OVERFLOW_WARM if warm else Reason.OVERFLOW_COLD, cost
