"""``simulation:`` in spillway.yaml: what the simulator assumes of the cluster and the clouds.

The runner ignores this section; ``python -m gateway_plugin simulate`` reads it. Every field has a
default, so a config without it simulates too: the cluster then takes 50 ms a request (measure
yours with ``simulate --calibrate``), and each target what its ``cost.expected_duration_ms`` and
``cold_start_ms`` say.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SimulatedCluster(_Model):
    """The on-prem cluster: ``local.parallelism`` servers, a FIFO queue, Triton's dynamic batcher."""

    service_ms: float = Field(default=50.0, gt=0, description="mean service time of one request")
    service_cv: float = Field(
        default=0.2, ge=0, le=5, description="its coefficient of variation (lognormal; 0: fixed)"
    )
    max_batch: int = Field(default=1, ge=1, le=1024, description="dynamic batching: largest batch (1: none)")
    batch_growth: float = Field(
        default=0.1, ge=0, description="a batch of n takes the service time x (1 + growth x (n - 1))"
    )
    network_ms: float = Field(default=1.0, ge=0, description="gateway to cluster and back")
    scrape_lag_ms: float = Field(
        default=5.0, ge=0, description="from Triton's sample to the runner's reading"
    )


class SimulatedTarget(_Model):
    """One cloud target as the platform behaves (the target's own section says what Spillway assumes)."""

    service_ms: float | None = Field(
        default=None, gt=0, description="mean inference time (default: cost.expected_duration_ms)"
    )
    service_cv: float = Field(
        default=0.2,
        ge=0,
        le=5,
        description="the inference time's coefficient of variation (lognormal; 0: fixed)",
    )
    cold_start_ms: float | None = Field(
        default=None, ge=0, description="mean cold start (default: the target's cold_start_ms)"
    )
    cold_start_cv: float = Field(
        default=0.3, ge=0, le=5, description="the cold start's coefficient of variation (lognormal; 0: fixed)"
    )
    network_ms: float = Field(
        default=20.0, ge=0, description="round trip from the gateway, added to each request"
    )
    instance_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="requests one instance runs at once (default: the target's instance_concurrency)",
    )
    max_instances: int = Field(
        default=1000, ge=1, description="the platform's concurrency limit; past it, 429"
    )
    error_rate: float = Field(default=0.0, ge=0, le=1, description="share of answers that fail (5xx)")
    idle_usd_per_second: float | None = Field(
        default=None,
        ge=0,
        description="what a live, idle instance costs (default: the target's cost.usd_per_idle_second)",
    )


class SimulatedGeneration(_Model):
    """Requests are LLM generations streamed back (``generate_stream``): each draws its prompt and
    output lengths from a published trace (``simulation.tokens``), takes ``prefill_ms_per_1k_tokens``
    to its first token and ``ms_per_output_token`` for each after, on the cluster and on a function
    alike (times the service's lognormal noise); the SLO is then the time to the first token, held
    to ``local.model_ttft_targets_ms`` of the model (else ``latency_target_ms``), and a function is
    billed the whole stream and its tokens."""

    tokens: Literal["azure-conversation", "azure-code"] = Field(
        default="azure-conversation", description="whose prompt and output lengths"
    )
    prefill_ms_per_1k_tokens: float = Field(
        default=40.0, gt=0, description="time to read 1,000 prompt tokens"
    )
    ms_per_output_token: float = Field(default=20.0, gt=0, description="time between output tokens")


class MemberChange(_Model):
    """From ``at_s`` on (seconds into the trace), the cluster has ``members`` pods: a rolling update
    (one leaves, its replacement joins), a drain, an autoscaler's step."""

    at_s: float = Field(ge=0, description="when, in seconds from the trace's start")
    members: int = Field(ge=1, le=10_000, description="how many members serve from then on")


class SimulationSettings(_Model):
    model: str = Field(default="model", description="the model every simulated request is for")
    cluster: SimulatedCluster = Field(
        default_factory=SimulatedCluster,
        description="how the on-prem cluster serves (measure it: simulate --calibrate)",
    )
    targets: dict[str, SimulatedTarget] = Field(
        default_factory=dict, description="per target name; targets not listed get the defaults"
    )
    gateway_counts: bool = Field(
        default=True,
        description="the gateway counts what it has in flight (the fast path); false: the runner's own "
        "books, which learn of answers when the logger reports them (the ext-plugin route)",
    )
    outcome_lag_s: float | None = Field(
        default=None,
        ge=0,
        description="how late answers reach the runner (default: outcomes.batch_s, the logger's batch)",
    )
    request_bytes: int = Field(
        default=16_384, ge=0, description="body size of a request the trace leaves unsized"
    )
    large_share: float = Field(default=0.0, ge=0, le=1, description="share of requests with large bodies")
    large_bytes: int = Field(default=8 * 1024 * 1024, ge=0, description="the size of those")
    members: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="the cluster's members at the start (default: local.endpoints', at least 1); each "
        "runs local.member_parallelism, or local.parallelism's share",
    )
    generation: SimulatedGeneration | None = Field(
        default=None, description="requests are streamed LLM generations (null: inference answered whole)"
    )
    membership: list[MemberChange] = Field(
        default_factory=list,
        max_length=10_000,
        description="members leaving and joining while the trace runs (a rolling update, autoscaling)",
    )

    def members_at_start(self, endpoints: int) -> int:
        return self.members or max(1, endpoints)

    def target(self, name: str) -> SimulatedTarget:
        return self.targets.get(name) or SimulatedTarget()
