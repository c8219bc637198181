"""The runner's side of the fast path: what the ``spillway`` Lua plugin reports, and the table
it gets back.

Outcomes come in summaries, one per worker every few hundred milliseconds (``FastOutcomes``):
decisions per label, local answer times per model, cloud answers ok and failed per target with
the instances that answered, quota'd tenants' arrivals and spend, the table's age at each
decision, and the requests residency kept home. They feed the same books the ext-plugin path's
outcomes do: breakers, warm pools, the local latency estimate, tenants, metrics, the residency log.

Every fetch is a POST carrying the node's cumulative counters (spend per target, the overflow flag
it last decided, fail-safe decisions, outcomes it dropped).
The runner takes each counter's growth since the node's previous report into its state (the
spend ledger, metrics) and answers with a table built from the state
as it now is, marking per target how much of the node's spend it includes, so the plugin adds
only what it spent past that mark. Counters restart at zero when nginx restarts (new node id).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gateway_plugin.routing import decision_table
from gateway_plugin.routing.ledger import TenantBook
from gateway_plugin.routing.policy import LOCAL, SHED, BreakerState, Reason, Snapshot, TenantState
from gateway_plugin.routing.state import GatewayState, residency_log

log = logging.getLogger("spillway.fast_path")
MAX_NODES = 16
MAX_KEYS = 1000
# The reason of a fast-path decision made without a usable decision table.
FAIL_SAFE = "table_stale"
_Counters = dict[str, float]
_Count = Annotated[int, Field(ge=0, le=10_000_000)]
_Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Text = Annotated[str, Field(max_length=4096)]


class FastPathReport(BaseModel):
    """One fetch's body; every count is cumulative since the node started."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    node: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    spent: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    hot: dict[str, bool] = Field(default_factory=dict, max_length=MAX_KEYS)
    fail_safe: float = Field(default=0.0, ge=0)
    dropped: float = Field(default=0.0, ge=0)


class KeptHome(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    path: _Text | None = None
    model: _Text | None = None
    classification: _Text | None = None


_ENTRIES: dict[str, TypeAdapter[Any]] = {
    "decisions": TypeAdapter(tuple[_Text, _Count]),
    "sent_local": TypeAdapter(tuple[_Text, _Count]),
    "local_s": TypeAdapter(tuple[_Text, tuple[_Count, _Amount]]),
    "cloud": TypeAdapter(tuple[_Text, tuple[_Count, _Count, _Amount]]),
    "instances": TypeAdapter(tuple[_Text, dict[_Text, bool]]),
    "tenants": TypeAdapter(tuple[_Text, tuple[_Count, _Amount]]),
}
_KEPT_HOME: TypeAdapter[Any] = TypeAdapter(KeptHome)


def _valid(adapter: TypeAdapter[Any], item: object) -> bool:
    try:
        adapter.validate_python(item)
    except ValidationError:
        return False
    return True


class FastOutcomes(BaseModel):
    """One worker's summary of what happened since its previous one; every map is bounded.

    An entry that fails validation (a client's overlong tenant name, say) is dropped and counted
    in ``invalid``; the rest of the summary (breaker results, spend) still counts. Only a
    summary whose shape is wrong, or whose maps are over their bounds, is refused whole.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    decisions: dict[_Text, _Count] = Field(default_factory=dict, max_length=MAX_KEYS)
    sent_local: dict[_Text, _Count] = Field(default_factory=dict, max_length=MAX_KEYS)
    local_s: dict[_Text, tuple[_Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    cloud: dict[_Text, tuple[_Count, _Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    instances: dict[_Text, dict[_Text, bool]] = Field(default_factory=dict, max_length=MAX_KEYS)
    tenants: dict[_Text, tuple[_Count, _Amount]] = Field(default_factory=dict, max_length=MAX_KEYS)
    residency: list[KeptHome] = Field(default_factory=list, max_length=MAX_KEYS)
    table_ages: list[_Count] = Field(default_factory=list, max_length=64)
    table_age_sum: _Amount = 0.0
    dropped: _Count = 0
    invalid: _Count = 0

    @model_validator(mode="before")
    @classmethod
    def _drop_invalid_entries(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        kept: dict[str, Any] = {**data, "invalid": 0}
        invalid = 0
        for name, adapter in _ENTRIES.items():
            entries = data.get(name)
            if isinstance(entries, dict) and len(entries) <= MAX_KEYS:
                kept[name] = {k: v for k, v in entries.items() if _valid(adapter, (k, v))}
                invalid += len(entries) - len(kept[name])
        residency = data.get("residency")
        if isinstance(residency, list) and len(residency) <= MAX_KEYS:
            kept["residency"] = [r for r in residency if _valid(_KEPT_HOME, r)]
            invalid += len(residency) - len(kept["residency"])
        kept["invalid"] = invalid
        return kept


@dataclass
class _Node:
    spent: _Counters = field(default_factory=dict)
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

        def tenant_state(name: str, book: TenantBook) -> TenantState:
            hour, day = book.spent(wall)
            own = TenantState(book.last_minute(wall), 0, hour, day)
            return own if state.shared is None else state.shared.tenant_state(name, own, wall)

        tenants = decision_table.tenants_at_a_limit(
            state.policy, ((name, tenant_state(name, book)) for name, book in state.tenants.items())
        )
        wiring = {
            name: decision_table.TargetWiring(
                state.target_values.get(name),
                target.signing_key_env,
                target.sign_body,
                target.forwarded,
            )
            for name, target in state.targets.items()
        }
        snapshot = Snapshot(loads, targets, tenants)
        return decision_table.build_table(
            state.policy,
            snapshot,
            wiring,
            self.version,
            wall,
            marks,
            state.decision_header,
            {name: state.cap(name) for name in state.targets},
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
                    if state.shared is not None:
                        state.shared.spent_elsewhere(name, usd, wall)
                    state.metrics.spend.labels(name).inc(usd)
        for model, hot in report.hot.items():
            state.load.set_overflowing(model or None, hot)
        state.metrics.fast_path_fail_safe.inc(_growth(report.fail_safe, node.fail_safe))
        state.metrics.fast_path_dropped.inc(_growth(report.dropped, node.dropped))
        node.fail_safe, node.dropped = report.fail_safe, report.dropped
        return node


def _labels(state: GatewayState) -> set[str]:
    """Every reason a decision may carry under the current config (bounded metric labels)."""
    return {*(r.value for r in Reason), FAIL_SAFE, *(f"rule:{r.name}" for r in state.policy.rules)}


def _records(count: int, state: GatewayState) -> int:
    """Only the last ``window`` answers (and a run of ``consecutive_failures``) move a breaker."""
    settings = state.config.breaker
    return min(count, max(settings.window, settings.consecutive_failures) + 1)


def interleaved(ok: int, failed: int, records: int) -> Iterator[bool]:
    """``records`` answers with ok and failed spread evenly in their proportion (a worker's sums
    say how many, not in what order): scattered failures never become a run of them."""
    total = ok + failed
    if total == 0:
        return
    failures = round(failed * records / total)
    if failed and not failures:
        failures = 1
    for i in range(records):
        yield (i + 1) * failures // records == i * failures // records


def apply_outcomes(state: GatewayState, summary: FastOutcomes) -> None:
    """Take one worker's summary into the gateway's books."""
    labels, now, wall = _labels(state), state.clock(), state.wall()
    for key, count in summary.decisions.items():
        target, _, label = key.partition(";")
        if (target in state.targets or target in (LOCAL, SHED)) and label.split("+")[0] in labels:
            state.metrics.decided(target, label, count)
            if label.startswith(Reason.RESIDENCY):
                state.metrics.residency_kept.inc(count)
    for kept in summary.residency:
        seen = {"event": "residency_kept", **kept.model_dump(), "via": "fast_path"}
        residency_log.info(json.dumps(seen))
    for model, sent in summary.sent_local.items():
        state.load.sent_local_many(model or None, sent)
    for model, (count, seconds) in summary.local_s.items():
        if count:
            state.answered_local(model or None, seconds / count * 1000)
    for name, (ok, failed, _) in summary.cloud.items():
        breaker = state.breakers.get(name)
        if breaker is not None:
            if breaker.current(now) is BreakerState.HALF_OPEN and ok + failed:
                # Which answer was the probe is not known: it closes only a batch without failures.
                breaker.record(failed == 0, now)
                ok, failed = (ok - 1, failed) if failed == 0 else (ok, failed - 1)
            for result in interleaved(ok, failed, _records(ok + failed, state)):
                breaker.record(result, now)
    for name, instances in summary.instances.items():
        pool = state.pools.get(name)
        if pool is None:
            continue
        for instance, cold in list(instances.items())[:64]:
            pool.seen(instance, now, cold)
            if cold:
                state.metrics.cold_hits.labels(name).inc()
    for tenant, (arrivals, spend) in summary.tenants.items():
        quota = state.policy.quota_of(tenant)
        if quota.limits_anything:
            book = state.tenants.book(tenant)
            if quota.requests_per_minute is not None:
                book.arrivals.extend([wall] * min(arrivals, quota.requests_per_minute))
            book.add_spend(spend, wall)
            if state.shared is not None:
                state.shared.tenant_reported(tenant, arrivals, spend, wall)
    state.metrics.fast_path_table_age.add(summary.table_ages, summary.table_age_sum)
    state.metrics.fast_path_dropped.inc(summary.dropped + summary.invalid)
    if summary.invalid:
        log.warning("fast path: %d invalid entries dropped from a worker's summary", summary.invalid)
