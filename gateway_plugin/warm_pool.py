"""Which instances of each cloud target are warm, learnt from their answers and warm-up reports.

Every function answer names its instance (``X-Spillway-Instance``); an instance seen within the
target's idle TTL is counted warm. Warm-up reports add the instances the pinger reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from functions.contract import WARM_INSTANCE_METRIC


@dataclass
class WarmPool:
    idle_ttl_s: float
    _last_seen: dict[str, float] = field(default_factory=dict)
    cold_hits: int = 0

    def seen(self, instance_id: str, now: float, cold: bool = False) -> None:
        self._last_seen[instance_id] = now
        if cold:
            self.cold_hits += 1

    def warm(self, now: float) -> int:
        horizon = now - self.idle_ttl_s
        stale = [i for i, at in self._last_seen.items() if at < horizon]
        for instance in stale:
            del self._last_seen[instance]
        return len(self._last_seen)


def read_warm_report(text: str) -> dict[str, list[str]]:
    """Target → warm instance ids, from the warm-up pinger's Prometheus text report."""
    found: dict[str, list[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != WARM_INSTANCE_METRIC:
            continue
        for sample in family.samples:
            if sample.value >= 1:
                found.setdefault(sample.labels["target"], []).append(sample.labels["instance"])
    return found
