"""The runner's side of the fast path: what the ``spillway`` Lua plugin reports, and the table
it gets back.

Every fetch is a POST carrying the node's cumulative counters (spend per target, requests sent
local per model, the overflow flag it last decided, fail-safe decisions, outcomes it dropped).
The runner takes each counter's growth since the node's previous report into its state (the
spend ledger, the local backlog estimate, metrics) and answers with a table built from the state
as it now is, marking per target how much of the node's spend it includes, so the plugin adds
only what it spent past that mark. Counters restart at zero when nginx restarts (new node id).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from gateway_plugin.routing import decision_table
from gateway_plugin.routing.policy import Snapshot, TenantState
from gateway_plugin.routing.state import GatewayState

MAX_NODES = 16
MAX_KEYS = 1000
_Counters = dict[str, float]


class FastPathReport(BaseModel):
    """One fetch's body; every count is cumulative since the node started."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    node: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    spent: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    local_sent: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    hot: dict[str, bool] = Field(default_factory=dict, max_length=MAX_KEYS)
    fail_safe: float = Field(default=0.0, ge=0)
    dropped: float = Field(default=0.0, ge=0)


@dataclass
class _Node:
    spent: _Counters = field(default_factory=dict)
    local_sent: _Counters = field(default_factory=dict)
    fail_safe: float = 0.0
    dropped: float = 0.0


def _growth(now: float, before: float) -> float:
    """A counter's growth; one that went down restarted from zero."""
    return now - before if now >= before else now


class FastPathBook:
    """Per node, the counters as last reported; owned by the runner's loop."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.version = 0
        self._nodes: OrderedDict[str, _Node] = OrderedDict()

    def exchange(self, report: FastPathReport) -> bytes:
        """Take a report in, answer with the table (JSON) as the state now stands."""
        node = self._take(report)
        self.version += 1
        return decision_table.encode(self.table({n: node.spent.get(n, 0.0) for n in self.state.targets}))

    def table(self, marks: dict[str, float] | None = None) -> dict[str, object]:
        state = self.state
        now, wall = state.clock(), state.wall()
        loads = state.load.snapshot(None)
        targets = {name: state.target_state(name, now, wall) for name in state.targets}
        tenants = {}
        for name, book in state.tenants.items():
            hour, day = book.spent(wall)
            tenants[name] = TenantState(book.last_minute(wall), 0, hour, day)
        wiring = {
            name: decision_table.TargetWiring(
                state.target_values.get(name), target.signing_key_env, target.sign_body
            )
            for name, target in state.targets.items()
        }
        snapshot = Snapshot(loads, targets, tenants)
        return decision_table.build_table(
            state.policy, snapshot, wiring, self.version, wall, marks, state.decision_header
        )

    def _take(self, report: FastPathReport) -> _Node:
        node = self._nodes.get(report.node)
        if node is None:
            while len(self._nodes) >= MAX_NODES:
                self._nodes.popitem(last=False)
            node = self._nodes[report.node] = _Node()
        self._nodes.move_to_end(report.node)
        state, wall = self.state, self.state.wall()
        for name, total in report.spent.items():
            if name in state.targets:
                usd = _growth(total, node.spent.get(name, 0.0))
                node.spent[name] = total
                if usd > 0:
                    state.ledger.spend(f"target:{name}", usd, wall)
                    state.metrics.spend.labels(name).inc(usd)
        for model, total in report.local_sent.items():
            sent = int(_growth(total, node.local_sent.get(model, 0.0)))
            node.local_sent[model] = total
            state.load.sent_local_many(model or None, sent)
        for model, hot in report.hot.items():
            state.load.set_overflowing(model or None, hot)
        state.metrics.fast_path_fail_safe.inc(_growth(report.fail_safe, node.fail_safe))
        state.metrics.fast_path_dropped.inc(_growth(report.dropped, node.dropped))
        node.fail_safe, node.dropped = report.fail_safe, report.dropped
        return node
