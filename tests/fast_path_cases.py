"""Random configs, snapshots and requests for the fast path's equivalence test, and what Python's
``decide()`` makes of each (the runner's own way of building features and route policies)."""

from __future__ import annotations

import base64
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from functions.contract import PathError, gateway_path
from gateway_plugin.books.ledger import streamed
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.content.checks import (
    HEADER_JSON_LENGTH,
    ContentPolicy,
    Verdict,
    body_verdict,
    content_policy,
    route_checks,
    size_verdict,
    tightened,
)
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.model import Decision, Policy
from gateway_plugin.policy.snapshot import (
    BreakerState,
    LocalLoad,
    RequestFeatures,
    Snapshot,
    TargetState,
    TenantState,
)
from gateway_plugin.request.spillway import RouteOverrides, _route_policy, body_bytes
from tests import content_cases

_MODEL = re.compile(r"^/v2/models/([^/]+)")  # as request/spillway.py reads the model
TARGETS = ("aws", "ali", "fc-b")
MODELS = ("add_sub", "resnet")
TENANTS = ("t1", "t2", "t3")
PATTERNS = ("high", "h.*", "low|medium", "[a-z]+", ".*", "x?y", "[0-9]{2}", "", "a|b|c")
URI_PATTERNS = ("^/v2/models/add", "infer$", "resnet", "health", "/v2/", "models/[a-z_]+/infer")
PATHS = (
    "/v2/models/add_sub/infer",
    "/v2/models/resnet/infer",
    "/v2/models/add_sub/infer",
    "/v2/models/resnet/infer",
    "/v2/models/add_sub/infer",
    "/v2/models/resnet/infer",
    "/v2/models/unknown/infer",
    "/v2/models/add_sub",
    "/v2/health/ready",
    "/v2/models/add_sub/generate_stream",
    "/v2/models/resnet/generate",
    "/v2/models/generate_stream/infer",
    # refused: not in normal form, or encoded more than once (no layer may read them two ways)
    "/v2//models/resnet/./infer",
    "/v2/models/%61dd_sub/infer",
    "/v2/models/add_sub/../resnet/infer",
    "/v2/models/resnet/infer/",
    "/v2/models/50%off/infer",
)
CLASSES = (
    None,
    "public",
    "PUBLIC ",
    " internal",
    "secret",
    "",
    "  ",
    "Internal",
    "confidential",
    "public",
    "public",
)
PRIORITIES = (None, "high", "low", "HIGH", "", "medium", "hx", "12", "b")
# A request's deadline in seconds and its priority (``admission:``), well formed or not.
DEADLINES = (None, None, "0.05", "0.2", " 1.5 ", "10", "0", "007.25", "99999", "1e3", "-1", "1.2345", "")
CRITICALITY = (None, None, "critical", "sheddable", "Sheddable ", "CRITICAL", "urgent", "")


def _maybe(rng: random.Random, value: Any, p: float = 0.5) -> Any:
    return value if rng.random() < p else None


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def random_config(rng: random.Random) -> dict[str, Any]:
    names = rng.sample(TARGETS, rng.randint(1, 3))
    targets = [
        {
            "name": n,
            "kind": "http",
            "url": "http://127.0.0.1:1",
            "concurrency_cap": rng.randint(1, 4),
            "cold_start_ms": rng.choice([0, 50, 400, 5000]),
            "instance_concurrency": rng.choice([1, 1, 2, 4]),
            "max_request_bytes": _maybe(rng, rng.choice([100, 10_000]), 0.3),
            "cost": {
                "memory_gb": rng.choice([1, 2, 4, 10]),
                "expected_duration_ms": rng.choice([20, 100, 900]),
                "usd_per_idle_second": rng.choice([0.0, 0.0, 0.00002]),
            },
        }
        for n in names
    ]
    rules = []
    for i in range(rng.randint(0, 4)):
        match = _drop_none(
            {
                "headers": _maybe(rng, {"x-priority": rng.choice(PATTERNS)}),
                "uri": _maybe(rng, rng.choice(URI_PATTERNS), 0.4),
                "args": _maybe(rng, {"mode": rng.choice(PATTERNS)}, 0.3),
                "models": _maybe(rng, rng.sample(MODELS, rng.randint(1, 2)), 0.3),
            }
        )
        rules.append(
            {
                "name": f"r{i}",
                "priority": rng.randint(0, 3),
                "match": match,
                "action": rng.choice(["local", "overflow", "target", "shed", "overflow", "target"]),
                "targets": rng.sample(names, rng.randint(0, len(names))),
                "content_checks": rng.random() < 0.3,
            }
        )
    enter = rng.choice([0.9, 1.0, 1.2])
    quota = {
        "requests_per_minute": _maybe(rng, rng.randint(1, 5), 0.3),
        "concurrency": _maybe(rng, rng.randint(1, 3), 0.3),
        "hourly_usd": _maybe(rng, rng.choice([0.0, 0.0001, 1.0]), 0.3),
        "daily_usd": _maybe(rng, rng.choice([0.0, 0.001, 1.0]), 0.2),
    }
    return {
        "content": content_cases.content_section(rng) if rng.random() < 0.7 else {},
        "local": {
            "latency_target_ms": rng.choice([50, 100, 200]),
            "model_latency_targets_ms": _drop_none({"resnet": _maybe(rng, rng.choice([30, 300]))}),
            "model_ttft_targets_ms": _drop_none(
                {m: _maybe(rng, rng.choice([5, 40, 150]), 0.3) for m in MODELS}
            ),
            "parallelism": rng.randint(1, 4),
            "max_queue_ms": rng.choice([100, 1000, 5000]),
        },
        "targets": targets,
        "rules": rules,
        "residency": {
            "header": rng.choice(["x-data-classification", "X-Class"]),
            "cloud_allowed": rng.sample(["public", "internal", "PUBLIC"], rng.randint(0, 2))
            + ["public"] * (rng.random() < 0.7),
            "unclassified_may_leave": rng.random() < 0.3,
        },
        "admission": {
            "deadline_header": rng.choice(["x-request-deadline-s", "x-deadline", None]),
            "priority_header": rng.choice(["x-request-priority", "x-criticality", None]),
            "max_deadline_s": rng.choice([0.1, 2.0, 60.0]),
            "default_priority": rng.choice(["critical", "sheddable"]),
        },
        "overflow": {
            "enter_ratio": enter,
            "exit_ratio": rng.choice([0.5, 0.8, enter]),
            "saturation_ratio": rng.choice([1.5, 4.0]),
            "retry_after_s": rng.randint(1, 3),
            "onprem_headroom": rng.choice([0.0, 1.0, 2.0, 5.0, 20.0]),
        },
        "budgets": {
            "per_target_hourly_usd": {
                n: rng.choice([0.0, 0.00001, 0.001, 1.0]) for n in names if rng.random() < 0.3
            },
            "per_target_daily_usd": {n: rng.choice([0.0, 0.0001, 1.0]) for n in names if rng.random() < 0.3},
        },
        "tenants": {
            "quotas": {t: _drop_none(quota) for t in rng.sample(TENANTS, rng.randint(0, 2))},
            "default": _drop_none(quota) if rng.random() < 0.3 else {},
        },
    }


def random_snapshot(rng: random.Random, policy: Policy) -> Snapshot:
    local = {}
    for model in ("", *MODELS):
        if model and rng.random() >= 0.6:
            continue
        compute_ms = rng.choice([0.0, 5.0, 30.0, 80.0])
        # On-prem-only utilisation of the cluster: none, some, near and past its capacity.
        rho = rng.choice([0.0, 0.0, 0.2, 0.5, 0.8, 0.95, 1.2])
        local[model] = LocalLoad(
            fresh=rng.random() < 0.8,
            queue_ms=rng.choice([0.0, 1.0, 40.0, 150.0, 190.0, 600.0, 9000.0]),
            compute_ms=compute_ms,
            pending=rng.randint(0, 20),
            sent_since_scrape=rng.randint(0, 40),
            age_ms=rng.choice([0.0, 50.0, 400.0]),
            overflowing=rng.random() < 0.5,
            observed_ms=rng.choice([0.0, 100.0, 250.0]),
            in_flight=rng.choice([-1, rng.randint(0, 3 * policy.parallelism + 6), 200]),
            onprem_rps=rho * policy.parallelism * 1000 / compute_ms if compute_ms else rho * 50,
            # A gauge of local.thresholds past its limit (its hysteresis applied at the scrape).
            gauges_hot=rng.random() < 0.25,
            # The cluster's own breaker: closed, open, or half-open with its probe free or taken.
            failing=rng.random() < 0.25,
            probe_allowed=rng.random() < 0.4,
        )
    targets = {}
    for name, spec in policy.targets.items():
        hourly = spec.hourly_usd or 0.0
        in_flight = rng.randint(0, spec.concurrency_cap + 1)
        targets[name] = TargetState(
            breaker=rng.choice(
                [BreakerState.CLOSED, BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN]
            ),
            probe_allowed=rng.random() < 0.5,
            in_flight=in_flight,
            warm_instances=rng.randint(0, 4),
            spent_hour_usd=rng.choice([0.0, hourly, hourly * 0.999, hourly - spec.cost_usd]),
            spent_day_usd=rng.choice([0.0, 0.5, 0.0001]),
            starting=rng.randint(0, in_flight),
            idle_s=rng.choice([math.inf, 0.0, 2.0, 400.0]),
        )
    tenants = {
        t: TenantState(
            rng.randint(0, 6), rng.randint(0, 4), rng.choice([0.0, 0.00009, 2.0]), rng.choice([0.0, 2.0])
        )
        for t in TENANTS
        if rng.random() < 0.7
    }
    return Snapshot(local, targets, tenants)


def hot_snapshot(rng: random.Random, policy: Policy) -> Snapshot:
    """Every model overflowing and every target free and warm: public requests want out."""
    load = LocalLoad(fresh=True, queue_ms=600.0, compute_ms=30.0, overflowing=True)
    targets = {n: TargetState(warm_instances=rng.randint(0, 4)) for n in policy.targets}
    return Snapshot({m: load for m in ("", *MODELS)}, targets, {})


def random_route(rng: random.Random, policy: Policy) -> dict[str, Any]:
    return _drop_none(
        {
            "latency_target_ms": _maybe(rng, rng.choice([20.0, 150.0, 1000.0]), 0.3),
            "targets": _maybe(rng, rng.sample([*TARGETS, "nope"], rng.randint(0, 3)), 0.3),
            "rules": _maybe(rng, [r.name for r in policy.rules if rng.random() < 0.5], 0.3),
            "on_prem_only": _maybe(rng, True, 0.15),
            "content_checks": _maybe(rng, True, 0.4),
        }
    )


def random_request(rng: random.Random, residency_header: str) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    named = (
        (residency_header.lower(), CLASSES),
        ("x-priority", PRIORITIES),
        (rng.choice(("x-request-deadline-s", "x-deadline")), DEADLINES),
        (rng.choice(("x-request-priority", "x-criticality")), CRITICALITY),
    )
    for name, choices in named:
        value = rng.choice(choices)
        if value is not None:
            headers[name] = [value, rng.choice(PRIORITIES[1:])] if rng.random() < 0.05 else value
    size = rng.choice((None, None, "0", "100", "101", " 99 ", "5000", "20000", "1e3", "-1", ["10", "10"]))
    if size is not None:
        headers["content-length"] = size
    elif rng.random() < 0.1:
        headers["transfer-encoding"] = "chunked"
    tenant = rng.choice((None, *TENANTS, ""))
    if tenant is not None:
        headers["x-tenant"] = tenant
    body = b""
    if rng.random() < 0.6:
        body, framing = content_cases.body(rng)
        headers = {k: v for k, v in headers.items() if k not in ("content-length", "transfer-encoding")}
        headers |= framing
    args: dict[str, Any] = {}
    if rng.random() < 0.5:
        args["mode"] = rng.choice(["high", "low", True, "", ["a", "high"]])
    return {
        "uri": rng.choice(PATHS),
        "headers": headers,
        "args": args,
        "body": base64.b64encode(body).decode(),
    }


def python_decision(
    request: dict[str, Any],
    route: dict[str, Any],
    policy: Policy,
    snap: Snapshot,
    content: ContentPolicy | None = None,
) -> tuple[Decision, Verdict | None]:
    """What the runner decides: features as ``SpillwayPlugin.request_filter`` builds them, the text
    read (and the request decided again) when it would leave and its route or rule asks. With what
    reading found (None: not read)."""
    headers = {k: ", ".join(v) if isinstance(v, list) else v for k, v in request["headers"].items()}
    args = {k: ("" if v is True else v[-1] if isinstance(v, list) else v) for k, v in request["args"].items()}
    path = gateway_path(request["uri"])
    match = _MODEL.match(path)
    features = RequestFeatures(path, headers, args, match.group(1) if match else None, body_bytes(headers))
    overrides = RouteOverrides(**route)
    route_policy = _route_policy(policy, overrides)
    decision = decide(features, snap, route_policy)
    checks = None if content is None else route_checks(content, route_policy, overrides.content_checks)
    if not (decision.is_cloud and checks is not None and checks.applies(route_policy, features)):
        return decision, None
    verdict = size_verdict(checks.content, features.body_bytes) or body_verdict(
        checks.content, base64.b64decode(request["body"]), headers.get(HEADER_JSON_LENGTH)
    )
    if checks.content.keeps_home(verdict):
        features = tightened(features, route_policy, checks.content)
    return decide(features, snap, route_policy), verdict


@dataclass
class Group:
    """One config and snapshot, the table the runner would publish for it, and requests under it."""

    policy: Policy
    snapshot: Snapshot
    table: str
    cases: list[dict[str, Any]]
    content: ContentPolicy | None = None


def random_group(rng: random.Random, requests: int, content_focus: bool = False) -> Group:
    """``content_focus``: a hot cluster, every route asking for content checks and most requests
    labelled public, so that many would leave and have their text read."""
    config = SpillwayConfig.model_validate(random_config(rng))
    policy = build_policy(config)
    content = content_policy(config)
    snap = hot_snapshot(rng, policy) if content_focus else random_snapshot(rng, policy)
    wiring = {t.name: decision_table.TargetWiring(f"{t.name}:mac") for t in config.targets}
    built = decision_table.build_table(policy, snap, wiring, 1, 0.0, content=content)
    table = decision_table.encode(built).decode()
    cases = []
    for _ in range(requests):
        request = random_request(rng, config.residency.header)
        route = random_route(rng, policy)
        if content_focus:
            route["content_checks"] = True
            route.pop("on_prem_only", None)
            request["headers"][config.residency.header.lower()] = rng.choice(("public", "public", "internal"))
        cases.append(
            {
                **request,
                "route": route,
                "in_flight": {n: s.in_flight for n, s in snap.targets.items()},
                "starting": {n: s.starting for n, s in snap.targets.items()},
                "local_in_flight": {
                    m: load.in_flight for m, load in snap.local.items() if load.in_flight >= 0
                },
                "tenant_in_flight": {n: s.in_flight for n, s in snap.tenants.items()},
            }
        )
    return Group(policy, snap, table, cases, content)


def bodies_group(config: dict[str, Any], bodies: list[tuple[bytes, dict[str, str]]]) -> Group:
    """One public request per body on a hot cluster whose route reads every request's text."""
    validated = SpillwayConfig.model_validate(config)
    policy, content = build_policy(validated), content_policy(validated)
    snap = hot_snapshot(random.Random(0), policy)
    wiring = {t.name: decision_table.TargetWiring(f"{t.name}:mac") for t in validated.targets}
    built = decision_table.build_table(policy, snap, wiring, 1, 0.0, content=content)
    cases = [
        {
            "uri": "/v2/models/add_sub/infer",
            "headers": {"x-data-classification": "public", **headers},
            "args": {},
            "body": base64.b64encode(body).decode(),
            "route": {"content_checks": True},
            "in_flight": {n: s.in_flight for n, s in snap.targets.items()},
            "starting": {n: s.starting for n, s in snap.targets.items()},
            "local_in_flight": {m: load.in_flight for m, load in snap.local.items() if load.in_flight >= 0},
            "tenant_in_flight": {},
        }
        for body, headers in bodies
    ]
    return Group(policy, snap, decision_table.encode(built).decode(), cases, content)


def expected(group: Group, case: dict[str, Any]) -> dict[str, Any]:
    try:
        d, verdict = python_decision(case, case["route"], group.policy, group.snapshot, group.content)
    except PathError:
        return {"refused": True}
    return {
        "read": verdict is not None,
        "content": None if verdict is None else verdict.label,
        "target": d.target,
        "label": d.label,
        "status": d.status,
        "retry_after_s": d.retry_after_s,
        "cost_usd": d.cost_usd,
        "residency_kept": d.residency_kept,
        "overflowing": d.overflowing,
        "tenant": d.tenant,
        "on_prem_only": d.on_prem_only,
        "streamed": streamed(gateway_path(case["uri"])),
    }
