"""The cloud bill, as each target's cost model says: per request, plus billed time (service, and
the init phase of a cold start where ``billed_init``) times memory and GPU prices, plus generated
tokens and prompt tokens, plus what live idle instances cost where the platform bills them (FC's idle GPU)."""

from __future__ import annotations

from collections import defaultdict

from gateway_plugin.config import TargetCost
from gateway_plugin.costs import answer_cost_usd


class Bill:
    """Spend per target, and per second of simulated time for the report."""

    def __init__(self, costs: dict[str, TargetCost]) -> None:
        self._costs = costs
        self.by_target: dict[str, float] = defaultdict(float)
        self.by_second: dict[int, float] = defaultdict(float)

    def request(
        self,
        target: str,
        service_ms: float,
        init_ms: float,
        at: float,
        tokens: int = 0,
        prompt: int | None = None,
    ) -> float:
        """One invocation that generated ``tokens`` from ``prompt`` tokens (None: the expected
        ones), billed as the gateway settles it."""
        cost = self._costs[target]
        billed_s = (service_ms + (init_ms if cost.billed_init else 0.0)) / 1000
        usd = answer_cost_usd(cost, billed_s, tokens, prompt)
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
