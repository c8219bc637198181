"""``rules:``, ``residency:``, ``overflow:``, ``admission:``, ``breaker:``, ``budgets:`` and
``tenants:``: what the routing policy is built from (``policy.build``)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gateway_plugin.config.model import Model
from gateway_plugin.policy.model import RuleAction
from gateway_plugin.request.header_names import HeaderName


class Match(Model):
    headers: dict[HeaderName, str] = Field(default_factory=dict, description="header → regex (full match)")
    uri: str | None = Field(default=None, description="regex searched in the path")
    args: dict[str, str] = Field(default_factory=dict, description="query arg → regex (full match)")
    models: list[str] = Field(default_factory=list, description="model names (any of)")

    @field_validator("uri")
    @classmethod
    def _uri_regex(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value

    @field_validator("headers", "args")
    @classmethod
    def _regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            re.compile(pattern)
        return value


class Rule(Model):
    name: str = Field(description="the rule's name, as logs and decisions show it")
    priority: int = Field(default=0, description="higher runs first")
    match: Match = Field(
        default_factory=Match, description="what a request must carry for the rule to apply (all of it)"
    )
    action: RuleAction = Field(
        description="local: stay; overflow: local until the load says otherwise; target: cloud first; shed"
    )
    targets: list[str] = Field(default_factory=list, description="fallback chain, first eligible wins")
    content_checks: bool = Field(
        default=False,
        description="read the text inputs of the requests this rule decides: one the content: detectors "
        "match stays on premises",
    )


class Residency(Model):
    header: HeaderName = Field(default="x-data-classification", description="request header with the class")
    cloud_allowed: list[str] = Field(default_factory=lambda: ["public"], description="classes that may leave")
    unclassified_may_leave: bool = Field(default=False, description="no header: on-prem-only unless true")
    consumer_ceilings: dict[str, str] = Field(
        default_factory=dict,
        description="APISIX consumer → its data's class: one not in cloud_allowed keeps every request of "
        "that consumer home, whatever its header says (needs tenants.source: consumer)",
    )


class Overflow(Model):
    enter_ratio: float = Field(default=0.8, gt=0, description="overflow when estimate > target x this")
    exit_ratio: float = Field(default=0.7, gt=0, description="stop when estimate < target x this")
    saturation_ratio: float = Field(default=4.0, gt=0, description="local is saturated past target x this")
    retry_after_s: int = Field(
        default=1,
        ge=1,
        description="the Retry-After of a shed request's 503 (and of a 429 over a concurrency quota), in s",
    )
    onprem_headroom: float = Field(
        default=4.0,
        ge=0,
        le=100,
        description="spill sooner by this many times the queueing that on-prem-only arrivals alone would "
        "cause (0: none)",
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> Overflow:
        if self.exit_ratio > self.enter_ratio:
            raise ValueError("exit_ratio must not exceed enter_ratio, or overflow would flap")
        return self


class Admission(Model):
    """A client's deadline and priority, read from its headers (input to check, not identity: a
    client may say it is in a hurry, which only gets it refused sooner)."""

    deadline_header: HeaderName | None = Field(
        default="x-request-deadline-s",
        description="seconds the client will wait for its answer (e.g. 2.5): a request that cannot be "
        "answered in time anywhere is refused at once with 503 and Retry-After; none: not read",
    )
    priority_header: HeaderName | None = Field(
        default="x-request-priority",
        description="critical or sheddable: a sheddable request without a deadline takes its model's "
        "latency target as one; none: not read",
    )
    max_deadline_s: float = Field(
        default=60.0, gt=0, le=3600, description="a longer deadline is read as this one"
    )
    default_priority: Literal["critical", "sheddable"] = Field(
        default="critical", description="the priority of a request that names none"
    )


class BreakerSettings(Model):
    consecutive_failures: int = Field(
        default=5, ge=1, description="failed answers in a row from a target that open its breaker"
    )
    failure_rate: float = Field(
        default=0.5, gt=0, le=1, description="or this share of failed answers over the window opens it"
    )
    window: int = Field(default=20, ge=2, description="outcomes the failure rate is taken over")
    cooldown_s: float = Field(
        default=5.0,
        gt=0,
        description="how long an open breaker waits before a probe, in s; doubles on each reopening",
    )
    max_cooldown_s: float = Field(default=120.0, gt=0, description="the longest the cooldown grows to, in s")
    half_open_probes: int = Field(
        default=1, ge=1, description="probes in flight at once while half-open (for all nodes together)"
    )
    retry_budget_ratio: float = Field(default=0.1, ge=0, le=1, description="retries as a share of requests")


Usd = Annotated[float, Field(ge=0)]


class Budgets(Model):
    per_target_hourly_usd: dict[str, Usd] = Field(
        default_factory=dict,
        description="target name to its spend an hour, USD; a target not named: no limit",
    )
    per_target_daily_usd: dict[str, Usd] = Field(
        default_factory=dict, description="target name to its spend a day, USD; a target not named: no limit"
    )


class TenantQuota(Model):
    requests_per_minute: int | None = Field(
        default=None, ge=1, description="requests a minute; past it, 429 (unset: no limit)"
    )
    concurrency: int | None = Field(
        default=None, ge=1, description="requests in flight at once; past it, 429 (unset: no limit)"
    )
    hourly_usd: float | None = Field(
        default=None,
        ge=0,
        description="cloud spend an hour, USD: past it the tenant's requests no longer leave "
        "(unset: no limit)",
    )
    daily_usd: float | None = Field(
        default=None,
        ge=0,
        description="cloud spend a day, USD: past it the tenant's requests no longer leave (unset: no limit)",
    )


class Tenants(Model):
    source: Literal["header", "consumer"] = Field(
        default="header",
        description="consumer: the APISIX consumer that authenticated the request is the tenant, and the "
        "header is ignored (and removed); header: the header names it, as the client says",
    )
    header: HeaderName = Field(
        default="x-tenant", description="request header naming the tenant (with source: header)"
    )
    quotas: dict[Annotated[str, Field(min_length=1, max_length=256)], TenantQuota] = Field(
        default_factory=dict, description="per tenant name (at most 256 characters)"
    )
    default: TenantQuota = Field(default_factory=TenantQuota, description="quota of tenants not listed")
    max_tracked: int = Field(
        default=10_000,
        ge=1,
        description="tenants under a quota kept in memory; the least recently seen is forgotten first",
    )
