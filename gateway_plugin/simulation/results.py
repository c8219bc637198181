"""What one policy's run measured: each request's fate, and the figures the command prints."""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gateway_plugin.config import LocalCost
from gateway_plugin.costs import peak_fleet

# Where a request ended up, per request (``Measures.kinds``).
LOCAL_KIND, CLOUD_KIND, SHED_KIND, FAILED_KIND = 0, 1, 2, 3
# The window peak rates are taken over (``costs`` takes them over --peak-window, 1 m by default).
PEAK_WINDOW_S = 60


@dataclass
class Measures:
    latency_target_ms: float
    at: array[float] = field(default_factory=lambda: array("d"))
    latency_ms: array[float] = field(default_factory=lambda: array("d"))
    kinds: array[int] = field(default_factory=lambda: array("b"))
    cold_hits: int = 0
    residency_breaches: int = 0
    flaps: int = 0
    spilling: bool = False
    # The cloud bill per target: the requests routed there and the warm-up's pings together.
    cost_by_target: dict[str, float] = field(default_factory=dict)
    cost_by_second: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    # The warm-up's part of ``cost_by_target`` (already in it: never added to it again).
    warmup_cost_usd: float = 0.0
    seconds: float = 0.0
    local_cost: LocalCost = field(default_factory=LocalCost)

    def record(self, at: float, latency_ms: float, kind: int) -> None:
        self.at.append(at)
        self.latency_ms.append(latency_ms)
        self.kinds.append(kind)

    def decided(self, cloud: bool) -> None:
        """A request that may leave was routed: a change between spilling and not is a flap."""
        if cloud != self.spilling:
            self.flaps += 1
            self.spilling = cloud

    def summary(self) -> dict[str, Any]:
        n = len(self.kinds)
        target = self.latency_target_ms
        answered = sorted(ms for ms, k in zip(self.latency_ms, self.kinds, strict=True) if k != SHED_KIND)
        met = sum(
            1 for ms, k in zip(self.latency_ms, self.kinds, strict=True) if ms <= target and k < SHED_KIND
        )
        minutes = max(self.seconds, 1e-9) / 60
        return {
            "requests": n,
            "slo_attainment": round(met / n, 5) if n else 0.0,
            "p50_ms": _percentile(answered, 0.5),
            "p99_ms": _percentile(answered, 0.99),
            "p999_ms": _percentile(answered, 0.999),
            "cloud_share": round(self.kinds.count(CLOUD_KIND) / n, 5) if n else 0.0,
            "cloud_cost_usd": round(sum(self.cost_by_target.values()), 6),
            "warmup_cost_usd": round(self.warmup_cost_usd, 6),
            "routed_cost_usd": round(sum(self.cost_by_target.values()) - self.warmup_cost_usd, 6),
            "cold_hits": self.cold_hits,
            "flaps_per_min": round(self.flaps / minutes, 3),
            "shed": self.kinds.count(SHED_KIND),
            "failed": self.kinds.count(FAILED_KIND),
            "residency_breaches": self.residency_breaches,
            **self.costs(),
        }

    def costs(self) -> dict[str, Any]:
        """The on-prem cluster's cost over the run, the cost per 1,000 requests, and what bursting
        saved against GPUs for the peak, as ``python -m gateway_plugin costs`` reckons them. The
        total is the cluster plus the cloud bill, which holds the warm-up's pings once."""
        hours = self.seconds / 3600
        onprem = self.local_cost.usd_per_hour * hours
        total = onprem + sum(self.cost_by_target.values())
        served = sum(1 for k in self.kinds if k in (LOCAL_KIND, CLOUD_KIND))
        windows: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for at, kind in zip(self.at, self.kinds, strict=True):
            if kind in (LOCAL_KIND, CLOUD_KIND):
                counts = windows[int(at // PEAK_WINDOW_S)]
                counts[0] += 1
                counts[1] += kind == LOCAL_KIND
        peak = max((c[0] for c in windows.values()), default=0) / PEAK_WINDOW_S
        local_peak = max((c[1] for c in windows.values()), default=0) / PEAK_WINDOW_S
        cost = self.local_cost
        fleet = peak_fleet(total, hours, cost.gpus, cost.usd_per_gpu_hour, peak, local_peak)
        return {
            "onprem_cost_usd": round(onprem, 6),
            "total_cost_usd": round(total, 6),
            "usd_per_1000_requests": round(1000 * total / served, 6) if served else None,
            "gpus_for_peak": fleet.gpus if fleet and self.cost_by_target else None,
            "bursting_saved_pct": round(fleet.saved_pct, 2) if fleet and self.cost_by_target else None,
        }


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 2)
