"""The decision table the runner publishes for the fast path (the ``spillway`` Lua plugin in APISIX).

The runner stays the brain: it compiles the policy (rules, residency, quotas, targets and their
costs) and the load-aware state (each model's estimated local latency, overflow flag and health, each
target's breaker, warm pool and spend, each tracked tenant's books) into one JSON document. The
plugin fetches it every few tens of milliseconds and decides each request with
``apisix/plugins/spillway/decide.lua``, the same steps as ``policy.decide``. In-flight counts and
the spend made since the table was built are the plugin's own (shared-dict counters).

A pure function of a ``Policy`` and a ``Snapshot`` (plus what only the runner knows: target
values, signing-key variable names, marks), so tests build tables from any snapshot.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, cast

from gateway_plugin.content.checks import ContentPolicy
from gateway_plugin.fast_path.contract import FORMAT
from gateway_plugin.fast_path.table_model import (
    ContentRow,
    DecisionTable,
    DetectorKind,
    DetectorRow,
    LoadRow,
    PolicyRow,
    QuotaRow,
    RuleRow,
    TargetRow,
    TenantRow,
    as_dict,
)
from gateway_plugin.policy.model import Policy, Quota, RulePolicy, TargetPolicy
from gateway_plugin.policy.overflow import backlog_ms, capacity, scraped_latency_ms
from gateway_plugin.policy.snapshot import LocalLoad, Snapshot, TargetState, TenantState
from gateway_plugin.policy.tenants import tenant_key
from gateway_plugin.request.header_names import FORWARDED_TO_CLOUD

# Most tenants a table carries; past it the most recently seen of those at a limit are kept.
MAX_TENANTS = 1000
# The most one tenant row takes in the encoded table: its key (at most 256 printable ASCII
# characters, ``policy.tenants``: 514 bytes quoted if every one is escaped), three numbers (a
# float is at most 24 characters as Python writes it) and the names around them. So the tenants
# make at most MAX_TENANTS x MAX_TENANT_ROW_BYTES (650 KB) of any table, whatever clients send;
# the rest is the config's (rules, targets, models the cluster reports).
MAX_TENANT_ROW_BYTES = 650
# Most tracked tenants a build reads, the most recently seen first: what bounds its cost.
MAX_SCANNED = 4 * MAX_TENANTS


class TargetWiring(NamedTuple):
    """How the plugin sends a request to a target: the value traffic-split matches (None: invoke
    mode, which the fast path does not serve), the signature's key, and the request headers the
    target may receive."""

    value: str | None
    key_env: str | None = None
    sign_body: bool = False
    forward: frozenset[str] = FORWARDED_TO_CLOUD
    # A stream's price (``costs.stream_price``), which the plugin settles it at when it ends.
    stream_price: tuple[float, float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _quota(q: Quota) -> QuotaRow:
    return QuotaRow(q.requests_per_minute, q.concurrency, q.hourly_usd, q.daily_usd)


def _rule(r: RulePolicy) -> RuleRow:
    return RuleRow(
        name=r.name,
        action=r.action,
        targets=list(r.targets),
        headers=[(name, p.pattern) for name, p in r.headers],
        args=[(name, p.pattern) for name, p in r.args],
        models=sorted(r.models),
        uri=None if r.uri is None else r.uri.pattern,
    )


def _policy(policy: Policy) -> PolicyRow:
    return PolicyRow(
        classification_header=policy.classification_header,
        cloud_allowed=sorted(policy.cloud_allowed),
        unclassified_may_leave=policy.unclassified_may_leave,
        tenant_header=policy.tenant_header,
        tenant_from_consumer=policy.tenant_from_consumer,
        consumer_ceilings=dict(policy.consumer_ceilings),
        quotas={name: _quota(q) for name, q in policy.quotas.items()},
        default_quota=_quota(policy.default_quota),
        latency_target_ms=policy.latency_target_ms,
        model_targets_ms=dict(policy.model_targets_ms),
        model_ttft_ms=dict(policy.model_ttft_ms),
        max_queue_ms=policy.max_queue_ms,
        enter_ratio=policy.enter_ratio,
        exit_ratio=policy.exit_ratio,
        saturation_ratio=policy.saturation_ratio,
        retry_after_s=policy.retry_after_s,
        parallelism=policy.parallelism,
        onprem_headroom=policy.onprem_headroom,
        default_chain=list(policy.default_chain),
        rules=[_rule(r) for r in policy.rules],
        deadline_header=policy.deadline_header,
        priority_header=policy.priority_header,
        max_deadline_ms=policy.max_deadline_ms,
        default_sheddable=policy.default_sheddable,
    )


def _content(content: ContentPolicy) -> ContentRow:
    return ContentRow(
        detectors=[
            DetectorRow(d.name, cast(DetectorKind, d.kind), d.pattern, d.program) for d in content.detectors
        ],
        max_bytes=content.max_bytes,
        unscannable_stays=content.unscannable_stays,
        classify_as=content.classify_as,
        rules=sorted(content.rules),
        budget_ms=content.budget_s * 1000,
    )


def _load(load: LocalLoad, policy: Policy) -> LoadRow:
    """The scrape's estimates: ``latency_ms`` where the plugin counts nothing, ``backlog_ms`` to
    take the larger of with its own in-flight count's (``policy.overflow.estimated_latency_ms``);
    the thresholds' verdict (``policy.overflow.gauges_hot``)."""
    return LoadRow(
        gauges_hot=load.gauges_hot,
        fresh=load.fresh,
        latency_ms=scraped_latency_ms(load, policy),
        backlog_ms=backlog_ms(load, policy),
        compute_ms=load.compute_ms,
        overflowing=load.overflowing,
        onprem_rps=load.onprem_rps,
        failing=load.failing,
        probe_allowed=load.probe_allowed,
        capacity=capacity(load, policy),
    )


def _target(
    spec: TargetPolicy, state: TargetState, wiring: TargetWiring, mark: tuple[float, float], cap: int
) -> TargetRow:
    return TargetRow(
        cap=cap,
        slots=spec.slots,
        idle_usd=spec.idle_price(state.idle_s),
        cold_start_ms=spec.cold_start_ms,
        cost_usd=spec.cost_usd,
        cold_cost_usd=spec.cold_cost_usd,
        breaker=state.breaker,
        probe_allowed=state.probe_allowed,
        warm=state.warm_instances,
        spent_hour_usd=state.spent_hour_usd,
        spent_day_usd=state.spent_day_usd,
        spent_mark=mark[0],
        given_back_mark=mark[1],
        invoke=wiring.value is None,
        sign_body=wiring.sign_body,
        forward=sorted(wiring.forward),
        stream_usd=list(wiring.stream_price),
        hourly_usd=spec.hourly_usd,
        daily_usd=spec.daily_usd,
        max_request_bytes=spec.max_request_bytes,
        value=wiring.value,
        key_env=wiring.key_env,
    )


def build_table(
    policy: Policy,
    snapshot: Snapshot,
    wiring: Mapping[str, TargetWiring],
    version: int,
    built_at: float,
    spent_marks: Mapping[str, tuple[float, float]] | None = None,
    decision_header: bool = True,
    caps: Mapping[str, int] | None = None,
    content: ContentPolicy | None = None,
) -> dict[str, Any]:
    """The table for ``snapshot`` (every model's load, every target's state, tracked tenants).

    ``spent_marks``: per target, the plugin's cumulative spend counter and what it gave back of it
    (streams settled below their price) as of the spend this snapshot includes; the plugin adds
    what it spent past the first, less what it gave back past the second. ``caps``: per target, the
    concurrency cap this node may fill (its slots of a cap shared by several nodes); the
    configured cap where absent. ``content``: the detectors and the rules that ask for them
    (``content.checks``); none where absent.
    """
    marks, node_caps = spent_marks or {}, caps or {}
    table = DecisionTable(
        format=FORMAT,
        version=version,
        built_at=built_at,
        decision_header=decision_header,
        policy=_policy(policy),
        content=_content(content or ContentPolicy()),
        local={model: _load(load, policy) for model, load in snapshot.local.items()},
        targets={
            name: _target(
                spec,
                snapshot.targets.get(name, TargetState()),
                wiring[name],
                marks.get(name, (0.0, 0.0)),
                node_caps.get(name, spec.concurrency_cap),
            )
            for name, spec in policy.targets.items()
            if name in wiring
        },
        tenants={
            tenant_key(name): TenantRow(t.requests_last_minute, t.spent_hour_usd, t.spent_day_usd)
            for name, t in snapshot.tenants.items()
        },
    )
    return as_dict(table)


def tenants_at_a_limit(
    policy: Policy,
    newest_first: Iterable[tuple[str, Callable[[], TenantState]]],
    cap: int = MAX_TENANTS,
    scanned: int = MAX_SCANNED,
) -> dict[str, TenantState]:
    """The tenants whose books can change a decision: at their rate quota, or within one request's
    largest cost of a spend quota. The plugin reads a tenant missing from the table as one with
    empty books, and for every other tenant that reads exactly as its books would, so publishing
    only these gives the same decisions while clients rotating tenant names cannot grow the table.

    ``newest_first``: each tracked tenant and how to read its state, the most recently seen first.
    At most ``cap`` are kept, the most recent, and at most ``scanned`` are read, so a build costs
    the same whether 4,000 or ``tenants.max_tracked`` tenants are tracked: a tenant at its limit
    but seen less recently than that many others is left out (a request it sends is seen again,
    and counted or shed). Returned oldest first (the order a trimmed table leaves them out in)."""
    margin = max((max(t.cost_usd, t.cold_cost_usd) for t in policy.targets.values()), default=0.0)
    kept: dict[str, TenantState] = {}
    for name, read in itertools.islice(newest_first, scanned):
        state = read()
        quota = policy.quota_of(name)
        rpm, hourly, daily = quota.requests_per_minute, quota.hourly_usd, quota.daily_usd
        if (
            (rpm is not None and state.requests_last_minute >= rpm)
            or (hourly is not None and state.spent_hour_usd + margin > hourly)
            or (daily is not None and state.spent_day_usd + margin > daily)
        ):
            kept[name] = state
            if len(kept) >= cap:
                break
    return dict(reversed(kept.items()))


def encode(table: dict[str, Any]) -> bytes:
    """Compact JSON; floats as Python writes them (shortest form that reads back exactly)."""
    return json.dumps(table, separators=(",", ":"), allow_nan=False).encode()


def encode_within(table: dict[str, Any], room: int | None) -> tuple[bytes, int]:
    """The table encoded, within ``room`` bytes when the plugin says its shared dict has no more:
    without as many tenant rows as that takes, the least recently seen first (as past MAX_TENANTS).
    A tenant left out reads as one with empty books, so its quota is held back less until the
    dict has room again; every other decision stays exact. When the rest alone is over ``room``
    the table goes without tenants and the plugin keeps its last one. Returns the bytes and how
    many rows were left out."""
    text = encode(table)
    if room is None or len(text) <= room:
        return text, 0
    tenants: dict[str, Any] = table["tenants"]
    over, left_out = len(text) - room, 0
    for name, row in tenants.items():
        if over <= 0:
            break
        over -= len(encode({name: row})) - 1  # its `"name":{...}` and a comma
        left_out += 1
    kept = dict(list(tenants.items())[left_out:])
    return encode({**table, "tenants": kept}), left_out
