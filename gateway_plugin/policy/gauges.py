"""The gauges ``local.thresholds`` names, read from each endpoint's scrape and taken over the cluster.

Triton samples its GPU and CPU gauges every ``--metrics-interval-ms`` (2 s by default), one sample
per GPU (label ``gpu_uuid``). Within an endpoint the largest sample counts (its busiest or fullest
GPU); across endpoints the largest, or the mean where a threshold says so. A gauge no endpoint
reports (GPU metrics off, no GPU) reads as absent: it neither enters nor holds overflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.samples import Sample

from gateway_plugin.config.thresholds import (
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
    Limit,
    Thresholds,
)
from gateway_plugin.policy.snapshot import Threshold

Gauges = tuple[float | None, ...]


@dataclass(frozen=True)
class GaugeSpec:
    """One threshold's gauge: ``metric`` (divided by ``total``, sample by sample with the same
    labels, where set) among the samples carrying ``labels``."""

    name: str
    metric: str
    labels: tuple[tuple[str, str], ...] = ()
    total: str | None = None
    across: str = "max"

    def endpoint_value(self, samples: Sequence[Sample]) -> float | None:
        wanted = [s for s in samples if s.name == self.metric and self._matches(s)]
        if self.total is None:
            return max((s.value for s in wanted), default=None)
        totals = {_key(s): s.value for s in samples if s.name == self.total and self._matches(s)}
        shares = [s.value / totals[_key(s)] for s in wanted if totals.get(_key(s), 0) > 0]
        return max(shares, default=None)

    def _matches(self, sample: Sample) -> bool:
        return all(sample.labels.get(k) == v for k, v in self.labels)

    def cluster_value(self, per_endpoint: Iterable[float | None]) -> float | None:
        values = [v for v in per_endpoint if v is not None]
        if not values:
            return None
        return max(values) if self.across == "max" else sum(values) / len(values)


def _key(sample: Sample) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(sample.labels.items()))


def compiled(
    thresholds: Thresholds, enter_ratio: float, exit_ratio: float
) -> tuple[tuple[GaugeSpec, ...], tuple[Threshold, ...]]:
    """What the scraper reads and what the policy compares it with, in the same order."""
    named: list[tuple[GaugeSpec, Limit]] = []
    if thresholds.gpu_utilization is not None:
        limit = thresholds.gpu_utilization
        named.append((GaugeSpec("gpu_utilization", GPU_UTILIZATION, across=limit.across), limit))
    if thresholds.gpu_memory is not None:
        limit = thresholds.gpu_memory
        spec = GaugeSpec("gpu_memory", GPU_MEMORY_USED, total=GPU_MEMORY_TOTAL, across=limit.across)
        named.append((spec, limit))
    for gauge in thresholds.all_gauges():
        labels = tuple(sorted(gauge.labels.items()))
        name = gauge.metric + ("{" + ",".join(f"{k}={v}" for k, v in labels) + "}" if labels else "")
        named.append((GaugeSpec(name, gauge.metric, labels, across=gauge.across), gauge))
    policy = tuple(
        Threshold(spec.name, limit.limit, _exit(limit, exit_ratio / enter_ratio)) for spec, limit in named
    )
    return tuple(spec for spec, _ in named), policy


def _exit(limit: Limit, ratio: float) -> float:
    """The exit limit: as set, else the latency estimate's own gap (exit_ratio / enter_ratio)."""
    return limit.limit * ratio if limit.exit is None else limit.exit


def read_gauges(samples_per_endpoint: Sequence[Sequence[Sample]], specs: Sequence[GaugeSpec]) -> Gauges:
    """Each spec's cluster value from one complete scrape of every endpoint."""
    return tuple(spec.cluster_value(spec.endpoint_value(s) for s in samples_per_endpoint) for spec in specs)
