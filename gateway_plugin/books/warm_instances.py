"""Which instances of each cloud target are warm, learnt from their answers and warm-up reports.

Every function answer names its instance (``X-Spillway-Instance``); an instance seen within the
target's idle TTL is counted warm. Warm-up reports add the instances the pinger reached.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from functions.contract import PROVISIONED_METRIC, WARM_INSTANCE_METRIC, WARMUP_SPEND_METRIC

MAX_INSTANCES = 10_000


@dataclass
class WarmPool:
    """Instances in the order they were last seen, so the idle ones are at the front; at most
    ``max_instances`` (the ids come from answers, which the gateway does not control)."""

    idle_ttl_s: float
    max_instances: int = MAX_INSTANCES
    _last_seen: OrderedDict[str, float] = field(default_factory=OrderedDict)
    cold_hits: int = 0
    # Instances the platform keeps warm without naming them (provisioned concurrency): at least
    # this many are warm, whichever ids answers bring.
    provisioned: int = 0

    def seen(self, instance_id: str, now: float, cold: bool = False) -> None:
        self._last_seen.pop(instance_id, None)
        self._last_seen[instance_id] = now
        if len(self._last_seen) > self.max_instances:
            self._last_seen.popitem(last=False)
        if cold:
            self.cold_hits += 1

    def idle_s(self, now: float) -> float:
        """Since an answer last came from any instance (infinite when none is known)."""
        if not self._last_seen:
            return math.inf
        return max(0.0, now - next(reversed(self._last_seen.values())))

    def warm(self, now: float) -> int:
        horizon = now - self.idle_ttl_s
        last_seen = self._last_seen
        while last_seen and next(iter(last_seen.values())) < horizon:
            last_seen.popitem(last=False)
        return max(len(last_seen), self.provisioned)


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


# The warm-up report's per-target counts the runner shows again on its own /metrics.
WARMUP_COUNTS = (
    "spillway_warmup_warm_instances",
    "spillway_warmup_wanted_instances",
    f"{WARMUP_SPEND_METRIC}_total",
    PROVISIONED_METRIC,
)
WARMUP_ROUND = "spillway_warmup_last_round_timestamp_seconds"


def read_warm_counts(text: str) -> tuple[dict[str, dict[str, float]], float | None]:
    """Family → target → count, and when the round ended, from the same report."""
    counts: dict[str, dict[str, float]] = {}
    ended = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WARMUP_COUNTS and "target" in sample.labels:
                counts.setdefault(sample.name, {})[sample.labels["target"]] = sample.value
            elif sample.name == WARMUP_ROUND:
                ended = sample.value
    return counts, ended
