"""The policy's types: what the config compiles into (``Policy``) and what a decision says
(``Decision``), apart from the decision itself (``policy.decide``) and the estimate it reads
(``policy.overflow``), which both use them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from gateway_plugin.policy.snapshot import (
    RequestFeatures,
    Threshold,
)

LOCAL = "local"
SHED = "shed"


class RuleAction(StrEnum):
    """What a matching rule does: stay, overflow while the cluster is hot, go out first, or shed."""

    LOCAL = "local"
    OVERFLOW = "overflow"
    TARGET = "target"
    SHED = "shed"


# How a decision is spelled for operators (``Decision.label``, ``Decision.shown``) and in the fast
# path's summaries: ``<target>;<reason>[+local_saturated]``, a rule's reason as ``rule:<name>``.
DECISION_SEP = ";"
LABEL_SEP = "+"
SATURATED = "local_saturated"
RULE_PREFIX = "rule:"


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
    LOCAL_FAILING = "local_failing"
    # Answered at once: it could not be answered by its deadline anywhere it may go.
    DEADLINE = "deadline"
    # Refused with 400: its deadline or priority header says neither.
    ADMISSION_INVALID = "admission_invalid"


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
    once (FC's instance concurrency; 1 on Lambda); ``idle_usd``: what using one of its slots keeps
    billed as idle time at most (an instance used is kept alive up to its idle TTL: FC bills idle
    GPUs), which weighs in choosing among warm targets where nothing is in flight."""

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
    idle_ttl_s: float = 300.0

    def idle_price(self, idle_s: float) -> float:
        """The idle time using a slot adds to the bill, ``idle_s`` after the target's last answer:
        its instance stays billed a TTL past its last use, so a use within the TTL extends that by
        the gap alone, and one past it (or with no answer known) keeps a woken instance a whole TTL."""
        return self.idle_usd * min(1.0, idle_s / self.idle_ttl_s)

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
    # A model held to a time to first token: its requests wait at most this long for the cluster.
    model_ttft_ms: Mapping[str, float] = field(default_factory=dict)
    parallelism: int = 1
    max_queue_ms: float = 5000.0
    enter_ratio: float = 0.8
    exit_ratio: float = 0.7
    saturation_ratio: float = 4.0
    retry_after_s: int = 1
    onprem_headroom: float = 4.0
    thresholds: tuple[Threshold, ...] = ()
    # ``admission:``: the headers that carry a deadline and a priority ("" is none), the longest
    # deadline read, and whether a request that names no priority is sheddable.
    deadline_header: str = ""
    priority_header: str = ""
    max_deadline_ms: float = 60_000.0
    default_sheddable: bool = False

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
        base = f"{RULE_PREFIX}{self.rule}" if self.reason is Reason.RULE else self.reason.value
        return f"{base}{LABEL_SEP}{SATURATED}" if self.local_saturated else base

    @property
    def shown(self) -> str:
        """``X-Spillway-Decision``'s value: ``<target>;<label>``."""
        return f"{self.target}{DECISION_SEP}{self.label}"
