"""``local:``: the on-prem Triton cluster."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gateway_plugin.config.model import Model


class LocalEndpoint(Model):
    url: str = Field(description="Triton's HTTP endpoint, http://host:port")
    metrics_url: str = Field(description="Triton's Prometheus endpoint, http://host:8002/metrics")


class LocalCluster(Model):
    """The on-prem Triton cluster: where requests go while it meets its latency target."""

    endpoints: list[LocalEndpoint] = Field(default_factory=list, description="every on-prem Triton to scrape")
    latency_target_ms: float = Field(default=200.0, gt=0, description="default p50 latency target")
    model_latency_targets_ms: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="per-model targets"
    )
    parallelism: int = Field(default=1, ge=1, description="requests the cluster runs at once per model")
    scrape_period_s: float = Field(default=0.25, gt=0, le=10, description="metrics scrape period")
    stale_after_s: float = Field(default=2.0, gt=0, description="signals older than this are missing")
    max_queue_ms: float = Field(
        default=5000.0, gt=0, description="past this local wait, shed instead of queueing"
    )
