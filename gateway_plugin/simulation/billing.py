"""The cloud bill, as each target's cost model says: per request, plus billed time (service, and
the init phase of a cold start where ``billed_init``) times memory and GPU prices, plus what live
idle instances cost where the platform bills them (FC's idle GPU)."""

from __future__ import annotations

import math
from collections import defaultdict

from gateway_plugin.config import TargetCost


class Bill:
    """Spend per target, and per second of simulated time for the report."""

    def __init__(self, costs: dict[str, TargetCost]) -> None:
        self._rates = {
            name: (c.usd_per_request, c.memory_gb * c.usd_per_gb_second + c.usd_per_gpu_second, c.billed_init)
            for name, c in costs.items()
        }
        self.by_target: dict[str, float] = defaultdict(float)
        self.by_second: dict[int, float] = defaultdict(float)

    def request(self, target: str, service_ms: float, init_ms: float, at: float) -> float:
        """One invocation; Lambda and FC both round billed time up to the millisecond."""
        per_request, per_second, billed_init = self._rates[target]
        billed_ms = math.ceil(service_ms + (init_ms if billed_init else 0.0))
        usd = per_request + billed_ms / 1000 * per_second
        self.by_target[target] += usd
        self.by_second[int(at)] += usd
        return usd

    def idle(self, target: str, usd: float, at: float) -> None:
        if usd > 0:
            self.by_target[target] += usd
            self.by_second[int(at)] += usd

    @property
    def total(self) -> float:
        return sum(self.by_target.values())
