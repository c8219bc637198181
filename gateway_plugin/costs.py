"""What one request costs on a cloud target, from the target's price model.

Lambda bills requests and GB-seconds (and, for image functions, the init phase of a cold start);
FC bills compute units and active GPU time: both fit requests + memory-seconds + GPU-seconds.
"""

from __future__ import annotations

from gateway_plugin.config import TargetCost


def request_cost_usd(cost: TargetCost, cold: bool = False, cold_start_ms: float = 0.0) -> float:
    seconds = cost.expected_duration_ms / 1000
    if cold and cost.billed_init:
        seconds += cold_start_ms / 1000
    return cost.usd_per_request + seconds * (
        cost.memory_gb * cost.usd_per_gb_second + cost.usd_per_gpu_second
    )


def monthly_warm_cost_usd(cost: TargetCost, instances: int, pings_per_hour: float, dwell_ms: float) -> float:
    """Keeping ``instances`` warm: each ping is a billed request holding its instance for the dwell."""
    per_ping = cost.usd_per_request + (dwell_ms / 1000) * (
        cost.memory_gb * cost.usd_per_gb_second + cost.usd_per_gpu_second
    )
    return per_ping * instances * pings_per_hour * 24 * 30
