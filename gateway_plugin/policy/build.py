"""Compile ``spillway.yaml`` (and a route's overrides) into the policy's immutable form, once."""

from __future__ import annotations

import re

from gateway_plugin.config import SpillwayConfig, TenantQuota
from gateway_plugin.costs import request_cost_usd
from gateway_plugin.policy.gauges import compiled
from gateway_plugin.policy.model import Policy, Quota, RulePolicy, TargetPolicy
from gateway_plugin.policy.tenants import tenant_key


def _quota(q: TenantQuota) -> Quota:
    return Quota(q.requests_per_minute, q.concurrency, q.hourly_usd, q.daily_usd)


def build_policy(config: SpillwayConfig) -> Policy:
    targets = {
        t.name: TargetPolicy(
            name=t.name,
            concurrency_cap=t.concurrency_cap,
            cold_start_ms=t.cold_start_ms,
            cost_usd=request_cost_usd(t.cost),
            cold_cost_usd=request_cost_usd(t.cost, cold=True, cold_start_ms=t.cold_start_ms),
            hourly_usd=config.budgets.per_target_hourly_usd.get(t.name),
            daily_usd=config.budgets.per_target_daily_usd.get(t.name),
            max_request_bytes=t.request_limit_bytes,
            slots=t.instance_concurrency,
            idle_usd=t.cost.usd_per_idle_second * t.idle_ttl_s / t.instance_concurrency,
            idle_ttl_s=t.idle_ttl_s,
        )
        for t in config.targets
    }
    rules = tuple(
        RulePolicy(
            name=r.name,
            action=r.action,
            targets=tuple(r.targets),
            headers=tuple((k.lower(), re.compile(v)) for k, v in r.match.headers.items()),
            uri=re.compile(r.match.uri) if r.match.uri else None,
            args=tuple((k, re.compile(v)) for k, v in r.match.args.items()),
            models=frozenset(r.match.models),
        )
        for r in sorted(config.rules, key=lambda r: -r.priority)
    )
    return Policy(
        targets=targets,
        rules=rules,
        default_chain=tuple(t.name for t in config.targets),
        classification_header=config.residency.header.lower(),
        cloud_allowed=frozenset(c.lower() for c in config.residency.cloud_allowed),
        unclassified_may_leave=config.residency.unclassified_may_leave,
        tenant_header=config.tenants.header.lower(),
        tenant_from_consumer=config.tenants.source == "consumer",
        consumer_ceilings={k: v.strip().lower() for k, v in config.residency.consumer_ceilings.items()},
        quotas={tenant_key(name): _quota(q) for name, q in config.tenants.quotas.items()},
        default_quota=_quota(config.tenants.default),
        latency_target_ms=config.local.latency_target_ms,
        model_targets_ms=dict(config.local.model_latency_targets_ms),
        model_ttft_ms=dict(config.local.model_ttft_targets_ms),
        parallelism=config.local.parallelism,
        max_queue_ms=config.local.max_queue_ms,
        enter_ratio=config.overflow.enter_ratio,
        exit_ratio=config.overflow.exit_ratio,
        saturation_ratio=config.overflow.saturation_ratio,
        retry_after_s=config.overflow.retry_after_s,
        onprem_headroom=config.overflow.onprem_headroom,
        deadline_header=config.admission.deadline_header or "",
        priority_header=config.admission.priority_header or "",
        max_deadline_ms=config.admission.max_deadline_s * 1000,
        default_sheddable=config.admission.default_priority == "sheddable",
        thresholds=compiled(config.thresholds(), config.overflow.enter_ratio, config.overflow.exit_ratio)[1],
    )
