"""The decision table's shape, declared once: the runner builds tables from these models, and the
plugin checks every table it fetches against the JSON schema generated from them
(``python -m devtools.generate`` writes ``spillway/table_schema.lua``; APISIX's
``core.schema.check`` runs it). Field order is the encoded order; a field that is None is left out
of the table (the plugin reads it as absent).

Plain dataclasses (the runner builds one per fetch, with up to ``MAX_TENANTS`` tenant rows);
pydantic only serialises them and writes their schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter

from gateway_plugin.policy.model import RuleAction
from gateway_plugin.policy.snapshot import BreakerState

DetectorKind = Literal["card", "iban", "search", "pattern"]


@dataclass(frozen=True, slots=True)
class QuotaRow:
    requests_per_minute: int | None = None
    concurrency: int | None = None
    hourly_usd: float | None = None
    daily_usd: float | None = None


@dataclass(frozen=True, slots=True)
class RuleRow:
    name: str
    action: RuleAction
    targets: list[str]
    # (header or argument name, its regex); the plugin compiles each pattern when it checks a table.
    headers: list[tuple[str, str]]
    args: list[tuple[str, str]]
    models: list[str]
    uri: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyRow:
    classification_header: str
    cloud_allowed: list[str]
    unclassified_may_leave: bool
    tenant_header: str
    tenant_from_consumer: bool
    consumer_ceilings: dict[str, str]
    quotas: dict[str, QuotaRow]
    default_quota: QuotaRow
    latency_target_ms: float
    model_targets_ms: dict[str, float]
    model_ttft_ms: dict[str, float]
    max_queue_ms: float
    enter_ratio: float
    exit_ratio: float
    saturation_ratio: float
    retry_after_s: int
    parallelism: int
    onprem_headroom: float
    default_chain: list[str]
    rules: list[RuleRow]
    # policy.admission: "" where a header is not read.
    deadline_header: str
    priority_header: str
    max_deadline_ms: float
    default_sheddable: bool


@dataclass(frozen=True, slots=True)
class DetectorRow:
    name: str
    kind: DetectorKind
    # A search's PCRE regex; an operator's pattern as written (the plugin runs its program).
    pattern: str | None = None
    # An operator's pattern compiled for the plugin's automaton (content.program).
    program: str | None = None


@dataclass(frozen=True, slots=True)
class ContentRow:
    detectors: list[DetectorRow]
    max_bytes: int
    unscannable_stays: bool
    classify_as: str
    rules: list[str]
    # The CPU one request's scan may take (content.scan_budget_ms).
    budget_ms: float


@dataclass(frozen=True, slots=True)
class LoadRow:
    gauges_hot: bool
    fresh: bool
    latency_ms: float
    backlog_ms: float
    compute_ms: float
    overflowing: bool
    onprem_rps: float
    failing: bool
    probe_allowed: bool
    # Requests the members that answer run at once (policy.overflow.capacity).
    capacity: float


@dataclass(frozen=True, slots=True)
class TargetRow:
    cap: int
    slots: int
    # The idle time a slot used now adds to the bill, as of the table (TargetPolicy.idle_price).
    idle_usd: float
    cold_start_ms: float
    cost_usd: float
    cold_cost_usd: float
    breaker: BreakerState
    probe_allowed: bool
    warm: int
    spent_hour_usd: float
    spent_day_usd: float
    spent_mark: float
    given_back_mark: float
    invoke: bool
    sign_body: bool
    forward: list[str]
    stream_usd: list[float]
    hourly_usd: float | None = None
    daily_usd: float | None = None
    max_request_bytes: int | None = None
    # What traffic-split matches; absent only for an invoke-mode target (the plugin checks that).
    value: str | None = None
    key_env: str | None = None


@dataclass(frozen=True, slots=True)
class TenantRow:
    requests_last_minute: int
    spent_hour_usd: float
    spent_day_usd: float


@dataclass(frozen=True, slots=True)
class DecisionTable:
    format: int
    version: int
    built_at: float
    decision_header: bool
    policy: PolicyRow
    content: ContentRow
    local: dict[str, LoadRow]
    targets: dict[str, TargetRow]
    tenants: dict[str, TenantRow]


_ADAPTER: TypeAdapter[DecisionTable] = TypeAdapter(DecisionTable)


def as_dict(table: DecisionTable) -> dict[str, Any]:
    """The table as JSON-ready values, absent fields left out."""
    dumped: dict[str, Any] = _ADAPTER.dump_python(table, exclude_none=True)
    return dumped


def json_schema() -> dict[str, Any]:
    """The models' JSON schema as pydantic writes it (``$defs``, ``anyOf`` with null for optional
    fields); ``devtools.generate.fast_path_contract`` turns it into the draft-4 form the plugin checks."""
    return _ADAPTER.json_schema()
