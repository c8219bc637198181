"""The runner's side of the fast path: what the ``spillway`` Lua plugin reports, and the table
it gets back.

Outcomes come in summaries, one per worker every few hundred milliseconds (``FastOutcomes``, read
part by part in ``summary``):
decisions per label, local answer times and answers ok and failed per model (the cluster's
health), cloud answers ok and failed per target with
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

import functools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gateway_plugin.books.cost_series import UNNAMED
from gateway_plugin.books.ledger import TenantBook
from gateway_plugin.books.state import GatewayState
from gateway_plugin.content.checks import Unscannable
from gateway_plugin.costs import stream_price
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.fast_path.contract import FAIL_SAFE, USAGE_SEP
from gateway_plugin.fast_path.summary import MAX_KEYS, FastOutcomes
from gateway_plugin.policy.model import DECISION_SEP, LABEL_SEP, LOCAL, SHED, Reason
from gateway_plugin.policy.snapshot import Snapshot, TenantState
from gateway_plugin.policy.tenants import tenant_key

log = logging.getLogger("spillway.fast_path")
MAX_NODES = 16
_Counters = dict[str, float]
_Mark = Annotated[float, Field(ge=0)]


class FastPathReport(BaseModel):
    """One fetch's body; every count is cumulative since the node started."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    node: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    # The spent and given-back marks of the table the node holds: its counters as the runner that
    # built it last took them in (none before its first table).
    marks: dict[str, tuple[_Mark, _Mark]] = Field(default_factory=dict, max_length=MAX_KEYS)
    spent: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    given_back: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    hot: dict[str, bool] = Field(default_factory=dict, max_length=MAX_KEYS)
    fail_safe: float = Field(default=0.0, ge=0)
    dropped: float = Field(default=0.0, ge=0)
    # Requests content checks kept home, per detector, and found unreadable, per reason.
    content: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    unscannable: _Counters = Field(default_factory=dict, max_length=MAX_KEYS)
    # Tables the plugin could not store (its shared dict full), and the most it can store now.
    store_failed: float = Field(default=0.0, ge=0)
    room: int | None = Field(default=None, ge=0)


@dataclass
class _Node:
    spent: _Counters = field(default_factory=dict)
    given_back: _Counters = field(default_factory=dict)
    content: _Counters = field(default_factory=dict)
    unscannable: _Counters = field(default_factory=dict)
    fail_safe: float = 0.0
    dropped: float = 0.0
    store_failed: float = 0.0
    left_out: int = 0  # tenant rows its last table went without


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
        table = self.table(
            {n: (node.spent.get(n, 0.0), node.given_back.get(n, 0.0)) for n in self.state.targets}
        )
        text, left_out = decision_table.encode_within(table, report.room)
        metrics = self.state.metrics
        node.left_out = left_out
        metrics.fast_path_table_bytes.set(len(text))
        metrics.fast_path_table_left_out.set(max(n.left_out for n in self._nodes.values()))
        if report.room is not None and metrics.due("fast_path_room"):
            log.error(
                "fast path: node %s cannot store a larger decision table in its shared dict spillway "
                "(room for %d bytes): %d tenant rows left out, so those tenants' quotas are held on "
                "the fast path only once it has room; make the dict larger "
                "(nginx_config.http.custom_lua_shared_dict)",
                report.node,
                report.room,
                left_out,
            )
        return text

    def table(self, marks: dict[str, tuple[float, float]] | None = None) -> dict[str, object]:
        state = self.state
        now, wall = state.clock(), state.wall()
        loads = state.load.snapshot(None)
        targets = {name: state.target_state(name, now, wall, fast_path=True) for name in state.targets}

        def tenant_state(name: str, book: TenantBook) -> TenantState:
            hour, day = book.spent(wall)
            own = TenantState(book.last_minute(wall), 0, hour, day)
            return own if state.shared is None else state.shared.tenant_state(name, own, wall)

        tenants = decision_table.tenants_at_a_limit(
            state.policy,
            ((name, functools.partial(tenant_state, name, book)) for name, book in state.tenants.newest()),
        )
        wiring = {
            name: decision_table.TargetWiring(
                state.target_values.get(name),
                target.signing_key_env,
                target.sign_body,
                target.forwarded,
                stream_price(target.cost),
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
            {name: state.fast_path_cap(name) for name in state.targets},
            state.content,
        )

    def _take(self, report: FastPathReport) -> _Node:
        node = self._nodes.get(report.node)
        if node is None:
            while len(self._nodes) >= MAX_NODES:
                self._nodes.popitem(last=False)
            # Counted up to its table's marks already (by this runner before it forgot the node,
            # or by the one before it): added whole, the node's lifetime spend would fall on this hour.
            node = self._nodes[report.node] = _Node(
                {name: mark[0] for name, mark in report.marks.items()},
                {name: mark[1] for name, mark in report.marks.items()},
            )
        self._nodes.move_to_end(report.node)
        state = self.state
        for name, total in report.spent.items():
            if name in state.targets:
                back = report.given_back.get(name, 0.0)
                usd = _growth(total, node.spent.get(name, 0.0)) - _growth(
                    back, node.given_back.get(name, 0.0)
                )
                node.spent[name], node.given_back[name] = total, back
                if usd:
                    state.spent_elsewhere(name, usd)
        for model, hot in report.hot.items():
            state.overflow_decided(model or None, hot)
        _content_counts(state, node, report)
        state.fast_path_counted(
            fail_safe=_growth(report.fail_safe, node.fail_safe),
            dropped=_growth(report.dropped, node.dropped),
            store_failed=_growth(report.store_failed, node.store_failed),
        )
        node.fail_safe, node.dropped = report.fail_safe, report.dropped
        node.store_failed = report.store_failed
        return node


def _content_counts(state: GatewayState, node: _Node, report: FastPathReport) -> None:
    """What the node's content checks found since its last report, under the names the config
    knows (the metric's labels stay bounded whatever a report says)."""
    known = {d.name for d in state.content.detectors}
    reasons = {r.value for r in Unscannable}
    for counts, seen, names, count in (
        (report.content, node.content, known, state.content_matched),
        (report.unscannable, node.unscannable, reasons, state.content_unscannable),
    ):
        for name, total in counts.items():
            if name in names:
                grown = _growth(total, seen.get(name, 0.0))
                seen[name] = total
                if grown > 0:
                    count(name, grown)


def _labels(state: GatewayState) -> set[str]:
    """Every reason a decision may carry under the current config (bounded metric labels)."""
    return {*(r.value for r in Reason), FAIL_SAFE, *(f"rule:{r.name}" for r in state.policy.rules)}


def apply_outcomes(state: GatewayState, summary: FastOutcomes) -> None:
    """Take one worker's summary into the gateway's books."""
    labels = _labels(state)
    for key, count in summary.decisions.items():
        target, _, label = key.partition(DECISION_SEP)
        if (target in state.targets or target in (LOCAL, SHED)) and label.split(LABEL_SEP)[0] in labels:
            state.decided_elsewhere(target, label, count)
    for key, (count, usd) in summary.usage.items():
        target, _, rest = key.partition(USAGE_SEP)
        tenant, _, model = rest.partition(USAGE_SEP)
        if target in state.targets or target == LOCAL:
            state.used(tenant_key(tenant) if tenant else None, model or None, target, count, usd)
    for target, (count, usd) in summary.usage_other.items():
        if target in state.targets or target == LOCAL:
            state.used(UNNAMED, UNNAMED, target, count, usd)
    for kept in summary.residency:
        seen = {"event": "residency_kept", **kept.model_dump(exclude={"content"}), "via": "fast_path"}
        if kept.content is not None:
            seen["content"] = kept.content
        state.kept_home(seen)
    for model, sent in summary.sent_local.items():
        state.sent_local(model or None, sent, summary.span_s)
    for model, arrived in summary.on_prem.items():
        state.arrived_onprem(model or None, arrived, summary.span_s)
    for model, (count, seconds) in summary.local_s.items():
        if count:
            state.answered_local(model or None, seconds / count * 1000)
    for model, (ok, failed) in summary.local_answers.items():
        state.local_answers(model or None, ok, failed)
    for address, (ok, failed, trailing) in summary.members.items():
        state.member_answers(address, ok, failed, trailing)
    for name, (ok, failed, _) in summary.cloud.items():
        state.cloud_answers(name, ok, failed)
    for name, instances in summary.instances.items():
        state.instances_answered(name, instances)
    for tenant, (arrivals, spend) in summary.tenants.items():
        state.tenant_counts(tenant, arrivals, spend)
    state.fast_path_counted(
        dropped=summary.dropped + summary.invalid,
        table_ages=summary.table_ages,
        table_age_sum=summary.table_age_sum,
    )
    if summary.invalid and state.metrics.due("fast_path_invalid"):
        log.warning(
            "fast path: %d malformed parts of a worker's summary read as absent or dropped (the rest "
            "taken); counted in spillway_fast_path_outcomes_dropped_total, said at most once a minute",
            summary.invalid,
        )
