"""What one policy's run measured: each request's fate, and the figures the command prints."""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# Where a request ended up, per request (``Measures.kinds``).
LOCAL_KIND, CLOUD_KIND, SHED_KIND, FAILED_KIND = 0, 1, 2, 3


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
    cost_by_target: dict[str, float] = field(default_factory=dict)
    cost_by_second: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    warmup_cost_usd: float = 0.0
    seconds: float = 0.0

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
            "cold_hits": self.cold_hits,
            "flaps_per_min": round(self.flaps / minutes, 3),
            "shed": self.kinds.count(SHED_KIND),
            "failed": self.kinds.count(FAILED_KIND),
            "residency_breaches": self.residency_breaches,
        }


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 2)
