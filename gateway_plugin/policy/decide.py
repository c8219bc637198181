"""Where each request goes: the whole routing policy, as one pure function.

``decide(features, snapshot, policy)`` reads no clock and does no I/O: load signals, breaker
states, budgets and warm pools arrive in an immutable ``Snapshot``, so what runs in the runner is
what the tests and any simulator run.

The order of concerns, each able only to narrow the choice:
1. residency: a request whose class may not leave is never given a cloud target;
2. tenant quota: over its quota, a tenant is shed with 429;
3. the first matching rule picks the action (default: overflow over every target);
4. overflow: stay local while the estimated local wait plus service time, plus the headroom kept
   for on-prem-only traffic, meets the latency target and no gauge of ``local.thresholds`` (GPU
   utilisation, GPU memory, ...) is past its limit, with hysteresis (``policy.overflow``);
   fail safe to local when the signals are missing;
5. cold starts: a cold target is not worth it when the local queue is shorter than its start,
   unless local would miss the target anyway or is saturated: then the chain's first cold target
   starts an instance for each request that finds no warm one free, up to its cap;
6. targets: of those in the chain whose breaker, concurrency cap, budget and request size limit
   allow, the cheapest with a free warm instance, else the first cold one (a body too big for one
   target goes to the next, else stays local);
7. nothing eligible: local, or shed with 503 and Retry-After when local is saturated too.

Deadlines (``policy.admission``): a request with one that may leave and that the cluster would
answer too late looks for a target as a hot cluster's would; one that stays local although the
cluster cannot answer it in time is answered 503 and Retry-After at once rather than queued past
its deadline (delaying every request behind it). A deadline or priority header that says neither
is refused with 400.

When the cluster itself fails (its breaker open, ``health.local_health``), steps 4 to 7 give way:
a request that may leave goes to the chain's first eligible target, warm or cold (waiting for
local is waiting for ever), and one that may not, or that no target takes, is shed at once with
503 and Retry-After rather than sent to a cluster that will not answer.
"""

from __future__ import annotations

import math

from gateway_plugin.policy.admission import InvalidAdmission, deadline_ms
from gateway_plugin.policy.model import (
    LOCAL,
    SHED,
    Decision,
    Policy,
    Reason,
    RuleAction,
)
from gateway_plugin.policy.overflow import WAIT_TAIL, estimated_latency_ms, overflowing, saturated
from gateway_plugin.policy.snapshot import (
    BreakerState,
    LocalLoad,
    RequestFeatures,
    Snapshot,
    TargetState,
    TenantState,
)

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
    load = snapshot.local.get(features.model or "") or snapshot.local.get("") or _NO_LOAD
    target_ms = policy.model_targets_ms.get(features.model or "", policy.latency_target_ms)
    try:
        deadline = deadline_ms(features, policy, target_ms)
    except InvalidAdmission:
        return Decision(SHED, Reason.ADMISSION_INVALID, 400, tenant=tenant)
    latency = estimated_latency_ms(load, policy) if load.fresh else 0.0
    late = deadline is not None and load.fresh and latency > deadline
    held = latency
    first_token_ms = policy.model_ttft_ms.get(features.model or "")
    if first_token_ms is not None:
        # Its users wait for the first token: what it waits is held to that, however long it runs
        # (its tail: ``overflow.WAIT_TAIL``).
        target_ms, held = first_token_ms, (latency - load.compute_ms) * WAIT_TAIL
    decision = _route(features, snapshot, policy, tenant, load, target_ms, latency, late, held)
    if late and decision.target == LOCAL:
        return Decision(
            SHED,
            Reason.DEADLINE,
            503,
            policy.retry_after_s,
            decision.residency_kept,
            decision.overflowing,
            tenant=tenant,
            on_prem_only=decision.on_prem_only,
        )
    return decision


def _route(
    features: RequestFeatures,
    snapshot: Snapshot,
    policy: Policy,
    tenant: str | None,
    load: LocalLoad,
    target_ms: float,
    latency: float,
    late: bool,
    held: float,
) -> Decision:
    """Steps 3 to 7; ``late``: the cluster would answer past the request's deadline; ``held``: the
    part of ``latency`` held to ``target_ms`` (its wait, for a first-token target)."""
    rule = next((r for r in policy.rules if r.matches(features)), None)
    action = rule.action if rule else RuleAction.OVERFLOW
    chain = rule.targets if rule and rule.targets else policy.default_chain
    rule_name = rule.name if rule else None
    hot = overflowing(load, target_ms, policy, held) if load.fresh else False
    spill = hot or late or (load.fresh and load.gauges_hot)
    if action is RuleAction.SHED:
        return Decision(SHED, Reason.RULE, 503, policy.retry_after_s, tenant=tenant, rule=rule_name)
    if load.failing and not load.probe_allowed:
        return _local_failing(features, action, chain, snapshot, policy, tenant)
    wants_out = bool(chain) and (action is RuleAction.TARGET or (action is RuleAction.OVERFLOW and spill))
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
    grow = held > target_ms or saturated(load, latency, policy)
    choice = _pick_target(chain, snapshot, policy, tenant, local_wait, features.body_bytes, grow)
    if choice is not None:
        name, chosen, cost = choice
        return Decision(name, chosen, overflowing=hot, cost_usd=cost, tenant=tenant)
    return _stay_local(load, latency, policy, Reason.NO_TARGET, tenant, hot)


def _local_failing(
    features: RequestFeatures,
    action: RuleAction,
    chain: tuple[str, ...],
    snapshot: Snapshot,
    policy: Policy,
    tenant: str | None,
) -> Decision:
    """The cluster fails its requests: out if the request may leave and a target takes it (cold
    or not: local would never answer), else 503 at once. A rule that keeps a request local keeps
    it off the cloud here too. Overflowing, so that traffic comes home through the hysteresis."""
    leaves = may_leave(features, policy)
    if leaves and chain and action is not RuleAction.LOCAL:
        choice = _pick_target(chain, snapshot, policy, tenant, math.inf, features.body_bytes, True)
        if choice is not None:
            name, chosen, cost = choice
            return Decision(name, chosen, overflowing=True, cost_usd=cost, tenant=tenant)
    retry = policy.retry_after_s
    return Decision(
        SHED, Reason.LOCAL_FAILING, 503, retry, overflowing=True, tenant=tenant, on_prem_only=not leaves
    )


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
    """The cheapest eligible target with a free warm instance (its price, and where nothing is in
    flight there the idle time using it may keep billed; the chain's order among equals), else the
    chain's first eligible cold one.

    A cold target whose start is longer than the local queue is not worth it, except the first
    such target of the chain when ``grow`` (local would miss the target anyway, or is saturated):
    the request misses either way, and the instance it starts serves the rest of the burst. Each
    request that finds no free warm instance may start one, up to the target's concurrency cap, so
    the pool grows at the pace of the burst. A warm instance is free while the warm instances'
    slots outnumber the requests in flight that were not sent there cold (those are starting
    instances of their own)."""
    eligible: list[tuple[str, bool, float, float]] = []
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
        # Idle time is billed for using a target nothing else uses (as long as it was idle, up to
        # its TTL): while one serves, its warm instances stay alive (and billed) whatever this
        # request does.
        price = cost + (spec.idle_price(state.idle_s) if state.in_flight == 0 else 0.0)
        eligible.append((name, warm, cost, price))
    if not eligible:
        return None
    warm_ones = [e for e in eligible if e[1]]
    name, warm, cost, _ = min(warm_ones, key=lambda e: e[3]) if warm_ones else eligible[0]
    return name, Reason.OVERFLOW_WARM if warm else Reason.OVERFLOW_COLD, cost
