"""``local:``: the on-prem Triton cluster."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gateway_plugin.config.model import Model


class LocalEndpoint(Model):
    url: str = Field(description="Triton's HTTP endpoint, http://host:port")
    metrics_url: str = Field(description="Triton's Prometheus endpoint, http://host:8002/metrics")


class LocalCost(Model):
    """What the on-prem cluster costs whether it is busy or not: the price of its GPUs by the hour
    (amortised purchase, power, space, operations), so a local request has a price as a cloud one
    has, and bursting can be weighed against buying GPUs for the peak."""

    gpus: int = Field(default=0, ge=0, description="GPUs serving the cluster (0: on-prem cost unknown)")
    usd_per_gpu_hour: float = Field(default=0.0, ge=0, description="what one of them costs an hour")

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.usd_per_gpu_hour


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
    cost: LocalCost = Field(default_factory=LocalCost, description="what the cluster costs an hour")
